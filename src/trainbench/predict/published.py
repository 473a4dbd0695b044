"""Plans for published layouts that are not recipe rows, so `predict` can compare itself
with them.

NVIDIA's MoE rows (catalog.heldout.HELD_OUT_MOE) include layouts of other releases and
a DeepSeek-V3 row whose pipeline layout is not published, which no recipe row (or plan
validation) carries. Predicting such a layout needs only its arithmetic to hold: the
plan is built with a layout validation accepts and then given the published one, after
the checks that matter to the model here. Pure Python.
"""

from __future__ import annotations

from dataclasses import replace

from ..catalog import hardware, recipes
from ..catalog.models import get_model
from ..plan import Layout, Plan, PlanError
from ..planning import build_plan


def published_plan(workload: str, size: str, dtype: str, gpus: int, gpu_type: str, *,
                   tp: int, pp: int, cp: int, ep: int, vp: int, mbs: int, gbs: int,
                   seq_len: int, recompute: str = "selective", source: str = "published") -> Plan:
    """The plan of a published layout, for prediction only (PlanError when its numbers
    do not fit together). DeepSeek-V3's 61 layers take Megatron-Bridge's layout for the
    row's stage count where one is known (catalog.recipes.DSV3_SPLITS); otherwise predict
    splits them as evenly as it can."""
    problems = []
    if gpus % (tp * pp * cp):
        problems.append(f"{gpus} GPUs do not split into TP{tp} x PP{pp} x CP{cp}")
    dp = gpus // (tp * pp * cp) if not problems else 1
    if not problems and (tp * dp * cp) % ep:
        problems.append(f"EP{ep} does not divide the TP x DP x CP ranks of a stage "
                        f"({tp * dp * cp})")
    if not problems and gbs % (mbs * dp):
        problems.append(f"GBS {gbs} is not a multiple of MBS {mbs} x DP {dp}")
    if problems:
        raise PlanError(problems)
    # The tiny size's bf16 plan carries everything but the model, the dtype and the layout
    # (any published layout, whether a recipe row has it or not).
    base = build_plan(workload, "tiny", "bf16", gpus, gpu_type,
                      overrides=dict(tp=1, pp=1, cp=1, ep=1, dp=gpus, vp=1, mbs=mbs, gbs=gbs,
                                     seq_len=seq_len, recompute=recompute))
    gpu = hardware.get_gpu(gpu_type)
    model = get_model(workload, size)
    split = recipes.DSV3_SPLITS.get(pp * vp, "") if model.family == "deepseek_v3" else ""
    return replace(base, model=model, size=size, dtype=dtype,
                   peak_tflops=gpu.peak(dtype), recipe_source=source,
                   layout=Layout(tp=tp, pp=pp, cp=cp, ep=ep, dp=dp, vp=vp, pp_split=split))
