"""Caches that outlive the machine a build ran on: the compiler launcher's shared backend (sccache over Redis,
S3, WebDAV or the GitHub Actions cache; ccache on the engine's cache mount by default), the registry that holds a
build's layers for the next runner, and the policy that keeps either from ever being the reason a build fails.

settings.py reads what the user asked for (flags, FORGE_* and sccache's own variables), probe.py asks each
backend before any compile whether it answers, secret.py hands credentials to the compile step alone,
layers.py keys and checks the registry's layer cache, sccache_stats.py reads the compile's counters back, and
phase.py is what builders/build.py calls.
"""
