"""A stack profile as Kubernetes objects: one Deployment, headless Service and PodDisruptionBudget per pool, the
router as a Deployment with its config in a ConfigMap, its keys in a Secret, a Service and a PodDisruptionBudget.

Pure: profile + images -> typed mappings, checked here and written by builders/deploy/command.py. The pools'
`vllm serve` arguments, the model and the router config are the ones `forge smoke` derives from the same
profile (builders/smoke/plan.py, tiny_model.py, builders/router/config.py), so a deployed stack and a smoke
stack differ only in where they run.
"""

from __future__ import annotations

import copy
import json
import math
import re
import secrets
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from builders.config.profile import StackProfile
from builders.config.types import IMAGE_REFERENCE
from builders.cpusets import parse_cpuset
from builders.cuda_driver import MINOR_COMPAT_MINIMUM, SHIPPED_WITH, CudaVersion, DriverVersion
from builders.engines import serving_engine
from builders.engines.args import SERVE_ENTRIES
from builders.engines.tiny_model import ModelShape, write_tiny_model
from builders.errors import ConfigError, UsageError
from builders.gpu_archs import Capability, LibraryArchs, core
from builders.router.config import RouterConfig, config_from_mapping
from builders.serving_dtype import AUTO
from builders.smoke.plan import CONTAINER_MODEL_DIR, plan_stack, pool_args

Object = dict[str, Any]
Network = Literal["cluster", "host"]

PORT = 8000
"""Every replica and the router listen here inside their pods; Services keep the same number."""
ROUTER_CONFIG_DIR = "/forge/router"
ROUTER_CONFIG_FILE = "router.json"
UID = 1000
"""The user Forge's images run as (containers/*.Containerfile.j2: USER 1000)."""

# Memory of one replica: what a CPU vLLM server takes before any model (Python, torch, the engine core
# process; 1.6-2.1 GiB RSS in forge smoke runs), plus weights, plus the KV cache the profile sets. The limit
# is the request: a replica that outgrows it is OOM-killed rather than squeezing its neighbours.
VLLM_BASE_MEMORY = 2 * 1024**3
MEMORY_STEP = 256 * 1024**2
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
# /dev/shm of a replica holds vLLM's shared-memory rings (vllm/distributed/device_communicators/shm_broadcast.py,
# v1/executor/multiproc_executor.py): the executor's broadcast ring of VLLM_MQ_MAX_CHUNK_BYTES_MB (default 16)
# x 10 chunks, and one response ring per worker of 24 MiB x 10. vLLM refuses to start when /dev/shm cannot hold
# a ring ("Insufficient space in /dev/shm ... 160 MiB required"). Memory-backed, so it counts against the limit.
MQ_CHUNKS = 10
MQ_CHUNK_MIB_DEFAULT = 16
RESPONSE_RING_MIB = 24 * MQ_CHUNKS
SHM_HEADROOM_MIB = 64
"""Torch's own shared tensors and the rings' metadata."""
SHM_STEP_MIB = 64
# NCCL keeps its proxy buffers in /dev/shm and, where two GPUs cannot reach each other directly, stages their
# traffic there (its SHM transport; NCCL_SHM_DISABLE turns it off); a default 64 MiB /dev/shm makes it crash in
# ncclShmOpen, and PyTorch's CI gives NCCL jobs 2 GiB (pytorch/tutorials 0ba3e39). 1 GiB per GPU of a replica.
NCCL_SHM_MIB_PER_GPU = 1024
# GPU Feature Discovery's node labels (NVIDIA/k8s-device-plugin docs/gpu-feature-discovery/README.md): GPU pools
# are kept to nodes whose labels say they can run the image. The driver's version is written under the newer name
# and the deprecated one; a pool accepts either, so a node labelled by an older GFD still qualifies.
GFD_COMPUTE_MAJOR = "nvidia.com/gpu.compute.major"
GFD_COMPUTE_MINOR = "nvidia.com/gpu.compute.minor"
GFD_DRIVER = (
    (
        "nvidia.com/cuda.driver-version.major",
        "nvidia.com/cuda.driver-version.minor",
        "nvidia.com/cuda.driver-version.revision",
    ),
    ("nvidia.com/cuda.driver.major", "nvidia.com/cuda.driver.minor", "nvidia.com/cuda.driver.rev"),
)
GPU_RESOURCE = "nvidia.com/gpu"
"""What NVIDIA's device plugin advertises and taints GPU nodes with (the GPU Operator's and cloud node pools')."""

_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True, kw_only=True)
class GpuPlacement:
    """What a GPU image's pools need from a cluster: its archs and CUDA, read from its labels or report."""

    libraries: tuple[LibraryArchs, ...]
    cuda: CudaVersion | None
    gpus_per_replica: int | None = None
    """--gpus: GPUs each replica requests (default: the pool's tensor-parallel size)."""


@dataclass(frozen=True, kw_only=True)
class DeployOptions:
    image: str
    router_image: str
    network: Network = "cluster"
    router_replicas: int = 2
    dns_interval_s: float = 5.0
    base_port: int | None = None
    """With network host: the router's port, replicas on the ports after it (default: the profile's ports.base)."""
    gpu: GpuPlacement | None = None
    """A GPU image: its pools request GPUs and keep to nodes that can run it; None renders CPU pools."""


@dataclass(frozen=True, kw_only=True)
class Rendered:
    """The objects of one stack, grouped into the files they are written to (file name -> objects)."""

    files: dict[str, list[Object]]
    notes: list[str]

    def objects(self) -> list[Object]:
        return [obj for objs in self.files.values() for obj in objs]


def check_image(flag: str, ref: str) -> list[str]:
    """UsageError for a reference no registry could accept; a note when it is a tag rather than a digest."""
    # fullmatch: the `$` this used to end with also matched before a trailing newline, which went into the
    # manifests as is.
    if not IMAGE_REFERENCE.fullmatch(ref):
        raise UsageError(f"{flag} {ref!r} is not an image reference like registry/name:tag or name@sha256:DIGEST")
    if "@sha256:" in ref:
        return []
    return [f"{flag} {ref} is a tag: every node pulls whatever it names then; pass NAME@sha256:DIGEST to pin it"]


def memory_bytes(profile: StackProfile, pool: str, *, gpus: int = 0) -> int:
    """A replica's memory request and limit, rounded up to 256 MiB (its /dev/shm is memory, counted in)."""
    model = profile.model
    vocab = 1024  # the tiny model's tokenizer (builders/engines/tiny_model.py VOCAB_SIZE)
    hidden = model.hidden_size
    intermediate = model.intermediate_size or 2 * hidden
    # Embeddings and LM head, then per layer the four attention projections and the three MLP matrices.
    params = 2 * vocab * hidden + model.num_hidden_layers * (4 * hidden * hidden + 3 * hidden * intermediate)
    weights = params * DTYPE_BYTES[_rendered_dtype(profile)]
    total = VLLM_BASE_MEMORY + weights + _bytes(model.kv_cache_memory) + shm_mib(profile, pool, gpus=gpus) * 1024**2
    return math.ceil(total / MEMORY_STEP) * MEMORY_STEP


def shm_mib(profile: StackProfile, pool: str, *, gpus: int = 0) -> int:
    """The memory-backed /dev/shm a replica of `pool` needs, in MiB: vLLM's broadcast ring, one response ring
    per worker (the pool's tensor-parallel size), NCCL's share per GPU, and headroom, rounded up to 64 MiB."""
    settings = profile.pools[pool]
    chunk_mib = int(settings.env.get("VLLM_MQ_MAX_CHUNK_BYTES_MB", MQ_CHUNK_MIB_DEFAULT))
    workers = _tensor_parallel(settings.extra_args)
    total = chunk_mib * MQ_CHUNKS + workers * RESPONSE_RING_MIB + SHM_HEADROOM_MIB + gpus * NCCL_SHM_MIB_PER_GPU
    return math.ceil(total / SHM_STEP_MIB) * SHM_STEP_MIB


def _tensor_parallel(extra_args: tuple[str, ...], *, where: str = "extra_args") -> int:
    for i, token in enumerate(extra_args):
        for flag in ("--tensor-parallel-size", "-tp"):
            value = extra_args[i + 1] if token == flag and i + 1 < len(extra_args) else None
            if token.startswith(flag + "="):
                value = token.split("=", 1)[1]
            if value is not None:
                return _whole(value, where=f"{where}: {flag}", what="a whole number of GPUs")
    return 1


def _whole(text: str, *, where: str, what: str) -> int:
    """A positive whole number the manifests are sized by (a tensor-parallel size, a ring's MiB)."""
    if not re.fullmatch(r"[1-9][0-9]{0,5}", text):
        raise ConfigError(f"{where}: {text!r} is not {what} (1 or more)", hint="fix the profile and render again")
    return int(text)


def check_sizes(profile: StackProfile, source: str) -> None:
    """What the manifests' memory and /dev/shm sizes are computed from, checked with the file and key before any
    is: vLLM reads these as numbers when it starts, which a cluster would show as a crash loop."""
    for name, settings in profile.pools.items():
        chunk = settings.env.get("VLLM_MQ_MAX_CHUNK_BYTES_MB")
        if chunk is not None:
            _whole(chunk, where=f"{source}: pools.{name}.env.VLLM_MQ_MAX_CHUNK_BYTES_MB", what="a whole number of MiB")
        _tensor_parallel(settings.extra_args, where=f"{source}: pools.{name}.extra_args")


def cpus_of(profile: StackProfile, pool: str) -> int:
    """Whole CPUs per replica: as many as the pool's CPU set names (1 when it names none)."""
    cpuset = profile.pools[pool].cpuset_of(0)
    return len(parse_cpuset(cpuset)) if cpuset is not None else 1


def _rendered_dtype(profile: StackProfile) -> str:
    """The dtype the manifests serve. The node that will run them is unknown when they are rendered, and
    bfloat16 without native BF16 serves tens of times slower than float32 (builders/serving_dtype.py), while
    float32 on a BF16 node costs about 2x: so float32, unless the profile names a dtype for its nodes."""
    return "float32" if profile.model.dtype == AUTO else profile.model.dtype


def render(profile: StackProfile, source: str, options: DeployOptions) -> Rendered:
    notes = check_image("--image", options.image) + check_image("--router-image", options.router_image)
    check_sizes(profile, source)
    prefix = f"forge-{profile.name}"
    if not _NAME.match(prefix) or len(prefix) + 1 + max(len(p) for p in profile.pools) > 63:
        raise UsageError(
            f"profile name {profile.name!r} does not make Kubernetes names ({prefix}-POOL must be lowercase "
            "letters, digits and '-', at most 63 characters)",
            hint="rename the profile file",
        )
    host = options.network == "host"
    if host and options.router_replicas != 1:
        raise UsageError("--network host runs one router: two would listen on the same host port")
    for name, settings in profile.pools.items():
        serving = serving_engine(settings.engine)
        if not serving.deployable:
            # The manifests start `vllm serve` on a model ConfigMap; another server needs its own pod spec.
            raise UsageError(
                f"{source}: pools.{name}: forge deploy renders vLLM pools only, and this pool runs {serving.title}",
                hint="deploy a profile whose pools all run engine: vllm",
            )
    plan = plan_stack(profile, run_id="deploy", base_port=options.base_port)
    if options.gpu is not None:
        notes.extend(_gpu_notes(options.gpu))
    files: dict[str, list[Object]] = {"model.yaml": [_model_configmap(profile, prefix)]}
    keys = f"{prefix}-keys"
    for name, settings in profile.pools.items():
        replica = next(r for r in plan.replicas if r.pool == name)
        port = replica.port if host else PORT
        args, _ = pool_args(
            profile, name, settings, port, _rendered_dtype(profile), host="127.0.0.1" if host else "0.0.0.0"
        )
        env = dict(replica.env)
        if not host:
            # The profile's CPU numbers are this host's; in a cluster the kubelet picks the cores (whole CPUs
            # with requests = limits get exclusive ones under the static CPU manager), and vLLM's OpenMP
            # threads follow the container's CPU set instead of named cores.
            env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
            env["OMP_NUM_THREADS"] = str(cpus_of(profile, name))
        files[f"pool-{name}.yaml"] = _pool_objects(
            profile, name, prefix=prefix, keys=keys, options=options, args=args, env=env, port=port
        )
    router = _router_config(
        profile,
        source,
        plan_ports=plan.pool_urls(),
        prefix=prefix,
        options=options,
        port=plan.router_port if host else PORT,
    )
    files["router.yaml"] = _router_objects(
        profile,
        prefix=prefix,
        keys=keys,
        options=options,
        config=router,
        port=plan.router_port if host else PORT,
    )
    files["secret.yaml"] = [_secret(prefix, keys)]
    if _api_discovery(profile, options):
        files["rbac.yaml"] = _rbac(prefix)
        notes.append(
            "deploy.discovery kubernetes: the router asks the API for its pools' pods, so its image needs the "
            "`kubernetes` client (pip install 'forge-vllm[kubernetes]'); Forge's router target does not carry it"
        )
    if host:
        notes.append(
            "--network host: replicas and the router share the node's network on 127.0.0.1 and the router lists "
            "them by port (no DNS discovery); for a single machine (podman kube play), not a cluster"
        )
    return Rendered(files=files, notes=notes)


def _gpu_notes(placement: GpuPlacement) -> list[str]:
    notes = [
        "GPU image: each pool's replicas request nvidia.com/gpu and are kept to nodes GPU Feature Discovery labels "
        "with a compute capability the image has kernels for"
        + (f" and a driver for its CUDA {placement.cuda}" if placement.cuda else "")
        + "; the cluster needs NVIDIA's device plugin and GFD (docs/kubernetes.md)"
    ]
    if placement.cuda is None:
        notes.append("the image's CUDA is not known: no driver affinity (pass --image-cuda MAJOR.MINOR)")
    elif driver_minimum(placement.cuda) is None:
        notes.append(f"CUDA {placement.cuda} is not in builders/cuda_driver.py's table: no driver affinity")
    return notes


def kustomization(rendered: Rendered, profile: StackProfile) -> Object:
    return {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": sorted(rendered.files),
        "labels": [{"pairs": {"app.kubernetes.io/part-of": f"forge-{profile.name}"}, "includeSelectors": False}],
    }


# --- objects ------------------------------------------------------------------------------------------------


def _labels(prefix: str, component: str, pool: str | None = None) -> dict[str, str]:
    labels = {
        "app.kubernetes.io/name": "forge",
        "app.kubernetes.io/instance": prefix,
        "app.kubernetes.io/component": component,
    }
    if pool is not None:
        labels["forge/pool"] = pool
    return labels


def _pool_selector(prefix: str, pool: str) -> dict[str, str]:
    """The labels that pick a pool's pods: its Deployment's and Service's selector, and the router's for API
    discovery."""
    labels = _labels(prefix, "pool", pool)
    return {k: labels[k] for k in ("app.kubernetes.io/instance", "app.kubernetes.io/component", "forge/pool")}


def _meta(name: str, labels: dict[str, str]) -> Object:
    return {"name": name, "labels": dict(labels)}


def _pod_security() -> Object:
    return {
        "runAsNonRoot": True,
        "runAsUser": UID,
        "runAsGroup": UID,
        "fsGroup": UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _container_security(*, read_only_root: bool) -> Object:
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": read_only_root,
        "runAsNonRoot": True,
    }


def _probes(port: int | str, *, startup_s: float, startup_period_s: int) -> Object:
    def probe(period: int, failures: int, timeout: int) -> Object:
        return {
            "httpGet": {"path": "/health", "port": port},
            "periodSeconds": period,
            "failureThreshold": failures,
            "timeoutSeconds": timeout,
        }

    return {
        # Liveness and readiness start counting only once /health first answers: a slow model load is not a
        # crash loop, however long startup_s allows.
        "startupProbe": probe(startup_period_s, max(1, math.ceil(startup_s / startup_period_s)), 3),
        # Not ready after two missed checks: the headless Service drops the pod, so the router's next
        # resolution stops sending it new requests (the streams it runs go on).
        "readinessProbe": probe(5, 2, 3),
        "livenessProbe": probe(10, 3, 5),
    }


def _grace_s(profile: StackProfile) -> int:
    """Seconds between SIGTERM and SIGKILL: the router's drain grace plus time to send its error events."""
    drain = RouterConfig.model_fields["drain_grace_s"].default
    drain = float(profile.router.get("drain_grace_s", drain))
    return math.ceil(drain) + 5


def _model_configmap(profile: StackProfile, prefix: str) -> Object:
    with tempfile.TemporaryDirectory(prefix="forge-deploy-model-") as tmp:
        model = Path(tmp) / "model"
        write_tiny_model(
            model,
            max_position_embeddings=profile.model.max_position_embeddings,
            shape=ModelShape(
                hidden_size=profile.model.hidden_size,
                num_hidden_layers=profile.model.num_hidden_layers,
                intermediate_size=profile.model.intermediate_size,
            ),
        )
        data = {path.name: path.read_text(encoding="utf-8") for path in sorted(model.iterdir())}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(f"{prefix}-model", _labels(prefix, "model")),
        "data": data,
    }


def _pool_objects(
    profile: StackProfile,
    name: str,
    *,
    prefix: str,
    keys: str,
    options: DeployOptions,
    args: list[str],
    env: dict[str, str],
    port: int,
) -> list[Object]:
    settings = profile.pools[name]
    labels = _labels(prefix, "pool", name)
    selector = _pool_selector(prefix, name)
    cpu = str(cpus_of(profile, name))
    gpus = gpus_of(options.gpu, settings.extra_args) if options.gpu else 0
    memory = f"{memory_bytes(profile, name, gpus=gpus) // 1024**2}Mi"
    resources = {"cpu": cpu, "memory": memory}
    host = options.network == "host"
    # In a cluster, requests = limits in whole CPUs is Guaranteed QoS, and the static CPU manager gives such a pod
    # exclusive cores. On one machine (podman kube play, --network host) there is no CPU manager: a CPU limit is
    # only a CFS quota over the whole pod, and the API server's streaming beside an engine busy on its core ran
    # past it and was throttled, stalling tokens for 100-400 ms (an ITL p99 of 422 ms against 400 in CI). There the
    # profile's named cores confine the compute threads (VLLM_CPU_OMP_THREADS_BIND) and memory alone is limited.
    limits = {"memory": memory} if host else dict(resources)
    entry = list(SERVE_ENTRIES[0])
    container: Object = {
        "name": "vllm",
        "image": options.image,
        "imagePullPolicy": "IfNotPresent",
        "command": entry,
        "args": [CONTAINER_MODEL_DIR, *args],
        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
        "env": [
            *({"name": k, "value": v} for k, v in sorted(env.items())),
            {"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": keys, "key": "upstream-api-key"}}},
        ],
        "resources": {"requests": dict(resources), "limits": limits},
        **_probes(port if host else "http", startup_s=profile.timeouts.startup_s, startup_period_s=5),
        # vLLM and torch write compile and kernel caches under $HOME at start: the root filesystem stays writable.
        "securityContext": _container_security(read_only_root=False),
        "volumeMounts": [
            {"name": "model", "mountPath": CONTAINER_MODEL_DIR, "readOnly": True},
            {"name": "dshm", "mountPath": "/dev/shm"},
        ],
    }
    pod: Object = {
        "terminationGracePeriodSeconds": _grace_s(profile),
        "automountServiceAccountToken": False,
        # Service links would put variables like FORGE_CI_BULK_PORT in every pod, and a Service named
        # `vllm` would set VLLM_PORT, which vLLM reads as its own setting.
        "enableServiceLinks": False,
        "securityContext": _pod_security(),
        "containers": [container],
        "volumes": [
            {"name": "model", "configMap": {"name": f"{prefix}-model"}},
            # Kubernetes has no shm-size: a memory-backed emptyDir at /dev/shm is how a pod gets more than the
            # runtime's 64 MiB (production-stack mounts one the same way).
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{shm_mib(profile, name, gpus=gpus)}Mi"}},
        ],
    }
    if host:
        _on_host_network(pod)
    if options.gpu:
        _on_gpus(pod, container, options.gpu, gpus)
    deployment: Object = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(f"{prefix}-{name}", labels),
        "spec": {
            "replicas": settings.replicas,
            "selector": {"matchLabels": selector},
            # A new replica is ready before an old one goes: the pool never serves with fewer than it has.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {"metadata": {"labels": dict(labels)}, "spec": pod},
        },
    }
    service: Object = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(f"{prefix}-{name}", labels),
        "spec": {
            # Headless: the name resolves to every ready pod's address, which the router's DNS discovery reads.
            "clusterIP": "None",
            "publishNotReadyAddresses": False,
            "selector": selector,
            "ports": [{"name": "http", "port": PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }
    budget: Object = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(f"{prefix}-{name}", labels),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector}},
    }
    return [deployment, service, budget]


def _router_config(
    profile: StackProfile,
    source: str,
    *,
    plan_ports: dict[str, list[str]],
    prefix: str,
    options: DeployOptions,
    port: int,
) -> dict[str, Any]:
    """The router's config file: the profile's router section, pools found by DNS (or by port on one host).
    The keys are not in it: they come from the Secret through the environment (builders/router/__main__.py)."""
    host = options.network == "host"
    mapping: dict[str, Any] = {
        **profile.router,
        "host": "127.0.0.1" if host else "0.0.0.0",
        "port": port,
        "class_pools": {c.value: pool for c, pool in profile.classes.items()},
    }
    if host:
        mapping["pools"] = plan_ports
    elif profile.deploy.discovery == "kubernetes":
        mapping["pools"] = {name: [] for name in profile.pools}
        # No namespace: the router's own, where kustomize puts the pools beside it.
        mapping["discovery"] = {
            name: {
                "label_selector": ",".join(f"{k}={v}" for k, v in _pool_selector(prefix, name).items()),
                "port": PORT,
            }
            for name in profile.pools
        }
    else:
        mapping["pools"] = {name: [] for name in profile.pools}
        mapping["discovery"] = {
            name: {"dns": f"{prefix}-{name}", "port": PORT, "interval_s": options.dns_interval_s}
            for name in profile.pools
        }
    try:
        config_from_mapping(mapping, source=f"{source}: router")
    except ConfigError as exc:
        raise ConfigError(exc.message, hint="the router section takes builders/router/config.py's fields") from None
    return mapping


def _router_objects(
    profile: StackProfile, *, prefix: str, keys: str, options: DeployOptions, config: dict[str, Any], port: int
) -> list[Object]:
    host = options.network == "host"
    labels = _labels(prefix, "router")
    selector = {k: labels[k] for k in ("app.kubernetes.io/instance", "app.kubernetes.io/component")}
    name = f"{prefix}-router"
    configmap: Object = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(name, labels),
        "data": {ROUTER_CONFIG_FILE: json.dumps(config, indent=2) + "\n"},
    }
    container: Object = {
        "name": "router",
        "image": options.router_image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["python3", "-m", "builders.router"],
        "args": ["--config", f"{ROUTER_CONFIG_DIR}/{ROUTER_CONFIG_FILE}"],
        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
        "env": [
            {"name": "FORGE_ROUTER_API_KEY", "valueFrom": {"secretKeyRef": {"name": keys, "key": "api-key"}}},
            {
                "name": "FORGE_ROUTER_UPSTREAM_API_KEY",
                "valueFrom": {"secretKeyRef": {"name": keys, "key": "upstream-api-key"}},
            },
        ],
        # One event loop: a core is what it can use; memory is its buffers (stream_buffer_bytes per stream).
        "resources": {"requests": {"cpu": "1", "memory": "512Mi"}, "limits": {"cpu": "2", "memory": "512Mi"}},
        **_probes(port if host else "http", startup_s=30, startup_period_s=1),
        "securityContext": _container_security(read_only_root=True),
        "volumeMounts": [{"name": "config", "mountPath": ROUTER_CONFIG_DIR, "readOnly": True}],
    }
    api = _api_discovery(profile, options)
    pod: Object = {
        "terminationGracePeriodSeconds": _grace_s(profile),
        **({"serviceAccountName": name} if api else {}),
        # Only a router that asks the API for its pods holds a token, and only for that (rbac.yaml).
        "automountServiceAccountToken": api,
        "enableServiceLinks": False,
        "securityContext": _pod_security(),
        "containers": [container],
        "volumes": [{"name": "config", "configMap": {"name": name}}],
    }
    if host:
        _on_host_network(pod)
    deployment: Object = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(name, labels),
        "spec": {
            "replicas": options.router_replicas,
            "selector": {"matchLabels": selector},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {"metadata": {"labels": dict(labels)}, "spec": pod},
        },
    }
    service: Object = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(name, labels),
        "spec": {
            "type": "ClusterIP",
            "selector": selector,
            "ports": [{"name": "http", "port": PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }
    budget: Object = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(name, labels),
        # One router at a time: with two or more (the default), a drain never leaves the Service empty. With
        # one, minAvailable 1 would block every node drain for good, so it too may go.
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector}},
    }
    return [configmap, deployment, service, budget]


# --- GPU pools -----------------------------------------------------------------------------------------------


def gpus_of(placement: GpuPlacement, extra_args: tuple[str, ...]) -> int:
    """GPUs one replica requests: --gpus, else the pool's tensor-parallel size (one GPU per worker)."""
    return placement.gpus_per_replica or _tensor_parallel(extra_args)


def _on_gpus(pod: Object, container: Object, placement: GpuPlacement, gpus: int) -> None:
    """A GPU pool's pod: its GPUs requested (extended resources are whole and never overcommitted, so requests equal
    limits), the device plugin's taint tolerated, and node affinity on GFD's labels keeping it to nodes whose GPU the
    image has kernels for and whose driver runs its CUDA. Its /dev/shm and memory were sized with NCCL's share."""
    for key in ("requests", "limits"):
        container["resources"][key][GPU_RESOURCE] = str(gpus)
    pod["tolerations"] = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    terms = gpu_node_terms(placement)
    if terms:
        pod["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
        }


def driver_minimum(cuda: CudaVersion) -> DriverVersion | None:
    """The least driver a runtime of `cuda` starts on (builders/cuda_driver.py): its major's minor-version
    compatibility minimum from CUDA 11 on, before that the driver its release shipped with."""
    return MINOR_COMPAT_MINIMUM.get(cuda.major) or SHIPPED_WITH.get(cuda)


# Compute capabilities the terms are drawn over: every minor of every major up to this one. A PTX kernel JITs on
# all later majors too; a major this far up that the image still covers stands for every one after it (Gt).
_LAST_MAJOR = 15


def compute_terms(libraries: tuple[LibraryArchs, ...]) -> list[list[Object]]:
    """Node-selector requirements (one list per term, terms ORed) that hold on exactly the compute capabilities
    every core library has kernels for, as the gate judges them (LibraryArchs.runs_on)."""
    libs = core(libraries)

    def runs(major: int, minor: int) -> bool:
        return all(lib.runs_on(Capability(major, minor)) is not None for lib in libs)

    covered = {m: [n for n in range(10) if runs(m, n)] for m in range(1, _LAST_MAJOR + 1)}
    tail = _LAST_MAJOR + 1
    while tail > 1 and len(covered[tail - 1]) == 10:
        tail -= 1
    terms: list[list[Object]] = []
    whole = [m for m in range(1, min(tail, _LAST_MAJOR + 1)) if len(covered[m]) == 10]
    if whole:
        terms.append([{"key": GFD_COMPUTE_MAJOR, "operator": "In", "values": [str(m) for m in whole]}])
    for major in range(1, min(tail, _LAST_MAJOR + 1)):
        if 0 < len(covered[major]) < 10:
            terms.append(
                [
                    {"key": GFD_COMPUTE_MAJOR, "operator": "In", "values": [str(major)]},
                    {"key": GFD_COMPUTE_MINOR, "operator": "In", "values": [str(n) for n in covered[major]]},
                ]
            )
    if tail <= _LAST_MAJOR:
        terms.append([{"key": GFD_COMPUTE_MAJOR, "operator": "Gt", "values": [str(tail - 1)]}])
    return terms


def driver_terms(minimum: DriverVersion) -> list[list[Object]]:
    """Requirements (terms ORed) that hold on a driver at or above `minimum`, under each spelling of GFD's labels."""
    terms: list[list[Object]] = []
    for major, minor, rev in GFD_DRIVER:

        def gt(key: str, value: int) -> Object:
            return {"key": key, "operator": "Gt", "values": [str(value)]}

        def eq(key: str, value: int) -> Object:
            return {"key": key, "operator": "In", "values": [str(value)]}

        if not minimum.minor and not minimum.rev:
            terms.append([gt(major, minimum.major - 1)])
            continue
        terms.append([gt(major, minimum.major)])
        if not minimum.rev:
            terms.append([eq(major, minimum.major), gt(minor, minimum.minor - 1)])
            continue
        terms.append([eq(major, minimum.major), gt(minor, minimum.minor)])
        terms.append([eq(major, minimum.major), eq(minor, minimum.minor), gt(rev, minimum.rev - 1)])
    return terms


def gpu_node_terms(placement: GpuPlacement) -> list[Object]:
    """Every (compute term AND driver term) pair: Kubernetes ORs terms and ANDs a term's requirements."""
    compute = compute_terms(placement.libraries) if placement.libraries else [[]]
    minimum = driver_minimum(placement.cuda) if placement.cuda else None
    drivers = driver_terms(minimum) if minimum else [[]]
    # Copies: an object shared between terms would be written as a YAML anchor and alias.
    return [{"matchExpressions": copy.deepcopy(c + d)} for c in compute for d in drivers if c + d]


def _on_host_network(pod: Object) -> None:
    pod["hostNetwork"] = True
    # On the node's network a port is not published, only listened on (Podman refuses port mappings there).
    for container in pod["containers"]:
        container.pop("ports", None)


def _api_discovery(profile: StackProfile, options: DeployOptions) -> bool:
    """Whether the router finds replicas through the Kubernetes API (with --network host it lists them by port)."""
    return options.network == "cluster" and profile.deploy.discovery == "kubernetes"


def _rbac(prefix: str) -> list[Object]:
    """What API discovery needs and no more: read the namespace's pods (builders/router/kubernetes_discovery.py
    lists and watches them)."""
    name = f"{prefix}-router"
    labels = _labels(prefix, "router")
    account: Object = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _meta(name, labels),
        "automountServiceAccountToken": False,
    }
    role: Object = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _meta(name, labels),
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
    }
    binding: Object = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _meta(name, labels),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        # No namespace: a RoleBinding's ServiceAccount subject is in the binding's own (kustomize's namespace:).
        "subjects": [{"kind": "ServiceAccount", "name": name}],
    }
    return [account, role, binding]


def _secret(prefix: str, name: str) -> Object:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(name, _labels(prefix, "keys")),
        "type": "Opaque",
        # Fresh for each render: replace them (or this file) with the cluster's own secret management.
        # Hex, not urlsafe base64: a urlsafe key may begin with "-", and `--api-key -abc…` is then read as an
        # option (CI's kube play failed so: "argument --api-key: expected one argument").
        "stringData": {"api-key": secrets.token_hex(24), "upstream-api-key": secrets.token_hex(24)},
    }


def _bytes(text: str) -> int:
    """vLLM's human-readable size (ModelSettings.kv_cache_memory, already checked): 128M = 128 MiB."""
    units = {"k": 1024, "m": 1024**2, "g": 1024**3}
    scale = units.get(text[-1].lower(), 1)
    return int(float(text.rstrip("kKmMgG")) * scale)
