"""The image speaks for itself, through a real engine: an image whose labels are those of Forge's gpu-wheel build
(arch list and CUDA), made in the engine from an empty rootfs, is judged by `forge smoke IMAGE` and `forge deploy
render --image IMAGE` with no --image-archs; one labelled GPU but without its archs is a usage error."""

from __future__ import annotations

import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from builders.cli import main
from builders.container import Engine
from builders.deploy.command import load_dir

pytestmark = pytest.mark.engine

SMI = Path(__file__).parent / "data" / "nvidia-smi"
ROOT = Path(__file__).resolve().parents[2]


def labelled(engine: Engine, tmp_path: Path, ref: str, labels: dict[str, str]) -> str:
    rootfs = tmp_path / f"{ref.replace('/', '_').replace(':', '_')}.tar"
    with tarfile.open(rootfs, "w"):
        pass
    engine.import_rootfs(str(rootfs), ref, changes=[f'LABEL {k}="{v}"' for k, v in labels.items()])
    return ref


@pytest.fixture
def images(engine: Engine, tmp_path: Path) -> Iterator[dict[str, str]]:
    made = {
        "gpu": labelled(
            engine,
            tmp_path,
            "forge-test/gpu-labels:54",
            {
                "dev.forge.gpu.mode": "pypi-wheels",
                "dev.forge.cuda.arch_list": "7.5 8.0 8.6 8.9 9.0 10.0 12.0",
                "dev.forge.cuda.version": "13.0",
            },
        ),
        "unlabelled": labelled(engine, tmp_path, "forge-test/gpu-no-archs:54", {"dev.forge.gpu.mode": "wheel"}),
    }
    try:
        yield made
    finally:
        for ref in made.values():
            engine.remove_image(ref)


def test_smoke_and_deploy_read_the_images_labels(
    images: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gpu = images["gpu"]
    assert main(["smoke", gpu, "--gpu-query", str(SMI / "v100.csv")]) == 20
    err = capsys.readouterr().err
    assert "Tesla V100-SXM2-16GB (compute capability 7.0" in err
    assert f"{gpu} label dev.forge.cuda.arch_list" in err
    assert main(["smoke", gpu, "--gpu-query", str(SMI / "h100-driver-535.csv")]) == 20
    err = capsys.readouterr().err
    assert "driver 535.183.01" in err and f"CUDA 13.0 runtime (from {gpu} label dev.forge.cuda.version)" in err
    assert main(["smoke", images["unlabelled"], "--gpu-query", str(SMI / "h100.csv")]) == 2
    assert "has no dev.forge.cuda.arch_list label" in capsys.readouterr().err

    out = tmp_path / "k8s"
    argv = ["--root", str(ROOT), "deploy", "render", "--profile", "ci", "--image", gpu, "-o", str(out)]
    assert main(argv) == 0
    pools = [o for o in load_dir(out) if o["kind"] == "Deployment" and "forge/pool" in o["metadata"]["labels"]]
    assert pools and all(
        p["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1" for p in pools
    )
    assert main([*argv[:-1], str(tmp_path / "refused"), "--gpu-query", str(SMI / "l4-driver-570.csv")]) == 20
    assert not (tmp_path / "refused").exists()
