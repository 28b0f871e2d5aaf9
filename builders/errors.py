"""Typed errors: each kind has its own exit code and a message that says what to do."""

from __future__ import annotations

from builders.redact import mask_urls


class ForgeError(Exception):
    """Base of every error Forge reports to a user; never a traceback."""

    exit_code = 1
    kind = "error"

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        # A message may quote a URL the user gave (a mirror, an index, an --endpoint), and it travels further than
        # the terminal (preflight findings, reports, JSON): its password is masked here, once.
        message = mask_urls(message)
        super().__init__(message)
        self.message = message
        self.hint = mask_urls(hint) if hint is not None else None

    def render(self) -> str:
        text = f"forge: {self.kind}: {self.message}"
        if self.hint:
            text += f"\n  what to do: {self.hint}"
        return text


class ConfigError(ForgeError):
    """A distro, recipe or profile file is invalid: names the file, key path and a close valid name."""

    exit_code = 2
    kind = "config error"


class UsageError(ForgeError):
    exit_code = 2
    kind = "usage error"


class PreflightBlocked(ForgeError):
    """Preflight found at least one blocking finding."""

    exit_code = 3
    kind = "preflight blocked"


class PreflightIncomplete(ForgeError):
    """Preflight blocked nothing but could not evaluate every gate: never reported as clear.

    `forge preflight --allow-incomplete` (and `forge ci --allow-incomplete-preflight`) accept it with exit 0.
    """

    exit_code = 9
    kind = "preflight incomplete"


class SourceUnavailable(ForgeError):
    """A source the build needs (vLLM sdist, oneDNN, a wheel) cannot be had."""

    exit_code = 4
    kind = "source unavailable"


class BaseUnavailable(ForgeError):
    """The base image is neither local nor pullable nor bootstrappable."""

    exit_code = 5
    kind = "base image unavailable"


class EngineError(ForgeError):
    """The container engine is missing, unreachable or refused an operation."""

    exit_code = 6
    kind = "engine error"


class BuildFailed(ForgeError):
    """The image build itself failed; the report carries the diagnosis."""

    exit_code = 7
    kind = "build failed"


class SmokeFailed(ForgeError):
    """The router stack came up but a class missed its gate, or it did not come up."""

    exit_code = 8
    kind = "smoke failed"


class ListenFailed(ForgeError):
    """A server Forge runs (the router) cannot listen on its address: the port is taken or not allowed."""

    # 9 is PreflightIncomplete; 10-13 are builders/repro/errors.py's.
    exit_code = 14
    kind = "cannot listen"


class SweepInvalid(ForgeError):
    """A sweep ran, but its reference profile answered under the floor of what it was sent: every profile was
    overloaded on this host, so the table ranks failures, not policies."""

    # 15: after ListenFailed's 14.
    exit_code = 15
    kind = "sweep invalid"


class GpuUnsupported(ForgeError):
    """A run host's GPU has no kernels in the image: no SASS for its compute capability and no PTX the driver can
    JIT to it (builders/preflight/gpu_gate.py). vLLM would start and then die with "no kernel image is available"."""

    # 16 is kvlab's, 17-18 publish's, 19 the registry's.
    exit_code = 20
    kind = "GPU not supported by the image"


class GpuDriverTooOld(GpuUnsupported):
    """A run host's NVIDIA driver is older than the image's CUDA runtime accepts (builders/cuda_driver.py): the
    runtime would stop at start-up with "The NVIDIA driver on your system is too old"."""

    kind = "GPU driver too old for the image"


class GpuNotEvaluated(ForgeError):
    """A GPU check found no GPU to run on (no driver library, no device): it says so instead of passing."""

    # The code of a gate not evaluated, as preflight's PreflightIncomplete.
    exit_code = 9
    kind = "cannot evaluate without a GPU"


class GpuProbeMismatch(ForgeError):
    """`forge gpu probe`: the driver ran a kernel variant the gate says cannot run on the GPU, or refused one it says
    can: Forge's reading of the binaries is wrong for that GPU, and the message names the variant."""

    # 23: 21 and 22 are the compiler caches' (builders/cache/errors.py).
    exit_code = 23
    kind = "the GPU gate disagrees with the driver"
