"""Podman as an engine, without an engine: names, facts read from `podman info`, start failures explained,
the engine choice. The `podman info` files are this machine's own (Debian 12, podman 4.3.1), rootful and
rootless."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from builders.container.base import OWNER_LABEL, RunSpec
from builders.container.podman_engine import PodmanEngine, explain_start_failure, facts_from_info, qualify
from builders.container.select import chosen, docker_cli_is_podman
from builders.diagnose import diagnose_file
from builders.errors import EngineError, UsageError

FIXTURES = Path(__file__).parent / "fixtures"
LOGS = Path(__file__).resolve().parents[1] / "logs"


def _info(name: str) -> dict[str, object]:
    info: dict[str, object] = json.loads((FIXTURES / f"podman-info-{name}-debian12.json").read_text())
    return info


@pytest.mark.parametrize(
    ("ref", "stored"),
    [
        ("forge/base:debian-12", "localhost/forge/base:debian-12"),
        ("forge/debian-12-router:latest", "localhost/forge/debian-12-router:latest"),
        ("localhost/forge/base:debian-12", "localhost/forge/base:debian-12"),
        ("debian:12", "docker.io/library/debian:12"),
        ("nvidia/cuda:12.8.1-runtime-ubuntu24.04", "docker.io/nvidia/cuda:12.8.1-runtime-ubuntu24.04"),
        ("registry.fedoraproject.org/fedora:44", "registry.fedoraproject.org/fedora:44"),
        ("localhost:5000/forge/router:1", "localhost:5000/forge/router:1"),
        ("sha256:" + "ab" * 32, "sha256:" + "ab" * 32),
        ("3cd85f8eb6e5", "3cd85f8eb6e5"),
    ],
)
def test_every_name_is_stored_fully_qualified(ref: str, stored: str) -> None:
    assert qualify(ref) == stored


def test_rootful_facts_come_from_podman_info() -> None:
    facts = facts_from_info(_info("rootful"))
    assert (facts.kind, facts.version, facts.rootless) == ("podman", "4.3.1", False)
    assert facts.root_dir == "/var/lib/containers/storage"
    assert facts.runtime == "runc" and facts.cgroups == "v1 cgroupfs"
    assert facts.builder_version == "1.28.2"
    # buildah 1.28 has secret and cache mounts; rootful Podman on v1 confines containers to cpusets.
    assert facts.capabilities == {"secrets": True, "cache_mounts": True, "cpuset": True, "subids": True}
    assert facts.describe() == "podman 4.3.1 (rootful, runc, cgroups v1 cgroupfs)"


def test_rootless_facts_name_the_users_storage_and_no_cpuset_on_cgroups_v1() -> None:
    facts = facts_from_info(_info("rootless"))
    assert facts.rootless is True
    assert facts.root_dir is not None and facts.root_dir.endswith("/.local/share/containers/storage")
    assert facts.capabilities["cpuset"] is False
    assert "rootless" in facts.describe()


def test_an_old_buildah_gets_the_template_without_mounts() -> None:
    info = _info("rootful")
    host = info["host"]
    assert isinstance(host, dict)
    host["buildahVersion"] = "1.22.3"
    facts = facts_from_info(info)
    assert facts.capabilities["secrets"] is False and facts.capabilities["cache_mounts"] is False


@pytest.mark.parametrize(
    ("log", "reason", "remedy"),
    [
        ("rlimit-denied--podman-build-nproc-above-hard-limit-captured.log", "rlimits", "default_ulimits"),
        ("crun-cgroups-hybrid--podman-build-hybrid-cgroups-captured.log", "crun", 'runtime = "runc"'),
    ],
)
def test_a_refused_start_names_reason_and_remedy(log: str, reason: str, remedy: str) -> None:
    text = (LOGS / log).read_text()
    got_reason, got_remedy = explain_start_failure(text)
    assert reason in got_reason and remedy in got_remedy
    # The same log, read by diagnosis, names the same cause.
    assert diagnose_file(LOGS / log).category == log.split("--")[0]


def test_a_missing_subuid_range_is_named(tmp_path: Path) -> None:
    # Podman 4.3 as user nobody (no /etc/subuid line) loading Debian 12's base, on this machine.
    reason, remedy = explain_start_failure(
        "ApplyLayer stdout:  stderr: potentially insufficient UIDs or GIDs available in user namespace (requested "
        "0:42 for /etc/gshadow): Check /etc/subuid and /etc/subgid if configured locally and run "
        "podman-system-migrate: lchown /etc/gshadow: invalid argument exit status 1"
    )
    assert "subordinate UID/GID" in reason and "--add-subuids" in remedy
    # Rootless with one UID mapped (what Podman does without a range) is said at once, not at the first load.
    info = _info("rootless")
    host = info["host"]
    assert isinstance(host, dict)
    assert facts_from_info(info).capabilities["subids"] is True
    host["idMappings"] = {"uidmap": [{"container_id": 0, "host_id": 65534, "size": 1}], "gidmap": []}
    assert facts_from_info(info).capabilities["subids"] is False


def test_an_unknown_engine_choice_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORGE_ENGINE", "containerd")
    with pytest.raises(UsageError, match="FORGE_ENGINE='containerd'"):
        chosen()
    assert chosen("podman") == "podman"
    monkeypatch.setenv("FORGE_ENGINE", "Podman")
    assert chosen() == "podman"


def test_a_docker_that_is_podman_is_told_apart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Fedora's podman-docker: /usr/bin/docker is a script that runs podman; its --version says podman.
    fake = tmp_path / "docker"
    fake.write_text('#!/bin/sh\necho "podman version 5.4.0"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    assert docker_cli_is_podman() is True
    fake.write_text('#!/bin/sh\necho "Docker version 20.10.24+dfsg1, build 297e128"\n')
    assert docker_cli_is_podman() is False


def test_a_run_spec_becomes_podmans_run_arguments() -> None:
    engine = PodmanEngine("podman", facts=facts_from_info(_info("rootful")))
    spec = RunSpec(
        image="forge/debian-12-vllm-cpu:latest",
        command=["--port", "8000"],
        name="pool-0",
        env={"HF_HUB_OFFLINE": "1"},
        volumes={"/srv/model": "/model", "/tmp/out": "/out:rw"},
        labels={"forge.run": "r1"},
        entrypoint=["vllm", "serve"],
        gpus=True,
        cpuset_cpus="0-1",
    )
    args = engine._run_args(spec)
    assert args[:2] == ["--name", "pool-0"]
    labels = [args[i + 1] for i, arg in enumerate(args) if arg == "--label"]
    assert labels == [f"{OWNER_LABEL}=forge", "forge.run=r1"]
    assert "--volume" in args and "/srv/model:/model:ro" in args and "/tmp/out:/out:rw" in args
    assert args[args.index("--entrypoint") + 1] == '["vllm", "serve"]'
    assert "nvidia.com/gpu=all" in args and args[args.index("--cpuset-cpus") + 1] == "0-1"
    assert args[-3:] == ["localhost/forge/debian-12-vllm-cpu:latest", "--port", "8000"]


def test_a_throwaway_run_is_named_and_labelled_so_it_can_be_removed() -> None:
    spec = RunSpec(image="debian:12", command=["true"], labels={"forge.test": "s1"}).throwaway()
    assert spec.name is not None and spec.name.startswith("forge-")
    assert spec.all_labels() == {OWNER_LABEL: "forge", "forge.test": "s1", "forge.throwaway": "1"}


def test_cpus_are_not_confined_where_rootless_podman_cannot() -> None:
    engine = PodmanEngine("podman", facts=facts_from_info(_info("rootless")))
    with pytest.raises(EngineError, match="cpuset controller is not delegated"):
        engine._run_args(RunSpec(image="debian:12", command=["true"], name="x", cpuset_cpus="0"))
