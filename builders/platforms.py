"""Target platforms: `--platform linux/amd64,linux/arm64` resolved once into one Distro per platform.

Everything downstream (bootstrap, preflight's arch gates, the wheelhouse's manylinux tags, the plan, the test
stage) already reads `distro.arch`; a platform is therefore a Distro with its arch, its base tag and its
multiarch library paths set, never a second branch in those modules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from builders.config.models import Distro
from builders.errors import ConfigError, UsageError

Arch = Literal["x86_64", "aarch64"]


@dataclass(frozen=True, kw_only=True)
class Platform:
    name: str  # OCI spelling: linux/arm64
    arch: Arch  # the kernel's (uname -m), as distros/*.yaml spell it
    oci_arch: str  # amd64, arm64: the OCI index's platform.architecture and Debian's dpkg architecture
    triplet: str  # Debian's multiarch folder under /usr/lib

    @property
    def native(self) -> bool:
        """The platform Forge built for before platforms existed: its tags and report folders keep no suffix."""
        return self.arch == "x86_64"

    @property
    def suffix(self) -> str:
        return "" if self.native else f"-{self.oci_arch}"


PLATFORMS: dict[str, Platform] = {
    p.name: p
    for p in (
        Platform(name="linux/amd64", arch="x86_64", oci_arch="amd64", triplet="x86_64-linux-gnu"),
        Platform(name="linux/arm64", arch="aarch64", oci_arch="arm64", triplet="aarch64-linux-gnu"),
    )
}
BY_ARCH: dict[str, Platform] = {p.arch: p for p in PLATFORMS.values()}
DEFAULT_PLATFORM = "linux/amd64"


def parse_platforms(text: str | None) -> tuple[Platform, ...]:
    """`linux/amd64,linux/arm64` → platforms in the order given, each once; None → the host's amd64."""
    names = [n.strip() for n in (text or DEFAULT_PLATFORM).split(",") if n.strip()]
    unknown = [n for n in names if n not in PLATFORMS]
    if unknown or not names:
        raise UsageError(
            f"--platform {text!r}: {'unknown platform ' + ', '.join(unknown) if unknown else 'empty'}",
            hint=f"choose from {', '.join(PLATFORMS)}, separated by commas",
        )
    return tuple(PLATFORMS[n] for n in dict.fromkeys(names))


def platform_of(distro: Distro) -> Platform:
    return BY_ARCH[distro.arch]


def for_platform(distro: Distro, platform: Platform) -> Distro:
    """The distro as built for `platform`: its arch, a base tag of its own (one engine holds one image per tag),
    and the multiarch paths of its libraries (tcmalloc) for that architecture."""
    if platform.arch == distro.arch:
        return distro
    boot = distro.base.bootstrap
    if boot is None or platform.arch not in boot.arches:
        have = ", ".join(boot.arches) if boot else "none (no base.bootstrap)"
        raise ConfigError(
            f"distros/{distro.name}.yaml: base.bootstrap.arches is {have}; {platform.name} needs {platform.arch}",
            hint=f"add {platform.arch} to base.bootstrap.arches if the archive ({boot.mirror if boot else '?'}) "
            "serves it",
        )
    here = platform_of(distro)
    return distro.model_copy(
        update={
            "arch": platform.arch,
            "base": distro.base.model_copy(update={"local_tag": distro.base.local_tag + platform.suffix}),
            "tcmalloc_path": distro.tcmalloc_path.replace(here.triplet, platform.triplet),
        }
    )


# vLLM's ISA switches (cmake/cpu_extension.cmake reads each from the environment) and the arch each belongs to.
# VLLM_CPU_X86=1 on aarch64 would force vLLM's x86 branch (`… OR ENABLE_X86_ISA`): an arch's build gets its own.
ISA_ARCH: dict[str, str] = {
    "VLLM_CPU_X86": "x86_64",
    "VLLM_CPU_AVX2": "x86_64",
    "VLLM_CPU_AVX512": "x86_64",
    "VLLM_CPU_AVX512BF16": "x86_64",
    "VLLM_CPU_AVX512VNNI": "x86_64",
    "VLLM_CPU_AMXBF16": "x86_64",
    "VLLM_CPU_ARM_BF16": "aarch64",
    "VLLM_CPU_ARM_I8MM": "aarch64",
}
# Under qemu-user-static /proc/cpuinfo is the build host's, so vLLM's own detection would decide BF16 from an x86
# CPU: the arm64 plan always states it. Off unless the recipe says on: Graviton2 and other Armv8.2 CPUs lack BF16.
ARM_BF16_DEFAULT = "0"


def isa_for(isa: dict[str, str], arch: str) -> dict[str, str]:
    """The recipe's ISA settings that apply to `arch`; aarch64 always gets VLLM_CPU_ARM_BF16 explicitly."""
    chosen = {k: v for k, v in isa.items() if ISA_ARCH.get(k, arch) == arch}
    if arch == "aarch64":
        chosen.setdefault("VLLM_CPU_ARM_BF16", ARM_BF16_DEFAULT)
    return chosen
