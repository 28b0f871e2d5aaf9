"""`forge deploy render` of a GPU image: pools request their GPUs, tolerate the GPU taint, size /dev/shm for NCCL and
keep to nodes whose GPU Feature Discovery labels the image can run on, strict-valid for Kubernetes 1.30 and 1.37;
and a CPU image's objects are what they were, GPU fields apart."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from builders.cli import main
from builders.cuda_driver import CudaVersion, DriverVersion, check_driver
from builders.deploy.command import load_dir
from builders.deploy.manifests import (
    NCCL_SHM_MIB_PER_GPU,
    DeployOptions,
    GpuPlacement,
    Network,
    gpu_node_terms,
    render,
)
from builders.gpu_archs import Arch, Capability, LibraryArchs, declared_library, parse_listing
from builders.preflight.gpu_gate import Gpu, judge
from builders.smoke.profile import load_profile

ROOT = Path(__file__).resolve().parents[2]
VERSIONS = ("1.30.0", "1.37.0")
DIGEST = "registry.example/forge/vllm-gpu@sha256:" + "c" * 64
ROUTER = "registry.example/forge/router@sha256:" + "d" * 64
GPU_DATA = ROOT / "tests" / "gpu" / "data" / "cuobjdump" / "vllm-0.33.0"


def wheel_libraries() -> list[LibraryArchs]:
    """cuobjdump's recorded listings of vLLM 0.33.0's CUDA wheel (tests/gpu/data/cuobjdump)."""
    libs = []
    for elf in sorted(GPU_DATA.glob("*.elf.txt")):
        stem = elf.name.removesuffix(".elf.txt")
        ptx = GPU_DATA / f"{stem}.ptx.txt"
        libs.append(
            LibraryArchs(
                library=stem,
                sass=parse_listing(elf.read_text(), "sass", where=str(elf)),
                ptx=parse_listing(ptx.read_text(), "ptx", where=str(ptx)),
            )
        )
    return libs


@pytest.fixture
def report(tmp_path: Path) -> str:
    path = tmp_path / "report.json"
    archs = {lib.library: lib.to_json() for lib in wheel_libraries()}
    path.write_text(json.dumps({"cuda_archs": archs, "cuda_runtime": "13.0"}))
    return str(path)


def rendered(tmp_path: Path, profile: str, *extra: str) -> list[dict[str, Any]]:
    out = tmp_path / Path(profile).stem
    argv = ["--root", str(ROOT), "deploy", "render", "--profile", profile, "--image", DIGEST, "-o", str(out)]
    assert main([*argv, "--router-image", ROUTER, *extra]) == 0
    return load_dir(out)


def pool_pods(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        o["metadata"]["labels"]["forge/pool"]: o["spec"]["template"]["spec"]
        for o in objects
        if o["kind"] == "Deployment" and "forge/pool" in o["metadata"]["labels"]
    }


@pytest.mark.parametrize("profile", ["split", "ci"])
def test_gpu_pools_request_gpus_and_stay_strict_valid(tmp_path: Path, profile: str, report: str) -> None:
    objects = rendered(tmp_path, profile, "--image-archs", report)
    for version in VERSIONS:
        for obj in objects:
            kubernetes_validate.validate(obj, version, strict=True)
    pods = pool_pods(objects)
    assert pods, "no pool rendered"
    for pod in pods.values():
        resources = pod["containers"][0]["resources"]
        assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"] == "1"
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
        terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert terms and all(t["matchExpressions"] for t in terms)
    router = next(o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-router"))
    assert "tolerations" not in router["spec"]["template"]["spec"], "the router needs no GPU"


def test_gpus_follow_tensor_parallel_or_the_flag(tmp_path: Path, report: str) -> None:
    profile = yaml.safe_load((ROOT / "profiles" / "ci.yaml").read_text())
    profile["pools"]["bulk"]["extra_args"] = ["--tensor-parallel-size", "2"]
    path = tmp_path / "tp.yaml"
    path.write_text(json.dumps(profile))
    pods = pool_pods(rendered(tmp_path, str(path), "--image-archs", report))
    assert pods["bulk"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert pods["interactive"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    pods = pool_pods(rendered(tmp_path / "flag", str(path), "--image-archs", report, "--gpus", "4"))
    assert {p["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] for p in pods.values()} == {"4"}


def _strip_gpu(objects: list[dict[str, Any]], gpus: dict[str, int]) -> list[dict[str, Any]]:
    """A GPU render with what _on_gpus and the NCCL share added taken out again."""
    out = copy.deepcopy(objects)
    for obj in out:
        if obj["kind"] == "Secret":
            obj["stringData"] = {}
        pool = obj["metadata"]["labels"].get("forge/pool")
        if obj["kind"] != "Deployment" or pool is None:
            continue
        pod = obj["spec"]["template"]["spec"]
        pod.pop("tolerations")
        pod.pop("affinity")
        extra = gpus[pool] * NCCL_SHM_MIB_PER_GPU
        resources = pod["containers"][0]["resources"]
        for key in ("requests", "limits"):
            assert resources[key].pop("nvidia.com/gpu") == str(gpus[pool])
            resources[key]["memory"] = f"{int(resources[key]['memory'].removesuffix('Mi')) - extra}Mi"
        shm = next(v for v in pod["volumes"] if v["name"] == "dshm")["emptyDir"]
        shm["sizeLimit"] = f"{int(shm['sizeLimit'].removesuffix('Mi')) - extra}Mi"
    return out


@pytest.mark.parametrize("network", ["cluster", "host"])
def test_a_cpu_render_is_the_gpu_render_without_its_gpu_fields(network: Network) -> None:
    profile, path = load_profile("split", root=ROOT)
    base = DeployOptions(
        image=DIGEST, router_image=ROUTER, network=network, router_replicas=1 if network == "host" else 2
    )
    cpu = render(profile, str(path), base)
    placement = GpuPlacement(libraries=tuple(wheel_libraries()), cuda=CudaVersion(13, 0))
    gpu = render(profile, str(path), dataclasses.replace(base, gpu=placement))
    stripped = _strip_gpu(gpu.objects(), {name: 1 for name in profile.pools})
    plain = copy.deepcopy(cpu.objects())
    for obj in plain:
        if obj["kind"] == "Secret":
            obj["stringData"] = {}
    assert stripped == plain
    assert cpu.files.keys() == gpu.files.keys()


# --- the affinity, judged by an evaluator of Kubernetes' node-selector rules against the gate's own verdicts --------


def _selects(terms: list[dict[str, Any]], labels: dict[str, str]) -> bool:
    """Kubernetes' nodeSelectorTerms: terms ORed, a term's requirements ANDed; In on the value, Gt as integers on a
    label that must exist (k8s.io/apimachinery selection.Requirement)."""

    def holds(req: dict[str, Any]) -> bool:
        value = labels.get(req["key"])
        if req["operator"] == "In":
            return value in req["values"]
        if req["operator"] == "Gt":
            return value is not None and int(value) > int(req["values"][0])
        raise AssertionError(f"operator {req['operator']} not expected")

    return any(all(holds(r) for r in term["matchExpressions"]) for term in terms)


def _node(cap: Capability, driver: DriverVersion, *, newer_gfd: bool) -> dict[str, str]:
    prefix = "nvidia.com/cuda.driver-version." if newer_gfd else "nvidia.com/cuda.driver."
    rev = "revision" if newer_gfd else "rev"
    return {
        "nvidia.com/gpu.compute.major": str(cap.major),
        "nvidia.com/gpu.compute.minor": str(cap.minor),
        f"{prefix}major": str(driver.major),
        f"{prefix}minor": str(driver.minor),
        f"{prefix}{rev}": f"{driver.rev:02d}",
    }


DRIVERS = [DriverVersion.parse(d) for d in ("450.80.02", "525.60.12", "525.60.13", "535.183.01", "579.99", "580.65.06")]


@pytest.mark.parametrize(
    ("libraries", "cuda"),
    [
        (tuple(wheel_libraries()), CudaVersion(13, 0)),
        ((declared_library("8.0+PTX 9.0a", where="t"),), CudaVersion(12, 4)),
        ((declared_library("7.5 8.6 12.0", where="t"),), CudaVersion(11, 8)),
        ((declared_library("10.0f", where="t"),), CudaVersion(12, 9)),
        ((LibraryArchs(library="a", sass=frozenset({Arch(9, 0, "a"), Arch(10, 0, "a")})),), CudaVersion(13, 0)),
    ],
    ids=["wheel-cuda13", "ptx80-90a-cuda12.4", "sass-cuda11.8", "family100f-cuda12.9", "sm90a-sm100a-cuda13"],
)
def test_node_affinity_admits_exactly_the_nodes_the_gate_passes(
    libraries: tuple[LibraryArchs, ...], cuda: CudaVersion
) -> None:
    terms = gpu_node_terms(GpuPlacement(libraries=libraries, cuda=cuda))
    for major in range(3, 16):
        for minor in range(10):
            cap = Capability(major, minor)
            (verdict,) = judge([Gpu(name="n", capability=cap, source="grid")], list(libraries))
            for driver in DRIVERS:
                expected = verdict.supported and bool(
                    check_driver(driver, cuda, compat_package=False, datacentre=True).ok
                )
                for newer in (True, False):
                    assert _selects(terms, _node(cap, driver, newer_gfd=newer)) is expected, (cap, driver, newer)
    # A node GFD has not labelled is never chosen.
    assert not _selects(terms, {})
