"""Imports run down the layers of `builders/`: count the arrows that run back up, and let the count only fall.

The layers are data here, lowest first, and docs/architecture.md explains them. Every package and top-level
module of builders/ must sit in one, so a new one cannot slip past the count. An arrow is one import edge of
test_imports.import_graph() (deferred imports inside functions, `if TYPE_CHECKING:` imports and loads by name all
counted, so 0 means none) whose importing module sits in a lower layer than the module it imports.
"""

from __future__ import annotations

import re

from test_imports import PACKAGE, import_graph

ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"

LAYERS: list[tuple[str, set[str]]] = [
    (
        "foundations",
        {
            "errors",
            "interrupt",
            "log",
            "output",
            "cpusets",
            "emulation",
            "gpu_archs",
            "cuda_driver",
            "gpu_image",
            "locks",
            "redact",
            "input_files",
            "runs",
            "records",
            "results",
        },
    ),
    ("router", {"router"}),
    ("config and data", {"config", "distros", "platforms", "target", "registry", "diagnose"}),
    ("container engines", {"container"}),
    (
        "planning",
        {"plan", "options", "render", "serving_dtype", "sources", "trust", "bootstrap", "rebuild", "gates", "cache"},
    ),
    ("serving engines", {"engines"}),
    ("build", {"project", "preflight", "build", "context", "report", "repro", "publish", "verify"}),
    ("runtime", {"traffic", "kvlab", "smoke", "sweep", "deploy", "gpu_probe", "gpu_smoke"}),
    ("CLI edge", {"cli", "commands"}),
]

# A ratchet: what was measured when this test was written (7 package arrows, carried by 10 module edges), then 0
# once issue 35 moved code; issue 55 made the graph count type-only imports and loads by name, and it is 0 still.
# Lower these as arrows are removed, never raise them; issue 55's bound is at most 3 package arrows.
MAX_PACKAGE_ARROWS = 0
MAX_MODULE_EDGES = 0


def unit(module: str) -> str:
    """The package or top-level module of builders/ a module belongs to (`builders.smoke.plan` → `smoke`)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def layer_of() -> dict[str, int]:
    found: dict[str, int] = {}
    for rank, (_, units) in enumerate(LAYERS):
        for name in units:
            assert name not in found, f"{name} is in two layers"
            found[name] = rank
    return found


def upward_edges(graph: dict[str, set[str]], layers: dict[str, int]) -> list[tuple[str, str]]:
    """Import edges from a module in a lower layer to one in a higher layer, sorted."""
    return sorted(
        (src, dst)
        for src, deps in graph.items()
        if src != "builders"
        for dst in deps
        if dst != "builders" and layers[unit(src)] < layers[unit(dst)]
    )


def test_every_package_and_module_has_a_layer() -> None:
    units = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"} | {
        p.parent.name for p in PACKAGE.glob("*/__init__.py")
    }
    layers = layer_of()
    assert sorted(units - set(layers)) == [], "add each new package or module to a layer in LAYERS"
    assert sorted(set(layers) - units) == [], "LAYERS names a package or module builders/ no longer has"


def test_an_upward_edge_is_counted_and_a_downward_one_is_not() -> None:
    layers = {"low": 0, "high": 1}
    graph = {"builders.low.a": {"builders.high.b"}, "builders.high.b": {"builders.low.c"}, "builders.low.c": set()}
    assert upward_edges(graph, layers) == [("builders.low.a", "builders.high.b")]


def test_arrows_back_up_the_layers_do_not_grow() -> None:
    edges = upward_edges(import_graph(), layer_of())
    names = [name for name, _ in LAYERS]
    ranks = layer_of()
    packages = sorted({(unit(src), unit(dst)) for src, dst in edges})
    for src, dst in packages:
        print(f"{src} ({names[ranks[src]]}) -> {dst} ({names[ranks[dst]]})")
    for src, dst in edges:
        print(f"  {src} -> {dst}")
    assert len(packages) <= MAX_PACKAGE_ARROWS, f"a new arrow back up the layers: {packages}"
    assert len(edges) <= MAX_MODULE_EDGES, f"a new import back up the layers: {edges}"


def documented_layers(text: str) -> list[tuple[str, set[str]]]:
    """The rows `| 0 | foundations | `errors.py`, `config/` | … |` of the layer table, as (name, members)."""
    rows = re.findall(r"^\| (\d+) \| ([^|]+) \| ([^|]+) \|", text, flags=re.MULTILINE)
    return [
        (name.strip(), {m.removesuffix(".py").removesuffix("/") for m in re.findall(r"`([^`]+)`", members)})
        for _, name, members in rows
    ]


def test_documented_layers_parse_names_and_members() -> None:
    text = "| # | layer |\n| 0 | low | `errors.py`, `config/` | owns |\n| 1 | high | `cli.py` | x |\n"
    assert documented_layers(text) == [("low", {"errors", "config"}), ("high", {"cli"})]


def test_the_layer_table_in_architecture_md_is_this_one() -> None:
    assert documented_layers(ARCHITECTURE.read_text()) == LAYERS, "docs/architecture.md's layer table and LAYERS differ"
