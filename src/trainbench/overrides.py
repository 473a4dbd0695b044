"""`--set KEY=VALUE` overrides: the keys a plan takes and their parsing, strict about
what a person types (ASCII digits, each key once). Pure Python, no torch."""

from __future__ import annotations

import math
import re

from .plan import FP8_RECIPES, PlanError

LAYOUT_KEYS = ("tp", "pp", "cp", "ep", "dp", "vp", "dp_shard")


INT_KEYS = LAYOUT_KEYS + ("mbs", "gbs", "seq_len", "layers", "experts", "steps",
                          "warmup_steps", "seed", "gpus_per_node")


FLOAT_KEYS = ("lr", "min_lr", "peak_tflops")


CHOICE_KEYS = {"recompute": ("none", "selective", "full"), "fp8_recipe": FP8_RECIPES,
               "reduce_dtype": ("fp32", "bf16"), "cp_impl": ("allgather", "ring"),
               "dp_sharding": ("full", "gradients", "optimizer"),
               "adam_moments": ("fp32", "bf16"),
               "master_weights": ("fp32", "bf16"), "ssd_scan": ("auto", "kernel", "torch")}


BOOL_KEYS = ("compile", "fsdp_prefetch", "async_tp")


TEXT_KEYS = ("pp_split", "pattern")


SETTABLE = INT_KEYS + FLOAT_KEYS + tuple(CHOICE_KEYS) + BOOL_KEYS + TEXT_KEYS


# Bounds that keep a typo (an extra zero or three) from becoming a run that never ends or
# an allocation that never fits: no benchmark needs more.
MAX_INT = 2 ** 31 - 1


MAX_STEPS = 10_000_000


MAX_SCALE = 1_000_000


# Numbers as a person types them in ASCII: int() and float() would also take `２`, `١٦`
# (other scripts' digits) and `1_6` (Python's digit grouping), which no one means.
_ASCII_INT = re.compile(r"[-+]?[0-9]+")


_ASCII_FLOAT = re.compile(r"[-+]?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"
                          r"|nan|inf|infinity)", re.IGNORECASE)


def parse_overrides(items: list[str]) -> dict[str, object]:
    """['tp=2', 'gbs=64'] -> {'tp': 2, 'gbs': 64}; PlanError on anything malformed: not
    KEY=VALUE, an unknown key, a key given twice, a number not in ASCII digits."""
    out: dict[str, object] = {}
    given: dict[str, str] = {}
    problems = []
    for item in items:
        for part in item.split():
            key, sep, value = part.partition("=")
            key = key.strip().lower()
            shown = value if len(value) <= 40 else value[:37] + "..."
            if not sep or not key or not value:
                problems.append(f"--set {part if len(part) <= 40 else part[:37] + '...'!r} "
                                "is not KEY=VALUE (e.g. --set tp=2)")
                continue
            if key not in SETTABLE:
                problems.append(f"--set {key[:40]}: unknown key; settable: {', '.join(SETTABLE)}")
                continue
            if key in given:
                problems.append(f"--set {key} is given twice ({key}={given[key]} and "
                                f"{key}={shown}); give each key once")
                continue
            given[key] = shown
            try:
                if key in INT_KEYS:
                    if not _ASCII_INT.fullmatch(value):
                        raise ValueError
                    if len(value) > 20:  # past any bound, and past what int() converts
                        problems.append(f"--set {key}={shown}: too large (at most {MAX_INT:,})")
                        continue
                    out[key] = int(value)
                    if abs(out[key]) > MAX_INT:
                        problems.append(f"--set {key}={shown}: too large (at most {MAX_INT:,})")
                        continue
                elif key in FLOAT_KEYS:
                    if not _ASCII_FLOAT.fullmatch(value):
                        raise ValueError
                    out[key] = float(value)
                    if not math.isfinite(out[key]):
                        problems.append(f"--set {key}={shown}: must be a finite number")
                        continue
                elif key in BOOL_KEYS:
                    if value.lower() not in ("true", "false", "1", "0"):
                        raise ValueError
                    out[key] = value.lower() in ("true", "1")
                elif key in TEXT_KEYS:
                    out[key] = value
                else:
                    if value not in CHOICE_KEYS[key]:
                        raise ValueError
                    out[key] = value
            except ValueError:
                kind = ("an integer" if key in INT_KEYS else "a number" if key in FLOAT_KEYS
                        else "true or false" if key in BOOL_KEYS
                        else "one of " + ", ".join(CHOICE_KEYS.get(key, ())))
                problems.append(f"--set {key}={shown}: must be {kind}"
                                + (" in ASCII digits" if key in INT_KEYS + FLOAT_KEYS else ""))
    if problems:
        raise PlanError(problems)
    return out
