"""Multipart uploads (audio transcription) relayed as they arrive: never read whole, bounded in bytes and time.

The client's body comes through aiohttp's StreamReader, which stops reading the client's socket while its buffer is
full, and goes to the replica on the router's own connection (builders/router/upstream.py), whose writes wait while
the replica's socket does not take them: the router holds at most those two buffers of an upload, whatever its size.
Only its beginning is held while the request is routed: the form fields before the first file part, where the
OpenAI client puts `model`, read up to SNIFF_BYTES.

Every byte counts against max_request_bytes, and the whole body against body_timeout_s, as a JSON body's does:
over the limit it is a 413 naming it, too slow a 408.
"""

from __future__ import annotations

import asyncio
import re
import time

import aiohttp
from aiohttp import web

from builders.router.upstream import Connection

SNIFF_BYTES = 64 * 1024
"""How much of an upload is read before it is routed, looking for its `model` field."""
MAX_MODEL_CHARS = 256

_BOUNDARY = re.compile(r'boundary=(?:"([^"]{1,70})"|([^\s;,"]{1,70}))', re.IGNORECASE)
_PART_NAME = re.compile(rb'(?:^|;)\s*name="([^"]*)"', re.IGNORECASE)
_PART_FILE = re.compile(rb"(?:^|;)\s*filename\*?=", re.IGNORECASE)


class UploadRefused(Exception):
    """The upload cannot go on: over the size limit (413), too slow (408), or its client left."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def multipart_boundary(content_type: str) -> bytes | None:
    """The boundary of a multipart/form-data Content-Type, or None when it is not one (or not printable ASCII: the
    header goes on to the replica as it came)."""
    if not (content_type.isascii() and content_type.isprintable()):
        return None
    kind, _, params = content_type.partition(";")
    if kind.strip().lower() != "multipart/form-data":
        return None
    found = _BOUNDARY.search(params)
    if found is None:
        return None
    return (found.group(1) or found.group(2)).encode("latin-1")


def form_model(prefix: bytes, boundary: bytes) -> tuple[bool, str | None]:
    """(decided, model) from the first bytes of a multipart body: decided once the `model` field is read, a file
    part begins (what follows it is not read to route), or the body ends; not decided while more may bring it."""
    delimiter = b"--" + boundary
    at = prefix.find(delimiter)
    while at >= 0:
        start = at + len(delimiter)
        if prefix[start : start + 2] == b"--":
            return True, None  # the closing delimiter: no model field at all
        head_end = prefix.find(b"\r\n\r\n", start)
        if head_end < 0:
            return False, None
        disposition = b""
        for line in prefix[start:head_end].split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-disposition":
                disposition = value
        if _PART_FILE.search(disposition):
            return True, None
        value_end = prefix.find(b"\r\n" + delimiter, head_end + 4)
        if value_end < 0:
            return False, None
        field = _PART_NAME.search(disposition)
        if field is not None and field.group(1) == b"model":
            model = prefix[head_end + 4 : value_end].decode("utf-8", "replace").strip()
            return True, model[:MAX_MODEL_CHARS] or None
        at = value_end + 2
    return False, None


class Upload:
    """One multipart request body on its way from the client to a replica."""

    def __init__(
        self,
        reader: aiohttp.StreamReader,
        *,
        content_type: str,
        boundary: bytes,
        length: int | None,
        limit: int,
        deadline: float,
    ) -> None:
        self._reader = reader
        self.content_type = content_type
        self._boundary = boundary
        self.length = length
        """The client's Content-Length, or None for a chunked body (then it goes on chunked)."""
        self._limit = limit
        self._deadline = deadline
        """time.monotonic() by which the whole body must have arrived (body_timeout_s after the request)."""
        self.prefix = b""
        self.received = 0
        """Bytes read from the client so far."""
        self.consumed = False
        """Bytes past the prefix were read: the body can no longer be sent to another replica."""
        self.finished = False
        """The whole body was read from the client."""

    def _left_s(self) -> float:
        return self._deadline - time.monotonic()

    def _count(self, chunk: bytes) -> None:
        self.received += len(chunk)
        if self.received > self._limit:
            raise UploadRefused(413, f"request body is over {self._limit} bytes (max_request_bytes)")

    async def _read(self) -> bytes:
        try:
            chunk = await self._reader.readany()
        except (aiohttp.ClientError, ConnectionError, OSError) as exc:
            raise UploadRefused(400, f"the upload ended early ({type(exc).__name__})") from None
        if chunk:
            self._count(chunk)
        else:
            self.finished = True
        return chunk

    async def sniff(self) -> str | None:
        """Read the body's beginning, up to SNIFF_BYTES, until its `model` field is found or cannot come before the
        first file; the model, or None."""
        if self.length is not None and self.length > self._limit:
            raise UploadRefused(413, f"request body is over {self._limit} bytes (max_request_bytes)")
        held = bytearray()
        try:
            async with asyncio.timeout(max(0.0, self._left_s())):
                while len(held) < SNIFF_BYTES:
                    chunk = await self._read()
                    if not chunk:
                        break
                    held += chunk
                    decided, model = form_model(bytes(held), self._boundary)
                    if decided:
                        self.prefix = bytes(held)
                        return model
        except TimeoutError:
            raise self._too_slow() from None
        self.prefix = bytes(held)
        return None

    def _too_slow(self) -> UploadRefused:
        return UploadRefused(408, f"request body did not arrive within the body timeout ({self.received} bytes came)")

    def framing(self) -> dict[str, str]:
        """The headers that carry the body to the replica: its own Content-Type, and its length or chunked framing."""
        framing = {"Content-Type": self.content_type}
        if self.length is not None:
            framing["Content-Length"] = str(self.length)
        else:
            framing["Transfer-Encoding"] = "chunked"
        return framing

    async def send(self, connection: Connection) -> None:
        """Write the whole body to the replica as it arrives, never more than the transport's buffer ahead of it."""
        chunked = self.length is None

        def write(data: bytes) -> None:
            transport = connection.transport
            if transport is None or transport.is_closing():
                raise ConnectionResetError("the replica closed the connection")
            transport.write(b"%x\r\n%b\r\n" % (len(data), data) if chunked else data)

        try:
            async with asyncio.timeout(max(0.0, self._left_s())):
                if self.prefix:
                    write(self.prefix)
                    await connection.drain()
                while not self.finished:
                    chunk = await self._read()
                    if not chunk:
                        break
                    self.consumed = True
                    write(chunk)
                    await connection.drain()
        except TimeoutError:
            raise self._too_slow() from None
        if chunked:
            write(b"")  # b"0\r\n\r\n": the last chunk

    def answer_closes(self, response: web.StreamResponse) -> bool:
        """Whether the client's connection must close after this answer: a body that stopped arriving is not
        waited for (aiohttp would read out a body it still sends, bounded by its lingering time, so that a 413
        reaches a client still writing)."""
        return response.status == 408 and not self.finished
