"""What forge.lock records of a vLLM build's source: its requirement files as the build installs them (through
the build's own filter script, run here) and the torch it installs first. builders/repro/resolve.py asks vLLM's
engine for these; the sdist itself, its epoch and the fetched sources are the lock's own, for every engine."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from builders.config.models import TorchIndex
from builders.engines.serving import LockedRequirements
from builders.engines.vllm.recipe import vllm_recipe
from builders.engines.vllm.source_facts import read_pins
from builders.errors import SourceUnavailable
from builders.plan import PlanOptions, torch_spec
from builders.target import Target


def requirement_lines(text: str) -> tuple[str, ...]:
    lines = []
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            lines.append(" ".join(line.split()))
    return tuple(lines)


def filtered_requirements(containers_dir: Path, sdist: Path, target: Target) -> tuple[LockedRequirements, ...]:
    """vLLM's requirement files as the build installs them: through the same filter script, run here."""
    recipe, device = target.recipe, target.device
    build_file, runtime_files = (
        f"requirements/build/{device}.txt",
        [f"requirements/{device}.txt", "requirements/common.txt"],
    )
    with tempfile.TemporaryDirectory(prefix="forge-lock-") as tmp:
        out = Path(tmp)
        with tarfile.open(sdist) as tar:
            for member in tar.getmembers():
                rel = member.name.split("/", 1)[1] if "/" in member.name else ""
                if member.isfile() and rel in {build_file, *runtime_files}:
                    handle = tar.extractfile(member)
                    (out / rel).parent.mkdir(parents=True, exist_ok=True)
                    (out / rel).write_bytes(handle.read() if handle else b"")
        present = [f for f in (build_file, *runtime_files) if (out / f).exists()]
        drop_cmake = "no" if vllm_recipe(recipe).cmake_from_pip else "yes"
        script = containers_dir / "scripts" / "filter_requirements.py"
        proc = subprocess.run(
            [sys.executable, str(script), f"--drop-cmake={drop_cmake}", *present],
            cwd=out,
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise SourceUnavailable(f"{script.name} failed on {sdist.name}: {proc.stderr.strip()[-400:]}")
        origin = f"{sdist.name}: %s after containers/scripts/filter_requirements.py --drop-cmake={drop_cmake}"
        build_lines = requirement_lines((out / build_file).read_text()) if (out / build_file).exists() else ()
        runtime: list[str] = []
        for name in runtime_files:
            if (out / name).exists():
                runtime += requirement_lines((out / name).read_text())
    return (
        LockedRequirements(name="build", origin=origin % build_file, hashed=False, lines=build_lines),
        LockedRequirements(
            name="runtime", origin=origin % " + ".join(runtime_files), hashed=False, lines=tuple(runtime)
        ),
    )


def torch_requirements(
    sdist: Path, target: Target, version: str | None, index: TorchIndex | None
) -> LockedRequirements:
    """The torch the build installs first: vLLM's pin for this device (or the override), from the chosen index."""
    pin = version or target.recipe.torch.version or read_pins(sdist, target.distro, target.device)[0]
    spec = torch_spec(target, PlanOptions(max_jobs=1, torch_version=pin, torch_index=index))
    if spec is None:
        return LockedRequirements(name="torch", origin="no torch: device none", hashed=False, lines=())
    return LockedRequirements(
        name="torch",
        origin=f"index {spec.index} ({spec.index_url or 'local wheels'})",
        hashed=False,
        lines=(spec.requirement,),
    )
