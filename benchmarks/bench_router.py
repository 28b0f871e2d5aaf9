"""What a router costs in front of a streaming OpenAI server, for four routers measured in one run.

Forge's router, vllm-router and sglang-router against a direct connection, all in front of one fake
streaming upstream on loopback.

Each router runs pinned to one core; the load generator and the fake upstream share the other. For each it
prints requests/s, the TTFT p50/p99 it adds over the direct connection, and its own CPU time per request,
read from the kernel's CPU clock of each process in the router's tree (clock_gettime on the process's
CPU-time clock: the scheduler's nanosecond count) over the measured window. /proc/<pid>/stat's utime and
stime are sampled at the 100 Hz tick, which for a router using 5% of a core in a 10 s window is about 50
samples: runs of the same router differed by up to 40% that way. Only the sys share still comes from them.
CPU per request is the robust figure: it does not depend on what else runs on the machine, while req/s and
TTFT do.

vllm-router and sglang-router are not dependencies of Forge: the benchmark installs each into its own
throwaway venv (under --routers-dir) on first use, and a router it cannot install or start is reported as
not measured, with the reason.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The routers measured run from this checkout (pinned_process puts it on their PYTHONPATH), so what this
# file reads of Forge comes from it too, whichever checkout `pip install -e` last pointed at.
sys.path.insert(0, str(ROOT))

from builders.results import Figure, LoadWatch, Result  # noqa: E402
from builders.router.native import ENV_SWITCH, NativeRelay  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")

THIRD_PARTY = {"vllm-router": "0.1.17", "sglang-router": "0.3.2"}
"""Pinned so that numbers from two runs compare the same code."""


# --- the fake upstream: a minimal HTTP/1.1 server streaming OpenAI chat chunks ---------------------------------


def _chunk_event(i: int) -> bytes:
    payload = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "bench",
        "choices": [{"index": 0, "delta": {"content": f"tok{i} "}, "finish_reason": None}],
    }
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def _chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class _UpstreamProtocol(asyncio.Protocol):
    """Keep-alive HTTP/1.1 with just enough parsing for the routers' requests: health, models, chat."""

    def __init__(self, events: list[bytes], interval_s: float) -> None:
        self._events = events
        self._interval = interval_s
        self._buffer = b""
        self._transport: asyncio.Transport | None = None
        self._busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        self._next()

    def _next(self) -> None:
        if self._busy or self._transport is None:
            return
        head_end = self._buffer.find(b"\r\n\r\n")
        if head_end < 0:
            return
        head = self._buffer[:head_end].decode("latin-1")
        length = 0
        for line in head.split("\r\n")[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        if len(self._buffer) < head_end + 4 + length:
            return
        body = self._buffer[head_end + 4 : head_end + 4 + length]
        self._buffer = self._buffer[head_end + 4 + length :]
        method, path = head.split(" ", 2)[:2]
        if method == "POST":
            self._busy = True
            self._stream(json.loads(body or b"{}").get("stream", False))
        else:
            answer = {"object": "list", "data": [{"id": "bench", "object": "model"}]} if path == "/v1/models" else {}
            self._reply(200, "application/json", json.dumps(answer).encode())

    def _reply(self, status: int, content_type: str, body: bytes) -> None:
        assert self._transport is not None
        head = f"HTTP/1.1 {status} OK\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
        self._transport.write(head.encode() + body)

    def _stream(self, stream: bool) -> None:
        assert self._transport is not None
        if not stream:
            text = "".join(f"tok{i} " for i in range(len(self._events)))
            answer = {"id": "bench", "choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}
            self._reply(200, "application/json", json.dumps(answer).encode())
            self._busy = False
            self._next()
            return
        self._transport.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        loop = asyncio.get_running_loop()

        def send(i: int) -> None:
            if self._transport is None:
                return
            if i < len(self._events):
                self._transport.write(_chunked(self._events[i]))
                loop.call_later(self._interval, send, i + 1)
                return
            self._transport.write(_chunked(b"data: [DONE]\n\n") + b"0\r\n\r\n")
            self._busy = False
            self._next()

        send(0)


async def _serve_upstream(port: int, chunks: int, interval_s: float) -> None:
    events = [_chunk_event(i) for i in range(chunks)]
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _UpstreamProtocol(events, interval_s), "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


# --- the load generator ----------------------------------------------------------------------------------------

REQUEST_BODY = json.dumps(
    {
        "model": "bench",
        "messages": [{"role": "user", "content": "Say something short."}],
        "stream": True,
        "max_tokens": 64,
    }
).encode()


@dataclass
class LoadResult:
    ttft_s: list[float] = field(default_factory=list)
    completed: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)


async def _one_stream(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str, expected_events: int
) -> float:
    """Send one streamed chat request on a keep-alive connection; its TTFT, after checking every event came."""
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Accept: text/event-stream\r\nContent-Length: {len(REQUEST_BODY)}\r\n\r\n"
    ).encode() + REQUEST_BODY
    sent = time.perf_counter()
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    status = head.split(b" ", 2)[1]
    if status != b"200":
        raise RuntimeError(f"status {status.decode()}: {head[:200]!r}")
    lower = head.lower()
    ttft = 0.0
    body = b""
    if b"transfer-encoding: chunked" in lower:
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            data = await reader.readexactly(size + 2)
            if size == 0:
                break
            if not ttft:
                ttft = time.perf_counter() - sent
            body += data[:-2]
    else:
        marker = b"content-length:"
        at = lower.find(marker)
        if at < 0:
            raise RuntimeError("neither chunked nor Content-Length: cannot tell where the stream ends")
        length = int(lower[at + len(marker) :].split(b"\r\n")[0])
        first = await reader.read(length)
        ttft = time.perf_counter() - sent
        body = first + await reader.readexactly(length - len(first))
    events = body.count(b"data:")
    if events != expected_events:
        raise RuntimeError(f"got {events} SSE events, expected {expected_events}")
    return ttft


async def _drive(
    url: str, *, concurrency: int, warmup_s: float, duration_s: float, chunks: int, on_window: Callable[[bool], None]
) -> LoadResult:
    host, port = url.removeprefix("http://").split(":")
    result = LoadResult()
    loop = asyncio.get_running_loop()
    start = loop.time()
    window_open, window_close = start + warmup_s, start + warmup_s + duration_s
    opened = asyncio.Event()

    async def opener() -> None:
        await asyncio.sleep(warmup_s)
        on_window(True)
        opened.set()

    async def worker() -> None:
        reader: asyncio.StreamReader | None = None
        writer: asyncio.StreamWriter | None = None
        while loop.time() < window_close:
            if writer is None or reader is None:
                reader, writer = await asyncio.open_connection(host, int(port))
            began = loop.time()
            try:
                ttft = await _one_stream(reader, writer, host, chunks + 1)
            except (OSError, RuntimeError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
                if window_open <= began:
                    result.failed += 1
                    if len(result.errors) < 3:
                        result.errors.append(f"{type(exc).__name__}: {exc}")
                writer.close()
                reader = writer = None
                continue
            # Only requests that started and ended inside the window count, so CPU and count match.
            if opened.is_set() and window_open <= began and loop.time() <= window_close:
                result.completed += 1
                result.ttft_s.append(ttft)
        if writer is not None:
            writer.close()

    opener_task = asyncio.create_task(opener())
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    await opener_task
    on_window(False)
    return result


# --- the routers -----------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def process_cpu_clock(pid: int) -> int:
    """The clock id of a process's CPU time (Linux: MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED))."""
    return ((~pid) << 3) | 2


def tree_cpu_s(pid: int) -> tuple[float, float, float]:
    """(cpu, utime, stime) of pid and every descendant, in seconds (dead threads' time stays in their process).

    cpu is exact (the scheduler's count); utime and stime are tick samples, good for the sys share only.
    """
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
    cpu, user, system, todo = 0.0, 0, 0, [pid]
    while todo:
        current = todo.pop()
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
            # fields[0] is field 3 (state): utime and stime are fields 14 and 15.
            user, system = user + int(fields[11]), system + int(fields[12])
            cpu += time.clock_gettime(process_cpu_clock(current))
        todo.extend(children.get(current, []))
    return cpu, user / CLK_TCK, system / CLK_TCK


@dataclass(frozen=True, kw_only=True)
class RouterSpec:
    name: str
    command: Callable[[str, int], list[str]] | None
    """upstream URL, listen port -> argv; None for the direct connection."""
    unavailable: str | None = None


def _venv_python(routers_dir: Path, package: str, version: str, install: bool) -> tuple[Path | None, str | None]:
    """The python of a venv holding package==version, installing it there on first use."""
    venv = routers_dir / f"{package}-{version}"
    python = venv / "bin" / "python"
    stamp = venv / ".installed"
    if stamp.exists():
        return python, None
    if not install:
        return None, f"not installed under {venv} and --no-install was given"
    shutil.rmtree(venv, ignore_errors=True)
    print(f"bench-router: installing {package}=={version} into {venv} ...", flush=True)
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        [str(python), "-m", "pip", "install", "--quiet", f"{package}=={version}"],
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
            return None, f"`{' '.join(step[-3:])}` failed: {tail[0]}"
    stamp.touch()
    return python, None


def _forge_config(upstream: str, port: int) -> Path:
    config = Path(tempfile.mkdtemp(prefix="forge-bench-router-config-")) / "router.json"
    pools = {"pools": {"p": [upstream]}, "default_pool": "p", "host": "127.0.0.1", "port": port}
    config.write_text(json.dumps(pools))
    return config


def forge_at(ref: str) -> RouterSpec:
    """Forge's router as of a git ref, exported from this repository, to measure a change beside its parent in
    one run (machine drift makes numbers from two runs incomparable)."""
    name = f"forge@{ref}"
    tree = Path(tempfile.mkdtemp(prefix="forge-bench-router-ref-"))
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "builders"], capture_output=True, check=False)
    if archive.returncode != 0:
        why = archive.stderr.decode(errors="replace").strip().splitlines()
        return RouterSpec(name=name, command=None, unavailable=f"`git archive {ref}` failed: {why[-1] if why else ''}")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(tree, filter="data")
    # The exported tree goes first on sys.path, ahead of this checkout's (pinned_process's PYTHONPATH).
    code = f"import sys; sys.path.insert(0, {str(tree)!r}); from builders.router.__main__ import main; sys.exit(main())"

    def command(upstream: str, port: int) -> list[str]:
        return [sys.executable, "-c", code, "--config", str(_forge_config(upstream, port))]

    return RouterSpec(name=name, command=command)


def router_specs(routers_dir: Path, install: bool, policy: str, forge_refs: Sequence[str] = ()) -> list[RouterSpec]:
    def forge(upstream: str, port: int) -> list[str]:
        return [sys.executable, "-m", "builders.router", "--config", str(_forge_config(upstream, port))]

    def forge_python(upstream: str, port: int) -> list[str]:
        # env execs the router, so the pid measured is the router's own.
        return ["env", f"{ENV_SWITCH}=0", *forge(upstream, port)]

    specs = [RouterSpec(name="direct", command=None), RouterSpec(name="forge", command=forge)]
    # Forge with its C relay switched off: what the extension saves, measured in the same run.
    if NativeRelay is None:
        specs.append(RouterSpec(name="forge-python", command=None, unavailable="the C relay is not built here"))
    else:
        specs.append(RouterSpec(name="forge-python", command=forge_python))
    specs.extend(forge_at(ref) for ref in forge_refs)
    for package, version in THIRD_PARTY.items():
        python, why = _venv_python(routers_dir, package, version, install)
        if python is None:
            specs.append(RouterSpec(name=package, command=None, unavailable=why))
            continue
        specs.append(RouterSpec(name=package, command=_third_party_command(package, python, policy)))
    return specs


def _third_party_command(package: str, python: Path, policy: str) -> Callable[[str, int], list[str]]:
    def command(upstream: str, port: int) -> list[str]:
        module = "vllm_router.launch_router" if package == "vllm-router" else "sglang_router.launch_router"
        return [
            str(python),
            "-m",
            module,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--worker-urls",
            upstream,
            "--policy",
            policy,
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            str(free_port()),
            "--log-level",
            "warning" if package == "vllm-router" else "warn",
        ]

    return command


@contextlib.contextmanager
def pinned_process(argv: list[str], cpu: int, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
            # Threads the router starts later inherit the mask, so its whole runtime stays on one core.
            preexec_fn=lambda: os.sched_setaffinity(0, {cpu}),
            start_new_session=True,
        )
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


async def _wait_ready(url: str, proc: subprocess.Popen[bytes] | None, chunks: int, timeout_s: float) -> None:
    """Until one streamed request comes back whole: health endpoints differ, a real request does not."""
    host, port = url.removeprefix("http://").split(":")
    deadline = time.monotonic() + timeout_s
    last = "no attempt"
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"exited with status {proc.returncode} before serving")
        try:
            reader, writer = await asyncio.open_connection(host, int(port))
            try:
                await asyncio.wait_for(_one_stream(reader, writer, host, chunks + 1), timeout=5)
                return
            finally:
                writer.close()
        except (OSError, RuntimeError, ValueError, TimeoutError, asyncio.IncompleteReadError) as exc:
            last = f"{type(exc).__name__}: {exc}"
        await asyncio.sleep(0.2)
    raise RuntimeError(f"not serving after {timeout_s:.0f}s (last: {last})")


# --- the report ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Row:
    name: str
    measured: bool
    note: str = ""
    req_s: float = 0.0
    ttft_p50_ms: float = 0.0
    ttft_p99_ms: float = 0.0
    cpu_ms_per_req: float | None = None
    sys_ms_per_req: float | None = None
    """The kernel's share of cpu_ms_per_req: socket calls a router in any language makes."""
    completed: int = 0
    failed: int = 0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def render(rows: list[Row], args: argparse.Namespace) -> str:
    direct = next((r for r in rows if r.name == "direct" and r.measured), None)
    lines = [
        f"bench-router: {args.concurrency} streams in flight, {args.chunks} chunks per stream "
        f"{args.interval_ms:g} ms apart, {args.duration:g} s measured per router in {args.rounds} interleaved "
        f"rounds after {args.warmup:g} s warm-up; "
        f"routers on cpu {args.router_cpu}, load and upstream on cpu {args.client_cpu}; policy {args.policy}",
        "",
        f"{'router':<14} {'req/s':>8} {'TTFT p50':>9} {'TTFT p99':>9} {'+p50':>8} {'+p99':>8} "
        f"{'CPU/req':>9} {'of it sys':>9} {'failed':>7}",
        f"{'':<14} {'':>8} {'ms':>9} {'ms':>9} {'ms':>8} {'ms':>8} {'ms':>9} {'ms':>9} {'':>7}",
    ]
    for r in rows:
        if not r.measured:
            lines.append(f"{r.name:<14} NOT MEASURED: {r.note}")
            continue
        added = (
            (f"{r.ttft_p50_ms - direct.ttft_p50_ms:>+8.2f} {r.ttft_p99_ms - direct.ttft_p99_ms:>+8.2f}")
            if direct is not None and r.name != "direct"
            else f"{'-':>8} {'-':>8}"
        )
        cpu = (
            f"{r.cpu_ms_per_req:>9.3f} {r.sys_ms_per_req:>9.3f}"
            if r.cpu_ms_per_req is not None and r.sys_ms_per_req is not None
            else f"{'-':>9} {'-':>9}"
        )
        lines.append(
            f"{r.name:<14} {r.req_s:>8.1f} {r.ttft_p50_ms:>9.2f} {r.ttft_p99_ms:>9.2f} {added} {cpu} {r.failed:>7}"
        )
    notes = [f"{r.name}: {r.note}" for r in rows if r.measured and r.note]
    if notes:
        lines.extend(["", *notes])
    forge = next((r for r in rows if r.name == "forge" and r.measured), None)
    if forge is not None and forge.cpu_ms_per_req:
        lines.append("")
        for other in rows:
            if other.measured and other.name not in ("forge", "direct") and other.cpu_ms_per_req:
                lines.append(
                    f"forge CPU/request ÷ {other.name}: {forge.cpu_ms_per_req / other.cpu_ms_per_req:.2f}x   "
                    f"req/s ratio: {forge.req_s / other.req_s:.2f}x"
                )
    return "\n".join(lines)


def _event_loop_of(log: Path) -> str:
    """The event loop Forge's router says it runs on (CPU per request depends on it); '' for the others."""
    prefix = "forge router event loop: "
    with contextlib.suppress(OSError):
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith(prefix):
                return "event loop " + line.removeprefix(prefix).strip()
    return ""


@dataclass
class _Tally:
    """One router's measured windows, summed over the rounds."""

    url: str
    proc: subprocess.Popen[bytes] | None
    seconds: float = 0.0
    cpu_s: float = 0.0
    tick_user_s: float = 0.0
    tick_sys_s: float = 0.0
    load: LoadResult = field(default_factory=LoadResult)


async def _start(
    spec: RouterSpec, upstream: str, args: argparse.Namespace, logs: Path, stack: contextlib.ExitStack
) -> _Tally | Row:
    """The router started and serving (a tally to fill), or the row that says why it is not measured."""
    if spec.unavailable is not None:
        return Row(name=spec.name, measured=False, note=spec.unavailable)
    proc: subprocess.Popen[bytes] | None = None
    url = upstream
    if spec.command is not None:
        port = free_port()
        log = logs / f"{spec.name}.log"
        proc = stack.enter_context(pinned_process(spec.command(upstream, port), args.router_cpu, log))
        url = f"http://127.0.0.1:{port}"
    try:
        await _wait_ready(url, proc, args.chunks, args.start_timeout)
    except RuntimeError as exc:
        return Row(name=spec.name, measured=False, note=f"{exc}; see {logs / (spec.name + '.log')}")
    return _Tally(url=url, proc=proc)


async def _measure_window(tally: _Tally, args: argparse.Namespace, warmup_s: float) -> None:
    marks: dict[bool, tuple[float, float, float, float]] = {}
    proc = tally.proc

    def on_window(opening: bool) -> None:
        marks[opening] = (time.perf_counter(), *(tree_cpu_s(proc.pid) if proc is not None else (0.0, 0.0, 0.0)))

    result = await _drive(
        tally.url,
        concurrency=args.concurrency,
        warmup_s=warmup_s,
        duration_s=args.duration / args.rounds,
        chunks=args.chunks,
        on_window=on_window,
    )
    (t0, cpu0, user0, sys0), (t1, cpu1, user1, sys1) = marks[True], marks[False]
    tally.seconds += t1 - t0
    tally.cpu_s += cpu1 - cpu0
    tally.tick_user_s += user1 - user0
    tally.tick_sys_s += sys1 - sys0
    tally.load.completed += result.completed
    tally.load.failed += result.failed
    tally.load.ttft_s.extend(result.ttft_s)
    tally.load.errors.extend(result.errors[: max(0, 3 - len(tally.load.errors))])


def _row(name: str, tally: _Tally, logs: Path) -> Row:
    load = tally.load
    if not load.ttft_s:
        return Row(name=name, measured=False, note=f"no request completed: {load.errors}")
    per_request = 1000 / load.completed
    cpu = system = None
    if tally.proc is not None:
        cpu = tally.cpu_s * per_request
        ticks = tally.tick_user_s + tally.tick_sys_s
        # The tick samples' sys share of the exact total.
        system = cpu * tally.tick_sys_s / ticks if ticks > 0 else None
    if load.errors:
        print(f"bench-router: {name}: {load.failed} failed, e.g. {load.errors[0]}", file=sys.stderr)
    return Row(
        name=name,
        measured=True,
        req_s=load.completed / tally.seconds,
        ttft_p50_ms=statistics.median(load.ttft_s) * 1000,
        ttft_p99_ms=percentile(load.ttft_s, 0.99) * 1000,
        cpu_ms_per_req=cpu,
        sys_ms_per_req=system,
        completed=load.completed,
        failed=load.failed,
        note=_event_loop_of(logs / f"{name}.log"),
    )


async def run(args: argparse.Namespace) -> list[Row]:
    """Every router started at once (each idle while not measured), then measured in interleaved rounds.

    The machine's speed drifts over minutes (CPU per request of one router moved by half between runs
    here); measuring each router in every round, in a rotating order, shares that drift out evenly
    instead of handing it to whichever router ran last.
    """
    specs = router_specs(Path(args.routers_dir), not args.no_install, args.policy, args.forge_ref)
    if args.only:
        # Refs asked for by --forge-ref are measured whatever --only says.
        specs = [s for s in specs if s.name in args.only or s.name == "direct" or s.name.startswith("forge@")]
    logs = Path(tempfile.mkdtemp(prefix="forge-bench-router-"))
    upstream_port = free_port()
    upstream_argv = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--serve-upstream",
        str(upstream_port),
        "--chunks",
        str(args.chunks),
        "--interval-ms",
        str(args.interval_ms),
    ]
    with pinned_process(upstream_argv, args.client_cpu, logs / "upstream.log"), contextlib.ExitStack() as stack:
        upstream = f"http://127.0.0.1:{upstream_port}"
        started: dict[str, _Tally | Row] = {}
        for spec in specs:
            print(f"bench-router: starting {spec.name} ...", flush=True)
            started[spec.name] = await _start(spec, upstream, args, logs, stack)
        tallies = {name: t for name, t in started.items() if isinstance(t, _Tally)}
        order = list(tallies)
        for round_ in range(args.rounds):
            print(f"bench-router: round {round_ + 1} of {args.rounds}: {', '.join(order)}", flush=True)
            for name in order:
                await _measure_window(tallies[name], args, args.warmup if round_ == 0 else SETTLE_S)
            order = order[1:] + order[:1]
        return [_row(name, t, logs) if isinstance(t, _Tally) else t for name, t in started.items()]


SETTLE_S = 1.0
"""Load before each later round's window opens: connections are open and every stream in flight again."""


def result(name: str, rows: list[Row], args: argparse.Namespace, watch: LoadWatch) -> Result:
    """The run as results/NAME.json: each measured router's req/s, TTFT, what it adds over direct, CPU/request."""
    direct = next((r for r in rows if r.name == "direct" and r.measured), None)
    figures: dict[str, Figure | tuple[int | float, str]] = {}
    for r in rows:
        if not r.measured:
            continue
        figures |= {
            f"{r.name}.req_s": (round(r.req_s, 1), "requests/s"),
            f"{r.name}.ttft_p50": (round(r.ttft_p50_ms, 2), "ms"),
            f"{r.name}.ttft_p99": (round(r.ttft_p99_ms, 2), "ms"),
            f"{r.name}.failed": (r.failed, "count"),
        }
        if direct is not None and r is not direct:
            figures[f"{r.name}.added_ttft_p50"] = (round(r.ttft_p50_ms - direct.ttft_p50_ms, 2), "ms")
            figures[f"{r.name}.added_ttft_p99"] = (round(r.ttft_p99_ms - direct.ttft_p99_ms, 2), "ms")
        if r.cpu_ms_per_req is not None:
            figures[f"{r.name}.cpu_per_request"] = (round(r.cpu_ms_per_req, 3), "ms")
        if r.sys_ms_per_req is not None:
            figures[f"{r.name}.sys_per_request"] = (round(r.sys_ms_per_req, 3), "ms")
    skipped = "; ".join(f"{r.name}: {r.note}" for r in rows if not r.measured)
    argv = " ".join(sys.argv[1:])
    return Result.capture(
        name,
        command=f"nox -s bench-router -- {argv}".rstrip(),
        figures=figures,
        versions={"python": sys.version.split()[0], **THIRD_PARTY},
        load=watch,
        note=f"{args.concurrency} streams, {args.chunks} chunks {args.interval_ms:g} ms apart, {args.duration:g} s per "
        f"router in {args.rounds} rounds; req/s and TTFT depend on the host's load, CPU/request much less"
        + (f"; not measured: {skipped}" if skipped else ""),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--concurrency", type=int, default=32, help="streams in flight (default 32)")
    parser.add_argument("--chunks", type=int, default=32, help="SSE chunks per stream (default 32)")
    parser.add_argument(
        "--interval-ms", type=float, default=10.0, help="gap between upstream chunks (default 10, as a served model)"
    )
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds of load before measuring (default 3)")
    parser.add_argument(
        "--duration", type=float, default=12.0, help="seconds measured per router, over all rounds (default 12)"
    )
    parser.add_argument(
        "--rounds", type=int, default=4, help="interleaved windows each router is measured in (default 4)"
    )
    parser.add_argument("--router-cpu", type=int, default=0, help="the core each router is pinned to")
    parser.add_argument("--client-cpu", type=int, default=1, help="the core of the load generator and upstream")
    parser.add_argument(
        "--policy", default="round_robin", help="vllm-router/sglang-router policy (one upstream: no choice to make)"
    )
    parser.add_argument(
        "--forge-ref",
        action="append",
        default=[],
        metavar="REF",
        help="also measure Forge's router as of this git ref (repeatable), e.g. the parent of a change",
    )
    parser.add_argument("--only", nargs="*", help="measure only these routers (direct is always measured)")
    parser.add_argument(
        "--routers-dir",
        default=str(Path(tempfile.gettempdir()) / "forge-bench-routers"),
        help="where the throwaway venvs of vllm-router and sglang-router live",
    )
    parser.add_argument("--no-install", action="store_true", help="use only routers already installed there")
    parser.add_argument("--start-timeout", type=float, default=60.0, help="seconds a router may take to serve")
    parser.add_argument("--serve-upstream", type=int, help=argparse.SUPPRESS)
    parser.add_argument(
        "--save",
        nargs="?",
        const="router-bench",
        metavar="NAME",
        help="write the figures to results/NAME.json (default name: router-bench)",
    )
    args = parser.parse_args()
    if args.serve_upstream is not None:
        asyncio.run(_serve_upstream(args.serve_upstream, args.chunks, args.interval_ms / 1000))
        return 0
    available = os.sched_getaffinity(0)
    if {args.router_cpu, args.client_cpu} - available or args.router_cpu == args.client_cpu:
        print(
            f"bench-router: needs two distinct usable cores for --router-cpu and --client-cpu; usable: "
            f"{sorted(available)}",
            file=sys.stderr,
        )
        return 2
    os.sched_setaffinity(0, {args.client_cpu})
    watch = LoadWatch.start()
    rows = asyncio.run(run(args))
    print()
    print(render(rows, args))
    if args.save:
        print(f"bench-router: wrote {result(args.save, rows, args, watch).save(ROOT)}")
    return 0 if all(r.measured for r in rows if r.name in ("direct", "forge")) else 1


if __name__ == "__main__":
    sys.exit(main())
