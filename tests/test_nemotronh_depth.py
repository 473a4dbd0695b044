"""Nemotron-H cut to fewer layers (`--set layers=N` or `--set pattern=...`): the cut keeps
the published pattern's mix of Mamba-2, attention and MLP layers, and plan, FLOPs,
predict, check, show and a real run all follow the cut model."""

import json
import math

import pytest
import torch

from helpers import losses, run_cli, train
from trainbench import flops as fl
from trainbench.catalog.hybrid import cut_pattern, kind_counts
from trainbench.catalog.models import NEMOTRONH_56B_PATTERN, get_model, parameter_count
from trainbench.overrides import parse_overrides
from trainbench.plan import PlanError
from trainbench.planning import build_plan
from trainbench.predict.memory import predict_memory
from trainbench.predict.perf import predict_step

# ../shared/reference/architectures.md, Nemotron-H 56B: "Pattern (118 chars: 54 M, 10 *,
# 54 -): `M-M-M-M*-` + `M-M-M-M-M*-` repeated 9 times + `M-M-M-M-M-`". By hand:
# the head 4 M, 1 *, 4 -; each repeat 5 M, 1 *, 5 -; the tail 5 M, 0 *, 5 -.
PUBLISHED = "M-M-M-M*-" + "M-M-M-M-M*-" * 9 + "M-M-M-M-M-"
HAND = {"M": 4 + 9 * 5 + 5, "*": 1 + 9 * 1 + 0, "-": 4 + 9 * 5 + 5}  # 54, 10, 54 of 118


def test_the_catalog_holds_the_published_pattern():
    assert NEMOTRONH_56B_PATTERN == PUBLISHED
    assert len(PUBLISHED) == 118 and HAND == {"M": 54, "*": 10, "-": 54}


# Expected counts worked by hand from 54 M, 10 *, 54 - of 118 (quota N * c / 118): every
# kind starts with one layer, the rest go one at a time to the kind furthest below its
# quota, ties to the kind met first (M, then -, then *).
@pytest.mark.parametrize("layers, expected", [
    (3, {"M": 1, "-": 1, "*": 1}),    # quotas 1.37, 1.37, 0.25: one each
    (5, {"M": 2, "-": 2, "*": 1}),    # 2.29, 2.29, 0.42: M and - take the two left
    (7, {"M": 3, "-": 3, "*": 1}),    # 3.20, 3.20, 0.59
    (12, {"M": 6, "-": 5, "*": 1}),   # 5.49, 5.49, 1.02: after 5, 5, 1 the tie goes to M
    (59, {"M": 27, "-": 27, "*": 5}),  # half the model: exactly half of each kind
    (118, {"M": 54, "-": 54, "*": 10}),
    (2, {"M": 1, "-": 1, "*": 0}),    # fewer layers than kinds: no floor of one
])
def test_a_cut_keeps_the_published_mix(layers, expected):
    assert kind_counts(PUBLISHED, layers) == expected
    cut = cut_pattern(PUBLISHED, layers)
    assert {k: cut.count(k) for k in "M-*"} == expected


def test_every_cut_is_within_one_layer_of_each_kinds_share_and_in_the_models_order():
    for layers in range(1, 119):
        cut = cut_pattern(PUBLISHED, layers)
        assert len(cut) == layers and cut[0] == PUBLISHED[0]
        for kind, total in HAND.items():
            assert abs(cut.count(kind) - layers * total / 118) < 1, (layers, kind)
        rest = iter(PUBLISHED)  # a subsequence: the kept layers keep the model's order
        assert all(c in rest for c in cut), layers
    assert cut_pattern(PUBLISHED, 118) == PUBLISHED
    assert cut_pattern(PUBLISHED, 5) == "M-*M-"


def _plan(settings: str, size: str = "56b", dtype: str = "fp8", gpu: str = "h100"):
    layout = " tp=1 pp=1 cp=1 dp=1 mbs=1 gbs=1" if size == "56b" else ""
    return build_plan("pretrain_nemotronh", size, dtype, 1, gpu,
                      overrides=parse_overrides([settings + layout]))


def test_the_plan_carries_the_cut_model_and_flops_and_predict_follow_it():
    full = get_model("pretrain_nemotronh", "56b")
    plan = _plan("layers=5")
    cut = plan.model
    assert (cut.pattern, cut.layers, cut.hidden) == ("M-*M-", 5, full.hidden)
    # FLOPs per layer kind do not depend on the depth: the cut's are its counts' share.
    for conv in fl.CONVENTIONS:
        whole, part = fl.flops_breakdown(full, 8192, conv), fl.flops_breakdown(cut, 8192, conv)
        assert part["mamba"] == pytest.approx(whole["mamba"] * 2 / 54)
        assert part["attention"] == pytest.approx(whole["attention"] * 1 / 10)
        assert part["mlp"] == pytest.approx(whole["mlp"] * 2 / 54)
        assert part["embedding"] == whole["embedding"]
    # predict and the memory model take the plan's model: fewer layers, less of both.
    three = _plan("layers=3")
    assert predict_memory(three, sharding="engine").total < predict_memory(
        plan, sharding="engine").total
    assert predict_step(three, sharding="engine").step_time_s < predict_step(
        plan, sharding="engine").step_time_s


def test_an_explicit_pattern_is_the_model():
    plan = _plan("pattern=M*--M")
    assert (plan.model.pattern, plan.model.layers) == ("M*--M", 5)
    assert _plan("layers=4 pattern=MM*-").model.pattern == "MM*-"


@pytest.mark.parametrize("settings, message", [
    ("pattern=M-X", "'X' is not a layer kind; a pattern holds only M (Mamba-2), * (attention) "
                    "and - (MLP)"),
    ("pattern=m-*", "'m' is not a layer kind"),
    ("layers=119", "pattern has 118 layers, and layers=N keeps at most that many"),
    ("layers=4 pattern=M-*", "--set layers=4 and pattern=M-* (3 layers) disagree"),
])
def test_a_bad_depth_is_refused_in_one_line(settings, message):
    with pytest.raises(PlanError) as err:
        _plan(settings)
    assert len(err.value.problems) == 1 and message in err.value.problems[0]


def test_the_cli_refuses_a_bad_pattern_with_one_line_and_exit_2(tmp_path):
    cases = [
        ("run", "-w", "pretrain_nemotronh", "-s", "tiny", "--scale", "1", "--gpu", "cpu",
         "--dry-run", "--set", "pattern=M-?"),
        ("run", "-w", "pretrain_llama3.1", "-s", "tiny", "--scale", "1", "--gpu", "cpu",
         "--dry-run", "--set", "pattern=M-"),
        ("show", "-w", "pretrain_nemotronh", "-s", "56b", "--set", "pattern="),
        ("show", "-w", "pretrain_nemotronh", "-s", "56b", "--set", "layers=0"),
        ("show", "-w", "pretrain_nemotronh", "-s", "56b", "--set", "tp=2"),
    ]
    for args in cases:
        res = run_cli(*args, root=tmp_path)
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 2 and len(lines) == 1, (args, res.stderr)
        assert lines[0].startswith("trainbench: error: ") and "Traceback" not in res.stderr
    assert not (tmp_path / "experiments").exists()


def test_show_prints_the_cut_model_and_its_flops(tmp_path):
    res = run_cli("show", "-w", "pretrain_nemotronh", "-s", "56b", "--set", "layers=5",
                  root=tmp_path)
    assert res.returncode == 0, res.stderr
    cut = get_model("pretrain_nemotronh", "56b").with_layers(5)
    assert "M-*M-" in res.stdout
    assert "2 M (Mamba-2), 1 * (attention), 2 - (MLP)" in res.stdout
    assert f"{parameter_count(cut):,}" in res.stdout
    assert f"{fl.flops_per_sequence(cut, convention='published'):.6e}" in res.stdout
    # The published reference keeps the whole model's FLOPs (its MFU is recomputed).
    whole = run_cli("show", "-w", "pretrain_nemotronh", "-s", "56b", root=tmp_path)
    assert whole.stdout.split("Published reference")[1] == res.stdout.split(
        "Published reference")[1]


def test_check_builds_the_real_width_cut_with_predicts_state(tmp_path):
    res = run_cli("check", "-w", "pretrain_nemotronh", "-s", "56b", "--dtype", "fp8",
                  "--gpu", "h100", "--scale", "1", "--set",
                  "layers=3 tp=1 pp=1 cp=1 dp=1 mbs=1 gbs=1", root=tmp_path, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    cut = get_model("pretrain_nemotronh", "56b").with_layers(3)
    assert cut.pattern == "M-*"
    assert "[0-2]+emb+out" in res.stdout and f"{parameter_count(cut):,}" in res.stdout


def test_the_cut_modules_hold_the_counted_parameters():
    from trainbench.engine.models import build_model
    spec = get_model("pretrain_nemotronh", "56b").with_layers(4)
    with torch.device("meta"):
        model = build_model(spec)
    assert [layer.kind for layer in model.layers.values()] == list("M-*M")
    assert sum(p.numel() for p in model.parameters()) == parameter_count(spec)


@pytest.mark.dist
def test_a_tiny_cut_trains_through_run_and_its_plan_records_the_pattern(tmp_path):
    exp = train(tmp_path, "pretrain_nemotronh", 1, "--set", "layers=3", steps=3)
    plan = json.loads((exp / "plan.json").read_text())
    assert plan["model"]["pattern"] == cut_pattern("M-*-M-", 3) == "M-*"
    assert plan["model"]["layers"] == 3
    got = losses(exp)
    assert len(got) == 3 and all(math.isfinite(v) for v in got)
    assert got[-1] < got[0]
