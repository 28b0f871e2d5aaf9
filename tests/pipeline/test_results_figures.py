"""Every figure the README and docs quote is checked against the results file it names (results/NAME.json).

The rule (docs/evidence.md says it for writers):
- A *figure* is a number with a unit of time (ms, s, min, h, seconds, minutes, hours; `4 min 56 s` is one
  figure), size (kB, MB, GB, MiB, GiB), share (%) or multiple (×); a range (`25–74 min`) is two. A number after a
  comparison (≥, ≤, <, >, under, below, above, at most, at least) is a requirement or a limit, not a figure; a
  number in a code span is code.
- A *block* is a paragraph or a table row (a table's header row holds column names, not figures). A block *names* a results file with a link to `results/NAME.json` or
  a code span `results/NAME.json` (docs/ pages use the code span: the site does not serve results/); a table
  row also takes the files its caption names (the paragraph just before or just after the table).
- Every figure in a block that names a results file must equal a figure of one of the files it names, to the
  digits shown, in the same unit or one it converts to (seconds to minutes, a ratio to %). A `#key` after the
  file name pins the figure to that key.
- In the README's first-screen table and its measured sections, and in docs/verified.md and docs/measured.md
  (REQUIRED), every block that quotes a figure must name a results file: a figure with no file behind it fails.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import jsonschema
import pytest

from builders.commands.schema import schema_text
from builders.results import RESULTS_DIR, SCHEMA_REF, Figure, Load, Machine, Provenance, Result, read_results

ROOT = Path(__file__).resolve().parents[2]

# (file, heading): every block under that heading (up to the next heading of its level or above) must name a
# results file if it quotes a figure; heading None is the whole file.
REQUIRED: tuple[tuple[str, str | None], ...] = (
    ("README.md", "What each job needs"),
    ("README.md", "The serving sweep on the image: what it found"),
    ("README.md", "Rebuilding a patched vLLM tree: what it took"),
    ("README.md", "How long the full suite takes"),
    ("docs/verified.md", None),
    ("docs/measured.md", None),
)

# unit → (kind, size in the kind's base unit)
UNITS: dict[str, tuple[str, float]] = {
    "ms": ("time", 1e-3),
    "s": ("time", 1.0),
    "seconds": ("time", 1.0),
    "min": ("time", 60.0),
    "minutes": ("time", 60.0),
    "h": ("time", 3600.0),
    "hours": ("time", 3600.0),
    "kB": ("bytes", 1e3),
    "MB": ("bytes", 1e6),
    "GB": ("bytes", 1e9),
    "MiB": ("binary bytes", 2.0**20),
    "GiB": ("binary bytes", 2.0**30),
    "%": ("share", 0.01),
    "ratio": ("share", 1.0),
    "×": ("multiple", 1.0),
}
NUMBER = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
_UNIT = "|".join(sorted((re.escape(u) for u in UNITS if u != "ratio"), key=len, reverse=True))
COMPOUND = re.compile(rf"(?<![\w.,/-])({NUMBER}) min ({NUMBER}) s(?![\w/])")
TOKEN = re.compile(rf"(?<![\w.,/=:+-])({NUMBER})(?:\s?[–-]\s?({NUMBER}))?\s?({_UNIT})(?![\w/])")
LIMIT = re.compile(r"(?:[≥≤<>]|\bunder|\bbelow|\babove|\bat most|\bat least)\s*$")
NAMED = re.compile(r"(?:\]\(|`)(?:\.\./)?results/([a-z0-9][a-z0-9.-]*)\.json(?:#([a-z0-9][\w.-]*))?")


@dataclass(frozen=True)
class Quoted:
    text: str  # as written: "4,441 s"
    value: float
    decimals: int
    unit: str
    line: int


@dataclass
class Block:
    lines: list[tuple[int, str]]
    table: bool
    section: list[str]  # the headings above it, outermost first

    @property
    def text(self) -> str:
        return "\n".join(t for _, t in self.lines)


def blocks_of(text: str) -> list[Block]:
    """Paragraphs and tables, code fences left out, each with the headings above it."""
    found: list[Block] = []
    section: list[tuple[int, str]] = []
    current: Block | None = None
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            current = None
            continue
        heading = re.match(r"(#+)\s+(.*)", line)
        if fenced or not line.strip() or heading:
            current = None
            if heading and not fenced:
                level = len(heading.group(1))
                section = [(lv, h) for lv, h in section if lv < level] + [(level, heading.group(2).strip())]
            continue
        table = line.lstrip().startswith("|")
        if current is None or current.table != table:
            current = Block(lines=[], table=table, section=[h for _, h in section])
            found.append(current)
        current.lines.append((number, line))
    return found


def _plain(line: str) -> str:
    """The line as read: code spans, link targets and emphasis out."""
    line = re.sub(r"`[^`]*`", " ", line)
    line = re.sub(r"\]\([^)]*\)", "]", line)
    return line.replace("**", "").replace("\\|", "|")


def quoted(block: Block) -> list[Quoted]:
    out = []
    for number, line in block.lines:
        plain = _plain(line)
        for match in COMPOUND.finditer(plain):
            if not LIMIT.search(plain[: match.start()]):
                seconds = float(match.group(1)) * 60 + float(match.group(2))
                out.append(Quoted(match.group(0), seconds, 0, "s", number))
        plain = COMPOUND.sub(" ", plain)
        for match in TOKEN.finditer(plain):
            if LIMIT.search(plain[: match.start()]):
                continue
            for part in (match.group(1), match.group(2)):
                if part is None:
                    continue
                digits = part.replace(",", "")
                decimals = len(digits.split(".")[1]) if "." in digits else 0
                out.append(Quoted(match.group(0), float(digits), decimals, match.group(3), number))
    return out


def named(block: Block) -> list[tuple[str, str | None]]:
    return [(m.group(1), m.group(2)) for m in NAMED.finditer(block.text)]


def matches(q: Quoted, figure: Figure) -> bool:
    if figure.unit not in UNITS or UNITS[figure.unit][0] != UNITS[q.unit][0]:
        return False
    converted = figure.value * UNITS[figure.unit][1] / UNITS[q.unit][1]
    # Either rounding of a half is accepted: 2.25 quoted as 2.2 or 2.3.
    return abs(converted - q.value) <= 0.5 * 10.0**-q.decimals + 1e-9


def required(path: str, block: Block) -> bool:
    return any(path == f and (h is None or h in block.section) for f, h in REQUIRED)


def caption(blocks: list[Block], index: int) -> list[tuple[str, str | None]]:
    """The files a table's caption names: the paragraph right before or right after it, under its heading."""
    names: list[tuple[str, str | None]] = []
    table = blocks[index]
    for near, edge, own in ((index - 1, -1, 0), (index + 1, 0, -1)):
        beside = 0 <= near < len(blocks) and not blocks[near].table and blocks[near].section == table.section
        if beside and abs(blocks[near].lines[edge][0] - table.lines[own][0]) <= 2:
            names += named(blocks[near])
    return names


def check(path: str, text: str, results: dict[str, Result]) -> list[str]:
    """What is wrong with the figures of one document: each problem as `path:line: ...`."""
    problems = []
    blocks = blocks_of(text)
    for index, block in enumerate(blocks):
        # A table row is checked against the files it names and those its caption names; a paragraph against
        # its own.
        # A table's first line is its header: column names, not figures (`ms share 90%`).
        parts = (
            [
                (Block(lines=[line], table=True, section=block.section), caption(blocks, index))
                for line in block.lines[1:]
            ]
            if block.table
            else [(block, [])]
        )
        for part, extra in parts:
            problems += check_part(path, part, named(part) + extra, results, block)
    return problems


def check_part(
    path: str, part: Block, names: list[tuple[str, str | None]], results: dict[str, Result], block: Block
) -> list[str]:
    figures = quoted(part)
    if not figures or (not names and not required(path, block)):
        return []
    if not names:
        return [f"{path}:{q.line}: {q.text} names no results file (results/NAME.json)" for q in figures]
    problems = [f"{path}:{part.lines[0][0]}: results/{n}.json does not exist" for n, _ in names if n not in results]
    pinned = [results[n].figures.get(k) for n, k in names if k and n in results]
    pool = [f for f in pinned if f] or [
        f for n, k in names if n in results and not k for f in results[n].figures.values()
    ]
    for q in figures:
        if not any(matches(q, f) for f in pool):
            shown = ", ".join(sorted({f"results/{n}.json" + (f"#{k}" if k else "") for n, k in names}))
            problems.append(f"{path}:{q.line}: {q.text} is no figure of {shown}")
    return problems


def documents() -> dict[str, str]:
    paths = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in paths}


@pytest.fixture(scope="module")
def results() -> dict[str, Result]:
    return read_results(ROOT)


def test_every_quoted_figure_is_the_figure_of_its_results_file(results: dict[str, Result]) -> None:
    problems = [p for path, text in documents().items() for p in check(path, text, results)]
    assert problems == [], "\n".join(problems)


def test_every_results_file_is_quoted_and_valid(results: dict[str, Result]) -> None:
    validator = jsonschema.Draft202012Validator(json.loads(schema_text("result")))
    text = "\n".join(documents().values())
    for name, result in results.items():
        path = ROOT / RESULTS_DIR / f"{name}.json"
        data = json.loads(path.read_text())
        assert [e.message for e in validator.iter_errors(data)] == [], path
        assert result.name == name and data["$schema"] == SCHEMA_REF, path
        assert path.read_text() == result.to_text(), f"{path} is not as the writer writes it"
        assert f"results/{name}.json" in text, f"{path}: no doc quotes it"
        if result.provenance.kind == "transcribed":
            assert result.provenance.source_commit, f"{path}: a transcribed result names the commit that wrote it"


def test_the_required_sections_exist() -> None:
    docs = documents()
    for path, heading in REQUIRED:
        assert path in docs, path
        if heading is not None:
            assert any(heading in b.section for b in blocks_of(docs[path])), f"{path} has no section {heading!r}"


# The checker itself, on the real README and on documents written here.


def test_a_figure_edited_by_hand_fails(results: dict[str, Result]) -> None:
    readme = documents()["README.md"]
    assert check("README.md", readme, results) == []
    for before, after in (("**17.5 s**", "**16.5 s**"), ("4,441 s (74 min)", "4,441 s (73 min)")):
        assert before in readme, before
        edited = check("README.md", readme.replace(before, after, 1), results)
        assert len(edited) == 1 and after.strip("*").split(" (")[-1].rstrip(")") in edited[0], edited


def synthetic(**figures: Figure) -> dict[str, Result]:
    """One results file, `bench`, holding these figures."""
    machine = Machine(cpu="x", cores=2, isa=[], memory_gib=1)
    return {
        "bench": Result(
            name="bench",
            date="2026-12-04",
            commit="abc",
            command="nox -s bench",
            machine=machine,
            load=Load(before=None, after=None),
            versions={},
            figures=figures,
            provenance=Provenance(kind="measured", source="reports/bench"),
        )
    }


def test_a_figure_with_no_file_behind_it_fails() -> None:
    results = synthetic(wall=Figure(value=4441, unit="s"))
    text = "# Measured\n\nThe build took 4,441 s on a 2-core machine.\n"
    assert check("docs/measured.md", text, results) == [
        "docs/measured.md:3: 4,441 s names no results file (results/NAME.json)"
    ]
    # Outside the required pages a block that names no file is not checked; one that names a file is.
    assert check("docs/other.md", text, results) == []
    assert check("docs/other.md", "It took 74 min (`results/bench.json`).\n", results) == []
    assert check("docs/other.md", "It took 4,440 s (`results/bench.json`).\n", results) == [
        "docs/other.md:1: 4,440 s is no figure of results/bench.json"
    ]
    assert check("docs/other.md", "It took 4,441 s (`results/gone.json`).\n", results)[0] == (
        "docs/other.md:1: results/gone.json does not exist"
    )


def test_a_table_row_takes_its_captions_files() -> None:
    results = synthetic(wall=Figure(value=17.5, unit="s"), share=Figure(value=0.987, unit="ratio"))
    table = "| step | wall |\n| --- | --- |\n| no change | 17.5 s |\n| other | 98.7 % |\n"
    assert check("README.md", f"Figures in [results](results/bench.json):\n\n{table}", results) == []
    assert check("README.md", f"{table}\nFrom `results/bench.json`.\n", results) == []
    # Another heading between caption and table: not its caption.
    assert check("docs/measured.md", f"From `results/bench.json`.\n\n## Next\n\n{table}", results) == [
        "docs/measured.md:7: 17.5 s names no results file (results/NAME.json)",
        "docs/measured.md:8: 98.7 % names no results file (results/NAME.json)",
    ]


def test_a_pinned_key_is_the_only_figure_a_quote_may_match() -> None:
    results = synthetic(cold=Figure(value=4441, unit="s"), warm=Figure(value=197, unit="s"))
    assert check("docs/other.md", "Warm: 197 s (`results/bench.json#warm`).\n", results) == []
    assert check("docs/other.md", "Warm: 197 s (`results/bench.json#cold`).\n", results) == [
        "docs/other.md:1: 197 s is no figure of results/bench.json#cold"
    ]


def test_what_counts_as_a_figure() -> None:
    block = blocks_of(
        "Took 4 min 56 s, 25–74 min, 93.0 %, 15×, 7.7 GB and `3 GB` of code; needs ≥ 30 GiB, under 45 min, "
        "vLLM 0.33.0, GCC 12.2 and x86-64-v3.\n"
    )[0]
    assert [(q.value, q.decimals, q.unit) for q in quoted(block)] == [
        (296.0, 0, "s"),
        (25.0, 0, "min"),
        (74.0, 0, "min"),
        (93.0, 1, "%"),
        (15.0, 0, "×"),
        (7.7, 1, "GB"),
    ]


def test_units_convert_and_digits_round() -> None:
    seconds = Figure(value=4441, unit="s")
    assert matches(Quoted("74 min", 74, 0, "min", 1), seconds)
    assert not matches(Quoted("73 min", 73, 0, "min", 1), seconds)
    assert matches(Quoted("43.6 min", 43.6, 1, "min", 1), Figure(value=2615, unit="s"))
    assert matches(Quoted("93.0 %", 93.0, 1, "%", 1), Figure(value=0.9295, unit="ratio"))
    assert not matches(Quoted("30 GiB", 30, 0, "GiB", 1), Figure(value=30, unit="GB"))
