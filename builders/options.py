"""Build options, declared once: each BuildOptions field that the command line sets carries its flag (help,
metavar, how the text becomes the value) in its `Annotated` metadata, and the parser is generated from them.

Choices are the `Literal`s of the models (TorchIndex, GpuMode) or of the container engines (BuilderChoice), never retyped;
a boolean field is a switch, a `bool | None` one a --x/--no-x pair. PlanOptions, the pure planner's input, is
derived from BuildOptions by `plan_options` plus what the build resolved (the builder, the CA bundle, the pins).
"""

from __future__ import annotations

import argparse
import re
import types
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Annotated, Any, Literal, TypedDict, Union, get_args, get_origin, get_type_hints

from packaging.version import InvalidVersion, Version

from builders.config.models import GpuMode, TorchIndex
from builders.config.types import INT32_MAX
from builders.container.base import BuilderChoice, EngineChoice
from builders.errors import UsageError
from builders.plan import PlanOptions
from builders.target import Target

# One CUDA compute capability as TORCH_CUDA_ARCH_LIST spells it: 9.0, 10.0a, 12.0f, 8.0+PTX.
CUDA_ARCH = re.compile(r"\d+\.\d+[af]?(\+PTX)?")


def cuda_arch_list(value: str) -> str:
    """argparse type: capabilities separated by spaces or semicolons, as TORCH_CUDA_ARCH_LIST takes them."""
    archs = [a for a in re.split(r"[\s;]+", value.strip()) if a]
    bad = [a for a in archs if not CUDA_ARCH.fullmatch(a)]
    if not archs or bad:
        raise argparse.ArgumentTypeError(
            f"{value!r}: {'not a compute capability: ' + ', '.join(bad) if bad else 'empty'} "
            "(expected e.g. '8.0 9.0 10.0' or '9.0;12.0+PTX')"
        )
    return " ".join(archs)


def positive_int(value: str) -> int:
    """argparse type: a whole number ≥ 1 (0 or -3 parallel jobs mean nothing a compiler can do), and within 32 bits
    (what ninja, make and Kubernetes keep a count in)."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: not a whole number") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value!r}: must be 1 or more")
    if number > INT32_MAX:
        raise argparse.ArgumentTypeError(f"{value!r}: must be at most {INT32_MAX:,}")
    return number


# 9999-12-31T23:59:59Z: the last second Python's datetime, tar's ustar header and the SBOM's ISO timestamp can all
# write; SOURCE_DATE_EPOCH's own spec asks for a non-negative integer.
EPOCH_MAX = 253_402_300_799


def epoch_seconds(value: str) -> int:
    """argparse type for --source-date-epoch: whole seconds since 1970, from 0 to the end of year 9999 (a negative
    one was accepted and written into the base's files, which tar and the engines then refuse or mangle)."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: not whole seconds since 1970 (e.g. 1700000000)") from None
    if not 0 <= number <= EPOCH_MAX:
        raise argparse.ArgumentTypeError(f"{value!r}: must be from 0 (1970) to {EPOCH_MAX} (the end of 9999)")
    return number


def pep440_version(value: str) -> str:
    """argparse type: a PEP 440 version (2.9, 2.9.1, 2.9.1+cpu), normalised; anything else never reaches a
    Containerfile's pip line."""
    try:
        return str(Version(value))
    except InvalidVersion:
        raise argparse.ArgumentTypeError(f"{value!r}: not a PEP 440 version (e.g. 2.9.1 or 2.9.1+cpu)") from None


# An image reference as engines take it: [HOST[:PORT]/]NAME[/NAME…][:TAG], lower-case path components.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_REFERENCE = re.compile(
    rf"(?:[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::\d+)?/)?{_COMPONENT}(?:/{_COMPONENT})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
)
SOURCE_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*")


def image_reference(value: str) -> str:
    """argparse type: NAME[:TAG] as an engine tags it."""
    if not IMAGE_REFERENCE.fullmatch(value):
        raise argparse.ArgumentTypeError(f"{value!r}: not an image reference (e.g. forge/debian-12-cpu:dev)")
    return value


def parse_sources(values: list[str] | None) -> dict[str, Path]:
    out = {}
    for value in values or []:
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            raise UsageError(f"--source {value!r}: expected NAME=PATH", hint="for example --source onednn=/src/oneDNN")
        if not SOURCE_NAME.fullmatch(name):
            raise UsageError(
                f"--source {value!r}: {name!r} is not a source name", hint="lower-case letters, digits, . _ -"
            )
        out[name] = Path(path).resolve()
    return out


def _path(value: str | None) -> Path | None:
    return Path(value).resolve() if value else None


@dataclass(frozen=True)
class Flag:
    """How one option is spelled on the command line."""

    help: str | None = None
    # plan: render, plan and build take it (it shapes the Containerfile); build: only `forge build`.
    scope: Literal["plan", "build"] = "build"
    name: str | None = None  # default: --field-name
    metavar: str | None = None
    parse: Callable[[str], Any] | None = None  # argparse's type=: rejects bad text while parsing
    repeat: bool = False  # may be given more than once; the values arrive as a list
    convert: Callable[[Any], Any] | None = None  # parsed value → field value (paths resolved, NAME=PATH split)


@dataclass(frozen=True, kw_only=True)
class BuildOptions:
    # Shape the plan: the order here is the order of `forge build --help`.
    max_jobs: Annotated[
        int | None,
        Flag("parallel compile jobs, 1 or more (default: derived from RAM)", scope="plan", parse=positive_int),
    ] = None
    builder: Annotated[
        BuilderChoice,
        Flag(
            "image builder: Docker's BuildKit or legacy API, Podman's buildah (auto: the engine's best)", scope="plan"
        ),
    ] = "auto"
    torch_version: Annotated[
        str | None,
        Flag(
            "override vLLM's torch pin: a PEP 440 version, e.g. 2.9.1",
            scope="plan",
            metavar="VERSION",
            parse=pep440_version,
        ),
    ] = None
    torch_index: Annotated[
        TorchIndex | None, Flag("where torch comes from (PyPI's Linux torch is a CUDA build)", scope="plan")
    ] = None
    cmake_from_pip: Annotated[bool | None, Flag("use PyPI's cmake instead of the distro's", scope="plan")] = None
    gpu_mode: Annotated[
        GpuMode | None,
        Flag(
            "GPU targets: PyPI's CUDA wheel, or compile the pinned sdist (default: the recipe's cuda.mode)",
            scope="plan",
        ),
    ] = None
    cuda_arch_list: Annotated[
        str | None,
        Flag(
            "GPU source builds: TORCH_CUDA_ARCH_LIST, e.g. '9.0' for H100/H200 only (default: the recipe's)",
            scope="plan",
            metavar="ARCHS",
            parse=cuda_arch_list,
        ),
    ] = None
    # The build's own.
    skip_preflight: Annotated[
        bool, Flag("build without the preflight gates (the report then says preflight was skipped, never clear)")
    ] = False
    skip_tests: Annotated[bool, Flag("tag the image without running its test stage")] = False
    locked: Annotated[bool, Flag("refuse to build when an input differs from forge.lock")] = False
    # A path, or `none`; builders/trust.find_ca_bundle resolves it (and the environment's) to the file.
    ca_bundle: Annotated[str | None, Flag("PEM bundle to trust (default: $PIP_CERT etc.; `none` to disable)")] = None
    source_overrides: Annotated[
        dict[str, Path],
        Flag("use a local copy of a source", name="--source", metavar="NAME=PATH", repeat=True, convert=parse_sources),
    ] = field(default_factory=dict)
    wheelhouse: Annotated[Path | None, Flag("folder of wheels for wheel targets", convert=_path)] = None
    tag: Annotated[
        str | None,
        Flag(
            "tag the image NAME:TAG (default: forge/DISTRO-TARGET:VERSION; :latest is tagged too)",
            metavar="NAME:TAG",
            parse=image_reference,
        ),
    ] = None
    no_cache: Annotated[bool, Flag("build every step again, ignoring the engine's layer cache")] = False
    # Caches that outlive the runner (builders/cache/, docs/ci-caches.md); each flag's FORGE_* variable is its default.
    compiler_cache: Annotated[
        str | None,
        Flag(
            "shared compiler cache: local (ccache, default), redis://HOST:PORT, s3://BUCKET?endpoint=URL, "
            "webdav+https://HOST/PATH or gha; credentials from the environment (default: $FORGE_COMPILER_CACHE)",
            metavar="URL",
        ),
    ] = None
    cache_registry: Annotated[
        str | None,
        Flag(
            "registry repository for the build's layers, imported and exported (default: $FORGE_CACHE_REGISTRY)",
            metavar="HOST/REPO",
        ),
    ] = None
    cache_export: Annotated[
        bool | None, Flag("export this build's layers to --cache-registry (default: yes; $FORGE_CACHE_EXPORT)")
    ] = None
    require_cache: Annotated[
        bool, Flag("a cache that fails is an error, not a warning (default: $FORGE_REQUIRE_CACHE)")
    ] = False
    reports_dir: Annotated[
        Path | None,
        Flag(
            "where the report, log and Containerfile go (default: reports/DISTRO-TARGET)",
            name="--report-dir",
            convert=_path,
        ),
    ] = None
    scratch_dir: Annotated[
        Path | None, Flag("where the build context is staged (not a small tmpfs)", convert=_path)
    ] = None
    # Not on the command line: set by callers (verify-repro, tests, benchmarks).
    source_date_epoch: int | None = None
    keep_context: bool = False
    lock_file: Path | None = None  # default: forge.lock at the project root
    sbom: bool = True  # write a CycloneDX SBOM of the tagged image beside the report
    # The container engine: every command's --engine. None: FORGE_ENGINE, else auto, read by connect() when
    # the build connects one, so rendering or planning never reads FORGE_ENGINE.
    engine: EngineChoice | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> BuildOptions:
        """The options a parser made by add_flags read; a flag that parser did not take keeps its default."""
        given = {
            o.field: o.flag.convert(getattr(args, o.field)) if o.flag.convert else getattr(args, o.field)
            for o in cli_options()
            if hasattr(args, o.field)
        }
        if getattr(args, "engine", None):
            given["engine"] = args.engine
        return cls(**given)


@dataclass(frozen=True)
class CliOption:
    field: str
    flag: Flag
    type: Any  # the field's type, without the Annotated metadata

    @property
    def name(self) -> str:
        return self.flag.name or "--" + self.field.replace("_", "-")

    @property
    def choices(self) -> tuple[str, ...] | None:
        """The Literal's values, for a field typed by a Literal (or a Literal | None)."""
        literal = _bare(self.type)
        return tuple(get_args(literal)) if get_origin(literal) is Literal else None


def _is_union(tp: Any) -> bool:
    return get_origin(tp) in (Union, types.UnionType)


def cli_options(scope: Literal["plan", "build"] | None = None) -> Iterator[CliOption]:
    """The table: every BuildOptions field with a Flag, in declaration order; scope=plan: only the plan's."""
    hints = get_type_hints(BuildOptions, include_extras=True)
    for f in fields(BuildOptions):
        hint = hints[f.name]
        flags = [m for m in getattr(hint, "__metadata__", ()) if isinstance(m, Flag)]
        if flags and (scope is None or flags[0].scope == scope):
            yield CliOption(field=f.name, flag=flags[0], type=get_args(hint)[0])


def flag(field_name: str) -> str:
    """The command-line spelling of one option (CI renders `forge build` lines with it)."""
    return next(o.name for o in cli_options() if o.field == field_name)


class _Argument(TypedDict, total=False):
    """argparse's add_argument keywords, as far as the options table sets them."""

    dest: str
    help: str | None
    action: str | type[argparse.Action]
    default: object
    choices: Sequence[str]
    type: Callable[[str], object]
    metavar: str


def add_flags(
    parser: argparse.ArgumentParser,
    options: Iterable[CliOption],
    *,
    helps: Mapping[str, str] | None = None,
) -> None:
    """The options' flags on a parser; `helps` rewords a flag's help where the command gives it a default of its
    own (verify-repro's report folder)."""
    for o in options:
        kwargs: _Argument = {"dest": o.field, "help": (helps or {}).get(o.field, o.flag.help)}
        if o.type is bool:
            kwargs["action"] = "store_true"
        elif _is_union(o.type) and bool in get_args(o.type):
            kwargs["action"], kwargs["default"] = argparse.BooleanOptionalAction, None
        else:
            kwargs["default"] = None if o.flag.convert else _default(o.field)
            if o.choices:
                kwargs["choices"] = o.choices
            if o.flag.parse:
                kwargs["type"] = o.flag.parse
            elif _bare(o.type) is int:
                kwargs["type"] = int
            if not o.choices:  # named for the flag, not the field: --report-dir REPORT_DIR
                kwargs["metavar"] = o.flag.metavar or o.name.removeprefix("--").replace("-", "_").upper()
            if o.flag.repeat:
                kwargs["action"] = "append"
        parser.add_argument(o.name, **kwargs)


def _bare(tp: Any) -> Any:
    """X for X | None."""
    return next((a for a in get_args(tp) if a is not type(None)), tp) if _is_union(tp) else tp


def _default(name: str) -> Any:
    return next(f.default for f in fields(BuildOptions) if f.name == name)


def plan_options(options: BuildOptions, max_jobs: int) -> PlanOptions:
    """The planner's options: every PlanOptions field BuildOptions also has, as given. What only the build
    knows (the builder's secret support, the CA bundle found, the pins read, the base's digest) the caller adds
    with dataclasses.replace."""
    shared = {f.name for f in fields(PlanOptions)} & {f.name for f in fields(BuildOptions)} - {"max_jobs"}
    return PlanOptions(max_jobs=max_jobs, **{name: getattr(options, name) for name in sorted(shared)})


def add_gpu_args(p: argparse.ArgumentParser) -> None:
    """--gpu-mode for preflight, from the same table as build's (no gate reads the arch list)."""
    add_flags(p, [o for o in cli_options("plan") if o.field == "gpu_mode"])
    p.set_defaults(cuda_arch_list=None)


def gpu_args_apply(target: Target, args: argparse.Namespace) -> None:
    """--gpu-mode and --cuda-arch-list shape GPU builds only: given for another target, they are a mistake."""
    given = [f for f, v in (("--gpu-mode", args.gpu_mode), ("--cuda-arch-list", args.cuda_arch_list)) if v]
    if given and not target.cuda:
        raise UsageError(
            f"{' and '.join(given)} given for target {target.recipe.target}, which is not a GPU target",
            hint="drop them, or build the gpu target",
        )
