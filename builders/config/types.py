"""Value types of the YAML Forge reads: what a field may hold, checked when the file is loaded.

A value from distros/, recipes/ or profiles/ reaches a Containerfile, a Kubernetes manifest or a shell. Quoting
there is the second line of defence (builders/render.py); the first is here: each field says what it holds (one
line of text, a package name, a path, an image reference, a name an engine accepts, a size that is a size), so a
value that could become an instruction is refused with the file and key before anything is rendered.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Annotated, Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version
from pydantic import AfterValidator, BeforeValidator, Field

INT32_MAX = 2**31 - 1
"""Kubernetes' counts (replicas, ports) are int32: a larger number is written and then refused by the API."""

# Cc: C0 and C1 controls (line breaks, tab, ESC, DEL); Cf: format characters (the right-to-left override U+202E,
# zero-width spaces and joiners, the BOM) that change how a name reads without being seen; Zl, Zp: the Unicode
# line and paragraph separators, which some parsers take as line breaks.
_UNSEEN = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"})


_CONTROL_NAMES = {"\n": "a line break", "\r": "a carriage return", "\t": "a tab", "\x1b": "an escape", "\x00": "a NUL"}


def unseen_character(text: str, *, allow: str = "") -> str | None:
    """The first character of text a reader cannot see or that breaks a line, as U+XXXX and its name."""
    for char in text:
        if char not in allow and unicodedata.category(char) in _UNSEEN:
            name = _CONTROL_NAMES.get(char) or unicodedata.name(char, "a control character").lower()
            return f"U+{ord(char):04X} ({name})"
    return None


def one_line(text: str) -> str:
    """One line of visible text: no line break, no control character, no invisible format character."""
    found = unseen_character(text)
    if found is not None:
        raise ValueError(f"{text!r} holds {found}: a value here is one line of visible text")
    return text


def prose(text: str) -> str:
    """Text for people (notes): line breaks allowed, other control and format characters not."""
    found = unseen_character(text, allow="\n")
    if found is not None:
        raise ValueError(f"{text!r} holds {found}")
    return text


def _pattern(regex: str, what: str, example: str) -> AfterValidator:
    compiled = re.compile(regex)

    def check(text: str) -> str:
        one_line(text)
        # fullmatch, never match with `$`: `$` also matches before a trailing newline.
        if not compiled.fullmatch(text):
            raise ValueError(f"{text!r} is not {what} (e.g. {example})")
        return text

    return AfterValidator(check)


def _no_parent_segment(text: str) -> str:
    if ".." in text.split("/"):
        raise ValueError(f"{text!r}: a '..' segment leaves the folder it names")
    return text


def _not_a_number(value: Any) -> Any:
    """YAML reads 3.10 as the number 3.1 and 12 as an integer: a version given unquoted has lost its text."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return value
    raise ValueError(
        f"{value!r} was read as a number, not a version: YAML reads 3.10 as 3.1; write the version in quotes "
        f'("{value}" or what you meant, e.g. "3.10")'
    )


def _pep440(text: str) -> str:
    try:
        Version(text)
    except InvalidVersion:
        raise ValueError(f"{text!r} is not a PEP 440 version (e.g. 0.33.0, 2.9.1+cpu)") from None
    return text


def _requirement(text: str) -> str:
    one_line(text)
    try:
        Requirement(text)
    except InvalidRequirement as exc:
        raise ValueError(f"{text!r} is not a pip requirement ({exc})") from None
    return text


OneLine = Annotated[str, AfterValidator(one_line)]
"""Text for one line: a description, a CMake source path, an argument."""

NOT_RENDERED = "forge: never rendered"
"""Marks a field no template reads (builders/render.py does not hold it to one line)."""

Prose = Annotated[str, AfterValidator(prose), NOT_RENDERED]
"""Text for people only, never rendered: notes."""

Name = Annotated[
    str,
    _pattern(
        r"[a-z0-9](?:[a-z0-9._-]{0,61}[a-z0-9])?",
        "a lower-case name (a-z, 0-9, '.', '_', '-', at most 63 characters, starting and ending with a letter or "
        "digit): it becomes part of an image tag, a path or a session name",
        "debian-12, cpu-wheel, onednn",
    ),
]
"""A distro, recipe, target or source name: lower-case, because image tags and DNS names must be."""

PackageName = Annotated[
    str,
    _pattern(r"[A-Za-z0-9][A-Za-z0-9._+-]*", "a package name", "libnuma-dev, gcc-toolset-14-gcc-c++, python3.12"),
]
"""A distro package (deb or rpm): what apt-get and dnf take as one word."""

ProjectName = Annotated[
    str,
    _pattern(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?", "a PyPI project name", "vllm, llama-cpp-python"),
]
"""A Python project name (PEP 508)."""

PipRequirement = Annotated[str, AfterValidator(_requirement)]
"""A pip requirement (PEP 508): vllm==0.33.0, aiohttp."""

PyVersion = Annotated[str, BeforeValidator(_not_a_number), AfterValidator(one_line), AfterValidator(_pep440)]
"""A PEP 440 version: 0.33.0, 2.9.1."""

VersionNumber = Annotated[
    str,
    BeforeValidator(_not_a_number),
    _pattern(r"\d+(?:\.\d+)*", "a version number", '"3.10", "12.2"'),
]
"""A dotted version number of a tool the distro ships: "3.10" (quoted: YAML reads 3.10 as 3.1)."""

Release = Annotated[
    str, BeforeValidator(_not_a_number), _pattern(r"[A-Za-z0-9][A-Za-z0-9._-]*", "a release", '"12", "24.04"')
]
"""A release name or number as the distro spells it."""

Word = Annotated[
    str,
    _pattern(r"[A-Za-z0-9._+:/=,@%-]*", "one word (letters, digits and . _ + : / = , @ % -)", "ON, cpu, 1"),
]
"""A value that goes into a Containerfile or a command line unquoted as one word: an ISA setting, an env value."""

EnvName = Annotated[str, _pattern(r"[A-Za-z_][A-Za-z0-9_]*", "an environment or CMake variable name", "VLLM_CPU_X86")]
"""An environment or CMake variable name."""

_PATH_CHARS = r"[A-Za-z0-9._+@%,=~-]"
AbsolutePath = Annotated[
    str,
    _pattern(rf"(?:/{_PATH_CHARS}+)+/?|/", "an absolute path", "/usr/lib64/libtcmalloc_minimal.so.4"),
    AfterValidator(_no_parent_segment),
]
"""An absolute path inside an image: written into ENV, COPY and RUN lines."""

RelativePath = Annotated[
    str,
    _pattern(rf"{_PATH_CHARS}+(?:/{_PATH_CHARS}+)*", "a relative path", "cmake/cpu_extension.cmake"),
    AfterValidator(_no_parent_segment),
]
"""A path relative to a folder Forge names (a template in containers/, a file in the vLLM source)."""

Suffix = Annotated[str, _pattern(r"[A-Za-z0-9._+-]*", "a file-name suffix", "-14")]
"""What follows a binary's name (g++-14): no folder, no blank."""

ArchList = Annotated[
    str,
    _pattern(
        r"\d+\.\d+[af]?(?:\+PTX)?(?:[ ;]+\d+\.\d+[af]?(?:\+PTX)?)*",
        "a CUDA arch list (compute capabilities separated by blanks or ';')",
        '"8.0 9.0 12.0+PTX"',
    ),
]
"""TORCH_CUDA_ARCH_LIST as a recipe gives it."""

FileName = Annotated[
    str, _pattern(rf"(?!\.){_PATH_CHARS}+", "a file name", "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl")
]
"""A file name without a folder."""

Url = Annotated[
    str,
    _pattern(
        r"(?:https?|file)://[A-Za-z0-9._~:/?#\[\]@+,=%-]+",
        "a URL (http, https or file; none of the characters a shell reads: blanks, quotes, $ ; & ( ) ! * \\)",
        "https://deb.debian.org/debian",
    ),
]
"""A URL: a mirror, a repository, an index. Printed with its user-info masked (builders/redact.py)."""

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_REFERENCE = re.compile(
    rf"(?:[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::\d+)?/)?{_COMPONENT}(?:/{_COMPONENT})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?"
)
"""[HOST[:PORT]/]NAME[/NAME…][:TAG][@sha256:DIGEST], lower-case path components, as engines and registries take
one. Use fullmatch: `$` would accept a trailing newline."""

ImageRef = Annotated[
    str,
    _pattern(IMAGE_REFERENCE.pattern, "an image reference", "docker.io/library/debian:bookworm or NAME@sha256:DIGEST"),
]
"""An image reference a registry and an engine accept."""

ImageTag = Annotated[
    str,
    _pattern(IMAGE_REFERENCE.pattern.removesuffix("(?:@sha256:[0-9a-f]{64})?"), "an image tag", "forge/base:debian-12"),
]
"""NAME[:TAG] an engine tags a local image with (no digest)."""

Digest = Annotated[str, _pattern(r"sha256:[0-9a-f]{64}", "a sha256 digest", "sha256:<64 hex digits>")]
"""sha256:HEX."""

Size = Annotated[float, Field(gt=0, allow_inf_nan=False)]
"""A size or an amount (GB, seconds): more than zero and finite. 0, -1, .nan and .inf are refused."""

Count = Annotated[int, Field(ge=1, le=INT32_MAX)]
"""A count a consumer keeps in 32 bits (Kubernetes replicas, jobs): 1 to 2**31-1."""
