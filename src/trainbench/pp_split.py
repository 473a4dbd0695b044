"""Megatron-Core's pipeline layout language (`pipeline_model_parallel_layout`), for models
whose layers do not divide over the pipeline stages (DeepSeek-V3's 61). Pure Python.

A layout lists the virtual stages in order, separated by '|': 'E' is the embedding, 't'
a transformer layer, 'm' a multi-token-prediction layer and 'L' the loss (the final norm
and output head). 'x*n' repeats a token n times and '(...)*n' a group. For example
"Et*4|(tttt|)*14tL" holds the embedding and 4 layers, then 14 stages of 4, then the last
layer with the loss: 61 layers over 16 stages.

trainbench builds no multi-token-prediction layer, so 'm' places nothing.
"""

from __future__ import annotations

import re

_GROUP = re.compile(r"\(([^()]*)\)\*(\d+)")
_TOKEN = re.compile(r"([EtmL])\*(\d+)")
TOKENS = "EtmL"


def expand(text: str) -> list[str]:
    """The tokens of each stage, repetitions written out; ValueError naming the problem."""
    flat = text.replace(" ", "")
    while match := _GROUP.search(flat):
        flat = flat[:match.start()] + match.group(1) * int(match.group(2)) + flat[match.end():]
    flat = _TOKEN.sub(lambda m: m.group(1) * int(m.group(2)), flat)
    unknown = sorted(set(flat) - set(TOKENS + "|"))
    if unknown:
        raise ValueError(f"pipeline layout {text!r}: cannot read {''.join(unknown)!r}; it is "
                         "written with E, t, m, L, '|', 'x*n' and '(...)*n'")
    return flat.split("|")


def layer_counts(text: str, stages: int, layers: int) -> list[int]:
    """Transformer layers of each virtual stage, checked against a plan of `stages`
    (PP x VP) stages and `layers` layers: the embedding opens the first stage and the
    loss closes the last, once each, and no stage is empty."""
    parts = expand(text)
    if len(parts) != stages:
        raise ValueError(f"pipeline layout {text!r} has {len(parts)} stages, the plan "
                         f"PP x VP = {stages}")
    counts = [part.count("t") for part in parts]
    if sum(counts) != layers:
        raise ValueError(f"pipeline layout {text!r} places {sum(counts)} layers, the model "
                         f"has {layers}")
    joined = "".join(parts)
    if joined.count("E") != 1 or not parts[0].startswith("E"):
        raise ValueError(f"pipeline layout {text!r}: the embedding (E) must open the first "
                         "stage, once")
    if joined.count("L") != 1 or not parts[-1].endswith("L"):
        raise ValueError(f"pipeline layout {text!r}: the loss (L) must close the last "
                         "stage, once")
    for index, part in enumerate(parts):
        if not set(part) & set("EtL"):
            raise ValueError(f"pipeline layout {text!r}: stage {index} holds no layer, "
                             "embedding or loss")
    return counts
