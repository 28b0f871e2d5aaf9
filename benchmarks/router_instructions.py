"""Instructions Forge's router executes per streamed chat request, counted by callgrind, for this checkout and the
refs given, in one run.

bench_router.py reads each router's CPU time, which other jobs on the machine move by 5-10 % between runs (cache and
frequency). An instruction count does not move with them: the same code on the same requests executes the same
instructions, give or take the reads that coalesce differently. Each router runs under valgrind's callgrind behind
bench_router's fake upstream (32 events per stream, spaced so that each arrives in a read of its own, as a served
model's tokens do); the counters are zeroed after a warm-up and dumped after the measured requests. The C relay is
measured where the ref's _fastrelay.c is this checkout's (its built module is copied into the ref's tree).

Needs valgrind (callgrind_control included); minutes per router, since everything runs some fifty times slower.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_router import _one_stream, free_port  # noqa: E402

CHUNKS = 32
WARM_UP = 32
CONCURRENCY = 4


def export(ref: str) -> tuple[Path, bool]:
    """The ref's builders/ in a folder of its own, and whether its C relay is this checkout's (then copied in)."""
    tree = Path(tempfile.mkdtemp(prefix="forge-router-instructions-"))
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "builders"], capture_output=True, check=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(tree, filter="data")
    same = (
        subprocess.run(
            ["git", "-C", str(ROOT), "diff", "--quiet", ref, "--", "builders/router/_fastrelay.c"], check=False
        ).returncode
        == 0
    )
    built = sorted((ROOT / "builders" / "router").glob("_fastrelay*.so"))
    if same and built:
        shutil.copy2(built[0], tree / "builders" / "router" / built[0].name)
    return tree, same and bool(built)


async def drive(port: int, requests: int) -> None:
    async def worker(count: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(count):
            await _one_stream(reader, writer, f"127.0.0.1:{port}", CHUNKS + 1)
        writer.close()

    await asyncio.gather(*(worker(requests // CONCURRENCY) for _ in range(CONCURRENCY)))


def count(tree: Path, upstream: str, requests: int, *, native: bool) -> float:
    """Instructions per request of the router in `tree`, over `requests` streamed requests after a warm-up."""
    port = free_port()
    work = Path(tempfile.mkdtemp(prefix="forge-router-instructions-run-"))
    config = work / "router.json"
    config.write_text(json.dumps({"pools": {"p": [upstream]}, "default_pool": "p", "host": "127.0.0.1", "port": port}))
    out = work / "callgrind.out"
    code = f"import sys; sys.path.insert(0, {str(tree)!r}); from builders.router.__main__ import main; sys.exit(main())"
    env = {**os.environ, "PYTHONPATH": str(tree), "FORGE_ROUTER_NATIVE": "1" if native else "0"}
    # The interpreter itself, not a shim script: callgrind would count the shell that execs it.
    python = os.path.realpath(sys.executable)
    argv = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", python, "-c", code, "--config", str(config)]
    router = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    try:
        assert router.stdout is not None
        line = router.stdout.readline().decode()
        if "listening on" not in line:
            raise RuntimeError(f"the router did not start under valgrind: {line!r}")
        relay = router.stdout.readline().decode().strip()
        if ("relay: native" in relay) != native:
            raise RuntimeError(f"asked for the {'C' if native else 'Python'} relay, got: {relay}")
        asyncio.run(drive(port, WARM_UP))
        subprocess.run(["callgrind_control", "-z", str(router.pid)], check=True, capture_output=True)
        asyncio.run(drive(port, requests))
        subprocess.run(["callgrind_control", "-d", str(router.pid)], check=True, capture_output=True)
        for _ in range(50):
            dumps = sorted(work.glob("callgrind.out.*"))
            if dumps:
                break
            time.sleep(0.1)
        for text in dumps[0].read_text().splitlines():
            if text.startswith("summary:"):
                return int(text.split()[1]) / requests
        raise RuntimeError(f"no summary line in {dumps[0]}")
    finally:
        router.kill()
        router.wait()
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--forge-ref", action="append", default=[], metavar="REF", help="also count this git ref")
    parser.add_argument("--requests", type=int, default=200, help="measured requests per router (default 200)")
    parser.add_argument("--repeat", type=int, default=2, help="runs per router, interleaved (default 2)")
    parser.add_argument("--interval-ms", type=float, default=20.0, help="gap between upstream events (default 20)")
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("router-instructions: needs valgrind and callgrind_control on PATH", file=sys.stderr)
        return 2
    trees: dict[str, tuple[Path, bool]] = {"checkout": (ROOT, True)}
    trees.update({f"forge@{ref}": export(ref) for ref in args.forge_ref})
    upstream_port = free_port()
    upstream = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).resolve().parent / "bench_router.py"),
            "--serve-upstream",
            str(upstream_port),
            "--chunks",
            str(CHUNKS),
            "--interval-ms",
            str(args.interval_ms),
        ]
    )
    rows: dict[tuple[str, str], list[float]] = {}
    try:
        time.sleep(1)
        for _ in range(args.repeat):
            for name, (tree, has_native) in trees.items():
                for native in (True, False) if has_native else (False,):
                    per = count(tree, f"http://127.0.0.1:{upstream_port}", args.requests, native=native)
                    rows.setdefault((name, "C" if native else "Python"), []).append(per)
                    print(f"router-instructions: {name} ({'C' if native else 'Python'} relay): {per:,.0f}", flush=True)
    finally:
        upstream.kill()
    print(f"\ninstructions per streamed request ({CHUNKS} events, {args.requests} requests, {args.repeat} runs each)")
    for (name, relay), values in rows.items():
        print(
            f"{name:<24} {relay:<7} relay  mean {sum(values) / len(values):>11,.0f}   runs {', '.join(f'{v:,.0f}' for v in values)}"
        )
    for relay in ("C", "Python"):
        base = rows.get(("checkout", relay))
        for (name, other), values in rows.items():
            if other == relay and name != "checkout" and base:
                ratio = (sum(base) / len(base)) / (sum(values) / len(values))
                print(f"checkout ÷ {name} ({relay} relay): {ratio:.4f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
