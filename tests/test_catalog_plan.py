"""Catalog consistency and plan validation."""

import json

import pytest

from trainbench import overrides, planning
from trainbench import plan as planmod
from trainbench.catalog import hardware, recipes, references
from trainbench.catalog.models import MODELS, WORKLOADS, get_model, parameter_count


@pytest.mark.parametrize("row", recipes.RECIPES, ids=lambda r: f"{r.workload}-{r.size}-{r.dtype}-{r.gpus}")
def test_every_recipe_row_is_consistent(row):
    assert row.tp * row.pp * row.cp * row.dp == row.gpus
    assert row.gbs == row.mbs * row.dp * row.ga
    model = get_model(row.workload, row.size)
    assert model.heads % row.tp == 0 and model.kv_heads % row.tp == 0
    if "uneven pipeline layout" in row.note:  # DeepSeek-V3's published Megatron layout
        assert row.pp * row.vp <= row.layers + 2
    else:
        assert planmod.layers_split_ok(row.layers, row.pp * row.vp)


def test_seed_tables_are_complete():
    def count(workload, size, dtype=None):
        return len(recipes.rows_for(workload, size, dtype, "h100"))
    assert count("pretrain_llama3.1", "8b") == 10  # 5 scales x BF16/FP8
    assert count("pretrain_llama3.1", "70b") == 12
    assert count("pretrain_llama3.1", "405b") == 6 and count("pretrain_llama3.1", "405b-proxy") == 6
    assert count("pretrain_llama2", "70b") == 12
    assert count("pretrain_nemotron4", "15b") == 16
    assert count("pretrain_nemotron4", "340b") == 10  # 4 newest + the older 128-GPU row, x2
    assert count("pretrain_nemotronh", "56b") == 7
    row = recipes.find_row("pretrain_nemotron4", "340b", "bf16", 256, "h100")
    assert row.vp == 1 and "VP=12" in row.note  # newest seed kept, the other noted


def test_every_reference_has_a_recipe_row_and_consistent_throughput():
    for ref in references.REFERENCES:
        row = recipes.find_row(ref.workload, ref.size, ref.dtype, ref.gpus, ref.gpu_type)
        tps = row.seq_len * row.gbs / ref.step_time_s
        # The seeds' tokens/s are seq x GBS / the printed step time, rounded to an integer:
        # the largest deviation is 1.16e-5 (Nemotron-4 340B FP8 on 128 GPUs, 41,477.5 printed
        # as 41,478), and half a token in the smallest figure (28,432/s) is 1.8e-5.
        assert tps == pytest.approx(ref.tokens_per_s, rel=2e-5), ref


def test_405b_proxy_layers_follow_scale():
    p = planning.build_plan("pretrain_llama3.1", "405b-proxy", "bf16", 64, "h100")
    assert p.model.layers == 30 and p.layout.pp == 4 and p.layout.vp == 8


def test_parameter_counts_are_the_published_sizes():
    assert parameter_count(get_model("pretrain_llama3.1", "8b")) == pytest.approx(8.03e9, rel=0.01)
    assert parameter_count(get_model("pretrain_llama3.1", "70b")) == pytest.approx(70.6e9, rel=0.01)
    assert parameter_count(get_model("pretrain_llama3.1", "405b")) == pytest.approx(405.9e9, rel=0.01)
    assert parameter_count(get_model("pretrain_nemotron4", "340b")) == pytest.approx(341e9, rel=0.01)
    assert parameter_count(get_model("pretrain_nemotronh", "56b")) == pytest.approx(56.3e9, rel=0.01)


def test_every_workload_has_a_tiny_size_at_scales_1_2_4():
    for workload in WORKLOADS:
        assert (workload, "tiny") in MODELS
        assert recipes.scales_for(workload, "tiny", "bf16", "cpu") == [1, 2, 4]


def test_gpu_lookup_never_borrows_a_peak():
    assert hardware.gpu_from_device_name("NVIDIA H100 80GB HBM3").key == "h100"
    assert hardware.gpu_from_device_name("NVIDIA GB200").key == "gb200"
    assert hardware.gpu_from_device_name("NVIDIA GeForce RTX 4090") is None
    with pytest.raises(LookupError, match="--peak-tflops"):
        hardware.get_gpu("rtx4090")


def test_plan_round_trips_through_json():
    p = planning.build_plan("pretrain_llama3.1", "70b", "bf16", 64, "h100",
                           overrides={"gbs": 256}, env={"A": "b"})
    again = planmod.Plan.from_dict(json.loads(p.to_json()))
    assert again == p
    assert again.ga == 128 and p.num_nodes == 8


def _problems(*args, **kwargs):
    with pytest.raises(planmod.PlanError) as err:
        planning.build_plan(*args, **kwargs)
    return err.value.problems


def test_plan_validation_messages():
    assert "TP*PP*CP*DP" in _problems("pretrain_llama3.1", "8b", "bf16", 8, "h100",
                                      overrides={"dp": 3})[0]
    assert any("not divisible by MBS*DP" in p for p in _problems(
        "pretrain_llama3.1", "8b", "bf16", 8, "h100", overrides={"gbs": 102}))
    assert any("KV heads" in p for p in _problems(
        "pretrain_llama3.1", "8b", "bf16", 16, "h100", overrides={"tp": 16, "cp": 1}))
    assert any("cannot be split" in p for p in _problems(
        "pretrain_llama3.1", "70b", "bf16", 64, "h100", overrides={"vp": 7}))
    assert any("2*CP" in p for p in _problems(
        "pretrain_llama3.1", "8b", "bf16", 8, "h100", overrides={"seq_len": 8190}))
    # FP8 on a CPU is an emulation (tests/test_fp8.py), so only a GPU without it is refused.
    assert planning.build_plan("pretrain_llama3.1", "tiny", "fp8", 2, "cpu").dtype == "fp8"
    assert any("no MXFP8" in p for p in _problems("pretrain_llama3.1", "tiny", "mxfp8", 2,
                                                   "h100"))
    assert any("no FP8" in p for p in _problems("pretrain_llama3.1", "tiny", "fp8", 2, "a100"))
    assert "scales: 8, 16, 32, 64, 128" in _problems("pretrain_llama3.1", "8b", "bf16", 12, "h100")[0]
    assert "unknown workload" in _problems("pretrain_gpt", "8b", "bf16", 8, "h100")[0]
    assert "known sizes" in _problems("pretrain_llama3.1", "9b", "bf16", 8, "h100")[0]
    assert "unknown GPU type" in _problems("pretrain_llama3.1", "8b", "bf16", 8, "v100")[0]
    assert any("context parallelism" in p for p in _problems(
        "pretrain_nemotronh", "tiny", "bf16", 2, "cpu", overrides={"cp": 2, "dp": 1}))


def test_nemo_uneven_split_is_accepted_for_405b_layouts():
    for size, scale in (("405b", 512), ("405b-proxy", 64), ("405b-proxy", 128)):
        assert planning.build_plan("pretrain_llama3.1", size, "bf16", scale, "h100")


def test_overrides_parse_and_reject():
    assert overrides.parse_overrides(["tp=2 gbs=64", "recompute=full"]) == {
        "tp": 2, "gbs": 64, "recompute": "full"}
    for bad in (["tp"], ["tp=two"], ["colour=red"], ["recompute=some"]):
        with pytest.raises(planmod.PlanError):
            overrides.parse_overrides(bad)


def test_unknown_gpu_accepted_with_peak():
    p = planning.build_plan("pretrain_llama3.1", "tiny", "bf16", 1, "mygpu", peak_tflops=100.0)
    assert p.peak_tflops == 100.0
