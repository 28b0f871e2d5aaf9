# Types of the C extension builders/router/_fastrelay.c.
import asyncio

class Relay(asyncio.Protocol):
    enabled: bool
    @property
    def relayed(self) -> int: ...
    def __init__(
        self,
        *,
        connection: asyncio.Protocol,
        owner: object,
        call: object,
        events: object,
        transport: asyncio.Transport,
        itl: object,
        router: object,
        write_low: int,
    ) -> None: ...
    def detach(self) -> None: ...
