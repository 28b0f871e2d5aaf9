"""`forge schema`: committed schemas match the models, every YAML file names its schema, and validates against it."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from builders.cli import main
from builders.commands.schema import SCHEMAS, modeline, schema_text
from builders.project import Project


def test_committed_schemas_are_current(project: Project) -> None:
    for name in SCHEMAS:
        path = project.root / "schemas" / f"{name}.schema.json"
        assert path.read_text() == schema_text(name), f"{path} is stale: run `forge schema`"
    assert main(["--root", str(project.root), "schema", "--check"]) == 0


def test_check_fails_on_a_stale_schema(project: Project, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--root", str(project.root), "schema", "-o", str(tmp_path)]) == 0
    (tmp_path / "recipe.schema.json").write_text("{}\n")
    # 12: docs/commands.md's code for a stale rendered file, as `forge ci --check` gives a stale workflow.
    assert main(["--root", str(project.root), "schema", "-o", str(tmp_path), "--check"]) == 12
    assert "recipe.schema.json" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_every_file_names_its_schema_and_validates(project: Project, name: str) -> None:
    folder = project.root / SCHEMAS[name][1]
    validator = jsonschema.Draft202012Validator(json.loads(schema_text(name)))
    files = sorted(folder.glob("*.yaml"))
    assert files
    for path in files:
        text = path.read_text()
        assert text.splitlines()[0] == modeline(name), f"{path}: first line must be {modeline(name)!r}"
        errors = [e.message for e in validator.iter_errors(yaml.safe_load(text))]
        assert not errors, f"{path}: {errors}"


def test_the_schema_catches_what_the_loader_catches(project: Project) -> None:
    """A misspelt key is an error for editors too (extra="forbid" becomes additionalProperties: false)."""
    validator = jsonschema.Draft202012Validator(json.loads(schema_text("distro")))
    data = yaml.safe_load((project.root / "distros" / "debian-13.yaml").read_text())
    data["tcmaloc_path"] = data.pop("tcmalloc_path")
    messages = " ".join(e.message for e in validator.iter_errors(data))
    assert "tcmaloc_path" in messages and "tcmalloc_path" in messages
