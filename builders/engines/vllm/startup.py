"""Where a vLLM replica's start-up time goes, read from its own log (issue 41).

vLLM prints some durations itself (weights, torch.compile, the engine's profile/KV-cache/warm-up step) and stamps
every line with `MM-DD HH:MM:SS` in the process's local time. The parts below come from those printed figures
where vLLM gives one, else from the difference of two stamps (1 s resolution). The stamps carry no year and no
zone, so they are only ever subtracted from each other, never compared with Forge's clock: what happens before
the first line (container start, interpreter, `import torch`/`import vllm`) is the replica's measured time to
health minus the span its log covers, which is also why the last marker used is "Starting vLLM API server", the
last stamped line before /health answers (uvicorn's own lines after it carry no stamp).

A part whose marker is missing is None, never 0: an eager replica has no compile, an older vLLM may word a line
differently, and a guessed zero would read as "this part costs nothing".
"""

from __future__ import annotations

import re
from datetime import datetime

_STAMP = re.compile(r"(?:INFO|WARNING|ERROR|DEBUG) (\d\d-\d\d \d\d:\d\d:\d\d)")
# Each marker: the line that ends (or begins) a part, worded as vLLM 0.32/0.33 print them.
_MARKERS = {
    # The model's config read and its class inspected by the registry (in a subprocess that imports torch and the
    # model code, unless VLLM_CACHE_ROOT/modelinfos already holds it): the API server's first expensive step.
    "architecture": re.compile(r"Resolved architecture"),
    "engine_core": re.compile(r"Initializing a V1 LLM engine"),
    "load_start": re.compile(r"Starting to load model"),
    # Real weights print "Loading weights took 1.62 seconds"; `--load-format dummy` (Forge's tiny models) prints
    # "Initializing model took 0.179622 seconds" instead (vLLM 0.32).
    "weights": re.compile(r"(?:Loading weights|Initializing model) took ([\d.]+) s"),
    "model_loaded": re.compile(r"Model loading took .*? and ([\d.]+) s"),
    "compile": re.compile(r"torch\.compile takes ([\d.]+) s in total"),
    # "init engine (profile, create kv cache, warmup model) took 0.20 s" (0.32), "... took 38.12 seconds" and
    # "init engine took 22.78 seconds" in other releases.
    "engine_init": re.compile(r"init engine(?: \([^)]*\))? took ([\d.]+) s"),
    # The API server's last stamped line before uvicorn serves: "Starting vLLM server on" (0.32) or "Starting
    # vLLM API server 0 on" (0.33); uvicorn's own "Application startup complete" carries no vLLM stamp.
    "app_ready": re.compile(r"Starting vLLM (?:API )?server"),
}


def _stamp(line: str) -> datetime | None:
    found = _STAMP.search(line)
    if found is None:
        return None
    # A leap day is a valid stamp, so parse it inside a leap year; the year never matters (differences only).
    try:
        return datetime.strptime(f"2024-{found.group(1)}", "%Y-%m-%d %H:%M:%S")
    except ValueError:  # not a date after all (a line quoting something else): not a stamp
        return None


def startup_parts(log: str, *, healthy_after_s: float | None) -> dict[str, float | None]:
    """The parts of one replica's start, in seconds, from its log and its measured time to health."""
    first: datetime | None = None
    stamps: dict[str, datetime] = {}
    printed: dict[str, float] = {}
    for line in log.splitlines():
        stamp = _stamp(line)
        if stamp is None:
            continue
        first = first or stamp
        for name, pattern in _MARKERS.items():
            found = pattern.search(line)
            if found is None or name in stamps:
                continue
            stamps[name] = stamp
            if found.groups():
                printed[name] = float(found.group(1))

    def between(start: str | datetime | None, end: str) -> float | None:
        begin = stamps.get(start) if isinstance(start, str) else start
        if begin is None or end not in stamps:
            return None
        # A log that crosses midnight at a year's end would go negative: say nothing rather than something wrong.
        seconds = (stamps[end] - begin).total_seconds()
        return seconds if seconds >= 0 else None

    span = between(first, "app_ready")
    loaded = "model_loaded" if "model_loaded" in stamps else "weights"
    before_first_line = None
    if span is not None and healthy_after_s is not None and healthy_after_s >= span:
        before_first_line = round(healthy_after_s - span, 1)
    return {
        "before_first_line_s": before_first_line,
        "api_server_s": between(first, "engine_core"),
        "model_inspect_s": between(first, "architecture"),
        "engine_core_s": between("engine_core", "load_start"),
        "model_load_s": between("load_start", loaded),
        "weights_s": printed.get("weights"),
        "engine_init_s": printed.get("engine_init"),
        "compile_s": printed.get("compile"),
        "api_ready_s": between("engine_init", "app_ready"),
        "healthy_after_s": healthy_after_s,
    }
