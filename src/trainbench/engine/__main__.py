"""`python -m trainbench.engine plan.json`: what each rank runs under torchrun."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import warnings
from pathlib import Path

import torch

from ..plan import PlanError
from ..planning import load_plan
from .run_records import report_failure
from .trainer import Trainer


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("trainbench: error: usage: python -m trainbench.engine EXPERIMENT_DIR/plan.json",
              file=sys.stderr)
        return 2
    whole_lines()
    plan_path = Path(argv[0])
    try:
        # Read before torch is imported: a missing or broken plan costs no start-up.
        plan = load_plan(plan_path)
    except PlanError as err:
        print(f"trainbench: error: {err.problems[0]}", file=sys.stderr)
        return 2
    if os.environ.get("TORCHELASTIC_RUN_ID") is not None:
        die_with_parent()


    # On a CPU mesh each rank's random init is overwritten by the seed's full init
    # (Trainer.materialize), so DTensor's CPU RNG caveat does not apply.
    warnings.filterwarnings("ignore", message="DTensor random operators may not have complete")

    exp_dir = plan_path.parent
    if plan.device == "cpu":
        # Ranks share the cores; oversubscribed threads would only fight each other.
        torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    trainer = Trainer(plan, exp_dir)
    try:
        trainer.setup()
        trainer.train()  # ends with every rank together, ready to tear down
    except BaseException as exc:  # noqa: BLE001 - every failure ends in exit code 1
        # The traceback goes to the log and one line to the launcher: re-raising would
        # print it again, to the terminal (torch's "[rank0]: Traceback ..." hook).
        report_failure(exp_dir, plan, exc)
        try:
            trainer.close()
        except BaseException:  # noqa: BLE001 - a full disk fails the flush again; reported
            pass
        return 1
    trainer.close()
    return 0


def whole_lines() -> None:
    """Each printed line leaves in one write. Unbuffered (PYTHONUNBUFFERED), print writes
    the text and its newline separately, and on the pipe the ranks share a peer's line can
    land between them: the launcher would then miss a rank's error line, glued to the end
    of another's. One write below the pipe's atomic size is never split."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True, write_through=False)
        except (AttributeError, ValueError):  # not a TextIOWrapper (a test's capture)
            pass


def die_with_parent() -> None:
    """Ask the kernel to kill this rank when its parent (torchrun) dies, whatever kills
    it: a rank left behind would hold its GPU and its port forever."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    if os.getppid() == 1:  # the parent died before the request took effect
        os._exit(1)


def exit_now(code: int) -> None:
    """Leave without the interpreter's teardown.

    Everything the run writes is closed by then (Trainer.close). A gloo worker thread
    frees a finished collective's tensors after the caller's wait has returned, and that
    free takes the GIL. destroy_process_group leaves groups that a DeviceMesh still holds
    alive, so the last collective's free can come after the interpreter has begun to
    finalize: the thread's GIL request then unwinds it through a noexcept destructor,
    and the rank aborts after a complete run ("terminate called without an active
    exception", SIGABRT; seen in a core dump of a two-rank FSDP run), which torchrun
    reports as a failed job.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main(sys.argv[1:]))
