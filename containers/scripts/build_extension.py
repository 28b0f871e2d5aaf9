"""Compile one C source file into an extension module for the Python running this script.

The router image builds its C relay (builders/router/_fastrelay.c) with it in the venv stage, where the
distro's compiler and Python headers are installed, and copies only the module into the runtime stage.
setuptools is not used: the image's venv has no project to install, and the flags are few. The compiler
is CC where set (the distro's chosen one), else the interpreter's own (sysconfig), as setuptools would take it.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import sysconfig
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="the C file")
    parser.add_argument("module", help="the module's dotted name, e.g. builders.router._fastrelay")
    parser.add_argument("dest", type=Path, help="the folder the module's package tree is written under")
    args = parser.parse_args()

    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    *package, name = args.module.split(".")
    out = args.dest.joinpath(*package) / f"{name}{suffix}"
    out.parent.mkdir(parents=True, exist_ok=True)
    # CC first, as setuptools does: on UBI the distro's compiler is a gcc-toolset one, named by the Containerfile.
    compiler = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
    command = [
        *compiler,
        "-shared",
        "-fPIC",
        "-O2",
        "-Wall",
        "-Werror",
        f"-I{sysconfig.get_paths()['include']}",
        "-o",
        str(out),
        str(args.source),
    ]
    print("+", shlex.join(command), flush=True)
    done = subprocess.run(command, check=False)
    if done.returncode != 0:
        sys.exit(
            f"build_extension: compiling {args.source} failed (exit {done.returncode}); the compiler's output is above"
        )
    print(f"build_extension: {out}", flush=True)


if __name__ == "__main__":
    main()
