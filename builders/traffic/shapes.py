"""Request shapes of the six classes, built from a plan; pure and deterministic for a given seed."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Required, TypedDict

from builders.router.classes import RequestClass
from builders.traffic.plan import AgentPlan, ClassPlan, Endpoint, TrafficPlan

ENDPOINT_PATHS: dict[str, str] = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


# The OpenAI API's request bodies, as far as the traffic sends them: OpenAI's and vLLM's shapes, not Forge's.
class ToolCallFunction(TypedDict):
    name: str
    arguments: str


class ToolCall(TypedDict):
    id: str
    type: str
    function: ToolCallFunction


class Message(TypedDict, total=False):
    role: Required[str]
    content: Required[str]
    tool_calls: list[ToolCall]
    tool_call_id: str


class FunctionSpec(TypedDict):
    name: str
    description: str
    parameters: dict[str, object]
    """The arguments' JSON Schema."""


class Tool(TypedDict):
    type: str
    function: FunctionSpec


class RequestBody(TypedDict, total=False):
    """A chat or completions request; `messages` for chat, `prompt` for completions."""

    model: Required[str]
    max_tokens: Required[int]
    stream: Required[bool]
    ignore_eos: bool
    messages: list[Message]
    prompt: str
    tools: list[Tool]
    tool_choice: str
    logprobs: bool | int
    top_logprobs: int


@dataclass(frozen=True, kw_only=True)
class RequestSpec:
    """One request ready to send; read_bytes set means the client reads the body slowly."""

    request_class: RequestClass
    index: int
    turn: int = 0
    endpoint: Endpoint
    body: RequestBody
    headers: dict[str, str]
    read_bytes: int | None = None
    read_delay_s: float = 0.0
    receive_buffer_bytes: int | None = None

    @property
    def path(self) -> str:
        return ENDPOINT_PATHS[self.endpoint]

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))

    @property
    def prompt_chars(self) -> int:
        if "prompt" in self.body:
            return len(self.body["prompt"])
        return sum(len(m["content"]) for m in self.body.get("messages", []))


class ShapeBuilder:
    """Makes the requests of each class; request i of a class is the same text on every run."""

    def __init__(self, plan: TrafficPlan) -> None:
        self.plan = plan

    def _rng(self, *key: object) -> random.Random:
        return random.Random(":".join(str(k) for k in (self.plan.seed, *key)))

    def words(self, rng: random.Random, count: int) -> str:
        return " ".join(rng.choice(self.plan.vocabulary) for _ in range(count))

    def _headers(self, request_class: RequestClass, plan: ClassPlan) -> dict[str, str]:
        return {"x-request-class": request_class.value} if plan.send_class_header else {}

    def _body(
        self, endpoint: Endpoint, text: str, plan: ClassPlan, *, stream: bool, system: str | None = None
    ) -> RequestBody:
        body: RequestBody = {"model": self.plan.model, "max_tokens": plan.max_tokens, "stream": stream}
        if plan.ignore_eos:
            body["ignore_eos"] = True
        if endpoint == "chat":
            messages: list[Message] = [{"role": "system", "content": system}] if system else []
            body["messages"] = [*messages, {"role": "user", "content": text}]
        else:
            body["prompt"] = f"{system}\n{text}" if system else text
        return body

    def interactive(self, index: int) -> RequestSpec:
        plan = self.plan.interactive
        rng = self._rng("interactive", index)
        text = self.words(rng, rng.randint(plan.prompt_words_min, plan.prompt_words_max))
        return RequestSpec(
            request_class=RequestClass.INTERACTIVE,
            index=index,
            endpoint=plan.endpoint,
            body=self._body(plan.endpoint, text, plan, stream=True),
            headers=self._headers(RequestClass.INTERACTIVE, plan),
        )

    def rag_document(self, document: int) -> str:
        plan = self.plan.rag
        rng = self._rng("rag-document", document)
        return self.words(rng, self.plan.words_for_tokens(plan.document_fraction * self.plan.max_model_len))

    def rag(self, index: int) -> RequestSpec:
        plan = self.plan.rag
        document = self.rag_document(index % plan.documents)
        question = self.words(self._rng("rag-question", index), plan.question_words) + "?"
        system = f"Answer from this document.\n{document}"
        return RequestSpec(
            request_class=RequestClass.RAG,
            index=index,
            endpoint=plan.endpoint,
            body=self._body(plan.endpoint, question, plan, stream=True, system=system),
            headers=self._headers(RequestClass.RAG, plan),
        )

    def long_prefill(self, index: int) -> RequestSpec:
        plan = self.plan.long_prefill
        room = self.plan.max_model_len - plan.max_tokens - plan.template_margin_tokens
        text = self.words(self._rng("long_prefill", index), self.plan.words_for_tokens(room * plan.prompt_fraction))
        return RequestSpec(
            request_class=RequestClass.LONG_PREFILL,
            index=index,
            endpoint=plan.endpoint,
            body=self._body(plan.endpoint, text, plan, stream=True),
            headers=self._headers(RequestClass.LONG_PREFILL, plan),
        )

    def batch(self, index: int) -> RequestSpec:
        plan = self.plan.batch
        rng = self._rng("batch", index)
        # The text comes first so batch prompts share no prefix and are never mistaken for rag.
        text = self.words(rng, self.plan.words_for_tokens(plan.document_fraction * self.plan.max_model_len))
        return RequestSpec(
            request_class=RequestClass.BATCH,
            index=index,
            endpoint=plan.endpoint,
            body=self._body(plan.endpoint, f"{text}\nSummarize the text above in detail.", plan, stream=False),
            headers=self._headers(RequestClass.BATCH, plan),
        )

    def slow_stream(self, index: int) -> RequestSpec:
        plan = self.plan.slow_stream
        headers = self._headers(RequestClass.SLOW_STREAM, plan)
        headers["x-client-id"] = f"slow-{self.plan.seed}-{index}"
        if plan.send_slow_header:
            headers["x-client-slow"] = "1"
        text = self.words(self._rng("slow_stream", index), plan.prompt_words)
        body = self._body(plan.endpoint, text, plan, stream=True)
        if plan.top_logprobs is not None:
            # The chat API takes a flag and a count; the completions API takes the count as `logprobs`.
            if plan.endpoint == "chat":
                body["logprobs"], body["top_logprobs"] = True, plan.top_logprobs
            else:
                body["logprobs"] = plan.top_logprobs
        return RequestSpec(
            request_class=RequestClass.SLOW_STREAM,
            index=index,
            endpoint=plan.endpoint,
            body=body,
            headers=headers,
            read_bytes=plan.read_bytes,
            read_delay_s=plan.read_delay_s,
            receive_buffer_bytes=plan.receive_buffer_bytes,
        )

    def agent(self, index: int) -> AgentConversation:
        return AgentConversation(builder=self, index=index)

    def single(self, request_class: RequestClass, index: int) -> RequestSpec:
        """Request `index` of a single-request class (every class but agent)."""
        if request_class is RequestClass.AGENT:
            raise ValueError("agent requests come from a conversation: use agent(index)")
        build = {
            RequestClass.INTERACTIVE: self.interactive,
            RequestClass.RAG: self.rag,
            RequestClass.LONG_PREFILL: self.long_prefill,
            RequestClass.BATCH: self.batch,
            RequestClass.SLOW_STREAM: self.slow_stream,
        }[request_class]
        return build(index)


@dataclass(kw_only=True)
class AgentConversation:
    """A tool-using conversation: each turn adds the model's reply as a tool call and the tool's result."""

    builder: ShapeBuilder
    index: int
    turn: int = 0
    messages: list[Message] = field(default_factory=list)
    tools: list[Tool] = field(default_factory=list)

    def __post_init__(self) -> None:
        plan = self.plan
        rng = self.builder._rng("agent", self.index)
        self.tools = [
            {
                "type": "function",
                "function": {
                    "name": f"tool_{k}",
                    "description": self.builder.words(rng, 8),
                    "parameters": {
                        "type": "object",
                        "properties": {"query": {"type": "string", "description": "what to look up"}},
                        "required": ["query"],
                    },
                },
            }
            for k in range(plan.tools)
        ]
        self.messages = [
            {"role": "system", "content": "You are an agent. Call a tool when it helps, then answer."},
            {"role": "user", "content": self.builder.words(rng, plan.user_words)},
        ]

    @property
    def plan(self) -> AgentPlan:
        return self.builder.plan.agent

    @property
    def done(self) -> bool:
        return self.turn >= self.plan.turns

    def next_request(self) -> RequestSpec:
        plan = self.plan
        body: RequestBody = {
            "model": self.builder.plan.model,
            "messages": [m.copy() for m in self.messages],
            "tools": self.tools,
            "tool_choice": plan.tool_choice,
            "max_tokens": plan.max_tokens,
            "stream": plan.stream,
        }
        if plan.ignore_eos:
            body["ignore_eos"] = True
        return RequestSpec(
            request_class=RequestClass.AGENT,
            index=self.index,
            turn=self.turn,
            endpoint="chat",
            body=body,
            headers=self.builder._headers(RequestClass.AGENT, plan),
        )

    def record_reply(self, text: str) -> None:
        """Grow the context as an agent loop would: the reply becomes a tool call, then its result."""
        rng = self.builder._rng("agent-turn", self.index, self.turn)
        call_id = f"call_{self.index}_{self.turn}"
        tool = self.tools[self.turn % len(self.tools)]["function"]["name"]
        # content stays a string, never None: chat templates disagree on None beside tool_calls.
        self.messages.append(
            {
                "role": "assistant",
                "content": text,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": tool, "arguments": json.dumps({"query": self.builder.words(rng, 4)})},
                    }
                ],
            }
        )
        self.messages.append(
            {"role": "tool", "tool_call_id": call_id, "content": self.builder.words(rng, self.plan.tool_result_words)}
        )
        self.turn += 1
