"""A row's plan, checked before it launches. No torch.

The plan is built exactly as `trainbench run` builds it from the same options, so what
predict describes is what runs. On a GPU a real-width proxy that does not plan here (an
option this trainbench lacks, a dtype without a recipe) or that predict says does not
fit the GPU falls back to the family's tiny size, and the row says why.
"""

from __future__ import annotations

import importlib.util
from dataclasses import replace

from ..overrides import parse_overrides
from ..plan import Plan, PlanError
from ..planning import build_plan
from ..predict.context import ENGINE
from ..predict.memory import predict_memory
from .rows import SINGLE_RANK, Row


def plan_of(row: Row, gpu_key: str) -> Plan:
    """The plan `trainbench run` makes of the row here; PlanError when it makes none."""
    plan = build_plan(row.workload, row.size, row.dtype, 1, gpu_key,
                      overrides=parse_overrides([row.settings] if row.settings else []))
    if plan.ssd_scan == "auto" and importlib.util.find_spec("mamba_ssm") is None:
        # The run's auto finds no mamba_ssm on this machine and runs the torch scan:
        # predict's figure beside it should charge that scan.
        plan = replace(plan, ssd_scan="torch")
    return plan


def resolve(row: Row, gpu_key: str) -> tuple[Row, Plan | None, str | None]:
    """The row as it will run, its plan, and the problem when it has none (the row is
    then reported, not run)."""
    try:
        plan = plan_of(row, gpu_key)
    except PlanError as err:
        plan, why = None, f"the {row.size} proxy does not plan: {err.problems[0]}"
    else:
        memory = predict_memory(plan, sharding=ENGINE)
        if memory.fits is not False:  # None on a CPU: no memory limit known
            return row, plan, None
        why = (f"the {row.size} proxy ({row.shape}) is predicted to need "
               f"{memory.total_gib:.1f} GiB, more than this GPU holds")
    if row.size == "tiny":
        return row, None, why
    tiny = replace(row, size="tiny", settings=SINGLE_RANK, note=f"tiny size: {why}")
    try:
        return tiny, plan_of(tiny, gpu_key), None
    except PlanError as err:
        return tiny, None, f"{why}; the tiny size does not plan either: {err.problems[0]}"
