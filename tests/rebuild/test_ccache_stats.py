"""ccache's counters, parsed from real `ccache --print-stats` output and found in build logs by their markers."""

from __future__ import annotations

from pathlib import Path

import pytest

from builders.errors import UsageError
from builders.rebuild.ccache_stats import BEGIN, END, parse_print_stats, stats_block, stats_from_log

FIXTURES = Path(__file__).parent / "fixtures"


def _stats(name: str) -> str:
    return (FIXTURES / f"ccache-4.7.5-{name}.stats").read_text()


def test_a_cold_compile_is_all_misses() -> None:
    stats = parse_print_stats(_stats("cold"))
    assert (stats.hits, stats.misses, stats.uncacheable, stats.errors) == (0, 2, 0, 0)
    assert stats.hit_rate == 0.0 and stats.compiles == 2


def test_nothing_changed_is_all_direct_hits() -> None:
    stats = parse_print_stats(_stats("warm"))
    assert (stats.direct_hits, stats.preprocessed_hits, stats.misses) == (2, 0, 0)
    assert stats.hit_rate == 1.0 and stats.compiles == 0


def test_one_edited_file_is_one_miss_and_one_hit() -> None:
    stats = parse_print_stats(_stats("one-edit"))
    assert (stats.hits, stats.misses) == (1, 1) and stats.hit_rate == 0.5


def test_a_preprocessed_hit_counts_as_a_hit_and_a_link_as_uncacheable() -> None:
    stats = parse_print_stats(_stats("comment-edit-and-link"))
    # The comment made the direct lookup miss, the preprocessed text was the same: a hit, not a miss.
    assert (stats.direct_hits, stats.preprocessed_hits, stats.misses) == (1, 1, 0)
    assert stats.uncacheable == 1 and stats.compiles == 1
    assert stats.as_report()["hits"] == 2


def test_zeroed_counters_have_no_rate() -> None:
    stats = parse_print_stats(_stats("zero"))
    assert stats.hits == stats.misses == 0 and stats.hit_rate is None


def test_a_line_that_is_not_a_counter_is_named() -> None:
    with pytest.raises(UsageError, match=r"log:3: 'Hits: 5'"):
        parse_print_stats("direct_cache_hit\t1\ncache_miss\t0\nHits: 5\n", where="log")
    with pytest.raises(UsageError, match="direct_cache_hit"):
        parse_print_stats("cache_miss\t3\n")


def _buildkit_run(step: int, lines: list[str]) -> str:
    # The prefix BuildKit's plain progress gives a RUN's output, as in tests/logs/*-buildkit.log.
    return "\n".join(f"#{step} {1.5 + i / 100:.3f} {line}" for i, line in enumerate(lines))


def test_the_block_is_found_in_a_buildkit_log_and_the_run_line_is_not_taken_for_it() -> None:
    counters = _stats("one-edit").splitlines()
    log = "\n".join(
        [
            f"#12 [extension 3/3] RUN ccache -z && pip wheel . && echo {BEGIN} && ccache --print-stats && echo {END}",
            _buildkit_run(12, ["Building wheel for demo", BEGIN, *counters, END]),
            "#12 DONE 4.1s",
        ]
    )
    stats = stats_from_log(log)
    assert stats is not None and (stats.hits, stats.misses) == (1, 1)


def test_the_block_is_found_in_a_plain_buildah_log() -> None:
    log = "\n".join(
        ["[3/5] STEP 4/4: RUN ccache -z && make", "make: ok", BEGIN, _stats("warm"), END, "--> 4a859bb6582"]
    )
    stats = stats_from_log(log)
    assert stats is not None and stats.hits == 2


def test_a_log_without_the_block_has_no_stats() -> None:
    assert stats_block("#12 [extension 3/3] RUN pip wheel .\n#12 CACHED\n") is None
    assert stats_from_log(f"{BEGIN}\ndirect_cache_hit\t1\n") is None  # cut off before END: nothing trusted
