"""Tracing chosen steps: torch.profiler, Nsight Systems capture, and the comm summary.

One StepTracer per rank, driven by the training loop (`before_step` / `after_step`):
- `--profile torch`: torch.profiler records exactly iterations A..B (inclusive, 0-based
  as in the log) on the profiled ranks; each writes a Chrome/Perfetto trace to
  `profile/trace-rank<R>.pt.trace.json`; rank 0 logs a summary (top operators by self
  time; compute / communication / idle share) and writes `profile/summary.json`.
- `--profile nsys`: the launcher runs the ranks under `nsys profile
  --capture-range=cudaProfilerApi`; here cudaProfilerStart/Stop bracket the same steps.
- `--nccl-trace`: every rank records its (few) steps only to summarise the collectives.
Both torch modes write `comm_summary.json` and log its table.

Steps carry `ProfilerStep#<iteration>` annotations (the name torch.profiler uses, so
TensorBoard, HTA and Perfetto queries work), numbered by training iteration, also after
a checkpoint load.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

from . import comm_trace
from .trace_events import (Event, intersect, is_comm_execution, is_comm_op, is_gpu_event,
                           load_events, step_windows, total, union)

PROFILE_DIR = "profile"
COMM_SUMMARY_FILE = "comm_summary.json"
TOP_OPS = 10
_NOT_OPS = ("PythonDispatchMode",)


def process_group_labels(dims) -> tuple[dict[str, str], dict[str, int]]:
    """(process group name -> mesh dim label, label -> group size) for this rank."""
    names: dict[str, str] = {}
    sizes: dict[str, int] = {}

    def add(label: str, group, size: int) -> None:
        names[group.group_name] = label
        sizes[label] = size

    add("world", dist.group.WORLD, dist.get_world_size())
    for dim in ("pp", "cp", "tp", "dp"):
        try:
            mesh = dims[dim]
        except (KeyError, RuntimeError, ValueError):
            continue
        add(dim, mesh.get_group(), mesh.size())
    try:
        flat = dims["dp_cp"]
        # With no context parallelism the FSDP mesh is just the data-parallel ranks.
        add("dp" if getattr(dims, "cp", 1) == 1 else "dp_cp", flat.get_group(), flat.size())
    except (KeyError, RuntimeError, ValueError):
        pass
    if getattr(dims, "tp_enabled", False):
        # An MoE layer under TP is FSDP-sharded over the data, context and tensor ranks
        # (engine/parallel/tp.py MoETokenLocal); a group named above keeps its name.
        group = dims["dp_cp_tp"].get_group()
        if group.group_name not in names:
            add("dp_cp_tp", group, dims["dp_cp_tp"].size())
    if getattr(dims, "ep_enabled", False):
        # Expert parallelism's own groups: the token all-to-all (ep) and the experts'
        # FSDP (dp_mod_ep). Where one of them holds the same ranks as a group above
        # (ep = dp, or ep = tp), the mesh reuses that process group: labelled "dp/ep".
        for dim in ("ep", "dp_mod_ep"):
            group = dims[dim].get_group()
            prior = names.get(group.group_name)
            add(f"{prior}/{dim}" if prior and prior != "world" else dim, group,
                dims[dim].size())
    return names, sizes


class StepTracer:
    """Profiles (or traces the collectives of) a window of iterations on this rank."""

    def __init__(self, plan, rank: int, world_size: int, device: torch.device, exp_dir: Path,
                 dims, log, first_step: int, last_step: int):
        f = plan.features
        self.log = log
        self.rank = rank
        self.device = device
        self.exp_dir = Path(exp_dir)
        self.backend = dist.get_backend()
        if f.profile:
            self.mode = f.profile
            self.window = (f.profile_start, f.profile_stop)
            self.ranks = sorted(r for r in set(f.profile_ranks) if r < world_size)
        elif f.nccl_trace:
            self.mode = "comm"
            self.window = (first_step, last_step)
            self.ranks = list(range(world_size))
        else:
            self.mode = ""
            self.window = (0, -1)
            self.ranks = []
        self.active_here = rank in self.ranks
        self.pg_labels, self.group_sizes = process_group_labels(dims) if self.mode else ({}, {})
        self.profiler = None
        self.labeler = None
        self.step_mark = None
        self.done = not self.mode

    @property
    def enabled(self) -> bool:
        return bool(self.mode)

    def in_window(self, step: int) -> bool:
        return self.window[0] <= step <= self.window[1]

    # --- the loop's hooks ----------------------------------------------------------------

    def before_step(self, step: int) -> None:
        if not self.active_here or self.done:
            return
        if self.mode == "nsys":
            if step == self.window[0]:
                torch.cuda.profiler.start()
            if self.in_window(step):
                torch.cuda.nvtx.range_push(f"ProfilerStep#{step}")
            return
        if step == self.window[0] - 1:
            self._new_profiler().prepare_trace()  # the profiler's warm-up, outside the window
        if step == self.window[0]:
            if self.profiler is None:
                self._new_profiler().prepare_trace()
            self.profiler.start_trace()
        if self.in_window(step):
            self.step_mark = torch.profiler.record_function(f"ProfilerStep#{step}")
            self.step_mark.__enter__()
            if self.backend == "gloo":  # inside the step mark: nothing of it leaks out
                self.labeler = comm_trace.make_labeler(self.pg_labels)
                self.labeler.__enter__()

    def after_step(self, step: int) -> None:
        """Every rank calls this; at the window's end rank 0 gathers and reports."""
        if not self.enabled or self.done or not self.in_window(step):
            return
        if self.active_here:
            self._end_step_mark()
        if step != self.window[1]:
            return
        results = self._finish() if self.active_here else None
        self.done = True
        gathered = [None] * dist.get_world_size() if self.rank == 0 else None
        dist.gather_object(results, gathered, dst=0)
        if self.rank == 0:
            self._report([r for r in gathered if r is not None])

    def close(self) -> None:
        """Stop whatever is still running (the run ended early or failed)."""
        if self.done:
            return
        self.done = True
        if self.step_mark is not None:
            self._end_step_mark()
        if self.profiler is not None:
            try:
                self.profiler.stop_trace()
            except RuntimeError:
                pass
            self.profiler = None

    # --- internals -----------------------------------------------------------------------

    def _new_profiler(self):
        activities = [ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        # record_shapes gives the collectives' message sizes.
        self.profiler = profile(activities=activities, record_shapes=True)
        return self.profiler

    def _end_step_mark(self) -> None:
        if self.mode == "nsys":
            torch.cuda.nvtx.range_pop()
            return
        if self.labeler is not None:
            self.labeler.__exit__(None, None, None)
            self.labeler = None
        if self.step_mark is not None:
            self.step_mark.__exit__(None, None, None)
            self.step_mark = None

    def _finish(self) -> dict:
        if self.mode == "nsys":
            torch.cuda.synchronize(self.device)
            torch.cuda.profiler.stop()
            return {"rank": self.rank}
        self.profiler.stop_trace()
        if self.mode == "torch":
            folder = self.exp_dir / PROFILE_DIR
            folder.mkdir(parents=True, exist_ok=True)
            trace = folder / f"trace-rank{self.rank}.pt.trace.json"
        else:  # a comm trace keeps only its summary: full traces of every rank are big
            trace = self.exp_dir / f".comm-trace-rank{self.rank}.json"
        self.profiler.export_chrome_trace(str(trace))
        events = load_events(trace)
        result = {
            "rank": self.rank,
            "comm": comm_trace.summarize(events, rank=self.rank, backend=self.backend,
                                         group_sizes=self.group_sizes,
                                         pg_labels=self.pg_labels),
        }
        if self.mode == "torch":
            result["trace"] = str(trace.relative_to(self.exp_dir))
            result["top_ops"] = self._top_ops()
            result["time_shares"] = time_shares(events, self.device.type == "cuda")
        else:
            trace.unlink()
        self.profiler = None
        return result

    def _top_ops(self) -> list[dict]:
        device = self.device.type == "cuda"
        steps = self.window[1] - self.window[0] + 1
        rows = []
        for avg in self.profiler.key_averages():
            # Operators only: not annotations (steps, FSDP phases, gloo transfers) nor the
            # labelling dispatch mode's own frames.
            if getattr(avg, "is_user_annotation", False) or avg.key in _NOT_OPS \
                    or avg.key.startswith(("ProfilerStep", comm_trace.LABEL_PREFIX)):
                continue
            self_us = avg.self_device_time_total if device else avg.self_cpu_time_total
            rows.append({"op": avg.key, "calls_per_step": avg.count / steps,
                         "self_ms_per_step": self_us / 1e3 / steps})
        rows.sort(key=lambda r: -r["self_ms_per_step"])
        return rows[:TOP_OPS]

    def _report(self, results: list[dict]) -> None:
        """Rank 0: log the summaries and write the JSON files."""
        first, last = self.window
        if self.mode == "nsys":
            self.log(f"Nsight Systems captured iterations {first}-{last} on ranks "
                     f"{_ranks(self.ranks)}: {PROFILE_DIR}/nsys-rank<R>.nsys-rep")
            return
        comm = {str(r["rank"]): r["comm"] for r in results}
        (self.exp_dir / COMM_SUMMARY_FILE).write_text(json.dumps(
            {"iterations": [first, last], "ranks": comm}, indent=2))
        if self.mode == "torch":
            summary = {"iterations": [first, last], "ranks": {
                str(r["rank"]): {k: r[k] for k in ("trace", "top_ops", "time_shares")}
                for r in results}}
            (self.exp_dir / PROFILE_DIR / "summary.json").write_text(json.dumps(summary, indent=2))
            for r in results:
                for line in format_profile(r, first, last):
                    self.log(line)
        if self.backend == "gloo":
            self.log("  note: on gloo a Python dispatch mode names each collective's process "
                     "group; it adds host time to every op of the traced steps")
        shown = results[0] if results else None
        if shown is not None:
            for line in comm_trace.format_table(shown["comm"]):
                self.log(line)
            if len(results) > 1:
                self.log(f"(all {len(results)} traced ranks in {COMM_SUMMARY_FILE})")


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks)) if len(ranks) <= 8 else f"{len(ranks)} ranks"


def time_shares(events: list[Event], on_gpu: bool) -> dict:
    """Shares of the profiled window spent computing, communicating, and in neither.

    Device time on a GPU (kernels; NCCL kernels are communication); on a CPU the
    training threads' ops are compute and gloo's transfer spans communication.
    'exposed' communication is the part no compute overlaps.
    """
    windows = [(w.start, w.end) for w in step_windows(events).values()]
    window = total(windows)
    if window <= 0:
        return {}
    if on_gpu:
        compute = [(e.start, e.end) for e in events if is_gpu_event(e) and not is_comm_execution(e)]
    else:
        comm_threads = {e.tid for e in events if e.name.startswith("gloo:")}
        # The dispatch mode's frames are host overhead, not compute; the ops inside count.
        compute = [(e.start, e.end) for e in events
                   if e.cat == "cpu_op" and e.tid not in comm_threads and not is_comm_op(e)
                   and e.name not in _NOT_OPS]
    comm = [(e.start, e.end) for e in events if is_comm_execution(e)]
    compute = intersect(compute, windows)
    comm = intersect(comm, windows)
    busy = total(union(compute + comm))
    overlap = total(intersect(compute, comm))
    c, m = total(compute), total(comm)
    return {
        "window_s": window / 1e6,
        "compute_pct": 100 * c / window,
        "communication_pct": 100 * m / window,
        "exposed_communication_pct": 100 * (m - overlap) / window,
        "overlapped_communication_pct": 100 * overlap / window,
        "idle_pct": 100 * (window - busy) / window,
        "basis": "GPU kernels" if on_gpu else "CPU ops on the training threads; gloo transfers",
    }


def format_profile(result: dict, first: int, last: int) -> list[str]:
    shares = result["time_shares"]
    lines = [f"Profile of iterations {first}-{last}, rank {result['rank']}: trace "
             f"{result['trace']}"]
    if shares:
        pct = {key: f"{value:.1f}%" for key, value in shares.items() if key.endswith("_pct")}
        lines.append(
            f"  time: compute {pct['compute_pct']} | communication "
            f"{pct['communication_pct']} (exposed {pct['exposed_communication_pct']}, "
            f"overlapped {pct['overlapped_communication_pct']}) | idle {pct['idle_pct']}  "
            f"[{shares['basis']}]")
    lines.append(f"  {'top operators by self time':<58}{'calls/step':>11}{'ms/step':>10}")
    for row in result["top_ops"]:
        name = row["op"] if len(row["op"]) <= 56 else row["op"][:53] + "..."
        lines.append(f"  {name:<58}{row['calls_per_step']:>11.1f}{row['self_ms_per_step']:>10.3f}")
    return lines
