"""Reproducibility and the CI image pipeline: forge.lock, verify-repro, SBOMs, rendered CI workflows.

Submodules are imported where used: builders.build imports the lock and SBOM phases, and verify-repro
imports builders.build, so this package's top level imports nothing.
"""
