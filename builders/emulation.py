"""What a container of another architecture lacks under qemu-user-static, and what Forge lends its test checks.

qemu-user translates the image's instructions but not the host's kernel interfaces: /sys/devices/system/cpu is
the x86 host's. oneDNN's xbyak_aarch64, which torch loads on `import torch`, reads the Arm CPU's identity from
`cpuN/regs/identification/midr_el1`; an x86 host has no such file, so the import prints "Can't open MIDR_EL1
sysfs entry", the emulated process takes a SIGSEGV, and qemu 7.2 then hangs in its core dump instead of
exiting. The checks of an emulated image therefore run with a stand-in of that folder naming an Arm core.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SYSFS_CPU = "/sys/devices/system/cpu"
# Neoverse N1 (Graviton2, Ampere Altra): implementer 0x41 (Arm), part 0xd0c, r3p1. The baseline Arm server core;
# nothing in an import check depends on which core it names, only on the file being there.
NEOVERSE_N1_MIDR = "0x00000000413fd0c1"


def _needs_stand_in(arch: str, host_arch: str) -> bool:
    """Only an aarch64 container on another architecture's host lacks the files: x86 code reads no MIDR."""
    return arch == "aarch64" and host_arch != arch


@contextmanager
def emulated_cpu_sysfs(arch: str, host_arch: str, cpus: int | None = None) -> Iterator[dict[str, str]]:
    """Volumes (host folder → container path) that stand in for the CPU sysfs an `arch` container expects on a
    `host_arch` host; none where it runs natively or needs none. The folder lives as long as the context."""
    if not _needs_stand_in(arch, host_arch):
        yield {}
        return
    count = cpus or os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="forge-arm-sysfs-") as tmp:
        root = Path(tmp)
        span = f"0-{count - 1}" if count > 1 else "0"
        for name in ("online", "possible", "present"):
            (root / name).write_text(span + "\n", encoding="ascii")
        for n in range(count):
            ident = root / f"cpu{n}" / "regs" / "identification"
            ident.mkdir(parents=True)
            (ident / "midr_el1").write_text(NEOVERSE_N1_MIDR + "\n", encoding="ascii")
            (ident / "revidr_el1").write_text("0x0000000000000000\n", encoding="ascii")
        # The checks run as the image's uid 1000, whoever made the temporary folder.
        for path in (root, *root.rglob("*")):
            path.chmod(0o755 if path.is_dir() else 0o644)
        yield {str(root): SYSFS_CPU}


def describe(arch: str, host_arch: str) -> str | None:
    """The line the report gives the stand-in, so no reader takes the emulated checks for native ones."""
    if not _needs_stand_in(arch, host_arch):
        return None
    return f"{SYSFS_CPU} is a stand-in naming a Neoverse N1 (MIDR_EL1 {NEOVERSE_N1_MIDR}): the host is not Arm"
