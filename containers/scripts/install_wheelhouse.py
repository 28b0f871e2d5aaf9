"""Install every wheel of a wheelhouse offline, except the excluded projects.

pip cannot leave out a dependency it resolves, so the wheelhouse is installed as a set with --no-deps;
`pip check` afterwards reports anything the set lacks, and the excluded projects are expected there.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path


def project(wheel: Path) -> str:
    return re.sub(r"[-_.]+", "-", wheel.name.split("-", 1)[0]).lower()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("wheelhouse", type=Path)
    parser.add_argument("--exclude", default="")
    args = parser.parse_args()
    excluded = {re.sub(r"[-_.]+", "-", e).lower() for e in args.exclude.split(",") if e}
    wheels = sorted(args.wheelhouse.glob("*.whl"))
    chosen = [w for w in wheels if project(w) not in excluded]
    for w in wheels:
        if w not in chosen:
            print(f"forge: left out {w.name} (excluded by the recipe)")
    if not chosen:
        sys.exit(f"forge: no wheels in {args.wheelhouse}")
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--no-compile",
                    *map(str, chosen)], check=True)
    check = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
    missing = [line for line in check.stdout.splitlines() if not any(e in line.lower() for e in excluded)]
    for line in missing:
        print(f"forge: pip check: {line}")


if __name__ == "__main__":
    main()
