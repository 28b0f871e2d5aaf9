"""The registry layer cache's keys, sccache's counters and the build-log line that blames the cache (engine-free;
tests/rebuild/test_ci_caches_engine.py drives them against real engines, Redis and a registry)."""

from __future__ import annotations

from builders.cache.layers import cache_failure, stage_keys, stage_names, tag_for
from builders.cache.sccache_stats import BEGIN, END, record_from_log

CONTAINERFILE = """FROM base AS toolchain
RUN apt-get install g++
FROM toolchain AS env
FROM env AS extension
FROM toolchain AS venv
FROM toolchain AS runtime-venv
FROM runtime-venv AS runtime
"""
PARTS = {"requirements": "r1", "compiler_inputs": "c1", "package": "p1"}


def _keys(**parts: str) -> dict[str, str]:
    return stage_keys(CONTAINERFILE, build_args={"A": "1"}, base_id="sha256:base", parts={**PARTS, **parts})


def test_a_python_edit_moves_only_the_runtime_key_and_a_cpp_edit_the_extension_too() -> None:
    before = _keys()
    assert (
        list(before)
        == stage_names(CONTAINERFILE)
        == ["toolchain", "env", "extension", "venv", "runtime-venv", "runtime"]
    )
    python = _keys(package="p2")
    assert [s for s in before if before[s] != python[s]] == ["runtime"]
    cpp = _keys(compiler_inputs="c2")
    assert [s for s in before if before[s] != cpp[s]] == ["extension", "runtime"]
    requirements = _keys(requirements="r2")
    assert [s for s in before if before[s] != requirements[s]] == [
        "env",
        "extension",
        "venv",
        "runtime-venv",
        "runtime",
    ]
    # Anything else that shapes the build moves every key: the base, the arguments, the Containerfile.
    other = stage_keys(CONTAINERFILE, build_args={"A": "2"}, base_id="sha256:base", parts=PARTS)
    assert all(other[s] != before[s] for s in before)
    assert tag_for("env", before["env"]) == "env-" + before["env"][:40]


def test_buildahs_failed_cache_push_is_the_caches_fault_and_a_compile_error_is_not() -> None:
    # buildah 1.28's own words when the registry was gone during --cache-to (Podman 4.3.1, 2026-12-04).
    pushed = (
        'Error: failed pushing cache to {{{"127.0.0.1:15999" "lc/bah"} "642dc57c"}}: trying to reuse blob '
        'sha256:f8ae at destination: pinging container registry 127.0.0.1:15999: Get "http://127.0.0.1:15999/v2/": '
        "dial tcp 127.0.0.1:15999: connect: connection refused"
    )
    assert cache_failure(f"STEP 2/2: RUN make\n{pushed}\n", "127.0.0.1:15999/lc/bah") == pushed[:300]
    # The same registry gone while another stage ran: buildah 1.28 panicked after this line (2026-12-04).
    panicked = (
        'time="2026-12-04T17:50:11Z" level=warning msg="Failed, retrying in 2s ... (3/3). Error: trying to reuse blob '
        'sha256:2540 at destination: pinging container registry 127.0.0.1:40137: Get \\"http://127.0.0.1:40137/v2/\\": '
        'dial tcp 127.0.0.1:40137: connect: connection refused"\n'
        "panic: runtime error: invalid memory address or nil pointer dereference\n"
        "github.com/containers/buildah/imagebuildah.(*StageExecutor).intermediateImageExists(0xc000490b60)\n"
    )
    found = cache_failure(panicked, "127.0.0.1:40137/forge-cache/devtree")
    assert found is not None and "pinging container registry 127.0.0.1:40137" in found
    compile_error = (
        "ops.cpp:3:1: error: expected ';' before '}' token\nError: building at STEP \"RUN make\": exit status 2\n"
    )
    assert cache_failure(compile_error, "127.0.0.1:15999/lc/bah") is None


def test_sccache_counters_are_read_per_backend_through_buildkits_prefixes() -> None:
    # The record containers/scripts/compiler_cache.py printed after Redis was killed mid-compile (host run).
    record = (
        '{"backend": "redis", "endpoint": "redis://127.0.0.1:16381/0", "events": ["redis redis://127.0.0.1:16381/0: '
        'stopped answering during the compile; the rest of the compile used the local cache folder"], "launcher": '
        '"sccache", "segments": [{"backend": "redis", "errors": 0, "hits": 1, "misses": 0, "not_cacheable": 0, '
        '"requests": 1, "writes": 0}, {"backend": "local", "errors": 0, "hits": 0, "misses": 2, "not_cacheable": 0, '
        '"requests": 2, "writes": 2}]}'
    )
    log = f"#14 3.1 {BEGIN}\n#14 3.1 {record}\n#14 3.2 {END}\n#14 DONE 3.3s\n"
    found = record_from_log(log)
    assert found is not None
    assert found["backends"]["redis"]["hits"] == 1 and found["backends"]["redis"]["hit_rate"] == 1.0
    assert found["backends"]["local"]["misses"] == 2 and found["backends"]["local"]["hit_rate"] == 0.0
    assert found["fallback"] and "stopped answering" in found["fallback"][0]
    assert record_from_log("#14 CACHED\n") is None


def test_the_summary_gives_hits_and_misses_per_backend_and_every_warning() -> None:
    from builders.rebuild.records import ReuseRecord
    from builders.report import reuse_lines

    counters = {"errors": 0, "hit_rate": None}
    reuse = ReuseRecord.model_validate(
        {
            "compiler_cache": {
                "launcher": "sccache",
                "backend": "redis",
                "endpoint": "redis://127.0.0.1:6379/0",
                "fallback": ["redis stopped answering"],
                "backends": {
                    "redis": {"hits": 486, "misses": 3, **counters},
                    "local": {"hits": 0, "misses": 1, **counters},
                },
            },
            "layer_cache": {
                "registry": "127.0.0.1:5000/c",
                "repository": "127.0.0.1:5000/c/debian-13-cpu",
                "mode": "registry",
                "imported": ["env (sha256:1)"],
                "exported": [],
                "export": False,
                "retried_without_registry": False,
            },
            "cache_warnings": ["redis redis://127.0.0.1:6379/0: stopped answering during the compile"],
        }
    )
    assert reuse_lines(reuse) == [
        "  sccache on redis: 486 hits, 3 misses, 0 errors",
        "  sccache on local: 0 hits, 1 misses, 0 errors",
        "  layer cache 127.0.0.1:5000/c/debian-13-cpu: imported env (sha256:1); exported nothing",
        "  cache warning: redis redis://127.0.0.1:6379/0: stopped answering during the compile",
    ]
