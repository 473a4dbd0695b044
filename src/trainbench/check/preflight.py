"""Build a plan's first and last rank before launching it.

`preflight_problem(plan)` runs the build in a child Python (`python -m
trainbench.check.preflight`, the plan as JSON on stdin) so the launcher's own process
never imports torch; it returns None when both ranks build, else one line naming the
rank and its error. Not imported by anything heavy.
"""

from __future__ import annotations

import json
import subprocess
import sys

from ..plan import Plan
from .build import check_ranks


def preflight_ranks(plan) -> list[int]:
    """Rank 0 and the last rank: the first and the last pipeline stage (embedding, output
    head), each at one end of the TP x CP x DP group."""
    return sorted({0, plan.gpus - 1})


def preflight_problem(plan, timeout: float = 600.0) -> str | None:
    try:
        proc = subprocess.run([sys.executable, "-m", "trainbench.check.preflight"],
                              input=plan.to_json(), capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return (f"the pre-launch build of ranks {preflight_ranks(plan)} took more than "
                f"{timeout:.0f} s; skip it with --no-check")
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return f"the pre-launch build could not run: {tail}"
    result = json.loads(lines[-1])
    return result.get("problem")


def _main() -> int:
    plan = Plan.from_dict(json.loads(sys.stdin.read()))
    problem = None
    for info in check_ranks(plan, preflight_ranks(plan)):
        if info.get("error"):
            problem = (f"rank {info['rank']} of {plan.layout.describe()} does not build: "
                       f"{info['error']}")
            break
    print(json.dumps({"problem": problem}))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
