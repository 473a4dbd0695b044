"""The text report of bench/predict_accuracy.py: its figures, as computed there, printed
as tables and lines (the --format table output). Formatting only: nothing here predicts or
fits."""

from __future__ import annotations

import statistics


def print_table(rows: list[dict], stats: dict) -> None:
    """One line per reference cell, then the error summary over all of them."""
    head = (f"{'workload':19} {'size':10} {'dtype':5} {'GPUs':>5}  {'layout':42} "
            f"{'measured':>8} {'predicted':>9} {'error':>7} {'MFU meas':>8} {'MFU pred':>8} "
            f"{'mem GiB':>7}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['workload']:19} {r['size']:10} {r['dtype']:5} {r['gpus']:>5}  "
              f"{r['layout']:42} {r['measured_s']:8.3f} {r['predicted_s']:9.3f} "
              f"{r['error_pct']:+6.1f}% {r['mfu_measured_pct']:7.2f}% "
              f"{r['mfu_predicted_pct']:7.2f}% {r['memory_gib']:7.1f}"
              + ("" if r["fits"] else "  (predicted not to fit)"))
    print(f"\n{stats['cells']} cells: mean |error| {stats['mean_abs_error_pct']:.1f}%, "
          f"max |error| {stats['max_abs_error_pct']:.1f}%, "
          f"{stats['within_10_pct']} within 10%, {stats['within_20_pct']} within 20%")


def print_moe(rows: list[dict], stats: dict, label: str) -> None:
    """The MoE rows and their moe_summary `stats`, under the constants `label` names."""
    print(f"\nMoE rows (held out, nothing fitted on them; {label}): {stats['rows']} rows, "
          f"mean |error| {stats['mean_abs_error_pct']:.1f}% (signed "
          f"{stats['mean_signed_error_pct']:+.1f}%), H100 {stats['h100_rows']} rows "
          f"{stats['h100_mean_abs_error_pct']:.1f}%")
    for r in rows:
        print(f"    {r['row']:76} {r['measured_s']:7.2f} s  predicted {r['predicted_s']:7.2f} s"
              f"  {r['error_pct']:+6.1f}%  (all-to-all {100 * r['ep_comm_share']:.0f}%)"
              f"  [{r['source'].split(', ')[0]}]")


def print_project(rows: list[dict]) -> None:
    print("\nThe project's own GPU runs (predict.project_runs) under predict's default "
          "constants, and with `predict --hardware` given that GPU type's probe profile "
          "(project_runs.PROBE_PROFILES): step time, and peak memory where the run logged it")
    for r in rows:
        memory = (f"  peak {r['measured_peak_gib']:6.1f} GiB {r['peak_kind']:9} predicted "
                  f"{r['predicted_peak_gib']:6.1f}  {r['memory_error_pct']:+6.1f}%"
                  if "measured_peak_gib" in r else "")
        probed = (f"  probe {r['probe_error_pct']:+6.1f}%" if "probe_error_pct" in r else "")
        print(f"    {r['row'][:84]:84} {r['measured_s']:7.4f} s  predicted "
              f"{r['predicted_s']:7.4f} s  {r['error_pct']:+6.1f}%{probed}{memory}")


def print_splits(acc: dict) -> None:
    print(f"\nAccuracy splits (calibrate.fit, {acc['sweeps']} sweeps, seed cells only):")
    ins, lowo = acc["in_sample"], acc["leave_one_workload_out"]
    print(f"  in-sample                 {ins['cells']:3d} cells  mean |error| "
          f"{ins['mean_abs_error_pct']:5.1f}%")
    print(f"  leave-one-workload-out    {lowo['cells']:3d} cells  mean |error| "
          f"{lowo['mean_abs_error_pct']:5.1f}%  ("
          + ", ".join(f"{w}: {v['mean_abs_error_pct']:.1f}%"
                      for w, v in lowo["per_workload"].items()) + ")")
    for gpu, v in acc["leave_one_gpu_type_out"].items():
        value = (f"{v['mean_abs_error_pct']:5.1f}%" if v["mean_abs_error_pct"] is not None
                 else v["why"])
        print(f"  leave-one-GPU-type-out    {gpu}: {value}")
    held = acc["held_out"]
    print(f"  held-out (published rows of other GPU types and releases, nothing fitted on "
          f"them): {len(held['rows'])} rows  mean |error| {held['mean_abs_error_pct']:.1f}% "
          f"(signed {held['mean_signed_error_pct']:+.1f}%)")
    print("    by GPU type: " + ", ".join(f"{g} {v:.1f}%" for g, v in
                                         held["mean_abs_error_pct_by_gpu"].items()))
    print(f"    GPU types the seeds never measured: {held['other_gpu_types_rows']} rows, mean "
          f"|error| {held['other_gpu_types_mean_abs_error_pct']:.1f}% (default constants "
          f"{held['other_gpu_types_mean_abs_error_pct_default_constants']:.1f}%; the H100 "
          "fractions of peak without the measured GEMM and attention figures "
          f"{held['other_gpu_types_mean_abs_error_pct_without_measured_gemm']:.1f}%)")
    for src, v in held["other_gpu_types_by_source"].items():
        print(f"      {src:60} {v['rows']:2d} rows  mean |error| "
              f"{v['mean_abs_error_pct']:5.1f}%  signed {v['mean_signed_error_pct']:+6.1f}%")
    print("    diagnosis on those rows, not a fit: " + "; ".join(
        f"with {k} {v:.1f}%" for k, v in held["diagnostics_mean_abs_error_pct"].items()))
    spread = held["release_spread"]
    if spread["rows"]:
        print(f"    the tables' own spread between releases: {spread['rows']} rows of "
              f"{spread['configurations']} configurations published more than once; one step "
              f"time per configuration, whatever the release, reaches at best "
              f"{spread['floor_pct']:.1f}% on them")
    print_pairs(held["same_layout_pairs"])
    for r in held["rows"]:
        print(f"    {r['row']:74} {r['measured_s']:7.3f} s  predicted {r['predicted_s']:7.3f} s"
              f"  {r['error_pct']:+6.1f}%  (GEMMs {100 * r['gemm_share']:.0f}% of the step)")


def print_pairs(pairs: list[dict]) -> None:
    """One line per GPU pair: how far apart the tables and predict put the two types."""
    for gpus in sorted({p["gpus"] for p in pairs}):
        these = [p for p in pairs if p["gpus"] == gpus]
        measured = [p["measured_ratio"] for p in these]
        predicted = [p["predicted_ratio"] for p in these]
        print(f"    {gpus} in the same table and layout ({len(these)} pairs): step-time ratio "
              f"measured {min(measured):.2f}-{max(measured):.2f}, predicted "
              f"{min(predicted):.2f}-{max(predicted):.2f}; mean |error| "
              f"{statistics.fmean(p['mean_abs_error_pct'] for p in these):.1f}%, floor with "
              "these hardware figures (one common scale of both) "
              f"{statistics.fmean(p['floor_pct'] for p in these):.1f}%")


def print_memory(verdicts: list[dict]) -> None:
    fit = sum(v["fits"] for v in verdicts)
    plain = sum(v["plain_fits"] for v in verdicts)
    print(f"\nMemory (every held-out row ran, so each fits): predict says {fit} of "
          f"{len(verdicts)} fit as they ran, with --loss te on the "
          f"{sum(v['te_cross_entropy'] for v in verdicts)} rows whose release fused the loss "
          f"and --offload-layers on the {sum(v['offload_layers'] > 0 for v in verdicts)} "
          f"whose recipe offloaded ({plain} of {len(verdicts)} without either)")
    for v in verdicts:
        if not v["fits"]:
            over = 100 * (v["predicted_gib"] / v["capacity_gib"] - 1)
            note = f", {v['offload_layers']} layers offloaded" if v["offload_layers"] else ""
            print(f"    {v['row']:74} {v['predicted_gib']:6.1f} GiB of "
                  f"{v['capacity_gib']:5.1f} usable (+{over:.1f}%{note})  "
                  f"[{v['source'].split(', ')[0]}]")


def print_groups(acc: dict) -> None:
    print("\nAccuracy by group, mean / max |error|: in-sample under the constants fitted on "
          "all seed cells; held out under constants fitted without the group (seed cells: "
          "without their workload; all else: the seed-fitted constants, which never saw it)")
    for g in acc["groups"]:
        ins = (f"{g['in_sample_mean_pct']:5.1f} / {g['in_sample_max_pct']:5.1f}%"
               if "in_sample_mean_pct" in g else "      -        ")
        extra = (f"  (predict's default constants {g['default_constants_error_pct']:+.1f}%"
                 + (f", with the GPU's probe {g['probe_error_pct']:+.1f}%"
                    if "probe_error_pct" in g else "") + ")"
                 if "default_constants_error_pct" in g else "")
        print(f"  {g['group'][:86]:86} {g['n']:3d}  in-sample {ins}  held out "
              f"{g['held_out_mean_pct']:5.1f} / {g['held_out_max_pct']:5.1f}%{extra}")
    over = [g["group"] for g in acc["groups"] if g["held_out_mean_pct"] > 15]
    print(f"  the issue's target set (the project's runs, dense rows of GPU types the seeds "
          f"never measured, MoE rows): {acc['target_rows']} rows, mean |error| "
          f"{acc['target_mean_pct']:.1f}%; groups above 15% held out: "
          + (", ".join(over) if over else "none"))
