"""SGLang as a serving engine, without an engine: a pool's knobs become SGLang's flags (each with its profile key),
its KV pool is sized like vLLM's, the key reaches the server without appearing on its command line, and the busy
gauge is read exactly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from builders.cli import build_parser
from builders.engines import ENGINES
from builders.engines.checks import CheckResult
from builders.engines.sglang import SGLang
from builders.engines.sglang.checks import parse_kernel_probe
from builders.engines.sglang.serve import ENTRY, KEY_ENV, SGLangPool, kv_tokens, parse_help
from builders.errors import ConfigError, PreflightBlocked, UsageError
from builders.report import CheckRecord
from builders.router.classes import ALL_CLASSES
from builders.serving_dtype import parse_cpuinfo
from builders.smoke.plan import plan_stack
from builders.smoke.profile import profile_from_mapping
from builders.smoke.runtimes import Runtimes

ROOT = Path(__file__).resolve().parents[2]


def _profile(pools: dict[str, Any], **extra: Any) -> Any:
    first = next(iter(pools))
    data = {"pools": pools, "classes": {c.value: first for c in ALL_CLASSES}, **extra}
    return profile_from_mapping(data, source="p.yaml", name="p")


def _flags(args: tuple[str, ...], keys: tuple[str, ...]) -> dict[str, tuple[str | None, str]]:
    """Each flag of a replica's argv with its value (None for a switch) and the profile key it came from."""
    out: dict[str, tuple[str | None, str]] = {}
    for i, token in enumerate(args):
        if token.startswith("--"):
            value = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else None
            out[token] = (value, keys[i])
    return out


def test_sglang_is_registered_beside_vllm_and_llama_cpp() -> None:
    engine = ENGINES.get("sglang")
    assert isinstance(engine, SGLang) and engine.serves and engine.model_format == "hf-dir"
    assert engine.pool_model is SGLangPool
    assert isinstance(
        _profile({"a": {"engine": "sglang", "sglang": {"max_running_requests": 3}}}).pools["a"], SGLangPool
    )


def test_smoke_and_sweep_take_the_sglang_image_or_a_host_python_and_endpoint_refuses_both() -> None:
    parser = build_parser()
    for command in ("smoke", "sweep"):
        args = parser.parse_args([command, "--sglang-image", "forge/debian-13-sglang:latest"])
        assert Runtimes.from_args(args).images == {"sglang": "forge/debian-13-sglang:latest"}
        args = parser.parse_args([command, "--local-sglang", "/usr/bin/python3"])
        assert Runtimes.from_args(args).local == {"sglang": Path("/usr/bin/python3")}
        args = parser.parse_args([command, "--sglang-image", "x:1", "--local-sglang", "/usr/bin/python3"])
        with pytest.raises(UsageError, match="--sglang-image or --local-sglang, not both"):
            Runtimes.from_args(args)
    args = parser.parse_args(["smoke", "--endpoint", "http://127.0.0.1:1", "--sglang-image", "x:1"])
    with pytest.raises(UsageError, match="--sglang-image"):
        args.func(args)


def test_the_seed_workload_controls_become_sglangs_flags_with_their_keys() -> None:
    knobs = {
        "chunked_prefill_size": 128,
        "max_running_requests": 16,
        "max_prefill_tokens": 256,
        "stream_interval": 1,
        "radix_cache": False,
        "mixed_chunk": True,
    }
    loaded = _profile({"a": {"engine": "sglang", "cpus": ["1"], "sglang": knobs}})
    (replica,) = plan_stack(loaded, run_id="t", base_port=25600).replicas
    flags = _flags(replica.args, replica.keys)
    assert flags["--chunked-prefill-size"] == ("128", "pools.a.sglang.chunked_prefill_size")
    assert flags["--max-running-requests"] == ("16", "pools.a.sglang.max_running_requests")
    assert flags["--max-prefill-tokens"] == ("256", "pools.a.sglang.max_prefill_tokens")
    assert flags["--disable-radix-cache"] == (None, "pools.a.sglang.radix_cache")
    assert flags["--enable-mixed-chunk"] == (None, "pools.a.sglang.mixed_chunk")
    assert flags["--load-format"][0] == "dummy" and flags["--device"][0] == "cpu"
    assert flags["--context-length"] == (str(loaded.model.max_model_len), "model.max_model_len")
    assert replica.env["SGLANG_CPU_OMP_THREADS_BIND"] == "1"
    assert replica.env["SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"] == "0"
    assert "--api-key" not in replica.args


def test_the_kv_pool_holds_what_vllms_kv_cache_memory_holds() -> None:
    # 64 MiB of keys and values for 2 layers of width 128 in bfloat16: 2 × 2 × 128 × 2 bytes per token.
    assert kv_tokens("64M", layers=2, hidden=128, dtype="bfloat16") == 64 * 2**20 // 1024
    assert kv_tokens("64M", layers=2, hidden=128, dtype="float32") == 64 * 2**20 // 2048
    loaded = _profile({"a": {"engine": "sglang"}}, model={"kv_cache_memory": "64M", "hidden_size": 128})
    (replica,) = plan_stack(loaded, run_id="t", base_port=25600).replicas
    flags = _flags(replica.args, replica.keys)
    assert flags["--max-total-tokens"][1] == "model.kv_cache_memory"
    assert int(flags["--max-total-tokens"][0] or 0) in (32768, 65536)  # float32 or bfloat16, by this host's CPU


def test_a_kv_pool_smaller_than_one_request_and_contradicting_chunk_settings_are_refused() -> None:
    with pytest.raises(ConfigError) as err:
        _profile({"a": {"engine": "sglang", "max_model_len": 1024, "sglang": {"max_total_tokens": 512}}})
    assert "pools.a.sglang.max_total_tokens: 512 tokens of KV pool cannot hold one request" in err.value.message
    with pytest.raises(ConfigError) as err:
        _profile({"a": {"engine": "sglang", "sglang": {"mixed_chunk": True, "chunked_prefill_size": -1}}})
    assert "pools.a.sglang.mixed_chunk" in err.value.message


def test_the_key_reaches_the_server_module_and_not_its_command_line(tmp_path: Path) -> None:
    package = tmp_path / "sglang"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "launch_server.py").write_text(
        "import json, os, sys\n"
        "if __name__ == '__main__':\n"
        "    cmdline = open('/proc/self/cmdline', 'rb').read().decode().split('\\0')\n"
        f"    print(json.dumps({{'argv': sys.argv[1:], 'cmdline': cmdline, 'env': os.environ.get({KEY_ENV!r})}}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path), KEY_ENV: "s3cret-key"}
    done = subprocess.run(
        [sys.executable, "-c", ENTRY, "--port", "1"], env=env, capture_output=True, text=True, check=True
    )
    seen = json.loads(done.stdout)
    assert seen["argv"] == ["--port", "1", "--api-key", "s3cret-key"]
    assert not any("s3cret-key" in part for part in seen["cmdline"]) and seen["env"] is None
    env.pop(KEY_ENV)
    done = subprocess.run([sys.executable, "-c", ENTRY, "--help"], env=env, capture_output=True, text=True, check=True)
    assert json.loads(done.stdout)["argv"] == ["--help"]


def test_busy_reads_the_running_requests_gauge_and_not_its_longer_namesake() -> None:
    engine = SGLang()
    idle = 'sglang:num_running_reqs{model_name="t"} 0.0\nsglang:num_running_reqs_offline_batch{model_name="t"} 3.0\n'
    assert not engine.busy(idle)
    assert engine.busy('# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{model_name="t"} 2.0\n')


def test_the_kernel_probe_is_judged_on_its_ops_and_the_amx_backends_op() -> None:
    line = 'FORGE-KERNELS {"torch": "2.9.0", "ops": ["convert_weight_packed", "rmsnorm_cpu"], "amx_tile": true, "sglang_amx_backend": true}'
    ok, detail, data = parse_kernel_probe(0, "warning: something\n" + line + "\n")
    assert ok and detail.startswith("2 ops registered under torch.ops.sgl_kernel (torch 2.9.0)")
    assert data == {"ops": ["convert_weight_packed", "rmsnorm_cpu"]}
    # The names reach report.json through the build report's model, which refuses any key it does not name.
    record = CheckRecord.model_validate(
        CheckResult(name="kernel-ops", ok=ok, detail=detail, seconds=7.3, data=data).as_report()
    )
    assert record.data is not None and record.data.ops == ["convert_weight_packed", "rmsnorm_cpu"]
    assert record.as_json()["data"] == {"ops": ["convert_weight_packed", "rmsnorm_cpu"]}
    with pytest.raises(ValidationError, match="amx_tile"):
        CheckRecord.model_validate({**record.as_json(), "data": {"ops": [], "amx_tile": True}})
    ok, detail, _ = parse_kernel_probe(0, line.replace('"convert_weight_packed", ', ""))
    assert not ok and "convert_weight_packed: MISSING" in detail
    ok, detail, data = parse_kernel_probe(1, "ImportError: libnuma.so.1: cannot open shared object file\n")
    assert not ok and data is None and "libnuma.so.1" in detail


HELP = Path(__file__).parent / "fixtures" / "sglang-0.5.10.post1-launch-server-help.txt"


def test_the_images_help_is_read_and_every_sglang_pool_of_the_profiles_passes_it() -> None:
    """The help recorded from the debian-13 sglang image (`python3 -m sglang.launch_server --help`, its warnings
    included): the flags Forge passes and every profile's SGLang pools are checked against it."""
    from builders.engines.args import PoolArgv, check_pools
    from builders.smoke.profile import load_profile
    from builders.sweep.definition import load_sweep

    spec = parse_help(HELP.read_text(encoding="utf-8"), source="the recorded help")
    assert spec.server == "SGLang" and spec.options["--model"].flags == ("--model-path", "--model")
    assert "dummy" in (spec.options["--load-format"].choices or ())
    stacks = [load_profile("ci-sglang", root=ROOT)[0]] + [
        p.profile for p in load_sweep(["shared", "class-aware"], root=ROOT, engines=["sglang"])
    ]
    for stack in stacks:
        pools = [PoolArgv(pool=r.pool, argv=r.args, keys=r.keys) for r in plan_stack(stack, run_id="t").replicas]
        assert check_pools(pools, spec) == [], stack.name
    (typo,) = check_pools([PoolArgv(pool="a", argv=("--chunked-prefil-size", "128"), keys=("extra",))], spec)
    assert (typo.suggestion or "").startswith("did you mean --chunked-prefill-size") and "SGLang" in typo.message


# The first processor's flags of two hosts this project ran on (/proc/cpuinfo, trimmed to the flags that matter
# and a few around them): an AMD EPYC with AVX2 only, and a Xeon with AVX-512 BF16 and AMX.
EPYC_AVX2 = "model name\t: AMD EPYC 7B13\nflags\t\t: fpu sse4_2 avx avx2 fma bmi2 sha_ni\n\n"
XEON_AMX = (
    "model name\t: Intel(R) Xeon(R) Processor\nflags\t\t: fpu avx avx2 avx512f avx512bw avx512_bf16 avx512_fp16 "
    "amx_bf16 amx_tile amx_int8\n\n"
)


def test_sglang_names_the_flags_a_cpu_lacks_and_vllm_runs_anywhere() -> None:
    epyc = parse_cpuinfo(EPYC_AVX2, source="/proc/cpuinfo")
    why = ENGINES.get("sglang").host_problem(epyc)
    assert why is not None and "AMD EPYC 7B13" in why
    assert "lacks avx512f, avx512_bf16, amx_bf16, amx_tile;" in why
    assert ENGINES.get("sglang").host_problem(parse_cpuinfo(XEON_AMX, source="/proc/cpuinfo")) is None
    assert ENGINES.get("vllm").host_problem(epyc) is None


def test_a_sweep_with_sglang_on_an_avx2_host_is_refused_before_any_profile_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from builders.cli import main
    from builders.sweep import command

    monkeypatch.setattr(command, "this_host", lambda: parse_cpuinfo(EPYC_AVX2, source="/proc/cpuinfo"))
    started: list[object] = []
    monkeypatch.setattr(command, "run_sweep", lambda *a, **k: started.append(a))
    argv = ["--root", str(ROOT), "sweep", "forge/x:1", "--sglang-image", "forge/y:1", "--engines", "vllm,sglang"]
    code = main([*argv, "--profiles", "shared", "--report", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == PreflightBlocked.exit_code and not started
    assert "serves SGLang, which cannot run on this host" in err and "lacks avx512f" in err
    assert "Traceback" not in err
