"""The tables `trainbench show` prints: a model's architecture, its recipe rows and the
published references, built from the catalog alone (no torch)."""

from __future__ import annotations

from rich.table import Table

from . import flops as fl
from . import metrics
from .catalog import hardware, recipes, references
from .catalog.models import ModelSpec, active_parameter_count, parameter_count

_FIELDS = ["vocab_size", "hidden", "ffn", "layers", "heads", "kv_heads", "head_dim", "seq_len",
           "mlp", "norm", "rope_base", "rotary_fraction", "rope_scaling", "position_embedding"]
_HYBRID_FIELDS = ["pattern", "mamba_heads", "mamba_head_dim", "mamba_state", "mamba_groups",
                  "mamba_chunk"]
_MOE_FIELDS = ["n_routed_experts", "n_shared_experts", "top_k", "moe_ffn", "first_dense_layers",
               "router", "n_group", "topk_group", "routed_scaling", "aux_loss", "aux_loss_coef",
               "bias_update_speed"]
_MLA_FIELDS = ["q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
               "v_head_dim"]


def architecture_table(model: ModelSpec, workload: str, size: str, rows: list) -> Table:
    """The model's fields, its layer mix, parameters and FLOPs per sequence."""
    arch = Table(title=f"{model.name} ({workload} {size})", show_header=False)
    arch.add_column("field")
    arch.add_column("value")
    fields = (_FIELDS + (_HYBRID_FIELDS if model.is_hybrid else [])
              + (_MOE_FIELDS if model.is_moe else []) + (_MLA_FIELDS if model.is_mla else []))
    for f in fields:
        arch.add_row(f, str(getattr(model, f)))
    if model.is_hybrid:
        counts = model.layer_counts()
        arch.add_row("layers by kind", f"{counts['mamba']} M (Mamba-2), {counts['attention']} * "
                     f"(attention), {counts['mlp']} - (MLP); --set layers=N keeps N in this "
                     "mix, --set pattern=... gives any other")
    depths = sorted({r.layers for r in rows})
    if len(depths) > 1 and not model.is_hybrid:
        by_scale = ", ".join(f"{r.layers} at {r.gpus} GPUs" for r in
                             sorted({(r.gpus, r.layers): r for r in rows}.values(),
                                    key=lambda r: r.gpus))
        arch.add_row("layers by scale", by_scale + " (figures below: the full depth; "
                     "pass --scale for one)")
    total = parameter_count(model)
    arch.add_row("parameters", f"{total:,} ({total / 1e9:.2f} B)")
    if model.is_moe:
        active = active_parameter_count(model)
        arch.add_row("active parameters", f"{active:,} ({active / 1e9:.2f} B per token, "
                     "embedding row included)")
    for conv in fl.CONVENTIONS:
        value = fl.flops_per_sequence(model, convention=conv)
        arch.add_row(f"FLOPs/sequence ({conv})", f"{fl.round_sig(value, 4):.4g} ({value:.6e})")
    return arch


def recipe_table(rows: list) -> tuple[Table, list[str]]:
    """The recipe rows, and their sources as numbered notes: a source and its note can run
    to a paragraph, so each is printed once, under the table."""
    table = Table(title="Recipe rows")
    for col in ("dtype", "gpu", "GPUs", "seq", "layers", "TP", "PP", "CP", "EP", "DP", "VP", "MBS",
                "GBS", "GA", "source"):
        table.add_column(col)
    sources: dict[str, int] = {}
    for r in rows:
        text = r.source + (f": {r.note}" if r.note else "")
        key = sources.setdefault(text, len(sources) + 1)
        table.add_row(r.dtype, r.gpu_type, str(r.gpus), str(r.seq_len), str(r.layers), str(r.tp),
                      str(r.pp), str(r.cp), str(r.ep) if r.ep > 1 else "NA", str(r.dp),
                      str(r.vp) if r.vp > 1 else "NA", str(r.mbs), str(r.gbs), str(r.ga),
                      f"[{key}]")
    return table, [f"[{key}] {text}" for text, key in sources.items()]


def reference_table(catalog_model: ModelSpec, workload: str, size: str, dtype: str | None,
                    scale: int | None) -> Table | None:
    """The published H100 references with the MFU recomputed from trainbench's FLOPs of
    the model they ran (whole, at the row's depth); None where there is none."""
    refs = [r for r in references.references_for(workload, size)
            if (dtype is None or r.dtype == dtype.lower()) and (scale is None or r.gpus == scale)]
    if not refs:
        return None
    table = Table(title="Published reference (H100)")
    for col in ("dtype", "GPUs", "step time (s)", "tokens/s", "MFU (seed)",
                "MFU (published, recomputed)", "days per 1T tokens"):
        table.add_column(col)
    for ref in refs:
        row = recipes.find_row(workload, size, ref.dtype, ref.gpus, "h100")
        spec = (catalog_model.with_layers(row.layers) if not catalog_model.is_hybrid
                else catalog_model)
        f = fl.flops_per_sequence(spec, row.seq_len)
        peak = hardware.GPUS["h100"].peak(ref.dtype)
        recomputed = metrics.mfu(row.gbs, f, ref.step_time_s, ref.gpus, peak)
        table.add_row(ref.dtype, str(ref.gpus), f"{ref.step_time_s:g}",
                      f"{ref.tokens_per_s:,.0f}", f"{ref.mfu_pct:.2f}%",
                      f"{100 * recomputed:.2f}%",
                      f"{ref.days_1t:g}" if ref.days_1t is not None else "n/a")
    return table
