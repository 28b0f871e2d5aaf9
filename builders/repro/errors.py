"""Errors of the reproducibility checks: each names what differs and how to act on it."""

from __future__ import annotations

from builders.errors import ForgeError


class LockDrift(ForgeError):
    """`forge build --locked`: what the build would consume differs from forge.lock."""

    exit_code = 10
    kind = "lock drift"


class NotReproducible(ForgeError):
    """`forge verify-repro`: two builds of the same inputs gave images whose contents differ."""

    exit_code = 11
    kind = "not reproducible"


class StaleRender(ForgeError):
    """`forge ci --check`: the committed workflow is not what the project renders now."""

    exit_code = 12
    kind = "stale rendered file"


class InsufficientSpace(ForgeError):
    """`forge verify-repro`: the engine's disk cannot hold a second build and the export of both images."""

    exit_code = 13
    kind = "not enough space"
