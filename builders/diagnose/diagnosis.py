"""Find the line that explains a failed build and the rule that names its cause.

How a candidate line is scored (the same text is in builders/diagnose/README.md):

    confidence = weight × step × (0.5·severity + 0.3·position + 0.2·context)

weight    the rule's weight from rules.yaml (its priority, 0 < weight ≤ 1).
severity  how much the line itself reads like a failure, from `line_kinds` in rules.yaml:
          fatal marker 1.0 (0.8 when the line is generic fallout such as `ninja: build stopped`),
          error marker 0.7, no marker 0.4. A line without a marker inherits from the nearest marked line
          up to 3 lines above (`CMake Error at ...:` followed by its indented message): 0.9 below a fatal
          line, 0.63 below an error line, and 0 below a warning. A line whose first marker is a warning
          (or a note) has severity 0 and is never a candidate: warnings never decide.
position  closeness to where the build broke, the larger of two halvings: every 200 lines before the
          end of the log, and every 25 lines away from the first fatal, non-fallout line of the failing
          step (parallel ninja jobs keep printing for hundreds of lines after the real error).
context   0.5, raised to 0.75 by one and to 1.0 by two or more distinct `context_patterns` of the rule
          matching other lines of the failing step.
step      1.0 inside the build step that failed (or when the log has no steps), 0.6 elsewhere: a step that
          completed cannot have caused the failure.

The best candidate wins (ties: higher score, then non-fallout, then heavier rule, then later line). A line
repeated verbatim (BuildKit's closing summary echoes the failing step's last lines) is scored at its best
occurrence and reported at its first occurrence in the failing step. Below CONFIDENCE_THRESHOLD the answer is
`unknown`: a wrong cause sends people the wrong way, an honest `unknown` points them at the first error.
For `unknown`, confidence is 1 − the best candidate's score: how sure it is that no known cause applies.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from builders.diagnose.loglines import LogLine, failing_step, split_log
from builders.diagnose.rules import UNKNOWN, LineKinds, Rule, RuleBook, load_rules
from builders.errors import UsageError

CONFIDENCE_THRESHOLD = 0.5
END_HALF_LIFE_LINES = 200.0
ANCHOR_HALF_LIFE_LINES = 25.0
INHERIT_WINDOW_LINES = 3
OUTSIDE_STEP_FACTOR = 0.6
MAX_EVIDENCE = 8
MAX_ALTERNATIVES = 3


class Alternative(BaseModel):
    """A category that also matched, but scored lower than the answer."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    category: str = Field(description="The rule id that matched.")
    line_number: int = Field(description="1-based line of that rule's best line.")
    confidence: float = Field(description="That rule's score, 0..1.")


class Diagnosis(BaseModel):
    """Why a build failed: the decisive line, its category, and what to do."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    category: str = Field(description="Rule id from rules.yaml, or 'unknown' when no rule is confident.")
    line_number: int | None = Field(
        description="1-based number of the decisive line; for 'unknown', the first error of the failing "
        "step (where to start reading), or None when the log shows no error at all."
    )
    line: str | None = Field(description="The decisive line as it appears in the log, ANSI codes removed.")
    cause: str = Field(description="Why the build failed.")
    remedy: str = Field(description="What to change so the build passes.")
    confidence: float = Field(
        ge=0.0, le=1.0, description="0..1; see this module's docstring for how it is computed."
    )
    evidence: tuple[int, ...] = Field(
        default=(), description="1-based numbers of supporting lines (context and repeats of the cause)."
    )
    alternatives: tuple[Alternative, ...] = Field(
        default=(), description="Other categories that matched, best first, for a person to weigh."
    )

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=2)

    def render(self) -> str:
        lines = [f"diagnosis: {self.category} (confidence {self.confidence:.2f})"]
        if self.line_number is not None:
            lines.append(f"  line {self.line_number}: {self.line}")
        lines.append(f"  cause:  {self.cause}")
        lines.append(f"  remedy: {self.remedy}")
        if self.evidence:
            lines.append("  evidence: lines " + ", ".join(str(n) for n in self.evidence))
        if self.alternatives:
            others = ", ".join(
                f"{alt.category} (line {alt.line_number}, {alt.confidence:.2f})" for alt in self.alternatives
            )
            lines.append(f"  also matched: {others}")
        return "\n".join(lines)


class Kind(Enum):
    FATAL = "fatal"
    ERROR = "error"
    WARNING = "warning"
    PLAIN = "plain"


_OWN_SEVERITY = {Kind.FATAL: 1.0, Kind.ERROR: 0.7, Kind.WARNING: 0.0, Kind.PLAIN: 0.4}
_INHERITED_SEVERITY = {Kind.FATAL: 0.9, Kind.ERROR: 0.63, Kind.WARNING: 0.0}
_FALLOUT_SEVERITY = 0.8


def _alternation(patterns: list[str]) -> re.Pattern[str] | None:
    return re.compile("|".join(f"(?:{p})" for p in patterns)) if patterns else None


@dataclass(frozen=True, slots=True)
class _CompiledKinds:
    fatal: re.Pattern[str]
    error: re.Pattern[str]
    warning: re.Pattern[str]
    fallout: re.Pattern[str] | None

    @classmethod
    def of(cls, kinds: LineKinds) -> _CompiledKinds:
        fatal, error, warning = (_alternation(p) for p in (kinds.fatal, kinds.error, kinds.warning))
        assert fatal is not None and error is not None and warning is not None  # min_length=1 in the model
        return cls(fatal=fatal, error=error, warning=warning, fallout=_alternation(kinds.fallout))

    def kind(self, text: str) -> Kind:
        """The line's kind is its earliest marker; at the same column the longest (most specific) wins."""
        best: tuple[int, int, Kind] | None = None
        for kind, pattern in ((Kind.FATAL, self.fatal), (Kind.ERROR, self.error), (Kind.WARNING, self.warning)):
            match = pattern.search(text)
            if match is not None:
                key = (match.start(), match.start() - match.end(), kind)
                if best is None or key[:2] < best[:2]:
                    best = key
        return Kind.PLAIN if best is None else best[2]

    def is_fallout(self, text: str) -> bool:
        return self.fallout is not None and self.fallout.search(text) is not None


@dataclass(frozen=True, slots=True)
class _CompiledRule:
    rule: Rule
    patterns: re.Pattern[str] | None
    gated: re.Pattern[str] | None
    context: tuple[re.Pattern[str], ...]

    @classmethod
    def of(cls, rule: Rule) -> _CompiledRule:
        return cls(
            rule=rule,
            patterns=_alternation(rule.patterns),
            gated=_alternation(rule.gated_patterns),
            context=tuple(re.compile(p) for p in rule.context_patterns),
        )


@dataclass(frozen=True, slots=True)
class _Candidate:
    rule: Rule
    line: LogLine
    score: float
    fallout: bool


_compiled_cache: dict[int, tuple[RuleBook, _CompiledKinds, tuple[_CompiledRule, ...]]] = {}


def _compile(book: RuleBook) -> tuple[_CompiledKinds, tuple[_CompiledRule, ...]]:
    # Keyed by identity and holding the book alive, so an id is never reused by another book.
    cached = _compiled_cache.get(id(book))
    if cached is None or cached[0] is not book:
        cached = (book, _CompiledKinds.of(book.line_kinds), tuple(_CompiledRule.of(r) for r in book.rules))
        _compiled_cache[id(book)] = cached
    return cached[1], cached[2]


def _severities(lines: list[LogLine], kinds: list[Kind], fallout: list[bool]) -> list[float]:
    severities: list[float] = []
    for index, kind in enumerate(kinds):
        if kind is Kind.PLAIN:
            severity = _OWN_SEVERITY[Kind.PLAIN]
            for back in range(index - 1, max(index - 1 - INHERIT_WINDOW_LINES, -1), -1):
                if kinds[back] is not Kind.PLAIN:
                    severity = _INHERITED_SEVERITY[kinds[back]]
                    break
        elif kind is Kind.FATAL and fallout[index]:
            severity = _FALLOUT_SEVERITY
        else:
            severity = _OWN_SEVERITY[kind]
        severities.append(severity if lines[index].text else 0.0)
    return severities


def diagnose_text(text: str, *, rules: RuleBook | None = None) -> Diagnosis:
    """Diagnose a failed build from its full log text. Never raises on odd input: worst case is 'unknown'."""
    book = rules if rules is not None else load_rules()
    compiled_kinds, compiled_rules = _compile(book)
    lines = split_log(text)
    if not lines:
        return _unknown(None, 0.0, ())
    step = failing_step(lines)
    kinds = [compiled_kinds.kind(line.text) for line in lines]
    fallout = [kind is Kind.FATAL and compiled_kinds.is_fallout(line.text) for kind, line in zip(kinds, lines)]
    severities = _severities(lines, kinds, fallout)

    def in_step(line: LogLine) -> bool:
        return step is None or line.number in step

    anchor = next(
        (
            line.number
            for line, kind, is_fallout in zip(lines, kinds, fallout)
            if kind is Kind.FATAL and not is_fallout and in_step(line)
        ),
        None,
    )
    last_number = lines[-1].number

    def position(number: int) -> float:
        from_end = 0.5 ** ((last_number - number) / END_HALF_LIFE_LINES)
        if anchor is None:
            return from_end
        return max(from_end, 0.5 ** (abs(number - anchor) / ANCHOR_HALF_LIFE_LINES))

    step_lines = [line for line in lines if in_step(line) and line.text]
    context_lines = {
        compiled.rule.id: [
            frozenset(line.number for line in step_lines if pattern.search(line.text))
            for pattern in compiled.context
        ]
        for compiled in compiled_rules
    }
    candidates: list[_Candidate] = []
    for index, line in enumerate(lines):
        severity = severities[index]
        if severity == 0.0:
            continue
        matched: list[tuple[_CompiledRule, int]] = []
        for compiled in compiled_rules:
            plain = compiled.patterns is not None and compiled.patterns.search(line.text) is not None
            gated = compiled.gated is not None and compiled.gated.search(line.text) is not None
            if not (plain or gated):
                continue
            found = sum(1 for numbers in context_lines[compiled.rule.id] if numbers - {line.number})
            if plain or found:
                matched.append((compiled, found))
        if not matched:
            continue
        # A line belongs to the heaviest rules that match it: weight is a rule's specificity, so a
        # generic rule never takes a line that a specific one explains, however much context it found.
        heaviest = max(compiled.rule.weight for compiled, _ in matched)
        for compiled, found in matched:
            if compiled.rule.weight < heaviest:
                continue
            context = 0.5 if found == 0 else 0.75 if found == 1 else 1.0
            score = (
                compiled.rule.weight
                * (1.0 if in_step(line) else OUTSIDE_STEP_FACTOR)
                * (0.5 * severity + 0.3 * position(line.number) + 0.2 * context)
            )
            candidates.append(_Candidate(rule=compiled.rule, line=line, score=score, fallout=fallout[index]))

    if not candidates:
        return _unknown(_first_error(lines, kinds, fallout, in_step), 0.0, ())

    def rank(candidate: _Candidate) -> tuple[float, bool, float, int]:
        return (candidate.score, not candidate.fallout, candidate.rule.weight, candidate.line.number)

    best_per_rule: dict[str, _Candidate] = {}
    for candidate in candidates:
        held = best_per_rule.get(candidate.rule.id)
        if held is None or rank(candidate) > rank(held):
            best_per_rule[candidate.rule.id] = candidate
    ordered = sorted(best_per_rule.values(), key=rank, reverse=True)
    best = ordered[0]
    alternatives = tuple(
        Alternative(category=c.rule.id, line_number=c.line.number, confidence=round(c.score, 2))
        for c in ordered[1 : 1 + MAX_ALTERNATIVES]
    )
    if best.score < CONFIDENCE_THRESHOLD:
        alternatives = tuple(
            Alternative(category=c.rule.id, line_number=c.line.number, confidence=round(c.score, 2))
            for c in ordered[:MAX_ALTERNATIVES]
        )
        return _unknown(_first_error(lines, kinds, fallout, in_step), best.score, alternatives)

    reported = next(
        (line for line in lines if line.text == best.line.text and in_step(line)),
        best.line,
    )
    supporting = {c.line.number for c in candidates if c.rule.id == best.rule.id}
    supporting.update(*context_lines[best.rule.id])
    supporting.discard(reported.number)
    nearest = sorted(supporting, key=lambda n: (abs(n - reported.number), n))[:MAX_EVIDENCE]
    return Diagnosis(
        category=best.rule.id,
        line_number=reported.number,
        line=reported.raw.strip(),
        cause=best.rule.cause.strip(),
        remedy=best.rule.remedy.strip(),
        confidence=round(min(best.score, 1.0), 2),
        evidence=tuple(sorted(nearest)),
        alternatives=alternatives,
    )


def _first_error(
    lines: list[LogLine],
    kinds: list[Kind],
    fallout: list[bool],
    in_step: Callable[[LogLine], bool],
) -> LogLine | None:
    """Where a person should start reading when no rule explains the log."""
    step_lines = [(line, kind, out) for line, kind, out in zip(lines, kinds, fallout) if in_step(line)]
    for line, kind, out in step_lines:
        if kind is Kind.FATAL and not out:
            return line
    for line, kind, _ in reversed(step_lines):
        if kind is Kind.ERROR:
            return line
    for line, kind, _ in reversed(step_lines):
        if kind is Kind.FATAL:
            return line
    return None


def _unknown(line: LogLine | None, best_score: float, alternatives: tuple[Alternative, ...]) -> Diagnosis:
    where = f"line {line.number}" if line is not None else "the end of the log"
    return Diagnosis(
        category=UNKNOWN,
        line_number=line.number if line is not None else None,
        line=line.raw.strip() if line is not None else None,
        cause="No known cause in builders/diagnose/rules.yaml explains this log with enough confidence.",
        remedy=f"Start reading at {where} (the first error of the failing step). If the cause is one Forge "
        "should recognise, add a rule with examples to builders/diagnose/rules.yaml and the log to tests/logs/.",
        confidence=round(1.0 - min(best_score, 1.0), 2),
        alternatives=alternatives,
    )


def read_log(path: Path | str) -> str:
    """A log's text from a file, or from standard input when path is '-'; undecodable bytes are replaced."""
    if str(path) == "-":
        return sys.stdin.buffer.read().decode("utf-8", errors="replace")
    log_path = Path(path)
    try:
        data = log_path.read_bytes()
    except FileNotFoundError as exc:
        raise UsageError(
            f"build log {log_path} does not exist", hint="pass the path of a saved build log, or '-' for stdin"
        ) from exc
    except IsADirectoryError as exc:
        raise UsageError(f"{log_path} is a directory, not a build log", hint="pass a log file") from exc
    except OSError as exc:
        raise UsageError(f"cannot read build log {log_path}: {exc.strerror}", hint="check its permissions") from exc
    return data.decode("utf-8", errors="replace")


def diagnose_file(path: Path | str, *, rules: RuleBook | None = None) -> Diagnosis:
    """Diagnose a failed build from a saved log file ('-' reads standard input)."""
    return diagnose_text(read_log(path), rules=rules)
