"""predict --hardware (a probe profile's measured figures), measured catalog figures for GPU
types the seeds never measured, and the accuracy splits of bench/predict_accuracy.py.

tests/data/hardware/h100-made-up.json is hand-written: its numbers are MADE UP for these
tests, not a measurement. It describes 2 nodes x 8 H100 where rank 5 is the slowest GEMM
rank (600 bf16 TFLOPS, the others 700; fp8 1300 everywhere), node 1 the slowest all-reduce
node (300 GB/s bus bandwidth at 1 GiB, node 0 360), local index 3 the slowest cross-node
group (35 GB/s, the others 40) and node 1's 1 KiB all-reduce takes 48 us over 8 ranks.
"""

import copy
import importlib.util
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainbench.catalog import heldout, measured
from trainbench.cli import app
from trainbench.planning import build_plan
from trainbench.predict import hardware_profile as hp
from trainbench.predict.constants import default_constants, transfer_constants
from trainbench.predict.perf import predict_step
from trainbench.predict.device import device_for

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "tests" / "data" / "hardware" / "h100-made-up.json"
runner = CliRunner()


@pytest.fixture(autouse=True)
def cluster_config(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINBENCH_CONFIG", str(tmp_path / "cluster.yaml"))


def _bench():
    spec = importlib.util.spec_from_file_location("predict_accuracy",
                                                  ROOT / "bench" / "predict_accuracy.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_profile_figures_are_the_slowest_rank_node_and_link():
    facts = hp.read_facts(PROFILE)
    assert facts.gpu_type == "h100" and facts.ranks == 16 and facts.nodes == 2
    assert facts.gemm["bf16"][0] == 600.0 and "rank 5" in facts.gemm["bf16"][2]
    assert facts.gemm["fp8"][0] == 1300.0
    assert facts.intra_node_busbw_gbs == 300.0
    assert facts.network_gbs == 35.0
    assert facts.latency_us == pytest.approx(48.0 / 3)  # log2(8) steps of a log-depth collective


def test_profile_replaces_catalog_figures_and_halving_gemm_doubles_the_gemm_time(tmp_path):
    plan = build_plan("pretrain_llama3.1", "8b", "bf16", 16, "h100")
    base, base_fig = hp.predict_with_profile(plan, None, sharding="recipe", config={})
    pred, figures = hp.predict_with_profile(plan, hp.read_facts(PROFILE), sharding="recipe",
                                            config={})
    assert pred.constants["gemm_eff_bf16"] != base.constants["gemm_eff_bf16"]
    # 600 TFLOPS at a shape whose smallest side is 4096: eff * 4096/(4096+90) * 989 = 600.
    d = default_constants("h100").gemm_half_dim
    assert pred.constants["gemm_eff_bf16"] == pytest.approx(600 / (989 * 4096 / (4096 + d)))
    assert figures["gemm_eff_bf16"].startswith("measured: hardware profile")
    assert figures["network_gbs"].startswith("measured: hardware profile")
    assert base_fig["gemm_eff_bf16"].startswith("fitted to the seeds")

    data = json.loads(PROFILE.read_text())
    halved = copy.deepcopy(data)
    for rank in halved["ranks"]:
        for g in rank["gemm"]:
            if g["dtype"] == "bf16":
                g["tflops"] /= 2
    slow_path = tmp_path / "halved.json"
    slow_path.write_text(json.dumps(halved))
    slow, _ = hp.predict_with_profile(plan, hp.read_facts(slow_path), sharding="recipe",
                                      config={})
    assert slow.compute_breakdown["gemm"] == pytest.approx(2 * pred.compute_breakdown["gemm"])
    assert slow.compute_breakdown["attention"] == pytest.approx(
        pred.compute_breakdown["attention"])
    assert slow.step_time_s > pred.step_time_s


def test_profile_sustained_share_scales_the_gemm_efficiency(tmp_path):
    """A GEMM that keeps 80% of its burst rate over the probe's sustained run (made-up
    figures; rank 7 the worst) is charged 80% of the burst-derived efficiency; a share
    above 1 (timing noise) is taken as 1; a profile without the run keeps the burst figure
    and says so."""
    plan = build_plan("pretrain_llama3.1", "8b", "bf16", 16, "h100")
    burst, burst_fig = hp.predict_with_profile(plan, hp.read_facts(PROFILE), sharding="recipe",
                                               config={})
    assert "a burst rate: the profile has no sustained run" in burst_fig["gemm_eff_bf16"]
    data = json.loads(PROFILE.read_text())
    for rank in data["ranks"]:
        kept = {7: 0.8, 3: 1.2}.get(rank["rank"], 0.9)
        rank["gemm_sustained"] = [{"dtype": "bf16", "shape": "Llama 3.1 70B MLP up",
                                   "m": 8192, "k": 8192, "n": 28672, "burst_tflops": 700.0,
                                   "tflops": 700.0 * kept, "seconds": 10.0}]
    path = tmp_path / "sustained.json"
    path.write_text(json.dumps(data))
    facts = hp.read_facts(path)
    assert facts.sustained["bf16"][0] == pytest.approx(0.8) and "rank 7" in facts.sustained[
        "bf16"][2]
    pred, figures = hp.predict_with_profile(plan, facts, sharding="recipe", config={})
    assert pred.constants["gemm_eff_bf16"] == pytest.approx(
        0.8 * burst.constants["gemm_eff_bf16"])
    assert "x 0.800, the share of its burst rate kept over a 10 s sustained run, rank 7" in \
        figures["gemm_eff_bf16"]
    assert "fp8" not in facts.sustained  # fp8 keeps its burst figure
    for rank in data["ranks"]:
        rank["gemm_sustained"][0]["tflops"] = 750.0  # faster than the burst: noise
    path.write_text(json.dumps(data))
    assert hp.read_facts(path).sustained["bf16"][0] == 1.0


def _with_attention(tmp_path, tflops_by_rank: dict[int, float], name="attention.json"):
    """The made-up profile with a causal-attention figure on every rank (made-up too)."""
    data = json.loads(PROFILE.read_text())
    for rank in data["ranks"]:
        rate = tflops_by_rank.get(rank["rank"], 450.0)
        rank["attention"] = {"name": "Llama 3.1 8B attention", "seq": 8192, "heads": 32,
                             "kv_heads": 8, "head_dim": 128, "dtype": "bf16",
                             "time_s": 6 * 8192 ** 2 * 32 * 128 / rate / 1e12,
                             "tflops": rate}
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_profile_attention_sets_the_attention_efficiency(tmp_path):
    """The slowest rank's causal attention (rank 3 here, 400 TFLOPS at seq 8192) becomes
    attn_eff = 400 / (989 x 8192 / (8192 + attn_half_len)); doubling every rank's rate
    halves the predicted attention time and leaves the GEMMs; a profile without attention
    keeps the catalog's and says so; one above the BF16 peak is refused."""
    plan = build_plan("pretrain_llama3.1", "8b", "bf16", 16, "h100")
    facts = hp.read_facts(_with_attention(tmp_path, {3: 400.0}))
    assert facts.attention[:2] == (400.0, 8192) and "rank 3" in facts.attention[2]
    pred, figures = hp.predict_with_profile(plan, facts, sharding="recipe", config={})
    half = default_constants("h100").attn_half_len
    assert pred.constants["attn_eff"] == pytest.approx(400 / (989 * 8192 / (8192 + half)))
    assert figures["attn_eff"].startswith("measured: hardware profile")
    fast = hp.read_facts(_with_attention(tmp_path, {r: 800.0 for r in range(16)}, "fast.json"))
    quick, _ = hp.predict_with_profile(plan, fast, sharding="recipe", config={})
    assert quick.compute_breakdown["attention"] == pytest.approx(
        pred.compute_breakdown["attention"] * 400 / 800)
    assert quick.compute_breakdown["gemm"] == pytest.approx(pred.compute_breakdown["gemm"])
    plain, plain_figures = hp.predict_with_profile(plan, hp.read_facts(PROFILE),
                                                   sharding="recipe", config={})
    assert plain.constants["attn_eff"] == default_constants("h100").attn_eff
    assert plain_figures["attn_eff"].startswith("not in the profile")
    too_fast = hp.read_facts(_with_attention(tmp_path, {r: 2000.0 for r in range(16)},
                                             "bad.json"))
    with pytest.raises(hp.HardwareProfileError, match="above the .* BF16 peak"):
        hp.predict_with_profile(plan, too_fast, sharding="recipe", config={})


def _profile_with_scan(path: Path, rates: dict[int, float]) -> Path:
    """The made-up H100 profile with a Mamba-2 scan rate per rank (150 TFLOPS where
    `rates` names none), written to `path`."""
    data = json.loads(PROFILE.read_text())
    for rank in data["ranks"]:
        rank["scan"] = {"name": "Nemotron-H 56B SSD scan (one TP8 rank)", "dtype": "bf16",
                        "implementation": "mamba_ssm Triton kernel",
                        "tflops": rates.get(rank["rank"], 150.0)}
    path.write_text(json.dumps(data))
    return path


def test_profile_scan_sets_the_scan_efficiency(tmp_path):
    """The slowest rank's Mamba-2 scan (made-up: rank 2 at 98.9 TFLOPS, a tenth of the
    BF16 peak) replaces the scan's derivation (its matmuls and its kernels' traffic) with
    scan_eff; doubling every rank's rate halves the predicted scan time; above the peak it
    is refused."""
    def with_scan(rates: dict[int, float], name: str):
        return hp.read_facts(_profile_with_scan(tmp_path / name, rates))
    plan = build_plan("pretrain_nemotronh", "56b", "fp8", 32, "h100")
    facts = with_scan({2: 98.9}, "scan.json")
    assert facts.scan[0] == 98.9 and "rank 2" in facts.scan[1]
    pred, figures = hp.predict_with_profile(plan, facts, sharding="recipe", config={})
    assert pred.constants["scan_eff"] == pytest.approx(0.1)
    assert figures["scan_eff"].startswith("measured: hardware profile")
    fast = with_scan({r: 197.8 for r in range(16)}, "fast.json")
    quick, _ = hp.predict_with_profile(plan, fast, sharding="recipe", config={})
    assert quick.compute_breakdown["scan"] == pytest.approx(pred.compute_breakdown["scan"] / 2)
    derived, plain = hp.predict_with_profile(plan, hp.read_facts(PROFILE), sharding="recipe",
                                             config={})
    assert plain["scan_eff"].startswith("not in the profile")
    # The measured rate covers the scan's traffic too: it leaves the memory-bound part.
    assert derived.constants["scan_eff"] == 0
    assert (pred.compute_breakdown["memory_bound"]
            < 0.9 * derived.compute_breakdown["memory_bound"])
    with pytest.raises(hp.HardwareProfileError, match="scan .* above the .* BF16 peak"):
        hp.predict_with_profile(plan, with_scan({r: 2000.0 for r in range(16)}, "bad.json"),
                                sharding="recipe", config={})


def test_predict_names_where_the_scan_efficiency_comes_from_only_where_it_is_used(tmp_path):
    """The scan is derived from its arithmetic on every GPU type, with no constant fitted
    to a workload: predict says so for Nemotron-H on the H100 and on a GPU no Nemotron-H
    recipe was measured on, names the probe that would measure it, says nothing of it for
    a model without the scan, and a profile with a measured scan replaces the label."""
    def figures(workload, size, gpu, *extra):
        res = runner.invoke(app, ["predict", "-w", workload, "-s", size, "--scale", "64",
                                  "--gpu", gpu, "--format", "json", *extra])
        assert res.exit_code == 0, res.output
        return json.loads(res.stdout)["hardware_figures"]
    h100 = figures("pretrain_nemotronh", "56b", "h100")["scan_eff"]
    b200 = figures("pretrain_nemotronh", "56b", "b200")["scan_eff"]
    assert h100 == b200 and h100.startswith("derived: the SSD kernels' matmuls")
    assert "no constant fitted" in h100 and "trainbench probe" in h100
    assert "scan_eff" not in figures("pretrain_llama3.1", "8b", "b200")
    profile = _profile_with_scan(tmp_path / "scan.json", {})
    measured_scan = figures("pretrain_nemotronh", "56b", "h100", "--hardware", str(profile))
    assert measured_scan["scan_eff"].startswith("measured: hardware profile")
    plain = figures("pretrain_nemotronh", "56b", "h100", "--hardware", str(PROFILE))
    assert plain["scan_eff"] == "not in the profile: " + h100


def test_cli_hardware_json_and_bad_profiles(tmp_path):
    args = ["predict", "-w", "pretrain_llama3.1", "-s", "8b", "--dtype", "bf16", "--scale",
            "16", "--format", "json"]
    res = runner.invoke(app, [*args, "--hardware", str(PROFILE)])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["hardware_profile"] == str(PROFILE)
    assert data["hardware_figures"]["intra_node_busbw_gbs"].startswith("measured: hardware")

    wrong = tmp_path / "old.json"
    wrong.write_text(json.dumps({"schema": 0, "ranks": []}))
    other_gpu = tmp_path / "b200.json"
    data = json.loads(PROFILE.read_text())
    data["machine"]["gpu_type"] = "b200"
    other_gpu.write_text(json.dumps(data))
    cpu = tmp_path / "cpu.json"
    data["machine"]["gpu_type"] = "cpu"
    cpu.write_text(json.dumps(data))
    # A node's telemetry as the probe records it on its local rank 0, here with a second
    # process on GPU 3 while the figures were timed.
    shared = tmp_path / "shared.json"
    data = json.loads(PROFILE.read_text())
    data["ranks"][0]["telemetry"] = {"source": "nvml", "gpu_processes_max": [1, 1, 1, 2],
                                     "shared_gpus": [3], "throttled": False}
    shared.write_text(json.dumps(data))
    for bad, words in ((tmp_path / "missing.json", "no such file"),
                       (wrong, "schema 0"),
                       (other_gpu, "measured on b200"),
                       (cpu, "measured on a CPU"),
                       (shared, "another process used GPUs while the probe timed them")):
        res = runner.invoke(app, [*args, "--hardware", str(bad)])
        assert res.exit_code == 2, res.output
        lines = [line for line in res.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("trainbench: error: ")
        assert words in lines[0] and "Traceback" not in res.output


def test_non_seed_gpu_uses_measured_figures_with_their_source():
    plan = build_plan("pretrain_llama3.1", "8b", "bf16", 8, "h200")
    _, figures = hp.predict_with_profile(plan, None, config={})
    assert figures["network_gbs"].startswith("measured: ") and "hardware.md" in figures[
        "network_gbs"]
    h200 = measured.measured_for("h200")
    assert h200.intra_node_busbw_gbs.value == 370.0 and h200.intra_node_busbw_gbs.source
    assert figures["gemm_eff_bf16"].startswith("measured:") and "ml-engineering" in figures[
        "gemm_eff_bf16"]
    b200_plan = build_plan("pretrain_llama3.1", "8b", "fp8", 8, "b200")
    b200_pred, b200 = hp.predict_with_profile(b200_plan, None, config={})
    # NVLink 5 inside a B200 node: ml-engineering's all_reduce_bench.py at 64 MiB, 400.60
    # GB/s on 8 x B200 against 346.51 on 8 x H200, carried as a ratio to H100's 370.
    assert b200["intra_node_busbw_gbs"].startswith("measured:")
    assert device_for("b200").intra_node_busbw_gbs == pytest.approx(370 * 400.60 / 346.51,
                                                                     abs=0.5)
    # No small-message time of a Blackwell system measured as DGX H100's was.
    assert b200["collective_latency_us"].startswith("assumed:")
    # The MAMF table's B200 and H100 rows (1745.0 of 2250, 794.5 of 989 BF16 TFLOPS; 3432.5
    # of 4500, 1402.6 of 1979 FP8) scale the H100-fitted efficiency, per dtype, B200's at
    # the clock it holds under sustained load (1580 of 1965 MHz, flashinfer PR #2899).
    h100 = default_constants("h100")
    clock = 1580 / 1965
    assert b200_pred.constants["gemm_eff_bf16"] == pytest.approx(
        h100.gemm_eff_bf16 * (1745.0 * clock / 2250) / (794.5 / 989), rel=1e-4)
    assert b200_pred.constants["gemm_eff_fp8"] == pytest.approx(
        h100.gemm_eff_fp8 * (3432.5 * clock / 4500) / (1402.6 / 1979), rel=1e-4)
    assert "1580 / 1965 MHz" in b200["gemm_eff_fp8"]
    # GB200's FP8 GEMM sustained after 10,000 warm-up iterations (Azure's benchmark guide:
    # 2906.9 TFLOPS) is divided by the same benchmark's H100 (1382.2), not MAMF's burst H100.
    gb200_pred, gb200 = hp.predict_with_profile(
        build_plan("pretrain_llama3.1", "8b", "fp8", 8, "gb200"), None, config={})
    assert gb200_pred.constants["gemm_eff_fp8"] == pytest.approx(
        h100.gemm_eff_fp8 * (2906.9 / 4900) / (1382.2 / 1979))
    assert "in the same benchmark" in gb200["gemm_eff_fp8"]
    # GB300's only GEMM figure is the same harness's FP8 run (a fork of Azure's guide:
    # 3308.5 TFLOPS), also against its H100; its BF16 has none.
    gb300_pred, gb300_fp8 = hp.predict_with_profile(
        build_plan("pretrain_llama3.1", "8b", "fp8", 8, "gb300"), None, config={})
    assert gb300_pred.constants["gemm_eff_fp8"] == pytest.approx(
        h100.gemm_eff_fp8 * (3308.5 / 4900) / (1382.2 / 1979))
    assert gb300_fp8["gemm_eff_fp8"].startswith("measured:")
    # No public BF16 GEMM figure for GB300: None with a reason, and predict says it assumes.
    gb300 = measured.measured_for("gb300")
    assert gb300.gemm_tflops["bf16"].value is None and gb300.gemm_tflops["bf16"].reason
    _, gb300_fig = hp.predict_with_profile(
        build_plan("pretrain_llama3.1", "8b", "bf16", 8, "gb300"), None, config={})
    assert gb300_fig["gemm_eff_bf16"].startswith("assumed:")
    for entry in measured.MEASURED.values():
        for fig in (*entry.gemm_tflops.values(), entry.intra_node_busbw_gbs, entry.network_gbs,
                    entry.collective_latency_us):
            assert (fig.value is not None and fig.source) or (fig.value is None and fig.reason)


def test_attention_efficiency_is_carried_by_the_measured_attention_rate():
    """cudnn-frontend's causal BF16 attention runs at Llama 3.1's shape, sequence 8192
    (catalog.measured CUDNN_SDPA): the fwd + bwd rate is both passes' FLOPs over both
    times. The rows' raw numbers are restated here from the CSVs."""
    def rate(fwd_ms, fwd_tflops, bwd_ms, bwd_tflops):
        return (fwd_ms * fwd_tflops + bwd_ms * bwd_tflops) / (fwd_ms + bwd_ms)

    hopper = rate(1.708, 644, 5.083, 541)        # H200, cuDNN 9.19
    gb200 = rate(0.688, 1598, 2.097, 1311)        # GB200, cuDNN 9.19
    gb300 = rate(0.583, 1887, 1.985, 1385)        # GB300, cuDNN 9.19
    assert measured.measured_for("h100").attention_tflops.value == pytest.approx(hopper, abs=0.1)
    h100 = default_constants("h100")
    plan = build_plan("pretrain_llama3.1", "8b", "fp8", 8, "gb300")
    pred, figures = hp.predict_with_profile(plan, None, config={})
    # GB300 reaches 0.61 of its BF16 peak where Hopper reaches 0.57: attention is charged
    # 7% above the peak-scaled rate, not the H100 fraction of GB300's peak.
    expected = h100.attn_eff * (gb300 / 2450) / (hopper / 989)
    assert pred.constants["attn_eff"] == pytest.approx(expected, rel=1e-3)
    assert expected > 1.06 * h100.attn_eff
    assert figures["attn_eff"].startswith("measured:") and "cudnn-frontend" in figures["attn_eff"]
    gb200_pred, _ = hp.predict_with_profile(
        build_plan("pretrain_llama3.1", "8b", "fp8", 8, "gb200"), None, config={})
    assert gb200_pred.constants["attn_eff"] == pytest.approx(
        h100.attn_eff * (gb200 / 2450) / (hopper / 989), rel=1e-3)
    # B200's only run is of older cuDNN than Hopper's: no ratio, the H100 fraction, and the
    # label says why.
    b200_pred, b200 = hp.predict_with_profile(
        build_plan("pretrain_llama3.1", "8b", "fp8", 8, "b200"), None, config={})
    assert b200_pred.constants["attn_eff"] == pytest.approx(h100.attn_eff)
    assert b200["attn_eff"].startswith("assumed:") and "cuDNN 9.13.1" in b200["attn_eff"]
    # No published run for B300: the H100 fraction, labelled an assumption.
    _, b300 = hp.predict_with_profile(build_plan("pretrain_llama3.1", "8b", "fp8", 8, "b300"),
                                      None, config={})
    assert b300["attn_eff"].startswith("assumed:")
    # A calibration of attn_eff in the cluster config wins, and says so.
    cfg = {"calibration": {"gb300": {"attn_eff": 0.3}}}
    calibrated, labels = hp.predict_with_profile(plan, None, config=cfg)
    assert calibrated.constants["attn_eff"] == 0.3
    assert labels["attn_eff"].startswith("calibrated")


def test_b200_and_gb200_reach_other_nodes_through_one_400g_nic_per_gpu():
    """NVIDIA's MLPerf Training system descriptions: DGX B200 '8x ConnectX-7 IB NDR
    400Gb/s', GB200 NVL72 '4x ConnectX-7 IB NDR 400 Gb/s' per 4-GPU node, GB300 NVL72 '4x
    ConnectX-8 IB XDR 800 Gb/s': the same NIC per GPU as DGX H100 on B200 and GB200 (45 GB/s
    bus bandwidth, ../shared/reference/hardware.md), twice it on GB300."""
    from trainbench.predict.device import device_for
    h100 = device_for("h100")
    for gpu in ("b200", "gb200"):
        dev = device_for(gpu)
        assert dev.network_gbs == h100.network_gbs == 45.0
        label = dict(dev.figures)["network_gbs"]
        assert label.startswith("measured:") and "ConnectX-7" in label
    assert device_for("gb300").network_gbs == 2 * h100.network_gbs


def test_leave_one_workload_out_refits_without_the_group():
    bench = _bench()
    runs = [r for r in bench.seed_runs()
            if r.source in ("pretrain_nemotronh", "pretrain_nemotron4")]
    names = ("hbm_eff", "gemm_eff_fp8")
    full, full_set, none_held = bench.refit(runs, sweeps=1, names=names)
    out, fit_set, held = bench.refit(runs, lambda r: r.source == "pretrain_nemotronh",
                                     sweeps=1, names=names)
    assert not none_held and len(full_set) == len(runs)
    assert held and all(r.source == "pretrain_nemotronh" for r in held)
    assert fit_set and not any(r.source == "pretrain_nemotronh" for r in fit_set)
    # Nemotron-H spends a third of its step in memory-bound kernels (the scan's traffic):
    # leaving it out changes what the fit sets hbm_eff to.
    assert abs(out.hbm_eff / full.hbm_eff - 1) > 0.01
    # The scan itself has no constant to fit: it is derived (constants.scan_eff).
    assert "scan_eff" not in __import__("trainbench.predict.calibrate",
                                        fromlist=["BOUNDS"]).BOUNDS


def test_held_out_rows_are_not_seed_cells_have_sources_and_are_predicted():
    from trainbench.catalog.references import REFERENCES
    bench = _bench()
    seed_cells = {(r.workload, r.size, r.dtype, r.gpu_type, r.gpus, r.step_time_s)
                  for r in REFERENCES}
    assert {r.gpu_type for r in heldout.HELD_OUT} >= {"b200", "gb200", "gb300"}
    for row in heldout.HELD_OUT:
        assert row.source and row.step_time_s > 0
        assert (row.workload, row.size, row.dtype, row.gpu_type, row.gpus,
                row.step_time_s) not in seed_cells
        if row.tokens_per_s_per_gpu:
            # step = GBS x seq / (tokens/s/GPU x GPUs), the tables' own definition
            assert row.step_time_s * row.tokens_per_s_per_gpu * row.gpus == pytest.approx(
                row.gbs * row.seq_len)
    # A refit on the seed cells cannot reach a held-out row: fit() keeps one GPU type's runs.
    rows = bench.predict_heldout(default_constants("h100"))
    assert len(rows) == len(heldout.HELD_OUT)
    assert all(r["predicted_s"] > 0 for r in rows)


def test_same_layout_pairs_compare_gpu_types_within_one_table():
    bench = _bench()
    # Every row "predicted" 1.2x its measured time, except GB300's, predicted exactly.
    rows = [{"row": r.key, "source": r.source, "measured_s": r.step_time_s,
             "predicted_s": r.step_time_s * (1.0 if r.gpu_type == "gb300" else 1.2)}
            for r in heldout.HELD_OUT]
    pairs = bench.same_layout_pairs(rows)
    eight_b = [p for p in pairs if p["gpus"] == "gb200/gb300" and " 8b " in p["row"]
               and "@5776a6d" in p["source"]]
    assert len(eight_b) == 1
    pair = eight_b[0]
    # Megatron-Bridge 25.11, Llama 3 8B on 8 GPUs, same layout: 31508 tokens/s/GPU on GB200,
    # 37556 on GB300, so GB200's step is 37556 / 31508 times GB300's.
    assert pair["measured_ratio"] == pytest.approx(37556 / 31508)
    assert pair["predicted_ratio"] == pytest.approx(1.2 * 37556 / 31508)
    # Errors +20% and 0%: mean 10%; one common scale can at best split the 1.2 ratio.
    assert pair["mean_abs_error_pct"] == pytest.approx(10.0)
    assert pair["floor_pct"] == pytest.approx(50 * (1 - 1 / 1.2))
    # Only rows of one table and one layout pair up: no pair spans two releases or layouts.
    for p in pairs:
        a, b = p["gpus"].split("/")
        assert p["row"].split(f"x{a} ")[1] in {r.key.split(f"x{b} ")[1] for r in heldout.HELD_OUT
                                                  if r.gpu_type == b and r.source == p["source"]}
    # Two GPU types that never share a table and layout give no pair.
    assert not [p for p in pairs if "h100" in p["gpus"]]


def test_release_blind_floor_is_the_best_single_prediction():
    bench = _bench()
    # 1 s, 1 s, 2 s: predicting 1 s errs +0, +0, -50% (mean 1/6); 2 s errs +100, +100, 0
    # (mean 2/3); anything between is worse than 1 s. One time alone needs no spread.
    assert bench.release_blind_floor([1.0, 1.0, 2.0]) == pytest.approx(1 / 6)
    assert bench.release_blind_floor([3.0]) == 0.0
    spread = bench.release_spread()
    assert spread["rows"] >= 2 * spread["configurations"] > 0
    assert 0 < spread["floor_pct"] < 100


def test_recipe_activation_offload_is_per_row_and_lowers_only_those_rows_memory():
    bench = _bench()
    by = {(r.source, r.gpu_type, r.size, r.fsdp): r for r in heldout.HELD_OUT}
    # Megatron-Bridge's 70B FP8-CS recipes (llama3_workload_base_configs.py, v0.3.0):
    # cpu_offloading_num_layers=20 on GB300, 40 on GB200; NeMo v2.4.0's GB200 CSV: 95 for
    # the 405B FSDP row; the 405B TP4 PP16 recipe (use_megatron_fsdp=False) offloads none.
    assert heldout.offload_layers(by[(heldout.MB_2602, "gb300", "70b", True)]) == 20
    assert heldout.offload_layers(by[(heldout.MB_2602, "gb200", "70b", True)]) == 40
    assert heldout.offload_layers(by[(heldout.NEMO_2507_GB200, "gb200", "405b", True)]) == 95
    assert heldout.offload_layers(by[(heldout.MB_2602, "gb200", "405b", False)]) == 0
    # TE's fused loss: Megatron-Bridge's Llama providers and perf overrides, NeMo's perf
    # helpers from v2.4.0 (25.07) only.
    assert heldout.te_cross_entropy(by[(heldout.MB_2509, "gb200", "70b", True)])
    assert heldout.te_cross_entropy(by[(heldout.NEMO_2507_GB200, "gb200", "70b", True)])
    assert not heldout.te_cross_entropy(by[(heldout.NEMO_2504_GB200, "gb200", "70b", True)])
    verdicts = {(v["source"], v["row"]): v
                for v in bench.memory_verdicts(default_constants("h100"))}
    for row in (by[(heldout.MB_2602, "gb200", "70b", True)],
                by[(heldout.NEMO_2507_GB200, "gb200", "70b", True)],
                by[(heldout.NEMO_2504_GB200, "gb200", "70b", True)],
                by[(heldout.MB_2602, "gb200", "405b", False)]):
        total = predict_step(bench.heldout_plan(row), sharding="fsdp" if row.fsdp else
                             "distributed_optimizer",
                             constants=transfer_constants(default_constants("h100"),
                                                          row.gpu_type)[0]).memory.total
        got = verdicts[(row.source, row.key)]["predicted_gib"] * 2**30
        if heldout.offload_layers(row):
            # 40 of 80 layers in host memory: close to half the activations come off.
            assert got < 0.75 * total
        elif heldout.te_cross_entropy(row) and row.pp == 1:
            # The loss's 10 B per logit become 2: 8 x 8192 x 128256 B at MBS 1.
            assert total - got == pytest.approx(8 * 8192 * 128256, rel=0.1)
        else:
            # No recipe fact applies (or, under PP16, rank 0 holds no logits).
            assert got == pytest.approx(total)


def test_search_ranks_layouts_with_the_profile_figures():
    from trainbench.predict.search import search
    facts = hp.read_facts(PROFILE)
    device, constants = hp.device_and_constants("h100", None, facts, {})
    result = search("pretrain_llama3.1", "8b", "bf16", 16, "h100", config={},
                    sharding="engine", device=device, constants=constants)
    plain = search("pretrain_llama3.1", "8b", "bf16", 16, "h100", config={}, sharding="engine")
    best = result.ranked[0]
    # The same plan predicted alone with the profile gets the search's figure...
    alone, _ = hp.predict_with_profile(best.plan, facts, sharding="engine", config={})
    assert best.prediction.step_time_s == pytest.approx(alone.step_time_s)
    # ...and the profile's slower GEMMs (600 of 989 TFLOPS) make every layout slower.
    plain_by_key = {c.describe(): c.prediction.step_time_s for c in plain.ranked}
    both = [c for c in result.ranked if c.describe() in plain_by_key]
    assert len(both) >= 5
    assert all(c.prediction.step_time_s > plain_by_key[c.describe()] for c in both)
