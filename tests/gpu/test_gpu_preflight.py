"""Preflight of the GPU recipe: the mode decides which gates run, the CUDA bases are what is probed, and the
torch gate asks for the plan's torch (the +cu130 build on PyTorch's cu130 index), here from a loopback index."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from builders.config.models import Distro, Recipe, TorchChoice
from builders.container import Engine
from builders.engines import make_plan
from builders.engines.vllm.preflight import COMPILE_GATES
from builders.plan import PlanOptions
from builders.preflight import PreflightReport, run_preflight
from builders.project import Project

SOURCE = Path(__file__).parents[1] / "preflight" / "fixtures" / "vllm-0.33.0"


def preflight(
    project: Project,
    distro: Distro,
    tmp_path: Path,
    mode: str | None,
    *,
    recipe: Recipe | None = None,
    engine: Engine | None = None,
    probe: bool = False,
) -> PreflightReport:
    return run_preflight(
        project,
        distro,
        recipe or project.recipe_for("gpu"),
        engine=engine,
        source=SOURCE,
        max_jobs=None,
        scratch_dir=tmp_path,
        probe=probe,
        gpu_mode=mode,  # type: ignore[arg-type]
    )


def gates_of(report: PreflightReport) -> set[str]:
    return {f.gate for f in (*report.findings, *report.passed)}


def test_wheel_mode_runs_no_compile_gate_and_keeps_torch_python_and_disk(project: Project, tmp_path: Path) -> None:
    report = preflight(project, project.distro("ubi-9"), tmp_path, "wheel")
    found = gates_of(report)
    assert not found & set(COMPILE_GATES), found & set(COMPILE_GATES)
    assert {"torch-wheel", "python", "disk-scratch", "gpu-mode"} <= found
    mode = report.finding("gpu-mode")
    assert mode is not None and mode.found.startswith("wheel") and mode.source == "--gpu-mode"
    assert report.max_jobs == 1


def test_source_mode_runs_the_compile_gates(project: Project, tmp_path: Path) -> None:
    report = preflight(project, project.distro("ubi-9"), tmp_path, "source")
    assert {"gcc", "nvcc-host-gcc", "cuda-glibc-rsqrt", "cmake", "python-cmake", "numa-headers", "ram"} <= gates_of(
        report
    )
    mode = report.finding("gpu-mode")
    assert mode is not None and mode.found.startswith("source") and mode.source == "--gpu-mode"


def test_the_recipe_decides_the_mode_when_none_is_given(project: Project, tmp_path: Path) -> None:
    recipe = project.recipe_for("gpu")
    assert recipe.cuda is not None
    report = preflight(project, project.distro("ubuntu-24.04"), tmp_path, None)
    mode = report.finding("gpu-mode")
    assert mode is not None and mode.found.startswith(recipe.cuda.mode)
    assert mode.source == "recipes/vllm-gpu.yaml: cuda.mode"


@pytest.mark.parametrize(("mode", "stage"), [("source", "devel"), ("wheel", "runtime")])
def test_the_cuda_base_is_what_would_be_probed(project: Project, tmp_path: Path, mode: str, stage: str) -> None:
    ubi9 = project.distro("ubi-9")
    assert ubi9.cuda is not None
    report = preflight(project, ubi9, tmp_path, mode)
    probe = report.finding("probe")
    want = ubi9.cuda.base_image if stage == "devel" else ubi9.cuda.runtime_image
    assert probe is not None and probe.required == f"probe of {want}" and "pull" in probe.remedy


def test_without_the_rsqrt_fix_fedora_44_source_builds_are_blocked(project: Project, tmp_path: Path) -> None:
    f44 = project.distro("fedora-44")
    assert f44.cuda is not None and f44.cuda.glibc_rsqrt_fix
    unfixed = f44.model_copy(update={"cuda": f44.cuda.model_copy(update={"glibc_rsqrt_fix": False})})
    rsqrt = next(f for f in preflight(project, unfixed, tmp_path, "source").blocking if f.gate == "cuda-glibc-rsqrt")
    assert rsqrt.found == "glibc 2.43 with CUDA 13.0" and "toolchain.glibc" in rsqrt.message
    # The same distro in wheel mode compiles nothing, so the headers never meet.
    assert "cuda-glibc-rsqrt" not in gates_of(preflight(project, unfixed, tmp_path, "wheel"))
    fixed = preflight(project, f44, tmp_path, "source").finding("cuda-glibc-rsqrt")
    assert fixed is not None and fixed.passed


def test_the_torch_gate_asks_pytorchs_cuda_index_for_the_plans_torch(project: Project, tmp_path: Path) -> None:
    ubuntu = project.distro("ubuntu-24.04")
    plan = make_plan(ubuntu, project.recipe_for("gpu"), PlanOptions(max_jobs=1, gpu_mode="wheel"))
    assert plan.torch is not None and plan.torch.index_url == "https://download.pytorch.org/whl/cu130"
    torch = preflight(project, ubuntu, tmp_path, "wheel").finding("torch-wheel")
    # Whether download.pytorch.org answers or not, the gate asked for the plan's requirement at the cu130 index.
    assert torch is not None and torch.required == f"{plan.torch.requirement} wheel for cp312 x86_64"
    assert plan.torch.requirement == "torch==2.14.0+cu130"
    assert "https://download.pytorch.org/whl/cu130/torch/" in torch.message


class _Index(http.server.BaseHTTPRequestHandler):
    """A PEP 503 page per path: /<case>/torch/ lists the wheels that case offers."""

    pages: ClassVar[dict[str, list[str]]] = {}

    def do_GET(self) -> None:
        names = self.pages.get(self.path.strip("/").split("/", 1)[0])
        if names is None:
            self.send_error(404)
            return
        body = "".join(f'<a href="/files/{n}">{n}</a>\n' for n in names).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def index() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Index)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    ("case", "wheels", "verdict"),
    [
        ("cu130", ["torch-2.14.0+cu130-cp312-cp312-manylinux_2_28_x86_64.whl"], "pass"),
        # The same torch for another CUDA, or only the CPU build, is not the plan's torch.
        ("cu128", ["torch-2.14.0+cu128-cp312-cp312-manylinux_2_28_x86_64.whl"], "block"),
        ("plain", ["torch-2.14.0-cp312-cp312-manylinux_2_28_x86_64.whl"], "block"),
    ],
)
def test_only_the_build_for_the_bases_cuda_passes(
    project: Project, tmp_path: Path, index: str, case: str, wheels: list[str], verdict: str
) -> None:
    _Index.pages[case] = wheels
    recipe = project.recipe_for("gpu")
    local = recipe.model_copy(
        update={"torch": TorchChoice(version=recipe.torch.version, index="pytorch-cuda", index_url=f"{index}/{case}")}
    )
    torch = preflight(project, project.distro("ubuntu-24.04"), tmp_path, "wheel", recipe=local).finding("torch-wheel")
    assert torch is not None and torch.verdict == verdict, torch
    assert torch.required.startswith("torch==2.14.0+cu130 ")


@pytest.mark.engine
def test_a_cuda_base_that_is_not_local_leaves_declared_facts(project: Project, engine: Engine, tmp_path: Path) -> None:
    ubi9 = project.distro("ubi-9")
    assert ubi9.cuda is not None
    if engine.image_exists(ubi9.cuda.base_image):
        pytest.skip("the CUDA devel base is loaded here")
    report = preflight(project, ubi9, tmp_path, "source", engine=engine, probe=True)
    probe = report.finding("probe")
    assert report.mode == "declared" and probe is not None and ubi9.cuda.base_image in probe.found
    nvcc = report.finding("nvcc-host-gcc")
    assert nvcc is not None and "CUDA_MAX_GCC" in nvcc.source  # no header to read: the table answers
