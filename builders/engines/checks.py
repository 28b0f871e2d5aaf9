"""What every engine's test stage returns: one CheckResult per check run in the image just built, and the helpers
the checks of each engine (builders/engines/*/image_tests.py, checks.py) share to start a server and read why it died.
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from typing import Any, Literal

import requests

from builders.container import Engine


@dataclass(frozen=True, kw_only=True)
class CheckResult:
    name: str
    ok: bool  # False fails the build; a skipped check is ok but reports status "skipped"
    detail: str
    seconds: float
    skipped: bool = False
    data: dict[str, Any] | None = None  # what the check read, kept in the report (cuda-archs: each library's archs)

    @property
    def status(self) -> Literal["passed", "failed", "skipped"]:
        return "skipped" if self.skipped else ("passed" if self.ok else "failed")

    def as_report(self) -> dict[str, Any]:
        """The entry the build report stores: status says skipped apart from passed."""
        return {
            "name": self.name,
            "status": self.status,
            "ok": self.ok,
            "detail": self.detail,
            "seconds": round(self.seconds, 1),
            **({"data": self.data} if self.data is not None else {}),
        }


def status_text(entry: dict[str, Any]) -> str:
    """A report.tests entry as a line reads it: `ok DETAIL`, `FAILED DETAIL` or `skipped: REASON` (never `ok`)."""
    detail = str(entry.get("detail") or "").strip().splitlines()
    first = detail[0] if detail else ""
    status = entry.get("status") or ("passed" if entry.get("ok") else "failed")
    if status == "skipped":
        return first if first.startswith("skipped") else f"skipped: {first or 'no reason given'}"
    return f"{'ok' if status == 'passed' else 'FAILED'} {first}".rstrip()


def server_log_excerpt(engine: Engine, cid: str) -> str:
    """The lines that say why a server died, then its last lines.

    vLLM's worker errors come hundreds of lines before the final RuntimeError, so the tail alone hides them.
    """
    lines = engine.logs(cid, tail=2000).splitlines()
    causes = [ln for ln in lines if "Error:" in ln or "error:" in ln][:8]
    head = ["errors in the log:", *causes, "...", "last lines:"] if causes else []
    return "\n".join(head + lines[-30:])


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
