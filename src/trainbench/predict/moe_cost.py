"""MoE costs beyond the expert GEMMs' FLOPs, counted from what the dispatchers run. Pure
Python.

- Grouped GEMM rows: each expert's rows form one GEMM of the group, whose efficiency is
  the dense GEMM fall-off at that row count (perf.gemm_efficiency reads Linear.group_m).
  FP8 grouped GEMMs need every group's rows a multiple of 16: Megatron-LM pads them
  (megatron/core/transformer/moe/experts.py, TEGroupedMLP's `Fp8Padding` under
  `config.fp8`), and so does the engine before torchao's grouped GEMM
  (engine/parallel/float8.py, wrap_experts). The padded rows are computed like any
  other. MXFP8's groups align to 32 rows; a plan's Shape does not tell MXFP8 from FP8,
  so both are charged the 16.
- The router: a bf16 GEMM (work.py's `router` linear), then softmax (or sigmoid) and
  top-k over fp32 logits per token, forward and backward (ROUTER_BYTES_PER_LOGIT).
- Permutation (megatron/core/transformer/moe/token_dispatcher.py). The alltoall
  dispatcher permutes the routed copies of each token into expert order before the
  all-to-all (`permute`: read and write a row per copy), sorts the received chunks by
  local expert when the rank holds several (`sort_chunks_by_idxs`: read and write),
  undoes both after the experts, and `unpermute` weighs each copy by its routing
  probability and sums the copies back into the token (read a row per copy, write one
  per token). The flex dispatcher that NVIDIA's MoE recipes run (DeepEP, HybridEP;
  predict/context.py, ep_dispatch) fuses the first permutation into the dispatch
  kernel and writes received tokens in rank order: `dispatch_postprocess` permutes them
  by expert once and `combine_preprocess` unpermutes, with no chunk sort. The backward
  moves the same bytes. The engine's expert parallelism is charged as the alltoall
  dispatcher.
"""

from __future__ import annotations

import math

FP8_GROUP_ROWS = 16
"""Rows each expert's FP8 GEMM group is padded to a multiple of."""

ROUTER_BYTES_PER_LOGIT = 28.0
"""fp32 router traffic per token and expert, forward + backward: the logits cast from
the GEMM's bf16 output (read 2, write 4), softmax (read 4, write 4), top-k (read 4); the
backward reads the probabilities and their gradient and writes the logits' gradient
(12). Load-balancing losses add passes over the same logits, not counted."""


def padded_rows(rows_per_expert: float, fp8: bool) -> int:
    """Rows of one expert's GEMM as it runs: rounded up to FP8_GROUP_ROWS in FP8."""
    if not fp8:
        return max(1, round(rows_per_expert))
    return FP8_GROUP_ROWS * max(1, math.ceil(rows_per_expert / FP8_GROUP_ROWS))


def router_bytes(tokens: float, experts: int) -> float:
    """Router softmax/top-k traffic of `tokens` tokens over `experts` experts."""
    return ROUTER_BYTES_PER_LOGIT * tokens * experts


def permutation_bytes(tokens: float, rows: float, hidden: int, b: int,
                      local_experts: int, ep: int, *, fused_dispatch: bool = False) -> float:
    """Bytes of permuting `rows` routed copies of `tokens` tokens (hidden wide, b bytes per
    element) to their experts and back, forward + backward: permute and unpermute's rows
    (read and write each copy, then read each copy and write each token), and, for the
    alltoall dispatcher, the sort by local expert and its undoing when expert parallelism
    hands a rank several experts' chunks."""
    per_pass = 2 * rows + (rows + tokens)  # permute; unpermute
    if ep > 1 and local_experts > 1 and not fused_dispatch:
        per_pass += 2 * 2 * rows  # sort_chunks_by_idxs, then its inverse
    return 2 * per_pass * hidden * b
