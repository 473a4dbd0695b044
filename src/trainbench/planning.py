"""Building a plan: a recipe row plus `--set` overrides become one validated Plan, or a
PlanError listing every problem (one line each) before anything launches. A Megatron
recipe row takes the state sharding that predict's memory model says fits (pure Python:
planning never imports torch)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

from .catalog import hardware, recipes
from .catalog.models import ModelSpec, get_model
from .overrides import CHOICE_KEYS, LAYOUT_KEYS, MAX_SCALE, MAX_STEPS, TEXT_KEYS
from .plan import (DTYPES, FP8_RECIPES, Features, Layout, Plan, PlanError, experiment_name,
                   layers_split_ok, pipeline_layers)
from .pp_split import layer_counts
from .predict.memory import predict_memory


def shape_model(model: ModelSpec, layers: int | None = None,
                pattern: str | None = None, experts: int | None = None) -> ModelSpec:
    """The model with `--set layers=N`, `--set pattern=...` or `--set experts=N` applied;
    PlanError (one line) for a pattern of unknown layer kinds, on a model without one,
    longer than the model's own when cut by layers=N, or disagreeing with layers=N, and
    for experts on a dense model or below top_k (ModelSpec.with_experts)."""
    if experts is not None:
        try:
            model = model.with_experts(experts)
        except ValueError as err:
            raise PlanError([f"--set experts={experts}: {err}"]) from None
    if pattern is not None:
        if not model.is_hybrid:
            raise PlanError([f"--set pattern: {model.name} has no layer pattern (only hybrid "
                             "models such as Nemotron-H have one); use --set layers=N"])
        if layers is not None and layers != len(pattern):
            raise PlanError([f"--set layers={layers} and pattern={pattern} ({len(pattern)} "
                             "layers) disagree; give one of them"])
        try:
            return model.with_pattern(pattern)
        except ValueError as err:
            raise PlanError([f"--set pattern={pattern}: {err}"]) from None
    if layers is None:
        return model
    if layers < 1:
        raise PlanError([f"--set layers={layers}: a model needs at least 1 layer"])
    if model.is_hybrid and layers > len(model.pattern):
        raise PlanError([f"--set layers={layers}: {model.name}'s pattern has "
                         f"{len(model.pattern)} layers, and layers=N keeps at most that many "
                         "in its mix of kinds; --set pattern=... gives any other pattern"])
    return model.with_layers(layers)


def proxy_shape(model: ModelSpec) -> str:
    """What a proxy keeps of its model, for the plan's note: depth and, for an MoE, the
    routed experts."""
    shape = f"{model.layers} layer" + ("s" if model.layers != 1 else "")
    if model.is_moe:
        shape += f", {model.n_routed_experts} routed experts, top {model.top_k}"
    return shape


def pipeline_schedule_problems(microbatches: int, pp: int, vp: int) -> list[str]:
    """What torch.distributed.pipelining's schedules need of the microbatch count GA.

    1F1B (VP = 1) needs at least PP microbatches. Interleaved 1F1B runs them in rounds
    of about PP (max(1, GA // PP) rounds) and needs GA to be a multiple of the round
    count; fewer than PP microbatches is refused too (such a pipeline is mostly bubble).
    """
    fix = "raise GBS or lower MBS or DP"
    schedule = "1F1B" if vp == 1 else "interleaved 1F1B"
    if microbatches < pp:
        return [f"GA = GBS/(MBS*DP) = {microbatches}, but the {schedule} pipeline schedule "
                f"needs at least PP = {pp} microbatches per step; {fix}"]
    rounds = max(1, microbatches // pp)
    if vp > 1 and microbatches % rounds:
        return [f"GA = {microbatches} microbatches do not split into {rounds} rounds "
                f"(GA // PP) of the interleaved 1F1B schedule; use a multiple of PP = {pp}"]
    return []


def _recipe_row(workload: str, size: str, dtype: str, scale: int, gpu_type: str,
                overrides: dict, model: ModelSpec) -> recipes.RecipeRow:
    """The recipe row the plan starts from; a layout given in full with --set needs none
    at this scale."""
    # MXFP8 runs its own published layout where there is one at this scale on this GPU
    # (the MoE rows on Blackwell), else the FP8 recipe's.
    row_dtype = dtype
    if dtype == "mxfp8" and not any(r.gpus == scale for r in recipes.rows_for(
            workload, size, "mxfp8", gpu_type)):
        row_dtype = "fp8"
    try:
        row = recipes.find_row(workload, size, row_dtype, scale, gpu_type)
    except LookupError as err:
        if not any(k in overrides for k in ("tp", "pp", "cp", "dp")):
            raise PlanError([str(err)]) from None
        # A layout given in full with --set needs no recipe row at this scale: start
        # from the nearest row and let validation check the result.
        rows = recipes.rows_for(workload, size, row_dtype)
        if not rows:
            # No recipe in this dtype (Qwen3 30B-A3B in bf16) or none at all: the layout
            # given with --set is the whole plan; batch sizes default to one sequence per
            # rank.
            rows = [recipes.RecipeRow(
                workload, size, row_dtype, gpu_type, scale, model.seq_len, pipeline_layers(model),
                1, 1, 1, 1, scale, 1, 1, scale, 1, f"--set (no published {row_dtype} recipe)")]
        row = min(rows, key=lambda r: abs(r.gpus - scale))
        row = replace(row, gpus=scale, note=f"layout from --set (no recipe row at scale {scale})")
    return row


def _shaped_model(workload: str, size: str, model: ModelSpec, row: recipes.RecipeRow,
                  overrides: dict) -> tuple[ModelSpec, recipes.RecipeRow]:
    """The model cut by --set layers/pattern/experts (a proxy, noted on the row), or at
    the row's depth (the 405B proxies)."""
    if overrides.keys() & {"layers", "pattern", "experts"}:
        model = shape_model(model, overrides.pop("layers", None), overrides.pop("pattern", None),
                            overrides.pop("experts", None))
        published = get_model(workload, size)
        if not published.is_hybrid:
            published = published.with_layers(row.layers)
        if row.source != recipes.TINY and model != published:
            row = replace(row, note=row.note + ("; " if row.note else "")
                          + f"a proxy of {get_model(workload, size).name} ({proxy_shape(model)}):"
                          " no published reference")
    elif not model.is_hybrid and row.layers != model.layers:
        model = model.with_layers(row.layers)  # the 405B proxies
    return model, row


def _layout(row: recipes.RecipeRow, overrides: dict, scale: int) -> Layout:
    """The row's parallel layout with the --set degrees applied; DP follows the others."""
    layout = Layout(tp=row.tp, pp=row.pp, cp=row.cp, ep=row.ep, dp=row.dp, vp=row.vp,
                    dp_shard=row.dp_shard, pp_split=row.pp_split)
    layout_over = {k: overrides.pop(k) for k in LAYOUT_KEYS + TEXT_KEYS if k in overrides}
    if layout_over.keys() & {"pp", "vp"} and "pp_split" not in layout_over:
        layout = replace(layout, pp_split="")  # the row's split is for the row's stages
    if layout_over:
        layout = replace(layout, **layout_over)
        if "dp" not in layout_over and scale % (layout.tp * layout.pp * layout.cp) == 0:
            layout = replace(layout, dp=scale // (layout.tp * layout.pp * layout.cp))
        if "dp_shard" not in layout_over:
            layout = replace(layout, dp_shard=0)
    return layout


def _set_run_defaults(overrides: dict, tiny: bool, gpu_type: str) -> None:
    """Learning rate, warm-up, recompute and compile where --set left them."""
    # NeMo's recipes: lr 3e-4 warming up over 2000 steps (a 50-step benchmark never leaves
    # the warm-up). The tiny proxies learn their synthetic task within 50 steps instead.
    overrides.setdefault("lr", 3e-3 if tiny else 3e-4)
    overrides.setdefault("min_lr", overrides["lr"] / 10)
    overrides.setdefault("warmup_steps", 5 if tiny else 2000)
    if "compile" in overrides:
        overrides["compile_source"] = "set"
    else:
        # On by default on GPUs, as torchtitan runs. Off on a CPU: inductor's C++ code
        # generation costs tens of seconds per block shape there, and a CPU run checks
        # numerics, which compiled and eager share (tests/test_compile.py).
        overrides["compile"] = gpu_type != hardware.CPU


def build_plan(workload: str, size: str, dtype: str, scale: int, gpu_type: str, *,
               overrides: dict | None = None, steps: int = 50, features: Features | None = None,
               peak_tflops: float | None = None, gpus_per_node: int | None = None,
               env: dict[str, str] | None = None, out_dir: str = "") -> Plan:
    """A validated plan, or PlanError listing every problem (one line each)."""
    overrides = dict(overrides or {})
    dtype = dtype.lower()
    gpu_type = gpu_type.lower()
    early = input_problems(scale, overrides, steps, features)
    if early:
        # Checked before anything divides by a degree or rebuilds the model with them.
        raise PlanError(early)
    try:
        model = get_model(workload, size)
    except LookupError as err:
        raise PlanError([str(err)]) from None
    size = size.lower()
    if dtype not in DTYPES:
        raise PlanError([f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}"])
    gpu = None
    if gpu_type != hardware.CPU:
        try:
            gpu = hardware.get_gpu(gpu_type)
        except LookupError as err:
            if peak_tflops is None:
                raise PlanError([str(err)]) from None
    row = _recipe_row(workload, size, dtype, scale, gpu_type, overrides, model)

    model, row = _shaped_model(workload, size, model, row, overrides)

    layout = _layout(row, overrides, scale)
    mbs = overrides.pop("mbs", row.mbs)
    gbs = overrides.pop("gbs", row.gbs)
    seq_len = overrides.pop("seq_len", row.seq_len)
    steps = overrides.pop("steps", steps)
    peak = overrides.pop("peak_tflops", peak_tflops)
    if peak is None and gpu is not None:
        peak = gpu.peak(dtype)
    overrides.setdefault("recompute", row.recompute)
    overrides.setdefault("adam_moments", row.adam_moments)
    overrides.setdefault("master_weights", row.master_weights)
    _set_run_defaults(overrides, tiny=row.source == recipes.TINY, gpu_type=gpu_type)
    per_node = overrides.pop("gpus_per_node", gpus_per_node)
    if per_node is None:
        per_node = gpu.gpus_per_node if gpu else scale
    plan = Plan(
        workload=workload, size=size, dtype=dtype, gpu_type=gpu_type, model=model, layout=layout,
        mbs=mbs, gbs=gbs, seq_len=seq_len, steps=steps, gpus_per_node=per_node,
        peak_tflops=peak, features=features or Features(),
        name=experiment_name(workload, size, dtype, scale), out_dir=out_dir,
        env=tuple(sorted((env or {}).items())), recipe_source=row.source, recipe_note=row.note,
        **overrides,
    )
    problems = validate(plan, scale, gpu)
    if problems:
        raise PlanError(problems)
    if not (megatron_recipe_row(plan) and gpu is not None):
        return replace(plan, dp_sharding_source="set") if "dp_sharding" in overrides else plan
    return recipe_sharding(plan, choose_sharding="dp_sharding" not in overrides,
                           choose_dtype="reduce_dtype" not in overrides)


MEGATRON_SHARDINGS = ("optimizer", "gradients", "full")
"""The engine's data-parallel shardings, closest to Megatron's distributed optimizer
(ZeRO-1: only the fp32 master weights and Adam's moments sharded) first."""


def megatron_recipe_row(plan: Plan) -> bool:
    """A plan from a published recipe that Megatron-LM ran (NeMo, Megatron-Bridge): not
    MaxText's FSDP (Llama 2), not a tiny proxy, not a layout given without a row."""
    return (plan.recipe_source not in (recipes.SEED_LLAMA2, recipes.TINY)
            and not plan.recipe_source.startswith("--set"))


def recipe_sharding(plan: Plan, choose_sharding: bool = True, choose_dtype: bool = True
                    ) -> Plan:
    """The state sharding a Megatron recipe row ran, as near as the engine comes to it
    (what --set did not give): bf16 gradients (`choose_dtype`; NeMo's performance recipes
    set `grad_reduce_in_fp32 = False`, e.g. nemo/collections/llm/recipes/llama3_70b.py
    and nemotron4_340b.py, `pretrain_performance_optimizations`; the NeMo Launcher's
    Nemotron-4 340B config `optim.grad_sync_dtype: bf16`) and the first of
    MEGATRON_SHARDINGS that `trainbench predict`'s memory model of the engine says fits
    the GPU (`choose_sharding`). Under PP the engine runs as 'optimizer' whatever the
    setting (torch's schedules gather once a step and reduce once), so that is what it
    is called. Where none fits, 'full' (the least memory), which `run` then refuses
    without --force."""
    base = replace(plan, reduce_dtype="bf16") if choose_dtype else plan
    if not choose_sharding:
        return replace(base, dp_sharding_source="set")
    base = replace(base, dp_sharding_source="recipe")
    if plan.layout.pp > 1:
        return base  # runs as 'optimizer' under any setting (weights_kept_gathered)
    for choice in MEGATRON_SHARDINGS:
        candidate = replace(base, dp_sharding=choice)
        try:
            m = predict_memory(candidate, sharding="engine")
        except (LookupError, ValueError):
            return replace(base, dp_sharding=plan.dp_sharding)
        if m.fits is not False:
            return candidate
    return replace(base, dp_sharding="full")


def input_problems(scale: int, overrides: dict, steps: int,
                   features: Features | None) -> list[str]:
    """Problems with the numbers a user typed, found before any of them is used."""
    p = []
    if not isinstance(scale, int) or scale < 1:
        p.append(f"--scale {scale}: the scale is the number of ranks (GPUs, or processes on "
                 "a CPU) and must be at least 1")
    elif scale > MAX_SCALE:
        p.append(f"--scale {scale}: at most {MAX_SCALE:,} ranks")
    for key in ("tp", "pp", "cp", "ep", "dp", "vp"):
        if key in overrides and overrides[key] < 1:
            p.append(f"--set {key}={overrides[key]}: parallel degrees must be at least 1")
    if overrides.get("dp_shard", 0) < 0:
        p.append(f"--set dp_shard={overrides['dp_shard']}: must be 0 (all of dp) or more")
    if "experts" in overrides and overrides["experts"] < 1:
        p.append(f"--set experts={overrides['experts']}: an MoE needs at least 1 routed expert")
    if "layers" in overrides and overrides["layers"] < 1:
        p.append(f"--set layers={overrides['layers']}: a model needs at least 1 layer")
    for key in ("mbs", "gbs", "seq_len", "gpus_per_node"):
        if key in overrides and overrides[key] < 1:
            p.append(f"--set {key}={overrides[key]}: must be at least 1")
    for key in ("warmup_steps", "seed"):
        if key in overrides and overrides[key] < 0:
            p.append(f"--set {key}={overrides[key]}: must be 0 or more")
    run_steps = overrides.get("steps", steps)
    if isinstance(run_steps, int) and not 1 <= run_steps <= MAX_STEPS:
        p.append(f"--steps {run_steps}: must be between 1 and {MAX_STEPS:,}")
    for key in ("lr", "min_lr"):
        value = overrides.get(key)
        if value is not None and not (math.isfinite(value) and value > 0 if key == "lr"
                                      else math.isfinite(value) and value >= 0):
            p.append(f"--set {key}={value}: the learning rate must be a finite number "
                     + ("above 0" if key == "lr" else "of 0 or more"))
    if ("lr" in overrides and "min_lr" in overrides and not p
            and overrides["min_lr"] > overrides["lr"]):
        p.append(f"--set min_lr={overrides['min_lr']} is above lr={overrides['lr']}; the "
                 "schedule decays from lr down to min_lr")
    peak = overrides.get("peak_tflops")
    if peak is not None and not (math.isfinite(peak) and peak > 0):
        p.append(f"--set peak_tflops={peak}: must be a positive number")
    f = features or Features()
    if f.checkpoint_interval < 0:
        p.append(f"--checkpoint-interval {f.checkpoint_interval}: must be 0 (save at the end "
                 "only) or a positive number of steps")
    return p


def overlap_problems(plan: Plan) -> list[str]:
    """The communication-overlap options that cannot run on this plan's device/layout."""
    p, lay = [], plan.layout
    if plan.async_tp:
        # Inductor's micro-pipelined TP rewrites all-gather+matmul into symmetric-memory
        # kernels: CUDA and NCCL only, and only inside compiled graphs.
        if plan.device == "cpu":
            p.append("--set async_tp=true needs CUDA GPUs (NCCL symmetric memory); it "
                     "cannot run on a CPU: drop it")
        elif lay.tp < 2:
            p.append("--set async_tp=true overlaps tensor-parallel communication; it needs "
                     "tp > 1 (e.g. --set tp=2)")
        elif not plan.compile:
            p.append("--set async_tp=true works inside compiled blocks only; drop "
                     "--set compile=false")
    if plan.cp_impl not in CHOICE_KEYS["cp_impl"]:
        p.append(f"cp_impl {plan.cp_impl!r} is not one of allgather, ring")
    elif plan.cp_impl == "ring":
        if lay.cp < 2:
            p.append("--set cp_impl=ring applies only with context parallelism (cp > 1); "
                     "add --set cp=2 or drop it")
        elif plan.device == "cpu":
            # torch 2.13: aten._scaled_dot_product_flash_attention_for_cpu has no sharding
            # strategy, so the ring dispatch never reaches a CPU kernel.
            p.append("--set cp_impl=ring needs CUDA attention kernels (PyTorch's ring "
                     "attention has no CPU path); use --set cp_impl=allgather on a CPU")
    if plan.ssd_scan == "kernel" and plan.device == "cpu":
        p.append("--set ssd_scan=kernel needs CUDA (mamba_ssm's Triton kernels); a CPU runs "
                 "the torch scan: drop it")
    if plan.reduce_dtype not in CHOICE_KEYS["reduce_dtype"]:
        p.append(f"reduce_dtype {plan.reduce_dtype!r} is not one of fp32, bf16")
    if plan.dp_sharding not in CHOICE_KEYS["dp_sharding"]:
        p.append(f"dp_sharding {plan.dp_sharding!r} is not one of full, gradients, optimizer")
    return p


# Far beyond any published model (Llama 3.1 405B has 126 layers, DeepSeek-V3 256 routed
# experts; the published layouts run at most 512 microbatches a step), and small enough
# that every per-layer, per-expert or per-microbatch walk of a plan stays instant.
MAX_LAYERS = 1024
MAX_EXPERTS = 4096
MAX_MICROBATCHES = 65536


def _size_problems(plan: Plan) -> list[str]:
    """Sizes no model or schedule has: refused before anything walks them."""
    p, m = [], plan.model
    layers = max(m.layers, len(m.pattern or ""))
    if layers > MAX_LAYERS:
        p.append(f"{layers:,} layers: at most {MAX_LAYERS:,} (Llama 3.1 405B has 126); use "
                 f"--set layers=N with N <= {MAX_LAYERS:,}")
    if m.n_routed_experts > MAX_EXPERTS:
        p.append(f"{m.n_routed_experts:,} routed experts: at most {MAX_EXPERTS:,} (DeepSeek-V3 "
                 f"has 256); use --set experts=N with N <= {MAX_EXPERTS:,}")
    microbatches = plan.gbs // max(1, plan.mbs * plan.layout.dp)
    if microbatches > MAX_MICROBATCHES:
        p.append(f"GBS {plan.gbs:,} is {microbatches:,} microbatches a step (GBS / (MBS x DP)): "
                 f"at most {MAX_MICROBATCHES:,}; raise mbs or lower gbs")
    return p


def _model_problems(plan: Plan) -> list[str]:
    """What the model's heads, Mamba groups and experts need of the layout."""
    p, m, lay = [], plan.model, plan.layout
    if m.heads % lay.tp:
        p.append(f"{m.heads} attention heads are not divisible by TP={lay.tp}")
    if m.kv_heads % lay.tp:
        p.append(f"{m.kv_heads} KV heads (query groups) are not divisible by TP={lay.tp}")
    if m.is_hybrid:
        if m.mamba_heads % lay.tp or m.mamba_groups % lay.tp:
            p.append(f"Mamba heads {m.mamba_heads} and groups {m.mamba_groups} must be "
                     f"divisible by TP={lay.tp}")
        if lay.cp > 1:
            p.append(f"{plan.workload} has Mamba layers, which have no context parallelism; "
                     "use cp=1")
    if lay.ep > 1:
        # EP spans a stage's tensor, context and data ranks (Megatron-Core's ETP 1
        # layout): each group of ep of them splits the routed experts among themselves.
        stage_ranks = lay.tp * lay.cp * lay.dp
        if not m.is_moe:
            p.append(f"{plan.workload} has no experts; expert parallelism (ep={lay.ep}) "
                     "applies to MoE workloads only; use ep=1")
        elif stage_ranks % lay.ep:
            p.append(f"ep={lay.ep} does not divide tp x cp x dp = {lay.tp} x {lay.cp} x "
                     f"{lay.dp} = {stage_ranks}, the ranks of a pipeline stage that expert "
                     f"parallelism spans; use an ep that divides {stage_ranks}")
        elif m.n_routed_experts % lay.ep:
            p.append(f"{m.n_routed_experts} routed experts do not split over ep={lay.ep}; "
                     "use an ep that divides the expert count")
    if m.is_moe:
        # Run and checked: DP/FSDP, EP, TP, PP (with VP) and CP (README, "Mixture of
        # experts").
        if plan.dtype == "fp8" and plan.gpu_type == hardware.CPU:
            # torchao 0.18's MoE float8 (prototype/moe_training) quantises with Triton
            # kernels and multiplies with torch._scaled_grouped_mm: CUDA only, no CPU kernel.
            # Its MXFP8 grouped GEMM has an emulation that runs anywhere (float8.py).
            p.append(f"{plan.workload}: FP8 for MoE needs torchao's float8 grouped GEMM "
                     "(Triton kernels and torch._scaled_grouped_mm: CUDA GPUs only); on a "
                     "CPU use --dtype mxfp8 (emulated) or bf16")
    return p


def _sequence_and_pipeline_problems(plan: Plan) -> list[str]:
    """The pipeline split and schedule, and the sequence split over CP and TP."""
    p, m, lay = [], plan.model, plan.layout
    if lay.vp > 1 and lay.pp == 1:
        p.append(f"VP={lay.vp} needs pipeline parallelism (PP > 1); set vp=1 or pp>1")
    layers = pipeline_layers(m)
    stages = lay.pp * lay.vp
    if lay.pp_split and lay.pp == 1:
        p.append(f"--set pp_split: pipeline layout {lay.pp_split!r} needs PP > 1")
    elif lay.pp_split:
        try:
            layer_counts(lay.pp_split, stages, layers)
        except ValueError as err:
            p.append(f"--set pp_split: {err}")
    elif not layers_split_ok(layers, stages):
        p.append(f"{layers} layers cannot be split into PP*VP = {stages} stages "
                 f"(neither {layers} nor {layers}+2 for embedding and loss is a multiple); "
                 "give Megatron's pipeline layout, e.g. --set pp_split='Et*4|(tttt|)*14tL'")
    if lay.cp > 1 and plan.seq_len % (2 * lay.cp):
        p.append(f"seq_len {plan.seq_len} is not divisible by 2*CP = {2 * lay.cp}")
    if plan.seq_len % (lay.cp * lay.tp):
        p.append(f"seq_len {plan.seq_len} is not divisible by CP*TP = {lay.cp}*{lay.tp} "
                 "(sequence parallel splits each context shard over TP)")
    if lay.pp > 1 and plan.gbs % (plan.mbs * lay.dp) == 0:
        p.extend(pipeline_schedule_problems(plan.ga, lay.pp, lay.vp))
    return p


def _dtype_problems(plan: Plan, gpu: hardware.GPU | None) -> list[str]:
    p = []
    # A CPU runs FP8 as an emulation (torch._scaled_mm in software): the numerics of the
    # GPU path, checked in tests, with no performance meaning (no MFU).
    if plan.dtype == "fp8" and gpu is not None and gpu.peak("fp8") is None:
        p.append(f"{gpu.name} has no FP8 tensor cores; use --dtype bf16")
    if plan.dtype == "mxfp8" and gpu is not None and gpu.peak("mxfp8") is None:
        p.append(f"{gpu.name} has no MXFP8 (block-scaled FP8) tensor cores, only Blackwell "
                 "GPUs do (B200, B300, GB200, GB300); use --dtype "
                 + ("fp8" if gpu.peak("fp8") else "bf16"))
    if plan.master_weights == "bf16" and (plan.dtype == "fp32" or plan.adam_moments != "bf16"):
        p.append("master_weights=bf16 keeps the bf16 parameters as the only copy, with "
                 "AdamW's moments in bf16 too (Apex's bf16-state Adam); it needs a bf16 or "
                 "FP8 run and adam_moments=bf16: add --set adam_moments=bf16, or drop it")
    if plan.fp8_recipe not in FP8_RECIPES:
        p.append(f"fp8_recipe {plan.fp8_recipe!r} is not one of {', '.join(FP8_RECIPES)}")
    elif plan.fp8_recipe != FP8_RECIPES[0] and plan.dtype != "fp8":
        p.append(f"--set fp8_recipe={plan.fp8_recipe} applies only to --dtype fp8 "
                 f"(this run is {plan.dtype}); add --dtype fp8 or drop it")
    return p


def _feature_problems(plan: Plan) -> list[str]:
    """Profiling, the NCCL trace and checkpoints against the run's steps and device."""
    p = []
    f = plan.features
    if f.profile and not (0 <= f.profile_start <= f.profile_stop):
        p.append(f"profile steps {f.profile_start}-{f.profile_stop} must satisfy 0 <= start <= stop")
    if f.profile and f.nccl_trace:
        p.append("profiling and the NCCL trace are mutually exclusive (as in the seeds); pick one")
    if f.profile == "nsys" and plan.device == "cpu":
        p.append("--profile nsys needs a GPU (Nsight Systems traces CUDA); use --profile torch "
                 "on a CPU")
    if f.profile and not f.load_checkpoint and f.profile_stop >= plan.steps:
        p.append(f"profile steps {f.profile_start}-{f.profile_stop} are not all in the run "
                 f"(iterations 0-{plan.steps - 1}); use --steps {f.profile_stop + 1} or more, "
                 "or other --profile-steps")
    return p


def validate(plan: Plan, scale: int, gpu: hardware.GPU | None) -> list[str]:
    """Every problem with a plan, one line each (empty when the plan is valid)."""
    p, lay = [], plan.layout
    for key in ("tp", "pp", "cp", "ep", "dp", "vp"):
        if getattr(lay, key) < 1:
            p.append(f"{key}={getattr(lay, key)} must be at least 1")
    for key in ("mbs", "gbs", "seq_len", "steps", "gpus_per_node"):
        if getattr(plan, key) < 1:
            p.append(f"{key}={getattr(plan, key)} must be at least 1")
    if p:
        return p
    p.extend(_size_problems(plan))
    if p:  # nothing below is checked (or modelled) at these sizes
        return p
    if lay.world_size != scale:
        p.append(f"TP*PP*CP*DP = {lay.tp}*{lay.pp}*{lay.cp}*{lay.dp} = {lay.world_size} "
                 f"but the scale is {scale} ranks; fix --scale or the layout in --set")
    if plan.gbs % (plan.mbs * lay.dp):
        p.append(f"GBS {plan.gbs} is not divisible by MBS*DP = {plan.mbs}*{lay.dp}; "
                 f"use a multiple of {plan.mbs * lay.dp}")
    if lay.dp_shard and lay.dp % lay.dp_shard:
        p.append(f"dp_shard {lay.dp_shard} does not divide DP {lay.dp}")
    p.extend(_model_problems(plan))
    p.extend(_sequence_and_pipeline_problems(plan))
    p.extend(_dtype_problems(plan, gpu))
    p.extend(overlap_problems(plan))
    if lay.world_size > plan.gpus_per_node and lay.world_size % plan.gpus_per_node:
        p.append(f"{lay.world_size} ranks do not fill whole nodes of {plan.gpus_per_node}")
    p.extend(_feature_problems(plan))
    if plan.peak_tflops is not None and not (math.isfinite(plan.peak_tflops)
                                             and plan.peak_tflops > 0):
        p.append(f"peak TFLOPS {plan.peak_tflops} must be a positive number")
    return p


def load_plan(path: str | Path) -> Plan:
    """The plan in a plan.json; PlanError (one line) when it is missing, unreadable,
    not JSON, incomplete or invalid: the engine must not start on half a plan."""
    path = Path(path)
    fix = "plan.json files are written by `trainbench run`"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except IsADirectoryError:
        raise PlanError([f"plan {path} is a directory; give EXPERIMENT_DIR/plan.json"]) from None
    except OSError as err:
        raise PlanError([f"cannot read plan {path}: {err.strerror}"]) from None
    except ValueError as err:  # not UTF-8, or not JSON (a partial write)
        raise PlanError([f"plan {path} is not valid JSON ({str(err).splitlines()[0]}); "
                         + fix]) from None
    try:
        plan = Plan.from_dict(data)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise PlanError([f"plan {path} is incomplete or not a trainbench plan "
                         f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); "
                         + fix]) from None
    problems = validate(plan, plan.gpus, hardware.GPUS.get(plan.gpu_type))
    if problems:
        raise PlanError([f"plan {path}: {problems[0]}"])
    return plan
