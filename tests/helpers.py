"""Shared test helpers: run the real CLI and read what a run left on disk."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
from pathlib import Path


def run_cli(*args: str, root: Path | None = None, env: dict | None = None,
            timeout: int = 300) -> subprocess.CompletedProcess:
    """`trainbench ARGS` in a subprocess, as a user runs it."""
    full_env = dict(os.environ)
    full_env.pop("TRAINBENCH_FAIL_AT_STEP", None)
    full_env.update(env or {})
    if root is not None:
        full_env["TRAINBENCH_ROOT"] = str(root)
        full_env.setdefault("TRAINBENCH_CONFIG", str(root / "cluster.yaml"))
    return subprocess.run([sys.executable, "-m", "trainbench.cli", *args], capture_output=True,
                          text=True, env=full_env, timeout=timeout)


def experiment_dirs(root: Path) -> list[Path]:
    return sorted(p.parent for p in (root / "experiments").glob("*/*/plan.json"))


def read_metrics(exp_dir: Path) -> list[dict]:
    path = exp_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def losses(exp_dir: Path) -> list[float]:
    return [float(r["loss"]) for r in read_metrics(exp_dir)]


# FP8 GEMMs on a CPU are software (torch._scaled_mm): about 0.5 s per tiny step on one
# idle core pair, many times that on a shared machine.
FP8_RUN_TIMEOUT = 1800
# CPU torch._scaled_mm is a plain loop (about 60 M multiply-adds/s on a Xeon core, some
# 150x slower than upcasting), so the FP8 runs train on sequences of 32 tokens: the same
# GEMMs, layers, layouts and learnable task on a quarter of the tiny recipe's tokens.
FP8_SEQ = "seq_len=32"


def train(root: Path, workload: str, scale: int, *extra: str, steps: int = 3,
          dtype: str = "fp32", size: str = "tiny", env: dict | None = None,
          timeout: int = 300) -> Path:
    """Run a tiny workload for real and return its experiment directory."""
    before = set(experiment_dirs(root)) if (root / "experiments").exists() else set()
    res = run_cli("run", "-w", workload, "-s", size, "--dtype", dtype, "--scale", str(scale),
                  "--steps", str(steps), "--gpu", "cpu", *extra, root=root, env=env,
                  timeout=timeout)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (new,) = set(experiment_dirs(root)) - before
    return new


def assert_resumes_exactly(root: Path, full: Path, workload: str, scale: int, *extra: str,
                           dtype: str = "fp32") -> Path:
    """Resume `full`'s step-2 checkpoint for steps 2-3 and assert they repeat `full`'s
    losses and gradient norms bit for bit (iteration 3 needs the restored optimizer state);
    returns the resumed experiment."""
    resumed = train(root, workload, scale, *extra, "--load-checkpoint",
                    str(full / "checkpoints" / "step-2"), steps=2, dtype=dtype)
    assert losses(resumed) == losses(full)[2:]
    assert [r["grad_norm"] for r in read_metrics(resumed)] == \
        [r["grad_norm"] for r in read_metrics(full)[2:]]
    return resumed


def assert_every_parameter_trained(module) -> None:
    """After a backward: every parameter has a finite, non-zero gradient."""
    for name, param in module.named_parameters():
        assert param.grad is not None, name
        assert param.grad.isfinite().all(), name
        assert param.grad.abs().sum() > 0, name


def processes_naming(text: str) -> list[str]:
    """Command lines of the live processes that contain text, read in full from /proc
    (ps may cut them short); a zombie has ended and only awaits its parent's wait."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            args = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if text in args and state != "Z":
            found.append(args)
    return found


def leave_spawned_rank() -> None:
    """End a torch.multiprocessing.spawn child whose work is done and written, without the
    interpreter's teardown (as the engine's ranks leave, engine/__main__.exit_now).
    destroy_process_group drops only torch.distributed's own references: a DeviceMesh or
    DTensor cache still holding the gloo group lets the interpreter destroy it at exit,
    and in a few percent of runs that aborts the child after a complete run ("terminate
    called without an active exception", SIGABRT; test_engine_kernels' two-rank loss test
    in the CI run of 2026-11-26, after both ranks had passed a barrier). Call it only
    after the work succeeded, so a failure still reaches spawn with its traceback."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def port_outside_the_ephemeral_range() -> int:
    """A free TCP port below the kernel's ephemeral range. A test that picks its process
    groups' ports ahead of their use cannot take them from bind(0), which hands out
    ephemeral ports: an earlier group's gloo connections may be holding one of those by
    the time it is used (EADDRINUSE)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    while True:
        port = random.randrange(10000, low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port


def tensors_created():
    """A dispatch mode that records every tensor an operation creates while it is active:
    `refs`, weak references to them (which are still alive later), and `shapes`."""
    import weakref

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class TensorsCreated(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.refs, self.shapes = [], []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            made = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
            self.refs += [weakref.ref(t) for t in made]
            self.shapes += [tuple(t.shape) for t in made]
            return out
    return TensorsCreated()
