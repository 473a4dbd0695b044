"""A hardware profile as rich tables and as a bandwidth-vs-size PNG (matplotlib, Agg,
imported on first use)."""

from __future__ import annotations

from pathlib import Path

from rich.markup import escape
from rich.table import Table

from .profile import COLLECTIVES, fmt_bytes, share_of_peak


def _kernel_cell(gpu_type: str, rank: dict, kernel: str) -> str:
    """'412.3 (41.7% of 989), seq 8192' for a rank's attention or scan, or 'n/a' (a
    profile from before the probe timed it, or an error)."""
    a = rank.get(kernel) or {}
    if not a.get("tflops"):
        return "n/a"
    share = share_of_peak(gpu_type, a.get("dtype", "bf16"), a["tflops"])
    return (f"{a['tflops']:.4g}" + (f" ({escape(share)})" if share else "")
            + f", seq {a['seq']}")


def print_profile(out, profile: dict, where: Path | None = None) -> None:
    m = profile["machine"]
    out.print(f"[bold]{escape(profile['name'])}[/bold]: {m['ranks']} ranks on {m['nodes']} "
              f"node(s) ({escape(', '.join(m['hosts']))}); {escape(', '.join(m['device_names']))}; "
              f"torch {escape(str(m['torch']))}, {m['backend']}", highlight=False)

    dtypes = profile["settings"]["dtypes"]
    ranks = Table(title="Per rank: best GEMM TFLOPS over the seed shapes, causal attention "
                  "and the Mamba-2 scan (forward + backward), memory bandwidth")
    for col in ("rank", "host", "local", "device", *(f"{d} TFLOPS" for d in dtypes),
                "attention TFLOPS", "scan TFLOPS", "copy GB/s (read+write)", "health"):
        ranks.add_column(col)
    slow = {f["rank"]: f for f in profile["verdict"]["findings"] if f["kind"] == "rank"}
    for r in profile["ranks"]:
        best = []
        for d in dtypes:
            rates = [g["tflops"] for g in r["gemm"] if g["dtype"] == d and g.get("tflops")]
            share = share_of_peak(m["gpu_type"], d, max(rates)) if rates else None
            best.append("n/a" if not rates else f"{max(rates):.4g}" + (
                f" ({escape(share)})" if share else ""))
        health = (f"[red]slow: {slow[r['rank']]['below_pct']:.0f}% below peers[/red]"
                  if r["rank"] in slow else "ok")
        ranks.add_row(str(r["rank"]), escape(r["host"]), str(r["local_rank"]),
                      escape(r["device"]), *best, _kernel_cell(m["gpu_type"], r, "attention"),
                      _kernel_cell(m["gpu_type"], r, "scan"),
                      f"{r['memory']['gbs']:.3g}", health)
    out.print(ranks)

    sustained = [(r, g) for r in profile["ranks"] for g in r.get("gemm_sustained") or []]
    if sustained:
        table = Table(title=f"Sustained GEMMs: the largest shape back to back, all ranks at "
                      f"once, {profile['settings'].get('sustain_seconds', 0):g} s per dtype")
        for col in ("rank", "dtype", "shape", "burst TFLOPS", "sustained TFLOPS", "kept"):
            table.add_column(col)
        for r, g in sustained:
            table.add_row(str(r["rank"]), g["dtype"], escape(g["shape"]),
                          f"{g['burst_tflops']:.4g}", f"{g['tflops']:.4g}",
                          f"{100 * g['tflops'] / g['burst_tflops']:.0f}%")
        out.print(table)
        if any(g["tflops"] > g["burst_tflops"] for _, g in sustained):
            out.print("  kept above 100%: the burst's short timings were the noisier; predict "
                      "--hardware takes at most 100%", highlight=False)

    if profile["collectives"]:
        coll = Table(title="Collectives (float32; nccl-tests bus bandwidth)")
        for col in ("op", "group", "ranks", "latency (us)", "largest size", "time (us)",
                    "algbw GB/s", "busbw GB/s", "best busbw GB/s (size)"):
            coll.add_column(col)
        for c in profile["collectives"]:
            last = c["results"][-1]
            top = max(c["results"], key=lambda x: x["busbw_gbs"])
            coll.add_row(c["op"], escape(c["group"]), str(c["n"]), f"{c['latency_us']:.1f}",
                         fmt_bytes(last["size"]), f"{last['time_us']:.1f}",
                         f"{last['algbw_gbs']:.3g}", f"{last['busbw_gbs']:.3g}",
                         f"{top['busbw_gbs']:.3g} ({fmt_bytes(top['size'])})")
        out.print(coll)
    else:
        out.print("collectives: none (a single rank has nobody to talk to)")

    verdict = profile["verdict"]
    colour = "red" if verdict["status"] == "slow" else "green"
    rule = (f" (slow = more than {verdict['threshold_pct']:g}% below the median of its peers)"
            if len(profile["ranks"]) > 1 else "")
    out.print(f"health: [{colour}]{verdict['status']}[/{colour}]{rule}", highlight=False)
    for finding in verdict["findings"]:
        out.print(f"  {escape(finding['message'])}", highlight=False)
    for note in verdict.get("notes", []):  # an older profile has none
        out.print(f"  note: {escape(note)}", highlight=False)
    if profile.get("test_hook"):
        out.print(f"note: test hook set ({escape(str(profile['test_hook']))})", highlight=False)
    if where is not None:
        out.print(f"profile: {escape(str(where))}", highlight=False)


def plot_profile(profile: dict, path: Path):
    """Bus bandwidth against message size, one line per collective and group, both axes
    logarithmic. Returns the (closed) figure."""
    # matplotlib takes about a second to import: only a chart pays for it.
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5))
    styles = ("-", "--", ":", "-.")
    groups = list(dict.fromkeys(c["group"] for c in profile["collectives"]))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for c in profile["collectives"]:
        xs = [r["size"] for r in c["results"]]
        ys = [r["busbw_gbs"] for r in c["results"]]
        ax.plot(xs, ys, styles[groups.index(c["group"]) % len(styles)], marker="o",
                markersize=3, color=colors[COLLECTIVES.index(c["op"]) % len(colors)],
                label=f"{c['op']} ({c['group']}, {c['n']} ranks)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s, nccl-tests convention)")
    m = profile["machine"]
    ax.set_title(f"{profile['name']}: {m['ranks']} ranks, {', '.join(m['device_names'])}"[:110],
                 fontsize=9)
    if profile["collectives"]:
        ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return fig
