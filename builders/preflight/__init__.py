"""Preflight: learn in seconds, not after a 40-minute compile, whether a distro can build a target.

`run_preflight` (runner.py) hands one context to the recipe's serving engine, whose gates come from its own
source (file and line), the distro file, the real base image when the container engine has it, the build host
and the torch index; each finding says what to do instead. `forge preflight` is command.py, and the gate that
refuses a GPU an image has no kernels for is gpu_gate.py.
"""

from builders.gates.findings import Finding, PreflightReport, render_table
from builders.gates.host import derive_max_jobs
from builders.preflight.runner import run_preflight

__all__ = ["Finding", "PreflightReport", "derive_max_jobs", "render_table", "run_preflight"]
