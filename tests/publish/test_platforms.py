"""Platforms resolve once into Distro variants; references and credentials parse as the engines write them."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from builders.distros import family_for
from builders.engines import make_plan
from builders.engines.vllm.arm_gates import arm_gates
from builders.engines.vllm.source_facts import read_source_files
from builders.errors import ConfigError, UsageError
from builders.gates.findings import Finding
from builders.plan import PlanOptions
from builders.platforms import PLATFORMS, for_platform, parse_platforms
from builders.project import Project
from builders.publish import sbom_tag
from builders.registry import parse_reference
from builders.registry.client import credentials_for

ARM64 = PLATFORMS["linux/arm64"]


def test_platforms_parse_in_order_once_each_and_name_the_choices_when_unknown() -> None:
    assert [p.name for p in parse_platforms("linux/arm64, linux/amd64,linux/arm64")] == ["linux/arm64", "linux/amd64"]
    assert [p.name for p in parse_platforms(None)] == ["linux/amd64"]
    with pytest.raises(UsageError, match="unknown platform linux/ppc64le") as err:
        parse_platforms("linux/amd64,linux/ppc64le")
    assert "linux/arm64" in (err.value.hint or "")


def test_an_arm64_distro_has_its_own_base_tag_arch_and_library_paths(project: Project) -> None:
    amd64 = project.distro("debian-12")
    arm64 = for_platform(amd64, ARM64)
    assert (arm64.arch, arm64.base.local_tag) == ("aarch64", "forge/base:debian-12-arm64")
    assert arm64.tcmalloc_path == "/usr/lib/aarch64-linux-gnu/libtcmalloc_minimal.so.4"
    assert "--arch=arm64" in family_for(arm64).bootstrap_command("/x.tar")
    assert "--arch=amd64" in family_for(amd64).bootstrap_command("/x.tar")
    plan = make_plan(arm64, project.recipe_for("router"), PlanOptions(max_jobs=1))
    assert plan.platform == "linux/arm64"
    assert plan.image_tag.startswith("forge/debian-12-router-arm64:")
    assert plan.labels["dev.forge.platform"] == "linux/arm64"
    assert plan.build_args["BASE_IMAGE"] == "forge/base:debian-12-arm64"


def test_a_platform_the_distro_file_does_not_list_is_refused_naming_the_key(project: Project) -> None:
    with pytest.raises(ConfigError, match=r"distros/debian-13.yaml: base.bootstrap.arches"):
        for_platform(project.distro("debian-13"), ARM64)


@pytest.mark.parametrize(
    ("text", "scheme", "name", "tag"),
    [
        ("127.0.0.1:5000/forge/debian-12-router:ci", "http", "forge/debian-12-router", "ci"),
        ("localhost/forge/x", "http", "forge/x", None),
        ("[::1]:5000/forge/x:1", "http", "forge/x", "1"),
        ("registry.example.com/team/forge:1.0", "https", "team/forge", "1.0"),
        # A non-loopback address is TLS even when it is this machine's LAN address.
        ("10.0.0.5:5000/forge/x", "https", "forge/x", None),
    ],
)
def test_references_parse_and_only_loopback_is_plain_http(text: str, scheme: str, name: str, tag: str | None) -> None:
    ref = parse_reference(text)
    assert (ref.scheme, ref.name, ref.tag) == (scheme, name, tag)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("forge/debian-12-router:ci", "names no registry host"),
        ("127.0.0.1:5000/Forge/X", "not a repository name"),
        ("127.0.0.1:5000/forge/x@sha256:abc", "not a sha256 digest"),
    ],
)
def test_bad_references_say_what_is_wrong(text: str, problem: str) -> None:
    with pytest.raises(UsageError, match=problem):
        parse_reference(text)


def test_a_digest_reference_keeps_its_digest() -> None:
    digest = "sha256:" + "ab" * 32
    ref = parse_reference(f"127.0.0.1:5000/forge/x@{digest}")
    assert (ref.digest, str(ref)) == (digest, f"127.0.0.1:5000/forge/x@{digest}")
    assert sbom_tag(digest) == "sha256-" + "ab" * 32 + ".sbom"


def test_credentials_come_from_the_engines_auth_files(tmp_path: Path) -> None:
    docker = tmp_path / "config.json"
    docker.write_text(
        json.dumps({"auths": {"https://registry.example.com/v1/": {"auth": base64.b64encode(b"ci:s3cret").decode()}}})
    )
    podman = tmp_path / "auth.json"
    podman.write_text(json.dumps({"auths": {"quay.example.org": {"username": "bot", "password": "pw"}}}))
    found = credentials_for("registry.example.com", [podman, docker])
    assert found is not None and (found.username, found.password, found.origin) == ("ci", "s3cret", str(docker))
    other = credentials_for("quay.example.org", [podman, docker])
    assert other is not None and (other.username, other.origin) == ("bot", str(podman))
    assert credentials_for("127.0.0.1:5000", [podman, docker]) is None
    docker.write_text("{not json")
    with pytest.raises(UsageError, match="not a readable auth file"):
        credentials_for("registry.example.com", [docker])


def test_the_bootstrap_arches_default_to_the_host_only(project: Project) -> None:
    boot = project.distro("debian-13").base.bootstrap
    assert boot is not None and boot.arches == ("x86_64",)


FIXTURE = Path(__file__).parents[1] / "preflight" / "fixtures" / "vllm-0.33.0"
X86_CPUINFO = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16\n"
ARM_CPUINFO = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes crc32 asimddp\n"


def _arm(files: dict[str, str], env: dict[str, str], cpuinfo: str, host: str) -> dict[str, Finding]:
    return {f.gate: f for f in arm_gates(files, compile_env=env, host_cpuinfo=cpuinfo, host_arch=host)}


def test_arm64_source_builds_under_emulation_are_blocked_by_vllms_asimd_gate(project: Project) -> None:
    files = read_source_files(FIXTURE)
    arm64 = for_platform(project.distro("debian-12"), ARM64)
    plan = make_plan(arm64, project.recipe_for("cpu"), PlanOptions(max_jobs=1, torch_version="2.14.0"))
    # The x86 switch would force vLLM's x86 branch on arm64; BF16 is stated, never left to the host's cpuinfo.
    assert "VLLM_CPU_X86" not in plan.compile_env
    assert plan.compile_env["VLLM_CPU_ARM_BF16"] == "0"
    emulated = _arm(files, plan.compile_env, X86_CPUINFO, "x86_64")
    assert emulated["arm-asimd"].blocking
    assert emulated["arm-asimd"].source.startswith("vLLM cmake/cpu_extension.cmake:106")
    # An x86 host's avx512_bf16 contains "bf16": vLLM's substring search would turn Arm BF16 on.
    assert not emulated["arm-bf16"].passed and "avx512_bf16" in emulated["arm-bf16"].found
    native = _arm(files, plan.compile_env, ARM_CPUINFO, "aarch64")
    assert native["arm-asimd"].passed and native["arm-bf16"].passed
    unset = _arm(files, {}, ARM_CPUINFO, "aarch64")
    assert unset["arm-bf16"].blocking
    missing = _arm({}, plan.compile_env, ARM_CPUINFO, "aarch64")
    assert all(not f.evaluated for f in missing.values())
