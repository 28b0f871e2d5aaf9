"""The sweep's replicas share one start-up cache directory (issue 41): a container replica gets it mounted
read-write with its engine's cache variable pointed at it; an engine that caches nothing gets no mount, and a
cold run (`--cold-replicas`) gets neither."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path
from typing import Any, cast

from builders.container import Engine, RunSpec
from builders.engines import ServerProbe, serving_engine
from builders.smoke.plan import CONTAINER_MODEL_DIR, ReplicaPlan
from builders.smoke.runtimes import CONTAINER_CACHE_DIR, ContainerReplicas
from builders.sweep import command as sweep_command


class RecordingEngine:
    """Only what ContainerReplicas asks of an engine: whether the image exists, its id, and the containers run.
    A one-off command runs for real on this host, with `home` as the image user's home and each volume's host
    folder in place of its mount point."""

    def __init__(self, home: Path | None = None) -> None:
        self.started: list[RunSpec] = []
        self.once: list[RunSpec] = []
        self.home = home

    def run_once(self, spec: RunSpec, *, timeout: float) -> tuple[int, str]:
        self.once.append(spec)
        mounts = {target.split(":")[0]: source for source, target in spec.volumes.items()}
        argv = [mounts.get(arg, arg) for arg in [*(spec.entrypoint or []), *spec.command]]
        env = {"PATH": os.environ["PATH"], "HOME": str(self.home)}
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, check=False)
        return done.returncode, done.stdout + done.stderr

    def image_exists(self, image: str) -> bool:
        return True

    def image_info(self, image: str) -> Any:
        return type("Info", (), {"id": "sha256:" + "0" * 64})()

    def run_detached(self, spec: RunSpec) -> str:
        self.started.append(spec)
        return f"cid{len(self.started)}"


def _start(
    kind: str, cache_dir: Path | None, tmp_path: Path, engine: RecordingEngine | None = None, replicas: int = 1
) -> RunSpec:
    engine = engine or RecordingEngine()
    runtime = ContainerReplicas(
        cast(Engine, engine), "img", model_dir=tmp_path / "model", serving=serving_engine(kind), cache_dir=cache_dir
    )
    probe = ServerProbe(spec=cast(Any, None), entry=("vllm", "serve"), model_is_positional=True, notes=())
    for index in range(replicas):
        replica = ReplicaPlan(
            pool="bulk", index=index, port=8001 + index, args=(), keys=(), env={"A": "1"}, name=f"r{index}", engine=kind
        )
        runtime.start(replica, probe, run_id="run1")
    return engine.started[0]


def _image_home(tmp_path: Path, *, warmed: bool) -> Path:
    home = tmp_path / "home"
    if warmed:  # what containers/scripts/warm_model_info.py leaves in the image user's cache
        (home / ".cache" / "vllm" / "modelinfos").mkdir(parents=True)
        (home / ".cache" / "vllm" / "modelinfos" / "LlamaForCausalLM.json").write_text('{"is_text_generation": 1}')
    else:
        home.mkdir()
    return home


def test_an_empty_shared_cache_is_seeded_once_with_what_the_image_warmed(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    engine = RecordingEngine(_image_home(tmp_path, warmed=True))
    _start("vllm", cache, tmp_path, engine, replicas=2)
    assert (cache / "modelinfos" / "LlamaForCausalLM.json").read_text() == '{"is_text_generation": 1}'
    assert len(engine.once) == 1 and len(engine.started) == 2
    # The copy reads the image's own cache: it runs without the shared cache's variable pointed at itself.
    assert "VLLM_CACHE_ROOT" not in engine.once[0].env


def test_an_image_that_warmed_nothing_seeds_nothing_and_its_replicas_start(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    engine = RecordingEngine(_image_home(tmp_path, warmed=False))
    _start("vllm", cache, tmp_path, engine)
    assert len(engine.once) == 1 and not any(cache.iterdir()) and len(engine.started) == 1


def test_a_shared_cache_an_earlier_profile_filled_is_not_seeded_again(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (cache / "torch_compile_cache").mkdir(parents=True)
    engine = RecordingEngine(_image_home(tmp_path, warmed=True))
    _start("vllm", cache, tmp_path, engine)
    assert engine.once == [] and not (cache / "modelinfos").exists()


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
    engine = RecordingEngine()
    spec = _start("llama-cpp", tmp_path / "cache", tmp_path, engine)
    assert list(spec.volumes.values()) == [CONTAINER_MODEL_DIR]
    assert engine.once == []


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
