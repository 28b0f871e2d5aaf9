"""Preflight: learn in seconds, not after a 40-minute compile, whether a distro can build a target.

Gates come from the vLLM source itself (file and line), the distro file, the real base image when the engine
has it, the build host and the torch index; each finding says what to do instead.
"""

from builders.engines.vllm.source_facts import SourceFacts, read_source_facts
from builders.gates.findings import Finding, PreflightReport, render_table
from builders.gates.host import derive_max_jobs
from builders.preflight.runner import default_source_path, run_preflight

__all__ = [
    "Finding",
    "PreflightReport",
    "SourceFacts",
    "default_source_path",
    "derive_max_jobs",
    "read_source_facts",
    "render_table",
    "run_preflight",
]
