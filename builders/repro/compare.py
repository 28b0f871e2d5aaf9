"""Two exports of one image recipe, compared layer by layer on what Forge controls.

Compared: every layer above the base (the base is an input, pinned by the lock), each path's kind, mode,
owner, size and content hash or link target, and the image config a user runs (env, entrypoint, user,
labels, the history's commands). Not compared, because the engine stamps them: the config's `created`
times, `container*` and `docker_version`. File mtimes are counted apart: Docker 20.10's BuildKit cannot
rewrite them to SOURCE_DATE_EPOCH, so an image can be reproducible in content and still differ in mtimes;
`strict_mtimes` makes those count too.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from pydantic import Field

from builders.records import Record
from builders.repro.image_export import Entry, ExportedImage, ImageConfig, Layer

ENGINE_STAMPED = ("created", "container", "container_config", "docker_version")
MAX_LISTED = 200


class FileDifferenceRecord(Record):
    layer: int = Field(description="the layer's index in the image")
    path: str = Field(description="the path inside the layer")
    what: str = Field(
        description="only in first | only in second | kind | mode | owner | size | content | link target | mtime"
    )
    first: str = Field(description="the first image's value (kind, mode, owner, size, digest or time)")
    second: str = Field(description="the second image's value")


class LayerRecord(Record):
    index: int = Field(description="the layer's index in the image (the base's layers are not compared)")
    created_by: str = Field(description="the history entry that made it; `A | B` when the two differ")
    identical: bool = Field(description="the same diff_id: the layer tars are byte-for-byte equal")
    files: int = Field(description="paths in either layer")
    differences: list[FileDifferenceRecord] = Field(description="each path that differs, the first 200 listed")
    mtime_only: int = Field(description="paths whose only difference is when they were written")


class Comparison(Record):
    """ReproComparison as repro.json holds it (the first 200 differences of each layer listed)."""

    first: str = Field(description="the first image's reference")
    second: str = Field(description="the second image's (built without cache)")
    base_layers: int = Field(description="the base's layers, an input pinned by the lock, not compared")
    strict_mtimes: bool = Field(description="--strict-mtimes: a path that differs only in mtime counts")
    structure: list[str] = Field(description="layer count or base differs: nothing finer can be said")
    config_differences: list[str] = Field(description="what differs in the image config a user runs")
    layers: list[LayerRecord] = Field(description="each layer above the base")
    reproducible: bool = Field(description="no structural, config or content difference")
    bit_identical: bool = Field(description="reproducible, and every layer byte-for-byte equal")


@dataclass(frozen=True, kw_only=True)
class FileDifference:
    layer: int
    path: str
    what: str  # only in first | only in second | kind | mode | owner | size | content | link target | mtime
    first: str
    second: str


@dataclass(frozen=True, kw_only=True)
class LayerVerdict:
    index: int
    created_by: str
    identical: bool  # same diff_id: the layer tars are byte-for-byte equal
    files: int
    differences: tuple[FileDifference, ...]
    mtime_only: int  # paths whose only difference is when they were written

    @property
    def content_equal(self) -> bool:
        return not self.differences


@dataclass(frozen=True, kw_only=True)
class ReproComparison:
    first: str
    second: str
    base_layers: int
    strict_mtimes: bool
    structure: tuple[str, ...]  # layer count or base differs: nothing finer can be said
    config_differences: tuple[str, ...]
    layers: tuple[LayerVerdict, ...]

    @property
    def reproducible(self) -> bool:
        return not self.structure and not self.config_differences and all(v.content_equal for v in self.layers)

    @property
    def bit_identical(self) -> bool:
        return self.reproducible and all(v.identical for v in self.layers)

    @property
    def differences(self) -> list[FileDifference]:
        return [d for v in self.layers for d in v.differences]

    def to_json(self) -> Comparison:
        return Comparison(
            first=self.first,
            second=self.second,
            base_layers=self.base_layers,
            strict_mtimes=self.strict_mtimes,
            structure=list(self.structure),
            config_differences=list(self.config_differences),
            layers=[
                LayerRecord(
                    index=v.index,
                    created_by=v.created_by,
                    identical=v.identical,
                    files=v.files,
                    differences=[FileDifferenceRecord(**asdict(d)) for d in v.differences[:MAX_LISTED]],
                    mtime_only=v.mtime_only,
                )
                for v in self.layers
            ],
            reproducible=self.reproducible,
            bit_identical=self.bit_identical,
        )

    def summary(self) -> str:
        verdict = (
            "bit-identical"
            if self.bit_identical
            else "reproducible in content"
            if self.reproducible
            else "NOT reproducible"
        )
        lines = [
            f"verify-repro {self.first} vs {self.second}: {verdict}",
            f"  compared {len(self.layers)} layers above {self.base_layers} base layer(s)"
            + ("; mtimes count" if self.strict_mtimes else "; mtimes counted apart"),
        ]
        lines += [f"  structure: {s}" for s in self.structure]
        lines += [f"  config: {c}" for c in self.config_differences]
        for v in self.layers:
            state = (
                "identical"
                if v.identical
                else "same content"
                if v.content_equal
                else f"{len(v.differences)} path(s) differ"
            )
            mt = f", {v.mtime_only} differ only in mtime" if v.mtime_only and not v.identical else ""
            lines.append(f"  layer {v.index} ({v.files} paths{mt}): {state} — {v.created_by[:90]}")
            for d in v.differences[:25]:
                lines.append(f"    {d.what}: {d.path}  [{d.first} | {d.second}]")
            if len(v.differences) > 25:
                lines.append(f"    … and {len(v.differences) - 25} more (see repro.json)")
        return "\n".join(lines)


def comparable_config(config: ImageConfig) -> dict[str, object]:
    """The image config without what the engine stamps at build time."""
    kept: dict[str, object] = {k: v for k, v in config.items() if k not in ENGINE_STAMPED and k != "rootfs"}
    kept["history"] = [{k: v for k, v in h.items() if k != "created"} for h in config.get("history", [])]
    return kept


def _flatten(value: object, prefix: str = "") -> dict[str, str]:
    """Every leaf of a JSON value by its path (`config.Env[0]`), as JSON text."""
    if isinstance(value, dict):
        out: dict[str, str] = {}
        for key in sorted(value):
            out.update(_flatten(value[key], f"{prefix}.{key}" if prefix else str(key)))
        return out or {prefix: "{}"}
    if isinstance(value, list):
        out = {}
        for i, item in enumerate(value):
            out.update(_flatten(item, f"{prefix}[{i}]"))
        return out or {prefix: "[]"}
    return {prefix: json.dumps(value)}


def config_differences(first: ImageConfig, second: ImageConfig) -> list[str]:
    a, b = _flatten(comparable_config(first)), _flatten(comparable_config(second))
    return [
        f"{key}: {a.get(key, '(absent)')} vs {b.get(key, '(absent)')}"
        for key in sorted(set(a) | set(b))
        if a.get(key) != b.get(key)
    ]


def _describe(entry: Entry, what: str) -> str:
    if what == "mode":
        return oct(entry.mode)
    if what == "owner":
        return f"{entry.uid}:{entry.gid}"
    if what == "size":
        return str(entry.size)
    if what == "kind":
        return entry.kind
    if what == "mtime":
        return str(entry.mtime)
    return entry.digest[:16] if entry.kind in {"file", "hardlink"} else entry.digest


def entry_difference(a: Entry, b: Entry, *, strict_mtimes: bool) -> str | None:
    """The first way two entries of one path differ, or None; "mtime" when only their times do."""
    if a.kind != b.kind:
        return "kind"
    if a.mode != b.mode:
        return "mode"
    if (a.uid, a.gid) != (b.uid, b.gid):
        return "owner"
    if a.kind == "file" and a.size != b.size:
        return "size"
    if a.digest_sans_mtime != b.digest_sans_mtime:
        return "link target" if a.kind == "symlink" else "content"
    if a.digest != b.digest or a.mtime != b.mtime:
        return "mtime"
    return None


def compare_layers(index: int, a: Layer, b: Layer, *, strict_mtimes: bool) -> LayerVerdict:
    if a.diff_id and a.diff_id == b.diff_id:
        return LayerVerdict(
            index=index, created_by=a.created_by, identical=True, files=len(a.entries), differences=(), mtime_only=0
        )
    diffs: list[FileDifference] = []
    mtime_only = 0
    for path in sorted(set(a.entries) | set(b.entries)):
        ea, eb = a.entries.get(path), b.entries.get(path)
        if ea is None or eb is None:
            present = ea or eb
            assert present is not None
            where = "only in second" if ea is None else "only in first"
            diffs.append(
                FileDifference(
                    layer=index, path=path, what=where, first=ea.kind if ea else "-", second=eb.kind if eb else "-"
                )
            )
            continue
        what = entry_difference(ea, eb, strict_mtimes=strict_mtimes)
        if what is None:
            continue
        if what == "mtime":
            mtime_only += 1
            if not strict_mtimes:
                continue
        diffs.append(
            FileDifference(layer=index, path=path, what=what, first=_describe(ea, what), second=_describe(eb, what))
        )
    created_by = a.created_by if a.created_by == b.created_by else f"{a.created_by} | {b.created_by}"
    return LayerVerdict(
        index=index,
        created_by=created_by,
        identical=False,
        files=len(set(a.entries) | set(b.entries)),
        differences=tuple(diffs),
        mtime_only=mtime_only,
    )


def compare_images(
    first: ExportedImage, second: ExportedImage, base_layers: tuple[str, ...], *, strict_mtimes: bool = False
) -> ReproComparison:
    """Compare the layers above the base and the config; `base_layers` are the base image's diff_ids."""
    structure: list[str] = []
    n = len(base_layers)
    for label, image in (("first", first), ("second", second)):
        got = tuple(layer.diff_id for layer in image.layers[:n])
        if got != base_layers:
            structure.append(f"the {label} image does not start with the base's {n} layer(s): was the base rebuilt?")
    if len(first.layers) != len(second.layers):
        structure.append(f"layer count differs: {len(first.layers)} vs {len(second.layers)}")
    verdicts: list[LayerVerdict] = []
    if not structure:
        for index in range(n, len(first.layers)):
            verdicts.append(
                compare_layers(index, first.layers[index], second.layers[index], strict_mtimes=strict_mtimes)
            )
    return ReproComparison(
        first=first.ref,
        second=second.ref,
        base_layers=n,
        strict_mtimes=strict_mtimes,
        structure=tuple(structure),
        config_differences=tuple(config_differences(first.config, second.config)),
        layers=tuple(verdicts),
    )
