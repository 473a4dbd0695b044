"""Build every H100 seed row at its real size, rank by rank, and compare with predict.

For each of the 79 H100 recipe rows, rank 0 and the last rank (the first and the last
pipeline stage: the embedding and the output head) are built with the engine's own code
on the meta device under a fake process group of the row's world size
(`trainbench check`'s path), and the model state each holds (sharded fp32 master weights,
gradients, the two AdamW moments, and under PP the gathered weights and fp32 gradients a
stage keeps all step) is printed beside `trainbench predict`'s figure for the same
pipeline rank (--sharding engine) and predict's whole-peak figure for the plan.

    python bench/check_all_rows.py [--ranks first-last|default] [--only SUBSTRING] [--trace] [--moe]

One line per row; the last line counts rows that built, failed, and whose model state
differs from predict's by more than 10%. With --trace each built rank's step is also
traced as `trainbench check` traces it (one rank of each pipeline stage, whose trace the
stage's other ranks take; as many traces at once as there are CPU cores; seconds to about
two minutes a trace at real width on a 2-core machine), one more line per
rank gives the traced peak beside predict's (tensors only on both sides), and the last
line counts the ranks more than 10% apart and those that could not be traced.

--moe takes the H100 rows of Megatron-Bridge's published table instead of the seeds':
the MoE rows (Qwen3 30B-A3B x16, 235B-A22B x256, DeepSeek-V3 671B x1024, all FP8), whose
routing the trace answers with the balanced load (check/routing.py).
"""

from __future__ import annotations

import argparse
import sys
import time

GIB = 1024 ** 3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", choices=("first-last", "default"), default="first-last",
                        help="first-last: rank 0 and the last rank; default: check's default "
                             "(the first and last rank of every pipeline stage)")
    parser.add_argument("--only", default="", help="rows whose 'workload size dtype gpus' "
                                                   "contains this text")
    parser.add_argument("--trace", action="store_true",
                        help="also trace each rank's step and compare its peak with predict's")
    parser.add_argument("--moe", action="store_true",
                        help="the published H100 MoE rows (Megatron-Bridge) instead of the seeds'")
    args = parser.parse_args()

    from trainbench.catalog import recipes
    from trainbench.check.cli import check_plan, default_ranks, microbatches_text
    from trainbench.check.tracing import default_jobs
    from trainbench.planning import build_plan
    from trainbench.predict.memory import predict_memory

    source = "Megatron-Bridge" if args.moe else "seed"
    rows = [r for r in recipes.RECIPES if r.gpu_type == "h100" and r.source.startswith(source)
            and args.only in f"{r.workload} {r.size} {r.dtype} {r.gpus}"]
    built = failed = off = traced_off = untraced = 0
    start_all = time.perf_counter()
    for row in rows:
        plan = build_plan(row.workload, row.size, row.dtype, row.gpus, "h100")
        ranks = default_ranks(plan) if args.ranks == "default" else sorted({0, plan.gpus - 1})
        start = time.perf_counter()
        data = check_plan(plan, ranks, trace=args.trace, jobs=default_jobs())
        secs = time.perf_counter() - start
        peak = predict_memory(plan, sharding="engine").total / GIB
        label = f"{row.workload} {row.size} {row.dtype} {row.gpus:>4} {plan.layout.describe():<22}"
        errors = [r for r in data["ranks"] if r.get("error")]
        if errors:
            failed += 1
            print(f"{label} FAILED rank {errors[0]['rank']}: {errors[0]['error']}", flush=True)
            continue
        built += 1
        worst = max(data["ranks"], key=lambda r: r["built_model_state_bytes"])
        pred = worst["predicted"]["model_state"] / GIB if worst["predicted"] else float("nan")
        gap = worst["model_state_gap_pct"]
        off += gap is None or abs(gap) > 10
        print(f"{label} ranks {','.join(str(r['rank']) for r in data['ranks'])}: built model "
              f"state {worst['built_model_state_bytes'] / GIB:7.2f} GiB (rank {worst['rank']}), "
              f"predicted {pred:7.2f} GiB ({'-' if gap is None else f'{gap:+.1f}%'}); "
              f"predicted peak {peak:6.1f} GiB; {secs:5.1f} s", flush=True)
        for r in data["ranks"] if args.trace else []:
            traced = r["trace"]
            if traced.get("error") or traced.get("gap_pct") is None:
                untraced += 1
                print(f"  rank {r['rank']}: not traced: {traced.get('error')}", flush=True)
                continue
            traced_off += abs(traced["gap_pct"]) > 10
            tensors = r["predicted"]["tensors"] / GIB
            source = (f"from rank {traced['traced_rank']}'s trace" if "traced_rank" in traced
                      else f"over {microbatches_text(traced)}")
            print(f"  rank {r['rank']}: traced peak {traced['peak_bytes'] / GIB:7.2f} GiB "
                  f"{source}, predicted tensors {tensors:7.2f} GiB "
                  f"({traced['gap_pct']:+.1f}%); {traced['trace_s']:.0f} s", flush=True)
    traced_text = (f"; traced ranks: {traced_off} more than 10% from predict's, {untraced} "
                   f"not traced" if args.trace else "")
    print(f"{len(rows)} rows: {built} built, {failed} failed, {off} with model state more "
          f"than 10% from predict's{traced_text}; {time.perf_counter() - start_all:.0f} s",
          flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
