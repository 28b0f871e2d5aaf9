"""sccache inside the compile step: start its server on the shared backend the build secret names, watch that
backend while the compile runs, and print the counters at the end (builders/cache/sccache_stats.py reads them).

    python3 compiler_cache.py start     # before the compile
    python3 compiler_cache.py stop      # after it: counters between FORGE-SCCACHE-STATS-BEGIN/END

A cache is never the reason a build fails: a backend that cannot be reached when the server starts, or that
stops answering (a Redis killed mid-build) or errs (a full or corrupt cache) while the compile runs, is replaced
by the local cache folder and the compile goes on; the counters then carry an event that names the backend and
what it cost. Only with FORGE_REQUIRE_CACHE=1 does either end the step with an error.

The server's settings and credentials come from the secret file alone; they reach the sccache server process
and never the compile's own environment, this script's output, or a file outside /tmp.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

# Where the build secret is mounted, and a folder of the step's own; a test on the host points both elsewhere.
SECRET = Path(os.environ.get("FORGE_COMPILER_CACHE_SECRET", "/run/secrets/forge_compiler_cache"))
STATE = Path(os.environ.get("FORGE_COMPILER_CACHE_STATE", "/tmp/forge-compiler-cache"))
BEGIN, END = "FORGE-SCCACHE-STATS-BEGIN", "FORGE-SCCACHE-STATS-END"
REMOTE_PREFIXES = ("SCCACHE_", "AWS_", "ACTIONS_")
POLL_S = 1.0


def _conf() -> dict[str, str]:
    if not SECRET.exists():
        return {}
    conf = {}
    for line in SECRET.read_text(encoding="utf-8").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            conf[key] = value
    return conf


def _mask(text: str, conf: dict[str, str]) -> str:
    for key, value in conf.items():
        if key.startswith(REMOTE_PREFIXES) and len(value) >= 4 and not key.endswith(("_ENDPOINT", "_BUCKET")):
            text = text.replace(value, "***")
    return text


CA_BUNDLE = Path("/run/secrets/ca_bundle")


def _remote_env(conf: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in conf.items() if k.startswith(REMOTE_PREFIXES)}
    if CA_BUNDLE.exists():
        # An https backend behind a TLS-inspecting proxy: the build's CA bundle, as pip gets it.
        env["SSL_CERT_FILE"] = str(CA_BUNDLE)
    return env


def _sccache(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sccache", *args], env=env, capture_output=True, text=True, timeout=timeout, check=False)


def _start_server(env: dict[str, str]) -> str | None:
    """None when the server answers, else the reason it did not start (its error log's last line)."""
    log = STATE / "server-error.log"
    log.unlink(missing_ok=True)
    try:
        proc = _sccache("--start-server", env={**env, "SCCACHE_ERROR_LOG": str(log)}, timeout=30)
    except subprocess.TimeoutExpired:
        return "sccache did not start within 30 s"
    if proc.returncode == 0:
        return None
    lines = [line for line in (log.read_text(errors="replace") if log.exists() else "").splitlines() if line.strip()]
    said = (proc.stderr or proc.stdout).strip().splitlines()
    return (lines[-1] if lines else said[-1] if said else f"exit {proc.returncode}")[:300]


def _stats() -> dict[str, Any]:
    proc = _sccache("--show-stats", "--stats-format=json", timeout=30)
    try:
        data: dict[str, Any] = json.loads(proc.stdout)
    except ValueError:
        return {}
    return data


def _summary(data: dict[str, Any]) -> dict[str, int]:
    stats = data.get("stats") or {}

    def total(key: str) -> int:
        value = stats.get(key) or {}
        return sum(int(v) for v in (value.get("counts") or {}).values()) if isinstance(value, dict) else int(value)

    return {
        "requests": int(stats.get("compile_requests") or 0),
        "hits": total("cache_hits"),
        "misses": total("cache_misses"),
        "errors": total("cache_errors")
        + int(stats.get("cache_read_errors") or 0)
        + int(stats.get("cache_write_errors") or 0)
        + int(stats.get("cache_timeouts") or 0),
        "writes": int(stats.get("cache_writes") or 0),
        "not_cacheable": int(stats.get("requests_not_cacheable") or 0)
        + int(stats.get("non_cacheable_compilations") or 0),
    }


def _event(text: str) -> None:
    with (STATE / "events").open("a", encoding="utf-8") as fh:
        fh.write(text.replace("\n", " ") + "\n")


def _reachable(endpoint: str) -> bool:
    parts = urlsplit(endpoint if "://" in endpoint else f"redis://{endpoint}")
    try:
        socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 6379), timeout=2).close()
    except OSError:
        return False
    return True


def _fall_back(conf: dict[str, str], why: str) -> None:
    """Swap the shared backend for the local folder while the compile runs: the counters so far are kept, the
    server restarts without the backend, and a compile caught in between runs the compiler itself
    (SCCACHE_IGNORE_SERVER_IO_ERROR=1)."""
    (STATE / "remote-stats.json").write_text(json.dumps(_summary(_stats())))
    _sccache("--stop-server", timeout=30)
    local = {k: v for k, v in os.environ.items() if not k.startswith(REMOTE_PREFIXES) or k in _LOCAL_KEEP}
    _start_server(local)
    backend = conf.get("FORGE_CACHE_BACKEND", "?")
    _event(
        f"{backend} {conf.get('FORGE_CACHE_ENDPOINT', '')}: {_mask(why, conf)}; the rest of the compile used "
        "the local cache folder"
    )


# The compile's own sccache settings (where the local folder and the server's socket are), set by the template.
_LOCAL_KEEP = ("SCCACHE_DIR", "SCCACHE_SERVER_UDS", "SCCACHE_IGNORE_SERVER_IO_ERROR", "SCCACHE_IDLE_TIMEOUT")


def watch() -> int:
    conf = _conf()
    redis = conf.get("SCCACHE_REDIS_ENDPOINT")
    while not (STATE / "stop").exists():
        if redis and not _reachable(redis):
            _fall_back(conf, "stopped answering during the compile")
            return 0
        errors = _summary(_stats()).get("errors", 0)
        if errors:
            _fall_back(conf, f"{errors} cache read or write errors during the compile (full, corrupt or refusing)")
            return 0
        time.sleep(POLL_S)
    return 0


def start() -> int:
    STATE.mkdir(parents=True, exist_ok=True)
    for name in ("events", "remote-stats.json", "stop", "watch.pid"):
        (STATE / name).unlink(missing_ok=True)
    conf = _conf()
    base = {k: v for k, v in os.environ.items() if not k.startswith(REMOTE_PREFIXES) or k in _LOCAL_KEEP}
    remote = _remote_env(conf)
    if not conf or conf.get("FORGE_CACHE_BACKEND", "local") == "local":
        why = _start_server(base)
        return 0 if why is None else _fail(f"sccache could not start: {why}")
    why = _start_server({**base, **remote})
    if why is not None:
        _event(
            f"{conf.get('FORGE_CACHE_BACKEND')} {conf.get('FORGE_CACHE_ENDPOINT', '')}: sccache could not start "
            f"on it ({_mask(why, conf)}); the compile used the local cache folder"
        )
        if conf.get("FORGE_REQUIRE_CACHE") == "1":
            return _fail("the shared compiler cache failed and FORGE_REQUIRE_CACHE=1")
        local_why = _start_server(base)
        if local_why is not None:
            return _fail(f"sccache could not start on the local folder either: {local_why}")
    else:
        watcher = subprocess.Popen(
            [sys.executable, __file__, "watch"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        (STATE / "watch.pid").write_text(str(watcher.pid))
        print(
            f"forge compiler cache: sccache on {conf.get('FORGE_CACHE_BACKEND')} {conf.get('FORGE_CACHE_ENDPOINT', '')}",
            flush=True,
        )
    _sccache("--zero-stats", timeout=30)
    return 0


def _fail(text: str) -> int:
    print(f"forge compiler cache: {text}", file=sys.stderr, flush=True)
    return 1


def stop() -> int:
    conf = _conf()
    (STATE / "stop").touch()
    pid_file = STATE / "watch.pid"
    if pid_file.exists():
        pid = int(pid_file.read_text())
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.2)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    events = (STATE / "events").read_text().splitlines() if (STATE / "events").exists() else []
    backend = conf.get("FORGE_CACHE_BACKEND", "local")
    segments = []
    remote = STATE / "remote-stats.json"
    if remote.exists():
        segments.append({"backend": backend, **json.loads(remote.read_text())})
        segments.append({"backend": "local", **_summary(_stats())})
    else:
        segments.append({"backend": "local" if events else backend, **_summary(_stats())})
    _sccache("--stop-server", timeout=30)
    record = {
        "launcher": "sccache",
        "backend": backend,
        "endpoint": conf.get("FORGE_CACHE_ENDPOINT", ""),
        "segments": segments,
        "events": events,
    }
    print(BEGIN)
    print(json.dumps(record, sort_keys=True))
    print(END, flush=True)
    if events and conf.get("FORGE_REQUIRE_CACHE") == "1":
        return _fail("the shared compiler cache failed and FORGE_REQUIRE_CACHE=1")
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    # A child that exited and was never reaped is a zombie: gone for this purpose.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def main(argv: list[str]) -> int:
    commands = {"start": start, "stop": stop, "watch": watch}
    if len(argv) != 1 or argv[0] not in commands:
        return _fail(f"usage: compiler_cache.py {{{'|'.join(commands)}}}")
    return commands[argv[0]]()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
