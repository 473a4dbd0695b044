"""A hybrid model's layer pattern, and how to cut it to fewer layers. Pure Python.

Nemotron-H names its layers with one character each: 'M' a Mamba-2 mixer, '*'
attention, '-' an MLP (../shared/reference/architectures.md). A proxy that fits one GPU
keeps the model's width and takes fewer layers; `cut_pattern` chooses which, so the
proxy keeps the full pattern's mix of layer kinds.
"""

from __future__ import annotations

LAYER_KINDS = {"M": "mamba", "*": "attention", "-": "mlp"}
"""Pattern character -> the kind of layer it stands for."""


def pattern_problem(pattern: str) -> str | None:
    """What is wrong with a layer pattern typed by a user, or None."""
    if not pattern:
        return "a layer pattern needs at least one layer"
    bad = sorted({c for c in pattern if c not in LAYER_KINDS}, key=pattern.index)
    if bad:
        return (f"{''.join(bad)!r} is not a layer kind; a pattern holds only M (Mamba-2), "
                "* (attention) and - (MLP), e.g. M-*M-")
    return None


def kind_counts(pattern: str, layers: int) -> dict[str, int]:
    """How many layers of each kind a `layers`-layer cut of `pattern` keeps.

    Each kind k, with c_k of the pattern's L layers, is owed the quota layers * c_k / L.
    When `layers` is at least the number of kinds, every kind starts with one layer (a
    proxy exercises every kind of layer the model has); otherwise none starts with any.
    The remaining layers are then handed out one at a time, each to the kind furthest
    below its quota (ties: the kind met first in the pattern). That is the
    largest-remainder (Hamilton) apportionment whenever it already gives every kind a
    layer: 56B's 54 M, 10 *, 54 - at 12 layers -> 6, 1, 5; at 5 -> 2, 1, 2.
    """
    if not 1 <= layers <= len(pattern):
        raise ValueError(f"a cut of a {len(pattern)}-layer pattern has 1 to {len(pattern)} "
                         f"layers, not {layers}")
    total = {k: pattern.count(k) for k in sorted(set(pattern), key=pattern.index)}
    quota = {k: layers * c / len(pattern) for k, c in total.items()}
    kept = {k: int(layers >= len(total)) for k in total}
    for _ in range(layers - sum(kept.values())):
        # max() keeps the first of equal deficits: the kind met first in the pattern.
        kind = max(kept, key=lambda k: quota[k] - kept[k])
        kept[kind] += 1
    return kept


def cut_pattern(pattern: str, layers: int) -> str:
    """The pattern cut to `layers` layers with `kind_counts`'s mix, in the pattern's order.

    Of each kind's c occurrences, the proxy keeps t spread evenly along the model: the
    i-th kept (i = 0 .. t-1) is occurrence ceil(i * c / t), the first of the i-th of t
    equal runs. The kept layers keep their order, so the cut starts as the model does,
    and where the Mamba and MLP layers keep equal numbers each Mamba layer's MLP still
    follows it. 56B at 5 layers: "M-*M-".
    """
    keep: set[int] = set()
    for kind, t in kind_counts(pattern, layers).items():
        where = [i for i, c in enumerate(pattern) if c == kind]
        keep.update(where[-(-i * len(where) // t)] for i in range(t))
    return "".join(pattern[i] for i in sorted(keep))
