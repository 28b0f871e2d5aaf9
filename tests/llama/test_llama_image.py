"""The llama-cpp image Forge builds (once per session, shared with the serving tests through llama_image()):
built with the recipe's ISA and no host-chosen one, and serving a Forge-written GGUF when run again here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from builders.container import Engine
from builders.engines import ENGINES, make_plan
from builders.plan import PlanOptions
from builders.project import Project

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "smoke"))
from smoke_helpers import llama_image

pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.image("docker:llama-cpp")]


@pytest.fixture(scope="module")
def image() -> str:
    return llama_image()


def _labels(image: str) -> dict[str, str]:
    out = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{json .Config.Labels}}", image],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    labels: dict[str, str] = json.loads(out)
    return labels


def test_labels_record_the_isa_the_recipe_chose(image: str, project: Project) -> None:
    labels = _labels(image)
    assert labels["dev.forge.engine"] == "llama-cpp"
    recipe = project.recipe_for("llama-cpp")
    enabled = sorted(k.removeprefix("GGML_") for k, v in recipe.isa.items() if v == "ON")
    assert labels["dev.forge.isa"].startswith("GGML_NATIVE=OFF; ON: ")
    assert sorted(labels["dev.forge.isa"].split("ON: ", 1)[1].split()) == enabled
    assert recipe.source is not None and recipe.source.pypi is not None
    assert labels["dev.forge.source.sha256"] == recipe.source.pypi.sha256


def test_the_image_passes_its_test_stage_again(image: str, project: Project, engine: Engine) -> None:
    distro, recipe = project.distro("debian-14"), project.recipe_for("llama-cpp")
    plan = make_plan(distro, recipe, PlanOptions(max_jobs=1))
    results = ENGINES.of(recipe).checks(engine, image, plan)
    assert [r.name for r in results] == ["llama-server-version", "no-compilers", "serve-gguf"]
    failed = [f"{r.name}: {r.detail}" for r in results if not r.ok]
    assert failed == []
    serve = results[-1]
    assert "streamed chat:" in serve.detail and "'tiny'" in serve.detail
