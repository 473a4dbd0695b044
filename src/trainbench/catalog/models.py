"""Model architectures of the seed workloads (../shared/reference/architectures.md).

Pure data: no torch. The engine builds real modules from a `ModelSpec`; flops.py,
predict/ and `trainbench show` read the same spec, so every number trainbench prints
about a model comes from one place.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from .hybrid import cut_pattern, pattern_problem


@dataclass(frozen=True)
class ModelSpec:
    """Shape of one model. Fields a family does not use keep their defaults."""

    family: str
    """'llama', 'nemotron4', 'nemotronh', 'qwen3_moe' or 'deepseek_v3': selects the module
    code in engine/models."""
    name: str
    """Human name, e.g. 'Llama 3.1 70B'."""
    vocab_size: int
    hidden: int
    ffn: int
    """MLP intermediate size."""
    layers: int
    """Transformer blocks (for hybrids: characters of `pattern`)."""
    heads: int
    kv_heads: int
    """Query groups of grouped-query attention."""
    head_dim: int
    seq_len: int
    """Sequence length the benchmarks use."""
    mlp: str = "swiglu"
    """'swiglu' (gate, up, down) or 'squared_relu' (up, down, no gate)."""
    norm: str = "rmsnorm"
    """'rmsnorm' or 'layernorm1p' (LN(x)*(1+g)+b)."""
    norm_eps: float = 1e-5
    rope_base: float = 10000.0
    rotary_fraction: float = 1.0
    """Share of each head's dimensions that RoPE rotates (Nemotron-4: 0.5)."""
    rope_scaling: str | None = None
    """'llama3' for Llama 3.1's frequency scaling, else None."""
    position_embedding: str = "rope"
    """'rope' or 'none' (Nemotron-H attention has no position embedding)."""
    # Hybrid (Nemotron-H) fields.
    pattern: str = ""
    """Layer pattern: 'M' Mamba-2, '*' attention, '-' MLP; empty for plain transformers."""
    mamba_heads: int = 0
    mamba_head_dim: int = 0
    mamba_state: int = 0
    mamba_groups: int = 0
    mamba_conv_kernel: int = 4
    mamba_chunk: int = 128
    mamba_expand: int = 2
    # Mixture-of-experts fields (Qwen3 MoE, DeepSeek-V3); 0 experts = a dense model.
    n_routed_experts: int = 0
    n_shared_experts: int = 0
    """Experts every token passes through, one SwiGLU of width moe_ffn * n_shared_experts."""
    top_k: int = 0
    """Routed experts per token."""
    moe_ffn: int = 0
    """Intermediate size of each expert."""
    first_dense_layers: int = 0
    """Leading layers with a dense MLP of width `ffn` instead of experts (DeepSeek-V3: 3)."""
    router: str = "softmax"
    """'softmax' (softmax, then top-k) or 'sigmoid' (DeepSeek-V3: sigmoid, bias-aided top-k)."""
    norm_topk_prob: bool = False
    """Renormalise the k chosen gate weights to sum to 1."""
    n_group: int = 1
    topk_group: int = 1
    """Group-limited routing: experts split in n_group groups, only topk_group groups eligible."""
    routed_scaling: float = 1.0
    """Multiplier of the routed experts' gate weights (routed_scaling_factor)."""
    aux_loss: str = "none"
    """Balance loss: 'none', 'switch' (E * sum f_i P_i over the batch) or 'sequence' (V3)."""
    aux_loss_coef: float = 0.0
    bias_update_speed: float = 0.0
    """gamma of DeepSeek-V3's auxiliary-loss-free bias update; 0 = no bias."""
    qk_norm: bool = False
    """RMSNorm over each head of q and k before RoPE (Qwen3)."""
    # Multi-head latent attention (DeepSeek-V3); kv_lora_rank 0 = not MLA.
    q_lora_rank: int = 0
    """Rank of the query's low-rank compression; 0 = a full query projection."""
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0

    @property
    def is_hybrid(self) -> bool:
        return bool(self.pattern)

    @property
    def is_moe(self) -> bool:
        return self.n_routed_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def mamba_d_inner(self) -> int:
        return self.mamba_heads * self.mamba_head_dim

    def layer_counts(self) -> dict[str, int]:
        """How many layers of each kind: {'attention', 'mlp', 'mamba', 'block'}."""
        if self.is_hybrid:
            return {
                "mamba": self.pattern.count("M"),
                "attention": self.pattern.count("*"),
                "mlp": self.pattern.count("-"),
                "block": 0,
            }
        if self.is_moe:
            # Every block holds one attention; the first `first_dense_layers` a dense MLP,
            # the others a mixture of experts.
            dense = self.first_dense_layers
            return {"mamba": 0, "attention": self.layers, "mlp": dense,
                    "moe": self.layers - dense, "block": self.layers}
        # A plain transformer block holds one attention and one MLP.
        return {"mamba": 0, "attention": self.layers, "mlp": self.layers, "block": self.layers}

    def with_layers(self, layers: int) -> "ModelSpec":
        """The same width with fewer (or more) layers: the seed's 405B proxies. A hybrid
        keeps `layers` of its pattern's layers in the pattern's mix of kinds
        (hybrid.cut_pattern); ValueError beyond the pattern's length."""
        if self.is_hybrid:
            return self.with_pattern(cut_pattern(self.pattern, layers))
        return replace(self, layers=layers)

    def with_experts(self, experts: int) -> "ModelSpec":
        """The same model with `experts` routed experts of the same width, each token still
        routed to top_k of them: the FLOPs per token stay, the parameters shrink (a
        one-GPU proxy of a model whose experts do not fit). Group-limited routing keeps
        its groups where they still split the experts evenly and leave top_k of them
        eligible, else it is off (n_group = topk_group = 1). ValueError for a dense model
        or fewer experts than top_k."""
        if not self.is_moe:
            raise ValueError(f"{self.name} has no experts; only MoE models (Qwen3 MoE, "
                             "DeepSeek-V3) have experts to set")
        if experts < self.top_k:
            raise ValueError(f"{self.name} routes each token to top_k = {self.top_k} experts; "
                             f"it needs at least {self.top_k}")
        n_group, topk_group = self.n_group, self.topk_group
        if experts % n_group or experts // n_group * topk_group < self.top_k:
            n_group = topk_group = 1
        return replace(self, n_routed_experts=experts, n_group=n_group, topk_group=topk_group)

    def with_pattern(self, pattern: str) -> "ModelSpec":
        """The same width with another layer pattern (hybrids only); ValueError for a
        character that is no layer kind."""
        if not self.is_hybrid:
            raise ValueError(f"{self.name} has no layer pattern; only hybrid models have one")
        problem = pattern_problem(pattern)
        if problem:
            raise ValueError(problem)
        return replace(self, pattern=pattern, layers=len(pattern))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "ModelSpec":
        return cls(**data)


def parameter_count(spec: ModelSpec) -> int:
    """Exact parameter count of trainbench's own module definitions.

    Checked against the real modules counted on the meta device (tests/test_models.py),
    so `trainbench show` can print it without importing torch.
    """
    h = spec.hidden
    norm_params = h if spec.norm == "rmsnorm" else 2 * h  # layernorm1p carries a bias
    embed = spec.vocab_size * h
    head = spec.vocab_size * h
    q_out = spec.heads * spec.head_dim
    kv_out = spec.kv_heads * spec.head_dim
    attention = h * q_out + 2 * h * kv_out + q_out * h
    mlp = (3 if spec.mlp == "swiglu" else 2) * h * spec.ffn
    if spec.is_moe:
        return _moe_parameter_count(spec, active=False)
    if not spec.is_hybrid:
        block = 2 * norm_params + attention + mlp
        return embed + head + spec.layers * block + norm_params
    d_inner = spec.mamba_d_inner
    gn = spec.mamba_groups * spec.mamba_state
    conv_dim = d_inner + 2 * gn
    mamba = (
        h * (2 * d_inner + 2 * gn + spec.mamba_heads)  # in_proj
        + conv_dim * spec.mamba_conv_kernel + conv_dim  # depthwise conv weight + bias
        + 3 * spec.mamba_heads  # dt_bias, A_log, D
        + d_inner  # gated RMSNorm weight
        + d_inner * h  # out_proj
    )
    counts = spec.layer_counts()
    total = embed + head + norm_params
    total += counts["mamba"] * (norm_params + mamba)
    total += counts["attention"] * (norm_params + attention)
    total += counts["mlp"] * (norm_params + mlp)
    return total


def attention_parameters(spec: ModelSpec) -> int:
    """One attention layer of a MoE family: Qwen3's GQA with QK-norm or DeepSeek-V3's MLA."""
    h, n = spec.hidden, spec.heads
    if spec.is_mla:
        qk = spec.qk_nope_head_dim + spec.qk_rope_head_dim
        q = (h * spec.q_lora_rank + spec.q_lora_rank + spec.q_lora_rank * n * qk
             if spec.q_lora_rank else h * n * qk)  # down, its RMSNorm, up; or one projection
        kv = (h * (spec.kv_lora_rank + spec.qk_rope_head_dim)  # latent + shared RoPE key
              + spec.kv_lora_rank  # latent RMSNorm
              + spec.kv_lora_rank * n * (spec.qk_nope_head_dim + spec.v_head_dim))
        return q + kv + n * spec.v_head_dim * h
    q_out, kv_out = n * spec.head_dim, spec.kv_heads * spec.head_dim
    gqa = h * q_out + 2 * h * kv_out + q_out * h
    return gqa + (2 * spec.head_dim if spec.qk_norm else 0)


def moe_mlp_parameters(spec: ModelSpec, active: bool) -> int:
    """One MoE MLP: router, routed experts (all of them, or the top_k a token uses) and
    shared experts. DeepSeek-V3's selection bias is a buffer, not a parameter."""
    h, f = spec.hidden, spec.moe_ffn
    routed = spec.top_k if active else spec.n_routed_experts
    return h * spec.n_routed_experts + (routed + spec.n_shared_experts) * 3 * h * f


def _moe_parameter_count(spec: ModelSpec, active: bool) -> int:
    h = spec.hidden
    dense = spec.first_dense_layers
    per_layer = 2 * h + attention_parameters(spec)  # two RMSNorms + attention
    total = 2 * spec.vocab_size * h + h  # untied embedding and head, final norm
    total += dense * (per_layer + 3 * h * spec.ffn)
    total += (spec.layers - dense) * (per_layer + moe_mlp_parameters(spec, active))
    return total


def active_parameter_count(spec: ModelSpec) -> int:
    """Parameters one token uses (embedding row and head included): the top_k routed
    experts plus the shared ones in each MoE layer, everything else in full. Equal to
    `parameter_count` for a dense model."""
    if not spec.is_moe:
        return parameter_count(spec)
    return _moe_parameter_count(spec, active=True)


_LLAMA31 = dict(
    family="llama", vocab_size=128256, kv_heads=8, head_dim=128, seq_len=8192,
    rope_base=500000.0, rope_scaling="llama3",
)
_NEMOTRON4 = dict(
    family="nemotron4", vocab_size=256000, kv_heads=8, seq_len=4096, mlp="squared_relu",
    norm="layernorm1p", rotary_fraction=0.5,
)

# Qwen3 MoE. Shapes: the Hugging Face config.json of Qwen/Qwen3-30B-A3B and
# Qwen/Qwen3-235B-A22B (transformers' Qwen3MoeConfig documents the 30B-A3B one: vocab
# 151936, hidden 2048, 32 heads, 4 KV heads, moe_intermediate_size 768, 128 experts, top 8,
# router_aux_loss_coef 0.001), cross-checked with Ascend MindSpeed-RL's
# configs/model/qwen3_30b_a3b.yaml and qwen3_235b_a22b.yaml (48/94 layers, hidden
# 2048/4096, 32/64 heads, 4 query groups, kv_channels 128, moe_ffn_hidden_size 768/1536,
# qk_layernorm, norm_topk_prob true, rotary base 1e6, RMSNorm eps 1e-6, untied
# embeddings) and MaxText's configs/models/qwen3-235b-a22b.yml. Every layer is MoE
# (decoder_sparse_step 1, mlp_only_layers []); no shared expert. `ffn` is the config's
# intermediate_size, which no layer uses. Published counts (Qwen3 model cards / technical
# report): 30.5B total, 3.3B activated; 235B total, 22B activated.
# Sequence length 4096: the Qwen3 technical report's pre-training stages 1-2.
_QWEN3_MOE = dict(
    family="qwen3_moe", vocab_size=151936, kv_heads=4, head_dim=128, seq_len=4096,
    norm_eps=1e-6, rope_base=1000000.0, n_routed_experts=128, top_k=8, router="softmax",
    norm_topk_prob=True, aux_loss="switch", aux_loss_coef=0.001, qk_norm=True,
)
# DeepSeek-V3 (DeepSeek-AI, "DeepSeek-V3 Technical Report", arXiv 2412.19437, sec. 2 and
# 4.2; Hugging Face deepseek-ai/DeepSeek-V3 config.json, the defaults of transformers'
# DeepseekV3Config): 61 layers, hidden 7168, 128 heads, q_lora_rank 1536, kv_lora_rank
# 512, qk_nope/qk_rope/v head dims 128/64/128, first_k_dense_replace 3 (dense ffn 18432),
# 256 routed + 1 shared expert of 2048, top 8 of 8 groups limited to 4, sigmoid scores,
# norm_topk_prob, routed_scaling_factor 2.5, vocab 129280, rope theta 10000, RMSNorm eps
# 1e-6. Balance: auxiliary-loss-free bias with gamma 0.001 and the sequence-wise loss
# with alpha 0.0001 (report sec. 4.2); pre-training sequence length 4K. Published
# counts: 671B total, 37B activated (report abstract); the repository's
# README_WEIGHTS.md gives 671B for the main model and 36.6B activated "including 0.9B
# for the output Head" (so without the input embedding), the multi-token-prediction
# module adding 11.5B unique parameters (685B on the Hub with it). trainbench leaves MTP
# out (num_nextn_predict_layers 0); its 671B is the main model. YaRN (the 128K context
# extension after pre-training) is left out too.
_DEEPSEEK_V3 = dict(
    family="deepseek_v3", norm_eps=1e-6, rope_base=10000.0, router="sigmoid",
    norm_topk_prob=True, aux_loss="sequence", aux_loss_coef=0.0001, bias_update_speed=0.001,
    n_shared_experts=1,
)

NEMOTRONH_56B_PATTERN = "M-M-M-M*-" + "M-M-M-M-M*-" * 9 + "M-M-M-M-M-"

# Models keyed by (workload, size). `tiny` sizes train on one CPU core in seconds and
# keep every architectural feature of their family (GQA, RoPE scaling, LayerNorm1p, ...).
MODELS: dict[tuple[str, str], ModelSpec] = {
    ("pretrain_llama3.1", "8b"): ModelSpec(
        name="Llama 3.1 8B", hidden=4096, ffn=14336, layers=32, heads=32, **_LLAMA31),
    ("pretrain_llama3.1", "70b"): ModelSpec(
        name="Llama 3.1 70B", hidden=8192, ffn=28672, layers=80, heads=64, **_LLAMA31),
    ("pretrain_llama3.1", "405b"): ModelSpec(
        name="Llama 3.1 405B", hidden=16384, ffn=53248, layers=126, heads=128, **_LLAMA31),
    # The proxy's depth depends on the scale (8, 30 or 62 layers): the recipe row sets it.
    ("pretrain_llama3.1", "405b-proxy"): ModelSpec(
        name="Llama 3.1 405B proxy", hidden=16384, ffn=53248, layers=126, heads=128, **_LLAMA31),
    ("pretrain_llama3.1", "tiny"): ModelSpec(
        name="Llama 3.1 tiny", family="llama", vocab_size=512, hidden=64, ffn=192, layers=4,
        heads=4, kv_heads=2, head_dim=16, seq_len=128, rope_base=500000.0, rope_scaling="llama3"),
    ("pretrain_llama2", "70b"): ModelSpec(
        name="Llama 2 70B", family="llama", vocab_size=32000, hidden=8192, ffn=28672, layers=80,
        heads=64, kv_heads=8, head_dim=128, seq_len=4096),
    ("pretrain_llama2", "tiny"): ModelSpec(
        name="Llama 2 tiny", family="llama", vocab_size=512, hidden=64, ffn=192, layers=4,
        heads=4, kv_heads=2, head_dim=16, seq_len=128),
    ("pretrain_nemotron4", "15b"): ModelSpec(
        name="Nemotron-4 15B", hidden=6144, ffn=24576, layers=32, heads=48, head_dim=128,
        **_NEMOTRON4),
    ("pretrain_nemotron4", "340b"): ModelSpec(
        name="Nemotron-4 340B", hidden=18432, ffn=73728, layers=96, heads=96, head_dim=192,
        **_NEMOTRON4),
    ("pretrain_nemotron4", "tiny"): ModelSpec(
        name="Nemotron-4 tiny", family="nemotron4", vocab_size=512, hidden=64, ffn=256, layers=4,
        heads=4, kv_heads=2, head_dim=16, seq_len=128, mlp="squared_relu", norm="layernorm1p",
        rotary_fraction=0.5),
    ("pretrain_nemotronh", "56b"): ModelSpec(
        name="Nemotron-H 56B", family="nemotronh", vocab_size=131072, hidden=8192, ffn=32768,
        layers=len(NEMOTRONH_56B_PATTERN), heads=64, kv_heads=8, head_dim=128, seq_len=8192,
        mlp="squared_relu", position_embedding="none", pattern=NEMOTRONH_56B_PATTERN,
        mamba_heads=256, mamba_head_dim=64, mamba_state=256, mamba_groups=8, mamba_chunk=128),
    ("pretrain_nemotronh", "tiny"): ModelSpec(
        name="Nemotron-H tiny", family="nemotronh", vocab_size=512, hidden=64, ffn=256,
        layers=6, heads=4, kv_heads=2, head_dim=16, seq_len=128, mlp="squared_relu",
        position_embedding="none", pattern="M-*-M-", mamba_heads=8, mamba_head_dim=16,
        mamba_state=16, mamba_groups=2, mamba_chunk=32),
    ("pretrain_qwen3", "30b_a3b"): ModelSpec(
        name="Qwen3 30B-A3B", hidden=2048, ffn=6144, layers=48, heads=32, moe_ffn=768,
        **_QWEN3_MOE),
    ("pretrain_qwen3", "235b_a22b"): ModelSpec(
        name="Qwen3 235B-A22B", hidden=4096, ffn=12288, layers=94, heads=64, moe_ffn=1536,
        **_QWEN3_MOE),
    ("pretrain_qwen3", "tiny"): ModelSpec(
        name="Qwen3 MoE tiny", family="qwen3_moe", vocab_size=512, hidden=64, ffn=192, layers=4,
        heads=4, kv_heads=2, head_dim=16, seq_len=128, norm_eps=1e-6, rope_base=1000000.0,
        n_routed_experts=8, top_k=2, moe_ffn=32, router="softmax", norm_topk_prob=True,
        aux_loss="switch", aux_loss_coef=0.001, qk_norm=True),
    # heads x head_dim is the query/key width, (qk_nope + qk_rope) per head; kv_heads =
    # heads because every head has its own key and value (from the shared latent).
    ("pretrain_deepseek_v3", "671b"): ModelSpec(
        name="DeepSeek-V3 671B", vocab_size=129280, hidden=7168, ffn=18432, layers=61,
        heads=128, kv_heads=128, head_dim=192, seq_len=4096, n_routed_experts=256, top_k=8,
        moe_ffn=2048, first_dense_layers=3, n_group=8, topk_group=4, routed_scaling=2.5,
        q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
        v_head_dim=128, **_DEEPSEEK_V3),
    ("pretrain_deepseek_v3", "tiny"): ModelSpec(
        name="DeepSeek-V3 tiny", vocab_size=512, hidden=64, ffn=192, layers=4, heads=4,
        kv_heads=4, head_dim=24, seq_len=128, n_routed_experts=8, top_k=2, moe_ffn=32,
        first_dense_layers=1, n_group=4, topk_group=2, routed_scaling=2.5, q_lora_rank=32,
        kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
        **_DEEPSEEK_V3),
}


WORKLOADS: dict[str, str] = {
    "pretrain_llama3.1": "Llama 3.1 pretraining (NeMo 2 recipe): 8B, 70B, 405B and its proxies",
    "pretrain_llama2": "Llama 2 70B pretraining (MaxText recipe: FSDP, MBS 2, seq 4096)",
    "pretrain_nemotron4": "Nemotron-4 pretraining (NeMo recipe): 15B, 340B",
    "pretrain_nemotronh": "Nemotron-H hybrid Mamba-2 pretraining (NeMo recipe): 56B, FP8",
    "pretrain_qwen3": "Qwen3 MoE pretraining: 30B-A3B, 235B-A22B (models only: no recipe, no EP)",
    "pretrain_deepseek_v3": "DeepSeek-V3 MoE + MLA pretraining: 671B (models only: no recipe, no EP)",
}


def sizes(workload: str) -> list[str]:
    return [size for (w, size) in MODELS if w == workload]


def get_model(workload: str, size: str) -> ModelSpec:
    """The spec for a workload and size; a LookupError names what exists."""
    if workload not in WORKLOADS:
        raise LookupError(
            f"unknown workload {workload!r}; known workloads: {', '.join(WORKLOADS)}")
    key = (workload, size.lower())
    if key not in MODELS:
        raise LookupError(
            f"unknown size {size!r} for {workload}; known sizes: {', '.join(sizes(workload))}")
    return MODELS[key]
