"""Megatron's pipeline layout language (`pp_split.py`): DeepSeek-V3's published layouts
place its 61 layers on 32 and 16 stages, and a plan built with one splits, predicts and
lists its ranks by it. (A run with an uneven split trains as one process does:
tests/test_expert_parallel.py, `pp2split`.)"""

from __future__ import annotations

import pytest

from trainbench.catalog.recipes import DSV3_SPLIT_16, DSV3_SPLIT_32
from trainbench.layout import stage_layers
from trainbench.plan import PlanError
from trainbench.planning import build_plan
from trainbench.pp_split import expand, layer_counts
from trainbench.predict.work import pipeline_chunks


def test_deepseek_v3_published_layouts_place_61_layers():
    """PP8 x VP4 (H100): the embedding and 1 layer, 30 stages of 2, then MTP and the loss
    (no layer). PP4 x VP4 (GB200, without MTP): 4 with the embedding, 14 stages of 4, the
    last layer with the loss."""
    assert layer_counts(DSV3_SPLIT_32, 32, 61) == [1] + [2] * 30 + [0]
    assert expand(DSV3_SPLIT_32)[-1] == "mL"
    assert layer_counts(DSV3_SPLIT_16, 16, 61) == [4] + [4] * 14 + [1]
    split = stage_layers(61, 4, 4, DSV3_SPLIT_16)
    assert split[0] == [0, 1, 2, 3] and split[-1] == [60]
    assert [i for stage in split for i in stage] == list(range(61))


@pytest.mark.parametrize("text,stages,layers,says", [
    ("Et|ttL", 3, 3, "has 2 stages, the plan PP x VP = 3"),
    ("Et|ttL", 2, 4, "places 3 layers, the model has 4"),
    ("tE|ttL", 2, 3, "the embedding (E) must open the first stage"),
    ("Et|tLt", 2, 3, "the loss (L) must close the last stage"),
    ("Et||ttL", 3, 3, "stage 1 holds no layer"),
    ("Et|tx|L", 3, 2, "cannot read 'x'"),
])
def test_a_wrong_layout_is_named(text, stages, layers, says):
    with pytest.raises(ValueError) as err:
        layer_counts(text, stages, layers)
    assert says in str(err.value)


def test_the_published_gb200_row_plans_and_predicts_by_its_layout():
    """The BF16 DeepSeek-V3 row on 256 GB200 (TP1 PP4 VP4 EP64) used to be refused (61
    layers split neither evenly nor with the embedding and loss counted); it plans with
    its layout, and predict's stages hold the same layers."""
    plan = build_plan("pretrain_deepseek_v3", "671b", "bf16", 256, "gb200")
    assert plan.layout.pp_split == DSV3_SPLIT_16
    chunks = pipeline_chunks(plan.model, 4, 4, plan.layout.pp_split)
    assert chunks[0][0] == "embedding" and chunks[-1][-1] == "head"
    # The first stage: embedding, then 4 layers (the 3 dense layers and the first MoE).
    assert chunks[0][1:] == ["attention", "mlp"] * 3 + ["attention", "moe"]
    assert chunks[-1] == ["attention", "moe", "head"]


def test_a_layout_is_set_and_checked_like_any_override():
    plan = build_plan("pretrain_deepseek_v3", "tiny", "bf16", 2, "cpu",
                      overrides={"pp": 2, "pp_split": "Et|tttL"})
    assert stage_layers(4, 2, 1, plan.layout.pp_split) == [[0], [1, 2, 3]]
    with pytest.raises(PlanError) as err:
        build_plan("pretrain_deepseek_v3", "tiny", "bf16", 2, "cpu",
                   overrides={"pp": 2, "pp_split": "Et|ttL"})
    assert "--set pp_split: pipeline layout 'Et|ttL' places 3 layers, the model has 4" in str(err.value)
    # Changing the stages drops the row's layout, which was written for the row's stages
    # (PP2 VP8 is 16 stages too, but not the same 16): the plan then asks for one.
    with pytest.raises(PlanError) as err:
        build_plan("pretrain_deepseek_v3", "671b", "bf16", 256, "gb200",
                   overrides={"pp": 2, "vp": 8})
    assert "61 layers cannot be split into PP*VP = 16 stages" in str(err.value)
    assert "--set pp_split=" in str(err.value)
