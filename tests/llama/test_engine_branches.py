"""A second engine is one module, not ten branches: no code outside an engine's own module asks which engine it is.

The check parses every module of the package and flags a comparison that names an inference engine: a string
such as "llama-cpp" or "sglang" compared with anything, or anything called `engine` compared with an engine's
name. An engine's own package (builders/engines/llama_cpp/ for llama-cpp) may name it.
"""

from __future__ import annotations

import ast
from pathlib import Path

from builders.engines import ENGINES as REGISTRY

ROOT = Path(__file__).resolve().parents[2]
ENGINES: tuple[str, ...] = REGISTRY.names
# vLLM is the engine the rest of the package was written for; its name is also the sdist's source key ("vllm" in
# overrides), so a bare "vllm" string is not an engine branch. Compared with something called engine, it is.
OTHER_ENGINES = tuple(e for e in ENGINES if e != "vllm")


def _strings(node: ast.expr) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [s for item in node.elts for s in _strings(item)]
    return []


def _is_engine_name(node: ast.expr) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "engine") or (
        isinstance(node, ast.Name) and node.id == "engine"
    )


def engine_branches(source: str, filename: str) -> list[str]:
    """Lines of `source` that compare against an inference engine's name, as `file:line: text`."""
    tree = ast.parse(source, filename=filename)
    parts = Path(filename).parts
    own = {e for e in ENGINES if parts[:3] == ("builders", "engines", e.replace("-", "_"))}
    found: list[str] = []
    for node in ast.walk(tree):
        sides: list[ast.expr] = []
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
        elif isinstance(node, ast.Match):
            sides = [node.subject] + [c.pattern.value for c in node.cases if isinstance(c.pattern, ast.MatchValue)]
        names = {s for side in sides for s in _strings(side)}
        by_name = bool(names & set(OTHER_ENGINES))
        by_attribute = any(_is_engine_name(side) for side in sides) and bool(names & set(ENGINES))
        if (by_name or by_attribute) and not (names & set(ENGINES)) <= own:
            line = source.splitlines()[node.lineno - 1].strip()  # type: ignore[attr-defined]
            found.append(f"{filename}:{node.lineno}: {line}")  # type: ignore[attr-defined]
    return found


def test_the_package_has_no_branch_on_an_engine_outside_its_module() -> None:
    offenders: list[str] = []
    for path in sorted((ROOT / "builders").rglob("*.py")):
        offenders += engine_branches(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    assert offenders == [], "branch on an engine outside its module:\n" + "\n".join(offenders)


def test_the_check_finds_each_shape_of_branch() -> None:
    branches = [
        'if recipe.engine == "llama-cpp":\n    pass\n',
        'if engine != "vllm":\n    pass\n',
        'x = recipe.engine in ("sglang", "vllm")\n',
        'if "sglang" == name:\n    pass\n',
        'match recipe.engine:\n    case "llama-cpp":\n        pass\n',
    ]
    for snippet in branches:
        assert engine_branches(snippet, "builders/plan.py"), snippet
    # Not branches: the sdist's source key, an engine naming itself in its own module.
    assert engine_branches('if "vllm" in overrides:\n    pass\n', "builders/sources.py") == []
    assert engine_branches('if recipe.engine == "llama-cpp":\n    pass\n', "builders/engines/llama_cpp/image.py") == []
    # Another engine's package, or a module merely named like the engine, is not its own.
    assert engine_branches('if recipe.engine == "llama-cpp":\n    pass\n', "builders/engines/sglang/image.py")
    assert engine_branches('if recipe.engine == "llama-cpp":\n    pass\n', "builders/llama_cpp_extra.py")


def test_every_engine_but_vllm_has_its_module() -> None:
    for name in OTHER_ENGINES:
        assert (ROOT / "builders" / "engines" / name.replace("-", "_") / "image.py").is_file(), name
