"""The mutation run's bookkeeping (builders/kvlab/mutation.py): a mutant's identity, the planted-bug harness left
out by where it sits, and an equivalence argument that excuses one mutant only, on mutants mutmut itself made
from small modules written here."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from builders.kvlab.mutation import (
    EQUIVALENT,
    MODULES,
    ModuleResult,
    MutantId,
    collect,
    function_name,
    read_mutants,
    score,
)

ROOT = Path(__file__).resolve().parents[2]

TWO_BREAKS = """\
def first_hit(xs, ys):
    for x in xs:
        if x:
            break
    for y in ys:
        if y:
            break
    return xs
"""

PLANTED = """\
class Layout:
    def spans(self, n):
        if self.bug == "gap":
            n = n + 7
        end = n - 1 if self.bug == "short" else n + 3
        if self.bug != "stale":
            end = end * 5
        return end
"""


def mutmut_run(tmp_path: Path, module: str, source: str, survivors: set[int] | None = None) -> Path:
    """The folder a mutmut run leaves: its mutants file, made by mutmut's own generator from `source`, and a meta
    file whose verdicts say the numbered mutants survived (all of them when `survivors` is None), the rest were
    killed."""
    work = tmp_path / module
    folder = work / "mutants" / "builders" / "kvlab"
    folder.mkdir(parents=True)
    (work / "setup.cfg").write_text("[mutmut]\nsource_paths = .\n")
    made = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json, sys\n"
            "from mutmut.mutation.file_mutation import mutate_file_contents\n"
            "m = mutate_file_contents(sys.argv[1], sys.argv[2])\n"
            "print(json.dumps({'code': m.code, 'names': m.mutant_names}))",
            f"{module}.py",
            source,
        ],
        cwd=work,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    mutated = json.loads(made.stdout)
    (folder / f"{module}.py").write_text(mutated["code"])
    codes = {
        f"builders.kvlab.{module}.{name}": 0 if survivors is None or int(name.rpartition("_")[2]) in survivors else 1
        for name in mutated["names"]
    }
    (folder / f"{module}.py.meta").write_text(json.dumps({"exit_code_by_key": codes}))
    return work


def test_a_survivor_with_the_same_text_on_another_line_is_counted(tmp_path: Path) -> None:
    work = mutmut_run(tmp_path, "toy", TWO_BREAKS)
    mutants = read_mutants((work / "mutants/builders/kvlab/toy.py").read_text(), "toy")
    breaks = sorted((m.id for m in mutants.values() if m.id.operator == "break → return"), key=lambda i: i.line)
    assert breaks == [
        MutantId("toy", "first_hit", 3, "break → return"),
        MutantId("toy", "first_hit", 6, "break → return"),
    ]
    # The first `break` argued equivalent: the second, the same text on another line, is still a survivor.
    result = ModuleResult("toy")
    collect(work, "toy", result, equivalent={breaks[0]: "the first loop's exit is not observed"})
    assert [e["line"] for e in result.equivalent] == [3]
    assert [(e["line"], e["operator"], e["change"]) for e in result.survived] == [(6, "break → return", "return")]
    assert score([result]).share < 1


def test_planted_bug_branches_are_left_out_by_where_they_sit(tmp_path: Path) -> None:
    work = mutmut_run(tmp_path, "toy", PLANTED)
    mutants = read_mutants((work / "mutants/builders/kvlab/toy.py").read_text(), "toy")
    harness = {(m.id.line, m.id.operator) for m in mutants.values() if m.harness}
    lab = {(m.id.line, m.id.operator) for m in mutants.values() if not m.harness}
    # The arm of `if self.bug == "gap"` and the true arm of `... if self.bug == "short" else ...` are harness.
    assert (2, "n + 7 → n - 7") in harness and (3, "n - 1 → n + 1") in harness
    # The code that runs without a planted bug is the lab: the else arm, the `!=` branch, the switches themselves.
    assert (3, "n + 3 → n - 3") in lab and (5, "end * 5 → end / 5") in lab
    assert any("'gap' → 'XXgapXX'" in op for _, op in lab)
    result = ModuleResult("toy")
    collect(work, "toy", result, equivalent={})
    assert len(result.harness) == len(harness) and all(h["status"] == "survived" for h in result.harness)
    total = score([result])
    assert (total.checked, total.harness, total.equivalent, total.scored) == (
        len(mutants),
        len(harness),
        0,
        len(mutants) - len(harness),
    )


def test_two_sites_on_one_line_have_two_identities(tmp_path: Path) -> None:
    work = mutmut_run(tmp_path, "toy", "def f(a):\n    return a.reshape(1, -1), a.reshape(2, -1)\n")
    ids = [m.id for m in read_mutants((work / "mutants/builders/kvlab/toy.py").read_text(), "toy").values()]
    assert len(ids) == len(set(ids))
    # `-1` → `-2` in either call: the same text twice on the line, told apart by their order on it.
    assert {MutantId("toy", "f", 1, "1 → 2 (2nd)"), MutantId("toy", "f", 1, "1 → 2 (3rd)")} <= set(ids)


def test_a_kept_result_is_judged_again_by_identity() -> None:
    entry: dict[str, str | int] = {
        "mutant": "x_f__mutmut_3",
        "module": "toy",
        "function": "f",
        "line": 4,
        "operator": "0 → 1",
        "change": "x = 1",
    }
    result = ModuleResult("toy", total=1, survived=[entry])
    result.judge({MutantId("toy", "f", 4, "0 → 1"): "argued"})
    assert result.survived == [] and result.equivalent[0]["why"] == "argued"
    result.judge({MutantId("toy", "f", 5, "0 → 1"): "another line"})
    assert result.equivalent == [] and result.survived == [entry]


def test_mutmut_function_names_read_as_the_source_names_them() -> None:
    assert function_name("xǁHybridLayoutǁ_groups") == "HybridLayout._groups"
    assert function_name("x_spans_of") == "spans_of"


def test_every_equivalence_argument_names_a_function_that_exists() -> None:
    for module in MODULES:
        tree = ast.parse((ROOT / "builders" / "kvlab" / f"{module}.py").read_text())
        names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)} | {
            f"{c.name}.{f.name}"
            for c in tree.body
            if isinstance(c, ast.ClassDef)
            for f in c.body
            if isinstance(f, ast.FunctionDef)
        }
        stale = [i for i in EQUIVALENT if i.module == module and i.function not in names]
        assert stale == [], f"arguments for functions {module}.py no longer has: re-run `nox -s kvlab-mutation`"
    assert all(len(why) > 20 for why in EQUIVALENT.values())
