"""Communication overlap (issue 19, item 4): FSDP2 prefetch, reduce-scatter dtype,
asynchronous TP and ring context parallel.

Overlap itself (communication hidden behind compute) shows only on GPUs; here the
numerics are checked on real 2-rank gloo runs: prefetching reorders collectives and
must not change a single bit, and a bf16 reduce-scatter must stay close to fp32. The
options that need CUDA are refused at plan time, before any process starts.
"""

from __future__ import annotations

import json

import pytest

from helpers import losses, read_metrics, run_cli, train
from trainbench import overrides, planning
from trainbench import plan as planmod

WORKLOAD = "pretrain_llama3.1"
# bf16 keeps 8 significant bits (unit roundoff 2^-9 ~ 2e-3 per gradient element); the
# loss and the global grad norm average many elements, so they move far less (about
# 1e-5 relative on the tiny Llama, 2-core AMD EPYC, torch 2.13.0 CPU).
BF16_REDUCE_RTOL = 1e-3


@pytest.fixture(scope="module")
def dp2_runs(tmp_path_factory):
    """Three DP2 fp32 runs of the tiny Llama (4 blocks): the engine's defaults, the
    engine as it was before explicit prefetching, and gradients reduced in bf16."""
    root = tmp_path_factory.mktemp("overlap")
    return {name: train(root, WORKLOAD, 2, *extra) for name, extra in (
        ("prefetch", ()),
        ("no_prefetch", ("--set", "fsdp_prefetch=false")),
        ("bf16_reduce", ("--set", "reduce_dtype=bf16")),
    )}


def run_info(exp) -> dict:
    return json.loads((exp / "run.json").read_text())


def grad_norms(exp) -> list[float]:
    return [float(r["grad_norm"]) for r in read_metrics(exp)]


@pytest.mark.dist
@pytest.mark.slow
def test_explicit_prefetch_changes_no_bit_and_is_recorded(dp2_runs):
    on, off = dp2_runs["prefetch"], dp2_runs["no_prefetch"]
    assert run_info(on)["fsdp"] == {
        "forward_prefetch": "next block", "backward_prefetch": "previous block",
        "reshard_after_forward": "all blocks but the last; root kept gathered",
        "param_dtype": "float32", "reduce_dtype": "float32", "dp_sharding": "full",
        "dp_sharding_chosen_by": "default",
        "dp_sharding_label": "full, fp32 gradients (default)",
        "gradients_reduced": "every microbatch"}
    assert run_info(off)["fsdp"]["forward_prefetch"] == "FSDP2 default"
    assert run_info(off)["fsdp"]["reshard_after_forward"] == "all blocks; root kept gathered"
    # Same collectives on the same data in another order: identical to the last bit.
    assert len(losses(on)) == 3
    assert losses(on) == losses(off)
    assert grad_norms(on) == grad_norms(off)


@pytest.mark.dist
@pytest.mark.slow
def test_bf16_reduce_scatter_stays_within_tolerance_of_fp32(dp2_runs):
    fp32, bf16 = dp2_runs["prefetch"], dp2_runs["bf16_reduce"]
    assert run_info(bf16)["fsdp"]["reduce_dtype"] == "bfloat16"
    # Step 0's loss comes before any gradient; its grad norm is the first reduced value,
    # and it must show that the reduction really ran in bf16.
    assert losses(bf16)[0] == losses(fp32)[0]
    assert grad_norms(bf16)[0] != grad_norms(fp32)[0]
    assert grad_norms(bf16) == pytest.approx(grad_norms(fp32), rel=BF16_REDUCE_RTOL)
    assert losses(bf16) == pytest.approx(losses(fp32), rel=BF16_REDUCE_RTOL)


@pytest.mark.parametrize("settings, message", [
    ("async_tp=true", "--set async_tp=true needs CUDA GPUs"),
    ("cp=2 cp_impl=ring", "--set cp_impl=ring needs CUDA attention kernels"),
])
def test_cpu_refuses_what_needs_cuda_in_one_line(tmp_path, settings, message):
    res = run_cli("run", "-w", WORKLOAD, "-s", "tiny", "--gpu", "cpu", "--scale", "2",
                  "--set", settings, root=tmp_path)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trainbench: error: " + message), lines
    assert not (tmp_path / "experiments").exists()


def test_overlap_keys_are_parsed_and_checked():
    assert overrides.parse_overrides(["fsdp_prefetch=false reduce_dtype=bf16 cp_impl=ring",
                                    "dp_sharding=optimizer"]) \
        == {"fsdp_prefetch": False, "reduce_dtype": "bf16", "cp_impl": "ring",
            "dp_sharding": "optimizer"}
    with pytest.raises(planmod.PlanError) as err:
        overrides.parse_overrides(["reduce_dtype=fp16", "fsdp_prefetch=maybe", "cp_impl=ulysses",
                                 "dp_sharding=zero2"])
    assert err.value.problems == [
        "--set reduce_dtype=fp16: must be one of fp32, bf16",
        "--set fsdp_prefetch=maybe: must be true or false",
        "--set cp_impl=ulysses: must be one of allgather, ring",
        "--set dp_sharding=zero2: must be one of full, gradients, optimizer"]
    with pytest.raises(planmod.PlanError) as err:
        planning.build_plan(WORKLOAD, "tiny", "fp32", 2, "cpu", overrides={"cp_impl": "ring"})
    assert err.value.problems == ["--set cp_impl=ring applies only with context parallelism "
                                  "(cp > 1); add --set cp=2 or drop it"]


def _problems(**overrides):
    with pytest.raises(planmod.PlanError) as err:
        planning.build_plan(WORKLOAD, "8b", "bf16", 8, "h100", overrides=overrides)
    return err.value.problems


def test_async_tp_on_gpus_needs_tensor_parallel_and_compile():
    assert any("needs tp > 1" in p for p in _problems(async_tp=True, compile=True))
    assert any("drop --set compile=false" in p
               for p in _problems(async_tp=True, tp=2, compile=False))
    plan = planning.build_plan(WORKLOAD, "8b", "bf16", 8, "h100",
                              overrides={"async_tp": True, "tp": 2, "compile": True})
    assert plan.async_tp and plan.layout.tp == 2


def test_ring_context_parallel_is_accepted_on_gpus_and_kept_in_plan_json():
    plan = planning.build_plan(WORKLOAD, "8b", "bf16", 8, "h100",
                              overrides={"cp": 2, "cp_impl": "ring", "reduce_dtype": "bf16",
                                         "fsdp_prefetch": False})
    again = planmod.Plan.from_dict(json.loads(plan.to_json()))
    assert (again.cp_impl, again.reduce_dtype, again.fsdp_prefetch) == ("ring", "bf16", False)
    defaults = planning.build_plan(WORKLOAD, "8b", "bf16", 8, "h100")
    # bf16 gradients: a Megatron recipe row's own (planning.recipe_sharding).
    assert (defaults.cp_impl, defaults.reduce_dtype, defaults.fsdp_prefetch,
            defaults.async_tp) == ("allgather", "bf16", True, False)
