"""Where each rank sits in the (pp, dp, cp, tp) mesh and which layers it owns. Pure Python.

The pipeline split follows NeMo: when the layers do not divide evenly over the PP*VP
virtual stages, the embedding and the loss each count as one layer, so the first and
the last virtual stage hold one transformer layer fewer (Llama 3.1 405B on PP8 VP8:
126 + 2 = 128 = 64 stages x 2; stage 0 has 1 layer, stages 1-62 have 2, stage 63 has 1).
"""

from __future__ import annotations

from .plan import Plan, pipeline_layers
from .pp_split import layer_counts


def stage_layers(num_layers: int, pp: int, vp: int = 1, split: str = "") -> list[list[int]]:
    """Layer indices of each virtual stage, in pipeline order (stage s runs on rank s % pp);
    `split` is a Megatron pipeline layout (pp_split.py) placing them instead."""
    stages = pp * vp
    if split:
        sizes = layer_counts(split, stages, num_layers)
    elif stages > num_layers + 2:
        raise ValueError(f"{num_layers} layers cannot fill {stages} pipeline stages")
    elif num_layers % stages == 0:
        sizes = [num_layers // stages] * stages
    elif (num_layers + 2) % stages == 0:
        per = (num_layers + 2) // stages
        sizes = [per] * stages
        sizes[0] -= 1  # the embedding counts as a layer
        sizes[-1] -= 1  # so does the loss
    else:
        raise ValueError(f"{num_layers} layers do not split into {stages} stages "
                         f"(nor do {num_layers} + 2 with embedding and loss)")
    out, start = [], 0
    for size in sizes:
        out.append(list(range(start, start + size)))
        start += size
    return out


def rank_stages(pp_rank: int, pp: int, vp: int) -> list[int]:
    """The virtual stages a pipeline rank runs: pp_rank, pp_rank + pp, ... (interleaved)."""
    return [pp_rank + v * pp for v in range(vp)]


def rank_coordinates(rank: int, plan: Plan) -> dict[str, int]:
    """Mesh coordinates of a global rank; the mesh is (pp, dp, cp, tp), tp fastest."""
    lay = plan.layout
    tp = rank % lay.tp
    cp = (rank // lay.tp) % lay.cp
    dp = (rank // (lay.tp * lay.cp)) % lay.dp
    pp = rank // (lay.tp * lay.cp * lay.dp)
    return {"pp": pp, "dp": dp, "cp": cp, "tp": tp}


def _span(layers: list[int]) -> str:
    if not layers:
        return "-"
    return f"{layers[0]}" if len(layers) == 1 else f"{layers[0]}-{layers[-1]}"


def rank_rows(plan: Plan, limit: int = 32) -> list[dict[str, str]]:
    """One row per rank for `run --dry-run`; beyond `limit` ranks, the first rank of each
    pipeline stage (which stands for its TP x CP x DP ranks) and the last rank."""
    lay = plan.layout
    split = stage_layers(pipeline_layers(plan.model), lay.pp, lay.vp, lay.pp_split)
    ranks = list(range(plan.gpus))
    per_stage = lay.tp * lay.cp * lay.dp
    shown = ranks if len(ranks) <= limit else sorted(
        {stage * per_stage for stage in range(lay.pp)} | {ranks[-1]})
    rows = []
    for rank in shown:
        c = rank_coordinates(rank, plan)
        stages = rank_stages(c["pp"], lay.pp, lay.vp)
        owned = " ".join(f"[{_span(split[s])}]" for s in stages)
        extras = []
        if stages[0] == 0:
            extras.append("embedding")
        if stages[-1] == lay.pp * lay.vp - 1:
            extras.append("output+loss")
        rows.append({
            "rank": str(rank), "node": str(rank // plan.gpus_per_node),
            "pp": str(c["pp"]), "dp": str(c["dp"]), "cp": str(c["cp"]), "tp": str(c["tp"]),
            "layers": owned + (" + " + ", ".join(extras) if extras else ""),
        })
    return rows
