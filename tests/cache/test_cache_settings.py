"""What a user asks of the caches, read where it enters: URLs, credentials from the environment, the FORGE_*
variables, and the secret file the compile step gets (engine-free)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from builders.cache.secret import mask, scrub_file, secret_lines, sensitive, write_secret
from builders.cache.settings import LOCAL, parse_compiler_cache, resolve
from builders.errors import UsageError


def test_a_redis_url_keeps_its_password_out_of_everything_but_the_secrets() -> None:
    cache = parse_compiler_cache("redis://ci:s3cr3t-pw@cache.internal:6380/2", {})
    assert cache.launcher == "sccache" and cache.backend == "redis"
    assert cache.settings == {"SCCACHE_REDIS_ENDPOINT": "redis://cache.internal:6380", "SCCACHE_REDIS_DB": "2"}
    assert cache.secrets == {"SCCACHE_REDIS_USERNAME": "ci", "SCCACHE_REDIS_PASSWORD": "s3cr3t-pw"}
    assert "s3cr3t" not in cache.describe() and "s3cr3t" not in cache.endpoint


def test_credentials_come_from_the_variables_sccache_reads() -> None:
    cache = parse_compiler_cache("redis://127.0.0.1:6379", {"SCCACHE_REDIS_PASSWORD": "from-env", "HOME": "/root"})
    assert cache.secrets == {"SCCACHE_REDIS_PASSWORD": "from-env"}


def test_s3_needs_both_keys_and_names_them() -> None:
    with pytest.raises(UsageError, match="AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"):
        parse_compiler_cache("s3://forge-cache/objects?endpoint=http://127.0.0.1:9000", {})
    cache = parse_compiler_cache(
        "s3://forge-cache/objects?endpoint=http://127.0.0.1:9000&region=eu-west-1",
        {"AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": "secret-key"},
    )
    assert cache.settings == {
        "SCCACHE_BUCKET": "forge-cache",
        "SCCACHE_REGION": "eu-west-1",
        "SCCACHE_S3_KEY_PREFIX": "objects",
        "SCCACHE_ENDPOINT": "127.0.0.1:9000",
        "SCCACHE_S3_USE_SSL": "false",
    }


def test_gha_outside_an_action_says_what_it_needs() -> None:
    with pytest.raises(UsageError, match="ACTIONS_RUNTIME_TOKEN"):
        parse_compiler_cache("gha", {})


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("ftp://cache:21", "not a compiler cache"),
        ("redis://cache:6379/x", "not a number"),
        ("redis://ca che:6379", "host"),
        ("webdav+https://dav.example/p\nRUN rm -rf /", "control character"),
        ("redis://cache:6379/0?x=1\x00", "control character"),
    ],
)
def test_a_bad_url_is_a_usage_error_naming_the_flag(text: str, needle: str) -> None:
    with pytest.raises(UsageError, match=needle) as info:
        parse_compiler_cache(text, {})
    assert info.value.message.startswith("--compiler-cache")


def test_the_flags_win_over_the_variables_and_a_registry_takes_no_tag() -> None:
    environ = {"FORGE_COMPILER_CACHE": "redis://127.0.0.1:1", "FORGE_CACHE_REGISTRY": "127.0.0.1:5000/cache"}
    settings = resolve(
        compiler_cache=None, cache_registry=None, cache_export=None, require_cache=False, environ=environ
    )
    assert settings.compiler.endpoint == "redis://127.0.0.1:1/0" and settings.export and not settings.require
    assert settings.registry is not None and settings.registry.repository == "127.0.0.1:5000/cache"
    flags = resolve(
        compiler_cache="local", cache_registry=None, cache_export=False, require_cache=True, environ=environ
    )
    assert flags.compiler == LOCAL and not flags.export and flags.require
    with pytest.raises(UsageError, match=r"FORGE_CACHE_REGISTRY.*a repository, not an image"):
        resolve(
            compiler_cache=None,
            cache_registry=None,
            cache_export=None,
            require_cache=False,
            environ={"FORGE_CACHE_REGISTRY": "127.0.0.1:5000/cache:latest"},
        )
    with pytest.raises(UsageError, match="FORGE_REQUIRE_CACHE"):
        resolve(
            compiler_cache=None,
            cache_registry=None,
            cache_export=None,
            require_cache=False,
            environ={"FORGE_REQUIRE_CACHE": "perhaps"},
        )
    nothing = resolve(compiler_cache=None, cache_registry=None, cache_export=None, require_cache=False, environ={})
    assert not nothing.configured


def test_the_secret_file_is_private_and_holds_every_setting(tmp_path: Path) -> None:
    cache = parse_compiler_cache("redis://127.0.0.1:6379", {"SCCACHE_REDIS_PASSWORD": "pw-123456"})
    path = write_secret(cache, require=True, scratch=tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert path.read_text() == secret_lines(cache, require=True)
    lines = dict(line.split("=", 1) for line in path.read_text().splitlines())
    assert lines["SCCACHE_REDIS_PASSWORD"] == "pw-123456" and lines["FORGE_REQUIRE_CACHE"] == "1"
    assert lines["SCCACHE_REDIS_ENDPOINT"] == "redis://127.0.0.1:6379"


def test_a_credential_that_reached_the_log_is_masked(tmp_path: Path) -> None:
    cache = parse_compiler_cache("redis://u:longpassword@127.0.0.1:6379", {})
    log = tmp_path / "build.log"
    log.write_text("connecting with longpassword\nfine\n")
    assert scrub_file(log, sensitive(cache)) and log.read_text() == "connecting with ***\nfine\n"
    assert not scrub_file(log, sensitive(cache))
    assert mask("u", sensitive(cache)) == "u"  # a one-letter user name is not masked: it proves nothing
