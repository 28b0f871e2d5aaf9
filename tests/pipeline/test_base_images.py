"""Images a build starts from that Forge does not bootstrap (the CUDA bases): local, else pulled, else a stop
within seconds that names the registry."""

from __future__ import annotations

import time

import pytest

from builders.bootstrap import ensure_base, ensure_image, registry_of
from builders.container import Engine
from builders.errors import BaseUnavailable
from builders.project import Project


@pytest.mark.parametrize(
    ("ref", "registry"),
    [
        ("docker.io/nvidia/cuda:13.0.3-devel-ubi9", "docker.io"),
        ("nvidia/cuda:13.0.3-runtime-ubuntu24.04", "docker.io"),
        ("registry.fedoraproject.org/fedora:44", "registry.fedoraproject.org"),
        ("localhost:5000/cuda@sha256:" + "0" * 64, "localhost:5000"),
        ("forge/base:fedora-44", "docker.io"),
    ],
)
def test_registry_of(ref: str, registry: str) -> None:
    assert registry_of(ref) == registry


@pytest.mark.engine
def test_a_local_image_is_used_as_it_is(project: Project, engine: Engine) -> None:
    # Debian 12's base, bootstrapped first when missing: a skip when it was not loaded made this test's running
    # depend on the order of the suite.
    ref = ensure_base(project.distro("debian-12"), engine).ref
    got = ensure_image(engine, ref)
    assert got.how == "local" and got.ref == ref and got.image_id == engine.image_info(ref).id


@pytest.mark.engine
def test_a_cuda_base_that_cannot_be_pulled_stops_at_once_naming_its_registry(project: Project, engine: Engine) -> None:
    ubi9 = project.distro("ubi-9")
    assert ubi9.cuda is not None
    # NVIDIA's repository under a tag it never published: refused where Docker Hub answers, unreachable here,
    # and never a multi-GB download in a test.
    ref = ubi9.cuda.runtime_image.rsplit(":", 1)[0] + ":0.0-forge-never-published"
    start = time.monotonic()
    with pytest.raises(BaseUnavailable) as exc:
        ensure_image(engine, ref)
    assert ref in exc.value.message and "registry docker.io unreachable or refused" in exc.value.message
    assert exc.value.hint is not None and "docker load" in exc.value.hint
    assert time.monotonic() - start < 60
    with pytest.raises(BaseUnavailable, match="pull disabled"):
        ensure_image(engine, ref, allow_pull=False)
