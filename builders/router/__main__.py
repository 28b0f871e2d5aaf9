"""`python -m builders.router --config FILE`: the router image's entry point."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Callable, Sequence

from builders.errors import ForgeError
from builders.router.app import serve
from builders.router.config import config_from_mapping, load_config

# Keys from the environment rather than the config file, so a Kubernetes Secret can supply them
# (builders/deploy renders the router that way) while the config stays a plain ConfigMap.
KEY_ENVIRONMENT = {"api_key": "FORGE_ROUTER_API_KEY", "upstream_api_key": "FORGE_ROUTER_UPSTREAM_API_KEY"}


async def _run_until_signalled(config_path: str, host: str | None, port: int | None) -> None:
    config = load_config(config_path)
    overrides: dict[str, object] = {
        field: os.environ[variable] for field, variable in KEY_ENVIRONMENT.items() if os.environ.get(variable)
    }
    if host is not None:
        overrides["host"] = host
    if port is not None:
        overrides["port"] = port
    if overrides:
        config = config_from_mapping(
            {**config.model_dump(mode="json"), **overrides}, source=f"{config_path} (and environment)"
        )
    stop, hurry = asyncio.Event(), asyncio.Event()

    def on_signal(sig: signal.Signals) -> None:
        # A container stop sends SIGTERM and, after its own grace, SIGKILL: drain first, and let a second
        # signal (an impatient operator) end the grace at once, still with an error event per stream.
        if stop.is_set():
            print(f"forge router: {sig.name} again: ending the remaining streams now", file=sys.stderr, flush=True)
            hurry.set()
        else:
            print(
                f"forge router: {sig.name}: draining (no new connections; streams get up to {config.drain_grace_s}s)",
                file=sys.stderr,
                flush=True,
            )
            stop.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    await serve(config, stop, hurry)


def event_loop() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop where it is installed (the router image has it), else None: asyncio's own loop.

    The router's CPU per streamed event is mostly event-loop work (bench-router measures it); the
    behaviour is the same on both loops, so a missing uvloop costs CPU, not correctness.
    """
    try:
        import uvloop
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m builders.router",
        description="Run Forge's class-aware router in front of vLLM pools. FORGE_ROUTER_API_KEY and "
        "FORGE_ROUTER_UPSTREAM_API_KEY, where set, replace the config's api_key and upstream_api_key.",
    )
    parser.add_argument("--config", required=True, help="router config file (JSON or YAML)")
    parser.add_argument("--host", default=None, help="override the config's listen address")
    parser.add_argument("--port", type=int, default=None, help="override the config's listen port")
    args = parser.parse_args(argv)
    try:
        with asyncio.Runner(loop_factory=event_loop()) as runner:
            runner.run(_run_until_signalled(args.config, args.host, args.port))
    except ForgeError as exc:
        print(exc.render(), file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
