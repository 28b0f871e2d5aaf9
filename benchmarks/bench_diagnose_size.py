"""How `forge diagnose` time grows with a log's size: real logs of tests/logs padded to 5, 50 and 500 MB.

A log of a real failed build (BuildKit, the classic builder) gets, before its failing region, real compile lines
cycled from tests/logs until the file reaches the size. In a BuildKit log the padding carries the failing step's
prefix (`#N 12.3 `): the step that failed is then the long one, the case a window on the log's end alone would
miss. Each padded log is diagnosed by the `forge diagnose` command (a new process, start-up and rule loading
included) and must give the unpadded log's answer: the same category and decisive line, its number moved by the
padding. Printed: wall seconds, CPU seconds of the process (user + system, which other work on the machine does
not inflate), MB/s, and each size's CPU time as a ratio of the first size's (10x the size each step; a diagnosis
linear in the size would show 10 and 100).

Run: `nox -s bench-diagnose-size` (or `python benchmarks/bench_diagnose_size.py [--sizes 5,50,500] [--logs A,B]
[--save]`); `--save` writes results/diagnose-size.json, each size's fastest and slowest log in wall and CPU seconds.
The padded files are written to a temporary folder one at a time and removed after their run.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from builders.diagnose import diagnose_text  # noqa: E402
from builders.results import Figure, LoadWatch, Result  # noqa: E402

LOGS = ROOT / "tests" / "logs"
# A BuildKit log whose failing step is long (a forced compile), a BuildKit log of a compile killed by the OOM
# killer, and a classic-builder log whose link failed on a full disk.
DEFAULT_LOGS = (
    "gcc-gate--debian12-forced-build-captured",
    "oom-killed--cc1plus-killed-after-400-steps",
    "disk-full--gcc-warnings-then-final-link-enospc",
)
DEFAULT_SIZES_MB = (5, 50, 500)
_NINJA = re.compile(r"\[\d+/\d+\] (?:Building|Linking) ")
_BUILDKIT_ERROR = re.compile(r"^#(\d+) (?:\d+\.\d+ )?ERROR\b", re.M)


def padding_lines() -> list[str]:
    """Real compile-progress lines from the corpus, without any prefix they had."""
    found: list[str] = []
    for path in sorted(LOGS.glob("*.log")):
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            match = _NINJA.search(line)
            if match and "error" not in line.lower() and "warning" not in line.lower():
                found.append(line[match.start() :])
    if not found:
        raise SystemExit("no compile lines found in tests/logs to pad with")
    return found


@dataclass(frozen=True)
class Answer:
    category: str
    line_number: int | None
    line: str | None


def answer_of(data: dict[str, object]) -> Answer:
    number = data.get("line_number")
    line = data.get("line")
    return Answer(
        category=str(data["category"]),
        line_number=number if isinstance(number, int) else None,
        line=line if isinstance(line, str) else None,
    )


def padded(log: str, size: int, pad: list[str], folder: Path) -> tuple[Path, int, Answer]:
    """The log with padding lines inserted before its first line, to `size` bytes; the padding's line count and
    the unpadded log's answer."""
    text = (LOGS / f"{log}.log").read_text(encoding="utf-8", errors="replace")
    original = answer_of(diagnose_text(text).to_dict())
    failed = _BUILDKIT_ERROR.search(text)
    prefix = f"#{failed.group(1)} 100.0 " if failed else ""
    path = folder / f"{log}-{size // 2**20}MB.log"
    added = 0
    with path.open("w", encoding="utf-8") as out:
        written = 0
        budget = size - len(text.encode("utf-8"))
        for line in itertools.cycle(pad):
            if written >= budget:
                break
            entry = f"{prefix}{line}\n"
            out.write(entry)
            written += len(entry.encode("utf-8"))
            added += 1
        out.write(text)
    return path, added, original


def diagnose_cli(path: Path) -> tuple[float, float, Answer]:
    """Wall seconds, CPU seconds (user + system: what the machine's load does not inflate) and the answer."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "builders.cli", "diagnose", str(path), "--json"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        raise SystemExit(f"forge diagnose {path} exited {proc.returncode}:\n{proc.stderr}")
    return seconds, cpu, answer_of(json.loads(proc.stdout))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES_MB)), help="MB, comma-separated")
    parser.add_argument("--logs", default=",".join(DEFAULT_LOGS), help="file stems in tests/logs, comma-separated")
    parser.add_argument("--save", action="store_true", help="write results/diagnose-size.json")
    args = parser.parse_args(argv)
    watch = LoadWatch.start()
    timed: dict[int, list[tuple[float, float]]] = {}
    sizes = [int(s) for s in args.sizes.split(",") if s]
    pad = padding_lines()
    load = " ".join(Path("/proc/loadavg").read_text(encoding="ascii").split()[:3])
    print(f"bench-diagnose-size: {os.cpu_count()} CPUs, load average at start {load}")
    print(
        f"{'log':48s} {'MB':>5s} {'lines':>10s} {'seconds':>8s} {'CPU s':>6s} {'MB/s':>7s} {'x first':>8s}  same answer"
    )
    wrong = 0
    for log in [name for name in args.logs.split(",") if name]:
        first: float | None = None
        for size_mb in sizes:
            with tempfile.TemporaryDirectory(prefix="forge-bench-diagnose-") as tmp:
                path, added, original = padded(log, size_mb * 2**20, pad, Path(tmp))
                real = path.stat().st_size
                with path.open("rb") as fh:
                    lines = sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 24), b""))
                seconds, cpu, got = diagnose_cli(path)
            expected = Answer(
                category=original.category,
                line_number=None if original.line_number is None else original.line_number + added,
                line=original.line,
            )
            same = got == expected
            timed.setdefault(size_mb, []).append((seconds, cpu))
            wrong += not same
            first = first if first is not None else cpu
            print(
                f"{log[:48]:48s} {real / 2**20:5.0f} {lines:10,d} {seconds:8.2f} {cpu:6.2f} "
                f"{real / 2**20 / seconds:7.1f} {cpu / first:8.1f}  "
                f"{'yes' if same else f'NO: {got} (expected {expected})'}"
            )
    print(f"load average at end {' '.join(Path('/proc/loadavg').read_text(encoding='ascii').split()[:3])}")
    if args.save and not wrong:
        figures: dict[str, Figure | tuple[float, str]] = {}
        for size_mb, runs in timed.items():
            walls, cpus = [w for w, _ in runs], [c for _, c in runs]
            figures |= {
                f"mb{size_mb}.size": (size_mb, "MB"),
                f"mb{size_mb}.wall.min": (round(min(walls), 1), "s"),
                f"mb{size_mb}.wall.max": (round(max(walls), 1), "s"),
                f"mb{size_mb}.cpu.min": (round(min(cpus), 1), "s"),
                f"mb{size_mb}.cpu.max": (round(max(cpus), 1), "s"),
                f"mb{size_mb}.logs": (len(runs), "count"),
            }
        saved = Result.capture(
            "diagnose-size",
            command="nox -s bench-diagnose-size -- --save",
            figures=figures,
            versions={"python": sys.version.split()[0]},
            load=watch,
            note="wall seconds depend on the load recorded; CPU seconds much less",
        ).save(ROOT)
        print(f"bench-diagnose-size: wrote {saved}", file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
