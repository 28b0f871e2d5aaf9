"""ccache's counters as the extension stage prints them (`ccache --print-stats`: one `name<TAB>value` a line,
ccache 4.x), found in a build log between the markers the template prints around them."""

from __future__ import annotations

import re
from dataclasses import dataclass

from builders.errors import UsageError

# Printed by containers/_devloop.j2's extension stage around `ccache --print-stats`, each alone on its line:
# the RUN line that prints them also holds the words, but never alone.
BEGIN = "FORGE-CCACHE-STATS-BEGIN"
END = "FORGE-CCACHE-STATS-END"

# ccache 4.x (src/core/Statistics.cpp) counts a call it cannot cache under one of these: a link, a
# preprocess-only call, an autoconf probe, an option or language it does not handle.
UNCACHEABLE = (
    "autoconf_test",
    "bad_compiler_arguments",
    "called_for_link",
    "called_for_preprocessing",
    "compiler_produced_empty_output",
    "compiler_produced_no_output",
    "compiler_produced_stdout",
    "could_not_use_modules",
    "could_not_use_precompiled_header",
    "multiple_source_files",
    "no_input_file",
    "output_to_stdout",
    "recache",
    "unsupported_code_directive",
    "unsupported_compiler_option",
    "unsupported_environment_variable",
    "unsupported_source_language",
)
ERRORS = (
    "bad_output_file",
    "compile_failed",
    "compiler_check_failed",
    "could_not_find_compiler",
    "error_hashing_extra_file",
    "internal_error",
    "missing_cache_file",
    "preprocessor_error",
)

# BuildKit's plain progress puts `#STEP SECONDS ` before each line a RUN prints; buildah and the legacy builder
# print the line as it is.
_BUILDKIT_PREFIX = re.compile(r"^#\d+ \d+\.\d+ ")


@dataclass(frozen=True, kw_only=True)
class CcacheStats:
    """What one compile asked of ccache: hits (found in the cache, either way), misses (compiled and stored),
    uncacheable calls (links and the like: compiled every time, never stored) and errors."""

    direct_hits: int
    preprocessed_hits: int
    misses: int
    uncacheable: int
    errors: int

    @property
    def hits(self) -> int:
        return self.direct_hits + self.preprocessed_hits

    @property
    def compiles(self) -> int:
        """Calls that ran the compiler: misses, and uncacheable calls (a link is one)."""
        return self.misses + self.uncacheable

    @property
    def hit_rate(self) -> float | None:
        """Hits over cacheable calls; None when there was none (a rate of 0/0 is no rate)."""
        total = self.hits + self.misses
        return round(self.hits / total, 4) if total else None

    def as_report(self) -> dict[str, int | float | None]:
        return {
            "hits": self.hits,
            "direct_hits": self.direct_hits,
            "preprocessed_hits": self.preprocessed_hits,
            "misses": self.misses,
            "uncacheable": self.uncacheable,
            "errors": self.errors,
            "hit_rate": self.hit_rate,
        }


def parse_print_stats(text: str, *, where: str = "ccache --print-stats") -> CcacheStats:
    """Parse ccache 4.x's machine-readable counters. A line that is not `name<TAB>integer` is an error naming it:
    the counters are the only thing between the markers."""
    counters: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        name, sep, value = line.strip().partition("\t")
        if not sep or not value.strip().isdigit():
            raise UsageError(
                f"{where}:{number}: {line.strip()!r} is not a `name<TAB>count` line of ccache --print-stats",
                hint="ccache 4.x prints these; an older ccache (3.x) has no --print-stats",
            )
        counters[name] = int(value)
    if "direct_cache_hit" not in counters:
        raise UsageError(f"{where}: no direct_cache_hit counter", hint="is this ccache --print-stats output?")
    return CcacheStats(
        direct_hits=counters.get("direct_cache_hit", 0),
        preprocessed_hits=counters.get("preprocessed_cache_hit", 0),
        misses=counters.get("cache_miss", 0),
        uncacheable=sum(counters.get(name, 0) for name in UNCACHEABLE),
        errors=sum(counters.get(name, 0) for name in ERRORS),
    )


def stats_block(log: str) -> str | None:
    """The text between the last BEGIN/END marker pair of a build log, its BuildKit prefixes removed; None when the
    log has none (the extension stage came from the cache and printed nothing)."""
    block: list[str] | None = None
    found: str | None = None
    for raw in log.splitlines():
        line = _BUILDKIT_PREFIX.sub("", raw).rstrip("\r")
        if line == BEGIN:
            block = []
        elif line == END and block is not None:
            found, block = "\n".join(block), None
        elif block is not None:
            block.append(line)
    return found


def stats_from_log(log: str, *, where: str = "build log") -> CcacheStats | None:
    block = stats_block(log)
    return None if block is None else parse_print_stats(block, where=where)
