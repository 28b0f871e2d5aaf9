"""What a traffic run sends: per class how many requests, how concurrently, of which shape, judged by which SLO.

Sizes are in words of a tiny vocabulary; ``tokens_per_word`` turns them into tokens against
``max_model_len``. The default vocabulary holds common short English words, which byte-level BPE
tokenizers (Llama's included) encode as one token each after a space, so 1.0 is the default.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from builders.engines.tiny_model import DEFAULT_VOCABULARY
from builders.router.classes import RequestClass

Endpoint = Literal["chat", "completions"]


class ClassSLO(BaseModel):
    """Service-level objectives of one class; None leaves a bound unchecked."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ttft_p99_ms: float | None = Field(
        default=None, gt=0, description="Bound on the class's p99 TTFT, and on each request's TTFT for goodput."
    )
    itl_p99_ms: float | None = Field(
        default=None,
        gt=0,
        description="Bound on the class's pooled p99 inter-chunk gap, and on each request's TPOT for goodput.",
    )
    max_error_rate: float = Field(default=0.0, ge=0, le=1, description="Largest tolerated fraction of failed requests.")
    min_goodput: float = Field(default=0.0, ge=0, le=1, description="Smallest fraction of requests meeting every SLO.")


class ClassPlan(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    count: int = Field(default=0, ge=0, description="Requests of this class (for agent: conversations).")
    concurrency: int = Field(
        default=1, ge=1, description="Requests (agent: conversations) in flight at once; unused with rate_per_s."
    )
    rate_per_s: float | None = Field(
        default=None,
        gt=0,
        description="Open loop: requests (agent: conversations) start at Poisson arrival times of this mean "
        "rate, drawn from the plan's seed, whether or not earlier ones have finished, so a slow server faces "
        "the same offered load as a fast one. None: closed loop at `concurrency`.",
    )
    send_class_header: bool = Field(
        default=False, description="Send x-request-class; off lets the router classify by content."
    )
    max_tokens: int = Field(default=32, ge=1, description="Output tokens asked for per request.")
    ignore_eos: bool = Field(
        default=True, description="Send vLLM's ignore_eos so a random model still produces max_tokens tokens."
    )
    slo: ClassSLO = Field(default_factory=ClassSLO, description="Objectives the class is judged by.")


class InteractivePlan(ClassPlan):
    """Short chat turns, streamed, small outputs."""

    prompt_words_min: int = Field(default=8, ge=1, description="Shortest prompt, in words.")
    prompt_words_max: int = Field(default=32, ge=1, description="Longest prompt, in words.")
    endpoint: Endpoint = Field(default="chat", description="OpenAI endpoint used.")


class RagPlan(ClassPlan):
    """Questions over a few shared documents: requests share a long common prefix."""

    documents: int = Field(default=2, ge=1, description="Distinct documents; request i uses document i mod this.")
    document_fraction: float = Field(
        default=0.3, gt=0, lt=1, description="Document length as a fraction of max_model_len."
    )
    question_words: int = Field(default=12, ge=1, description="Words of the question after the document.")
    endpoint: Endpoint = Field(default="chat", description="OpenAI endpoint used.")


class LongPrefillPlan(ClassPlan):
    """Prompts that fill the context window up to the room left for the output."""

    max_tokens: int = Field(default=16, ge=1, description="Output tokens asked for per request.")
    prompt_fraction: float = Field(
        default=0.85,
        gt=0,
        le=1,
        description="Prompt length as a fraction of (max_model_len - max_tokens - template_margin).",
    )
    template_margin_tokens: int = Field(
        default=64, ge=0, description="Tokens kept free for the chat template and tokenizer surprises."
    )
    endpoint: Endpoint = Field(default="completions", description="OpenAI endpoint used (exact prompt length).")


class AgentPlan(ClassPlan):
    """Multi-turn tool-using conversations whose context grows every turn."""

    turns: int = Field(default=3, ge=1, description="Requests per conversation.")
    tools: int = Field(default=2, ge=1, description="Tool definitions sent with every turn.")
    user_words: int = Field(default=16, ge=1, description="Words of the opening user message.")
    tool_result_words: int = Field(default=40, ge=1, description="Words of each tool result fed back.")
    tool_choice: str = Field(
        default="none",
        description="tool_choice sent; 'none' works on any vLLM, 'auto' needs --enable-auto-tool-choice.",
    )
    stream: bool = Field(default=True, description="Stream each turn.")


class BatchPlan(ClassPlan):
    """Summaries of a text with long, non-streamed outputs."""

    max_tokens: int = Field(default=512, ge=1, description="Output tokens asked for; long by design.")
    document_fraction: float = Field(
        default=0.25, gt=0, lt=1, description="Text to summarise, as a fraction of max_model_len."
    )
    endpoint: Endpoint = Field(default="completions", description="OpenAI endpoint used.")


class SlowStreamPlan(ClassPlan):
    """Streaming clients that read the response body at a throttled rate."""

    max_tokens: int = Field(default=64, ge=1, description="Output tokens asked for per request.")
    prompt_words: int = Field(default=16, ge=1, description="Prompt length in words.")
    read_bytes: int = Field(default=64, ge=1, description="Bytes read from the body per read.")
    read_delay_s: float = Field(default=0.05, ge=0, description="Sleep between reads of the body.")
    receive_buffer_bytes: int | None = Field(
        default=None,
        ge=1024,
        description="Push back as a real slow client does: SO_RCVBUF of the client's socket and the HTTP "
        "client's read buffer, so the server, not the client library, holds what is not read yet. Null "
        "lets the client library and the kernel absorb the answer (up to ~128 KiB + autotuned window).",
    )
    top_logprobs: int | None = Field(
        default=None,
        ge=0,
        le=20,
        description="Ask for this many top logprobs per token (as evaluation clients do): each streamed event "
        "grows ~20x, so a short generation produces an answer larger than every buffer on its way.",
    )
    send_slow_header: bool = Field(default=True, description="Send x-client-slow: 1 (a client's own hint).")
    endpoint: Endpoint = Field(default="chat", description="OpenAI endpoint used.")


class TrafficPlan(BaseModel):
    """A bounded mixed-traffic run: it stops after max_total_requests or deadline_s, whichever comes first."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(description="Model name sent in every request.")
    max_model_len: int = Field(ge=64, description="The served model's context length, in tokens.")
    tokens_per_word: float = Field(default=1.0, gt=0, description="Tokens one vocabulary word costs.")
    vocabulary: tuple[str, ...] = Field(
        default=DEFAULT_VOCABULARY, min_length=2, description="Words prompts are made of."
    )
    seed: int = Field(default=0, description="Seed for prompt contents; the same plan sends the same text.")
    max_total_requests: int = Field(default=200, ge=1, description="Hard cap on requests sent, all classes.")
    deadline_s: float = Field(
        default=120.0, gt=0, description="Wall-clock bound of the run; in-flight requests are cut."
    )
    request_timeout_s: float = Field(default=60.0, gt=0, description="Bound on any single request.")
    drain_s: float = Field(
        default=0.0,
        ge=0,
        description="After deadline_s no request starts; those in flight may finish for this much longer "
        "before they are cut and counted as errors. 0 cuts them at the deadline. A benchmark wants the "
        "answers of everything it sent (a slow reader's answer takes as long as its reader).",
    )
    interactive: InteractivePlan = Field(default_factory=InteractivePlan, description="Interactive chat.")
    rag: RagPlan = Field(default_factory=RagPlan, description="Shared-document questions.")
    long_prefill: LongPrefillPlan = Field(default_factory=LongPrefillPlan, description="Near-full prompts.")
    agent: AgentPlan = Field(default_factory=AgentPlan, description="Tool-using conversations.")
    batch: BatchPlan = Field(default_factory=BatchPlan, description="Long non-streamed summaries.")
    slow_stream: SlowStreamPlan = Field(default_factory=SlowStreamPlan, description="Throttled readers.")

    @model_validator(mode="after")
    def _shapes_fit_the_context(self) -> TrafficPlan:
        for request_class in RequestClass:
            plan = self.for_class(request_class)
            if plan.count and plan.max_tokens >= self.max_model_len:
                raise ValueError(
                    f"{request_class.value}.max_tokens={plan.max_tokens} leaves no room for a prompt in "
                    f"max_model_len={self.max_model_len}"
                )
        if self.interactive.prompt_words_min > self.interactive.prompt_words_max:
            raise ValueError("interactive.prompt_words_min is above prompt_words_max")
        for request_class in RequestClass:
            plan = self.for_class(request_class)
            need = self.prompt_tokens_at_most(request_class) + plan.max_tokens
            if plan.count and need > self.max_model_len:
                raise ValueError(
                    f"{request_class.value}: prompt and output need about {need} tokens, over "
                    f"max_model_len={self.max_model_len}; lower its sizes or max_tokens"
                )
        return self

    def prompt_tokens_at_most(self, request_class: RequestClass) -> int:
        """A generous estimate of the longest prompt the class sends, chat template included."""
        template = 32
        words = self.tokens_per_word
        length = self.max_model_len
        match request_class:
            case RequestClass.INTERACTIVE:
                return int(self.interactive.prompt_words_max * words) + template
            case RequestClass.RAG:
                return int(self.rag.document_fraction * length + self.rag.question_words * words) + template
            case RequestClass.LONG_PREFILL:
                lp = self.long_prefill
                return int((length - lp.max_tokens - lp.template_margin_tokens) * lp.prompt_fraction) + template
            case RequestClass.AGENT:
                a = self.agent
                per_turn = a.max_tokens + a.tool_result_words * words + 40
                return int(a.user_words * words + a.tools * 60 + (a.turns - 1) * per_turn) + template
            case RequestClass.BATCH:
                return int(self.batch.document_fraction * length) + template
            case RequestClass.SLOW_STREAM:
                return int(self.slow_stream.prompt_words * words) + template

    def for_class(self, request_class: RequestClass) -> ClassPlan:
        plan: ClassPlan = getattr(self, request_class.value)
        return plan

    def words_for_tokens(self, tokens: float) -> int:
        return max(1, int(tokens / self.tokens_per_word))


__all__ = [
    "DEFAULT_VOCABULARY",
    "AgentPlan",
    "BatchPlan",
    "ClassPlan",
    "ClassSLO",
    "InteractivePlan",
    "LongPrefillPlan",
    "RagPlan",
    "SlowStreamPlan",
    "TrafficPlan",
]
