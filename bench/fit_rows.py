"""Does every published H100 recipe row fit an H100 at its published layout?

For each of the published H100 recipe rows (the seeds' and the Megatron-Bridge rows the
catalog holds), the plan `trainbench run` would launch is built (no --set: the recipe's
own layout, recompute setting and the engine's state sharding for the row, which the
third column names) and
`trainbench predict`'s memory model gives two figures per GPU on the most loaded pipeline
rank: the engine's (what trainbench runs, `--sharding engine`) and the recipe model's
(what the recipe's own framework ran, `--sharding recipe`). A row fits when the engine's
figure is within the H100's usable memory (78.8 GiB), and the ratio engine / recipe says
how far the engine is from the framework it reproduces.

    python bench/fit_rows.py [--gpu h100] [--only SUBSTRING] [--format text|markdown]

One line per row, then the count of rows that do not fit and the largest ratio. Pure
Python (predict does not import torch); about a second.
"""

from __future__ import annotations

import argparse
import sys

GIB = 1024 ** 3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", default="h100")
    parser.add_argument("--only", default="", help="rows whose 'workload size dtype gpus' "
                                                   "contains this text")
    parser.add_argument("--format", choices=("text", "markdown"), default="text")
    args = parser.parse_args()

    from trainbench.catalog import recipes
    from trainbench.plan import PlanError, dp_sharding_label
    from trainbench.planning import build_plan
    from trainbench.predict.memory import predict_memory

    rows = [r for r in recipes.RECIPES if r.gpu_type == args.gpu
            and args.only in f"{r.workload} {r.size} {r.dtype} {r.gpus}"]
    md = args.format == "markdown"
    if md:
        print("| row | layout | sharding | engine GiB | largest parts | recipe GiB | "
              "engine / recipe | fits |")
        print("|---|---|---|---|---|---|---|---|")
    misfits = 0
    worst_ratio = 0.0
    engine = None
    for row in rows:
        try:
            plan = build_plan(row.workload, row.size, row.dtype, row.gpus, args.gpu)
        except PlanError as err:
            print(f"{row.workload} {row.size} {row.dtype} x{row.gpus}: not planned: "
                  f"{err.problems[0]}", flush=True)
            continue
        engine = predict_memory(plan, sharding="engine")
        recipe = predict_memory(plan, sharding="recipe")
        ratio = engine.total / recipe.total
        worst_ratio = max(worst_ratio, ratio)
        fits = engine.fits
        misfits += not fits
        parts = sorted(engine.parts_gib().items(), key=lambda kv: -kv[1])[:2]
        largest = ", ".join(f"{k} {v:.1f}" for k, v in parts)
        name = f"{row.workload} {row.size} {row.dtype} x{row.gpus}"
        layout = plan.layout.describe()
        sharding = dp_sharding_label(plan).split(" (")[0]
        if md:
            print(f"| {name} | {layout} | {sharding} | {engine.total_gib:.1f} | {largest} | "
                  f"{recipe.total_gib:.1f} | {ratio:.2f} | {'yes' if fits else 'NO'} |")
        else:
            print(f"{name:<36} {layout:<26} {sharding:<24} engine {engine.total_gib:6.1f} GiB "
                  f"({largest:<36}) recipe {recipe.total_gib:6.1f} GiB  x{ratio:4.2f}  "
                  f"{'fits' if fits else 'DOES NOT FIT'}", flush=True)
    cap = engine.capacity / GIB if engine is not None and engine.capacity else float("nan")
    print(f"{len(rows)} {args.gpu} rows: {misfits} do not fit in {cap:.1f} GiB as the engine "
          f"runs them; largest engine / recipe ratio {worst_ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
