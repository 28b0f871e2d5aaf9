"""Bases from Debian's archive: snapshot archives past Valid-Until, and failures that say what happened."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from builders.bootstrap import bootstrap, bootstrap_failure, remove_stale_tempdir, stale_tempdir
from builders.container import Engine
from builders.distros import family_for
from builders.errors import BaseUnavailable
from builders.project import Project

LOGS = Path(__file__).parents[1] / "logs"


def test_an_expired_archive_is_accepted_only_where_the_distro_says_so(project: Project) -> None:
    d14 = family_for(project.distro("debian-14")).bootstrap_command("/x.tar")
    d13 = family_for(project.distro("debian-13")).bootstrap_command("/x.tar")
    # --aptopt also lands in the base's /etc/apt/apt.conf.d, so apt-get in later build stages accepts it too.
    assert '--aptopt=Acquire::Check-Valid-Until "false"' in d14
    assert not any("Check-Valid-Until" in arg for arg in d13)
    assert d14[-3:] == ["forky", "/x.tar", "http://deb.debian.org/debian"]


def test_an_expired_release_file_points_at_the_schema_field(project: Project) -> None:
    err = bootstrap_failure(
        project.distro("debian-14"), (LOGS / "release-expired--mmdebstrap-forky-snapshot-captured.log").read_text()
    )
    assert "release-expired" in err.message and "is expired (invalid since 24d" in err.message
    assert err.hint is not None
    assert "check_valid_until: false" in err.hint and "distros/debian-14.yaml" in err.hint
    assert "reachable" not in err.message


def test_an_unreachable_mirror_names_the_host(project: Project) -> None:
    err = bootstrap_failure(
        project.distro("debian-14"),
        (LOGS / "mirror-unreachable--mmdebstrap-unresolvable-host-captured.log").read_text(),
    )
    assert "mirror-unreachable" in err.message and "Could not resolve 'no-such-mirror.invalid'" in err.message
    assert err.hint is not None and "base.bootstrap.mirror" in err.hint and "distros/debian-14.yaml" in err.hint
    assert "check_valid_until" not in err.hint


def test_a_clock_behind_is_not_an_expired_archive(project: Project) -> None:
    # apt's wording when the host's clock is behind the archive's Date.
    output = (
        "E: Release file for http://deb.debian.org/debian/dists/forky/InRelease is not valid yet (invalid for "
        "another 2d 0h 56min 20s). Updates for this repository will not be applied.\n"
    )
    err = bootstrap_failure(project.distro("debian-14"), output)
    assert "release-not-yet-valid" in err.message
    assert err.hint is not None and "clock" in err.hint and "check_valid_until: false" not in err.hint


def test_a_missing_archive_key_points_at_the_keyring(project: Project) -> None:
    # apt's wording when the keyring lacks the archive's signing key.
    output = (
        "W: GPG error: http://deb.debian.org/debian forky InRelease: The following signatures couldn't be verified "
        "because the public key is not available: NO_PUBKEY 762F67A0B2C39DE4\n"
        "E: The repository 'http://deb.debian.org/debian forky InRelease' is not signed.\n"
    )
    err = bootstrap_failure(project.distro("debian-14"), output)
    assert "archive-key" in err.message and "NO_PUBKEY 762F67A0B2C39DE4" in err.message
    assert err.hint is not None and "base.bootstrap.keyring" in err.hint and "distros/debian-14.yaml" in err.hint


def test_an_unknown_failure_keeps_the_tools_last_lines(project: Project) -> None:
    err = bootstrap_failure(project.distro("debian-13"), "I: something\nE: dpkg was interrupted\n")
    assert "E: dpkg was interrupted" in err.message and err.hint is not None and "forge diagnose" in err.hint


@pytest.mark.engine
@pytest.mark.timeout(120, func_only=True)
def test_the_real_snapshot_archive_is_refused_without_the_field(project_copy: Path, engine: Engine) -> None:
    """Against the real archive: without check_valid_until the bootstrap stops, saying why and what to set."""
    path = project_copy / "distros" / "debian-14.yaml"
    text = path.read_text()
    assert "check_valid_until: false" in text
    path.write_text(text.replace("check_valid_until: false", "check_valid_until: true"))
    distro = Project.load(project_copy).distro("debian-14")
    try:
        bootstrap(distro, engine)
    except BaseUnavailable as err:
        assert "is expired" in err.message or "not valid yet" in err.message
        assert err.hint is not None and "check_valid_until: false" in err.hint
    else:
        pytest.skip("this mirror serves a live archive, within its Valid-Until: nothing to refuse")


# mmdebstrap 1.3.5's last lines in the loaded CI run of 2026-12-03 (issue 34): a complete tarball, then a
# /proc still mounted in the chroot when it removed its tempdir.
LOADED_CI_TAIL = """I: cleaning package lists and apt cache...
I: creating tarball...
I: done
I: removing tempdir /tmp/mmdebstrap.0ZmUo9VM3r...
rm: skipping '/tmp/mmdebstrap.0ZmUo9VM3r/proc', since it's on a different device
E: rm failed: 256
"""


def test_a_tempdir_left_after_a_complete_tarball_is_named_for_removal() -> None:
    assert stale_tempdir(LOADED_CI_TAIL) == Path("/tmp/mmdebstrap.0ZmUo9VM3r")


@pytest.mark.parametrize(
    "output",
    [
        # an error before the tarball: a failed bootstrap, whatever its cleanup did
        LOADED_CI_TAIL.replace("I: creating tarball...", "E: apt-get download failed\nI: creating tarball..."),
        # the tarball never finished
        LOADED_CI_TAIL.replace("I: done\n", ""),
        # no tarball step at all
        LOADED_CI_TAIL.replace("I: creating tarball...\n", ""),
        # the removal did not fail
        LOADED_CI_TAIL.replace("E: rm failed: 256\n", ""),
        # a path that is not mmdebstrap's own tempdir is never removed
        LOADED_CI_TAIL.replace("/tmp/mmdebstrap.0ZmUo9VM3r", "/var/lib/docker"),
        LOADED_CI_TAIL.replace("/tmp/mmdebstrap.0ZmUo9VM3r", "/tmp/mmdebstrap.x/../../etc"),
    ],
    ids=["error-before", "unfinished-tar", "no-tar", "removal-ok", "foreign-path", "escaping-path"],
)
def test_any_other_failure_stays_a_failure(output: str) -> None:
    assert stale_tempdir(output) is None


def test_a_stale_tempdir_is_removed(tmp_path: Path) -> None:
    stale = Path(tempfile.mkdtemp(prefix="mmdebstrap."))
    (stale / "proc").mkdir()
    (stale / "etc").mkdir()
    (stale / "etc" / "hostname").write_text("x")
    remove_stale_tempdir(stale)
    assert not stale.exists()
