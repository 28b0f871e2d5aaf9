"""Image references as a registry reads them: HOST[:PORT]/NAME[:TAG][@sha256:HEX]."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, replace

from builders.errors import UsageError

# The distribution spec's grammar, trimmed to what a push target needs: lower-case path components.
NAME = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*")
TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


@dataclass(frozen=True, kw_only=True)
class Reference:
    host: str  # registry host[:port]
    name: str  # repository path inside it
    tag: str | None = None
    digest: str | None = None

    @property
    def repository(self) -> str:
        return f"{self.host}/{self.name}"

    @property
    def loopback(self) -> bool:
        """Plain HTTP is allowed for these only: traffic that never leaves the machine."""
        host = self.host.rsplit(":", 1)[0] if not self.host.startswith("[") else self.host[1:].split("]")[0]
        if host == "localhost":
            return True
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False

    @property
    def scheme(self) -> str:
        return "http" if self.loopback else "https"

    def with_tag(self, tag: str) -> Reference:
        return replace(self, tag=tag, digest=None)

    def with_digest(self, digest: str) -> Reference:
        return replace(self, tag=None, digest=digest)

    def __str__(self) -> str:
        if self.digest:
            return f"{self.repository}@{self.digest}"
        return f"{self.repository}:{self.tag or 'latest'}"


def parse_reference(text: str, *, what: str = "reference") -> Reference:
    """A reference that names its registry host (a push target must: Docker Hub is never assumed)."""
    rest, _, digest = text.partition("@")
    first, sep, path = rest.partition("/")
    if not sep or not ("." in first or ":" in first or first == "localhost"):
        raise UsageError(
            f"{what} {text!r} names no registry host",
            hint="write it as HOST[:PORT]/NAME[:TAG], e.g. 127.0.0.1:5000/forge/debian-12-router:latest",
        )
    tag: str | None = None
    last = path.rsplit("/", 1)[-1]
    if ":" in last:
        path, _, tag = path.rpartition(":")
    if not NAME.fullmatch(path):
        raise UsageError(f"{what} {text!r}: {path!r} is not a repository name (lower-case a-z 0-9 . _ - /)")
    if tag is not None and not TAG.fullmatch(tag):
        raise UsageError(f"{what} {text!r}: {tag!r} is not a tag")
    if digest and not DIGEST.fullmatch(digest):
        raise UsageError(f"{what} {text!r}: {digest!r} is not a sha256 digest (sha256: and 64 hex digits)")
    return Reference(host=first, name=path, tag=tag, digest=digest or None)
