"""FP8 quantisation traffic, counted from the casts each framework runs. Pure Python.

An FP8 linear multiplies FP8 copies of its operands: every high-precision tensor that
enters one of its three GEMMs (forward, input gradient, weight gradient) is read, its
scale found (an amax reduction) and an FP8 copy written, once in the layout each GEMM
needs. What that costs depends on who does it; the bytes below, at the memory-bound rate
(perf.layer_time), are the cost: nothing here is fitted.

torchao's float8 training (the engine; torchao 0.18, float8/float8_linear.py,
`matmul_with_hp_or_float8_args`): the forward casts the input (GemmInputRole.INPUT) and
the weight; the backward casts the output gradient twice (dim 0 for the input gradient,
dim 1, a column-major copy, for the weight gradient), the weight again (for the input
gradient) and the saved bf16 input again (dim 1, for the weight gradient). With
`tensorwise` scaling every cast of one tensor shares its one scale, so inside a compiled
block (AOTAutograd's joint graph) one amax pass serves all its casts: per element
b (amax) + (b + 1) per cast, b bytes per high-precision element. With `rowwise` scaling
the dim-0 and dim-1 casts reduce along different axes: an amax pass per cast.
FSDP2's float8 all-gather (torchao float8/fsdp_utils.py,
WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather) casts the weight shard with the
scale `precompute_float8_dynamic_scale_for_fsdp` found after the optimizer step (one amax
pass a step) and gathers FP8: the linear then receives an FP8 weight and casts none.

Transformer Engine under Megatron-LM (the published recipes):
- LayerNormLinear (QKV, the MLP's first linear, Mamba's in_proj) hands its input
  quantizer to the norm (transformer_engine/pytorch/module/layernorm_linear.py,
  `with_quantized_norm`), which fuses the cast under delayed scaling only
  (te_norm_fused_bytes);
- every other FP8 input and every output gradient goes through one cast-transpose kernel
  (transformer_engine/common/transpose/cast_transpose): read b, write the FP8 copy and its
  transpose (2 B). Delayed scaling takes the scale from the amax history, recorded by the
  same kernel; current scaling needs an amax pass first (b more). MXFP8 (Blackwell)
  scales blocks of 32 inside the kernel: 2 x (1 + 1/32) B written;
- weights are cast (with their transpose) on a step's first microbatch and reused by the
  others (Megatron-LM megatron/core/extensions/transformer_engine.py, TELinear.forward
  passes `is_first_microbatch`; TE keeps the FP8 weight cache).
"""

from __future__ import annotations

from dataclasses import dataclass

TORCHAO = "torchao"
TE = "te"

NORM_FUSED = frozenset({"qkv", "up", "in_proj"})
"""Linears Megatron-LM builds as TE LayerNormLinear: the norm before them writes FP8."""

MX_BLOCK = 32
"""Elements sharing one MXFP8 scale (one E8M0 byte)."""

EAGER_FLOAT8_CAST_BYTES = 27.0
"""Bytes per element of torchao's cast of a bf16 weight shard before FSDP2's float8
all-gather. It runs in FSDP's pre-forward hook, outside the compiled blocks, so eager:
torchao 0.18 float8_training_tensor._ToFloat8ConstrFunc.forward writes
`tensor.to(torch.float32) * scale` (read 2, write 4; read 4, write 4), then
float8_utils.to_fp8_saturated clamps (read 4, write 4; torch 2.11 and older, which the
project's H100 ran) and casts (read 4, write 1)."""


@dataclass(frozen=True)
class Fp8Recipe:
    """Who casts and how it scales: framework TORCHAO or TE; scaling 'tensorwise' or
    'rowwise' (torchao), 'delayed', 'current' or 'mxfp8' (TE)."""
    framework: str
    scaling: str

    @property
    def shared_amax(self) -> bool:
        """One amax pass serves every cast of a tensor (torchao tensorwise, compiled)."""
        return self.framework == TORCHAO and self.scaling == "tensorwise"


def torchao_tensor_bytes(casts: int, b: int, recipe: Fp8Recipe) -> float:
    """Bytes per element of one bf16 tensor torchao casts `casts` times: an amax pass
    (b) per cast, or one for all under shared (tensorwise) scaling, and each cast reading
    b and writing 1; MXFP8 finds each block's scale inside the cast and writes it."""
    if recipe.scaling == "mxfp8":
        return casts * (b + 1 + 1 / MX_BLOCK)
    amax_passes = 1 if recipe.shared_amax else casts
    return amax_passes * b + casts * (b + 1)


def te_cast_transpose_bytes(scaling: str, b: int) -> float:
    """Bytes per element of one TE cast-transpose: read b, write the FP8 copy and its
    transpose (with MXFP8 their block scales); current scaling's amax pass first."""
    if scaling == "mxfp8":
        return b + 2 * (1 + 1 / MX_BLOCK)
    return b + 2 + (b if scaling == "current" else 0)


def recipe_for(dtype: str, engine: bool, fp8_recipe: str) -> Fp8Recipe:
    """The engine casts through torchao with the plan's scaling; a Megatron-LM run through
    TE, with MXFP8 for `mxfp8` and per-tensor current scaling for `fp8` (the published
    tables' FP8-CS, which trainbench's tensorwise names; catalog.heldout). The seeds'
    NeMo releases ran delayed scaling, which saves the amax pass (b per element)."""
    if engine:
        return Fp8Recipe(TORCHAO, "mxfp8" if dtype == "mxfp8" else fp8_recipe)
    return Fp8Recipe(TE, "mxfp8" if dtype == "mxfp8" else "current")


def activation_bytes(name: str, m: int, k: int, n: int, recipe: Fp8Recipe, b: int) -> float:
    """Cast traffic of one FP8 linear's input (m x k) and output gradient (m x n), one
    microbatch, forward + backward."""
    if recipe.framework == TORCHAO:
        # Input: forward cast and the backward's dim-1 cast; output gradient: dim 0 and dim 1.
        per = torchao_tensor_bytes(2, b, recipe)
        return per * m * (k + n)
    cast = te_cast_transpose_bytes(recipe.scaling, b)
    into = te_norm_fused_bytes(recipe.scaling, b) if name in NORM_FUSED else cast
    return into * m * k + cast * m * n


def te_norm_fused_bytes(scaling: str, b: int) -> float:
    """Bytes per element of a LayerNormLinear's FP8 input beyond the norm's own (a bf16
    write, counted in work.py). TE fuses the quantisation into the norm kernel for
    delayed scaling only (transformer_engine/pytorch/csrc/extensions/normalization.cpp,
    layernorm_fwd / rmsnorm_fwd: `force_unfused_kernel` is false for Float8Quantizer):
    the norm writes the FP8 copy (1 B) in place of the bf16 one (b), and a transpose
    kernel reads and writes 1 B for the weight gradient. Current scaling and MXFP8 (without
    NVTE_NORM_FWD_USE_CUDNN) write the bf16 output and quantise it after: a cast-transpose
    like any other input."""
    if scaling != "delayed":
        return te_cast_transpose_bytes(scaling, b)
    return 1 - b + 2


def weight_bytes(k: int, n: int, recipe: Fp8Recipe, b: int, *, microbatches: int,
                 fsdp_float8_gathers: int = 0, fsdp_shard: int = 1) -> float:
    """Cast traffic of one FP8 linear's weight (k x n on this GPU), per microbatch.

    torchao without the float8 all-gather: cast in the forward and again in the backward,
    every microbatch, inside the compiled block. With it (`fsdp_float8_gathers` > 0
    gathers a microbatch): each gather casts the 1/fsdp_shard shard eagerly
    (EAGER_FLOAT8_CAST_BYTES), and one amax pass over the shard a step. TE: one
    cast-transpose a step, shared by the step's microbatches."""
    elems = k * n
    if recipe.framework == TORCHAO:
        if fsdp_float8_gathers:
            per_mb = fsdp_float8_gathers * EAGER_FLOAT8_CAST_BYTES + b / microbatches
            return per_mb * elems / fsdp_shard
        return torchao_tensor_bytes(2, b, recipe) * elems
    return te_cast_transpose_bytes(recipe.scaling, b) * elems / microbatches


def fsdp_float8_gathers(ctx) -> float:
    """FP8 all-gathers of each weight per microbatch under the engine's FSDP2 (torchao
    casts before them with tensorwise scaling only; engine/parallel/float8.py): a forward
    and a backward gather, or one a step when the plan keeps weights gathered; 0 where
    the weights reach the linear in bf16."""
    plan = ctx.plan
    if not (ctx.shape.engine and plan.dtype == "fp8" and plan.fp8_recipe == "tensorwise"):
        return 0.0
    return plan.fsdp_gathers_per_step(ctx.microbatches) / ctx.microbatches


def float8_gathered_params(lw, ctx) -> float:
    """Parameters of one layer that the engine's FSDP gathers in FP8: its FP8 linears'
    weights when the float8 all-gather is on (the experts' grouped weights gather bf16)."""
    if not fsdp_float8_gathers(ctx):
        return 0.0
    return float(sum(lin.k * lin.n for lin in lw.linears if lin.fp8 and not lin.group_m))


def layer_cast_bytes(linears, ctx) -> float:
    """FP8 cast traffic of one layer's linears, one microbatch on one GPU (0 in a bf16
    plan and for the linears every recipe keeps in bf16: the head, the router)."""
    plan, sh = ctx.plan, ctx.shape
    if not sh.fp8:
        return 0.0
    recipe = recipe_for(plan.dtype, sh.engine, plan.fp8_recipe)
    gathers = fsdp_float8_gathers(ctx)
    b = sh.act_bytes
    total = 0.0
    for lin in linears:
        if not lin.fp8:
            continue
        own, own_gathers = recipe, gathers
        if lin.group_m and sh.engine:
            # The engine's experts: torchao's grouped GEMM wrapper quantises both operands
            # inside the op, rowwise (its only FP8 recipe) or MXFP8, and FSDP gathers
            # their weights in bf16 (engine/parallel/float8.py, wrap_experts).
            own = Fp8Recipe(TORCHAO, "mxfp8" if plan.dtype == "mxfp8" else "rowwise")
            own_gathers = 0.0
        total += activation_bytes(lin.name, lin.m, lin.k, lin.n, own, b)
        if own_gathers:
            # Cast eagerly before FSDP's float8 all-gather: a streaming pass over the
            # weight shard, charged with FSDP's copies (perf.fsdp_pass_bytes).
            continue
        # A grouped linear's k x n is one expert's: this GPU holds m / group_m of them.
        experts = max(1, round(lin.m / lin.group_m)) if lin.group_m else 1
        total += experts * weight_bytes(
            lin.k, lin.n, own, b, microbatches=ctx.microbatches,
            fsdp_float8_gathers=own_gathers, fsdp_shard=ctx.groups.fsdp.size)
    return total

