"""The `forge` command line: one subcommand per module that registers itself."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from builders import interrupt
from builders.errors import ForgeError

# Each module exposes `register(subparsers)`, adding its subcommands with a `func`
# default that takes the parsed namespace and returns an exit code.
COMMAND_MODULES = (
    "builders.commands.core",
    "builders.preflight.command",
    "builders.diagnose.command",
    "builders.smoke.command",
    "builders.deploy.command",
    "builders.repro.command",
    "builders.commands.schema",
    "builders.sweep.command",
    "builders.kvlab.command",
)

Handler = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="forge",
        description="Build vLLM images from source on the distro you choose; learn why a build cannot work "
        "before it starts; prove the image serves mixed traffic.",
    )
    parser.add_argument("--root", default=None, help="project root holding distros/, recipes/, containers/")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        try:
            module: Any = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and name.startswith(exc.name):
                continue
            raise
        module.register(subparsers)
    for sub in subparsers.choices.values():
        # Every command that meets an engine takes the same choice; Engine.connect() reads it from FORGE_ENGINE,
        # so processes a command starts (a test stage, a nox session) inherit it.
        sub.add_argument(
            "--engine",
            choices=("auto", "docker", "podman"),
            default=None,
            help="container engine (default: $FORGE_ENGINE, else auto: Podman when `docker` or DOCKER_HOST is Podman)",
        )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler = args.func
    if getattr(args, "engine", None):
        os.environ["FORGE_ENGINE"] = args.engine
    try:
        # SIGTERM and SIGHUP unwind as Ctrl-C does, in every command (builders/interrupt.py).
        with interrupt.handled():
            return handler(args)
    except ForgeError as exc:
        print(exc.render(), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        code = interrupt.exit_code_of(exc)
        print(f"forge: interrupted by {interrupt.signal_of(exc)} (exit {code})", file=sys.stderr)
        return code
    except BrokenPipeError:
        # `forge diagnose LOG | head`: the reader left; say nothing more and do not print a traceback.
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
