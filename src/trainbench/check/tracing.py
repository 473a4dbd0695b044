"""Trace the chosen ranks of a plan: one trace per pipeline stage, in parallel processes.

Ranks of one pipeline stage differ only in their TP, CP, EP and DP coordinates. They
run the same schedule on tensors of the same shapes, so one rank of each stage is traced
and stands for the others. Where FSDP shards a dimension unevenly the last shards are
shorter, but FSDP pads every shard's storage to the same size and the tracker counts
that storage, so the forward/backward peak is the same on every rank of the stage; only
the AdamW moments, which the trace takes from each rank's build, differ (Llama 3.1 8B's
width over TP4 PP2 DP3: ranks 0 and 11 trace the same forward/backward peak and hold
335,904 B of moments apart).
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor, as_completed


def stage_representatives(infos: list[dict]) -> dict[int, int]:
    """rank -> the rank whose trace stands for it: the first built rank of its stage."""
    first: dict[int, int] = {}
    out = {}
    for info in infos:
        if info.get("error"):
            continue
        out[info["rank"]] = first.setdefault(info["pp"], info["rank"])
    return out


def _trace_in_worker(plan, rank: int) -> dict:
    # torch and check.build load in the workers and the command, not with this module,
    # which `trainbench --help` imports through check.cli.
    import torch
    torch.set_num_threads(1)  # fake tensors compute nothing; the workers share the cores
    from .build import trace_rank
    return trace_rank(plan, rank)


def default_jobs() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
               else (os.cpu_count() or 1))


def trace_ranks(plan, ranks: list[int], jobs: int, progress=None) -> dict[int, dict]:
    """Trace `ranks`, `jobs` at a time, each in a fresh process (a trace leaves DTensor
    caches and a process group behind; a fresh interpreter starts clean). One rank, or
    one job, traces here in this process."""
    from .build import trace_rank
    out: dict[int, dict] = {}

    def done(rank: int, traced: dict) -> None:
        out[rank] = traced
        if progress is not None:
            progress({"rank": rank, "error": traced.get("error"),
                      "build_s": traced.get("trace_s", 0.0), "what": "traced"})

    if jobs <= 1 or len(ranks) <= 1:
        for rank in ranks:
            done(rank, trace_rank(plan, rank))
        return out
    with ProcessPoolExecutor(max_workers=min(jobs, len(ranks)),
                             mp_context=multiprocessing.get_context("spawn"),
                             max_tasks_per_child=1) as pool:
        futures = {pool.submit(_trace_in_worker, plan, rank): rank for rank in ranks}
        for future in as_completed(futures):
            rank = futures[future]
            try:
                traced = future.result()
            except Exception as err:  # a worker that died (memory) is reported, not raised
                traced = {"rank": rank, "error": f"the tracing process failed: "
                                                 f"{type(err).__name__}: {err}"}
            done(rank, traced)
    return out


def reused_trace(traced: dict, info: dict, traced_info: dict) -> dict:
    """The trace of `traced_info`'s rank standing for `info`'s rank of the same stage:
    its forward/backward peak and receive buffers, with `info`'s own AdamW moments."""
    out = {**traced, "rank": info["rank"], "traced_rank": traced_info["rank"], "trace_s": 0.0}
    if not traced.get("error"):
        moments = info["optimizer_bytes"]
        out["optimizer_bytes"] = moments
        out["peak_bytes"] = traced["peak_bytes"] - traced["optimizer_bytes"] + moments
    return out
