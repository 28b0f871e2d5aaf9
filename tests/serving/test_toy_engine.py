"""A serving engine added from a test package (tests/serving/toy_engine/) through the registry alone: its recipe
loads with its own keys, it plans and renders, its preflight runs its own gate beside every build's, a profile's
pool runs it with its own knobs, `forge smoke` and `forge sweep` take its image, and builders/ never names it."""

from __future__ import annotations

import io
import json
import re
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from toy_engine import ToyEngine, ToyPool, ToyRecipe

from builders.cli import build_parser, main
from builders.commands.schema import schema_text
from builders.engines import ENGINES, make_plan
from builders.errors import ConfigError
from builders.gates.host import GIB, HostFacts, Memory
from builders.plan import PlanOptions
from builders.preflight import run_preflight
from builders.project import Project
from builders.render import render
from builders.router.classes import ALL_CLASSES
from builders.smoke.plan import plan_stack
from builders.smoke.profile import profile_from_mapping
from builders.smoke.runtimes import Runtimes

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = """{%- import "_common.j2" as common with context -%}
{{ common.header(plan, "toy.Containerfile.j2") }}
ARG BASE_IMAGE={{ plan.base_ref }}
FROM ${BASE_IMAGE} AS runtime
COPY {{ plan.context[0].name }} /opt/toy/
RUN echo {{ plan.recipe.greeting | sh }} > /opt/toy/greeting
ENTRYPOINT {{ plan.recipe.entrypoint | list | tojson }}
"""


def _sdist(folder: Path, floor: str) -> Path:
    """toy-server 1.0's archive: what its one gate reads is on line 3 of its toy.toml."""
    data = f'[toy]\nname = "toy-server"\ncmake_minimum = "{floor}"\n'.encode()
    path = folder / "toy-server-1.0.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo("toy-server-1.0/toy.toml")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture
def toy_project(project_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A copy of the project with the toy's recipe and template, its archive in the source cache, and the toy
    engine registered for the test's length."""
    cache = tmp_path / "cache"
    (cache / "sources").mkdir(parents=True)
    monkeypatch.setenv("FORGE_CACHE", str(cache))
    _sdist(cache / "sources", "3.24")
    (project_copy / "containers" / "toy.Containerfile.j2").write_text(TEMPLATE)
    (project_copy / "recipes" / "toy.yaml").write_text(
        "target: toy\ndescription: a toy server\ntemplate: toy.Containerfile.j2\nkind: native\nengine: toy\n"
        "device: cpu\nentrypoint: [toy-server]\ngreeting: hello from forge\n"
        f"source:\n  pypi:\n    name: toy-server\n    version: '1.0'\n    sha256: '{'0' * 64}'\n"
        "resources:\n  disk_gb: 1\n  scratch_gb: 0.1\n  ram_per_job_gb: 0.5\n"
    )
    with ENGINES.added(ToyEngine()):
        yield project_copy
    assert "toy" not in ENGINES.names


def _host() -> HostFacts:
    memory = Memory(total=16 * GIB, available=12 * GIB, source="test")
    return HostFacts(memory=memory, cores=4, cpu_flags=frozenset({"avx2"}), mounts=())


def test_the_toy_recipe_loads_by_its_own_model_plans_and_renders(toy_project: Path) -> None:
    project = Project.load(toy_project)
    recipe = project.recipe_for("toy")
    assert isinstance(recipe, ToyRecipe) and recipe.greeting == "hello from forge"
    plan = make_plan(project.distro("debian-12"), recipe, PlanOptions(max_jobs=1))
    assert plan.labels["dev.forge.engine"] == "toy" and plan.context[0].name == "sources/toy-server-1.0.tar.gz"
    text = render(plan, project.containers_dir)
    assert "RUN echo 'hello from forge' > /opt/toy/greeting" in text
    assert text.startswith("# Rendered by Forge") and "recipes/toy.yaml" in text
    assert ("debian-12", "toy") in [(d.name, r.target) for d, r in project.pairs()]


def test_the_cli_plans_the_toy_and_refuses_its_key_in_a_vllm_recipe(
    toy_project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--root", str(toy_project), "plan", "debian-13", "toy"]) == 0
    assert json.loads(capsys.readouterr().out)["labels"]["dev.forge.engine"] == "toy"
    vllm = toy_project / "recipes" / "vllm-cpu.yaml"
    vllm.write_text(vllm.read_text() + "greeting: hello\n")
    with pytest.raises(ConfigError, match="unknown key 'greeting'"):
        _ = Project.load(toy_project).recipes


@pytest.mark.usefixtures("ample_disk")
def test_the_toy_preflight_runs_its_own_gate_beside_the_disk_and_ram_gates(toy_project: Path, tmp_path: Path) -> None:
    project = Project.load(toy_project)
    recipe = project.recipe_for("toy")
    report = run_preflight(
        project,
        project.distro("debian-13"),
        recipe,
        engine=None,
        source=None,
        max_jobs=2,
        scratch_dir=tmp_path,
        host=_host(),
    )
    toy = report.finding("toy-cmake")
    assert toy is not None and toy.passed and toy.source == "toy-server-1.0.tar.gz: toy.toml:3"
    assert report.finding("ram") is not None and report.finding("disk-scratch") is not None
    assert report.max_jobs == 2
    # Debian 12's CMake 3.25 is under the floor a newer archive states: blocked, citing that line.
    _sdist(Path(tmp_path / "cache" / "sources"), "3.28")
    blocked = run_preflight(
        project,
        project.distro("debian-12"),
        recipe,
        engine=None,
        source=None,
        max_jobs=2,
        scratch_dir=tmp_path,
        host=_host(),
    )
    assert blocked.blocked and [f.gate for f in blocked.blocking] == ["toy-cmake"]


def test_a_profile_runs_toy_pools_with_their_own_knobs(toy_project: Path) -> None:
    classes = {c.value: ("toys" if i % 2 else "vllm") for i, c in enumerate(ALL_CLASSES)}
    data: dict[str, Any] = {
        "pools": {"toys": {"engine": "toy", "toy": {"workers": 3}}, "vllm": {"max_num_seqs": 4}},
        "classes": classes,
    }
    profile = profile_from_mapping(data, source="p.yaml", name="p")
    toys = profile.pools["toys"]
    assert isinstance(toys, ToyPool) and toys.max_sequences == 3
    plan = plan_stack(profile, run_id="t", base_port=25800)
    replica = next(r for r in plan.replicas if r.pool == "toys")
    assert replica.engine == "toy" and replica.args[-2:] == ("--workers", "3") and replica.env["TOY_ORDINAL"]
    # vLLM's knob on a toy pool is named as vLLM's; the toy's own limit is the toy's message.
    data["pools"]["toys"] = {"engine": "toy", "max_num_seqs": 4}
    with pytest.raises(ConfigError, match=r"pools\.toys\.max_num_seqs: a vLLM setting, but this pool's engine is toy"):
        profile_from_mapping(data, source="p.yaml", name="p")
    data["pools"]["toys"] = {"engine": "toy", "toy": {"workers": 9}}
    with pytest.raises(ConfigError, match=r"pools\.toys\.toy\.workers: 9 workers on 1 CPU set"):
        profile_from_mapping(data, source="p.yaml", name="p")
    assert '"ToyPool"' in schema_text("profile")


def test_smoke_and_sweep_take_the_toys_image_and_host_binary(toy_project: Path) -> None:
    parser = build_parser()
    for command in ("smoke", "sweep"):
        args = parser.parse_args([command, "--toy-image", "forge/toy:1"])
        assert Runtimes.from_args(args).images == {"toy": "forge/toy:1"}
        args = parser.parse_args([command, "--local-toy", "/usr/bin/true"])
        assert Runtimes.from_args(args).local == {"toy": Path("/usr/bin/true")}


def test_builders_never_names_the_toy() -> None:
    named = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "builders").rglob("*.py")
        if re.search(r"\btoy\b", path.read_text(encoding="utf-8"), flags=re.IGNORECASE)
    ]
    assert named == []
