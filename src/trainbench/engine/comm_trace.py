"""The communication summary: which collectives each step runs, over which parallel
dimension, moving how many bytes, taking how long. Built from a torch.profiler trace.

What torch 2.13 records (inspected, not assumed):
- every backend: the issuing op on the training thread, `c10d::<op>` (what FSDP2 and
  torch.distributed call) or `_c10d_functional::<op>` (what DTensor/TP calls), with
  `Input Dims` / `Input type` when `record_shapes=True`;
- gloo: a `gloo:<op>` span on the process group's worker thread while the data moves
  (its own duration; a gloo reduce-scatter runs as `gloo:all_reduce` of the full input);
- NCCL: a `record_param_comms` op carrying the process group's name, and the
  `nccl...` kernels on the GPU, linked to their launch by `correlation`.
gloo's events name no process group, so on gloo a small dispatch mode
(CollectiveLabeler) wraps each collective in a `trainbench.comm:<dim>` annotation
naming the mesh dimension of its process group. It runs only in traced steps.

Message size follows nccl-tests: the full buffer a collective works on (an
all-gather's gathered output, a reduce-scatter's input, an all-reduce's tensor).
"""

from __future__ import annotations

import bisect
import re
from collections import defaultdict

import torch
from torch.distributed.tensor import DTensor
from torch.profiler import record_function
from torch.utils._python_dispatch import TorchDispatchMode

from .trace_events import Event, step_of, step_windows

LABEL_PREFIX = "trainbench.comm:"
UNKNOWN_GROUP = "?"

_OP_KINDS = {
    "_allgather_base": "all_gather", "allgather": "all_gather",
    "allgather_coalesced": "all_gather", "allgather_into_tensor_coalesced": "all_gather",
    "all_gather_into_tensor": "all_gather", "all_gather_into_tensor_out": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "_reduce_scatter_base": "reduce_scatter", "reduce_scatter": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "allreduce": "all_reduce", "allreduce_coalesced": "all_reduce",
    "all_reduce": "all_reduce", "all_reduce_coalesced": "all_reduce",
    "broadcast": "broadcast", "alltoall": "all_to_all", "alltoall_base": "all_to_all",
    "all_to_all_single": "all_to_all", "send": "send", "recv": "recv",
    "recv_any_source": "recv", "barrier": "barrier", "monitored_barrier": "barrier",
    "gather": "gather", "scatter": "scatter", "reduce": "reduce",
}
# Functional all-gathers take the local shard; the message is group_size shards.
_GATHERS_FROM_SHARD = ("all_gather_into_tensor", "all_gather_into_tensor_out",
                       "all_gather_into_tensor_coalesced")
_ISSUE = re.compile(r"^(?:c10d|_c10d_functional|c10d_functional)::(\w+?)_?$")

# Element sizes of the `Input type` strings the profiler writes.
_DTYPE_BYTES = {
    "float": 4, "double": 8, "c10::BFloat16": 2, "c10::Half": 2, "BFloat16": 2, "Half": 2,
    "Float": 4, "Double": 8, "long int": 8, "int": 4, "short int": 2, "signed char": 1,
    "unsigned char": 1, "bool": 1, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1,
    "Float8_e4m3fn": 1, "Float8_e5m2": 1, "Long": 8, "Int": 4, "Byte": 1,
}
_DTYPE_NAMES = {"float": "fp32", "Float": "fp32", "double": "fp64", "Double": "fp64",
                "c10::BFloat16": "bf16", "BFloat16": "bf16", "c10::Half": "fp16",
                "Half": "fp16", "long int": "int64", "Long": "int64", "int": "int32",
                "Int": "int32", "c10::Float8_e4m3fn": "fp8e4m3", "Float8_e4m3fn": "fp8e4m3",
                "c10::Float8_e5m2": "fp8e5m2", "Float8_e5m2": "fp8e5m2",
                "unsigned char": "uint8", "Byte": "uint8", "bool": "bool"}


def op_kind(name: str) -> str | None:
    """'c10d::_allgather_base_' -> 'all_gather'; None for anything not a collective."""
    match = _ISSUE.match(name)
    if not match:
        return None
    return _OP_KINDS.get(match.group(1)) or _OP_KINDS.get(match.group(1).rstrip("_"))


# --- labelling process groups (gloo) -----------------------------------------------------

def make_labeler(pg_labels: dict[str, str]):
    """A TorchDispatchMode naming each collective's mesh dimension in the trace.

    pg_labels maps a process group's `group_name` to its label (e.g. 'tp').
    """
    namespaces = ("c10d", "_c10d_functional", "c10d_functional")

    def group_of(args, kwargs) -> str:
        for value in list(args) + list(kwargs.values()):
            if isinstance(value, str) and value in pg_labels:
                return pg_labels[value]
            if isinstance(value, torch.ScriptObject) and "ProcessGroup" in str(value._type()):
                name = torch.distributed.ProcessGroup.unbox(value).group_name
                return pg_labels.get(name, f"pg{name}")
        return UNKNOWN_GROUP

    class CollectiveLabeler(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if isinstance(func, torch._ops.HigherOrderOperator):
                return func(*args, **kwargs)
            # Let DTensor desugar an op into the collectives it needs; those come back
            # through this mode on plain tensors. (Other subclasses, e.g. the fake
            # tensors of DTensor's sharding propagation, just run.)
            if any(issubclass(t, DTensor) for t in types):
                return NotImplemented
            if func.namespace not in namespaces or \
                    op_kind(f"{func.namespace}::{func._opname}") is None:
                return func(*args, **kwargs)
            with record_function(LABEL_PREFIX + group_of(args, kwargs)):
                return func(*args, **kwargs)

    return CollectiveLabeler()


# --- summarising a trace -----------------------------------------------------------------

def _numel(shape) -> int:
    """Elements of a tensor of this shape ([] is a 0-dim tensor: one element)."""
    if not isinstance(shape, list):
        return 0
    if shape and not all(isinstance(d, int) for d in shape):  # nested: a list of tensors
        return sum(_numel(inner) for inner in shape)
    numel = 1
    for d in shape:
        numel *= d
    return numel


def _arg_numels(event: Event) -> list[int]:
    """Elements of each tensor (or tensor list) argument; 0 for anything else.

    `Input Dims` writes [] both for a 0-dim tensor and for a non-tensor argument;
    `Input type` tells them apart (a dtype name, 'TensorList', or something else).
    """
    dims = event.args.get("Input Dims", [])
    types = event.args.get("Input type", [])
    out = []
    for i, shape in enumerate(dims):
        kind = types[i] if i < len(types) else ""
        if kind == "TensorList":
            out.append(sum(_numel(inner) for inner in shape) if isinstance(shape, list) else 0)
        elif kind in _DTYPE_BYTES or (kind == "" and shape):
            out.append(_numel(shape))
        else:
            out.append(0)
    return out


def _tensor_dtype(event: Event) -> str | None:
    """The dtype of the op's first plain-tensor argument, as the profiler spells it."""
    for kind in event.args.get("Input type", []):
        if kind in _DTYPE_BYTES:
            return kind
    return None


def _outermost(events: list[Event]) -> list[Event]:
    """Issuing ops, leaving out collectives called inside another one (functional ops
    call the c10d op underneath)."""
    kept: list[Event] = []
    last_on_thread: dict[object, Event] = {}
    for event in events:
        outer = last_on_thread.get(event.tid)
        if outer is not None and outer.contains(event):
            continue
        kept.append(event)
        last_on_thread[event.tid] = event
    return kept


class _Enclosing:
    """Find, per thread, the event of a sorted list that contains a given event."""

    def __init__(self, events: list[Event]):
        self.by_tid: dict[object, list[Event]] = defaultdict(list)
        for event in events:
            self.by_tid[event.tid].append(event)
        self.starts = {tid: [e.start for e in evs] for tid, evs in self.by_tid.items()}

    def find(self, inner: Event) -> Event | None:
        evs = self.by_tid.get(inner.tid)
        if not evs:
            return None
        i = bisect.bisect_right(self.starts[inner.tid], inner.start + 1e-3) - 1
        # Containers here do not nest deeply: the nearest few before are the candidates.
        for j in range(i, max(-1, i - 8), -1):
            if evs[j].contains(inner):
                return evs[j]
        return None


def summarize(events: list[Event], *, rank: int, backend: str,
              group_sizes: dict[str, int], pg_labels: dict[str, str]) -> dict:
    """The collectives of every profiled step of one rank's trace.

    group_sizes: label -> ranks in that group; pg_labels: process group name -> label
    (used where the trace names the group, as NCCL's record_param_comms does).
    """
    windows = step_windows(events)
    issues = _outermost([e for e in events if op_kind(e.name)])
    owner = _Enclosing(issues)
    group_by_issue: dict[int, str] = {}
    dtype_by_issue: dict[int, str] = {}
    for event in events:
        if event.name.startswith(LABEL_PREFIX):
            # The profiler opens an op's span before the dispatch mode runs, so the label
            # sits inside the issuing op's span.
            issue = owner.find(event)
            if issue is not None:
                group_by_issue[id(issue)] = event.name[len(LABEL_PREFIX):]
        elif event.name == "record_param_comms":
            issue = owner.find(event)
            if issue is not None:
                name = str(event.args.get("Process Group Name", ""))
                desc = str(event.args.get("Process Group Description", ""))
                group_by_issue.setdefault(id(issue), pg_labels.get(name) or desc or UNKNOWN_GROUP)
                if event.args.get("dtype"):
                    dtype_by_issue[id(issue)] = str(event.args["dtype"])
    time_by_issue, exec_dtype = _execution_times(events, issues)

    records = []
    for issue in issues:
        step = step_of(issue.start, windows)
        if step is None:
            continue
        kind = op_kind(issue.name)
        group = group_by_issue.get(id(issue), UNKNOWN_GROUP)
        numels = _arg_numels(issue)
        message = max(numels, default=0)
        op_name = _ISSUE.match(issue.name).group(1)
        if op_name in _GATHERS_FROM_SHARD:
            message = (numels[0] if numels else 0) * group_sizes.get(group, 1)
        dtype = (_tensor_dtype(issue) or exec_dtype.get(id(issue))
                 or dtype_by_issue.get(id(issue)))
        elem = _DTYPE_BYTES.get(dtype or "", None)
        records.append({
            "step": step, "op": kind, "group": group,
            "dtype": _DTYPE_NAMES.get(dtype or "", dtype or "?"),
            "bytes": message * elem if elem else None,
            "time_s": time_by_issue.get(id(issue)),
        })
    return _aggregate(records, sorted(windows), rank=rank, backend=backend,
                      group_sizes=group_sizes)


def _execution_times(events: list[Event], issues: list[Event]) -> tuple[dict, dict]:
    """Seconds each issued collective spent moving data, and the dtype it moved."""
    times: dict[int, float] = {}
    dtypes: dict[int, str] = {}
    # gloo: a process group runs its works in the order they were issued, each after
    # its issue; match each issue to the first later unclaimed span of the same size.
    spans: dict[int, list[Event]] = defaultdict(list)
    for event in events:
        if event.name.startswith("gloo:"):
            spans[sum(_arg_numels(event))].append(event)
    claimed: set[int] = set()
    starts = {numel: [e.start for e in evs] for numel, evs in spans.items()}
    for issue in issues:
        for numel in dict.fromkeys([n for n in _arg_numels(issue) if n > 0] or [0]):
            if numel not in spans:
                continue
            i = bisect.bisect_left(starts[numel], issue.start)
            while i < len(spans[numel]) and id(spans[numel][i]) in claimed:
                i += 1
            if i < len(spans[numel]):
                span = spans[numel][i]
                claimed.add(id(span))
                times[id(issue)] = span.dur / 1e6
                if _tensor_dtype(span):
                    dtypes[id(issue)] = _tensor_dtype(span)
                break
    # NCCL: kernels link to their launch (runtime/driver call) by correlation id; the
    # launch happens inside the issuing op on the same thread.
    launches = {}
    for event in events:
        if event.cat in ("cuda_runtime", "cuda_driver") and "correlation" in event.args:
            launches[event.args["correlation"]] = event
    owner = _Enclosing(issues)
    for event in events:
        if event.cat == "kernel" and "nccl" in event.name.lower():
            launch = launches.get(event.args.get("correlation"))
            issue = owner.find(launch) if launch is not None else None
            if issue is not None:
                times[id(issue)] = times.get(id(issue), 0.0) + event.dur / 1e6
    return times, dtypes


def _aggregate(records: list[dict], steps: list[int], *, rank: int, backend: str,
               group_sizes: dict[str, int]) -> dict:
    n_steps = max(1, len(steps))
    per_step: dict[int, dict] = defaultdict(dict)
    totals: dict[tuple, dict] = {}
    for rec in records:
        key = (rec["op"], rec["group"], rec["dtype"])
        for bucket in (totals.setdefault(key, _empty(key)),
                       per_step[rec["step"]].setdefault(key, _empty(key))):
            bucket["calls"] += 1
            if rec["bytes"] is not None:
                bucket["bytes"] += rec["bytes"]
                bucket["min_message_bytes"] = min(bucket["min_message_bytes"] or rec["bytes"],
                                                  rec["bytes"])
                bucket["max_message_bytes"] = max(bucket["max_message_bytes"] or 0, rec["bytes"])
            if rec["time_s"] is not None:
                bucket["time_s"] += rec["time_s"]
                bucket["timed_calls"] += 1
    collectives = []
    for key, bucket in sorted(totals.items(), key=lambda kv: -kv[1]["bytes"]):
        bucket["group_size"] = group_sizes.get(bucket["group"])
        bucket["calls_per_step"] = bucket["calls"] / n_steps
        bucket["bytes_per_step"] = bucket["bytes"] / n_steps
        bucket["time_per_step_s"] = bucket["time_s"] / n_steps if bucket["timed_calls"] else None
        collectives.append(bucket)
    return {
        "rank": rank, "backend": backend, "steps": steps,
        "message_size": "full buffer (all-gather output, reduce-scatter input, all-reduce tensor)",
        "collectives": collectives,
        "per_step": {str(step): list(per_step[step].values()) for step in steps},
    }


def _empty(key: tuple) -> dict:
    op, group, dtype = key
    return {"op": op, "group": group, "dtype": dtype, "calls": 0, "bytes": 0,
            "min_message_bytes": None, "max_message_bytes": None, "time_s": 0.0,
            "timed_calls": 0}


# --- printing ---------------------------------------------------------------------------

def _size(num_bytes: float | None) -> str:
    if num_bytes is None:
        return "?"
    for unit, scale in (("GiB", 1024 ** 3), ("MiB", 1024 ** 2), ("KiB", 1024)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:.1f} {unit}"
    return f"{num_bytes:.0f} B"


def format_table(summary: dict) -> list[str]:
    """Plain-text lines for the log: one row per (collective, group, dtype)."""
    steps = summary["steps"]
    span = f"{steps[0]}-{steps[-1]}" if steps else "none"
    lines = [f"Collectives per step, rank {summary['rank']} ({summary['backend']}, iterations "
             f"{span}; message = {summary['message_size']}):"]
    header = (f"  {'collective':<15}{'group':<8}{'ranks':>6}  {'dtype':<8}{'calls/step':>11}"
              f"{'bytes/step':>13}  {'message min-max':<22}{'time/step':>12}")
    lines.append(header)
    for row in summary["collectives"]:
        ranks = row["group_size"] if row["group_size"] is not None else "?"
        message = (_size(row["min_message_bytes"]) if row["min_message_bytes"] ==
                   row["max_message_bytes"] else
                   f"{_size(row['min_message_bytes'])} - {_size(row['max_message_bytes'])}")
        timing = ("n/a" if row["time_per_step_s"] is None
                  else f"{row['time_per_step_s'] * 1e3:.2f} ms")
        lines.append(f"  {row['op']:<15}{row['group']:<8}{ranks:>6}  {row['dtype']:<8}"
                     f"{row['calls_per_step']:>11.1f}{_size(row['bytes_per_step']):>13}  "
                     f"{message:<22}{timing:>12}")
    if not summary["collectives"]:
        lines.append("  (no collectives in the traced steps)")
    return lines
