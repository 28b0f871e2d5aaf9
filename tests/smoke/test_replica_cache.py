"""The sweep's replicas share one start-up cache directory (issue 41): a container replica gets it mounted
read-write with its engine's cache variable pointed at it; an engine that caches nothing gets no mount, and a
cold run (`--cold-replicas`) gets neither."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any, cast

from builders.container import Engine, RunSpec
from builders.engines import ServerProbe, serving_engine
from builders.smoke.plan import CONTAINER_MODEL_DIR, ReplicaPlan
from builders.smoke.runtimes import CONTAINER_CACHE_DIR, ContainerReplicas
from builders.sweep import command as sweep_command


class RecordingEngine:
    """Only what ContainerReplicas asks of an engine: whether the image exists, its id, and the containers run."""

    def __init__(self) -> None:
        self.started: list[RunSpec] = []

    def image_exists(self, image: str) -> bool:
        return True

    def image_info(self, image: str) -> Any:
        return type("Info", (), {"id": "sha256:" + "0" * 64})()

    def run_detached(self, spec: RunSpec) -> str:
        self.started.append(spec)
        return f"cid{len(self.started)}"


def _start(kind: str, cache_dir: Path | None, tmp_path: Path) -> RunSpec:
    engine = RecordingEngine()
    replicas = ContainerReplicas(
        cast(Engine, engine), "img", model_dir=tmp_path / "model", serving=serving_engine(kind), cache_dir=cache_dir
    )
    replica = ReplicaPlan(pool="bulk", index=0, port=8001, args=(), keys=(), env={"A": "1"}, name="r0", engine=kind)
    probe = ServerProbe(spec=cast(Any, None), entry=("vllm", "serve"), model_is_positional=True, notes=())
    replicas.start(replica, probe, run_id="run1")
    return engine.started[0]


def test_a_vllm_replica_gets_the_shared_cache_mounted_read_write_and_pointed_at(tmp_path: Path) -> None:
    spec = _start("vllm", tmp_path / "cache", tmp_path)
    assert spec.volumes[str(tmp_path / "cache")] == f"{CONTAINER_CACHE_DIR}:rw"
    assert spec.env["VLLM_CACHE_ROOT"] == CONTAINER_CACHE_DIR
    assert spec.env["A"] == "1"  # the replica's own environment is kept
    assert spec.volumes[str(tmp_path / "model")] == CONTAINER_MODEL_DIR  # and the model stays read-only


def test_without_a_shared_cache_a_replica_starts_as_it_always_did(tmp_path: Path) -> None:
    spec = _start("vllm", None, tmp_path)
    assert list(spec.volumes.values()) == [CONTAINER_MODEL_DIR]
    assert "VLLM_CACHE_ROOT" not in spec.env


def test_an_engine_that_caches_nothing_gets_no_mount(tmp_path: Path) -> None:
    spec = _start("llama-cpp", tmp_path / "cache", tmp_path)
    assert list(spec.volumes.values()) == [CONTAINER_MODEL_DIR]


def test_the_sweep_cache_is_empty_writable_by_the_image_user_and_removed_after(tmp_path: Path) -> None:
    with sweep_command._replica_cache(cold=False) as folder:
        assert folder is not None and folder.is_dir() and not any(folder.iterdir())
        # Replica containers run as uid 1000, not as the user running Forge.
        assert stat.S_IMODE(folder.stat().st_mode) == 0o777
        (folder / "modelinfos").mkdir()
        (folder / "modelinfos" / "x.json").write_text("{}")
    assert not folder.exists()


def test_cold_replicas_share_nothing() -> None:
    with sweep_command._replica_cache(cold=True) as folder:
        assert folder is None
