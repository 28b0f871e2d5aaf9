"""SGLang's CPU gates, read from its own files: the sglang sdist (its kernel and torch pins, its AMX probe) and,
when one is given, the sgl-kernel checkout (its version, its torch pin, the CPU macros its kernels need).

Without a checkout the kernel facts are the ones pinned in kernel_source.py, cited at the pinned commit, and the
source gate is not evaluated: the report is then incomplete, never clear.
"""

from __future__ import annotations

from builders.engines.sdist import find_line, sdist_member
from builders.engines.sglang import kernel_source
from builders.engines.sglang.kernel_source import KernelCheckout
from builders.errors import SourceUnavailable
from builders.gates.context import PreflightContext
from builders.gates.findings import Finding, blocker, passed, unchecked, warning

# SGLang's own probe, in the sdist: the intel_amx backend runs only where torch reports AMX tiles.
AMX_PROBE_FILE = "sglang/srt/utils/common.py"
AMX_PROBE = r"=\s*torch\._C\._cpu\._is_amx_tile_supported\(\)"
AMX_FLAGS = ("amx_tile",)
BUILD_HOST = "build host /proc/cpuinfo"
KERNEL_PIN_FILE = "pyproject.toml"
TORCH_PIN_FILE = "pyproject_cpu.toml"
TORCH_PIN = r"""["']torch==([^"';\s]+)["']"""
# SGLang decorates functions with torch.compile as its server imports them (the first on the import path of
# ModelConfig, seen in a real start: the decorator runs at import, whatever it is told to disable).
COMPILE_AT_IMPORT_FILE = "sglang/srt/layers/moe/moe_runner/deep_gemm.py"
COMPILE_AT_IMPORT = r"^@torch\.compile\("
# torch releases whose torch.compile raises on a newer Python, pinned as data from the wheel (no sdist of torch is
# fetched here): torch 2.9.0's torch/__init__.py:2590 raises "torch.compile is not supported on Python 3.14+".
TORCH_COMPILE_PYTHON_BELOW = {"2.9": ((3, 14), "torch 2.9.0 wheel: torch/__init__.py:2590")}


def preflight(inputs: PreflightContext) -> list[Finding]:
    checkout: KernelCheckout | None = None
    problem: str | None = None
    path = inputs.given_sources.get(kernel_source.NAME)
    if path is not None:
        try:
            checkout = kernel_source.read_checkout(path)
        except SourceUnavailable as exc:
            problem = exc.message
    return [
        _kernel_isa(inputs, checkout),
        _amx(inputs),
        _kernel_source(inputs, checkout, problem),
        _torch_pin(inputs, checkout),
        _python_for_compile(inputs),
    ]


def _kernel_isa(inputs: PreflightContext, checkout: KernelCheckout | None) -> Finding:
    if checkout is not None and checkout.isa_where is not None:
        macros = checkout.isa_macros
        source = f"{checkout.root}: {checkout.isa_where}" + (
            f" and {checkout.march_where}" if checkout.march_where else ""
        )
    else:
        macros = kernel_source.PINNED_ISA_MACROS
        source = f"{kernel_source.pinned_isa_source()} (pinned as data: no sdist carries sgl-kernel's CPU build)"
    flags = kernel_source.flags_for(macros)
    # -march=native: the build host's CPU decides what is compiled, and the run host must have it too.
    hosts = {BUILD_HOST: inputs.host.cpu_flags, inputs.run_source: inputs.run_flags}
    lacking = {where: missing for where, have in hosts.items() if (missing := [f for f in flags if f not in have])}
    required = ", ".join(flags)
    if not lacking:
        return passed("isa-avx512", f"{' and '.join(hosts)}: have {required}", required, source)
    found = "; ".join(f"{where}: lacks {', '.join(missing)}" for where, missing in lacking.items())
    return blocker(
        "isa-avx512",
        found,
        required,
        source,
        "build and run SGLang's CPU image on a CPU with AVX-512 BF16 and AMX (Intel Xeon 4th generation, "
        "Sapphire Rapids, or newer); on this CPU use the llama-cpp or vLLM cpu targets",
        "sgl-kernel's CMake compiles with -march=native, and its vectorised kernels exist only where that defines "
        f"{' and '.join(macros)}; without them its GEMM's scalar path stops with 'not implemented' on the first "
        "request",
    )


def _amx(inputs: PreflightContext) -> Finding:
    lacking = [f for f in AMX_FLAGS if f not in inputs.run_flags]
    if inputs.source is None:
        return unchecked(
            "isa-amx",
            f"not evaluated: {inputs.source_why}",
            "amx_tile",
            f"recipes/{inputs.recipe.name}.yaml: source.pypi",
            f"run `forge fetch {inputs.distro.name} {inputs.recipe.target}`, then preflight again",
        )
    text = sdist_member(inputs.source, AMX_PROBE_FILE)
    where = find_line(text, AMX_PROBE) if text is not None else None
    source = f"{inputs.source.name}: {AMX_PROBE_FILE}:{where[0]}" if where else f"{inputs.source.name}"
    found = f"{inputs.run_source}: {'lacks ' + ', '.join(lacking) if lacking else 'has amx_tile'}"
    if not lacking:
        return passed("isa-amx", found, "amx_tile", source)
    return warning(
        "isa-amx",
        found,
        "amx_tile",
        source,
        "run SGLang's CPU server on a CPU with AMX (Sapphire Rapids or newer)",
        "SGLang's intel_amx backend, the one sgl-kernel's CPU kernels serve, runs only where torch reports AMX "
        "tiles; elsewhere it falls back to torch_native",
    )


def _required_kernel(inputs: PreflightContext) -> tuple[str, str]:
    """The kernel version the sglang sdist requires and where it says so; the pin where the sdist is not at hand."""
    text = sdist_member(inputs.source, KERNEL_PIN_FILE) if inputs.source is not None else None
    pin = kernel_source.required_version(text) if text else None
    if pin is None or inputs.source is None:
        return kernel_source.VERSION, f"{kernel_source.PINNED} (pinned as data)"
    return pin[0], f"{inputs.source.name}: {KERNEL_PIN_FILE}:{pin[1]}"


def _kernel_source(inputs: PreflightContext, checkout: KernelCheckout | None, problem: str | None) -> Finding:
    version, where = _required_kernel(inputs)
    required = f"sgl-kernel {version}: a checkout of {kernel_source.PINNED}"
    if problem is not None:
        return blocker("sgl-kernel-source", problem, required, where, kernel_source.checkout_hint())
    if checkout is None:
        return unchecked(
            "sgl-kernel-source",
            "not evaluated: no --source sgl-kernel=PATH, and no PyPI release of sgl-kernel carries its source "
            "(no sdist)",
            required,
            where,
            kernel_source.checkout_hint(),
        )
    if checkout.version is None:
        return blocker(
            "sgl-kernel-source",
            f"{checkout.root}: no __version__ in sgl-kernel/{kernel_source.VERSION_FILE}",
            required,
            where,
            kernel_source.checkout_hint(),
        )
    found = f"sgl-kernel {checkout.version.value} at {checkout.root} ({checkout.version.where})"
    if checkout.version.value != version:
        return blocker(
            "sgl-kernel-source",
            found,
            required,
            where,
            kernel_source.checkout_hint(),
            "SGLang's Python package calls the kernels by name and signature (torch.ops.sgl_kernel.*): another "
            "release of them fails at import or on the first request",
        )
    return passed("sgl-kernel-source", found, required, where)


def _torch_pin(inputs: PreflightContext, checkout: KernelCheckout | None) -> Finding:
    """The torch the build installs against what SGLang's CPU project and the kernels' CPU project pin: the kernels
    are C++ against torch's ABI, and SGLang's own pins would otherwise replace it."""
    recipe = inputs.recipe
    build = (recipe.torch.version or "?").split("+", 1)[0]
    origin = f"recipes/{recipe.name}.yaml: torch.version"
    pins: list[tuple[str, str]] = []
    text = sdist_member(inputs.source, TORCH_PIN_FILE) if inputs.source is not None else None
    hit = find_line(text, TORCH_PIN) if text else None
    if hit and inputs.source is not None:
        pins.append((hit[1].group(1), f"{inputs.source.name}: {TORCH_PIN_FILE}:{hit[0]}"))
    if checkout is not None and checkout.torch is not None:
        pins.append((checkout.torch.value, f"{checkout.root}: {checkout.torch.where}"))
    if not pins:
        return unchecked(
            "torch-pin",
            f"not evaluated: {inputs.source_why if inputs.source is None else 'no torch== pin found'}",
            f"torch {build} ({origin})",
            f"{TORCH_PIN_FILE} of sglang and of sgl-kernel",
            f"run `forge fetch {inputs.distro.name} {recipe.target}`, then preflight again",
        )
    source = "; ".join(where for _, where in pins)
    differing = [(value, where) for value, where in pins if value.split("+", 1)[0] != build]
    required = " and ".join(sorted({f"torch=={value}" for value, _ in pins}))
    found = f"torch {build} ({origin})"
    if not differing:
        return passed("torch-pin", found, required, source)
    return blocker(
        "torch-pin",
        found,
        required,
        source,
        f"set torch.version in recipes/{recipe.name}.yaml to {differing[0][0]}, or use a checkout whose "
        f"{TORCH_PIN_FILE} pins {build}",
        "sgl-kernel's CPU kernels are C++ built against torch's headers and ABI, and SGLang's own pins would "
        "install another torch beside them",
    )


def _python_for_compile(inputs: PreflightContext) -> Finding:
    """The distro's Python against the newest one the pinned torch's torch.compile accepts, where SGLang calls it
    at import: the server would die before it listens (a real start on Debian 14's Python 3.14 did)."""
    recipe, distro = inputs.recipe, inputs.distro
    python = distro.toolchain.python
    found = f"Python {python} (distros/{distro.name}.yaml: toolchain.python)"
    torch = ".".join((recipe.torch.version or "?").split("+", 1)[0].split(".")[:2])
    limit = TORCH_COMPILE_PYTHON_BELOW.get(torch)
    text = sdist_member(inputs.source, COMPILE_AT_IMPORT_FILE) if inputs.source is not None else None
    hit = find_line(text, COMPILE_AT_IMPORT) if text else None
    if limit is None or inputs.source is None or hit is None:
        why = (
            f"no Python limit of torch {torch}'s torch.compile is pinned in builders/engines/sglang/gates.py"
            if limit is None
            else inputs.source_why
            if inputs.source is None
            else f"no import-time @torch.compile in {COMPILE_AT_IMPORT_FILE}"
        )
        return unchecked(
            "python-torch-compile",
            f"not evaluated: {why}",
            "a Python torch.compile supports, where SGLang calls it at import",
            f"recipes/{recipe.name}.yaml: torch.version",
            "check that `python3 -m sglang.launch_server --help` starts in the image",
        )
    (major, minor), torch_where = limit
    required = f"Python < {major}.{minor} (torch {torch}'s torch.compile)"
    source = f"{torch_where}; {inputs.source.name}: {COMPILE_AT_IMPORT_FILE}:{hit[0]}"
    have = tuple(int(part) for part in python.split(".")[:2])
    if have < (major, minor):
        return passed("python-torch-compile", found, required, source)
    return blocker(
        "python-torch-compile",
        found,
        required,
        source,
        f"build on a distro with Python below {major}.{minor} (debian-13: 3.13, ubuntu-24.04: 3.12)",
        f"SGLang decorates functions with torch.compile as it imports them, and torch {torch} raises on Python "
        f"{major}.{minor} and later, so the server dies before it listens",
    )
