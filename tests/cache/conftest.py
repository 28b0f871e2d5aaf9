"""A Redis stand-in for the probe and the policy: Redis's own protocol (RESP), as much of it as Forge speaks before
a build (AUTH, PING), on loopback."""

from __future__ import annotations

import socketserver
import threading
from collections.abc import Iterator

import pytest


class _Resp(socketserver.StreamRequestHandler):
    """Redis's protocol, as much as the probe speaks: AUTH with the right password, PING."""

    password = "right-password"

    def handle(self) -> None:
        authed = False
        while True:
            header = self.rfile.readline()
            if not header:
                return
            words = []
            for _ in range(int(header[1:])):
                self.rfile.readline()
                words.append(self.rfile.readline().strip().decode())
            if words[0] == "AUTH":
                authed = words[-1] == self.password
                self.wfile.write(b"+OK\r\n" if authed else b"-WRONGPASS invalid username-password pair\r\n")
            elif words[0] == "PING":
                self.wfile.write(b"+PONG\r\n" if authed else b"-NOAUTH Authentication required.\r\n")


@pytest.fixture
def resp_server() -> Iterator[int]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Resp)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
