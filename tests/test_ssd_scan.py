"""Which Mamba-2 scan a run uses (--set ssd_scan=auto|kernel|torch): the engine sets it on
the mixers and records it, plan validation refuses the kernel on a CPU, and predict
charges the torch scan at its measured ratio to the kernels (predict/constants.py)."""

from __future__ import annotations

import json

import pytest

from helpers import run_cli, train
from trainbench.overrides import parse_overrides
from trainbench.plan import PlanError
from trainbench.planning import build_plan
from trainbench.predict.context import make_context
from trainbench.predict.perf import layer_time

# Measured on one H200 (issue 38): the torch scan's non-GEMM part 0.349 us a token
# compiled and 0.967 eager, against the kernels' derived 0.241.
COMPILED, EAGER = 0.349 / 0.241, 0.967 / 0.241


def _mamba_time(sets: list[str], sharding: str = "engine"):
    plan = build_plan("pretrain_nemotronh", "56b", "fp8", 32, "h100",
                      overrides=parse_overrides(sets))
    ctx = make_context(plan, sharding=sharding)
    return layer_time(ctx.work["mamba"], ctx)


@pytest.mark.parametrize("compile_set,ratio", [("compile=true", COMPILED),
                                               ("compile=false", EAGER)])
def test_predict_charges_the_torch_scan_at_its_measured_ratio(compile_set, ratio):
    kernel = _mamba_time([compile_set])
    torch_scan = _mamba_time([compile_set, "ssd_scan=torch"])
    # The kernels' scan: its matmuls (scan) and its traffic (inside memory_bound); the
    # torch scan's measured time stands for both.
    traffic = kernel.memory_bound - torch_scan.memory_bound
    assert traffic > 0
    assert torch_scan.scan == pytest.approx(ratio * (kernel.scan + traffic), rel=0.01)
    assert torch_scan.gemm == kernel.gemm
    assert _mamba_time([compile_set, "ssd_scan=kernel"]).scan == kernel.scan


def test_the_recipe_model_keeps_megatrons_kernels():
    assert _mamba_time(["ssd_scan=torch"], "recipe").scan == _mamba_time([], "recipe").scan


def test_a_cpu_plan_cannot_ask_for_the_kernel(tmp_path):
    with pytest.raises(PlanError, match="ssd_scan=kernel needs CUDA"):
        build_plan("pretrain_nemotronh", "tiny", "bf16", 1, "cpu",
                   overrides=parse_overrides(["ssd_scan=kernel"]))
    res = run_cli("run", "-w", "pretrain_nemotronh", "-s", "tiny", "--gpu", "cpu", "--scale", "1",
                  "--set", "ssd_scan=fast", "--dry-run", root=tmp_path)
    assert res.returncode == 2 and "ssd_scan" in res.stderr and "Traceback" not in res.stderr


def test_the_engine_sets_the_scan_on_every_mixer():
    torch = pytest.importorskip("torch")
    from trainbench.catalog.models import get_model
    from trainbench.engine.models import build_model
    from trainbench.engine.models.mamba2 import Mamba2Mixer, choose_scan
    with torch.device("meta"):
        model = build_model(get_model("pretrain_nemotronh", "tiny"))
        dense = build_model(get_model("pretrain_llama3.1", "tiny"))
    mixers = [m for m in model.modules() if isinstance(m, Mamba2Mixer)]
    assert mixers
    assert choose_scan(model, "torch", "cuda") == "torch chunked scan"
    assert not any(m.use_kernel for m in mixers)
    assert choose_scan(model, "auto", "cpu") == "torch chunked scan"
    assert all(m.use_kernel for m in mixers)  # where the kernel loads, it runs
    with pytest.raises(RuntimeError, match="ssd_scan=torch"):
        choose_scan(model, "kernel", "cpu")
    assert choose_scan(dense, "torch", "cpu") is None


@pytest.mark.dist
def test_a_run_records_the_scan_it_ran(tmp_path):
    exp = train(tmp_path, "pretrain_nemotronh", 1, "--set", "ssd_scan=torch", steps=1,
                dtype="bf16")
    assert json.loads((exp / "run.json").read_text())["ssd_scan"] == "torch chunked scan"


def test_a_probed_scan_rate_is_charged_as_measured():
    from trainbench.predict.constants import Constants
    plan = build_plan("pretrain_nemotronh", "56b", "fp8", 32, "h100")
    torch_plan = build_plan("pretrain_nemotronh", "56b", "fp8", 32, "h100",
                            overrides=parse_overrides(["ssd_scan=torch"]))
    probed = Constants(scan_eff=0.3)  # a probe timed the scan this run will use
    times = [layer_time(ctx.work["mamba"], ctx) for ctx in
             (make_context(p, sharding="engine", constants=probed) for p in (plan, torch_plan))]
    assert times[0].scan == times[1].scan > 0
