"""Which skips an engine- or server-backed run may take: the allow-list (tests/allowed_skips.toml) and the skips a
pytest run's JUnit XML records that it does not excuse.

A skipped engine test is a proof that did not run. The suite splitter (tests/run_split.py) fails a run with any
skip this module does not excuse, so a host that skips every image-backed test (a small disk, a missing tool)
cannot go green.
"""

from __future__ import annotations

import re
import tomllib
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALLOWED_SKIPS = ROOT / "tests" / "allowed_skips.toml"


@dataclass(frozen=True, kw_only=True)
class Allowed:
    reason: re.Pattern[str]
    tests: tuple[str, ...]
    why: str
    where: str
    ci: bool


@dataclass(frozen=True, kw_only=True)
class Skip:
    test: str  # the JUnit classname and name: tests.smoke.test_podman_stack::test_x
    reason: str
    raised_in: str  # the file the skip was raised in, relative to the root where it lies under it
    kind: str  # pytest.skip or pytest.xfail


class AllowListError(ValueError):
    """The allow-list file is not what tests/allowed_skips.toml's header says an entry is."""


def load_allowed(path: Path = ALLOWED_SKIPS) -> list[Allowed]:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise AllowListError(f"{path}: cannot read the allow-list ({exc})") from exc
    entries = data.get("skip", [])
    if set(data) - {"skip"} or not isinstance(entries, list):
        raise AllowListError(f"{path}: only [[skip]] entries belong here")
    allowed = []
    for number, entry in enumerate(entries, 1):
        keys = {"reason", "tests", "why", "where", "ci"}
        if not isinstance(entry, dict) or set(entry) != keys:
            raise AllowListError(f"{path}: skip entry {number} needs exactly {', '.join(sorted(keys))}")
        texts = [entry["reason"], entry["why"], entry["where"]]
        tests = entry["tests"]
        if not all(isinstance(t, str) and t.strip() for t in texts) or not isinstance(entry["ci"], bool):
            raise AllowListError(f"{path}: skip entry {number}: reason, why and where are text, ci true or false")
        if not isinstance(tests, list) or not tests or not all(isinstance(t, str) and t for t in tests):
            raise AllowListError(f"{path}: skip entry {number}: tests lists the files the skip may come from")
        allowed.append(
            Allowed(
                reason=re.compile(entry["reason"]),
                tests=tuple(tests),
                why=entry["why"],
                where=entry["where"],
                ci=entry["ci"],
            )
        )
    return allowed


def _relative(path: str, root: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(root))
    except ValueError:
        return path


def skips_in(junit_xml: Path, *, root: Path = ROOT) -> list[Skip]:
    """Every skipped or xfailed test case of a pytest --junitxml file."""
    found = []
    for case in ET.parse(junit_xml).getroot().iter("testcase"):
        for skipped in case.findall("skipped"):
            classname = case.get("classname", "")
            test = f"{classname}::{case.get('name', '')}"
            # pytest writes "path:line: reason" for a skip: the file the skip was raised in (a helper's, for a
            # skip in a helper). An xfail carries no location: its test's module stands in.
            text = skipped.text or ""
            located = re.match(r"(.+?\.py):\d+: ", text)
            module = classname.split(".")
            while module and not module[-1].startswith("test"):
                module.pop()
            raised = _relative(located.group(1), root) if located else "/".join(module) + ".py"
            found.append(
                Skip(
                    test=test,
                    reason=skipped.get("message", ""),
                    raised_in=raised,
                    kind=skipped.get("type", "pytest.skip"),
                )
            )
    return found


def excuse(skip: Skip, allowed: list[Allowed], *, ci: bool) -> Allowed | None:
    """The entry that excuses this skip here, or None."""
    for entry in allowed:
        if (ci and not entry.ci) or not entry.reason.search(skip.reason):
            continue
        if any(skip.raised_in == t or skip.raised_in.endswith(f"/{t}") for t in entry.tests):
            return entry
    return None


def unexcused(junit_xml: Path, allowed: list[Allowed], *, ci: bool, root: Path = ROOT) -> list[Skip]:
    return [s for s in skips_in(junit_xml, root=root) if excuse(s, allowed, ci=ci) is None]
