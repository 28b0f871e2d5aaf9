"""The C relay (builders/router/_fastrelay.c): what it takes, what it hands back, and that it changes nothing a
client or a metric can see.

The unit tests drive the C object with plain stand-ins for the transports and the Python relay; the
end-to-end ones run the router with each relay against the same fake replica and compare.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from router_fakes import Behavior, FakeReplica, chat_body, router_config, run, sse_data

from builders.router import start_router
from builders.router.native import ENV_SWITCH, NativeRelay, native_relay, relay_name
from builders.router.prometheus import HistogramSeries
from builders.router.upstream import Connection

needs_native = pytest.mark.skipif(NativeRelay is None, reason="the C relay is not built in this checkout")

EVENT = b'data: {"choices":[{"delta":{"content":"t1 "}}]}\n\n'


def chunk(payload: bytes, size_line: bytes | None = None) -> bytes:
    return (size_line if size_line is not None else b"%x" % len(payload)) + b"\r\n" + payload + b"\r\n"


class ClientTransport:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.buffered = 0
        self.closing = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return self.buffered


@dataclass
class Events:
    last_event: float | None = None


@dataclass
class Call:
    last_upstream: float = 0.0


@dataclass
class RouterState:
    stream_buffer_peak: int = 0


class PythonSide(asyncio.Protocol):
    """The replica connection's Python protocol and the Python relay in one: records what is handed over."""

    def __init__(self, events: Events) -> None:
        self.events = events
        self.handed: list[bytes] = []
        self.last_event_seen: list[float | None] = []
        self.set_last_event: float | None = None
        """When set, handling a read stores this as the framer's last event, as the Python framer would."""
        self.fast_ok = True
        self.asked = 0
        self.lost: list[Exception | None] = []

    def data_received(self, data: bytes) -> None:
        self.handed.append(data)
        self.last_event_seen.append(self.events.last_event)
        if self.set_last_event is not None:
            self.events.last_event = self.set_last_event

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.append(exc)

    def _fast_ok(self) -> bool:
        self.asked += 1
        return self.fast_ok


@dataclass
class Rig:
    relay: Any
    side: PythonSide
    client: ClientTransport
    events: Events
    call: Call
    itl: HistogramSeries
    router: RouterState


def rig(write_low: int = 4096, bounds: tuple[float, ...] = (0.001, 0.01, 10.0)) -> Rig:
    assert NativeRelay is not None
    events, call, router, client = Events(), Call(), RouterState(), ClientTransport()
    side = PythonSide(events)
    itl = HistogramSeries(bounds)
    relay = NativeRelay(
        connection=side,
        owner=side,
        call=call,
        events=events,
        transport=client,  # type: ignore[arg-type]
        itl=itl,
        router=router,
        write_low=write_low,
    )
    relay.enabled = True
    return Rig(relay, side, client, events, call, itl, router)


@needs_native
def test_a_one_event_chunk_is_written_as_it_came_and_timed() -> None:
    r = rig()
    before = time.monotonic()
    r.relay.data_received(chunk(EVENT))
    assert r.client.written == [chunk(EVENT)] and r.side.handed == []
    # The first event has no gap to count; the call's last upstream time is stored on the same clock.
    assert sum(r.itl.counts) == 0 and before <= r.call.last_upstream <= time.monotonic()
    r.relay.data_received(chunk(EVENT))
    assert len(r.client.written) == 2 and sum(r.itl.counts) == 1
    assert r.itl.counts[0] + r.itl.counts[1] == 1 and 0 < r.itl.total < 0.01
    assert r.relay.relayed == 2 and r.side.asked == 0


@needs_native
@pytest.mark.parametrize("size_line", [b"%X" % len(EVENT), b"00%x" % len(EVENT)])
def test_any_valid_size_line_spelling_is_relayed_verbatim(size_line: bytes) -> None:
    r = rig()
    data = chunk(EVENT, size_line)
    r.relay.data_received(data)
    assert r.client.written == [data]


DECLINED = {
    "two events in one chunk": chunk(EVENT + EVENT),
    "two chunks in one read": chunk(EVENT) + chunk(EVENT),
    "half a chunk": chunk(EVENT)[:20],
    "a chunk without its closing CRLF": chunk(EVENT)[:-2],
    "the [DONE] event": chunk(b"data: [DONE]\n\n"),
    "the [DONE] event without a space": chunk(b"data:[DONE]\n\n"),
    "the last chunk": b"0\r\n\r\n",
    "a chunk extension": b"%x;x=1\r\n%b\r\n" % (len(EVENT), EVENT),
    "a size line of nine digits": chunk(EVENT, b"0%08x" % len(EVENT)),
    "a size that does not match": chunk(EVENT, b"%x" % (len(EVENT) + 1)),
    "an event of two lines": chunk(b"data: a\ndata: b\n\n"),
    "an event ended by CRLFs": chunk(b"data: a\r\n\r\n"),
    "a comment": chunk(b": keep-alive\n\n"),
    "not SSE at all": chunk(b"hello world\n\n"),
}


@needs_native
@pytest.mark.parametrize("data", DECLINED.values(), ids=DECLINED.keys())
def test_anything_else_is_handed_to_python_unchanged(data: bytes) -> None:
    r = rig()
    r.relay.data_received(data)
    assert r.client.written == [] and r.side.handed == [data] and r.relay.relayed == 0
    assert r.side.asked == 1, "after a hand-over the Python relay decides whether the fast path goes on"


@needs_native
def test_a_lagging_or_closing_client_is_left_to_python() -> None:
    r = rig(write_low=len(EVENT) + 10)
    r.client.buffered = 11
    r.relay.data_received(chunk(EVENT))
    r.client.buffered = 0
    r.client.closing = True
    r.relay.data_received(chunk(EVENT))
    assert r.client.written == [] and r.side.handed == [chunk(EVENT)] * 2


@needs_native
def test_a_buffer_under_the_low_water_mark_raises_the_routers_peak() -> None:
    r = rig()
    r.client.buffered = 100
    r.relay.data_received(chunk(EVENT))
    assert r.client.written == [chunk(EVENT)] and r.router.stream_buffer_peak == 100
    r.client.buffered = 50
    r.relay.data_received(chunk(EVENT))
    assert r.router.stream_buffer_peak == 100


@needs_native
def test_the_last_event_time_travels_with_every_hand_over() -> None:
    r = rig()
    r.relay.data_received(chunk(EVENT))
    timed_here = r.call.last_upstream
    r.side.set_last_event = time.monotonic() - 1.0
    r.relay.data_received(chunk(EVENT + EVENT))
    # Python saw the time of the event relayed in C, and the next gap is timed from what Python stored.
    assert r.side.last_event_seen == [timed_here]
    r.relay.data_received(chunk(EVENT))
    assert r.itl.counts == [0, 0, 1, 0] and 1.0 <= r.itl.total < 2.0


@needs_native
def test_the_python_relay_switches_the_fast_path_off_and_on() -> None:
    r = rig()
    r.side.fast_ok = False
    r.relay.data_received(chunk(EVENT + EVENT))
    assert not r.relay.enabled
    r.relay.data_received(chunk(EVENT))
    assert r.side.handed == [chunk(EVENT + EVENT), chunk(EVENT)] and r.client.written == []
    r.relay.enabled = True
    r.relay.data_received(chunk(EVENT))
    assert r.client.written == [chunk(EVENT)]


@needs_native
def test_a_detached_relay_passes_everything_to_the_connection() -> None:
    r = rig()
    r.relay.detach()
    r.relay.enabled = True
    r.relay.data_received(chunk(EVENT))
    assert r.side.handed == [chunk(EVENT)] and r.client.written == [] and r.side.asked == 0
    # A transport that still has it as its protocol reports the loss through it: the pool must hear.
    error = ConnectionResetError()
    r.relay.connection_lost(error)
    assert r.side.lost == [error]


def _reference_takes(data: bytes) -> bool:
    """What the C relay should take, said in Python: one chunk, one single-line data event, not [DONE]."""
    match = re.fullmatch(rb"([0-9a-fA-F]{1,8})\r\n(.*)\r\n", data, re.DOTALL)
    if match is None or int(match[1], 16) != len(match[2]):
        return False
    payload = match[2]
    return (
        payload.startswith(b"data:")
        and payload.find(b"\n") == len(payload) - 2
        and payload.endswith(b"\n")
        and payload not in (b"data: [DONE]\n\n", b"data:[DONE]\n\n")
    )


_payloads = st.one_of(
    st.builds(lambda t: b"data: " + t + b"\n\n", st.binary(max_size=40)),
    st.sampled_from([b"data: [DONE]\n\n", b"data:[DONE]\n\n", b"data: a\n\n", EVENT]),
    st.binary(max_size=60),
)
_reads = st.one_of(
    st.builds(chunk, _payloads),
    st.builds(lambda p, line: chunk(p, line), _payloads, st.binary(max_size=10)),
    st.builds(lambda a, b: chunk(a) + chunk(b), _payloads, _payloads),
    st.binary(max_size=80),
)


@needs_native
@settings(max_examples=400, deadline=None)
@given(_reads)
def test_every_read_is_either_relayed_whole_or_handed_over_whole(data: bytes) -> None:
    r = rig()
    r.relay.data_received(data)
    if _reference_takes(data):
        assert r.client.written == [data] and r.side.handed == []
    else:
        assert r.client.written == [] and r.side.handed == [data]


def test_the_c_relay_is_built_where_a_compiler_is() -> None:
    """Where a C compiler and Python's headers are present, `pip install` builds the relay: a missing one there
    is a broken build, not a choice, and would leave every other test here silently on Python."""
    headers = sysconfig.get_paths()["include"]
    if shutil.which("cc") is None or not (Path(headers) / "Python.h").exists():
        pytest.skip("no C compiler or no Python.h here: the router runs its Python relay")
    assert NativeRelay is not None, (
        "a C compiler is here but builders/router/_fastrelay.c is not built: pip install -e ."
    )


def test_the_switch_turns_the_c_relay_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_SWITCH, "0")
    assert native_relay() is None and relay_name() == "python"
    monkeypatch.setenv(ENV_SWITCH, "1")
    assert (native_relay() is NativeRelay) and relay_name() == ("python" if NativeRelay is None else "native")


# --- end to end ---------------------------------------------------------------------------------------------------


async def _streams(url: str, count: int) -> list[bytes]:
    bodies = []
    async with aiohttp.ClientSession() as session:
        for i in range(count):
            async with session.post(f"{url}/v1/chat/completions", json=chat_body(f"q{i}", stream=True)) as resp:
                assert resp.status == 200
                bodies.append(await resp.read())
    return bodies


@needs_native
def test_both_relays_give_clients_the_same_bytes_and_the_same_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    tokens, streams = 12, 3

    async def body(native: bool) -> tuple[list[bytes], list[int], int, int]:
        monkeypatch.setenv(ENV_SWITCH, "1" if native else "0")
        replica = await FakeReplica(Behavior(tokens=tokens, delay_s=0.004)).start()
        router = await start_router(router_config({"p": [replica.url]}))
        try:
            bodies = await _streams(router.url, streams)
            itl = router.router.metrics.itl.bind({"class": "interactive"})
            upstream = router.router._upstream
            assert upstream is not None
            # One pooled connection served every stream, and it went back to the pool as its own protocol.
            idle = [c for connections in upstream._idle.values() for c in connections]
            assert upstream.open_connections == 1 and len(idle) == 1
            assert idle[0].transport is not None and isinstance(idle[0].transport.get_protocol(), Connection)
            return bodies, list(itl.counts), router.router.stats.events_relayed_natively, replica.completed
        finally:
            await router.stop()
            await replica.stop()

    native_bodies, native_counts, native_events, native_done = run(body(True))
    python_bodies, python_counts, python_events, python_done = run(body(False))
    assert native_bodies == python_bodies and len(sse_data(native_bodies[0])) == tokens + 1
    assert sse_data(native_bodies[0])[-1] == "[DONE]"
    # Every gap between a stream's events is counted once, whichever relay timed it.
    assert sum(native_counts) == sum(python_counts) == streams * tokens
    assert native_done == python_done == streams
    # The first event of a stream goes through Python (it sends the response head), [DONE] too: the rest in C.
    assert python_events == 0 and native_events >= streams * (tokens - 1) // 2, native_events
