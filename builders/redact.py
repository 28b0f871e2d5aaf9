"""Secrets never printed: a URL's user-info (`https://user:password@host/`) is masked wherever Forge shows a URL.

A URL is handed on whole to whatever connects with it (requests sends its user-info as basic auth); what reaches a
terminal, a log, a report or an error message goes through `mask_url` or `mask_urls` first. CI logs are kept and
read by many.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

MASK = "***"

# scheme://authority: the authority ends at '/', '?', '#', a blank or a quote; its user-info is everything up to
# its last '@', so a password with a raw '@' in it is masked whole.
_AUTHORITY = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<authority>[^/?#\s'\"<>]*@[^/?#\s'\"<>]*)")


def _masked(match: re.Match[str]) -> str:
    host = match["authority"].rpartition("@")[2]
    return f"{match['scheme']}{MASK}@{host}"


def mask_urls(text: str) -> str:
    """Text with the user-info of every URL in it replaced by ***."""
    if "@" not in text or "://" not in text:
        return text
    return _AUTHORITY.sub(_masked, text)


def mask_url(url: str) -> str:
    """One URL with its user-info masked (also a URL urlsplit cannot parse: it is masked as text)."""
    return mask_urls(url)


def has_userinfo(url: str) -> bool:
    try:
        parts = urlsplit(url)
    except ValueError:
        return bool(_AUTHORITY.search(url))
    return parts.username is not None or parts.password is not None
