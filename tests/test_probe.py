"""`trainbench probe`: one real two-rank probe on this CPU (gloo) with rank 1 slowed by the
test hook, shared by the tests that read what it wrote; the bus-bandwidth arithmetic and
the verdict against hand-computed values; bad input refused with nothing written."""

from __future__ import annotations

import json
import os
import socket

import pytest

from helpers import run_cli
from trainbench.probe import profile as P

SIZES = [1024, 2048, 4096, 8192]


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    root = tmp_path_factory.mktemp("probe_root")
    # Rank 1's GEMMs and copies run at a quarter of their real rate (it waits inside the timed
    # region); everything else in the run is untouched.
    res = run_cli("probe", "--scale", "2", "--gpu", "cpu", "--max-size", "8K", root=root,
                  env={P.SLOW_RANK_ENV: "1:0.25"}, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (out_dir,) = (root / "probes").iterdir()
    return res, out_dir, json.loads((out_dir / P.PROFILE_FILE).read_text())


@pytest.mark.slow
@pytest.mark.dist
def test_probe_writes_a_profile_and_a_plot(probed):
    import torch
    res, out_dir, prof = probed
    assert out_dir.name.startswith("probe_cpu_ranks2_")
    assert prof["schema"] == 1
    machine = prof["machine"]
    assert machine["hosts"] == [socket.gethostname()]
    assert machine["torch"] == torch.__version__
    assert machine["backend"] == "gloo" and machine["ranks"] == 2 and machine["nodes"] == 1
    assert [r["rank"] for r in prof["ranks"]] == [0, 1]
    # The node's conditions over the measurements, sampled once by its local rank 0: on
    # this CPU, sysfs (no NVML, so no count of processes on GPUs: nothing claimed).
    (node,) = [r["telemetry"] for r in prof["ranks"] if "telemetry" in r]
    assert prof["ranks"][0]["telemetry"] is node
    assert node["source"] == "cpu sysfs" and node["samples"] >= 2
    assert node["shared_gpus"] is None and "another process" not in str(prof["verdict"])
    for r in prof["ranks"]:
        assert r["local_rank"] == r["rank"] and r["host"] == socket.gethostname()
        assert {(g["dtype"], g["shape"]) for g in r["gemm"]} == {
            (d, s["name"]) for d in ("fp32", "bf16") for s in P.gemm_shapes("cpu")}
        for g in r["gemm"]:
            # The rate is the GEMM's FLOPs over its best time.
            assert g["tflops"] == pytest.approx(2 * g["m"] * g["k"] * g["n"] / g["time_s"] / 1e12)
        att = r["attention"]
        assert {k: att[k] for k in ("seq", "heads", "kv_heads", "head_dim", "dtype")} == {
            **P.CPU_ATTENTION, "dtype": "fp32"}
        assert att["backend"] == "flash (CPU, causal)"
        # Causal forward + backward, predict's count: 6 x s^2 x heads x head_dim.
        assert att["tflops"] == pytest.approx(
            6 * 512 ** 2 * 8 * 64 / att["time_s"] / 1e12)
        scan = r["scan"]
        assert {k: scan[k] for k in P.CPU_SCAN} == P.CPU_SCAN and scan["dtype"] == "fp32"
        assert scan["implementation"] == "plain-PyTorch chunked SSD (the engine's)"
        # predict's scan count: 6 x s x heads x (Q/2 (N + P) + 2 N P).
        assert scan["tflops"] == pytest.approx(
            6 * 512 * 4 * (32 / 2 * (16 + 16) + 2 * 16 * 16) / scan["time_s"] / 1e12)
        # The sustained run: the largest seed shape per dtype, its rate the median of the
        # last half of the windows, beside the burst rate of the same shape.
        largest = max(P.gemm_shapes("cpu"), key=lambda s: s["m"] * s["k"] * s["n"])
        assert [g["dtype"] for g in r["gemm_sustained"]] == ["fp32", "bf16"]
        for s in r["gemm_sustained"]:
            assert (s["m"], s["k"], s["n"]) == (largest["m"], largest["k"], largest["n"])
            burst = next(g for g in r["gemm"] if g["dtype"] == s["dtype"]
                         and g["shape"] == largest["name"])
            assert s["burst_tflops"] == burst["tflops"]
            windows = s["window_tflops"]
            assert len(windows) == 10 and all(w > 0 for w in windows)
            settled = sorted(windows[5:])
            assert s["tflops"] == settled[2] and s["seconds"] > 0
        mem = r["memory"]
        assert mem["counted"] == "read + write" and mem["bytes_moved"] == 2 * mem["buffer_bytes"]
        assert mem["gbs"] == pytest.approx(mem["bytes_moved"] / mem["time_s"] / 1e9)
    ops = [c["op"] for c in prof["collectives"]]
    assert ops == list(P.COLLECTIVES)
    for c in prof["collectives"]:
        assert c["group"] == "node 0" and c["ranks"] == [0, 1]
        assert [x["size"] for x in c["results"]] == SIZES
        assert c["latency_us"] == c["results"][0]["time_us"] > 0
    png = (out_dir / P.PLOT_FILE).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert (out_dir / "exit.json").exists() and (out_dir / "probe.log").exists()
    # The table on the terminal: one row per rank, one per collective.
    assert prof["settings"]["sustain_seconds"] == 0.5
    for text in ("Per rank", "Collectives", "all_to_all", "send_recv", "copy GB/s",
                 "attention TFLOPS", "scan TFLOPS", "seq 512", "Sustained GEMMs"):
        assert text in res.stdout


@pytest.mark.slow
@pytest.mark.dist
def test_probe_bandwidths_follow_the_nccl_tests_convention(probed):
    _, _, prof = probed
    # Two ranks: all-reduce 2(2-1)/2 = 1; all-gather, reduce-scatter, all-to-all
    # (2-1)/2 = 0.5; send/recv 1.
    factor = {"all_reduce": 1.0, "all_gather": 0.5, "reduce_scatter": 0.5,
              "all_to_all": 0.5, "send_recv": 1.0}
    for c in prof["collectives"]:
        for x in c["results"]:
            algbw = x["size"] / (x["time_us"] * 1e-6) / 1e9
            assert x["algbw_gbs"] == pytest.approx(algbw, rel=1e-3)
            assert x["busbw_gbs"] == pytest.approx(algbw * factor[c["op"]], rel=1e-3)


@pytest.mark.slow
@pytest.mark.dist
def test_probe_names_the_slowed_rank(probed):
    res, _, prof = probed
    r0, r1 = prof["ranks"]
    for g0, g1 in zip(r0["gemm"] + r0["gemm_sustained"], r1["gemm"] + r1["gemm_sustained"]):
        # A quarter of the speed; the bound leaves room for two busy cores' noise (a
        # half-speed hook measured 0.73 of its peer on a loaded CI machine).
        assert g1["tflops"] < 0.5 * g0["tflops"]
    verdict = prof["verdict"]
    assert verdict["status"] == "slow"
    slow = [f for f in verdict["findings"] if f["kind"] == "rank"]
    assert [f["rank"] for f in slow] == [1]
    assert slow[0]["host"] == socket.gethostname() and slow[0]["local_rank"] == 1
    assert slow[0]["below_pct"] > 30
    assert f"rank 1 ({socket.gethostname()}, local index 1)" in res.stdout


@pytest.mark.slow
@pytest.mark.dist
def test_report_reprints_an_earlier_probe(probed):
    _, out_dir, _ = probed
    res = run_cli("probe", "--report", str(out_dir))
    assert res.returncode == 0, res.stderr
    assert "rank 1 (" in res.stdout and "send_recv" in res.stdout


# --- arithmetic and verdict on hand-made inputs ----------------------------------------------

def test_bus_factors_are_nccl_tests():
    # all-reduce over 8 ranks: 2 x 7 / 8 = 14/8 = 1.75 (n-1 additions and n assignments
    # per element, 2(n-1) transfers over n links).
    assert P.bus_factor("all_reduce", 8) == 1.75
    assert P.bus_factor("all_gather", 8) == 0.875      # 7/8
    assert P.bus_factor("reduce_scatter", 4) == 0.75   # 3/4
    assert P.bus_factor("all_to_all", 2) == 0.5        # 1/2
    assert P.bus_factor("send_recv", 16) == 1.0
    assert P.bus_factor("all_reduce", 1) == 0.0        # nothing leaves a lone rank
    # 1 GiB in 10 ms: algbw 1073741824 / 0.01 / 1e9 = 107.3741824 GB/s; x 1.75.
    assert P.algbw_gbs(1 << 30, 0.01) == pytest.approx(107.3741824)
    assert P.busbw_gbs("all_reduce", 8, 1 << 30, 0.01) == pytest.approx(187.9048192)
    with pytest.raises(ValueError):
        P.bus_factor("broadcast", 8)


def test_gemm_rates_are_shown_against_the_catalog_peak():
    # 795 of the H100's 989 dense bf16 TFLOPS: 80.38...%.
    assert P.share_of_peak("h100", "bf16", 795) == "80.4% of 989"
    assert P.share_of_peak("h100", "bf16", 1200).startswith("INVALID: above the H100 SXM's 989")
    assert P.share_of_peak("cpu", "fp32", 0.04) is None


def test_sizes_are_powers_of_two_between_the_bounds():
    assert P.parse_size("64M", "--max-size") == 64 * 2**20
    assert P.parse_size("1GiB", "--max-size") == 2**30
    assert P.parse_size("4096", "--max-size") == 4096
    assert P.message_sizes(1000, 8192) == SIZES
    assert P.message_sizes(P.KIB, P.GIB)[-1] == P.GIB and len(P.message_sizes(P.KIB, P.GIB)) == 21
    for bad in ("64 apples", "", "-1K"):
        with pytest.raises(P.ProbeError):
            P.parse_size(bad, "--max-size")
    with pytest.raises(P.ProbeError):
        P.message_sizes(8192, 1024)


def _rank(rank, host, local, tflops, gbs):
    return {"rank": rank, "host": host, "local_rank": local,
            "gemm": [{"dtype": "bf16", "shape": "s", "tflops": tflops}],
            "memory": {"gbs": gbs}}


def test_verdict_flags_only_what_is_more_than_5_percent_below_its_peers():
    ranks = [_rank(0, "a", 0, 800, 3000), _rank(1, "a", 1, 800, 3000),
             _rank(2, "b", 0, 770, 3000),  # 3.75% below: within the threshold
             _rank(3, "b", 1, 800, 2800)]  # memory 6.7% below 3000
    verdict = P.health_verdict(ranks, [])
    assert verdict["status"] == "slow"
    (finding,) = verdict["findings"]
    assert (finding["rank"], finding["host"], finding["local_rank"]) == (3, "b", 1)
    assert finding["metric"] == "memory bandwidth GB/s"
    assert finding["below_pct"] == pytest.approx(6.7)
    assert "rank 3 (b, local index 1)" in finding["message"]
    assert P.health_verdict(ranks[:3], [])["status"] == "healthy"


def test_verdict_notes_gpus_another_process_used_and_clocks_that_throttled():
    """Each node's telemetry over the measurements (on its local rank 0): a second
    process on a GPU, or throttled clocks, is said in the verdict's notes."""
    ranks = [_rank(0, "a", 0, 800, 3000), _rank(1, "a", 1, 800, 3000),
             _rank(2, "b", 0, 800, 3000), _rank(3, "b", 1, 800, 3000)]
    ranks[0]["telemetry"] = {"shared_gpus": [], "throttled": False}
    ranks[2]["telemetry"] = {"shared_gpus": [1], "throttled": True,
                             "throttle_reasons": ["sw power cap"]}
    notes = P.health_verdict(ranks, [])["notes"]
    assert notes == [
        "another process used these GPUs while they were timed: b (GPU 1): the figures are "
        "not the hardware's alone; probe them again when nothing else runs on them",
        "b: clocks throttled while timed (sw power cap)"]
    assert P.shared_gpu_nodes(ranks[:2]) == []


def test_cpu_ranks_of_one_host_are_not_compared_on_copy_bandwidth():
    def cpu(rank, host, local, tflops, gbs):
        return {**_rank(rank, host, local, tflops, gbs), "threads": 1}
    # Two CPU ranks of one host copy through the same RAM: 7% apart is contention.
    one_host = [cpu(0, "a", 0, 0.16, 12.9), cpu(1, "a", 1, 0.16, 13.9)]
    verdict = P.health_verdict(one_host, [])
    assert verdict["status"] == "healthy" and not verdict["findings"]
    assert "not compared between CPU ranks of one host" in verdict["notes"][0]
    # Their GEMMs still are: a quarter of the rate is named.
    slowed = [cpu(0, "a", 0, 0.16, 12.9), cpu(1, "a", 1, 0.04, 13.9)]
    (finding,) = P.health_verdict(slowed, [])["findings"]
    assert finding["rank"] == 1 and finding["metric"] == "bf16 GEMM TFLOPS"
    # CPU ranks on two hosts have memories of their own: compared as GPUs are.
    two_hosts = [cpu(0, "a", 0, 0.16, 12.9), cpu(1, "b", 0, 0.16, 13.9)]
    (finding,) = P.health_verdict(two_hosts, [])["findings"]
    assert finding["rank"] == 0 and finding["metric"] == "memory bandwidth GB/s"
    assert not P.health_verdict(two_hosts, [])["notes"]


def test_a_gpu_that_throttles_under_sustained_load_is_named():
    # Equal bursts, but GPU 1 keeps 20% less of its rate over the sustained run (power or
    # heat): named on the sustained metric. Two CPU ranks of one host that differ the same
    # way share cores and power: not compared, and the note says so.
    def sustained(rank, tflops, threads=None):
        return {**rank, "threads": threads,
                "gemm_sustained": [{"dtype": "bf16", "tflops": tflops, "burst_tflops": 800}]}
    gpus = [sustained(_rank(0, "a", 0, 800, 3000), 780),
            sustained(_rank(1, "a", 1, 800, 3000), 620),
            sustained(_rank(2, "a", 2, 800, 3000), 775)]
    (finding,) = P.health_verdict(gpus, [])["findings"]
    assert finding["rank"] == 1 and finding["metric"] == "bf16 sustained GEMM TFLOPS"
    assert finding["below_pct"] == pytest.approx(100 * (1 - 620 / 777.5), abs=0.1)
    cpus = [sustained(_rank(0, "a", 0, 0.16, 13), 0.16, threads=1),
            sustained(_rank(1, "a", 1, 0.16, 13), 0.12, threads=1)]
    verdict = P.health_verdict(cpus, [])
    assert not verdict["findings"]
    assert "sustained GEMM rates are not compared" in verdict["notes"][0]


def test_verdict_names_a_slow_node_group():
    def group(name, host, busbw):
        return P.collective_entry("all_reduce", name, "node", [0, 1], [host],
                                  [(1 << 20, (1 << 20) / (busbw * 1e9))])
    groups = [group("node 0", "a", 300), group("node 1", "b", 300), group("node 2", "c", 240)]
    verdict = P.health_verdict([], groups)
    (finding,) = verdict["findings"]
    assert finding["group"] == "node 2" and finding["hosts"] == ["c"]
    assert finding["below_pct"] == pytest.approx(20.0)


# --- planning without running ---------------------------------------------------------------

def test_slurm_dry_run_renders_the_probe_job(tmp_path):
    res = run_cli("probe", "--scale", "16", "--gpu", "h100", "--executor", "slurm",
                  "--dry-run", "--account", "acct", "--partition", "batch", "--gres", "gpu:8",
                  root=tmp_path)
    assert res.returncode == 0, res.stderr
    script = res.stdout
    assert "#SBATCH --nodes=2" in script and "TB_NPROC_PER_NODE=8" in script
    assert '-m trainbench.probe.worker "$TB_EXP_DIR/probe-plan.json"' in script
    assert "trainbench.engine" not in script
    assert "bf16, fp8" in script  # H100 has FP8: its GEMMs are probed too
    assert not (tmp_path / "probes").exists()


def test_a_refused_slurm_submission_leaves_nothing(tmp_path):
    # No sbatch on PATH (where Slurm is installed, nothing must reach the cluster): the
    # submission fails after the directory was made, and the directory goes again.
    bare = tmp_path / "bin"
    bare.mkdir()
    root = tmp_path / "root"
    root.mkdir()
    res = run_cli("probe", "--scale", "2", "--gpu", "cpu", "--executor", "slurm",
                  "--account", "acct", "--partition", "batch", "--root", str(root),
                  env={"PATH": str(bare)})
    assert res.returncode == 2, res.stdout + res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith("trainbench: error: sbatch not found")
    assert list(root.iterdir()) == []


BAD = [
    (["--scale", "0", "--gpu", "cpu"], {}, "--scale 0"),
    (["--scale", "2", "--gpu", "tpu9"], {}, "unknown GPU type 'tpu9'"),
    (["--scale", "2", "--gpu", "cpu", "--max-size", "lots"], {}, "--max-size 'lots'"),
    (["--scale", "2", "--gpu", "cpu", "--nodes", "2"], {}, "--executor slurm"),
    (["--scale", "2", "--gpu", "cpu"], {P.SLOW_RANK_ENV: "5:0.5"}, "rank 5 does not exist"),
    (["--scale", "2", "--gpu", "cpu"], {"ROOT_IS_A_FILE": "1"}, "is a file"),
]


@pytest.mark.parametrize("args,env,expected", BAD, ids=[b[2] for b in BAD])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, args, env, expected):
    root = tmp_path / "root"
    root.mkdir()
    if env.pop("ROOT_IS_A_FILE", None):
        (tmp_path / "file").write_text("x")
        root = tmp_path / "file" / "sub"
    before = sorted(p for p in tmp_path.rglob("*"))
    res = run_cli("probe", *args, "--root", str(root), env=env)
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trainbench: error: "), res.stderr
    assert expected in lines[0] and "Traceback" not in res.stderr
    assert sorted(p for p in tmp_path.rglob("*")) == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory")
def test_unwritable_root_is_refused(tmp_path):
    root = tmp_path / "ro"
    root.mkdir()
    root.chmod(0o555)
    try:
        res = run_cli("probe", "--scale", "2", "--gpu", "cpu", "--root", str(root))
    finally:
        root.chmod(0o755)
    assert res.returncode == 2
    assert res.stderr.startswith("trainbench: error: probe root") and "Traceback" not in res.stderr
    assert list(root.iterdir()) == []


@pytest.mark.slow
@pytest.mark.dist
def test_two_nodes_are_probed_across_nodes(tmp_path, monkeypatch):
    """Two torchrun agents on this machine stand for two nodes of one rank each (as srun
    starts them on Slurm): the ranks form the cross-node group and the all-ranks group."""
    import subprocess
    import sys

    from trainbench.launch.local import free_port
    from trainbench.launch.probe import ProbeRequest, plan_probe
    monkeypatch.setenv("TRAINBENCH_CONFIG", str(tmp_path / "none.yaml"))
    plan = plan_probe(ProbeRequest(scale=2, gpu="cpu", nodes=2, executor="slurm",
                                   root=tmp_path, max_size="2K", environ={})).plan
    assert (plan["nodes"], plan["ranks_per_node"]) == (2, 1)
    # Neither the copy nor the GEMMs are what this test is about: kept small.
    plan.update(memory_bytes=16 * P.MIB, dtypes=["fp32"], gemm_shapes=plan["gemm_shapes"][:1])
    (tmp_path / P.PLAN_FILE).write_text(json.dumps(plan))
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop(P.SLOW_RANK_ENV, None)
    agents = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=1", "--nnodes=2",
         f"--node-rank={node}", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
         "--rdzv-id=probe-test", "--max-restarts=0", "-m", "trainbench.probe.worker",
         str(tmp_path / P.PLAN_FILE)], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True) for node in (0, 1)]
    outputs = [a.communicate(timeout=300)[0] for a in agents]
    assert [a.returncode for a in agents] == [0, 0], "\n".join(outputs)[-3000:]
    prof = json.loads((tmp_path / P.PROFILE_FILE).read_text())
    assert prof["machine"]["nodes"] == 2
    assert [(r["rank"], r["node"], r["local_rank"]) for r in prof["ranks"]] == [(0, 0, 0),
                                                                                 (1, 1, 0)]
    # One rank per node: no node group has two members; the two groups that remain.
    assert [(c["group"], c["group_kind"], c["op"]) for c in prof["collectives"]] == [
        *(("local index 0 across nodes", "cross-node", op) for op in P.COLLECTIVES),
        *(("all ranks", "world", op) for op in P.COLLECTIVES)]
