"""Before any compile: does the compiler cache's backend answer, and does it take the credentials? Three answers,
each with what it means for the build (phase.py): `ok`; `unreachable` (a warning, the build goes on without the
shared cache); `rejected` (an error naming the backend: the user named a cache that cannot work, and finding out
after an hour's compile would be worse). A probe never waits more than a few seconds.

Redis is asked in its own protocol (AUTH, then PING); WebDAV with an authenticated PROPFIND. S3 and the GitHub
Actions cache are asked whether their endpoint answers at all: signing an S3 request or speaking GitHub's cache
protocol is sccache's business, and a refusal there surfaces as cache write errors, which the compile step
reports as a fallback (containers/scripts/compiler_cache.py).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

import requests

from builders.cache.settings import CompilerCache

Verdict = Literal["ok", "unreachable", "rejected", "unchecked"]
TIMEOUT = 3.0


@dataclass(frozen=True, kw_only=True)
class Probe:
    verdict: Verdict
    detail: str  # never a credential: messages are built from the endpoint and the server's own words


def _resp(sock: socket.socket, *words: str) -> str:
    """One Redis command as a RESP array; the first line of the answer."""
    payload = f"*{len(words)}\r\n" + "".join(f"${len(w.encode())}\r\n{w}\r\n" for w in words)
    sock.sendall(payload.encode())
    answer = b""
    while not answer.endswith(b"\r\n"):
        chunk = sock.recv(512)
        if not chunk:
            break
        answer += chunk
        if len(answer) > 4096:
            break
    return answer.decode(errors="replace").strip()


def probe_redis(cache: CompilerCache) -> Probe:
    parts = urlsplit(cache.settings["SCCACHE_REDIS_ENDPOINT"])
    host, port = parts.hostname or "127.0.0.1", parts.port or 6379
    if parts.scheme == "rediss":
        # TLS to Redis: a plain TCP connect says whether it is there; the handshake and AUTH are sccache's.
        try:
            socket.create_connection((host, port), timeout=TIMEOUT).close()
        except OSError as exc:
            return Probe(verdict="unreachable", detail=f"{cache.endpoint}: {exc.strerror or exc}")
        return Probe(verdict="unchecked", detail=f"{cache.endpoint}: answers (TLS: credentials not checked here)")
    try:
        with socket.create_connection((host, port), timeout=TIMEOUT) as sock:
            sock.settimeout(TIMEOUT)
            password = cache.secrets.get("SCCACHE_REDIS_PASSWORD")
            if password:
                user = cache.secrets.get("SCCACHE_REDIS_USERNAME")
                answer = _resp(sock, "AUTH", *([user] if user else []), password)
                if not answer.startswith("+OK"):
                    return Probe(verdict="rejected", detail=f"{cache.endpoint}: AUTH answered {answer[:120]!r}")
            answer = _resp(sock, "PING")
    except OSError as exc:
        return Probe(verdict="unreachable", detail=f"{cache.endpoint}: {exc.strerror or exc}")
    if answer.startswith("+PONG"):
        return Probe(verdict="ok", detail=f"{cache.endpoint}: answers")
    if "NOAUTH" in answer or "WRONGPASS" in answer or "invalid password" in answer:
        return Probe(verdict="rejected", detail=f"{cache.endpoint}: {answer[:120]!r}")
    return Probe(verdict="unreachable", detail=f"{cache.endpoint}: PING answered {answer[:120]!r}")


def _http(url: str, method: str = "HEAD", auth: tuple[str, str] | None = None, token: str | None = None) -> Probe:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if method == "PROPFIND":
        headers["Depth"] = "0"
    try:
        resp = requests.request(method, url, auth=auth, headers=headers, timeout=TIMEOUT, allow_redirects=False)
    except requests.RequestException as exc:
        return Probe(verdict="unreachable", detail=f"{url}: {type(exc).__name__}")
    if resp.status_code in (401, 403) and (auth or token):
        return Probe(verdict="rejected", detail=f"{url}: HTTP {resp.status_code}")
    if resp.status_code >= 500:
        return Probe(verdict="unreachable", detail=f"{url}: HTTP {resp.status_code}")
    return Probe(verdict="ok" if (auth or token) else "unchecked", detail=f"{url}: HTTP {resp.status_code}")


def probe(cache: CompilerCache) -> Probe:
    if not cache.shared:
        return Probe(verdict="ok", detail="local")
    if cache.backend == "redis":
        return probe_redis(cache)
    if cache.backend == "webdav":
        user, password = cache.secrets.get("SCCACHE_WEBDAV_USERNAME"), cache.secrets.get("SCCACHE_WEBDAV_PASSWORD")
        return _http(
            cache.settings["SCCACHE_WEBDAV_ENDPOINT"],
            "PROPFIND",
            auth=(user or "", password) if password else None,
            token=cache.secrets.get("SCCACHE_WEBDAV_TOKEN"),
        )
    if cache.backend == "s3":
        host = cache.settings.get("SCCACHE_ENDPOINT") or f"s3.{cache.settings['SCCACHE_REGION']}.amazonaws.com"
        scheme = "http" if cache.settings.get("SCCACHE_S3_USE_SSL") == "false" else "https"
        found = _http(f"{scheme}://{host}/")
        return found if found.verdict == "unreachable" else Probe(verdict="unchecked", detail=found.detail)
    url = cache.secrets.get("ACTIONS_RESULTS_URL") or cache.secrets.get("ACTIONS_CACHE_URL") or ""
    found = _http(url)
    # The service's URL is GitHub's to tell, and not a secret, but it is only meaningful inside the job.
    return found if found.verdict == "unreachable" else Probe(verdict="unchecked", detail="GitHub Actions cache")
