"""`python -m builders.router --config FILE`: the router image's entry point."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Sequence

from builders.errors import ForgeError
from builders.router.config import load_config
from builders.router.server import serve


async def _run_until_signalled(config_path: str, host: str | None, port: int | None) -> None:
    config = load_config(config_path)
    overrides: dict[str, object] = {}
    if host is not None:
        overrides["host"] = host
    if port is not None:
        overrides["port"] = port
    if overrides:
        config = config.model_validate({**config.model_dump(), **overrides})
    task = asyncio.create_task(serve(config))
    loop = asyncio.get_running_loop()
    # A container stop sends SIGTERM: shut down cleanly so in-flight upstream connections are closed.
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await task


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m builders.router", description="Run Forge's class-aware router in front of vLLM pools."
    )
    parser.add_argument("--config", required=True, help="router config file (JSON or YAML)")
    parser.add_argument("--host", default=None, help="override the config's listen address")
    parser.add_argument("--port", type=int, default=None, help="override the config's listen port")
    args = parser.parse_args(argv)
    try:
        asyncio.run(_run_until_signalled(args.config, args.host, args.port))
    except ForgeError as exc:
        print(exc.render(), file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
