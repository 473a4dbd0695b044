"""`python -m trainbench.probe.worker DIR/probe-plan.json`: what each rank of a probe runs
under torchrun.

All ranks measure at the same time (a barrier before each measurement), so a rank that is
slow while its peers work shows as slow. Rank 0 gathers everything, writes
hardware-profile.json and the bandwidth plot into DIR.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import sys
import time
import traceback
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..engine import sdpa
from ..engine.__main__ import die_with_parent, whole_lines
from ..engine.models import mamba2
from ..engine.telemetry import Sampler
from . import profile as P

# Timed repetitions: nccl-tests' defaults on a GPU (5 warm-up, 20 timed calls); on a CPU
# fewer, scaled down with the message size, so that gloo's sweep takes seconds.
GPU_WARMUP, GPU_ITERS = 5, 20
GEMM_REPEATS = 5
GPU_GEMM_BATCH = 10  # GEMMs per timing on a GPU: launch overhead stays out of the figure
SUSTAIN_WINDOWS = 10  # timings over a sustained run; the rate is the median of the last half


def _cpu_iters(size: int) -> int:
    return 20 if size <= 64 * P.KIB else 10 if size <= P.MIB else 3


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "CPU"


class Rank:
    def __init__(self, plan: dict):
        self.torch, self.dist, self.plan = torch, dist, plan
        self.cuda = plan["device"] == "cuda"
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if self.cuda:
            torch.cuda.set_device(self.local_rank)
            self.device = torch.device("cuda", self.local_rank)
            dist.init_process_group("nccl", device_id=self.device)
        else:
            self.device = torch.device("cpu")
            torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
            dist.init_process_group("gloo")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.node = int(os.environ.get("GROUP_RANK", "0"))
        self.host = socket.gethostname()
        slow = P.parse_slow_rank(os.environ.get(P.SLOW_RANK_ENV))
        self.speed = slow[1] if slow and slow[0] == self.rank else 1.0
        self.device_name = (torch.cuda.get_device_name(self.device) if self.cuda
                            else _cpu_name())

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize(self.device)

    def say(self, text: str) -> None:
        if self.rank == 0:
            print(f"probe: {text}", flush=True)

    def _timed(self, fn, calls: int) -> float:
        """Seconds for `calls` calls of fn, synchronised on both ends. The test hook's slow
        rank waits inside the timed region, as a slow device would."""
        self.sync()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        self.sync()
        elapsed = time.perf_counter() - start
        if self.speed < 1.0:
            time.sleep(elapsed * (1 / self.speed - 1))
            elapsed = time.perf_counter() - start
        return elapsed

    # --- compute and memory -------------------------------------------------------------

    def gemms(self) -> list[dict]:
        torch = self.torch
        out = []
        calls = GPU_GEMM_BATCH if self.cuda else 1
        for dtype_name in self.plan["dtypes"]:
            for shape in self.plan["gemm_shapes"]:
                m, k, n = shape["m"], shape["k"], shape["n"]
                entry = {"dtype": dtype_name, "shape": shape["name"], "m": m, "k": k, "n": n}
                self.dist.barrier()
                fn = None
                try:
                    fn = self._gemm_fn(dtype_name, m, k, n)
                    fn()  # warm-up: kernel selection, first-touch of the operands
                    best = min(self._timed(fn, calls) / calls for _ in range(GEMM_REPEATS))
                    entry.update(time_s=best, tflops=2 * m * k * n / best / 1e12)
                except (RuntimeError, TypeError, NotImplementedError) as err:
                    # fp8 on a GPU or build without it: recorded, not fatal.
                    entry.update(time_s=None, tflops=None,
                                 error=" ".join(str(err).split())[:200])
                out.append(entry)
                del fn
        if self.cuda:
            torch.cuda.empty_cache()
        return out

    def sustained(self, gemm: list[dict]) -> list[dict]:
        """Per dtype, the largest seed shape run back to back on every rank at once for the
        plan's sustain_seconds, timed in SUSTAIN_WINDOWS windows: its rate once the clocks
        have settled (the median of the last half of the windows) beside the burst rate of
        the same shape (gemms: best of GEMM_REPEATS short timings). A GPU that slows under
        sustained load at its power limit (Blackwell: ~20% below its burst, catalog.
        measured) shows here, not in the burst."""
        seconds = float(self.plan.get("sustain_seconds") or 0)
        out = []
        if seconds <= 0:
            return out
        largest = max(self.plan["gemm_shapes"], key=lambda s: s["m"] * s["k"] * s["n"])
        m, k, n = largest["m"], largest["k"], largest["n"]
        for dtype_name in self.plan["dtypes"]:
            burst = next((g for g in gemm if g["dtype"] == dtype_name and g["m"] == m
                          and g["k"] == k and g["n"] == n and g.get("time_s")), None)
            self.dist.barrier()
            if burst is None:
                continue  # the dtype failed in the burst run, recorded there
            entry = {"dtype": dtype_name, "shape": burst["shape"], "m": m, "k": k, "n": n,
                     "burst_tflops": burst["tflops"]}
            fn = self._gemm_fn(dtype_name, m, k, n)
            fn()
            calls = max(1, round(seconds / SUSTAIN_WINDOWS / burst["time_s"]))
            windows, total = [], 0.0
            for _ in range(SUSTAIN_WINDOWS):
                elapsed = self._timed(fn, calls)
                total += elapsed
                windows.append(2 * m * k * n * calls / elapsed / 1e12)
            settled = sorted(windows[SUSTAIN_WINDOWS // 2:])
            entry.update(seconds=total, calls_per_window=calls, window_tflops=windows,
                         tflops=settled[len(settled) // 2])
            out.append(entry)
            del fn
        if self.cuda:
            self.torch.cuda.empty_cache()
        return out

    def _gemm_fn(self, dtype_name: str, m: int, k: int, n: int):
        """C = A @ W^T with A[m, k] and W[n, k] both contiguous: nn.Linear's layout (and
        the column-major second operand torch._scaled_mm needs)."""
        torch = self.torch
        gen = torch.Generator(device=self.device).manual_seed(1234 + self.rank)
        if dtype_name == "fp8":
            a = torch.randn(m, k, device=self.device, generator=gen).to(torch.float8_e4m3fn)
            w = torch.randn(n, k, device=self.device, generator=gen).to(torch.float8_e4m3fn)
            one = torch.ones((), device=self.device)
            return lambda: torch._scaled_mm(a, w.t(), scale_a=one, scale_b=one,
                                            out_dtype=torch.bfloat16)
        dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype_name]
        a = torch.randn(m, k, device=self.device, generator=gen).to(dtype)
        w = torch.randn(n, k, device=self.device, generator=gen).to(dtype)
        c = torch.empty(m, n, device=self.device, dtype=dtype)
        return lambda: torch.mm(a, w.t(), out=c)

    def _best_rate(self, step, flops: float, entry: dict) -> dict:
        """`entry` with the best time of GEMM_REPEATS calls of `step` after a warm-up
        (kernel selection, Triton's compilation) and its rate, or the error that stopped
        it, recorded, not fatal."""
        self.dist.barrier()
        try:
            step()
            best = min(self._timed(step, 1) for _ in range(GEMM_REPEATS))
            entry.update(time_s=best, tflops=flops / best / 1e12)
        except (RuntimeError, TypeError, NotImplementedError) as err:
            entry.update(time_s=None, tflops=None, error=" ".join(str(err).split())[:200])
        return entry

    def attention(self) -> dict | None:
        """Causal scaled-dot-product attention, forward and backward, through the kernel
        the engine's attention gets (F.scaled_dot_product_attention, grouped KV heads, the
        engine's backend order): best of GEMM_REPEATS after a warm-up. None for a plan
        from before the probe timed attention."""
        shape = self.plan.get("attention")
        if not shape:
            return None
        torch = self.torch

        sdpa.use_engine_order(self.device.type)
        dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[shape["dtype"]]
        s, n, g, d = shape["seq"], shape["heads"], shape["kv_heads"], shape["head_dim"]
        gen = torch.Generator(device=self.device).manual_seed(4321 + self.rank)

        def make(heads: int):
            return torch.randn(1, heads, s, d, device=self.device, generator=gen,
                               dtype=dtype).requires_grad_()
        q, k, v = make(n), make(g), make(g)
        grad = torch.randn(1, n, s, d, device=self.device, generator=gen, dtype=dtype)

        def step():
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=n != g)
            q.grad = k.grad = v.grad = None
            out.backward(grad)
        entry = {**shape, "backend": sdpa.chosen_backend(self.device, dtype, n, g, d, s)}
        return self._best_rate(step, P.attention_flops(shape), entry)

    def scan(self) -> dict | None:
        """The engine's Mamba-2 scan (SSMCore: mamba_ssm's Triton kernel where it is
        installed on a GPU, else the plain-PyTorch chunked form the engine falls back
        to), forward and backward: best of GEMM_REPEATS after a warm-up. None for a plan
        from before the probe timed the scan."""
        shape = self.plan.get("scan")
        if not shape:
            return None
        torch = self.torch

        dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[shape["dtype"]]
        s, h, p, n, g = (shape[k] for k in ("seq", "heads", "head_dim", "state", "groups"))
        gen = torch.Generator(device=self.device).manual_seed(5678 + self.rank)
        core = mamba2.SSMCore(h).to(self.device)
        with torch.no_grad():  # Mamba-2's initialisation ranges (engine/models/mamba2.py)
            core.A_log.uniform_(*mamba2.A_INIT_RANGE, generator=gen).log_()
            core.dt_bias.fill_(-4.0)  # softplus(-4) ~ 0.018, inside [1e-3, 0.1]
            core.D.fill_(1.0)

        def make(*dims, scale=1.0):
            return (scale * torch.randn(1, s, *dims, device=self.device, generator=gen)
                    ).to(dtype).requires_grad_()
        x, dt, b, c = make(h, p), make(h), make(g, n, scale=0.1), make(g, n, scale=0.1)
        grad = torch.randn(1, s, h, p, device=self.device, generator=gen).to(dtype)
        kernel = bool(self.cuda and mamba2.mamba_chunk_scan_combined is not None)

        def step():
            out = core(x, dt, b, c, shape["chunk"])
            for t in (x, dt, b, c):
                t.grad = None
            out.backward(grad)
        entry = {**shape, "implementation": ("mamba_ssm Triton kernel" if kernel
                                             else "plain-PyTorch chunked SSD (the engine's)")}
        return self._best_rate(step, P.scan_flops(shape), entry)

    def memory(self) -> dict:
        """A device-to-device (CPU: RAM-to-RAM) copy of one large buffer; every byte is
        read once and written once, so the figure counts 2 x the buffer."""
        torch = self.torch
        size = self.plan["memory_bytes"]
        src = torch.ones(size // 4, device=self.device)
        dst = torch.empty_like(src)
        self.dist.barrier()
        dst.copy_(src)
        best = min(self._timed(lambda: dst.copy_(src), 1) for _ in range(GEMM_REPEATS))
        return {"buffer_bytes": size, "bytes_moved": 2 * size, "counted": "read + write",
                "time_s": best, "gbs": 2 * size / best / 1e9}

    # --- collectives -----------------------------------------------------------------------

    def groups(self, places: list[dict]) -> list[dict]:
        """Every group, created by every rank in the same order (torch requires it):
        each node's ranks; with several nodes, each local index across the nodes and all
        ranks together."""
        nodes = sorted({p["node"] for p in places})
        specs = []
        for node in nodes:
            members = [p["rank"] for p in places if p["node"] == node]
            specs.append(("node", f"node {node}", members))
        if len(nodes) > 1:
            for local in sorted({p["local_rank"] for p in places}):
                members = [p["rank"] for p in places if p["local_rank"] == local]
                specs.append(("cross-node", f"local index {local} across nodes", members))
            specs.append(("world", "all ranks", [p["rank"] for p in places]))
        hosts = {p["rank"]: p["host"] for p in places}
        out = []
        for kind, name, members in specs:
            handle = self.dist.new_group(members) if len(members) < self.world else \
                self.dist.group.WORLD
            if len(members) > 1:
                out.append({"kind": kind, "name": name, "ranks": members, "handle": handle,
                            "hosts": sorted({hosts[r] for r in members})})
        return out

    def _op(self, op: str, size: int, group: dict):
        """A callable running one `op` of `size` bytes (float32) over the group, and the
        size it really moves (a multiple of 4 x n bytes)."""
        torch, dist = self.torch, self.dist
        handle, members = group["handle"], group["ranks"]
        n = len(members)
        numel = max(n, size // 4 // n * n) if op in ("all_gather", "reduce_scatter",
                                                     "all_to_all") else max(1, size // 4)
        buf = torch.ones(numel, device=self.device)
        if op == "all_reduce":
            return (lambda: dist.all_reduce(buf, group=handle)), numel * 4
        if op == "all_gather":
            gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
            piece = torch.ones(numel // n, device=self.device)
            return (lambda: gather(buf, piece, group=handle)), numel * 4
        if op == "reduce_scatter":
            scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
            piece = torch.empty(numel // n, device=self.device)
            return (lambda: scatter(piece, buf, group=handle)), numel * 4
        if op == "all_to_all":
            out = torch.empty_like(buf)
            return (lambda: dist.all_to_all_single(out, buf, group=handle)), numel * 4
        # send/recv: a ring, each rank sending to the next and receiving from the previous
        # at once (nccl-tests' sendrecv); across nodes every pair crosses the network.
        me = members.index(self.rank)
        nxt, prev = members[(me + 1) % n], members[(me - 1) % n]
        recv = torch.empty_like(buf)

        def ring():
            ops = [dist.P2POp(dist.isend, buf, nxt, group=handle),
                   dist.P2POp(dist.irecv, recv, prev, group=handle)]
            for req in dist.batch_isend_irecv(ops):
                req.wait()
        return ring, numel * 4

    def sweep(self, groups: list[dict]) -> list[dict]:
        """Each kind of group in turn, its groups at the same time (each rank is in one)."""
        torch, dist = self.torch, self.dist
        mine = []
        for kind in dict.fromkeys(g["kind"] for g in groups):
            group = next((g for g in groups if g["kind"] == kind and self.rank in g["ranks"]),
                         None)
            dist.barrier()
            if group is None:
                continue
            self.say(f"collectives in each {kind} group ({len(group['ranks'])} ranks)")
            for op in P.COLLECTIVES:
                timings = []
                for size in self.plan["sizes"]:
                    fn, moved = self._op(op, size, group)
                    warmup, iters = ((GPU_WARMUP, GPU_ITERS) if self.cuda
                                     else (1, _cpu_iters(size)))
                    for _ in range(warmup):
                        fn()
                    dist.barrier(group=group["handle"])
                    self.sync()
                    start = time.perf_counter()
                    for _ in range(iters):
                        fn()
                    self.sync()
                    mean = (time.perf_counter() - start) / iters
                    # The group's time is its slowest rank's: the collective ends there.
                    t = torch.tensor([mean], dtype=torch.float64, device=self.device)
                    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group["handle"])
                    timings.append((moved, float(t.item())))
                    del fn
                if self.rank == group["ranks"][0]:
                    mine.append(P.collective_entry(op, group["name"], kind, group["ranks"],
                                                   group["hosts"], timings))
        return mine


def _profile(plan: dict, rank: "Rank", records: list, collectives: list) -> dict:
    """The hardware profile rank 0 writes: the machine, how each figure was timed, every
    rank's measurements, the collectives and the health verdict."""
    torch, dist = rank.torch, rank.dist
    return {
        "schema": P.SCHEMA,
        "kind": "trainbench hardware profile",
        "name": plan["name"],
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {
            "gpu_type": plan["gpu_type"], "device": plan["device"],
            "hosts": sorted({r["host"] for r in records}),
            "device_names": sorted({r["device"] for r in records}),
            "nodes": len({r["node"] for r in records}), "ranks": rank.world,
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "backend": dist.get_backend(), "python": platform.python_version(),
        },
        "settings": {
            "dtypes": plan["dtypes"], "sizes": plan["sizes"],
            "gemm_shapes": plan["gemm_shapes"], "memory_bytes": plan["memory_bytes"],
            "attention": plan.get("attention"), "scan": plan.get("scan"),
            "collective_dtype": "float32",
            "sustain_seconds": plan.get("sustain_seconds", 0),
            "timing": ("GEMM, attention, scan and copy: best of %d after a warm-up, "
                       "synchronised; sustained GEMM: the median of the last half of "
                       "%d windows of back-to-back calls; collectives: mean over timed "
                       "calls after warm-up, the slowest rank of the group"
                       % (GEMM_REPEATS, SUSTAIN_WINDOWS)),
            "bus_bandwidth": "nccl-tests: all_reduce x 2(n-1)/n; all_gather, "
                             "reduce_scatter, all_to_all x (n-1)/n; send_recv x 1",
        },
        "ranks": records,
        "collectives": collectives,
        "verdict": P.health_verdict(records, collectives),
    }


def node_conditions(summary: dict) -> dict:
    """What the profile keeps of the node's telemetry over the measurements."""
    keys = ("source", "samples", "throttled", "throttle_reasons", "sm_clock_mhz",
            "gpu_processes_max", "shared_gpus", "missing")
    return {k: summary.get(k) for k in keys}


def run(plan_path: Path) -> int:
    plan = json.loads(plan_path.read_text())
    out_dir = plan_path.parent
    rank = Rank(plan)
    torch, dist = rank.torch, rank.dist
    rank.say(f"{rank.world} ranks, {rank.device_name}; GEMMs in "
             f"{', '.join(plan['dtypes'])}")
    # The node's clocks, throttling and other processes on its GPUs while the figures are
    # taken: a profile timed beside another job is not the hardware's.
    sampler = (Sampler(rank.device.type, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
               if rank.local_rank == 0 else None)
    if sampler is not None:
        sampler.start()
    gemm = rank.gemms()
    rank.say(f"sustained GEMMs: the largest shape for {plan.get('sustain_seconds', 0):g} s "
             "per dtype, all ranks at once")
    sustained = rank.sustained(gemm)
    rank.say("causal attention, forward and backward")
    attention = rank.attention()
    rank.say("the Mamba-2 SSD scan, forward and backward")
    scan = rank.scan()
    if rank.cuda:  # the two kernels' tensors went with their frames; their cached blocks too
        torch.cuda.empty_cache()
    rank.say("memory bandwidth (a large copy)")
    memory = rank.memory()
    record = {"rank": rank.rank, "host": rank.host, "node": rank.node,
              "local_rank": rank.local_rank, "device": rank.device_name,
              "threads": torch.get_num_threads() if not rank.cuda else None,
              "gemm": gemm, "gemm_sustained": sustained, "memory": memory}
    if attention is not None:
        record["attention"] = attention
    if scan is not None:
        record["scan"] = scan
    if sampler is not None:
        record["telemetry"] = node_conditions(sampler.stop())
    if rank.speed < 1.0:
        record["slowed_by_test_hook"] = rank.speed
    records: list = [None] * rank.world
    dist.all_gather_object(records, record)
    places = [{k: r[k] for k in ("rank", "host", "node", "local_rank")} for r in records]
    groups = rank.groups(places)
    mine = rank.sweep(groups)
    gathered: list = [None] * rank.world
    dist.all_gather_object(gathered, mine)
    if rank.rank == 0:
        collectives = P.sorted_collectives([c for part in gathered for c in part])
        profile = _profile(plan, rank, records, collectives)
        hook = os.environ.get(P.SLOW_RANK_ENV)
        if hook:
            profile["test_hook"] = {P.SLOW_RANK_ENV: hook}
        P.write_profile(profile, out_dir)
        try:
            from .report import plot_profile
            plot_profile(profile, out_dir / P.PLOT_FILE)
        except Exception as err:  # noqa: BLE001 - the profile stands without its chart
            print(f"probe: warning: no plot ({type(err).__name__}: {err})", flush=True)
        rank.say(f"wrote {out_dir / P.PROFILE_FILE}")
    dist.barrier()
    dist.destroy_process_group()
    return 0


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("trainbench: error: usage: python -m trainbench.probe.worker "
              "DIR/probe-plan.json", file=sys.stderr)
        return 2
    whole_lines()
    plan_path = Path(argv[0])
    try:
        json.loads(plan_path.read_text())
    except (OSError, ValueError) as err:
        print(f"trainbench: error: {plan_path}: not a readable probe plan ({err})",
              file=sys.stderr)
        return 2
    if os.environ.get("TORCHELASTIC_RUN_ID") is not None:
        die_with_parent()
    # torch >= 2.13 renames all_gather_into_tensor; older releases have only that name.
    warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")
    try:
        return run(plan_path)
    except Exception as err:  # noqa: BLE001 - one line the launcher reads, then the trace
        rank = os.environ.get("RANK", "0")
        line = " ".join(f"{type(err).__name__}: {err}".split())
        print(f"[rank {rank}] trainbench engine error: {line}", file=sys.stderr, flush=True)
        traceback.print_exc()
        return 1


if __name__ == "__main__":
    from ..engine.__main__ import exit_now
    exit_now(main(sys.argv[1:]))
