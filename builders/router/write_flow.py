"""The write side's flow control that both ends of a relayed stream share: the fast front end's client
connections (front.py) and the upstream connections (upstream.py) are plain protocols, without asyncio's
StreamWriter, so each needs the pause, the resume and the drain that a StreamWriter would have given it."""

from __future__ import annotations

import asyncio


class WriteFlow(asyncio.Protocol):
    """A protocol whose writes wait, in drain(), while its transport's write buffer is over its high-water mark.

    A subclass sets `transport` while it is connected, says in _closed_error what drain raises once it is not,
    and calls _fail_drain when the connection is lost, so an upload or a stream waiting on it stops at once.
    """

    transport: asyncio.Transport | None

    def __init__(self) -> None:
        self._write_paused = False
        self._drain_waiter: asyncio.Future[None] | None = None
        """A writer waiting for the peer to take what was written (a stream to a slow client, an upload's body)."""

    def _closed_error(self, why: str | None) -> Exception:
        """What drain raises once the connection is gone (`why`: what closed it, where that is known); each side
        names its own peer."""
        raise NotImplementedError

    def _fail_drain(self, why: str | None) -> None:
        waiter = self._drain_waiter
        if waiter is not None and not waiter.done():
            # Built only here: most connections close with nobody waiting on them.
            waiter.set_exception(self._closed_error(why))

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        waiter = self._drain_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def drain(self) -> None:
        """Wait until the transport's write buffer is under its low-water mark."""
        if self.transport is None:
            raise self._closed_error(None)
        if not self._write_paused:
            return
        # Only while paused: the loop is found here rather than kept, at no cost to a write that need not wait.
        self._drain_waiter = asyncio.get_running_loop().create_future()
        try:
            await self._drain_waiter
        finally:
            self._drain_waiter = None
