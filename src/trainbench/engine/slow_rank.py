"""The straggler test hook's setting, TRAINBENCH_SLOW_RANK=RANK:SECONDS (engine/straggler.py
install_slow_hook), read without torch: `trainbench run` checks it before anything starts,
and a bad value is one line of bad input, not a torch import later."""

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
