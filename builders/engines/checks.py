"""What every engine's test stage returns: one CheckResult per check run in the image just built, and the helpers
the checks of each engine (builders/engines/*/image_tests.py, checks.py) share to start a server and read why it died.
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass
from typing import Literal, NotRequired, TypedDict, TypeVar

import requests
from pydantic import TypeAdapter, ValidationError

# pydantic validates a TypedDict from typing_extensions alone on Python < 3.12.
from typing_extensions import TypedDict as ValidatedDict

from builders.container import Engine, RunSpec

# cuda-archs: per library, the archs with machine code ("sass") and with PTX ("ptx"), as builders/gpu_archs.py
# writes them.
ArchsByLibrary = dict[str, dict[str, list[str]]]
CheckStatus = Literal["passed", "failed", "skipped"]
# What a build stage may need and a runtime image must not carry (check_no_compilers).
COMPILERS = ("gcc", "g++", "cc", "c++", "cmake", "clang")


class CheckDataEntry(TypedDict, total=False):
    """What a check read and the report keeps (builders/report.CheckData validates it there)."""

    cuda_archs: ArchsByLibrary  # cuda-archs: each CUDA library's archs
    ops: list[str]  # kernel-ops: the custom ops a kernel library registered with torch, by name
    # cuda-libs-load: torch's version and the CUDA it was built for, what the driver gate judges hosts by.
    torch: str
    cuda_runtime: str


class CheckEntry(TypedDict):
    """A check as the build report stores it (builders/report.CheckRecord validates it there)."""

    name: str
    status: CheckStatus
    ok: bool
    detail: str
    seconds: float
    data: NotRequired[CheckDataEntry]


@dataclass(frozen=True, kw_only=True)
class CheckResult:
    name: str
    ok: bool  # False fails the build; a skipped check is ok but reports status "skipped"
    detail: str
    seconds: float
    skipped: bool = False
    # What the check read, kept in the report (cuda_archs: each library's archs; ops: a kernel library's ops;
    # torch and cuda_runtime: what cuda-libs-load read).
    data: CheckDataEntry | None = None

    @property
    def status(self) -> CheckStatus:
        return "skipped" if self.skipped else ("passed" if self.ok else "failed")

    def as_report(self) -> CheckEntry:
        """The entry the build report stores: status says skipped apart from passed."""
        entry: CheckEntry = {
            "name": self.name,
            "status": self.status,
            "ok": self.ok,
            "detail": self.detail,
            "seconds": round(self.seconds, 1),
        }
        if self.data is not None:
            entry["data"] = self.data
        return entry


def server_log_excerpt(engine: Engine, cid: str) -> str:
    """The lines that say why a server died, then its last lines.

    vLLM's worker errors come hundreds of lines before the final RuntimeError, so the tail alone hides them.
    """
    lines = engine.logs(cid, tail=2000).splitlines()
    causes = [ln for ln in lines if "Error:" in ln or "error:" in ln][:8]
    head = ["errors in the log:", *causes, "...", "last lines:"] if causes else []
    return "\n".join(head + lines[-30:])


def check_no_compilers(engine: Engine, image: str) -> CheckResult:
    """Non-root, and no compiler or CMake on the PATH: the toolchain stage stayed behind."""
    start = time.monotonic()
    script = f"id -u; for t in {' '.join(COMPILERS)}; do command -v $t || true; done"
    rc, out = engine.run_once(
        RunSpec(image=image, command=["-c", script], entrypoint=["/bin/sh"], network_host=False), timeout=60
    )
    lines = out.strip().splitlines()
    uid = lines[0].strip() if lines else "?"
    found = [ln for ln in lines[1:] if ln.strip()]
    ok = rc == 0 and uid == "1000" and not found
    detail = f"uid {uid}; compilers: {', '.join(found) or 'none'}"
    return CheckResult(name="no-compilers", ok=ok, detail=detail, seconds=time.monotonic() - start)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def streamed_chat(base_url: str, model: str, *, max_tokens: int = 8, timeout: float = 60) -> tuple[int, str]:
    """POST a streamed chat completion; return (content chunks, finish_reason) after `data: [DONE]`.

    Raises ValueError naming what the stream lacked (no [DONE], a chunk that is not JSON)."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "hello world, please explain the system"}],
        "max_tokens": max_tokens,
        "stream": True,
    }
    chunks, finish, done = 0, "", False
    with requests.post(f"{base_url}/v1/chat/completions", json=body, stream=True, timeout=timeout) as resp:
        resp.raise_for_status()
        for raw in resp.iter_lines(decode_unicode=True):
            if not raw or not raw.startswith("data: "):
                continue
            data = raw.removeprefix("data: ").strip()
            if data == "[DONE]":
                done = True
                break
            event = json.loads(data)
            for choice in event.get("choices", []):
                if choice.get("delta", {}).get("content"):
                    chunks += 1
                finish = choice.get("finish_reason") or finish
    if not done:
        raise ValueError(f"the stream ended without data: [DONE] after {chunks} content chunks")
    return chunks, finish


class Cuobjdump(ValidatedDict):
    """A GPU image's archs probe line: the cuobjdump found, and per library and flag its exit code and listing
    lines (the probe runs cuobjdump inside the image, the judge reads its line here)."""

    tool: str | None
    libs: dict[str, dict[str, tuple[int, list[str]]]]


ProbeLine = TypeVar("ProbeLine")


def probe_line(out: str, prefix: str, shape: type[ProbeLine]) -> ProbeLine | None:
    """A test-stage probe's JSON line `PREFIX {...}`, as the probe writes it; None when it printed none or
    something else."""
    line = next((ln for ln in out.splitlines() if ln.startswith(prefix + " ")), None)
    if line is None:
        return None
    try:
        return TypeAdapter(shape).validate_json(line.removeprefix(prefix + " "))
    except ValidationError:
        return None
