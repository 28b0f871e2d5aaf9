"""Linux cpuset lists ('0-3,6'), as profiles, `--cpuset-cpus`, CPU affinity and the serving engines spell them.

Its own module because profiles, the runtimes and every serving engine read them, and none of those should
import another for it.
"""

from __future__ import annotations

import re
import typing


def parse_cpuset(text: str) -> frozenset[int]:
    """The CPUs of a Linux cpuset list ('0-3,6'), or ValueError saying what is wrong with it."""
    cpus: set[int] = set()
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if match is None:
            raise ValueError(f"{text!r} is not a CPU list like '0', '0-3' or '0,2'")
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) is not None else low
        if high < low:
            raise ValueError(f"{text!r}: range {low}-{high} runs backwards")
        cpus.update(range(low, high + 1))
    return frozenset(cpus)


def format_cpuset(cpus: typing.Iterable[int]) -> str:
    """The shortest cpuset list naming `cpus` ({0, 1, 2, 5} -> '0-2,5')."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    start = prev = None
    for cpu in [*ordered, None]:
        if cpu is not None and prev is not None and cpu == prev + 1:
            prev = cpu
            continue
        if start is not None and prev is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = cpu
    return ",".join(parts)
