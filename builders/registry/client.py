"""A small client for the registry HTTP API (distribution spec v2): manifests by tag or digest, blob uploads,
and the credentials the engines themselves read."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import requests

from builders.errors import ForgeError, UsageError
from builders.registry.reference import Reference

DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST_TYPES = (OCI_INDEX, DOCKER_LIST, OCI_MANIFEST, DOCKER_MANIFEST)
TIMEOUT = 60


class Platform(TypedDict, total=False):
    architecture: str
    os: str
    variant: str


class Descriptor(TypedDict, total=False):
    """A content descriptor of the OCI image spec (Docker's distribution spec writes the same keys)."""

    mediaType: str
    digest: str
    size: int
    platform: Platform
    annotations: dict[str, str]
    artifactType: str


class Manifest(TypedDict, total=False):
    """An image manifest, a manifest list or an index, as a registry serves it: the registry's JSON, not Forge's."""

    schemaVersion: int
    mediaType: str
    artifactType: str
    config: Descriptor
    layers: list[Descriptor]
    manifests: list[Descriptor]
    subject: Descriptor
    annotations: dict[str, str]


class RegistryError(ForgeError):
    """The registry refused or failed a request; the message names the request and the registry's answer."""

    # 15 and 16 are the sweep's and the KV lab's, 17 and 18 builders/publish.py's.
    exit_code = 19
    kind = "registry error"


@dataclass(frozen=True, kw_only=True)
class Credentials:
    username: str
    password: str
    origin: str  # the file they came from, for messages (never the secret)


def auth_files() -> list[Path]:
    """Where the engines keep registry logins, in the order Podman and Docker read them."""
    files = []
    if os.environ.get("REGISTRY_AUTH_FILE"):
        files.append(Path(os.environ["REGISTRY_AUTH_FILE"]))
    if os.environ.get("XDG_RUNTIME_DIR"):
        files.append(Path(os.environ["XDG_RUNTIME_DIR"]) / "containers" / "auth.json")
    docker_config = Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker")
    files.append(docker_config / "config.json")
    return files


def credentials_for(host: str, files: list[Path] | None = None) -> Credentials | None:
    """The first login for `host` in the engines' auth files (`docker login` / `podman login` write them)."""
    for path in files if files is not None else auth_files():
        try:
            auths = json.loads(path.read_text()).get("auths") or {}
        except FileNotFoundError:
            continue
        except (OSError, ValueError, AttributeError) as exc:
            raise UsageError(
                f"{path}: not a readable auth file ({exc})", hint="fix or remove it, then log in again"
            ) from exc
        for key, entry in auths.items():
            if re.sub(r"^https?://", "", key).split("/", 1)[0] != host or not isinstance(entry, dict):
                continue
            if entry.get("auth"):
                user, _, password = base64.b64decode(entry["auth"]).decode().partition(":")
                return Credentials(username=user, password=password, origin=str(path))
            if entry.get("username"):
                return Credentials(username=entry["username"], password=entry.get("password", ""), origin=str(path))
    return None


def _challenge(header: str) -> tuple[str, dict[str, str]]:
    scheme, _, rest = header.partition(" ")
    return scheme.lower(), dict(re.findall(r'(\w+)="([^"]*)"', rest))


class RegistryClient:
    """One registry host. TLS always, except for a loopback registry, which is plain HTTP (what
    `docker-registry` and `registry:2` serve by default, and what Docker allows for 127.0.0.0/8)."""

    def __init__(self, ref: Reference, *, credentials: Credentials | None = None) -> None:
        self.host = ref.host
        self.base = f"{ref.scheme}://{ref.host}/v2"
        self.credentials = credentials if credentials is not None else credentials_for(ref.host)
        self.session = requests.Session()
        self.session.verify = True  # never switched off: a non-loopback registry is https with a trusted cert
        self._token: str | None = None

    def _request(self, method: str, url: str, **kwargs: Any) -> requests.Response:
        headers = dict(kwargs.pop("headers", {}))
        for attempt in range(2):
            if self._token:
                headers["Authorization"] = f"Bearer {self._token}"
            elif self.credentials and attempt:
                raw = f"{self.credentials.username}:{self.credentials.password}".encode()
                headers["Authorization"] = "Basic " + base64.b64encode(raw).decode()
            try:
                resp = self.session.request(method, url, headers=headers, timeout=TIMEOUT, **kwargs)
            except requests.exceptions.SSLError as exc:
                raise RegistryError(
                    f"{method} {url}: TLS verification failed ({exc})",
                    hint="give the registry a certificate your CA bundle trusts (REQUESTS_CA_BUNDLE); plain HTTP "
                    "is allowed only for a loopback registry",
                ) from exc
            except requests.RequestException as exc:
                raise RegistryError(
                    f"{method} {url}: registry {self.host} unreachable ({exc})",
                    hint=f"start the registry or check the address {self.host}",
                ) from exc
            if resp.status_code != 401 or attempt:
                return resp
            scheme, params = _challenge(resp.headers.get("WWW-Authenticate", ""))
            if scheme == "bearer" and params.get("realm"):
                self._token = self._fetch_token(params)
            elif scheme != "basic" or not self.credentials:
                return resp
        return resp

    def _fetch_token(self, params: dict[str, str]) -> str:
        query = {k: v for k, v in params.items() if k in {"service", "scope"}}
        auth = (self.credentials.username, self.credentials.password) if self.credentials else None
        try:
            resp = self.session.get(params["realm"], params=query, auth=auth, timeout=TIMEOUT)
        except requests.RequestException as exc:
            raise RegistryError(f"token service {params['realm']} unreachable ({exc})") from exc
        if resp.status_code != 200:
            raise self._refused("GET", params["realm"], resp)
        body = resp.json()
        return str(body.get("token") or body.get("access_token") or "")

    def _refused(self, method: str, url: str, resp: requests.Response) -> RegistryError:
        try:
            errors = resp.json().get("errors") or []
            detail = "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errors) or resp.text[:300]
        except ValueError:
            detail = resp.text[:300]
        if resp.status_code in (401, 403):
            where = (
                f"from {self.credentials.origin}"
                if self.credentials
                else "none found in " + ", ".join(str(p) for p in auth_files())
            )
            hint = f"log in with the engine (`docker login {self.host}`); credentials used: {where}"
        else:
            hint = None
        return RegistryError(f"{method} {url}: HTTP {resp.status_code} {detail}", hint=hint)

    def ping(self) -> int:
        """The status /v2/ answers (200, or 401 where a login is asked for); RegistryError when nothing answers."""
        return self._request("GET", f"{self.base}/").status_code

    # --- manifests ---------------------------------------------------------------------------------------

    def head_manifest(self, name: str, reference: str) -> tuple[str, str, int] | None:
        """(digest, media type, size) the registry serves for a tag or digest; None when it has none."""
        url = f"{self.base}/{name}/manifests/{reference}"
        resp = self._request("HEAD", url, headers={"Accept": ", ".join(MANIFEST_TYPES)})
        if resp.status_code == 404:
            return None
        if resp.status_code != 200:
            raise self._refused("HEAD", url, resp)
        digest = resp.headers.get("Docker-Content-Digest", "")
        if not digest.startswith("sha256:"):
            raise RegistryError(f"HEAD {url}: the registry sent no Docker-Content-Digest header")
        return digest, resp.headers.get("Content-Type", ""), int(resp.headers.get("Content-Length", "0"))

    def get_manifest(self, name: str, reference: str) -> tuple[Manifest, str, str]:
        """(manifest, media type, digest of the bytes as served)."""
        url = f"{self.base}/{name}/manifests/{reference}"
        resp = self._request("GET", url, headers={"Accept": ", ".join(MANIFEST_TYPES)})
        if resp.status_code != 200:
            raise self._refused("GET", url, resp)
        digest = "sha256:" + hashlib.sha256(resp.content).hexdigest()
        return json.loads(resp.content), resp.headers.get("Content-Type", ""), digest

    def put_manifest(self, name: str, tag: str, body: bytes, media_type: str) -> str:
        """Store a manifest under a tag; returns its digest, checked against the bytes sent."""
        url = f"{self.base}/{name}/manifests/{tag}"
        resp = self._request("PUT", url, data=body, headers={"Content-Type": media_type})
        if resp.status_code not in (200, 201):
            raise self._refused("PUT", url, resp)
        sent = "sha256:" + hashlib.sha256(body).hexdigest()
        served = resp.headers.get("Docker-Content-Digest", sent)
        if served != sent:
            raise RegistryError(f"PUT {url}: the registry stored {served}, not the {sent} Forge sent")
        return sent

    # --- blobs -------------------------------------------------------------------------------------------

    def get_blob(self, name: str, digest: str, *, limit: int = 1 << 20) -> bytes | None:
        """A small blob (an image config), checked against its digest; None when it is missing, too large, or
        does not hash to the digest it was asked for."""
        resp = self._request("GET", f"{self.base}/{name}/blobs/{digest}", stream=True)
        if resp.status_code != 200:
            return None
        data = resp.raw.read(limit + 1, decode_content=True)
        if len(data) > limit or "sha256:" + hashlib.sha256(data).hexdigest() != digest:
            return None
        return bytes(data)

    def put_blob(self, name: str, data: bytes) -> str:
        """Upload one blob (monolithic: POST a session, PUT the bytes); a blob already there is not re-sent."""
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        head = self._request("HEAD", f"{self.base}/{name}/blobs/{digest}")
        if head.status_code == 200:
            return digest
        url = f"{self.base}/{name}/blobs/uploads/"
        start = self._request("POST", url)
        if start.status_code != 202 or "Location" not in start.headers:
            raise self._refused("POST", url, start)
        location = start.headers["Location"]
        if location.startswith("/"):
            location = self.base.removesuffix("/v2") + location
        sep = "&" if "?" in location else "?"
        done = self._request(
            "PUT",
            f"{location}{sep}digest={digest}",
            data=data,
            headers={"Content-Type": "application/octet-stream"},
        )
        if done.status_code != 201:
            raise self._refused("PUT", location.split("?")[0], done)
        return digest
