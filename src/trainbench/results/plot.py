"""PNG charts of results: weak scaling against the reference, step time per iteration
(warm-up and window visible) and loss curves. matplotlib (Agg) is imported on first use,
so importing this module stays cheap."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

from .. import metrics
from ..catalog import references
from .summary import ExperimentResult, reference_mfu_pct

SCALING_FILE = "scaling.png"
LOSS_FILE = "loss.png"


def _pyplot():
    # matplotlib takes about a second to import: only `trainbench plot` pays for it.
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _safe(name: str) -> str:
    return re.sub(r"[^\w.\-]+", "_", name).strip("_") or "run"


def _label(r: ExperimentResult) -> str:
    return " ".join(x for x in ((r.workload or "?").replace("pretrain_", ""), r.size or "?",
                                r.dtype or "?", r.gpu_type or "") if x)


def plan_files(results: list[ExperimentResult]) -> dict[str, list]:
    """File name -> the results it draws; decided before anything is written so an
    existing file stops the command before the first chart."""
    files: dict[str, list] = {}
    if any(r.gpus and r.tokens_per_s for r in results):
        files[SCALING_FILE] = [r for r in results if r.gpus and r.tokens_per_s]
    used = set(files)
    for r in results:
        if not r.records:
            continue
        base = f"step_time_{_safe(r.name)}"
        name, n = f"{base}.png", 2
        while name in used:
            name, n = f"{base}-{n}.png", n + 1
        used.add(name)
        files[name] = [r]
    with_loss = [r for r in results if any(x.loss is not None for x in r.records)]
    if with_loss:
        files[LOSS_FILE] = with_loss
    return files


def plot_scaling(results: list[ExperimentResult], path: Path, convention: str):
    """Tokens/s and MFU against GPU count, each workload with its reference curve.

    The MFU axis always reaches the 100% ceiling, drawn as a line; a run whose MFU came
    out above it (a wrong peak, metrics.mfu_problem) is not drawn as a point but counted
    in a note on the chart. Returns the (closed) figure, for inspection.
    """
    plt = _pyplot()
    fig, (ax_tok, ax_mfu) = plt.subplots(1, 2, figsize=(12, 4.8))
    groups: dict[tuple, list[ExperimentResult]] = {}
    for r in results:
        groups.setdefault((r.workload, r.size, r.dtype, r.gpu_type), []).append(r)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, ((workload, size, dtype, gpu_type), runs) in enumerate(sorted(
            groups.items(), key=lambda kv: tuple(str(x) for x in kv[0]))):
        color = colors[i % len(colors)]
        label = _label(runs[0])
        runs = sorted(runs, key=lambda r: r.gpus)
        ax_tok.plot([r.gpus for r in runs], [r.tokens_per_s for r in runs], "o", color=color,
                    label=f"{label} (measured)")
        mfu_runs = [r for r in runs if r.mfu_pct is not None]
        if mfu_runs:
            ax_mfu.plot([r.gpus for r in mfu_runs], [r.mfu_pct for r in mfu_runs], "o",
                        color=color, label=f"{label} (measured)")
        refs = sorted((ref for ref in references.references_for(workload or "", size)
                       if ref.dtype == dtype and ref.gpu_type == gpu_type),
                      key=lambda ref: ref.gpus)
        if refs:
            ax_tok.plot([ref.gpus for ref in refs], [ref.tokens_per_s for ref in refs], "--",
                        color=color, alpha=0.7, label=f"{label} (reference)")
            ref_mfu = [(ref.gpus, reference_mfu_pct(ref, convention)) for ref in refs]
            ref_mfu = [(g, m) for g, m in ref_mfu if m is not None]
            if ref_mfu:
                ax_mfu.plot(*zip(*ref_mfu), "--", color=color, alpha=0.7,
                            label=f"{label} (reference)")
    for ax in (ax_tok, ax_mfu):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("GPUs (ranks)")
        ax.grid(True, which="both", alpha=0.3)
    ax_tok.set_yscale("log")
    ax_tok.set_ylabel("tokens/s (window mean)")
    ax_tok.set_title("Throughput, weak scaling")
    ax_mfu.set_ylabel(f"MFU % ({convention} FLOPs)")
    ax_mfu.set_title("Model FLOPs utilisation")
    ax_mfu.axhline(metrics.MFU_CEILING_PCT, color="black", linestyle="-", linewidth=1,
                   label="100% (ceiling)")
    ax_mfu.set_ylim(0, 1.05 * metrics.MFU_CEILING_PCT)  # every valid MFU lies below the line
    invalid = [r for r in results if r.mfu_problem]
    if invalid:
        ax_mfu.text(0.02, 0.5, f"{len(invalid)} run(s) with MFU INVALID (above 100%: the peak "
                    "is wrong;\nsee `trainbench results`, fix with --peak-tflops or --gpu)",
                    transform=ax_mfu.transAxes, fontsize=7, color="tab:red")
    for ax in (ax_tok, ax_mfu):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    _save(fig, path)
    return fig


def plot_step_times(r: ExperimentResult, path: Path) -> None:
    """Step time of every logged iteration, the window shaded and its mean drawn."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    its = [x.iteration for x in r.records]
    times = [x.step_time_s for x in r.records]
    ax.plot(its, times, ".-", linewidth=1, markersize=4, label="step time")
    if r.window:
        a, b = r.window
        ax.axvspan(a - 0.5, b + 0.5, color="tab:green", alpha=0.15,
                   label=f"window {a}-{b}")
        if its and its[0] < a:
            ax.axvspan(its[0] - 0.5, a - 0.5, color="tab:orange", alpha=0.12, label="warm-up")
    if r.step_time_mean_s is not None:
        ax.axhline(r.step_time_mean_s, color="tab:green", linestyle="--", linewidth=1,
                   label=f"window mean {r.step_time_mean_s:.4g} s")
    if r.ref_step_time_s is not None:
        ax.axhline(r.ref_step_time_s, color="tab:red", linestyle=":", linewidth=1,
                   label=f"reference {r.ref_step_time_s:g} s")
    # The first steps are often many times slower: clip the axis to keep the steady
    # state readable and write the clipped values at the top instead.
    finite = sorted(t for t in times if t is not None and math.isfinite(t))
    if finite:
        median = finite[len(finite) // 2]
        top = 2.0 * median
        if finite[-1] > top:
            ax.set_ylim(0, top)
            for it, t in zip(its, times):
                if t is not None and t > top:
                    ax.annotate(f"{t:.3g} s", (it, top), xytext=(3, -12),
                                textcoords="offset points", fontsize=7, color="tab:blue")
        else:
            ax.set_ylim(bottom=0)
    ax.set_xlabel("iteration")
    ax.set_ylabel("step time (s)")
    ax.set_title(f"{r.name} ({r.status})", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    _save(fig, path)


def plot_losses(results: list[ExperimentResult], path: Path) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in results:
        points = [(x.iteration, x.loss) for x in r.records if x.loss is not None]
        ax.plot(*zip(*points), linewidth=1, label=r.name[:60])
    ax.set_xlabel("iteration")
    ax.set_ylabel("loss")
    ax.set_title("Training loss")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=6)
    fig.tight_layout()
    _save(fig, path)


def _save(fig, path: Path) -> None:
    """Write through a temporary name so a failure never leaves half a PNG."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        fig.savefig(tmp, dpi=100, format="png")
        os.replace(tmp, path)
    finally:
        import matplotlib.pyplot as plt
        plt.close(fig)
        if tmp.exists():
            tmp.unlink()


def write_plots(results: list[ExperimentResult], out_dir: str | Path,
                convention: str = "published") -> list[Path]:
    """Every chart the results allow, as PNGs in out_dir; FileExistsError (before writing
    anything) if one of them is already there: nothing is overwritten."""
    out = Path(out_dir)
    files = plan_files(results)
    if not files:
        return []
    clash = [name for name in files if (out / name).exists()]
    if clash:
        raise FileExistsError(f"{out / clash[0]} already exists; choose a new output directory")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, runs in files.items():
        target = out / name
        if name == SCALING_FILE:
            plot_scaling(runs, target, convention)
        elif name == LOSS_FILE:
            plot_losses(runs, target)
        else:
            plot_step_times(runs[0], target)
        written.append(target)
    return written
