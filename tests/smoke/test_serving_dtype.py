"""The serving dtype for each kind of CPU, from real /proc/cpuinfo texts (tests/smoke/fixtures/cpuinfo-*.txt)."""

from __future__ import annotations

from pathlib import Path

import pytest

from builders.engines.vllm.gates import runtime_dtype_gate
from builders.serving_dtype import MEASURED_BF16_FACTOR, CpuHost, choose_dtype, parse_cpuinfo
from builders.smoke.plan import plan_stack
from builders.smoke.profile import profile_from_mapping

FIXTURES = Path(__file__).parent / "fixtures"


def host(name: str) -> CpuHost:
    path = FIXTURES / f"cpuinfo-{name}.txt"
    return parse_cpuinfo(path.read_text(encoding="utf-8"), source=str(path))


@pytest.mark.parametrize(
    ("name", "arch", "model", "native", "dtype"),
    [
        # This machine: AVX2, no AVX-512: bfloat16 matmuls were 55x slower than float32 here.
        ("amd-epyc-avx2", "x86_64", "AMD EPYC", (), "float32"),
        # AVX-512 without its BF16 extension is still no native bfloat16.
        ("xeon-cascade-lake-avx512", "x86_64", "Intel(R) Xeon(R) Platinum 8259CL CPU @ 2.50GHz", (), "float32"),
        (
            "xeon-sapphire-rapids-amx",
            "x86_64",
            "Intel(R) Xeon(R) Platinum 8488C",
            ("avx512_bf16", "amx_bf16"),
            "bfloat16",
        ),
        ("graviton3-bf16", "aarch64", "Arm CPU part 0xd40", ("bf16",), "bfloat16"),
        ("graviton2-no-bf16", "aarch64", "Arm CPU part 0xd0c", (), "float32"),
    ],
)
def test_auto_serves_bfloat16_only_with_native_bf16(
    name: str, arch: str, model: str, native: tuple[str, ...], dtype: str
) -> None:
    cpu = host(name)
    assert (cpu.arch, cpu.model, cpu.bf16_flags) == (arch, model, native)
    choice = choose_dtype("auto", cpu)
    assert choice.dtype == dtype
    assert choice.native_bf16 is bool(native)
    assert choice.warning is None
    assert ("no native BF16" in choice.reason) is (not native)


def test_amx_alone_counts_as_native() -> None:
    text = (FIXTURES / "cpuinfo-xeon-sapphire-rapids-amx.txt").read_text(encoding="utf-8")
    cpu = parse_cpuinfo(text.replace(" avx512_bf16", ""), source="edited")
    assert cpu.bf16_flags == ("amx_bf16",)
    assert choose_dtype("auto", cpu).dtype == "bfloat16"


def test_only_the_first_processor_is_read() -> None:
    # The second block of the Graviton 3 fixture lists fewer features; the first one decides.
    assert "svebf16" in host("graviton3-bf16").flags


def test_explicit_bfloat16_wins_but_warns_with_the_measured_factor_without_native_bf16() -> None:
    slow = choose_dtype("bfloat16", host("amd-epyc-avx2"))
    assert slow.dtype == "bfloat16" and slow.requested == "bfloat16"
    assert slow.warning is not None and f"{MEASURED_BF16_FACTOR:.0f}x" in slow.warning and "AMD EPYC" in slow.warning
    fast = choose_dtype("bfloat16", host("graviton3-bf16"))
    assert fast.dtype == "bfloat16" and fast.warning is None
    assert choose_dtype("float32", host("xeon-sapphire-rapids-amx")).dtype == "float32"


def test_the_plan_serves_the_choice_and_records_it() -> None:
    profile = profile_from_mapping(
        {
            "pools": {"p": {}},
            "classes": dict.fromkeys(("interactive", "rag", "agent", "long_prefill", "batch", "slow_stream"), "p"),
        },
        source="t.yaml",
        name="t",
    )
    assert profile.model.dtype == "auto"
    plan = plan_stack(profile, run_id="t", base_port=20000, dtype=choose_dtype("auto", host("amd-epyc-avx2")))
    args = plan.replicas[0].args
    assert args[args.index("--dtype") + 1] == "float32"
    assert plan.dtype.as_json().isa == "avx2, no avx512f, no avx512_bf16, no amx_bf16"
    pinned = profile.model_copy(update={"model": profile.model.model_copy(update={"dtype": "bfloat16"})})
    plan = plan_stack(pinned, run_id="t", base_port=20000, dtype=choose_dtype("bfloat16", host("amd-epyc-avx2")))
    args = plan.replicas[0].args
    assert args[args.index("--dtype") + 1] == "bfloat16" and plan.dtype.warning


def test_preflight_names_the_run_host_dtype_and_its_source() -> None:
    avx2 = host("amd-epyc-avx2")
    finding = runtime_dtype_gate(arch="x86_64", run_flags=avx2.flags, run_source="run-host.txt")
    assert finding.passed and "run-host.txt" in finding.source
    assert "float32" in finding.message and finding.found == "none of avx512_bf16 or amx_bf16"
    amx = host("xeon-sapphire-rapids-amx")
    finding = runtime_dtype_gate(arch="x86_64", run_flags=amx.flags, run_source="spr.txt")
    assert "bfloat16" in finding.message and finding.found == "avx512_bf16 amx_bf16"
