"""Split a source tree into the three parts a layered build caches apart: the requirements (keying the Python
environment), the compiler inputs (keying the compiled extension) and the Python package (laid over it last).

The parts are data (`TreeLayout`, globs); a serving engine declares its own (builders/engines/vllm/devtree.py).
Reading the tree is the only I/O here; `stage_parts` writes the parts into a build context.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Literal, TypedDict

from builders.errors import SourceUnavailable, UsageError

Part = Literal["requirements", "compiler_inputs", "package"]
PARTS: tuple[Part, ...] = ("requirements", "compiler_inputs", "package")

# Never part of a build's input: VCS metadata, bytecode, and the in-tree build folder a local `pip install -e`
# leaves (it holds objects for the host's compiler, not the image's).
DEFAULT_IGNORE: tuple[str, ...] = ("**/.git/**", ".git/**", "**/__pycache__/**", "**/*.pyc", "build/**")


@dataclass(frozen=True, kw_only=True)
class TreeLayout:
    """Which files of a source tree belong to which part, as globs relative to the tree's root (`**` crosses
    folders, `*` does not). A file may belong to two parts: vLLM's setup.py reads vllm/envs.py, which also ships."""

    requirements: tuple[str, ...]
    compiler_inputs: tuple[str, ...]
    package: tuple[str, ...]
    ignore: tuple[str, ...] = DEFAULT_IGNORE

    def globs(self, part: Part) -> tuple[str, ...]:
        return {"requirements": self.requirements, "compiler_inputs": self.compiler_inputs, "package": self.package}[
            part
        ]


@cache
def _regex(glob: str) -> re.Pattern[str]:
    out = ""
    i = 0
    while i < len(glob):
        if glob.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif glob.startswith("**", i):
            out += ".*"
            i += 2
        elif glob[i] == "*":
            out += "[^/]*"
            i += 1
        elif glob[i] == "?":
            out += "[^/]"
            i += 1
        else:
            out += re.escape(glob[i])
            i += 1
    return re.compile(out + r"\Z")


def matches(path: str, globs: Iterable[str]) -> bool:
    """Whether a tree-relative POSIX path matches any of the globs."""
    return any(_regex(g).match(path) for g in globs)


def file_digest(path: Path) -> str:
    """What a file contributes to its part's hash: a symlink's target (never followed: the tree names what it
    names), else the executable bit and the content. Mode bits besides +x differ between checkouts and umasks."""
    info = path.lstat()
    digest = hashlib.sha256()
    if stat.S_ISLNK(info.st_mode):
        digest.update(b"symlink\0" + str(path.readlink()).encode())
    else:
        digest.update(b"exec\0" if info.st_mode & 0o111 else b"file\0")
        with path.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def _hash_files(files: Mapping[str, str], *extra: str) -> str:
    digest = hashlib.sha256()
    for rel in sorted(files):
        digest.update(f"{rel}\0{files[rel]}\n".encode())
    for item in extra:
        digest.update(b"\0" + item.encode())
    return digest.hexdigest()


@dataclass(frozen=True, kw_only=True)
class TreeSplit:
    """A source tree split into its parts: each part's files with their digests, keyed by tree-relative path."""

    root: Path
    requirements: dict[str, str] = field(default_factory=dict)
    compiler_inputs: dict[str, str] = field(default_factory=dict)
    package: dict[str, str] = field(default_factory=dict)

    def files(self, part: Part) -> dict[str, str]:
        return {"requirements": self.requirements, "compiler_inputs": self.compiler_inputs, "package": self.package}[
            part
        ]

    @property
    def requirements_hash(self) -> str:
        return _hash_files(self.requirements)

    @property
    def package_hash(self) -> str:
        return _hash_files(self.package)

    def compiler_input_hash(self, compile_env: Mapping[str, str], toolchain: str) -> str:
        """The files, and what else decides the objects: the compile's environment (flags, ISA, job count is in
        there too: it changes no object, but the build reruns when it changes) and the toolchain's identity."""
        env = json.dumps(dict(compile_env), sort_keys=True)
        return _hash_files(self.compiler_inputs, "env", env, "toolchain", toolchain)

    def manifest(self) -> dict[str, dict[str, str]]:
        """Per-file digests of every part, for the report: the next build names which files changed."""
        return {part: dict(sorted(self.files(part).items())) for part in PARTS}


def split_tree(root: Path, layout: TreeLayout) -> TreeSplit:
    """Walk the tree once; a file that matches no part is not a build input (tests/, docs/, benchmarks/)."""
    if not root.is_dir():
        raise UsageError(f"--source {root}: not a directory", hint="pass a vLLM checkout or an unpacked sdist")
    parts: dict[Part, dict[str, str]] = {part: {} for part in PARTS}
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath)
        rel_dir = base.relative_to(root).as_posix()
        prefix = "" if rel_dir == "." else rel_dir + "/"
        # Symlinks to folders are entries too (os.walk lists them in dirnames but does not follow them).
        entries = list(filenames) + [d for d in dirnames if (base / d).is_symlink()]
        dirnames[:] = sorted(d for d in dirnames if not matches(f"{prefix}{d}/x", layout.ignore))
        for name in sorted(entries):
            rel = prefix + name
            if matches(rel, layout.ignore):
                continue
            wanted = [part for part in PARTS if matches(rel, layout.globs(part))]
            if not wanted:
                continue
            digest = file_digest(base / name)
            for part in wanted:
                parts[part][rel] = digest
    if not parts["compiler_inputs"]:
        raise SourceUnavailable(
            f"{root}: no file matches the compiler inputs {', '.join(layout.compiler_inputs)}",
            hint="point --source at the root of the source tree (the folder holding setup.py)",
        )
    return TreeSplit(root=root, **parts)


def changed_files(previous: Mapping[str, str], current: Mapping[str, str]) -> list[str]:
    """Paths added, removed or changed between two per-file manifests, sorted, each marked `+`, `-` or `~`."""
    added = [f"+{p}" for p in current.keys() - previous.keys()]
    removed = [f"-{p}" for p in previous.keys() - current.keys()]
    modified = [f"~{p}" for p in current.keys() & previous.keys() if current[p] != previous[p]]
    return sorted(added + removed + modified, key=lambda entry: (entry[1:], entry[0]))


def stage_parts(split: TreeSplit, dest: Mapping[Part, Path]) -> None:
    """Copy each part into its own folder of a build context (hard links where the file system allows), so each
    COPY in the Containerfile sees exactly its part and the engine's cache keys on nothing else."""
    for part in PARTS:
        folder = dest[part]
        folder.mkdir(parents=True, exist_ok=True)
        for rel in split.files(part):
            src, target = split.root / rel, folder / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            if src.is_symlink():
                target.symlink_to(src.readlink())
                continue
            try:
                os.link(src, target)
            except OSError:
                shutil.copy2(src, target)


# Per-file digests of the last source-tree build in a reports folder. Not one of build.REPORT_FILES: a new build
# must read it before it writes its own, to name the files that changed.
MANIFEST = "tree-manifest.json"


class TreeManifest(TypedDict):
    """tree-manifest.json: when the build started, and per part of the tree each file's digest."""

    started: str | None
    files: dict[str, dict[str, str]]


def read_manifest(folder: Path) -> TreeManifest | None:
    """The previous build's manifest, or None where there is none or it cannot be read (a build from an older
    Forge, a file cut short): the report then names no changed files, never wrong ones."""
    try:
        data = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, dict) or not all(
        isinstance(part, dict) and all(isinstance(v, str) for v in part.values()) for part in files.values()
    ):
        return None
    started = data.get("started")
    return {"started": started if isinstance(started, str) else None, "files": files}


def write_manifest(folder: Path, split: TreeSplit, *, started: str) -> None:
    """This build's manifest, for the next one in the same folder to compare with (replaced whole, never torn)."""
    manifest: TreeManifest = {"started": started, "files": split.manifest()}
    tmp = folder / f".{MANIFEST}.new"
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    tmp.replace(folder / MANIFEST)
