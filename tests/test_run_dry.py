"""`trainbench run --dry-run`: the plan, the memory verdict, nothing launched or written."""

import json
import re

import pytest
from helpers import run_cli


def test_dry_run_warns_when_predicted_not_to_fit(tmp_path):
    res = run_cli("run", "-w", "pretrain_llama3.1", "-s", "405b", "--scale", "64", "--gpu", "h100",
                  "--set", "tp=8 pp=8 cp=1 dp=1 gbs=64", "--dry-run", root=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "warning: predicted peak memory per GPU" in res.stdout
    assert "exceeds" in res.stdout and "DOES NOT FIT" in res.stdout
    assert "dry run: nothing launched" in res.stdout
    assert not (tmp_path / "experiments").exists()


def test_dry_run_of_a_seed_row_fits_quietly(tmp_path):
    res = run_cli("run", "-w", "pretrain_llama3.1", "-s", "8b", "--scale", "8", "--gpu", "h100",
                  "--dry-run", root=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "DOES NOT FIT" not in res.stdout and "warning" not in res.stdout
    assert "TP1 PP1 CP2 DP4" in res.stdout


@pytest.mark.parametrize("gpu,dtype,compile_setting,noted", [
    ("h100", "fp8", " compile=false", True),   # eager FP8 on a GPU: said before it runs
    ("h100", "fp8", "", False),                # compiled blocks, the GPU default
    ("h100", "bf16", " compile=false", False),  # eager bf16 costs nothing like it
    ("cpu", "fp8", "", False),                 # an emulation, already flagged: no MFU
])
def test_eager_fp8_on_a_gpu_is_noted_in_the_plan(tmp_path, gpu, dtype, compile_setting,
                                                  noted):
    res = run_cli("run", "-w", "pretrain_llama3.1", "-s", "tiny", "--scale", "2", "--gpu", gpu,
                  "--dtype", dtype, "--set", "dp=2" + compile_setting, "--dry-run",
                  root=tmp_path)
    assert res.returncode == 0, res.stderr
    flat = " ".join(res.stdout.split())
    assert ("FP8 without compiled blocks runs torchao's scaling and casts as separate kernels"
            in flat) == noted
    assert not (tmp_path / "experiments").exists()


def test_cpu_run_too_big_for_this_machine_is_refused_before_anything_is_written(tmp_path):
    res = run_cli("run", "-w", "pretrain_llama3.1", "-s", "8b", "--scale", "8", "--gpu", "cpu",
                  root=tmp_path)
    assert res.returncode == 2
    assert "GiB of memory but this machine has" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "experiments").exists()


def test_local_gpu_run_on_a_machine_without_gpus_is_refused(tmp_path):
    res = run_cli("run", "-w", "pretrain_llama3.1", "-s", "tiny", "--scale", "2", "--gpu", "h100",
                  root=tmp_path, env={"PATH": str(tmp_path / "no-bin")})  # no nvidia-smi
    assert res.returncode == 2
    assert "this machine has no NVIDIA GPU" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "experiments").exists()


RUN_PEAK = re.compile(r"predicted peak memory per GPU (\d+\.\d) GiB")
PREDICT_PEAK = re.compile(r"peak memory per GPU\s*\S\s*(\d+\.\d) GiB")


@pytest.mark.parametrize("workload,size,dtype,scale", [
    ("pretrain_llama3.1", "8b", "bf16", 8),         # CP2 x DP4
    ("pretrain_llama3.1", "70b", "bf16", 64),       # TP4 PP4 CP2 VP5: the PP case
    ("pretrain_llama3.1", "405b", "bf16", 512),     # predicted not to fit
    ("pretrain_llama2", "70b", "bf16", 512),        # the recipe's HSDP groups (not run)
    ("pretrain_nemotron4", "15b", "fp8", 16),
    ("pretrain_nemotronh", "56b", "fp8", 32),
])
def test_run_and_predict_print_the_same_peak_memory(tmp_path, workload, size, dtype, scale):
    common = ("-w", workload, "-s", size, "--dtype", dtype, "--scale", str(scale))
    run = run_cli("run", *common, "--gpu", "h100", "--dry-run", root=tmp_path)
    predict = run_cli("predict", *common, "--gpu", "h100", root=tmp_path)
    as_json = run_cli("predict", *common, "--gpu", "h100", "--format", "json", root=tmp_path)
    assert run.returncode == predict.returncode == as_json.returncode == 0, (
        run.stderr + predict.stderr + as_json.stderr)
    (run_gib,) = RUN_PEAK.findall(run.stdout)
    (predict_gib,) = PREDICT_PEAK.findall(predict.stdout)
    assert run_gib == predict_gib
    assert float(run_gib) == pytest.approx(json.loads(as_json.stdout)["memory_gib"], abs=0.05)
    # Both name the sharding they assume: what trainbench's engine runs.
    assert "assumes FSDP2 (trainbench's engine)" in run.stdout
    assert "FSDP2 (trainbench's engine)" in predict.stdout
    assert not (tmp_path / "experiments").exists()


def test_predict_can_still_assume_the_published_recipe(tmp_path):
    # The seeds ran Megatron's distributed optimizer: bf16 weights and gradients on every
    # rank. The engine runs a recipe row the same way where it fits (planning.recipe_sharding),
    # so the two figures are close; fully sharded (FSDP2 as ZeRO-3) it needs less.
    common = ("-w", "pretrain_llama3.1", "-s", "8b", "--dtype", "bf16", "--scale", "8")
    engine = run_cli("predict", *common, root=tmp_path)
    full = run_cli("predict", *common, "--set", "dp_sharding=full", root=tmp_path)
    recipe = run_cli("predict", *common, "--sharding", "recipe", root=tmp_path)
    assert engine.returncode == recipe.returncode == full.returncode == 0, (
        engine.stderr + recipe.stderr + full.stderr)
    assert "distributed optimizer (the recipe)" in recipe.stdout
    (engine_gib,) = PREDICT_PEAK.findall(engine.stdout)
    (full_gib,) = PREDICT_PEAK.findall(full.stdout)
    (recipe_gib,) = PREDICT_PEAK.findall(recipe.stdout)
    assert float(engine_gib) == pytest.approx(float(recipe_gib), rel=0.1)
    assert float(recipe_gib) > float(full_gib)


def test_run_refuses_a_plan_predicted_not_to_fit_unless_forced(tmp_path):
    args = ("run", "-w", "pretrain_llama3.1", "-s", "405b", "--scale", "64", "--gpu", "h100",
            "--set", "tp=8 pp=8 cp=1 dp=1 gbs=64")
    res = run_cli(*args, root=tmp_path, env={"PATH": str(tmp_path / "no-bin")})
    assert res.returncode == 2
    assert "predicted not to fit" in res.stderr and "--force" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr
    assert not (tmp_path / "experiments").exists()
    # --force goes on to the next check (this machine has no GPU).
    forced = run_cli(*args, "--force", root=tmp_path, env={"PATH": str(tmp_path / "no-bin")})
    assert forced.returncode == 2 and "predicted not to fit" not in forced.stderr
    assert "no NVIDIA GPU" in forced.stderr


def test_dry_run_says_the_recipe_rows_state_sharding(tmp_path):
    res = run_cli("run", "-w", "pretrain_llama3.1", "-s", "70b", "--scale", "64", "--gpu",
                  "h100", "--dry-run", root=tmp_path)
    assert res.returncode == 0, res.stderr
    flat = " ".join(res.stdout.split())
    assert "data-parallel sharding: optimizer, bf16 gradients" in flat
    assert "DOES NOT FIT" not in flat
