"""The smoke run on a built image (FORGE_SMOKE_IMAGE): replicas as containers, nothing left behind."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from smoke_helpers import ROOT, free_base_port, interrupt_forge_smoke, router_image, smoke_image
from smoke_runs import smoke_run

from builders.cli import main
from builders.container import Engine, RunSpec
from builders.smoke.plan import RUN_LABEL
from builders.smoke.profile import load_profile
from builders.smoke.runtimes import ContainerReplicas, ContainerRouter
from builders.smoke.stack import SmokeOptions, SmokeRun

pytestmark = [pytest.mark.engine, pytest.mark.server, pytest.mark.slow, pytest.mark.image("docker:cpu-wheel")]


def image_run(engine: Engine, image: str, options: SmokeOptions) -> SmokeRun:
    router = router_image()

    return smoke_run(
        options,
        lambda _kind, _image, model_dir, _logs_dir: ContainerReplicas(engine, image, model_dir=model_dir),
        lambda _logs_dir: ContainerRouter(engine, router),
    )


# No rerun: the pools' replicas are confined to their own cores (profiles/ci.yaml pools.*.cpus).
# The kill check only: killing a container is this runtime's own path, while the slow-client check judges the
# router, which is the same process whatever runs the replicas, and runs (with its negative control) on the
# host-process stack (test_smoke_local_stack.py). Its baseline run cost CI a minute here for nothing new.
@pytest.mark.timeout(900)
def test_ci_profile_passes_on_the_image_with_the_kill_check(engine: Engine, tmp_path: Path) -> None:
    image = smoke_image()
    profile, path = load_profile("ci", root=ROOT)
    options = SmokeOptions(
        profile=profile,
        profile_path=path,
        report_dir=tmp_path,
        base_port=free_base_port(profile.replica_count),
        check_kill_replica=True,
    )
    run = image_run(engine, image, options)
    report = json.loads(run.execute().to_json())

    assert report["gates"] == {"passed": True, "failures": []}
    assert report["checks"]["kill_replica"]["cut"] >= 1
    assert report["teardown"]["clean"] is True and report["teardown"]["leftovers"] == []
    assert engine.containers_with_label(RUN_LABEL, run.run_id) == []
    assert report["replicas_from"].startswith(f"image {image}")


@pytest.mark.timeout(600)
def test_the_images_vllm_refuses_a_retired_flag_before_anything_starts(
    engine: Engine, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    image = smoke_image()
    ci, _ = load_profile("ci", root=ROOT)
    data = ci.model_dump(mode="json", exclude={"name"})
    data["pools"]["interactive"]["extra_args"] = ["--max-long-partial-prefills", "1"]
    profile_file = tmp_path / "retired.yaml"
    profile_file.write_text(json.dumps(data), encoding="utf-8")
    before = set(engine.containers_with_label(RUN_LABEL))
    code = main(["smoke", image, "--profile", str(profile_file), "--report", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "pool 'interactive', pools.interactive.extra_args[0]: --max-long-partial-prefills" in err
    assert set(engine.containers_with_label(RUN_LABEL)) == before


@pytest.mark.timeout(900)
def test_ctrl_c_on_the_image_removes_every_container(engine: Engine, tmp_path: Path) -> None:
    image = smoke_image()
    base = free_base_port(3)
    code, run_id, output = interrupt_forge_smoke(
        [image, "--profile", "ci", "--base-port", str(base), "--report", str(tmp_path)], signal.SIGINT, after_s=10
    )
    assert code == 130, output
    assert engine.containers_with_label(RUN_LABEL, run_id) == []
    report = json.loads((tmp_path / f"smoke-ci-{run_id}.json").read_text(encoding="utf-8"))
    assert report["teardown"]["clean"] is True


@pytest.mark.timeout(600)
def test_a_replica_container_runs_only_on_its_cpu_set(engine: Engine) -> None:
    """What `cpus` in a profile becomes for a container: the cpuset the kernel enforces inside it."""
    image = smoke_image()
    last = max(os.sched_getaffinity(0))
    cid = engine.run_detached(
        RunSpec(
            image=image,
            entrypoint=["sh"],
            command=["-c", "grep Cpus_allowed_list /proc/self/status; sleep 30"],
            network_host=False,
            shm_size="64m",
            labels={RUN_LABEL: "cpuset-test"},
            cpuset_cpus=str(last),
        )
    )
    try:
        deadline = time.monotonic() + 30
        while "Cpus_allowed_list" not in engine.logs(cid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert engine.logs(cid).split() == ["Cpus_allowed_list:", str(last)]
    finally:
        engine.stop_and_remove(cid, timeout=0)
