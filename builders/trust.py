"""The extra CA bundle a build needs where the network intercepts TLS.

Found from an explicit path, else from the variables pip, requests and OpenSSL read on the host. The bundle
is handed to the build as a secret (BuildKit) or to build stages only (legacy): never to the final image.
"""

from __future__ import annotations

import os
from pathlib import Path

from builders.errors import UsageError

HOST_VARIABLES = ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE")


def find_ca_bundle(explicit: str | None = None, *, environ: dict[str, str] | None = None) -> tuple[Path | None, str]:
    """(bundle, where it came from); (None, reason) when there is none to pass."""
    env = os.environ if environ is None else environ
    if explicit is not None:
        if explicit in {"", "none"}:
            return None, "disabled by --ca-bundle none"
        path = Path(explicit)
        if not path.is_file():
            raise UsageError(f"--ca-bundle {explicit}: no such file", hint="give a PEM bundle, or `none`")
        return path, "--ca-bundle"
    for var in HOST_VARIABLES:
        value = env.get(var)
        if value and Path(value).is_file():
            return Path(value), f"${var}"
    return None, f"none of {', '.join(HOST_VARIABLES)} names a file"
