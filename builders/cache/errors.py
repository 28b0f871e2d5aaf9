"""The two ways a cache stops a build: credentials a backend refused (always, before any compile: the user
named a cache that cannot work), and any cache failure under --require-cache."""

from __future__ import annotations

from builders.errors import ForgeError


class CacheCredentialsRejected(ForgeError):
    """A cache backend answered and refused the credentials it was given."""

    # 20 is GpuUnsupported's (builders/errors.py); 21 and 22 are the caches'.
    exit_code = 21
    kind = "cache credentials rejected"


class CacheRequired(ForgeError):
    """--require-cache (FORGE_REQUIRE_CACHE=1): a cache failed, and the pipeline asked for that to be an error."""

    exit_code = 22
    kind = "cache required"
