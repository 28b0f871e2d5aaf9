"""One answered or failed request as the traffic runner records it, for the sweep's tests that build results
without a server: every test of the report, the claims and the repetitions builds them the same way."""

from __future__ import annotations

from builders.router.classes import RequestClass
from builders.traffic.metrics import RequestRecord


def streamed(request_class: RequestClass, index: int, ttft_s: float | None, *, max_tokens: int = 4) -> RequestRecord:
    """A streamed chat request whose first token came after `ttft_s` and the rest 10 ms apart; None: it failed
    with HTTP 503 after 10 ms."""
    r = RequestRecord(
        request_class=request_class,
        index=index,
        endpoint="chat",
        stream=True,
        sent_class_header=False,
        prompt_chars=10,
        max_tokens=max_tokens,
    )
    if ttft_s is None:
        r.error = "HTTP 503"
        r.e2e_s = 0.01
    else:
        r.content_times_s = [ttft_s + 0.01 * i for i in range(max_tokens)]
        r.e2e_s = r.content_times_s[-1]
    return r
