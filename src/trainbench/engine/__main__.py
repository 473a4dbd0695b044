"""`python -m trainbench.engine plan.json`: what each rank runs under torchrun."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m trainbench.engine EXPERIMENT_DIR/plan.json", file=sys.stderr)
        return 2
    import warnings

    import torch

    # On a CPU mesh each rank's random init is overwritten by the seed's full init
    # (Trainer.materialize), so DTensor's CPU RNG caveat does not apply.
    warnings.filterwarnings("ignore", message="DTensor random operators may not have complete")

    from ..plan import Plan
    from .trainer import Trainer, report_failure
    plan_path = Path(argv[0])
    plan = Plan.load(plan_path)
    exp_dir = plan_path.parent
    if plan.device == "cpu":
        # Ranks share the cores; oversubscribed threads would only fight each other.
        torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    trainer = Trainer(plan, exp_dir)
    try:
        trainer.setup()
        trainer.train()
        # Leave together: a rank tearing down gloo while a peer still talks to it can
        # abort the peer after a complete run.
        if torch.distributed.is_initialized():
            torch.distributed.barrier()
    except BaseException as exc:  # noqa: BLE001 - logged, then re-raised for torchrun
        report_failure(exp_dir, plan, exc)
        raise
    finally:
        trainer.close()
    return 0


def exit_now(code: int) -> None:
    """Leave without the interpreter's teardown.

    Everything the run writes is closed by then (Trainer.close). What teardown would
    still do is destroy gloo's C++ objects in whatever order Python frees them, and in a
    few percent of runs that aborts a rank ("terminate called without an active
    exception", SIGABRT) after a complete run, which torchrun reports as a failed job.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main(sys.argv[1:]))
