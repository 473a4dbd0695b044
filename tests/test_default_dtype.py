"""The default dtype fits the machine: bf16 on GPUs and on CPUs with native bf16, fp32 on
other CPUs; `run` and `predict` say which and why."""

from __future__ import annotations

import json

from helpers import run_cli
from trainbench.default_dtype import default_dtype, native_bf16_flags

# Excerpts of real /proc/cpuinfo texts (flags lines shortened).
EPYC_AVX2 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13
flags\t\t: fpu vme de pse tsc msr sse sse2 ssse3 sse4_1 sse4_2 avx f16c avx2 bmi2
bugs\t\t: sysret_ss_attrs
"""
SAPPHIRE_RAPIDS = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2 avx avx2 avx512f avx512bw avx512_bf16 amx_bf16 amx_tile amx_int8
"""
ZEN4 = """model name\t: AMD EPYC 9654
flags\t\t: avx2 avx512f avx512_bf16 avx512_vnni
"""
# A "bf16" that is not a flag on the flags line must not count.
DECOY = """model name\t: Fake CPU avx512_bf16 edition
flags\t\t: avx2 fma
"""


def test_native_bf16_flags_are_read_from_the_flags_line():
    assert native_bf16_flags(EPYC_AVX2) == []
    assert native_bf16_flags(SAPPHIRE_RAPIDS) == ["amx_bf16", "avx512_bf16"]
    assert native_bf16_flags(ZEN4) == ["avx512_bf16"]
    assert native_bf16_flags(DECOY) == []
    assert native_bf16_flags("") == []


def test_cpu_default_is_fp32_without_native_bf16_and_bf16_with_it():
    dtype, why = default_dtype("cpu", EPYC_AVX2)
    assert dtype == "fp32" and "no native bf16" in why and "slower" in why
    dtype, why = default_dtype("cpu", SAPPHIRE_RAPIDS)
    assert dtype == "bf16" and "amx_bf16" in why
    assert default_dtype("cpu", ZEN4)[0] == "bf16"


def test_gpu_default_is_bf16_whatever_the_host_cpu():
    assert default_dtype("h100", EPYC_AVX2)[0] == "bf16"
    assert default_dtype("b200", "")[0] == "bf16"


def this_cpu_has_native_bf16() -> bool:
    with open("/proc/cpuinfo") as fh:
        text = fh.read()
    return any(flag in line.split() for line in text.splitlines() if line.startswith("flags")
               for flag in ("avx512_bf16", "amx_bf16"))


def test_run_defaults_to_this_cpus_dtype_and_says_why(tmp_path):
    res = run_cli("run", "-w", "pretrain_llama3.1", "-s", "tiny", "--scale", "2", "--gpu",
                  "cpu", "--dry-run", root=tmp_path, env={"DTYPE": ""})
    assert res.returncode == 0, res.stderr
    if this_cpu_has_native_bf16():
        assert "pretrain_llama3.1_tiny_bf16_gpus2" in res.stdout
        assert "dtype: bf16 (default on this CPU: native bf16" in res.stdout
    else:
        assert "pretrain_llama3.1_tiny_fp32_gpus2" in res.stdout
        assert ("dtype: fp32 (default on this CPU: no native bf16 (avx512_bf16/amx_bf16), "
                "bf16 GEMMs would be emulated, several times slower than fp32)") in res.stdout
    assert not (tmp_path / "experiments").exists()


def test_dtype_option_and_env_var_still_choose(tmp_path):
    res = run_cli("run", "-w", "pretrain_llama3.1", "-s", "tiny", "--scale", "2", "--gpu",
                  "cpu", "--dry-run", root=tmp_path, env={"DTYPE": "bf16"})
    assert res.returncode == 0, res.stderr
    # A chosen dtype gets no "(default ...)" line (compile's own default is another line).
    assert "pretrain_llama3.1_tiny_bf16_gpus2" in res.stdout
    assert "dtype: bf16 (default" not in res.stdout
    res = run_cli("run", "-w", "pretrain_llama3.1", "-s", "tiny", "--scale", "2", "--gpu",
                  "cpu", "--dtype", "fp32", "--dry-run", root=tmp_path)
    assert "pretrain_llama3.1_tiny_fp32_gpus2" in res.stdout
    assert "dtype: fp32 (default" not in res.stdout


def test_predict_defaults_its_dtype_like_run(tmp_path):
    res = run_cli("predict", "-w", "pretrain_llama3.1", "-s", "8b", "--scale", "8",
                  root=tmp_path, env={"DTYPE": ""})
    assert res.returncode == 0, res.stderr
    assert "dtype: bf16 (default on GPUs" in res.stdout
    res = run_cli("predict", "-w", "pretrain_llama3.1", "-s", "8b", "--scale", "8",
                  "--format", "json", root=tmp_path, env={"DTYPE": ""})
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["dtype"] == "bf16"


def test_a_workload_without_the_preferred_dtype_takes_its_recipes():
    # Llama 3.1 8B has bf16 and fp8 recipes only; Nemotron-H 56B only fp8.
    dtype, why = default_dtype("cpu", EPYC_AVX2, available=["bf16", "fp8"])
    assert dtype == "bf16" and "bf16, fp8" in why
    assert default_dtype("h100", "", available=["fp8"])[0] == "fp8"
    assert default_dtype("cpu", EPYC_AVX2, available=["bf16", "fp32", "fp8"])[0] == "fp32"


def test_predict_nemotronh_56b_defaults_to_its_fp8_recipe(tmp_path):
    res = run_cli("predict", "-w", "pretrain_nemotronh", "-s", "56b", "--scale", "256",
                  "--format", "json", root=tmp_path, env={"DTYPE": ""})
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["dtype"] == "fp8"
