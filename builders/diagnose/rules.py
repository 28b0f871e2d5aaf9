"""Load and validate the diagnosis rule book (rules.yaml): the knowledge lives in data, not in code."""

from __future__ import annotations

import difflib
import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from builders.errors import ConfigError, UsageError
from builders.input_files import read_small_text

DEFAULT_RULES_PATH = Path(__file__).with_name("rules.yaml")
SCHEMA_PATH = Path(__file__).with_name("rules.schema.json")
UNKNOWN = "unknown"
_RULE_ID = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")


_NAMED_GROUP = re.compile(r"\(\?P<\w+>")


def strip_names(pattern: str) -> str:
    """A pattern without its named groups: several patterns may name the same group (`subject`), which one
    alternation cannot hold; the names matter only when the winning line is read again, pattern by pattern."""
    return _NAMED_GROUP.sub("(?:", pattern)


def _compile_all(patterns: list[str], field: str) -> list[str]:
    for index, pattern in enumerate(patterns):
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"{field}[{index}] {pattern!r} is not a valid regex: {exc}") from exc
    try:
        # The engine joins a list into one alternation; a global flag such as a leading (?i) breaks that.
        re.compile("|".join(f"(?:{strip_names(p)})" for p in patterns))
    except re.error as exc:
        raise ValueError(
            f"{field} cannot be combined into one regex ({exc}); use a scoped flag group such as "
            "'(?i:...)' instead of a global '(?i)'"
        ) from exc
    return patterns


class LineKinds(BaseModel):
    """Rule-independent regexes that say how much a log line reads like a failure."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fatal: list[str] = Field(
        min_length=1, description="Markers of a line that reports a hard error (`fatal error:`, `ERROR:`)."
    )
    error: list[str] = Field(
        min_length=1, description="Markers of a line that sounds wrong but may be routine (`failed`, `cannot`)."
    )
    warning: list[str] = Field(
        min_length=1,
        description="Markers of warnings and notes; a line whose first marker is one of these never decides.",
    )
    fallout: list[str] = Field(
        default_factory=list,
        description="Generic consequences of an earlier failure (`ninja: build stopped`, docker's "
        "`did not complete successfully`): they never anchor 'the first error' and are reported for an "
        "unknown failure only when nothing better exists.",
    )

    @field_validator("fatal", "error", "warning", "fallout")
    @classmethod
    def _valid_regexes(cls, value: list[str], info: Any) -> list[str]:
        return _compile_all(value, str(info.field_name))


class Undetermined(BaseModel):
    """Causes a log cannot tell apart when it does not name the filesystem or the tool."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    unless: list[str] = Field(
        min_length=1,
        description="Regexes that settle it on the decisive line itself (a path, the tool that wrote): then, "
        "or when the line names a `subject`, the rule's own cause stands.",
    )
    unless_in_step: list[str] = Field(
        default_factory=list,
        description="Regexes that settle it from any line of the failing step (the kernel's OOM report, "
        "a disk-only writer such as a layer export). Paths elsewhere in the step do not settle it: a "
        "traceback's file names say nothing about which filesystem filled.",
    )
    categories: list[str] = Field(min_length=1, description="The categories the answer could be, the rule's own first.")
    causes: list[str] = Field(min_length=2, description="Each cause the log cannot tell apart, in words.")
    remedy: str = Field(min_length=1, description="The check that tells them apart, and what to do after it.")

    @field_validator("unless", "unless_in_step")
    @classmethod
    def _valid_regexes(cls, value: list[str], info: Any) -> list[str]:
        return _compile_all(value, str(info.field_name))


class Rule(BaseModel):
    """One known cause of a failed build: how to recognise its decisive line, and what to do about it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(description="The category this rule reports, lower-case words joined by '-'.")
    cause: str = Field(min_length=1, description="One or two sentences saying why the build failed.")
    remedy: str = Field(min_length=1, description="What the user should change to make the build pass.")
    weight: float = Field(
        gt=0.0,
        le=1.0,
        description="Priority of the rule: it scales the confidence, and between two rules that match the "
        "same line the heavier wins. A specific rule must outweigh a generic one it overlaps.",
    )
    patterns: list[str] = Field(
        default_factory=list, description="Regexes that identify the decisive line on their own."
    )
    gated_patterns: list[str] = Field(
        default_factory=list,
        description="Regexes that identify the decisive line only when one of context_patterns also "
        "matches in the failing step (pip's 'No matching distribution' means a network failure only when "
        "pip also logged connection errors).",
    )
    warning_patterns: list[str] = Field(
        default_factory=list,
        description="Regexes that identify the decisive line even on a line logged as a warning, for the "
        "few messages that are never harmless whatever level they were logged at (a compiled extension "
        "whose torch symbols are undefined cannot load). Such a line scores as an error line.",
    )
    context_patterns: list[str] = Field(
        default_factory=list,
        description="Regexes for supporting lines (any kind, warnings included) that raise confidence.",
    )
    examples: list[str] = Field(
        min_length=1,
        description="Real-looking log lines that must match this rule and no other rule of equal or "
        "higher weight; checked by the test suite.",
    )
    must_not_fire_on: list[str] = Field(
        default_factory=list,
        description="Categories whose logs this rule must never explain (as the answer or as a close "
        "second): the look-alikes it could be confused with. tests/diagnose checks it on every log in "
        "tests/logs labelled with one of them.",
    )

    subject_label: str | None = Field(
        default=None,
        description="What a pattern's named group `subject` names on the decisive line (`killed tool`, "
        "`host compiler`, `pinning package`); the answer reports it.",
    )
    agree_patterns: list[str] = Field(
        default_factory=list,
        description="Regexes with a named group `version` for lines stating what was asked for (pip's "
        "`The user requested torch==2.1.0`). A candidate line whose own `version` group equals one of "
        "those versions agrees with the request, so it is not the conflict and is skipped.",
    )
    undetermined: Undetermined | None = Field(
        default=None,
        description="When the log cannot say which of several causes it is (ENOSPC with no path, `Killed` "
        "with no tool), the causes it cannot tell apart and the check that tells them apart.",
    )

    @field_validator("id")
    @classmethod
    def _id_shape(cls, value: str) -> str:
        if not _RULE_ID.match(value):
            raise ValueError(f"id {value!r} must be lower-case words joined by '-', e.g. 'disk-full'")
        if value == UNKNOWN:
            raise ValueError(f"id {UNKNOWN!r} is reserved for logs no rule explains")
        return value

    @field_validator("patterns", "gated_patterns", "warning_patterns", "context_patterns", "agree_patterns")
    @classmethod
    def _valid_regexes(cls, value: list[str], info: Any) -> list[str]:
        return _compile_all(value, str(info.field_name))

    @model_validator(mode="after")
    def _has_a_way_to_match(self) -> Rule:
        if not self.patterns and not self.gated_patterns:
            raise ValueError("needs at least one entry in patterns or gated_patterns")
        if self.gated_patterns and not self.context_patterns:
            raise ValueError("gated_patterns need context_patterns to open the gate")
        if self.undetermined is not None and self.undetermined.categories[0] != self.id:
            raise ValueError(f"undetermined.categories must start with the rule's own id {self.id!r}")
        for pattern in self.agree_patterns:
            if "version" not in re.compile(pattern).groupindex:
                raise ValueError(f"agree_patterns {pattern!r} needs a named group (?P<version>...)")
        return self


class RuleBook(BaseModel):
    """The whole rules.yaml: how to read lines, and the known causes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    line_kinds: LineKinds = Field(description="How error-like each log line is, independent of any rule.")
    rules: list[Rule] = Field(min_length=1, description="Known causes of failed builds.")

    @model_validator(mode="after")
    def _unique_ids(self) -> RuleBook:
        seen: set[str] = set()
        for rule in self.rules:
            if rule.id in seen:
                raise ValueError(f"rule id {rule.id!r} appears twice; each category has exactly one rule")
            seen.add(rule.id)
        for rule in self.rules:
            for other in rule.must_not_fire_on:
                if other not in seen and other != UNKNOWN:
                    close = difflib.get_close_matches(other, sorted(seen), n=1)
                    hint = f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(sorted(seen))}"
                    raise ValueError(f"rule {rule.id!r}: must_not_fire_on names no rule {other!r}{hint}")
                if other == rule.id:
                    raise ValueError(f"rule {rule.id!r}: must_not_fire_on cannot name the rule itself")
            for other in rule.undetermined.categories if rule.undetermined is not None else []:
                if other not in seen:
                    raise ValueError(f"rule {rule.id!r}: undetermined.categories names no rule {other!r}")
        return self

    @property
    def categories(self) -> tuple[str, ...]:
        return (*(rule.id for rule in self.rules), UNKNOWN)

    def rule(self, rule_id: str) -> Rule:
        for rule in self.rules:
            if rule.id == rule_id:
                return rule
        raise KeyError(rule_id)


def _child(node: Any, key: int | str) -> Any:
    if isinstance(node, dict):
        return node.get(key)
    if isinstance(node, list) and isinstance(key, int) and 0 <= key < len(node):
        return node[key]
    return None


def _describe_location(loc: tuple[int | str, ...], raw: Any) -> str:
    """Turn pydantic's ('rules', 3, 'paterns') into "rules[3] (rule 'disk-full').paterns"."""
    parts: list[str] = []
    node = raw
    for index, key in enumerate(loc):
        node = _child(node, key)
        if isinstance(key, int):
            rule_id = node.get("id") if isinstance(node, dict) else None
            named = loc[:1] == ("rules",) and index == 1 and isinstance(rule_id, str)
            parts.append(f"[{key}] (rule {rule_id!r})" if named else f"[{key}]")
        else:
            parts.append(f".{key}" if parts else key)
    return "".join(parts) or "<top level>"


def _model_for(loc: tuple[int | str, ...]) -> type[BaseModel]:
    if loc[:1] == ("rules",) and len(loc) >= 3:
        return Rule
    if loc[:1] == ("line_kinds",) and len(loc) >= 2:
        return LineKinds
    return RuleBook


def _explain(exc: ValidationError, raw: Any, source: str) -> ConfigError:
    lines: list[str] = []
    hints: list[str] = []
    for error in exc.errors():
        loc = tuple(error["loc"])
        where = _describe_location(loc, raw)
        if error["type"] == "extra_forbidden":
            key = str(loc[-1])
            valid = sorted(_model_for(loc).model_fields)
            close = difflib.get_close_matches(key, valid, n=1)
            if close:
                lines.append(f"{where}: unknown key {key!r}; did you mean {close[0]!r}?")
                hints.append(f"rename {key!r} to {close[0]!r} at {where}")
            else:
                lines.append(f"{where}: unknown key {key!r}; valid keys are {', '.join(valid)}")
                hints.append(f"remove {key!r} at {where}")
        else:
            lines.append(f"{where}: {error['msg']}")
    message = f"{source} is not a valid rule book:\n  " + "\n  ".join(lines)
    hint = "; ".join(hints) if hints else "fix the entries named above (see builders/diagnose/README.md)"
    return ConfigError(message, hint=hint)


def parse_rules(text: str, *, source: str = "rules.yaml") -> RuleBook:
    """Validate rule-book YAML text; every problem names the rule id and key path."""
    try:
        # libyaml where PyYAML has it: every `forge diagnose` parses the 900-line rule book, half a second in
        # pure Python here.
        raw = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source} is not valid YAML: {exc}", hint="fix the YAML syntax") from exc
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{source} must be a mapping with keys 'line_kinds' and 'rules', found {type(raw).__name__}",
            hint="start the file with 'line_kinds:' and 'rules:'",
        )
    try:
        return RuleBook.model_validate(raw)
    except ValidationError as exc:
        raise _explain(exc, raw, source) from exc


def load_rules(path: Path | None = None) -> RuleBook:
    """The rule book at `path`, or Forge's own rules.yaml (parsed once per process)."""
    if path is None:
        return _default_rules()
    try:
        text = read_small_text(path, limit=16 * 2**20, what="rule book", hint="pass an existing rules.yaml")
    except UsageError as exc:
        raise ConfigError(exc.message, hint=exc.hint) from None
    return parse_rules(text, source=str(path))


@cache
def _default_rules() -> RuleBook:
    return parse_rules(DEFAULT_RULES_PATH.read_text(encoding="utf-8"), source=str(DEFAULT_RULES_PATH))


def rules_json_schema() -> str:
    """JSON schema of rules.yaml, for editors (rules.yaml names it) and for the staleness test."""
    return json.dumps(RuleBook.model_json_schema(), indent=2, ensure_ascii=False) + "\n"


def write_schema() -> Path:
    """Rewrite rules.schema.json after a model change."""
    SCHEMA_PATH.write_text(rules_json_schema(), encoding="utf-8")
    return SCHEMA_PATH
