"""The torch-free half of the straggler measurement (engine/straggler.py): the test hook's
setting, TRAINBENCH_SLOW_RANK=RANK:SECONDS, which `trainbench run` checks before anything
starts, and the measurement's summary in words, which `results` prints. Neither may
import torch: a bad setting is one line of bad input, and `results` reads files only."""

from __future__ import annotations

import math

SLOW_RANK_ENV = "TRAINBENCH_SLOW_RANK"


def parse_slow_rank(text: str | None) -> tuple[int, float] | None:
    """'1:0.05' -> (rank 1, 0.05 s per microbatch forward); None when unset."""
    if not text:
        return None
    try:
        rank, seconds = text.split(":")
        parsed = int(rank), float(seconds)
    except ValueError:
        raise ValueError(f"{SLOW_RANK_ENV}={text!r} is not RANK:SECONDS (e.g. 1:0.05)") from None
    if parsed[0] < 0 or not 0 <= parsed[1] < math.inf:
        raise ValueError(f"{SLOW_RANK_ENV}={text!r}: the rank and the seconds must be >= 0 "
                         "and finite (e.g. 1:0.05)")
    return parsed


def describe(summary: dict) -> str | None:
    """One line for the log and the results' note: the straggler named, or the spread."""
    slow = summary.get("slowest")
    if slow is None:
        return None
    if summary.get("flagged"):
        return (f"straggler: rank {slow['rank']} (host {slow['host']}, local rank "
                f"{slow['local_rank']}) computes {slow['median_compute_s']:.4g} s/step, "
                f"{slow['pct_above_median']:.1f}% above the median rank "
                f"({slow['group_median_compute_s']:.4g} s); a hardware cause would show in "
                f"`{summary.get('probe_command')}`")
    spread = max(g["spread_pct"] for g in summary["groups"])
    return (f"no straggler: every rank's compute time within {summary['threshold_pct']:g}% "
            f"of the median rank (slowest rank {slow['rank']} "
            f"{slow['pct_above_median']:+.1f}%, spread {spread:.1f}%)")
