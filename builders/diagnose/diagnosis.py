"""Find the line that explains a failed build and the rule that names its cause.

Every line that a rule's pattern matches is a candidate, scored (the same text is in README.md here):

    confidence = weight × step × (0.5·severity + 0.3·position + 0.2·context)

weight    the rule's weight from rules.yaml (its priority, 0 < weight ≤ 1). A line belongs to the heaviest
          rules that match it, so a specific rule keeps its line against a generic one.
severity  how much the line reads like a failure, from `line_kinds` in rules.yaml: fatal marker 1.0 (0.8 for
          generic fallout such as `ninja: build stopped`), error marker 0.7, no marker 0.4. An indented line
          under a less indented one within 4 lines is that message's body (`CMake Error at ...:` then its
          text): below a fatal line it is worth at least 0.9 of it, below a warning it is 0. A line whose
          earliest marker is a warning or a note is 0 and never a candidate: warnings never decide, except
          through a rule's `warning_patterns` (messages never harmless at any level), scored as an error line.
position  closeness to where the build broke, the larger of two halvings: one per 200 lines before the end
          of the log, and one per 25 lines away from the anchor, the first fatal line of the failing step
          that is neither fallout nor also printed by a step that completed (parallel ninja jobs keep
          printing for hundreds of lines after the real error).
context   0.5, raised to 0.75 by one and to 1.0 by two or more of the rule's `context_patterns` matching
          other lines of the failing step. A rule's `gated_patterns` count only when one did.
step      1.0 inside the build step that failed (or when the log has no steps), 0.6 elsewhere: a step that
          completed cannot have caused the failure.

The best candidate wins (ties: non-fallout, then heavier rule, then later line). A message repeated verbatim
(BuildKit's closing summary echoes the failing step's last lines; vLLM logs an exception, then re-raises it)
is scored at its best occurrence and reported at its first occurrence in the failing step; when the winning
rule matched several lines that score within SAME_CAUSE_MARGIN of the best (apt's one `E:` per repository),
the first of them is reported. Below CONFIDENCE_THRESHOLD the answer is `unknown`, pointing at the anchor: a
wrong cause sends people the wrong way.

Confidence means one thing for every answer: how strongly the reported line supports the answer, by the
formula above. `unknown` is scored as the catch-all rule: its line is the first error of the failing step,
its weight is UNKNOWN_WEIGHT (= CONFIDENCE_THRESHOLD) and no context supports it, so an `unknown` is never
more confident than the least a named cause needs, and is 0 when nothing in the log reads like an error.
A runner-up above the threshold and within CLOSE_MARGIN of the answer is flagged `close`: the log supports
both causes nearly as well, and both are shown.
"""

from __future__ import annotations

import json
import math
import re
import textwrap
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from builders.diagnose.loglines import LogLine, failing_step, split_log, split_window
from builders.diagnose.rules import UNKNOWN, LineKinds, Rule, RuleBook, load_rules, strip_names
from builders.diagnose.window import FULL_BYTES, FULL_LINES, LOG_LIMIT_BYTES, Window, open_log, select
from builders.errors import UsageError
from builders.redact import mask_urls

CONFIDENCE_THRESHOLD = 0.5
END_HALF_LIFE_LINES = 200.0
ANCHOR_HALF_LIFE_LINES = 25.0
INHERIT_WINDOW_LINES = 4
INHERIT_FACTOR = 0.9
OUTSIDE_STEP_FACTOR = 0.6
MAX_EVIDENCE = 8
MAX_ALTERNATIVES = 3
SAME_CAUSE_MARGIN = 0.1
CLOSE_MARGIN = 0.1
UNKNOWN_WEIGHT = CONFIDENCE_THRESHOLD


class Alternative(BaseModel):
    """A category that also matched, but scored lower than the answer."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    category: str = Field(description="The rule id that matched.")
    line_number: int = Field(description="1-based line of that rule's best line.")
    confidence: float = Field(description="That rule's score, 0..1.")
    close: bool = Field(
        default=False,
        description="Above the threshold and within CLOSE_MARGIN of the answer: a second cause as likely, "
        "shown next to the answer.",
    )
    cause: str = Field(default="", description="That rule's cause, so that a close second can be read as one.")


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
    confidence: float = Field(ge=0.0, le=1.0, description="0..1; see this module's docstring for how it is computed.")
    evidence: tuple[int, ...] = Field(
        default=(), description="1-based numbers of supporting lines (context and repeats of the cause)."
    )
    alternatives: tuple[Alternative, ...] = Field(
        default=(), description="Other categories that matched, best first, for a person to weigh."
    )
    subject: str | None = Field(
        default=None,
        description="What the decisive line names, read from its structure: the killed tool (`ld`, "
        "`cc1plus`, `ptxas`), the rejected host compiler, the package pinning torch.",
    )
    subject_label: str | None = Field(default=None, description="What `subject` is (`killed tool`, ...).")
    cannot_tell_apart: tuple[str, ...] = Field(
        default=(),
        description="When the log does not say which filesystem filled or which tool was killed: the "
        "causes it cannot tell apart (the remedy is then the check that tells them apart). Empty otherwise.",
    )
    possible_categories: tuple[str, ...] = Field(
        default=(),
        description="With cannot_tell_apart, the categories the answer could be; `category` is the first.",
    )
    read: str | None = Field(
        default=None,
        description="For a log too long to read whole (builders/diagnose/window.py): which of its lines the rules "
        "read, and what was cut. None: every line.",
    )

    def to_dict(self) -> dict[str, object]:
        """Plain JSON-ready data, the shape `forge diagnose --json` prints and build reports store."""
        data: dict[str, object] = self.model_dump(mode="json")
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False)

    def render(self, width: int = 100) -> str:
        """A few lines for a person: what, where, why, what to do."""
        verdict = f"confidence {self.confidence:.2f}"
        if self.category == UNKNOWN:
            verdict += f"; no known cause reached {CONFIDENCE_THRESHOLD:.2f}"
        headline = self.category
        if self.cannot_tell_apart:
            headline = " or ".join(self.possible_categories)
            verdict = f"the log cannot tell which; {verdict}"
        lines = [f"diagnosis: {headline} ({verdict})"]
        if self.line_number is not None:
            shown = self.line if len(self.line or "") <= 2 * width else f"{(self.line or '')[: 2 * width]} ..."
            lines.append(f"  line {self.line_number}: {shown}")
        if self.subject is not None:
            lines.append(f"  {self.subject_label or 'subject'}: {self.subject}")
        for label, text in (("cause: ", self.cause), ("remedy:", self.remedy)):
            lines.append(textwrap.fill(text, width=width, initial_indent=f"  {label} ", subsequent_indent=" " * 10))
        if self.evidence:
            lines.append("  evidence: lines " + ", ".join(str(n) for n in self.evidence))
        for alt in self.alternatives:
            if alt.close:
                lines.append(
                    textwrap.fill(
                        f"{alt.category} (line {alt.line_number}, confidence {alt.confidence:.2f}): {alt.cause}",
                        width=width,
                        initial_indent="  or, as likely: ",
                        subsequent_indent=" " * 10,
                    )
                )
        others = [alt for alt in self.alternatives if not alt.close]
        if others:
            listed = ", ".join(f"{alt.category} (line {alt.line_number}, {alt.confidence:.2f})" for alt in others)
            lines.append(f"  also matched: {listed}")
        if self.read is not None:
            lines.append(textwrap.fill(self.read, width=width, initial_indent="  read:   ", subsequent_indent=" " * 10))
        return "\n".join(lines)


class Kind(Enum):
    FATAL = "fatal"
    ERROR = "error"
    WARNING = "warning"
    PLAIN = "plain"


_OWN_SEVERITY = {Kind.FATAL: 1.0, Kind.ERROR: 0.7, Kind.WARNING: 0.0, Kind.PLAIN: 0.4}
_FALLOUT_SEVERITY = 0.8


def _alternation(patterns: list[str]) -> re.Pattern[str] | None:
    return re.compile("|".join(f"(?:{strip_names(p)})" for p in patterns)) if patterns else None


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
        """A line whose earliest marker is a warning is a warning (`warning: unused variable 'error'`); at the
        same column the longer, more specific marker wins. Otherwise the strongest marker present decides."""
        found: dict[Kind, tuple[int, int]] = {}
        for kind, pattern in ((Kind.FATAL, self.fatal), (Kind.ERROR, self.error), (Kind.WARNING, self.warning)):
            match = pattern.search(text)
            if match is not None:
                found[kind] = (match.start(), match.start() - match.end())
        if not found:
            return Kind.PLAIN
        if Kind.WARNING in found and found[Kind.WARNING] == min(found.values()):
            return Kind.WARNING
        return Kind.FATAL if Kind.FATAL in found else Kind.ERROR

    def is_fallout(self, text: str) -> bool:
        return self.fallout is not None and self.fallout.search(text) is not None


@dataclass(frozen=True, slots=True)
class _CompiledRule:
    rule: Rule
    patterns: re.Pattern[str] | None
    gated: re.Pattern[str] | None
    in_warnings: re.Pattern[str] | None
    context: tuple[re.Pattern[str], ...]
    singles: tuple[re.Pattern[str], ...]
    """Each deciding pattern on its own, named groups kept: read again on a line they chose."""
    agree: tuple[re.Pattern[str], ...]
    unless: re.Pattern[str] | None
    unless_in_step: re.Pattern[str] | None

    @classmethod
    def of(cls, rule: Rule) -> _CompiledRule:
        return cls(
            rule=rule,
            patterns=_alternation(rule.patterns),
            gated=_alternation(rule.gated_patterns),
            in_warnings=_alternation(rule.warning_patterns),
            context=tuple(re.compile(p) for p in rule.context_patterns),
            singles=tuple(re.compile(p) for p in (*rule.patterns, *rule.gated_patterns, *rule.warning_patterns)),
            agree=tuple(re.compile(p) for p in rule.agree_patterns),
            unless=_alternation(rule.undetermined.unless) if rule.undetermined is not None else None,
            unless_in_step=_alternation(rule.undetermined.unless_in_step) if rule.undetermined is not None else None,
        )

    def group(self, text: str, name: str) -> str | None:
        """The first deciding pattern's named group `name` on this line, if any pattern names it."""
        for pattern in self.singles:
            if name not in pattern.groupindex:
                continue
            match = pattern.search(text)
            if match is not None and match.group(name):
                return match.group(name)
        return None


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
        if len(_compiled_cache) >= 8:
            _compiled_cache.clear()
        cached = (book, _CompiledKinds.of(book.line_kinds), tuple(_CompiledRule.of(r) for r in book.rules))
        _compiled_cache[id(book)] = cached
    return cached[1], cached[2]


def _parent(lines: list[LogLine], index: int) -> int | None:
    """The line a continuation line belongs to: the nearest non-blank line above that is less indented."""
    indent = lines[index].indent
    for back in range(index - 1, max(index - 1 - INHERIT_WINDOW_LINES, -1), -1):
        if lines[back].text and lines[back].indent < indent:
            return back
    return None


def _severities(lines: list[LogLine], kinds: list[Kind], fallout: list[bool]) -> list[float]:
    own: list[float] = []
    for line, kind, is_fallout in zip(lines, kinds, fallout, strict=True):
        if not line.text:
            own.append(0.0)
        elif kind is Kind.FATAL and is_fallout:
            own.append(_FALLOUT_SEVERITY)
        else:
            own.append(_OWN_SEVERITY[kind])
    severities: list[float] = []
    for index, kind in enumerate(kinds):
        severity = own[index]
        if kind in (Kind.PLAIN, Kind.ERROR) and severity > 0.0:
            # An indented line under `CMake Error at ...:` or under a compiler warning is that message's
            # body, not a message of its own: it is as serious as its header.
            parent = _parent(lines, index)
            if parent is not None and kinds[parent] is Kind.WARNING:
                severity = 0.0
            elif parent is not None and kinds[parent] is Kind.FATAL:
                severity = max(severity, INHERIT_FACTOR * own[parent])
        severities.append(severity)
    return severities


@dataclass(frozen=True, slots=True)
class _LogView:
    """A log split into lines, each with its kind and severity, and where the build broke."""

    lines: list[LogLine]
    kinds: list[Kind]
    fallout: list[bool]
    severities: list[float]
    step: frozenset[int] | None
    survived: frozenset[str]
    anchor: LogLine | None
    """The first fatal line of the failing step that is neither fallout nor seen in a completed step."""
    last: int
    """The number of the log's last line (a window of a long log ends before it may)."""
    index: dict[int, int]
    """Line number -> position in `lines` (a window's numbers are not its positions)."""

    @classmethod
    def of(
        cls, lines: list[LogLine], kinds_of: _CompiledKinds, *, window: tuple[frozenset[int] | None, int] | None = None
    ) -> _LogView:
        """window: for a window of a long log, the failing step's lines within it and the log's last line."""
        kinds = [kinds_of.kind(line.text) for line in lines]
        fallout = [
            kind is Kind.FATAL and kinds_of.is_fallout(line.text) for kind, line in zip(kinds, lines, strict=True)
        ]
        step, last = window if window is not None else (failing_step(lines), lines[-1].number)
        # A message that also appears in a step that completed did not stop that step: it is background
        # noise (a loader complaining about LD_PRELOAD in every RUN), not where this build broke.
        survived = frozenset(line.text for line in lines if step is not None and line.number not in step and line.text)
        anchor = next(
            (
                line
                for line, kind, is_fallout in zip(lines, kinds, fallout, strict=True)
                if kind is Kind.FATAL
                and not is_fallout
                and (step is None or line.number in step)
                and line.text not in survived
            ),
            None,
        )
        return cls(
            lines=lines,
            kinds=kinds,
            fallout=fallout,
            severities=_severities(lines, kinds, fallout),
            step=step,
            survived=survived,
            anchor=anchor,
            last=last,
            index={line.number: i for i, line in enumerate(lines)},
        )

    def in_step(self, line: LogLine) -> bool:
        return self.step is None or line.number in self.step

    def position(self, number: int) -> float:
        from_end = math.pow(0.5, (self.last - number) / END_HALF_LIFE_LINES)
        if self.anchor is None:
            return from_end
        return max(from_end, math.pow(0.5, abs(number - self.anchor.number) / ANCHOR_HALF_LIFE_LINES))

    def first_error(self) -> LogLine | None:
        """Where a person should start reading when no rule explains the log."""
        if self.anchor is not None:
            return self.anchor
        in_step = [(line, kind) for line, kind in zip(self.lines, self.kinds, strict=True) if self.in_step(line)]
        for line, kind in in_step:
            if kind is Kind.ERROR:
                return line
        # Only fallout is left (a CalledProcessError, its traceback): the earliest of it is where the
        # failure first shows; the traceback it raises after it only repeats it.
        return next((line for line, kind in in_step if kind is Kind.FATAL), None)


def _candidates(
    view: _LogView, compiled_rules: tuple[_CompiledRule, ...]
) -> tuple[list[_Candidate], dict[str, set[int]]]:
    step_lines = [line for line in view.lines if view.in_step(line) and line.text]
    context_lines = {
        compiled.rule.id: [
            frozenset(line.number for line in step_lines if pattern.search(line.text)) for pattern in compiled.context
        ]
        for compiled in compiled_rules
    }
    # What was asked for (pip's `The user requested torch==2.1.0`): a pin that agrees with it is no conflict.
    requested = {
        compiled.rule.id: {
            match.group("version") for line in step_lines for p in compiled.agree if (match := p.search(line.text))
        }
        for compiled in compiled_rules
        if compiled.agree
    }
    candidates: list[_Candidate] = []
    for index, line in enumerate(view.lines):
        severity = view.severities[index]
        # A warning decides only through a rule's warning_patterns, and then as an error line would.
        in_warning = severity == 0.0 and view.kinds[index] is Kind.WARNING and bool(line.text)
        if in_warning:
            severity = _OWN_SEVERITY[Kind.ERROR]
        elif severity == 0.0:
            continue
        matched: list[tuple[_CompiledRule, int]] = []
        for compiled in compiled_rules:
            if in_warning:
                if compiled.in_warnings is not None and compiled.in_warnings.search(line.text) is not None:
                    matched.append((compiled, sum(1 for n in context_lines[compiled.rule.id] if n - {line.number})))
                continue
            plain = compiled.patterns is not None and compiled.patterns.search(line.text) is not None
            gated = compiled.gated is not None and compiled.gated.search(line.text) is not None
            if not (plain or gated):
                continue
            found = sum(1 for numbers in context_lines[compiled.rule.id] if numbers - {line.number})
            asked = requested.get(compiled.rule.id)
            if asked and compiled.group(line.text, "version") in asked:
                continue
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
                * (1.0 if view.in_step(line) else OUTSIDE_STEP_FACTOR)
                * (0.5 * severity + 0.3 * view.position(line.number) + 0.2 * context)
            )
            candidates.append(_Candidate(rule=compiled.rule, line=line, score=score, fallout=view.fallout[index]))
    evidence = {rule_id: set().union(*numbers) for rule_id, numbers in context_lines.items()}
    return candidates, evidence


def _rank(candidate: _Candidate) -> tuple[float, bool, float, int]:
    return (candidate.score, not candidate.fallout, candidate.rule.weight, candidate.line.number)


def diagnose_text(text: str, *, rules: RuleBook | None = None) -> Diagnosis:
    """Diagnose a failed build from its full log text. Never raises on odd input: worst case is 'unknown'.
    A log longer than FULL_LINES lines is diagnosed from a window (builders/diagnose/window.py)."""
    raw = text.split("\n")
    if len(raw) > FULL_LINES + 1:  # + 1: the empty string after a final newline is no line
        return _diagnose_window(select(lambda: enumerate(raw, start=1)), rules, cut=None)
    return _diagnose(split_log(text), rules)


def diagnose_log(path: Path | str, *, rules: RuleBook | None = None, strict: bool = True) -> Diagnosis:
    """Diagnose a saved log ('-': standard input) in bounded memory, whatever its size.

    Strict (what a user's `forge diagnose` gets): an empty or binary input is a UsageError that says what it is.
    A build's own log is read leniently: an empty one is a fact about that build, diagnosed as 'unknown'."""
    source = open_log(path)
    try:
        if source.cut is None and source.size() <= FULL_BYTES:
            data = source.head(FULL_BYTES)
            problem = _not_a_log(data, source.name) if strict else None
            if problem is not None:
                raise problem
            return diagnose_text(data.decode("utf-8", errors="replace"), rules=rules)
        problem = _not_a_log(source.head(), source.name) if strict else None
        if problem is not None:
            raise problem
        window = select(source.lines)
        if strict and not any(shown.strip() for _, shown in window.lines):
            raise UsageError(
                f"{source.name} is empty: there is no log to diagnose", hint="pass the saved output of the failed build"
            )
        return _diagnose_window(window, rules, cut=source.cut)
    finally:
        source.close()


def _diagnose_window(window: Window, rules: RuleBook | None, *, cut: str | None) -> Diagnosis:
    lines = split_window(window.lines)
    if not lines:
        return _unknown(None, None, ()).model_copy(update={"read": window.note(cut)})
    diagnosis = _diagnose(lines, rules, window=(window.step, window.last))
    return diagnosis.model_copy(update={"read": window.note(cut)})


def _diagnose(
    lines: list[LogLine], rules: RuleBook | None, *, window: tuple[frozenset[int] | None, int] | None = None
) -> Diagnosis:
    book = rules if rules is not None else load_rules()
    compiled_kinds, compiled_rules = _compile(book)
    if not lines:
        return _unknown(None, None, ())
    view = _LogView.of(lines, compiled_kinds, window=window)
    candidates, context_evidence = _candidates(view, compiled_rules)
    best_per_rule: dict[str, _Candidate] = {}
    for candidate in candidates:
        held = best_per_rule.get(candidate.rule.id)
        if held is None or _rank(candidate) > _rank(held):
            best_per_rule[candidate.rule.id] = candidate
    ordered = sorted(best_per_rule.values(), key=_rank, reverse=True)
    if not ordered or ordered[0].score < CONFIDENCE_THRESHOLD:
        rejected = tuple(_alternative(c) for c in ordered[:MAX_ALTERNATIVES])
        return _unknown(view, view.first_error(), rejected)

    best = ordered[0]
    # Apt prints one `E:` line per repository, a parallel build one `Killed` per job: the same cause on
    # several lines that score alike. A person reads from the first of them.
    earliest = min(
        (
            c
            for c in candidates
            if c.rule.id == best.rule.id
            and c.fallout == best.fallout
            and view.in_step(c.line)
            and c.score >= best.score - SAME_CAUSE_MARGIN
        ),
        key=lambda c: c.line.number,
        default=best,
    )
    reported = next((line for line in lines if line.key == earliest.line.key and view.in_step(line)), earliest.line)
    supporting = {c.line.number for c in candidates if c.rule.id == best.rule.id}
    supporting |= context_evidence[best.rule.id]
    supporting.discard(reported.number)
    nearest = sorted(supporting, key=lambda n: (abs(n - reported.number), n))[:MAX_EVIDENCE]
    compiled = next(c for c in compiled_rules if c.rule is best.rule)
    subject = compiled.group(reported.text, "subject") or compiled.group(earliest.line.text, "subject")
    cause, remedy = best.rule.cause.strip(), best.rule.remedy.strip()
    if subject is not None and best.rule.subject_label is not None:
        cause = f"{best.rule.subject_label.capitalize()}: {subject}. {cause}"
    undetermined = best.rule.undetermined
    in_step = compiled.unless_in_step
    unsettled = (
        undetermined is not None
        and subject is None
        and compiled.unless is not None
        and compiled.unless.search(reported.text) is None
        and compiled.unless.search(earliest.line.text) is None
        and not (in_step is not None and any(in_step.search(ln.text) for ln in lines if ln.text and view.in_step(ln)))
    )
    if unsettled and undetermined is not None:
        cause = "The log does not say which of these it is: " + "; or ".join(c.strip() for c in undetermined.causes)
        remedy = undetermined.remedy.strip()
    return Diagnosis(
        category=best.rule.id,
        line_number=reported.number,
        line=mask_urls(reported.raw.strip()),  # pip prints an index URL with its credentials
        cause=cause,
        remedy=remedy,
        subject=subject,
        subject_label=best.rule.subject_label if subject is not None else None,
        cannot_tell_apart=tuple(c.strip() for c in undetermined.causes) if unsettled and undetermined else (),
        possible_categories=tuple(undetermined.categories) if unsettled and undetermined else (),
        confidence=round(min(best.score, 1.0), 2),
        evidence=tuple(sorted(nearest)),
        alternatives=tuple(_alternative(c, best=best) for c in ordered[1 : 1 + MAX_ALTERNATIVES]),
    )


def _alternative(candidate: _Candidate, *, best: _Candidate | None = None) -> Alternative:
    close = (
        best is not None and candidate.score >= CONFIDENCE_THRESHOLD and best.score - candidate.score <= CLOSE_MARGIN
    )
    return Alternative(
        category=candidate.rule.id,
        line_number=candidate.line.number,
        confidence=round(candidate.score, 2),
        close=close,
        cause=candidate.rule.cause.strip(),
    )


def _unknown(view: _LogView | None, line: LogLine | None, alternatives: tuple[Alternative, ...]) -> Diagnosis:
    where = (
        f"line {line.number}, the first error of the failing step"
        if line is not None
        else "the end of the log (no line reads like an error)"
    )
    return Diagnosis(
        category=UNKNOWN,
        line_number=line.number if line is not None else None,
        line=mask_urls(line.raw.strip()) if line is not None else None,
        cause="No known cause in builders/diagnose/rules.yaml explains this log with enough confidence.",
        remedy=f"Start reading at {where}. If the cause is one Forge should recognise, add a rule with "
        "examples to builders/diagnose/rules.yaml and the log to tests/logs/.",
        confidence=round(_unknown_score(view, line), 2),
        alternatives=alternatives,
    )


def _unknown_score(view: _LogView | None, line: LogLine | None) -> float:
    """The catch-all rule's score at `line`, by the same formula as every rule (no context supports it)."""
    if view is None or line is None:
        return 0.0
    severity = view.severities[view.index[line.number]]
    return UNKNOWN_WEIGHT * (0.5 * severity + 0.3 * view.position(line.number) + 0.2 * 0.5)


# Leading bytes of the files people pass by mistake: an archive of the logs, a core dump, an image layer.
_MAGIC = (
    (b"\x1f\x8b", "a gzip archive"),
    (b"\x28\xb5\x2f\xfd", "a zstd archive"),
    (b"\xfd7zXZ\x00", "an xz archive"),
    (b"BZh", "a bzip2 archive"),
    (b"PK\x03\x04", "a zip archive"),
    (b"\x7fELF", "an ELF binary"),
)


def _not_a_log(data: bytes, name: str) -> UsageError | None:
    """Why these bytes are no build log, or None: an empty file and a binary one would otherwise both get
    'unknown', which reads as 'no rule matched' when nothing was there to match."""
    if not data.strip():
        return UsageError(
            f"{name} is empty: there is no log to diagnose", hint="pass the saved output of the failed build"
        )
    what = next((label for magic, label in _MAGIC if data.startswith(magic)), None)
    if what is None and len(data) > 262 and data[257:262] == b"ustar":
        what = "a tar archive"
    if what is None and b"\x00" in data[:8192]:
        what = "binary data (it holds NUL bytes)"
    if what is None:
        return None
    return UsageError(f"{name} is {what}, not a text log", hint="unpack it first, or pass the build's text output")


def read_log(path: Path | str, *, strict: bool = True) -> str:
    """A log's text from a file, or from standard input when path is '-'; undecodable bytes are replaced. Special
    files are refused and at most LOG_LIMIT_BYTES are read (diagnose_log reads a log of any size in bounded
    memory). Strict: an empty or binary input is a UsageError that says what it is."""
    source = open_log(path)
    try:
        data = source.head(LOG_LIMIT_BYTES)
    finally:
        source.close()
    problem = _not_a_log(data, source.name) if strict else None
    if problem is not None:
        raise problem
    return data.decode("utf-8", errors="replace")


def diagnose_file(path: Path | str, *, rules: RuleBook | None = None) -> Diagnosis:
    """Diagnose a failed build from a saved log file ('-' reads standard input)."""
    return diagnose_log(path, rules=rules, strict=False)
