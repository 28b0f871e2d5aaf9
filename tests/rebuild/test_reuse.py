"""Which stages ran and which came from the cache, read from real BuildKit and buildah (podman build) logs."""

from __future__ import annotations

from pathlib import Path

from builders.rebuild.reuse import stage_reuse, verdict

FIXTURES = Path(__file__).parent / "fixtures"
LOGS = Path(__file__).parents[1] / "logs"


def test_a_buildkit_build_with_every_step_cached_reused_both_stages() -> None:
    log = (FIXTURES / "buildkit-router-debian12-all-cached.log").read_text()
    stages = stage_reuse(log)
    assert {name: s.verdict for name, s in stages.items()} == {"venv": "reused", "runtime": "reused"}
    # venv 2/6 … 6/6 and runtime 2/7 … 7/7: every non-FROM step, each counted once.
    assert (stages["venv"].cached, stages["runtime"].cached) == (5, 6)


def test_a_buildkit_build_that_compiled_rebuilt_its_stages() -> None:
    log = (LOGS / "gcc-gate--debian12-forced-build-captured.log").read_text(errors="replace")
    assert verdict(log, "toolchain") == "rebuilt"
    assert verdict(log, "wheel") == "rebuilt"
    assert verdict(log, "extension") == "not in log"


def test_a_podman_build_names_stages_from_their_from_lines() -> None:
    log = (FIXTURES / "podman-router-debian12-venv-built.log").read_text()
    stages = stage_reuse(log)
    assert set(stages) == {"venv", "runtime"}
    assert stages["venv"].verdict == "rebuilt" and stages["venv"].cached == 0 and stages["venv"].ran == 8
    # SHELL and ARG came from the cache (they match the venv stage's), the rest of runtime ran.
    assert stages["runtime"].cached == 2 and stages["runtime"].ran == 21


def test_a_buildah_stage_whose_steps_all_came_from_the_cache_is_reused() -> None:
    # The shape of the podman fixture above with every step answered by `--> Using cache`.
    log = "\n".join(
        [
            "[1/2] STEP 1/3: FROM forge/base:debian-12 AS env",
            '[1/2] STEP 2/3: SHELL ["/bin/bash", "-o", "pipefail", "-c"]',
            "--> Using cache 8d21759256d5efe762d22a6d84f2e149bc361726726914647649ad610bdd9d99",
            "--> 8d21759256d",
            "[1/2] STEP 3/3: RUN pip install -r requirements.txt",
            "--> Using cache 4a859bb65827361759ae2ab6fe5c2a5d24304ab397a0740cc88e594765d196b9",
            "--> 4a859bb6582",
            "[2/2] STEP 1/2: FROM env AS extension",
            "[2/2] STEP 2/2: RUN pip wheel .",
            "building",
            "--> 5638c26e212",
        ]
    )
    assert verdict(log, "env") == "reused" and verdict(log, "extension") == "rebuilt"


def test_buildahs_interleaved_stages_are_told_apart_by_their_index() -> None:
    # A Python-only edit of the dev loop's small project on Podman: the venv stage's COPY --from=extension is
    # printed, then the whole extension stage (all from the cache), then the COPY's own cache line, then the
    # package layer, which ran. Read by the last FROM alone, that layer made the extension look rebuilt.
    log = (FIXTURES / "podman-devtree-python-edit-interleaved.log").read_text()
    stages = stage_reuse(log)
    assert {name: s.verdict for name, s in stages.items()} == {
        "toolchain": "reused",
        "env": "reused",
        "extension": "reused",
        "venv": "rebuilt",
    }
    assert (stages["extension"].cached, stages["extension"].ran) == (6, 0)
    # venv: SHELL, ARG, the requirements, the venv, the wheels and their install from the cache; the package
    # COPY and its compile ran.
    assert (stages["venv"].cached, stages["venv"].ran) == (6, 2)


def test_a_buildah_step_whose_stage_moved_on_without_a_cache_line_ran() -> None:
    log = "\n".join(
        [
            "[1/2] STEP 1/3: FROM base AS a",
            "[1/2] STEP 2/3: RUN make",
            "compiling",
            "--> 1111111111a",
            "[2/2] STEP 1/2: FROM base AS b",
            "[2/2] STEP 2/2: COPY --from=a /out /out",
            "[1/2] STEP 3/3: RUN make install",
            "--> Using cache 2222222222222222222222222222222222222222222222222222222222222222",
            "--> 2222222222b",
            "--> 3333333333c",
        ]
    )
    stages = stage_reuse(log)
    assert (stages["a"].cached, stages["a"].ran) == (1, 1)
    # b's COPY got no cache line of its own (the one printed answered a's later step): it ran.
    assert (stages["b"].cached, stages["b"].ran) == (0, 1)


def test_a_log_of_neither_format_names_no_stage() -> None:
    assert stage_reuse("Step 1/3 : FROM debian\n ---> Using cache\n") == {}
