"""What every fake server of the router's and the traffic runner's tests shares: an aiohttp app served on a
loopback port, set up the way vLLM's own server is, so the fakes differ only in what they answer."""

from __future__ import annotations

from aiohttp import web


async def serve(app: web.Application, host: str = "127.0.0.1", port: int = 0) -> tuple[web.AppRunner, str]:
    """The runner (cleaned up to stop) and the URL `app` answers at; port 0 takes a free one."""
    # Like vLLM, a replica learns of a vanished client by its handler being cancelled.
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=1.0)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    bound_host, bound_port = runner.addresses[0][:2]
    return runner, f"http://{bound_host}:{bound_port}"
