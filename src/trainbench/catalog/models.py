"""Model architectures of the seed workloads (../shared/reference/architectures.md).

Pure data: no torch. The engine builds real modules from a `ModelSpec`; flops.py,
predict/ and `trainbench show` read the same spec, so every number trainbench prints
about a model comes from one place.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace


@dataclass(frozen=True)
class ModelSpec:
    """Shape of one model. Fields a family does not use keep their defaults."""

    family: str
    """'llama', 'nemotron4' or 'nemotronh': selects the module code in engine/models."""
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

    @property
    def is_hybrid(self) -> bool:
        return bool(self.pattern)

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
        # A plain transformer block holds one attention and one MLP.
        return {"mamba": 0, "attention": self.layers, "mlp": self.layers, "block": self.layers}

    def with_layers(self, layers: int) -> "ModelSpec":
        """The same width with fewer (or more) layers: the seed's 405B proxies."""
        if self.is_hybrid:
            raise ValueError("a hybrid model's depth is its pattern; change the pattern instead")
        return replace(self, layers=layers)

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


_LLAMA31 = dict(
    family="llama", vocab_size=128256, kv_heads=8, head_dim=128, seq_len=8192,
    rope_base=500000.0, rope_scaling="llama3",
)
_NEMOTRON4 = dict(
    family="nemotron4", vocab_size=256000, kv_heads=8, seq_len=4096, mlp="squared_relu",
    norm="layernorm1p", rotary_fraction=0.5,
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
}


WORKLOADS: dict[str, str] = {
    "pretrain_llama3.1": "Llama 3.1 pretraining (NeMo 2 recipe): 8B, 70B, 405B and its proxies",
    "pretrain_llama2": "Llama 2 70B pretraining (MaxText recipe: FSDP, MBS 2, seq 4096)",
    "pretrain_nemotron4": "Nemotron-4 pretraining (NeMo recipe): 15B, 340B",
    "pretrain_nemotronh": "Nemotron-H hybrid Mamba-2 pretraining (NeMo recipe): 56B, FP8",
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
