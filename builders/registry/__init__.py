"""Registries through their HTTP API (the OCI distribution spec): references, credentials, manifests, blobs.

Engine-independent on purpose: the engine pushes an image's layers and manifest (it holds them), and everything
after that (verifying the digest, the SBOM beside the image, the multi-platform index) is plain HTTP here, so a
second engine adds only its own `push`.
"""

from builders.registry.client import RegistryClient
from builders.registry.reference import Reference, parse_reference

__all__ = ["Reference", "RegistryClient", "parse_reference"]
