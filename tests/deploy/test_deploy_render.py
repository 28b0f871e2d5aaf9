"""`forge deploy render`: the split and ci profiles as Kubernetes objects, validated strict against the OpenAPI
schemas of Kubernetes 1.30 and 1.37 (kubernetes-validate ships both), and what each object promises."""

from __future__ import annotations

import json
import re
import stat
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from builders.cli import main
from builders.deploy.command import load_dir
from builders.deploy.manifests import cpus_of, memory_bytes
from builders.router.config import DnsDiscovery, KubernetesDiscovery, config_from_mapping
from builders.smoke.plan import pool_args
from builders.smoke.profile import load_profile

ROOT = Path(__file__).resolve().parents[2]
VERSIONS = ("1.30.0", "1.37.0")
DIGEST = "registry.example/forge/vllm-cpu@sha256:" + "a" * 64


def rendered(tmp_path: Path, profile: str, *extra: str) -> list[dict[str, Any]]:
    out = tmp_path / Path(profile).stem
    argv = ["--root", str(ROOT), "deploy", "render", "--profile", profile, "--image", DIGEST, "-o", str(out)]
    assert main([*argv, *extra]) == 0
    return load_dir(out)


def by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


@pytest.mark.parametrize("network", ["cluster", "host"])
@pytest.mark.parametrize("profile", ["split", "ci", "two-models"])
def test_every_object_is_valid_strict_for_both_kubernetes_versions(tmp_path: Path, profile: str, network: str) -> None:
    objects = rendered(tmp_path, profile, "--network", network)
    kinds = sorted({o["kind"] for o in objects})
    assert kinds == ["ConfigMap", "Deployment", "PodDisruptionBudget", "Secret", "Service"]
    for version in VERSIONS:
        for obj in objects:
            # Raises ValidationError naming the path on any unknown or mistyped field (strict: no extras).
            kubernetes_validate.validate(obj, version, strict=True)


def test_strict_validation_catches_a_misspelt_field(tmp_path: Path) -> None:
    # The check the test above relies on is real: one wrong key in a probe fails it.
    objects = rendered(tmp_path, "ci")
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    probe = deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
    probe["periodSecond"] = probe.pop("periodSeconds")
    with pytest.raises(kubernetes_validate.ValidationError, match="periodSecond"):
        kubernetes_validate.validate(deployment, VERSIONS[0], strict=True)


def test_pools_follow_the_profile(tmp_path: Path) -> None:
    profile, _ = load_profile("split", root=ROOT)
    objects = rendered(tmp_path, "split")
    deployments = by_kind(objects, "Deployment")
    services = by_kind(objects, "Service")
    for name, pool in profile.pools.items():
        deployment = deployments[f"forge-split-{name}"]
        assert deployment["spec"]["replicas"] == pool.replicas
        pod = deployment["spec"]["template"]["spec"]
        container = pod["containers"][0]
        assert container["image"] == DIGEST
        expected, _ = pool_args(profile, name, pool, 8000, "float32", host="0.0.0.0")
        assert container["args"] == ["/forge/model", *expected]
        resources = container["resources"]
        assert resources["requests"] == resources["limits"], "Guaranteed QoS: exclusive cores under the CPU manager"
        assert resources["limits"]["memory"] == f"{memory_bytes(profile, name) // 2**20}Mi"
        assert {p: container[p]["httpGet"]["path"] for p in ("startupProbe", "readinessProbe", "livenessProbe")} == {
            "startupProbe": "/health",
            "readinessProbe": "/health",
            "livenessProbe": "/health",
        }
        startup = container["startupProbe"]
        assert startup["periodSeconds"] * startup["failureThreshold"] >= profile.timeouts.startup_s
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        service = services[f"forge-split-{name}"]
        assert service["spec"]["clusterIP"] == "None"
        assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
        assert resources["limits"]["cpu"] == str(cpus_of(profile, name))


def test_router_config_finds_every_pool_by_its_headless_service_and_keys_come_from_the_secret(tmp_path: Path) -> None:
    objects = rendered(tmp_path, "ci", "--router-image", "registry.example/forge/router@sha256:" + "b" * 64)
    config_map = by_kind(objects, "ConfigMap")["forge-ci-router"]
    config = config_from_mapping(json.loads(config_map["data"]["router.json"]), source="router.json")
    services = by_kind(objects, "Service")
    names = {name: d.dns for name, d in config.discovery.items() if isinstance(d, DnsDiscovery)}
    assert names == {"interactive": "forge-ci-interactive", "bulk": "forge-ci-bulk"}
    assert all(name in services for name in names.values())
    assert config.api_key is None and config.upstream_api_key is None, "keys stay out of the ConfigMap"
    assert config.long_prefill_tokens == 600, "the profile's router section is carried over"
    router = by_kind(objects, "Deployment")["forge-ci-router"]
    pod = router["spec"]["template"]["spec"]
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in pod["containers"][0]["env"]}
    secret = by_kind(objects, "Secret")["forge-ci-keys"]
    assert {ref["key"] for ref in env.values()} <= set(secret["stringData"])
    # Keys a command line can carry as they are: CI's kube play once drew one that began with "-", and
    # `forge smoke --api-key -…` read it as an option.
    for key in secret["stringData"].values():
        assert re.fullmatch(r"[0-9a-f]{48}", key), key
    assert pod["terminationGracePeriodSeconds"] > config.drain_grace_s
    for deployment in by_kind(objects, "Deployment").values():
        assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > config.drain_grace_s
    budgets = by_kind(objects, "PodDisruptionBudget")
    assert budgets["forge-ci-router"]["spec"]["selector"]["matchLabels"].items() <= (
        router["spec"]["template"]["metadata"]["labels"].items()
    )
    assert router["spec"]["replicas"] == 2


def test_a_second_model_gets_a_deployment_of_its_own_and_the_router_finds_it_without_a_class(tmp_path: Path) -> None:
    profile, _ = load_profile("two-models", root=ROOT)
    objects = rendered(tmp_path, "two-models")
    deployments = by_kind(objects, "Deployment")
    assert set(deployments) == {"forge-two-models-chat", "forge-two-models-embed", "forge-two-models-router"}
    embed = deployments["forge-two-models-embed"]["spec"]["template"]["spec"]["containers"][0]["args"]
    chat = deployments["forge-two-models-chat"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert embed[embed.index("--served-model-name") + 1] == "forge-tiny-embed"
    assert embed[embed.index("--runner") :][:4] == ["--runner", "pooling", "--convert", "embed"]
    assert chat[chat.index("--served-model-name") + 1] == "forge-tiny" and "--runner" not in chat
    config_map = by_kind(objects, "ConfigMap")["forge-two-models-router"]
    config = config_from_mapping(json.loads(config_map["data"]["router.json"]), source="router.json")
    # The embedding pool takes no class: requests reach it by their model, which the router asks its replicas for.
    assert set(config.class_pools.values()) == {"chat"} and set(config.discovery) == {"chat", "embed"}
    assert not config.models and profile.model_pools() == {"embed": "forge-tiny-embed"}


def test_the_secret_file_is_private_and_kustomization_lists_every_file(tmp_path: Path) -> None:
    rendered(tmp_path, "ci")
    out = tmp_path / "ci"
    assert stat.S_IMODE((out / "secret.yaml").stat().st_mode) == 0o600
    kustomization = yaml.safe_load((out / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == sorted(
        p.name for p in out.glob("*.yaml") if p.name != "kustomization.yaml"
    )


def test_tags_are_accepted_with_a_note_and_bad_references_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--root", str(ROOT), "deploy", "render", "--profile", "ci", "-o", str(tmp_path / "x")]
    assert main([*argv, "--image", "forge/debian-12-cpu-wheel:latest"]) == 0
    assert "is a tag" in capsys.readouterr().err
    assert main([*argv, "--image", "Forge/UPPER CASE"]) == 2
    assert "--image 'Forge/UPPER CASE' is not an image reference" in capsys.readouterr().err
    assert main([*argv, "--image", DIGEST, "--network", "host", "--router-replicas", "2"]) == 2


def test_cpu_and_memory_come_from_the_pools_cpu_set_and_the_model(tmp_path: Path) -> None:
    data = yaml.safe_load((ROOT / "profiles" / "ci.yaml").read_text())
    data["pools"]["bulk"]["cpus"] = ["0-2,5"]
    data["model"]["kv_cache_memory"] = "1G"
    path = tmp_path / "wide.yaml"
    path.write_text(yaml.safe_dump(data))
    objects = rendered(tmp_path, str(path))
    limits = {
        n: d["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
        for n, d in by_kind(objects, "Deployment").items()
    }
    assert limits["forge-wide-bulk"]["cpu"] == "4"
    assert limits["forge-wide-interactive"]["cpu"] == "1"
    # 1 GiB of KV cache more than ci's 64 MiB, in whole 256 MiB steps.
    ci, _ = load_profile("ci", root=ROOT)
    assert (
        int(limits["forge-wide-bulk"]["memory"].removesuffix("Mi")) - memory_bytes(ci, "bulk") // 2**20
        == 1024 - 64 + 64
    )


def test_on_one_machine_pools_are_bound_to_their_cores_and_not_throttled_by_a_cpu_quota(tmp_path: Path) -> None:
    profile, _ = load_profile("ci", root=ROOT)
    objects = rendered(tmp_path, "ci", "--network", "host")
    for name, pool in profile.pools.items():
        container = by_kind(objects, "Deployment")[f"forge-ci-{name}"]["spec"]["template"]["spec"]["containers"][0]
        resources = container["resources"]
        assert resources["requests"]["cpu"] == str(cpus_of(profile, name))
        assert "cpu" not in resources["limits"], "a CFS quota, not a CPU manager, on one machine"
        assert resources["limits"]["memory"] == f"{memory_bytes(profile, name) // 2**20}Mi"
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["VLLM_CPU_OMP_THREADS_BIND"] == ",".join(pool.cpus)


@pytest.mark.parametrize("network", ["cluster", "host"])
def test_every_pool_mounts_memory_backed_shm_sized_for_vllms_rings(tmp_path: Path, network: str) -> None:
    data = yaml.safe_load((ROOT / "profiles" / "ci.yaml").read_text())
    # A bigger broadcast chunk and two tensor-parallel workers: 64 x 10 + 2 x 240 + 64 = 1184 MiB -> 1216 MiB.
    data["pools"]["bulk"]["env"] = {"VLLM_MQ_MAX_CHUNK_BYTES_MB": "64"}
    data["pools"]["bulk"]["extra_args"] = ["--tensor-parallel-size", "2"]
    path = tmp_path / "rings.yaml"
    path.write_text(yaml.safe_dump(data))
    sizes = {}
    for name, deployment in by_kind(rendered(tmp_path, str(path), "--network", network), "Deployment").items():
        pod = deployment["spec"]["template"]["spec"]
        if name.endswith("-router"):
            assert all(v["name"] != "dshm" for v in pod["volumes"])
            continue
        assert "hostIPC" not in pod, "the host's IPC namespace is not a pod's to share"
        mounts = {m["mountPath"]: m["name"] for m in pod["containers"][0]["volumeMounts"]}
        volume = next(v for v in pod["volumes"] if v["name"] == mounts["/dev/shm"])
        assert volume["emptyDir"]["medium"] == "Memory"
        sizes[name] = volume["emptyDir"]["sizeLimit"]
    # ci's own pools: the default 16 MiB x 10 broadcast ring (the 160 MiB vLLM asked for under Podman's 64 MiB),
    # one 240 MiB response ring and 64 MiB headroom, 464 MiB rounded up to 512.
    assert sizes == {"forge-rings-interactive": "512Mi", "forge-rings-bulk": "1216Mi"}


def test_api_discovery_renders_the_routers_rbac_and_a_selector_per_pool(tmp_path: Path) -> None:
    data = yaml.safe_load((ROOT / "profiles" / "ci.yaml").read_text())
    data["deploy"] = {"discovery": "kubernetes"}
    path = tmp_path / "api.yaml"
    path.write_text(yaml.safe_dump(data))
    objects = rendered(tmp_path, str(path))
    for version in VERSIONS:
        for obj in objects:
            kubernetes_validate.validate(obj, version, strict=True)
    config_map = by_kind(objects, "ConfigMap")["forge-api-router"]
    config = config_from_mapping(json.loads(config_map["data"]["router.json"]), source="router.json")
    deployments = by_kind(objects, "Deployment")
    for pool, settings in config.discovery.items():
        assert isinstance(settings, KubernetesDiscovery) and settings.namespace is None
        selector = dict(term.split("=") for term in settings.label_selector.split(","))
        labels = deployments[f"forge-api-{pool}"]["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items()
        # The selector picks this pool's pods only.
        others = [d for n, d in deployments.items() if n != f"forge-api-{pool}"]
        assert all(not selector.items() <= d["spec"]["template"]["metadata"]["labels"].items() for d in others)
    account = by_kind(objects, "ServiceAccount")["forge-api-router"]
    role = by_kind(objects, "Role")["forge-api-router"]
    binding = by_kind(objects, "RoleBinding")["forge-api-router"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"]}]
    pods = {n: d["spec"]["template"]["spec"] for n, d in deployments.items()}
    assert pods["forge-api-router"]["serviceAccountName"] == account["metadata"]["name"]
    # Only the router holds a token; the replicas never talk to the API.
    assert {n: p["automountServiceAccountToken"] for n, p in pods.items()} == {
        "forge-api-interactive": False,
        "forge-api-bulk": False,
        "forge-api-router": True,
    }
    assert "rbac.yaml" in yaml.safe_load((tmp_path / "api" / "kustomization.yaml").read_text())["resources"]
    # DNS discovery, the default, renders no RBAC and mounts no token anywhere.
    plain = rendered(tmp_path, "ci")
    assert not {"ServiceAccount", "Role", "RoleBinding"} & {o["kind"] for o in plain}
    assert all(
        not d["spec"]["template"]["spec"]["automountServiceAccountToken"] for d in by_kind(plain, "Deployment").values()
    )
