"""Which scaled-dot-product-attention kernel the engine runs, chosen explicitly on CUDA.

PyTorch's default order on CUDA tries flash, then memory-efficient, then cuDNN. On
H100/H200/B200 cuDNN's fused attention is the fastest causal kernel for bf16 at head dim
128 (it is what NeMo/Transformer Engine run), so the engine asks for cuDNN first, then
flash; memory-efficient and math stay last so an fp32 GPU run (which neither fused kernel
takes) still runs. On a CPU torch's own choice stays (its CPU flash kernel).

The order is set for the whole process, not around the forward: activation checkpointing
recomputes each block inside the backward, outside any forward-time context, and the
recomputed attention must pick the same kernel as the forward (its saved tensors differ
between kernels, and the checkpoint checks them).

Context-parallel chunks attend under a lower-right causal mask (`causal_lower_right`,
parallel/cp.py); torch dispatches that bias to the memory-efficient kernel (or flash)
itself, without a materialised mask, so it is recorded as such.
"""

from __future__ import annotations

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

CUDA_ORDER = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION,
              SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
NAMES = {SDPBackend.CUDNN_ATTENTION: "cuDNN", SDPBackend.FLASH_ATTENTION: "flash",
         SDPBackend.EFFICIENT_ATTENTION: "memory-efficient", SDPBackend.MATH: "math"}

_held = []  # the entered sdpa_kernel context, kept for the life of the process


def use_engine_order(device_type: str) -> None:
    """On CUDA, make CUDA_ORDER the SDPA priority for the rest of the process."""
    if device_type != "cuda" or _held:
        return
    ctx = sdpa_kernel(CUDA_ORDER, set_priority=True)
    ctx.__enter__()
    _held.append(ctx)


def chosen_backend(device: torch.device, dtype: torch.dtype, heads: int, kv_heads: int,
                   head_dim: int, seq_len: int, cp: int = 1) -> str:
    """The kernel torch picks for this rank's causal attention, as run.json records it,
    e.g. 'cuDNN (CUDA, causal)' or 'flash (CPU, causal)'.

    Asked of torch's own dispatcher with tensors of the run's per-rank head counts, head
    dimension and dtype (a short sequence: the choice depends on the shapes' kinds, not
    on the length), after use_engine_order.
    """
    where = "CUDA" if device.type == "cuda" else device.type.upper()
    if cp > 1:
        return (f"lower-right causal bias per context-parallel chunk ({where}): "
                "torch dispatches it to memory-efficient or flash, else math")
    seq = min(seq_len, 256)
    q = torch.zeros(1, heads, seq, head_dim, dtype=dtype, device=device)
    kv = torch.zeros(1, kv_heads, seq, head_dim, dtype=dtype, device=device)
    try:
        # Private but stable since 2.0: the same selection F.scaled_dot_product_attention
        # makes (the public API offers none).
        choice = SDPBackend(torch._fused_sdp_choice(q, kv, kv, is_causal=True,
                                                    enable_gqa=heads != kv_heads))
    except Exception as exc:  # noqa: BLE001 - the record must never stop a run
        return f"unknown ({type(exc).__name__})"
    return f"{NAMES.get(choice, choice.name.lower())} ({where}, causal)"
