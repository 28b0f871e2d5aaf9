"""How well `forge diagnose` names the cause of the logs in tests/logs, and how much of that is overfitting.

Three figures, all measured here in one run over the labelled corpus (the file name is the label):

1. Per category, precision (of the logs diagnosed as C, how many are C) and recall (of the logs labelled C,
   how many were diagnosed C), with the overall split of answers into right / unknown / wrong.
2. The issue-13 figures over the public logs alone: precision (right among the logs given a named cause) and
   coverage (right among the logs whose label is a known cause), reported separately, since a wrong cause is
   worse than `unknown`.
3. Leave-one-source-out. Rules were written while reading these very logs, so (1) flatters them. Here each
   source (a repository whose thread a log came from; Forge's own captures count as one source) is held out
   in turn, and its logs are diagnosed with a rule book cut down to what the *other* sources justify: a
   pattern survives only if it matches some line of a log from another source labelled with its rule's
   category. A pattern written for one project's wording therefore does not count for that project, and a
   cause only one project reported is not recognised there. The same is done holding out whole
   organisations (the repository's owner: all of pytorch/*, all of vllm-project/*), which is stricter.
5. The set-aside batch (tests/logs/set-aside.txt): the last logs added, measured before any rule was
   written for them; their figure is printed on its own.
6. A reliability table: the answers grouped by their confidence, with the share of each group that named
   the right cause, over the whole corpus and over leave-one-repository-out. Below the threshold the answer
   is `unknown`; its best guess (the strongest rejected cause) is counted separately.

4. Leave-one-year-out, over the public logs whose sidecar dates the post they were quoted from
   (`source.year`): each year's logs are diagnosed with the patterns that logs of other years justify, so
   a wording that only one year's tools printed does not count for that year. Undated logs stay in the
   evidence and are not scored here.

Run: `nox -s bench-diagnose` (or `python benchmarks/bench_diagnose.py [--json] [--save]`); `--save` writes the
figures to results/diagnosis.json (builders/results.py), which docs/diagnosis-reliability.md quotes.
"""

from __future__ import annotations

import itertools
import json
import platform
import re
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The rules and engine measured are this checkout's, not those of wherever Forge was last installed from.
sys.path.insert(0, str(ROOT))

from builders.diagnose import UNKNOWN, Rule, RuleBook, diagnose_text, load_rules  # noqa: E402
from builders.diagnose.loglines import split_log  # noqa: E402
from builders.results import Figure, LoadWatch, Result  # noqa: E402

LOGS = ROOT / "tests" / "logs"
SET_ASIDE = LOGS / "set-aside.txt"
BUCKETS = (0.5, 0.6, 0.7, 0.8, 0.9)
LOCAL_SOURCE = "forge (own captures)"


@dataclass(frozen=True, slots=True)
class Log:
    name: str
    label: str
    source: str  # owner/name of the thread's repository, or LOCAL_SOURCE
    public: bool
    text: str
    line_number: int
    lines: tuple[str, ...]  # what rules match against: prefixes stripped, wrapped lines rejoined
    year: int | None  # when the quoted post was written, where the sidecar says

    @property
    def organisation(self) -> str:
        return self.source.split("/", 1)[0]


def load_corpus() -> list[Log]:
    logs: list[Log] = []
    for folder, public in ((LOGS, False), (LOGS / "public", True)):
        for path in sorted(folder.glob("*.log")):
            sidecar = json.loads(path.with_name(path.name + ".expect.json").read_text(encoding="utf-8"))
            text = path.read_bytes().decode("utf-8", errors="replace")
            logs.append(
                Log(
                    name=path.stem,
                    label=path.stem.partition("--")[0],
                    source=sidecar["source"]["repo"] if public else LOCAL_SOURCE,
                    public=public,
                    text=text,
                    line_number=sidecar["line_number"],
                    lines=tuple(line.text for line in split_log(text)),
                    year=sidecar["source"].get("year") if public else None,
                )
            )
    return logs


def set_aside_names() -> frozenset[str]:
    """The logs of the last batch added, one file stem per line (`#` comments allowed)."""
    if not SET_ASIDE.exists():
        return frozenset()
    names = frozenset(
        line.split("#", 1)[0].strip()
        for line in SET_ASIDE.read_text(encoding="utf-8").splitlines()
        if line.split("#", 1)[0].strip()
    )
    missing = sorted(name for name in names if not (LOGS / "public" / f"{name}.log").exists())
    if missing:
        raise SystemExit(f"{SET_ASIDE}: no tests/logs/public/<name>.log for {', '.join(missing)}")
    return names


@dataclass(frozen=True, slots=True)
class Outcome:
    log: Log
    got: str
    line_number: int | None
    confidence: float = 0.0
    best_guess: str | None = None  # for `unknown`: the strongest cause it rejected
    tell_apart: tuple[str, ...] = ()  # the categories a log it cannot settle could be

    @property
    def verdict(self) -> str:
        # An answer that names the causes it cannot tell apart is right when the label is among them.
        if self.got == self.log.label or self.log.label in self.tell_apart:
            return "right"
        return "unknown" if self.got == UNKNOWN else "wrong"


def diagnose_all(logs: Iterable[Log], book: RuleBook) -> list[Outcome]:
    outcomes = []
    for log in logs:
        diagnosis = diagnose_text(log.text, rules=book)
        outcomes.append(
            Outcome(
                log=log,
                got=diagnosis.category,
                line_number=diagnosis.line_number,
                confidence=diagnosis.confidence,
                best_guess=diagnosis.alternatives[0].category if diagnosis.alternatives else None,
                tell_apart=diagnosis.possible_categories,
            )
        )
    return outcomes


@dataclass(frozen=True, slots=True)
class Bucket:
    low: float
    high: float
    right: int
    wrong: int

    @property
    def share(self) -> float:
        return self.right / (self.right + self.wrong) if self.right + self.wrong else float("nan")


def reliability(outcomes: list[Outcome]) -> tuple[list[Bucket], int, int]:
    """Named answers by confidence bucket (share right), and for `unknown` answers on logs with a known
    cause: how many there were and how many had the right cause as their best guess."""
    buckets = []
    edges = (*BUCKETS, 1.0001)
    for low, high in itertools.pairwise(edges):
        named = [o for o in outcomes if o.got != UNKNOWN and low <= o.confidence < high]
        buckets.append(
            Bucket(
                low=low,
                high=min(high, 1.0),
                right=sum(1 for o in named if o.verdict == "right"),
                wrong=sum(1 for o in named if o.verdict == "wrong"),
            )
        )
    unknown = [o for o in outcomes if o.got == UNKNOWN and o.log.label != UNKNOWN]
    return buckets, len(unknown), sum(1 for o in unknown if o.best_guess == o.log.label)


@dataclass(frozen=True, slots=True)
class Summary:
    right: int
    unknown: int
    wrong: int
    labelled_known: int
    named: int

    @property
    def precision(self) -> float:
        """Right among the answers that named a cause (1.0 when none did)."""
        return self.right / self.named if self.named else 1.0

    @property
    def coverage(self) -> float:
        """Right among the logs whose label is a known cause."""
        return self.right / self.labelled_known if self.labelled_known else 1.0


def summarise(outcomes: list[Outcome]) -> Summary:
    verdicts = Counter(outcome.verdict for outcome in outcomes)
    known = [o for o in outcomes if o.log.label != UNKNOWN]
    return Summary(
        right=sum(1 for o in known if o.verdict == "right"),
        unknown=verdicts["unknown"],
        wrong=verdicts["wrong"],
        labelled_known=len(known),
        named=sum(1 for o in outcomes if o.got != UNKNOWN),
    )


def per_category(outcomes: list[Outcome], categories: Iterable[str]) -> list[tuple[str, int, float, float]]:
    rows = []
    for category in categories:
        labelled = [o for o in outcomes if o.log.label == category]
        answered = [o for o in outcomes if o.got == category]
        hits = sum(1 for o in labelled if o.got == category)
        precision = hits / len(answered) if answered else float("nan")
        recall = hits / len(labelled) if labelled else float("nan")
        rows.append((category, len(labelled), precision, recall))
    return rows


def _sources_matching(pattern: str, evidence: list[Log], group: Callable[[Log], str | None]) -> frozenset[str | None]:
    compiled = re.compile(pattern)
    return frozenset(group(log) for log in evidence if any(compiled.search(line) for line in log.lines))


def leave_one_out(logs: list[Log], book: RuleBook, group: Callable[[Log], str | None]) -> tuple[list[Outcome], int]:
    """Diagnose each group's logs with the patterns that logs of *other* groups justify: a pattern survives
    for group g only if a log outside g, labelled with the pattern's rule, has a line it matches. Context
    patterns stay: they only weigh a line that a surviving pattern already chose. Logs whose group is None
    are evidence for every group and are not scored."""
    support = {
        (rule.id, pattern): _sources_matching(pattern, [log for log in logs if log.label == rule.id], group)
        for rule in book.rules
        for pattern in (*rule.patterns, *rule.gated_patterns, *rule.warning_patterns)
    }
    outcomes: list[Outcome] = []
    groups = sorted({name for log in logs if (name := group(log)) is not None})
    for name in groups:
        rules: list[Rule] = []
        for rule in book.rules:
            kept = {
                field: [p for p in getattr(rule, field) if support[rule.id, p] - {name}]
                for field in ("patterns", "gated_patterns", "warning_patterns")
            }
            if kept["patterns"] or kept["gated_patterns"] or kept["warning_patterns"]:
                if not (kept["patterns"] or kept["gated_patterns"]):
                    # A rule needs a plain or gated pattern to be valid; one that cannot match keeps it so.
                    kept["patterns"] = [r"(?!)"]
                rules.append(rule.model_copy(update=kept))
        reduced = book.model_copy(update={"rules": rules})
        outcomes += diagnose_all([log for log in logs if group(log) == name], reduced)
    return [o for o in outcomes if o.log.public], len(groups)


def _pct(value: float) -> str:
    return "  -  " if value != value else f"{100 * value:5.1f}"  # NaN: no log to measure on


@dataclass(frozen=True, slots=True)
class Figures:
    logs: int
    public_logs: int
    public_sources: int
    per_category: list[tuple[str, int, float, float]]
    everything: Summary
    public: Summary
    public_line_agreement: float
    by_repository: Summary
    repositories: int
    by_organisation: Summary
    organisations: int
    by_year: Summary
    years: int
    dated_public_logs: int
    set_aside: Summary
    set_aside_logs: int
    set_aside_sources: int
    tell_apart: int
    reliability_all: list[Bucket]
    unknown_all: tuple[int, int]
    reliability_by_repository: list[Bucket]
    unknown_by_repository: tuple[int, int]
    single_source_categories: list[str]
    misses: list[tuple[str, str]]
    misses_held_out: list[tuple[str, str]]


def measure(logs: list[Log], book: RuleBook, set_aside: frozenset[str] = frozenset()) -> Figures:
    outcomes = diagnose_all(logs, book)
    aside = [o for o in outcomes if o.log.name in set_aside]
    buckets_all, unknown_all, guessed_all = reliability(outcomes)
    public = [o for o in outcomes if o.log.public]
    pub = summarise(public)
    by_repo, repos = leave_one_out(logs, book, lambda log: log.source)
    by_org, orgs = leave_one_out(logs, book, lambda log: log.organisation)
    by_year, years = leave_one_out(logs, book, lambda log: str(log.year) if log.year is not None else None)
    missed = {o.log.name for o in public if o.verdict != "right"}
    right = [o for o in public if o.verdict == "right"]
    line_hits = sum(1 for o in right if o.line_number == o.log.line_number)
    sources_of: dict[str, set[str]] = defaultdict(set)
    for log in logs:
        sources_of[log.label].add(log.source)
    buckets_repo, unknown_repo, guessed_repo = reliability(by_repo)
    return Figures(
        logs=len(logs),
        public_logs=len(public),
        public_sources=len({log.source for log in logs if log.public}),
        per_category=per_category(outcomes, book.categories),
        everything=summarise(outcomes),
        public=pub,
        public_line_agreement=line_hits / len(right) if right else 1.0,
        by_repository=summarise(by_repo),
        repositories=repos,
        by_organisation=summarise(by_org),
        organisations=orgs,
        by_year=summarise(by_year),
        years=years,
        dated_public_logs=len(by_year),
        set_aside=summarise(aside),
        set_aside_logs=len(aside),
        set_aside_sources=len({o.log.source for o in aside}),
        tell_apart=sum(1 for o in outcomes if o.tell_apart),
        reliability_all=buckets_all,
        unknown_all=(unknown_all, guessed_all),
        reliability_by_repository=buckets_repo,
        unknown_by_repository=(unknown_repo, guessed_repo),
        single_source_categories=sorted(c for c, sources in sources_of.items() if len(sources) == 1),
        misses=[(o.log.name, o.got) for o in public if o.verdict != "right"],
        misses_held_out=[(o.log.name, o.got) for o in by_org if o.verdict != "right" and o.log.name not in missed],
    )


def _line(summary: Summary) -> str:
    return (
        f"right {summary.right:3d} / {summary.labelled_known:3d} labelled with a known cause, "
        f"unknown {summary.unknown:2d}, wrong {summary.wrong:2d}  |  "
        f"precision {_pct(summary.precision)} %  coverage {_pct(summary.coverage)} %"
    )


def result(figures: Figures, rules: int, watch: LoadWatch) -> Result:
    """The run as results/diagnosis.json: the corpus, each row's counts and shares, the reliability buckets."""
    named: dict[str, Figure | tuple[int | float, str]] = {
        "logs": (figures.logs, "count"),
        "public_logs": (figures.public_logs, "count"),
        "public_sources": (figures.public_sources, "count"),
        "rules": (rules, "count"),
        "tell_apart": (figures.tell_apart, "count"),
        "public.decisive_line_agreement": (round(figures.public_line_agreement, 4), "ratio"),
    }
    rows = {
        "all": figures.everything,
        "public": figures.public,
        "by_repository": figures.by_repository,
        "by_organisation": figures.by_organisation,
        "by_year": figures.by_year,
        "set_aside": figures.set_aside,
    }
    for row, summary in rows.items():
        for what in ("right", "unknown", "wrong", "labelled_known"):
            named[f"{row}.{what}"] = (getattr(summary, what), "count")
        named[f"{row}.precision"] = (round(summary.precision, 4), "ratio")
        named[f"{row}.coverage"] = (round(summary.coverage, 4), "ratio")
    named |= {
        "by_repository.sources": (figures.repositories, "count"),
        "by_organisation.sources": (figures.organisations, "count"),
        "by_year.years": (figures.years, "count"),
        "by_year.dated_logs": (figures.dated_public_logs, "count"),
        "set_aside.logs": (figures.set_aside_logs, "count"),
    }
    for corpus, buckets in (("all", figures.reliability_all), ("by_repository", figures.reliability_by_repository)):
        for b in buckets:
            key = f"reliability.{corpus}.{b.low:.2f}-{b.high:.2f}"
            named[f"{key}.right"] = (b.right, "count")
            named[f"{key}.wrong"] = (b.wrong, "count")
            if b.right + b.wrong:
                named[f"{key}.share"] = (round(b.share, 4), "ratio")
    return Result.capture(
        "diagnosis",
        command="nox -s bench-diagnose -- --save",
        figures=named,
        versions={"python": platform.python_version()},
        load=watch,
        note="nothing is timed: the figures are counts over tests/logs, the same on any machine",
    )


def main(argv: list[str]) -> int:
    watch = LoadWatch.start()
    book = load_rules()
    figures = measure(load_corpus(), book, set_aside_names())
    if "--save" in argv:
        print(f"bench-diagnose: wrote {result(figures, len(book.rules), watch).save(ROOT)}", file=sys.stderr)
    if "--json" in argv:
        print(json.dumps(asdict(figures), indent=2))
        return 0 if figures.public.wrong == 0 else 1
    print(
        f"bench-diagnose: {figures.logs} logs, {figures.public_logs} from public threads "
        f"({figures.public_sources} repositories), {len(book.rules)} rules"
    )
    print()
    print(f"{'category':24s} {'logs':>5s} {'precision %':>12s} {'recall %':>9s}")
    for category, count, precision, recall in figures.per_category:
        print(f"{category:24s} {count:5d} {_pct(precision):>12s} {_pct(recall):>9s}")
    print()
    print(f"all logs                 {_line(figures.everything)}")
    print(f"public logs              {_line(figures.public)}")
    print(f"  decisive line as labelled on {_pct(figures.public_line_agreement)} % of the right answers")
    print(f"leave one repository out ({figures.repositories} sources), public logs:")
    print(f"                         {_line(figures.by_repository)}")
    print(f"leave one organisation out ({figures.organisations} sources), public logs:")
    print(f"                         {_line(figures.by_organisation)}")
    print(
        f"leave one year out ({figures.years} years), the {figures.dated_public_logs} public logs whose "
        "sidecar dates their post:"
    )
    print(f"                         {_line(figures.by_year)}")
    print(
        f"set-aside batch ({figures.set_aside_logs} logs from {figures.set_aside_sources} repositories, "
        "tests/logs/set-aside.txt):"
    )
    print(f"                         {_line(figures.set_aside)}")
    print(
        f"answers that name the causes the log cannot tell apart (counted right when the label is one): "
        f"{figures.tell_apart}"
    )
    print()
    print("reliability: named answers by confidence -> share right (right / wrong)")
    print(f"{'confidence':>12s} {'all logs':>22s} {'leave one repository out':>28s}")
    for whole, held in zip(figures.reliability_all, figures.reliability_by_repository, strict=True):
        print(
            f"{whole.low:5.2f}-{whole.high:4.2f}  {_pct(whole.share):>8s} % ({whole.right:3d} / {whole.wrong:2d})"
            f"  {_pct(held.share):>12s} % ({held.right:3d} / {held.wrong:2d})"
        )
    print(
        f"  < 0.50 (unknown)   all logs: {figures.unknown_all[0]} with a known cause, best guess right on "
        f"{figures.unknown_all[1]}; held out by repository: {figures.unknown_by_repository[0]}, best guess "
        f"right on {figures.unknown_by_repository[1]}"
    )
    print(f"categories seen from one source only: {', '.join(figures.single_source_categories) or 'none'}")
    for name, got in figures.misses:
        print(f"  not right: {name} -> {got}")
    for name, got in figures.misses_held_out:
        print(f"  not right only when its organisation is held out: {name} -> {got}")
    # A wrong cause is the failure this benchmark exists to catch; unknowns only lower coverage.
    return 0 if figures.public.wrong == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
