"""Which dtype a vLLM CPU replica serves in, decided once from the CPU that serves.

vLLM's CPU backend runs bfloat16 well only where the CPU has native BF16 instructions; elsewhere torch
falls back to a slow path that here made bfloat16 serving some fifty times slower than float32, so every
profile of a sweep was overloaded and failed. Smoke, sweep, the image's test stage and preflight ask
`choose_dtype` and nothing else, and the reports record its answer and why.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field

from builders.records import Record

CPUINFO = Path("/proc/cpuinfo")

# /proc/cpuinfo flags that give torch's CPU matmuls native bfloat16: AVX512-BF16 or AMX on x86 (oneDNN's
# bf16 kernels), the BF16 extension on Arm (Features: bf16). vllm/platforms/cpu.py picks its bf16 kernels
# from the same features.
NATIVE_BF16_FLAGS: dict[str, tuple[str, ...]] = {
    "x86_64": ("avx512_bf16", "amx_bf16"),
    "aarch64": ("bf16",),
}
# The figure a user is warned with when a profile insists on bfloat16 without native support.
MEASURED_BF16_FACTOR = 55.0
MEASURED_BF16_HOW = (
    "one 16x1024x4096 matmul took 438 ms in bfloat16 and 7.9 ms in float32 on an AMD EPYC with AVX2 and no "
    "AVX-512 (torch 2.13.0+cpu, one thread)"
)
AUTO = "auto"


@dataclass(frozen=True, kw_only=True)
class CpuHost:
    """What /proc/cpuinfo says about the CPU replicas run on."""

    arch: str
    model: str
    flags: frozenset[str]
    source: str

    @property
    def bf16_flags(self) -> tuple[str, ...]:
        """The native-BF16 flags this CPU has (empty: none)."""
        return tuple(f for f in NATIVE_BF16_FLAGS.get(self.arch, ()) if f in self.flags)

    def isa_summary(self) -> str:
        """The flags that matter to a CPU replica, in one line ('avx2, no avx512f, no BF16')."""
        interesting: tuple[str, ...]
        if self.arch == "x86_64":
            interesting = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
        else:
            interesting = ("asimd", "sve", "bf16")
        return ", ".join(f if f in self.flags else f"no {f}" for f in interesting)


def parse_cpuinfo(text: str, *, source: str, machine: str | None = None) -> CpuHost:
    """The first processor of a /proc/cpuinfo text. The architecture comes from the text itself (x86 lists
    `flags`, Arm `Features`), so a file from another host is judged as that host; `machine` is the fallback
    when the text has neither."""
    model = ""
    flags: frozenset[str] | None = None
    arch = machine or ""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            if flags is not None:
                break  # the first processor's block is over
            continue
        key = key.strip()
        if key == "flags" and flags is None:
            flags, arch = frozenset(value.split()), "x86_64"
        elif key == "Features" and flags is None:
            flags, arch = frozenset(value.split()), "aarch64"
        elif key in ("model name", "Model", "Hardware") and not model:
            model = value.strip()
        elif key == "CPU part" and not model:
            model = f"Arm CPU part {value.strip()}"
    return CpuHost(arch=arch or "unknown", model=model or "unknown CPU", flags=flags or frozenset(), source=source)


def this_host(path: Path = CPUINFO) -> CpuHost:
    """This machine's CPU: the replicas of a local engine or of host processes run here."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    return parse_cpuinfo(text, source=f"{path} of this host", machine=platform.machine())


@dataclass(frozen=True, kw_only=True)
class DtypeChoice:
    dtype: str
    requested: str
    native_bf16: bool
    host: CpuHost
    reason: str
    warning: str | None = None

    def as_json(self) -> DtypeRecord:
        return DtypeRecord(
            dtype=self.dtype,
            requested=self.requested,
            native_bf16=self.native_bf16,
            cpu=self.host.model,
            arch=self.host.arch,
            isa=self.host.isa_summary(),
            source=self.host.source,
            reason=self.reason,
            warning=self.warning,
        )


class DtypeRecord(Record):
    """The dtype in a smoke or sweep report: what was served, what was asked for, and the CPU it was decided on."""

    dtype: str = Field(description="the dtype the replicas serve")
    requested: str = Field(description="the profile's model.dtype (auto: decided from the CPU)")
    native_bf16: bool = Field(description="the serving CPU has native BF16")
    cpu: str = Field(description="the serving CPU's model name")
    arch: str = Field(description="its architecture")
    isa: str = Field(description="the BF16-related ISA extensions it has and lacks")
    source: str = Field(description="where the CPU's facts were read")
    reason: str = Field(description="why this dtype, in words")
    warning: str | None = Field(description="set when the dtype asked for is slow on this CPU")


def choose_dtype(requested: str, host: CpuHost) -> DtypeChoice:
    """bfloat16 where `host` has native BF16, float32 elsewhere; an explicit `requested` dtype wins, with a
    warning (and the measured factor) when it is bfloat16 on a host without native BF16."""
    native = host.bf16_flags
    has = f"{host.model} ({host.arch}) has {' '.join(native)}" if native else ""
    lacks = f"{host.model} ({host.arch}) has none of {' / '.join(NATIVE_BF16_FLAGS.get(host.arch, ('bf16',)))}"
    if requested == AUTO:
        if native:
            return DtypeChoice(
                dtype="bfloat16", requested=AUTO, native_bf16=True, host=host, reason=f"native BF16: {has}"
            )
        return DtypeChoice(
            dtype="float32",
            requested=AUTO,
            native_bf16=False,
            host=host,
            reason=f"no native BF16: {lacks}; bfloat16 would run on torch's slow fallback",
        )
    warning = None
    if requested == "bfloat16" and not native:
        warning = (
            f"dtype bfloat16 was asked for, but {lacks}: expect it to serve about {MEASURED_BF16_FACTOR:.0f}x "
            f"slower than float32 ({MEASURED_BF16_HOW}); drop the profile's model.dtype to let Forge choose"
        )
    return DtypeChoice(
        dtype=requested,
        requested=requested,
        native_bf16=bool(native),
        host=host,
        reason="asked for explicitly (model.dtype)",
        warning=warning,
    )
