"""rules.yaml is valid data: its examples match their own rule only, and a broken rule book is explained."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from builders.diagnose import UNKNOWN, Rule, diagnose_text, load_rules, parse_rules
from builders.diagnose.rules import DEFAULT_RULES_PATH, SCHEMA_PATH, rules_json_schema
from builders.errors import ConfigError

BOOK = load_rules()
EXAMPLES = [(rule.id, example) for rule in BOOK.rules for example in rule.examples]


def _matches(patterns: list[str], line: str) -> bool:
    return any(re.search(pattern, line) for pattern in patterns)


def test_required_categories_are_present() -> None:
    required = {
        "gcc-gate", "cmake-too-old", "missing-header", "disk-full", "oom-killed", "torch-mismatch",
        "network-fetch", "isa-unsupported", "python-unsupported", "tcmalloc-preload", "tls-untrusted",
        "shm-too-small", "cmake-policy", "missing-library", "cuda-mismatch", "cuda-home-unset",
        "cuda-arch-unsupported",
        # issue 15: bootstrap failures say what happened
        "release-expired", "release-not-yet-valid", "mirror-unreachable", "archive-key",
    }  # fmt: skip
    assert required <= set(BOOK.categories)
    assert UNKNOWN in BOOK.categories


@pytest.mark.parametrize(("rule_id", "example"), EXAMPLES, ids=[f"{r}:{i}" for i, (r, _) in enumerate(EXAMPLES)])
def test_example_matches_its_rule_and_no_heavier_rule(rule_id: str, example: str) -> None:
    own = BOOK.rule(rule_id)
    assert _matches(own.patterns + own.gated_patterns, example), f"{rule_id} does not match its example"
    # Gated patterns need context to count, so only the patterns that decide alone can steal a line.
    rivals = [
        other.id
        for other in BOOK.rules
        if other.id != rule_id and other.weight >= own.weight and _matches(other.patterns, example)
    ]
    assert not rivals, f"{rule_id}'s example is also claimed by {rivals}, which weigh as much or more"


@pytest.mark.parametrize(("rule_id", "example"), EXAMPLES, ids=[f"{r}:{i}" for i, (r, _) in enumerate(EXAMPLES)])
def test_example_alone_is_never_another_category(rule_id: str, example: str) -> None:
    assert diagnose_text(example).category in {rule_id, UNKNOWN}


def _raw() -> dict[str, object]:
    data = yaml.safe_load(DEFAULT_RULES_PATH.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def _with_rule_change(**changes: object) -> str:
    data = _raw()
    rules = data["rules"]
    assert isinstance(rules, list)
    rules[1] = {**rules[1], **changes}
    return yaml.safe_dump(data, allow_unicode=True)


def test_unknown_key_names_the_rule_and_suggests_the_closest_key() -> None:
    data = _raw()
    rules = data["rules"]
    assert isinstance(rules, list)
    rule = dict(rules[1])
    rule["paterns"] = rule.pop("patterns")
    rules[1] = rule
    with pytest.raises(ConfigError) as caught:
        parse_rules(yaml.safe_dump(data, allow_unicode=True), source="book.yaml")
    text = caught.value.render()
    assert f"rule {rule['id']!r}" in text
    assert "unknown key 'paterns'; did you mean 'patterns'?" in text
    assert "rename 'paterns' to 'patterns'" in text
    assert "book.yaml" in text


def test_unknown_key_in_line_kinds_suggests_the_closest_key() -> None:
    data = _raw()
    kinds = data["line_kinds"]
    assert isinstance(kinds, dict)
    kinds["warnings"] = kinds.pop("warning")
    with pytest.raises(ConfigError, match="unknown key 'warnings'; did you mean 'warning'"):
        parse_rules(yaml.safe_dump(data, allow_unicode=True))


def test_invalid_regex_names_rule_field_and_index() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_rules(_with_rule_change(context_patterns=["fine", "(unclosed"]))
    text = caught.value.render()
    assert f"rule {BOOK.rules[1].id!r}" in text
    assert "context_patterns[1]" in text
    assert "not a valid regex" in text


def test_global_inline_flag_is_refused_with_the_scoped_form_suggested() -> None:
    with pytest.raises(ConfigError, match=r"\(\?i:\.\.\.\)"):
        parse_rules(_with_rule_change(patterns=["first", "(?i)second"]))


def test_gated_patterns_without_context_are_refused() -> None:
    with pytest.raises(ConfigError, match="gated_patterns need context_patterns"):
        parse_rules(_with_rule_change(gated_patterns=["x"], context_patterns=[]))


def test_rule_without_examples_is_refused() -> None:
    with pytest.raises(ConfigError, match="examples"):
        parse_rules(_with_rule_change(examples=[]))


@pytest.mark.parametrize("bad_id", ["unknown", "Disk_Full", "disk full"])
def test_bad_or_reserved_ids_are_refused(bad_id: str) -> None:
    with pytest.raises(ConfigError, match="id"):
        parse_rules(_with_rule_change(id=bad_id))


def test_duplicate_ids_are_refused() -> None:
    with pytest.raises(ConfigError, match="appears twice"):
        parse_rules(_with_rule_change(id=BOOK.rules[0].id))


def test_not_a_mapping_and_bad_yaml_are_explained() -> None:
    with pytest.raises(ConfigError, match="must be a mapping"):
        parse_rules("- just\n- a list\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        parse_rules("rules: [unclosed\n")


def test_missing_rule_book_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"rule book .*absent\.yaml does not exist"):
        load_rules(tmp_path / "absent.yaml")


def test_a_rule_book_from_a_file_is_used(tmp_path: Path) -> None:
    data = _raw()
    rules = data["rules"]
    assert isinstance(rules, list)
    rules.append(
        Rule(
            id="externally-managed",
            cause="pip refuses to install into the distro's Python.",
            remedy="Create a venv first.",
            weight=0.9,
            patterns=["error: externally-managed-environment"],
            examples=["error: externally-managed-environment"],
        ).model_dump()
    )
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    log = "Step 4/4 : RUN pip install vllm\n ---> Running in 1f2e\nerror: externally-managed-environment\n"
    assert diagnose_text(log).category == UNKNOWN
    assert diagnose_text(log, rules=load_rules(path)).category == "externally-managed"


def test_json_schema_file_is_current() -> None:
    assert SCHEMA_PATH.read_text(encoding="utf-8") == rules_json_schema(), (
        "builders/diagnose/rules.schema.json is stale: run "
        "`python -c 'from builders.diagnose.rules import write_schema; write_schema()'`"
    )


def test_must_not_fire_on_names_known_rules_and_suggests_the_closest() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_rules(_with_rule_change(must_not_fire_on=["disk-ful"]), source="book.yaml")
    text = caught.value.render()
    assert "must_not_fire_on names no rule 'disk-ful'; did you mean 'disk-full'?" in text
