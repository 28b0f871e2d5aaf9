"""The wheelhouse images ship bytecode (issue 41: a replica's start-up), and the test stage checks it.

The image's user cannot write site-packages, so a module without its .pyc is compiled again by every process of
every container. install_wheelhouse.py byte-compiles what it installed; the test stage's import probe lists the
site-packages modules the import loaded that have none. Both run here for real, on a site-packages folder of
this test's own, read by a Python that may not write bytecode (as the image's user cannot)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from builders.engines import make_plan
from builders.engines.vllm.image_tests import BYTECODE_PROBE, ImportProbe, check_bytecode
from builders.plan import PlanOptions
from builders.project import Project

SCRIPT = Path(__file__).resolve().parents[2] / "containers" / "scripts" / "install_wheelhouse.py"


def installer() -> ModuleType:
    spec = importlib.util.spec_from_file_location("install_wheelhouse", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def site(tmp_path: Path) -> Path:
    packages = tmp_path / "venv" / "lib" / "site-packages"
    (packages / "demo").mkdir(parents=True)
    (packages / "demo" / "__init__.py").write_text("from demo.value import VALUE\n")
    (packages / "demo" / "value.py").write_text("VALUE = 1\n")
    # Shipped by real wheels (templates, code for other Pythons): never imported, and no reason to fail.
    (packages / "demo" / "template_py2.py").write_text("print 'not python 3'\n")
    return packages


def probe(packages: Path, code: str = "import demo") -> ImportProbe:
    env = {**os.environ, "PYTHONPATH": str(packages), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", code + "\n" + BYTECODE_PROBE.format()], capture_output=True, text=True, env=env
    )
    return ImportProbe(rc=done.returncode, output=done.stdout + done.stderr, seconds=0.1)


def test_an_install_without_bytecode_fails_the_check_naming_a_module(tmp_path: Path) -> None:
    result = check_bytecode(probe(site(tmp_path)))
    assert not result.ok
    # The demo's two modules, at least (this interpreter's own site-packages may add modules of its .pth files).
    missing = int(result.detail.split(" of ", 1)[0])
    assert missing >= 2 and "imported site-packages modules have no .pyc" in result.detail, result.detail
    assert "demo/value.py" in result.detail or "demo/__init__.py" in result.detail


def test_byte_compiled_modules_pass_and_are_hash_checked(tmp_path: Path) -> None:
    packages = site(tmp_path)
    installer().byte_compile([str(packages)])
    result = check_bytecode(probe(packages))
    assert result.ok and result.detail.endswith(" imported site-packages modules"), result.detail
    pyc = Path(importlib.util.cache_from_source(str(packages / "demo" / "value.py")))
    # PEP 552 flags: 0b11 is hash-based and checked against the source. No mtime in the file, and an edited
    # source is still what runs.
    assert int.from_bytes(pyc.read_bytes()[4:8], "little") == 0b11
    (packages / "demo" / "value.py").write_text("VALUE = 2\n")
    edited = probe(packages, "import demo; print('VALUE', demo.VALUE)")
    assert "VALUE 2" in edited.output


def test_byte_compiling_twice_writes_the_same_bytes(tmp_path: Path) -> None:
    packages = site(tmp_path)
    compile_ = installer().byte_compile
    compile_([str(packages)])
    pyc = Path(importlib.util.cache_from_source(str(packages / "demo" / "value.py")))
    first = pyc.read_bytes()
    pyc.unlink()
    os.utime(packages / "demo" / "value.py", (1, 1))  # a different mtime, as another build's extraction gives
    compile_([str(packages)])
    assert pyc.read_bytes() == first


def test_a_probe_that_never_ran_fails_rather_than_passes() -> None:
    result = check_bytecode(ImportProbe(rc=1, output="ModuleNotFoundError: No module named 'vllm'", seconds=0))
    assert not result.ok and result.detail.startswith("not read")


@pytest.mark.parametrize("target", ["cpu", "cpu-wheel", "gpu-wheel"])
def test_every_vllm_image_checks_its_bytecode(project: Project, target: str) -> None:
    recipe = project.recipe_for(target)
    distro = next(d for d, r in project.pairs() if r.target == target)
    plan = make_plan(distro, recipe, PlanOptions(max_jobs=1, torch_version="2.13.0+cpu"))
    assert "bytecode" in plan.test_checks
