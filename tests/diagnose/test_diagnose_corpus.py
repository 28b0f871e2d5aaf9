"""Every log in tests/logs is diagnosed as its file name says, at the line its sidecar names.

A log is `<expected-category>--<short-name>.log` with `<file>.expect.json` beside it holding
`{"line_number": N, "line": "<that line as shown: ANSI codes and progress redraws removed, stripped>"}`
(optionally a `note`). Drop a new
log and its sidecar into tests/logs and it is picked up; see tests/logs/README.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from builders.diagnose import CONFIDENCE_THRESHOLD, UNKNOWN, diagnose_file, load_rules
from builders.diagnose.loglines import split_log

LOGS = Path(__file__).resolve().parents[1] / "logs"
SIDECAR_SUFFIX = ".expect.json"


def _logs() -> list[Path]:
    return sorted(LOGS.glob("*.log"))


def _sidecar(log: Path) -> dict[str, Any]:
    path = log.with_name(log.name + SIDECAR_SUFFIX)
    if not path.exists():
        pytest.fail(
            f"{log.name} has no {path.name}: add one holding the 1-based number and the text of the line "
            'that decides this log, e.g. {"line_number": 812, "line": "c++: fatal error: Killed signal ..."}'
        )
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    assert set(data) <= {"line_number", "line", "note"}, f"{path.name}: unexpected keys {sorted(data)}"
    assert isinstance(data.get("line_number"), int), f"{path.name}: line_number must be an integer"
    assert isinstance(data.get("line"), str), f"{path.name}: line must be the decisive line's text"
    return data


def _expected_category(log: Path) -> str:
    category, sep, rest = log.stem.partition("--")
    assert sep and rest, f"{log.name}: name it <expected-category>--<short-name>.log"
    assert category in load_rules().categories, (
        f"{log.name}: {category!r} is not a category; known: {', '.join(load_rules().categories)}"
    )
    return category


def test_corpus_is_not_empty() -> None:
    assert len(_logs()) >= 20


def test_every_category_has_a_log_and_unknowns_are_several() -> None:
    present = [_expected_category(log) for log in _logs()]
    missing = set(load_rules().categories) - set(present)
    assert not missing, f"no log in tests/logs for: {sorted(missing)}"
    assert present.count(UNKNOWN) >= 3


def test_every_sidecar_has_its_log() -> None:
    orphans = [
        p.name for p in LOGS.glob(f"*{SIDECAR_SUFFIX}") if not p.with_name(p.name[: -len(SIDECAR_SUFFIX)]).exists()
    ]
    assert not orphans, f"sidecars without a log: {orphans}"


@pytest.mark.parametrize("log", _logs(), ids=lambda p: p.stem)
def test_log_is_diagnosed_as_named(log: Path) -> None:
    expected_category = _expected_category(log)
    expected = _sidecar(log)
    lines = split_log(log.read_bytes().decode("utf-8", errors="replace"))
    assert 1 <= expected["line_number"] <= len(lines), f"{log.name}: line_number outside the log"
    at_number = lines[expected["line_number"] - 1].raw.strip()
    assert at_number == expected["line"], (
        f"sidecar of {log.name} is stale: line {expected['line_number']} reads {at_number!r}"
    )

    diagnosis = diagnose_file(log)

    assert diagnosis.category == expected_category, (
        f"{log.name}: expected {expected_category}, got {diagnosis.category} at line {diagnosis.line_number} "
        f"({diagnosis.line!r}), alternatives {diagnosis.alternatives}"
    )
    assert (diagnosis.line_number, diagnosis.line) == (expected["line_number"], expected["line"])
    if expected_category == UNKNOWN:
        assert all(alt.confidence < CONFIDENCE_THRESHOLD for alt in diagnosis.alternatives)
    else:
        assert CONFIDENCE_THRESHOLD <= diagnosis.confidence <= 1.0
