"""The `forge` command line: each command module below registers its subcommands."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from importlib import metadata
from types import ModuleType
from typing import Any, NoReturn

from builders import gpu_probe, interrupt
from builders.commands import core, schema
from builders.config.types import unseen_character
from builders.container.select import CHOICES as ENGINE_CHOICES
from builders.container.select import chosen as chosen_engine
from builders.deploy import command as deploy_command
from builders.diagnose import command as diagnose_command
from builders.errors import ForgeError, UsageError
from builders.kvlab import command as kvlab_command
from builders.preflight import command as preflight_command
from builders.redact import mask_urls
from builders.repro import command as repro_command
from builders.smoke import command as smoke_command
from builders.sweep import command as sweep_command
from builders.verify import command as verify_command

# Each module exposes `register(subparsers)`, adding its subcommands with a `func` default that takes the parsed
# namespace and returns an exit code; `forge --help` lists them in this order.
COMMAND_MODULES: tuple[ModuleType, ...] = (
    core,
    preflight_command,
    diagnose_command,
    smoke_command,
    deploy_command,
    repro_command,
    verify_command,
    schema,
    sweep_command,
    kvlab_command,
    gpu_probe,
)

Handler = Callable[[argparse.Namespace], int]


class ForgeParser(argparse.ArgumentParser):
    """argparse without prefix matching: `--mutant` must not quietly run `--mutants`, and a flag added later must
    not change what an abbreviation meant. Subcommands' parsers are of this class too (add_subparsers' default)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        # argparse quotes the value it refused: a URL's password must not reach the terminal this way either.
        super().error(mask_urls(message))


def forge_version() -> str:
    try:
        return metadata.version("forge-vllm")
    except metadata.PackageNotFoundError:  # run from a checkout that was never pip-installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = ForgeParser(
        prog="forge",
        description="Build vLLM images from source on the distro you choose; learn why a build cannot work "
        "before it starts; prove the image serves mixed traffic.",
    )
    parser.add_argument("--version", action="version", version=f"forge {forge_version()}")
    parser.add_argument("--root", default=None, help="project root holding distros/, recipes/, containers/")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMAND_MODULES:
        module.register(subparsers)
    for sub in subparsers.choices.values():
        # Every command that meets an engine takes the same choice; main() resolves it once and the command
        # passes it down to its connect.
        sub.add_argument(
            "--engine",
            choices=ENGINE_CHOICES,
            default=None,
            help="container engine (default: $FORGE_ENGINE, else auto: Podman when `docker` or DOCKER_HOST is Podman)",
        )
    return parser


def innermost_parser(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.ArgumentParser:
    """The (sub)command parser argv reaches: `deploy render --bad` is deploy render's mistake, and its usage is the
    one that helps."""
    current = parser
    for token in argv:
        subs = [a for a in current._actions if isinstance(a, argparse._SubParsersAction)]
        if subs and token in subs[0].choices:
            current = subs[0].choices[token]
    return current


def unseen_argument(argv: Sequence[str]) -> UsageError | None:
    """A command-line value holding a line break, a control or an invisible format character (a right-to-left
    override) becomes a tag, a path, a session name or a line of a file: refused here, once, for every command."""
    for index, token in enumerate(argv):
        found = unseen_character(token)
        if found is None:
            continue
        flag = argv[index - 1] if index and argv[index - 1].startswith("-") else None
        # A key is never printed, not even a broken one.
        shown = "the value" if flag in SECRET_FLAGS else mask_urls(repr(token))
        return UsageError(
            f"argument {index + 1}, {shown}{f' after {flag}' if flag else ''}, holds {found}",
            hint="a command-line value is one line of visible text; retype it without the character",
        )
    return None


SECRET_FLAGS = frozenset({"--api-key"})


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    unseen = unseen_argument(argv)
    if unseen is not None:
        print(unseen.render(), file=sys.stderr)
        return unseen.exit_code
    args, extras = parser.parse_known_args(argv)
    if extras:
        innermost_parser(parser, argv).error(f"unrecognized arguments: {' '.join(extras)}")
    handler: Handler = args.func
    try:
        if getattr(args, "engine", None):
            # The flag is written to FORGE_ENGINE so that processes the command starts (a test stage, a nox
            # session) make the same choice. Without the flag FORGE_ENGINE is read only where an engine is
            # connected (`connect()`): `forge diagnose` or `forge kvlab` do not care what it says.
            args.engine = chosen_engine(args.engine)
            os.environ["FORGE_ENGINE"] = args.engine
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
    except OSError as exc:
        # A file the command could not read or write that no command turned into a typed error: name it, never
        # a traceback.
        print(ForgeError(os_error_text(exc)).render(), file=sys.stderr)
        return ForgeError.exit_code
    except UnicodeDecodeError as exc:
        print(ForgeError(f"a file is not UTF-8 text: {exc}").render(), file=sys.stderr)
        return ForgeError.exit_code
    except Exception as exc:
        # A failure no command turned into a typed error is a bug in Forge, but a traceback would show the user
        # nothing they can act on, and its frames may hold a URL with a password: one line, masked, exit 1.
        # FORGE_DEBUG=1 shows the traceback to whoever fixes it.
        if os.environ.get("FORGE_DEBUG"):
            raise
        error = ForgeError(
            f"internal error: {type(exc).__name__}: {exc}",
            hint="this is a bug in Forge: report it with the command line; FORGE_DEBUG=1 prints the traceback",
        )
        print(error.render(), file=sys.stderr)
        return ForgeError.exit_code


def os_error_text(exc: OSError) -> str:
    """`PATH: reason` as a user reads it: `[Errno 17] File exists: 'x'` says less than `x: File exists`."""
    where = exc.filename if exc.filename is not None else ""
    reason = exc.strerror or str(exc)
    return f"{where}: {reason}" if where else reason


if __name__ == "__main__":
    sys.exit(main())
