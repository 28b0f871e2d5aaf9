"""vLLM's aarch64 gates, read from its cmake/cpu_extension.cmake, for a build that may run under emulation.

vLLM decides Arm features by searching /proc/cpuinfo for `asimd` and `bf16`. Under qemu-user-static that file is
the build host's: an x86 host has no `asimd`, so the arm64 build stops at vLLM's "requires ... ARMv8" error, and
an x86 host's `avx512_bf16` contains `bf16`, which would switch on Arm BF16 kernels for CPUs that lack it. These
gates say so before a build starts, naming the lines of the vLLM source they read.
"""

from __future__ import annotations

import platform
import re

from builders.gates.findings import Finding, blocker, passed, unchecked, warning

CPU_EXTENSION = "cmake/cpu_extension.cmake"
NATIVE_ARM = "a native arm64 builder (GitHub's ubuntu-24.04-arm runner, a Graviton or Grace host)"


def _line(text: str, pattern: str) -> int | None:
    for number, line in enumerate(text.splitlines(), 1):
        if re.search(pattern, line):
            return number
    return None


def arm_gates(
    files: dict[str, str], *, compile_env: dict[str, str], host_cpuinfo: str, host_arch: str | None = None
) -> list[Finding]:
    """asimd (the ARMv8 gate) and bf16 (the BF16 kernels), for an aarch64 source build on this host."""
    host_arch = host_arch or platform.machine()
    text = files.get(CPU_EXTENSION)
    if text is None:
        return [
            unchecked(
                gate,
                f"not evaluated: the source has no {CPU_EXTENSION}",
                "vLLM's Arm ISA detection",
                CPU_EXTENSION,
                "check the source: preflight reads the Arm gates from this file",
            )
            for gate in ("arm-asimd", "arm-bf16")
        ]
    out: list[Finding] = []
    asimd = _line(text, r'find_isa\(.*"asimd"')
    fatal = _line(text, r"FATAL_ERROR.*ARMv8")
    where = f"vLLM {CPU_EXTENSION}:{asimd}" + (f" (FATAL_ERROR at :{fatal})" if fatal else "")
    has_asimd = "asimd" in host_cpuinfo
    if asimd is None:
        out.append(
            unchecked("arm-asimd", "not evaluated: no asimd detection line found", "asimd", CPU_EXTENSION, "read it")
        )
    elif has_asimd:
        out.append(passed("arm-asimd", f"/proc/cpuinfo of this {host_arch} host has asimd", "asimd", where))
    else:
        emulated = host_arch != "aarch64"
        out.append(
            blocker(
                "arm-asimd",
                f"/proc/cpuinfo has no asimd: it is this {host_arch} host's"
                + (", which qemu-user-static shows the arm64 build" if emulated else ""),
                "asimd in /proc/cpuinfo (ASIMD_FOUND), or vLLM stops: 'requires X86, Power9+ ISA, S390X ISA, "
                "ARMv8 or RISC-V support'",
                where,
                f"build on {NATIVE_ARM}; vLLM has no environment override for ASIMD",
            )
        )
    bf16 = _line(text, r'find_isa\(.*"bf16"')
    override = _line(text, r"\$ENV\{VLLM_CPU_ARM_BF16\}")
    wanted = compile_env.get("VLLM_CPU_ARM_BF16")
    source = f"vLLM {CPU_EXTENSION}:{bf16} (override read at :{override})"
    if bf16 is None or override is None:
        out.append(
            unchecked("arm-bf16", "not evaluated: no bf16 detection or override line", "bf16", CPU_EXTENSION, "read")
        )
    elif wanted is None:
        out.append(
            blocker(
                "arm-bf16",
                "VLLM_CPU_ARM_BF16 unset: vLLM would decide from /proc/cpuinfo",
                "VLLM_CPU_ARM_BF16 set by the plan",
                source,
                "set VLLM_CPU_ARM_BF16 in the recipe's isa",
            )
        )
    elif "bf16" in host_cpuinfo and wanted.strip() not in {"1", "ON", "on", "true"}:
        # The override only switches BF16 on; a substring match on the host's flags switches it on regardless.
        out.append(
            warning(
                "arm-bf16",
                f"VLLM_CPU_ARM_BF16={wanted}, but this host's /proc/cpuinfo contains 'bf16' (e.g. x86 avx512_bf16)",
                "no 'bf16' in the cpuinfo the build reads, for an image without BF16 kernels",
                source,
                f"build on {NATIVE_ARM} whose CPU matches the run hosts, or set VLLM_CPU_ARM_BF16=1 when every "
                "run host has BF16 (Graviton3, Grace)",
                "the image would carry BF16 kernels that Armv8.2 CPUs without BF16 (Graviton2) cannot execute",
            )
        )
    else:
        out.append(
            passed(
                "arm-bf16",
                f"VLLM_CPU_ARM_BF16={wanted} set explicitly; this host's cpuinfo has "
                f"{'bf16' if 'bf16' in host_cpuinfo else 'no bf16'}",
                "BF16 decided by the plan, not by the build host's CPU",
                source,
            )
        )
    return out
