"""`trainbench accept`: every workload family's one-GPU proxy built (`check`) and
trained in bf16 and FP8, a checkpoint saved and resumed, a profiled step and a probe,
each through the real CLI
under its own time limit, ending with one table of measured against predicted step
time, MFU and peak memory (also written as Markdown and JSON). On a CPU the tiny sizes.

    from trainbench.accept import AcceptRequest, run_acceptance
    report = run_acceptance(AcceptRequest(quick=True), echo=print)

No torch here: the commands it runs import it.
"""

from __future__ import annotations

import os
import shlex
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from . import checks, machine, proxy, report as report_mod, rows as rows_mod
from .checks import NOT_RUN, RowResult
from .report import Report
from .rows import TRAIN, Row

MARKDOWN_FILE, JSON_FILE = "acceptance.md", "acceptance.json"
DEFAULT_STEPS = {"gpu": 10, "cpu": 2}
"""Steps per training run: on a GPU the first compiles and results' window leaves it out;
on a CPU two show that a family trains."""
DEFAULT_LIMIT_S = {"gpu": 300.0, "cpu": 180.0}
"""Each command's own time limit: compilation included on a GPU."""
MAX_LIMIT_S = 24 * 3600.0


class AcceptError(ValueError):
    """Bad input, found before anything is created: one line."""


@dataclass(frozen=True)
class AcceptRequest:
    quick: bool = False
    out: Path | None = None
    """The run's own new directory; None: acceptance/<timestamp> under TRAINBENCH_ROOT
    (else the current directory), as `run` places experiments/."""
    steps: int | None = None
    only: tuple[str, ...] = ()
    """Run only the rows whose label contains one of these ('llama3.1', 'probe')."""
    time_limits: tuple[str, ...] = ()
    """'SECONDS' for every row, or 'LABEL=SECONDS' for the rows whose label contains LABEL."""
    argv: tuple[str, ...] = ()
    """The command line after `trainbench` ('accept', '--quick', ...), for the report."""


def parse_limits(items: tuple[str, ...], default: float) -> tuple[float, dict[str, float]]:
    """('600', 'probe=60') -> (600.0, {'probe': 60.0}); AcceptError when malformed."""
    per_row: dict[str, float] = {}
    for item in items:
        label, sep, value = item.rpartition("=")
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1.0
        if not 0 < seconds <= MAX_LIMIT_S or (sep and not label.strip()):
            raise AcceptError(f"--time-limit {item!r}: give SECONDS or ROW=SECONDS, seconds "
                              f"above 0 and at most {MAX_LIMIT_S:g} (e.g. --time-limit 600 "
                              "or --time-limit probe=120)")
        if sep:
            per_row[label.strip()] = seconds
        else:
            default = seconds
    return default, per_row


def _new_out_dir(out: Path | None) -> Path:
    if out is None:
        root = Path(os.environ.get("TRAINBENCH_ROOT") or ".")
        base = root / "acceptance" / time.strftime("%Y%m%d-%H%M%S")
        out, n = base, 2
        while out.exists():
            out, n = base.with_name(f"{base.name}-{n}"), n + 1
    elif out.exists():
        raise AcceptError(f"--out {out}: exists; an acceptance run never overwrites one, "
                          "give a new directory")
    try:
        (out / "logs").mkdir(parents=True)
    except OSError as err:
        raise AcceptError(f"--out {out}: cannot create it ({err.strerror})") from None
    return out


def plan_rows(req: AcceptRequest, m: machine.Machine) -> tuple[list[Row], list[str]]:
    """The rows this machine runs, their limits set, and what is skipped; AcceptError
    for an --only or --time-limit that names no row."""
    default, per_row = parse_limits(req.time_limits, DEFAULT_LIMIT_S[m.kind])
    train, skipped = rows_mod.training_rows(m.gpu, m.torchao is not None, req.quick)
    # On a GPU the training rows build the real-width proxies themselves.
    builds = rows_mod.build_rows(req.quick) if m.on_cpu else []
    every = builds + train + rows_mod.check_rows(m.gpu)
    rows = every
    if req.only:
        rows = [r for r in every if rows_mod.matches(r.label, req.only)]
        skipped = [s for s in skipped if rows_mod.matches(s, req.only)]
        if not rows:
            raise AcceptError(f"--only {','.join(req.only)} names no row; rows: "
                              + ", ".join(r.label for r in every))
    for label in per_row:
        if not any(rows_mod.matches(r.label, (label,)) for r in rows):
            raise AcceptError(f"--time-limit {label}=...: no row to run is called that; "
                              "rows: " + ", ".join(r.label for r in rows))
    limited = []
    for r in rows:
        limits = [s for label, s in per_row.items() if rows_mod.matches(r.label, (label,))]
        limited.append(replace(r, limit_s=min(limits) if limits else default))
    return limited, skipped


def _run_row(ctx: checks.Context, row: Row) -> RowResult:
    res = RowResult(label=row.label, kind=row.kind, shape=row.shape, dtype=row.dtype,
                    limit_s=row.limit_s)
    if row.kind == TRAIN:
        row, plan, problem = proxy.resolve(row, ctx.gpu_key)
        res.shape, res.note = row.shape, row.note
        if plan is None:
            res.status, res.detail = NOT_RUN, problem or ""
            return res
        checks.train(ctx, row, res)
    else:
        checks.RUNNERS[row.kind](ctx, row, res)
    return res


def run_acceptance(req: AcceptRequest, echo: Callable[[str], None] = lambda _: None
                   ) -> tuple[Report, Path]:
    """Run every row, each under its own limit, and write the report into a new
    directory; returns the report and that directory. AcceptError before anything is
    created for bad input or a GPU the catalog does not know."""
    if req.steps is not None and not 1 <= req.steps <= 1000:
        raise AcceptError(f"--steps {req.steps}: give 1 to 1000 steps per run")
    m = machine.detect()
    if m.gpu_key == "":
        raise AcceptError(f"GPU {m.device!r} is not in trainbench's catalog, so no MFU or "
                          "prediction can be made for it; `trainbench run --peak-tflops` "
                          "runs it one workload at a time")
    rows, skipped = plan_rows(req, m)
    out = _new_out_dir(req.out)
    ctx = checks.Context(out=out, gpu_key=m.gpu_key, steps=req.steps or DEFAULT_STEPS[m.kind])
    command = shlex.join(["trainbench", *req.argv])
    rep = Report(machine=m, command=command, started=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                 skipped=skipped)
    if m.on_cpu:
        rep.notes.append("no GPU found: every family trained its tiny size on the CPU "
                         "(FP8 emulated in software; the build rows built the H100 proxies "
                         "on the meta device); predict has no step-time model for a CPU, "
                         "and a CPU run's peak memory is its process's resident set, "
                         "libraries included, which predict's memory model does not describe")
    echo(report_mod.machine_line(m))
    start = time.monotonic()
    for i, row in enumerate(rows, 1):
        echo(f"[{i}/{len(rows)}] {row.label} (limit {row.limit_s:g} s)")
        res = _run_row(ctx, row)
        res.log = str(out / "logs" / f"{row.label}.log")
        rep.rows.append(res)
        echo(f"    {res.status}" + (f": {res.detail}" if res.detail else "")
             + f" ({res.seconds:.0f} s)")
    rep.elapsed_s = time.monotonic() - start
    (out / MARKDOWN_FILE).write_text(report_mod.markdown(rep), encoding="utf-8")
    (out / JSON_FILE).write_text(rep.to_json(), encoding="utf-8")
    return rep, out


__all__ = ["AcceptError", "AcceptRequest", "Report", "run_acceptance"]
