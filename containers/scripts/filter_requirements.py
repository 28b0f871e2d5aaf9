"""Rewrite vLLM requirement files in place for a build against an already-installed torch.

Dropped: torch and its add-ons (torchvision, torchaudio, torchcodec: their PyPI builds pin other torch builds),
direct URL requirements (triton-cpu from GitHub), and optionally cmake (so the distro's CMake is used and
its version gate stays meaningful). Each dropped line is printed, so the build log says what was left out.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

DROP = re.compile(r"^\s*(torch|torchvision|torchaudio|torchcodec)\s*([=<>!~;\[]|$)", re.IGNORECASE)
CMAKE = re.compile(r"^\s*cmake\s*([=<>!~;]|$)", re.IGNORECASE)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--drop-cmake", choices=("yes", "no"), default="no")
    parser.add_argument("files", nargs="+", type=Path)
    args = parser.parse_args()
    for path in args.files:
        if not path.exists():
            continue
        kept = []
        for line in path.read_text().splitlines():
            reason = None
            if DROP.match(line):
                reason = "torch family: the installed torch is used"
            elif " @ " in line and "://" in line:
                reason = "direct URL requirement"
            elif args.drop_cmake == "yes" and CMAKE.match(line):
                reason = "the distro's CMake is used"
            if reason:
                print(f"forge: {path}: dropped {line.strip()!r} ({reason})")
                continue
            kept.append(line)
        path.write_text("\n".join(kept) + "\n")


if __name__ == "__main__":
    main()
