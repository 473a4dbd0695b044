"""Which workload a foreign log belongs to, read from the names the seeds give their runs.

- NeMo 2 recipes: `pretrain_llama3.1_70b_fp8_256`, `pretrain_nemotronh_56b_fp8_gpus128_tp8_...`
  (and trainbench's own `pretrain_llama3.1_8b_bf16_gpus8`);
- the older recipes: `results/<version>/<dtype>/<size>/<gpus>/log-maxtext-64_70b_1407993.out`.

Only what a name states is taken; the rest stays None for the user to give
(`-w/-s/--dtype/--scale`). Pure Python.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from pathlib import Path

from ..catalog import models

_SIZE = r"(\d+(?:\.\d+)?b(?:-proxy)?|tiny)"
_DTYPE = r"(bf16|fp8|fp32)"
_NEMO2_NAME = re.compile(
    r"(pretrain(?:ing)?_[a-z0-9.]+?)_" + _SIZE + "_" + _DTYPE + r"_(?:gpus)?(\d+)", re.I)
_MAXTEXT_NAME = re.compile(r"maxtext[-_](\d+)_" + _SIZE, re.I)
_DTYPE_DIR = re.compile(_DTYPE + "$", re.I)
_SIZE_DIR = re.compile(_SIZE + "$", re.I)

# Words in a file or directory name that pick the workload when the size alone does not
# (70b is both Llama 2, the MaxText recipe, and Llama 3.1).
_WORKLOAD_HINTS = (
    ("maxtext", "pretrain_llama2"),
    ("llama2", "pretrain_llama2"),
    ("llama3", "pretrain_llama3.1"),
    ("nemotronh", "pretrain_nemotronh"),
    ("nemotron-h", "pretrain_nemotronh"),
    ("nemotron", "pretrain_nemotron4"),
)


@dataclass
class Identity:
    """What a run was: any field may be None when nothing says it."""

    workload: str | None = None
    size: str | None = None
    dtype: str | None = None
    gpus: int | None = None

    def merged_over(self, other: "Identity") -> "Identity":
        """This identity, with other's fields where this one has None."""
        return Identity(**{f.name: getattr(self, f.name) if getattr(self, f.name) is not None
                           else getattr(other, f.name) for f in fields(self)})

    def is_empty(self) -> bool:
        return all(getattr(self, f.name) is None for f in fields(self))


def _canonical_workload(name: str) -> str | None:
    name = name.lower().replace("pretraining_", "pretrain_")
    return name if name in models.WORKLOADS else None


def _workload_for_size(size: str, hint_text: str, log_format: str | None) -> str | None:
    """The workload of a size, using name hints when several workloads have that size."""
    candidates = [w for w in models.WORKLOADS if size in models.sizes(w)]
    if len(candidates) == 1:
        return candidates[0]
    text = hint_text.lower()
    for word, workload in _WORKLOAD_HINTS:
        if word in text and workload in candidates:
            return workload
    if log_format == "maxtext" and "pretrain_llama2" in candidates:
        return "pretrain_llama2"  # the only MaxText workload of the seeds
    return None


def infer_identity(path: str | Path, log_format: str | None = None) -> Identity:
    """Workload, size, dtype and GPU count from a log's path, deepest name first."""
    path = Path(path)
    parts = list(path.parts)
    ident = Identity()
    for part in reversed(parts):
        match = _NEMO2_NAME.search(part)
        if match:
            ident = Identity(_canonical_workload(match.group(1)), match.group(2).lower(),
                             match.group(3).lower(), int(match.group(4)))
            break
    if ident.workload and ident.size and ident.dtype and ident.gpus:
        return ident
    # Older layout: .../<dtype>/<size>/<gpus>/<file>.
    older = Identity()
    for i in range(len(parts) - 2):
        if (_DTYPE_DIR.match(parts[i]) and _SIZE_DIR.match(parts[i + 1])
                and parts[i + 2].isdigit()):
            older = Identity(None, parts[i + 1].lower(), parts[i].lower(), int(parts[i + 2]))
    match = _MAXTEXT_NAME.search(path.name)
    if match:
        older = Identity(None, match.group(2).lower(), None, int(match.group(1))).merged_over(older)
    ident = ident.merged_over(older)
    if ident.workload is None and ident.size is not None:
        ident.workload = _workload_for_size(ident.size, str(path), log_format)
    return ident
