"""The ranking measured for real on a short run: what each layout reads follows from its definition, and the
report (tables, plot) is written."""

from __future__ import annotations

from pathlib import Path

from builders.kvlab import rank
from builders.kvlab.command import render_rank
from builders.kvlab.spec import AttnSpec


def test_short_ranking_measures_and_ranks(tmp_path: Path) -> None:
    results = rank.run_ranking(quick=True, steps=1)
    by_name = {r.layout: r for r in results}
    assert set(by_name) == {"paged", "spans", "virtual", "hybrid"}
    share = by_name["paged"].measures["share-90"]
    assert share.shared_fraction > 0.5
    # Hybrid reads the shared prefix once per batch; the others once per request.
    assert by_name["hybrid"].measures["share-90"].kv_bytes_read_per_step < 0.5 * share.kv_bytes_read_per_step
    # The kernel of the virtual layout sees a pointer and a length; a block table grows with the context.
    longest = "len-256"
    assert by_name["virtual"].measures[longest].metadata_bytes_per_request == 12
    assert by_name["paged"].measures[longest].metadata_bytes_per_request > 4 * 256 // rank.BLOCK_SIZE
    # A shuffled pool breaks tables into runs; a fresh one hands out one run per request.
    assert (
        by_name["spans"].measures["frag-shuffled"].runs_per_request
        > by_name["spans"].measures["frag-fresh"].runs_per_request
    )
    assert by_name["virtual"].measures[longest].kv_bytes_copied_per_step > 0

    rows = rank.rank(results, {name: name != "spans" for name in by_name}, quick=True)
    assert [row["place"] for row in rows][-1] is None and rows[-1]["layout"] == "spans"
    assert [row["place"] for row in rows[:3]] == [1, 2, 3]
    text = render_rank(results, rows, quick=True)
    assert "| — | spans | FAIL |" in text
    png = rank.write_plots(results, tmp_path, quick=True)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_ties_share_their_places() -> None:
    assert rank._ranks({"a": 1.0, "b": 1.0, "c": 0.5}) == {"c": 1, "a": 2.5, "b": 2.5}


def test_measure_counts_one_indirection_per_token_for_the_paged_table() -> None:
    spec = AttnSpec(num_heads=4, num_kv_heads=1, head_size=64)
    scenario = rank.Scenario(name="s", axis="length", seq_len=40)
    m = rank.measure("paged", spec, scenario, steps=1)
    # Batch of 8 with lengths 40, 37, …, 19, each one token longer after the step.
    assert m.indirections_per_request == sum(40 - 3 * i + 1 for i in range(rank.BATCH)) / rank.BATCH
