"""Run conditions and telemetry (issue #17 items 1-2): what collect() records on this
machine, that no secret reaches any file a real run writes, the NVML throttle-reason
decoding, the CPU sampler, and what `results` makes of run.json's telemetry."""

from __future__ import annotations

import glob
import json
import os
import platform
import shutil
import socket
from pathlib import Path

import pytest
import torch

from trainbench import conditions
from trainbench.engine import telemetry
from trainbench.results.summary import summarize_experiment

from helpers import read_metrics, train

SECRETS = {"HF_TOKEN": "hf_secretvalue123",
           "NCCL_SOCKET_PASSWORD": "xyzsecret987",
           # a credential inside an otherwise harmless recorded variable
           "TORCH_HUB_URL": "https://alice:pw4secret55@hub.example.org/models"}


def _has_gpu() -> bool:
    return bool(glob.glob("/dev/nvidia[0-9]*"))


# --- collect() on this machine ---------------------------------------------------------

def test_collect_records_this_machine():
    info = conditions.collect()
    assert info["schema"] == 1
    assert info["torch"] == torch.__version__
    assert info["python"] == platform.python_version()
    assert info["cuda"] == torch.version.cuda
    assert info["cpu"]["cores"] == os.cpu_count()
    assert info["cpu"]["threads_per_rank"] == torch.get_num_threads()
    # sysinfo's total RAM, the figure /proc/meminfo's MemTotal also reports
    assert info["memory_bytes"] == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert platform.release() in info["host"]["kernel"]
    assert info["host"]["hostname"] == platform.node()
    cpuinfo = Path("/proc/cpuinfo").read_text()
    assert info["cpu"]["model"] and info["cpu"]["model"] in cpuinfo
    assert ("avx2" in info["cpu"]["flags"]) == (" avx2" in cpuinfo)
    json.dumps(info)  # it goes into run.json as it is
    if not _has_gpu():
        assert info["gpus"] == [] and info["topology"] is None
        assert any(m.startswith("gpus:") and "NVML" in m for m in info["missing"]), \
            info["missing"]
        assert any(m.startswith("topology:") for m in info["missing"])
    if torch.version.cuda is None:
        assert info["cudnn"] is None and info["nccl"] is None
        assert any("CPU build" in m for m in info["missing"])


# --- redaction -------------------------------------------------------------------------

def test_only_listed_prefixes_are_recorded_and_secrets_redacted():
    environ = {
        "NCCL_IB_HCA": "mlx5",
        "OMP_NUM_THREADS": "4",
        "NVTE_FUSED_ATTN": "1",
        "CUDA_DEVICE_MAX_CONNECTIONS": "1",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "NCCL_SOCKET_PASSWORD": "xyz",
        "nccl_api_key": "lowercase-name-is-still-a-secret",  # not a prefix: not recorded
        "NCCL_AUTH_COOKIE": "abc",
        "TORCH_KEYFILE": "/etc/key.pem",
        "CUDA_CACHE_PATH": "/home/u/hf_abcdefghijklmnop/cache",
        "TORCH_HUB_URL": "https://alice:pw4secret55@hub.example.org/models",
        "NVTE_NOTE": "ghp_abcdefghijklmnopqrstuvwx",
        "HF_TOKEN": "hf_secretvalue123",
        "PATH": "/usr/bin",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    }
    assert conditions.recorded_env(environ) == {
        "CUDA_CACHE_PATH": "/home/u/<redacted>/cache",
        "CUDA_DEVICE_MAX_CONNECTIONS": "1",
        "NCCL_AUTH_COOKIE": "<redacted>",
        "NCCL_IB_HCA": "mlx5",
        "NCCL_SOCKET_PASSWORD": "<redacted>",
        "NVTE_FUSED_ATTN": "1",
        "NVTE_NOTE": "<redacted>",
        "OMP_NUM_THREADS": "4",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "TORCH_HUB_URL": "https://alice:<redacted>@hub.example.org/models",
        "TORCH_KEYFILE": "<redacted>",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    }


def test_slurm_facts_from_the_job_environment():
    environ = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "gpu[001-004]",
               "SLURM_NNODES": "4", "SLURM_NTASKS": "32", "SLURM_JOB_PARTITION": "batch",
               "SLURM_CLUSTER_NAME": "eos", "SLURM_JOB_NAME": "not asked for"}
    assert conditions.slurm_facts(environ) == {
        "job_id": "4242", "nodelist": "gpu[001-004]", "nnodes": "4", "ntasks": "32",
        "partition": "batch", "cluster": "eos"}
    assert conditions.slurm_facts({}) == {}


# --- NVML clock-event (throttle) reasons ------------------------------------------------

try:
    import pynvml
    BITS = {"idle": pynvml.nvmlClocksThrottleReasonGpuIdle,
            "app": pynvml.nvmlClocksThrottleReasonApplicationsClocksSetting,
            "power": pynvml.nvmlClocksThrottleReasonSwPowerCap,
            "hw": pynvml.nvmlClocksThrottleReasonHwSlowdown,
            "sync": pynvml.nvmlClocksThrottleReasonSyncBoost,
            "sw_thermal": pynvml.nvmlClocksThrottleReasonSwThermalSlowdown,
            "hw_thermal": pynvml.nvmlClocksThrottleReasonHwThermalSlowdown,
            "brake": pynvml.nvmlClocksThrottleReasonHwPowerBrakeSlowdown,
            "display": pynvml.nvmlClocksThrottleReasonDisplayClockSetting}
except ImportError:
    # nvml.h, "Clocks Event Reasons" (NVML API Reference Manual, group
    # nvmlClocksEventReasons): GpuIdle 0x1, ApplicationsClocksSetting 0x2,
    # SwPowerCap 0x4, HwSlowdown 0x8, SyncBoost 0x10, SwThermalSlowdown 0x20,
    # HwThermalSlowdown 0x40, HwPowerBrakeSlowdown 0x80, DisplayClockSetting 0x100.
    BITS = {"idle": 0x1, "app": 0x2, "power": 0x4, "hw": 0x8, "sync": 0x10,
            "sw_thermal": 0x20, "hw_thermal": 0x40, "brake": 0x80, "display": 0x100}


@pytest.mark.parametrize("slowdown,name", [
    ("power", "sw power cap"), ("hw", "hw slowdown"), ("sw_thermal", "sw thermal slowdown"),
    ("hw_thermal", "hw thermal slowdown"), ("brake", "hw power brake slowdown")])
def test_a_real_slowdown_is_throttling(slowdown, name):
    names, throttled = telemetry.decode_clock_reasons(BITS[slowdown] | BITS["idle"])
    assert throttled
    assert sorted(names) == sorted([name, "gpu idle"])
    assert telemetry.slowdown_names(BITS[slowdown] | BITS["sync"]) == [name]


def test_idle_sync_boost_and_app_clocks_are_not_throttling():
    mask = BITS["idle"] | BITS["sync"] | BITS["app"] | BITS["display"]
    names, throttled = telemetry.decode_clock_reasons(mask)
    assert not throttled
    assert sorted(names) == ["applications clocks setting", "display clock setting",
                             "gpu idle", "sync boost"]
    assert telemetry.decode_clock_reasons(0) == ([], False)
    assert telemetry.decode_clock_reasons(0x4000)[0] == ["unknown reason bits 0x4000"]


# --- the CPU sampler and the job-wide summary -------------------------------------------

def _assert_cpu_telemetry_truthful(summary: dict) -> None:
    """What the summary says was (not) measured matches what this machine's /sys has."""
    missing = " | ".join(summary["missing"])
    freq = glob.glob("/sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_cur_freq")
    assert ("scaling_cur_freq" in missing) == (not freq)
    assert (summary["cpu_clock_mhz"] is None) == (not freq)
    temps = glob.glob("/sys/class/thermal/thermal_zone*/temp")
    assert ("thermal_zone" in missing) == (not temps)
    assert (summary["temperature_c"] is None) == (not temps)
    rapl = [p for p in glob.glob("/sys/class/powercap/intel-rapl:*/energy_uj")
            if os.access(p, os.R_OK)]
    if not rapl:
        assert summary["energy_j"] is None and "energy:" in missing
    if not glob.glob("/sys/devices/system/cpu/cpu[0-9]*/thermal_throttle/*_throttle_count"):
        assert summary["throttled"] is None and "thermal_throttle" in missing
    assert summary["sm_clock_mhz"] is None and summary["power_w"] is None


def test_cpu_sampler_records_what_this_machine_offers():
    sampler = telemetry.Sampler("cpu", interval_s=0.01)
    sampler.start()
    x = torch.randn(256, 256)
    for _ in range(20):  # some work while the thread samples
        x = (x @ x).tanh()
    step = sampler.step_summary()
    summary = sampler.stop()
    assert summary["source"] == "cpu sysfs"
    assert summary["samples"] >= 2  # one at the start, one at the stop at least
    assert 1 <= step["samples"] < summary["samples"]
    assert ("cpu_clock_mhz" in step) == (summary["cpu_clock_mhz"] is not None)
    _assert_cpu_telemetry_truthful(summary)


@pytest.mark.skipif(_has_gpu(), reason="checks a machine without NVIDIA GPUs")
def test_gpu_sampler_without_nvml_says_so_and_never_raises():
    sampler = telemetry.Sampler("cuda")
    sampler.start()
    assert sampler.step_summary() is None
    summary = sampler.stop()
    assert summary["source"] is None and summary["samples"] == 0
    assert summary["energy_j"] is None and summary["throttled"] is None
    assert any(m.startswith("telemetry:") and "NVML" in m for m in summary["missing"]), \
        summary["missing"]


def test_combine_sums_energy_over_nodes_or_says_why_not():
    node = {"source": "nvml", "energy_j": 100.0, "energy_covers": "8 GPU(s) of this node",
            "throttled": False, "throttle_reasons": [], "missing": []}
    whole = telemetry.combine(node, 400.0, nodes=4, nodes_with_energy=4, nodes_throttled=0,
                              tokens=8000)
    assert whole["energy_j"] == 400.0
    assert whole["energy_per_token_j"] == 0.05
    assert "summed over 4 node(s)" in whole["energy_covers"]
    assert whole["throttled"] is False
    part = telemetry.combine(node, 300.0, nodes=4, nodes_with_energy=3, nodes_throttled=1,
                             tokens=8000)
    assert part["energy_j"] is None and part["energy_per_token_j"] is None
    assert "only 3 of 4 node(s)" in part["missing"][-1]
    assert part["throttled"] is True and "1 of 4 node(s) throttled" in part["throttle_reasons"]


def test_a_gpu_with_more_compute_processes_than_the_runs_rank_is_shared():
    """Each sample counts NVML's compute processes per GPU; a GPU that ever had more than
    this run's one rank was shared. A count of 0 (NVML shows none, as in a container that
    hides other PIDs) claims nothing."""
    samples = [[1, 1, 0], [1, 2, 0], [1, 1, 0]]
    assert telemetry.shared_gpus(samples) == {"gpu_processes_max": [1, 2, 0],
                                              "shared_gpus": [1]}
    assert telemetry.shared_gpus([[1, 1], [1, 1]])["shared_gpus"] == []
    assert telemetry.shared_gpus([]) == {"gpu_processes_max": None, "shared_gpus": None}
    node = {"source": "nvml", "energy_j": None, "throttled": False, "throttle_reasons": [],
            "missing": [], "shared_gpus": [1]}
    job = telemetry.combine(node, None, nodes=4, nodes_with_energy=0, nodes_throttled=0,
                            tokens=8000, nodes_shared=1)
    assert job["gpu_shared"] is True and job["gpu_shared_nodes"] == "1 of 4 node(s)"
    alone = telemetry.combine({**node, "shared_gpus": []}, None, nodes=1, nodes_with_energy=0,
                              nodes_throttled=0, tokens=8000, nodes_shared=0)
    assert alone["gpu_shared"] is False
    unseen = telemetry.combine({**node, "shared_gpus": None}, None, nodes=1,
                               nodes_with_energy=0, nodes_throttled=0, tokens=8000)
    assert "gpu_shared" not in unseen


def test_results_say_when_a_gpu_run_shared_its_gpu(tmp_path):
    """A run of one H200 (docs/gpu-runs/), its run.json telemetry as the engine writes it
    when NVML counted another process on its GPU: the result says so, and why it
    matters."""
    (src,) = Path(__file__).resolve().parent.parent.glob(
        "docs/gpu-runs/2026-11-28-h200/accept_dense/runs/nemotron4-bf16/experiments/*/*")
    copy = Path(shutil.copytree(src, tmp_path / src.name))
    assert summarize_experiment(copy).gpu_shared is None  # written before it was counted
    run = json.loads((copy / "run.json").read_text())
    run["telemetry"].update(gpu_processes_max=[2], shared_gpus=[0], gpu_shared=True)
    (copy / "run.json").write_text(json.dumps(run))
    result = summarize_experiment(copy)
    assert result.gpu_shared is True
    assert conditions.SHARED_GPU_LINE in result.notes


# --- one real run, secrets in its environment ------------------------------------------

@pytest.fixture(scope="module")
def secret_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("conditions")
    env = {**SECRETS, "NCCL_IB_HCA": "mlx5"}
    exp = train(root, "pretrain_llama3.1", 2, env=env)
    return root, exp


@pytest.mark.slow
def test_no_secret_reaches_any_file_the_run_writes(secret_run):
    root, exp = secret_run
    files = [p for p in root.rglob("*") if p.is_file()]
    assert len(files) >= 6  # plan, run.json, conditions, metrics, log, exit, job history
    for path in files:
        data = path.read_bytes()
        for secret in (b"hf_secretvalue123", b"xyzsecret987", b"pw4secret55"):
            assert secret not in data, f"{secret!r} written to {path}"
    run = json.loads((exp / "run.json").read_text())
    node = json.loads((exp / f"conditions-{socket.gethostname()}.json").read_text())
    for recorded in (run["conditions"], node):
        assert recorded["env"]["NCCL_IB_HCA"] == "mlx5"
        assert recorded["env"]["NCCL_SOCKET_PASSWORD"] == "<redacted>"
        assert recorded["env"]["TORCH_HUB_URL"] == \
            "https://alice:<redacted>@hub.example.org/models"
        assert "HF_TOKEN" not in recorded["env"]
        assert recorded["torch"] == torch.__version__
    assert node["host"] == run["conditions"]["host"]


@pytest.mark.slow
def test_cpu_run_records_telemetry_of_its_window(secret_run):
    _, exp = secret_run
    run = json.loads((exp / "run.json").read_text())
    tel = run["telemetry"]
    assert tel["source"] == "cpu sysfs"
    assert tel["samples"] >= 2
    # 3 steps: the seeds' window 11-44 of 50 scales to iterations 1-2
    assert tel["window"] == [1, 2]
    plan = json.loads((exp / "plan.json").read_text())
    assert tel["window_tokens"] == 2 * plan["gbs"] * plan["seq_len"]
    assert tel["nodes"] == 1
    _assert_cpu_telemetry_truthful(tel)
    # the window's steps carry their own readings in metrics.jsonl, the warm-up's none
    per_step = {r["iteration"]: r.get("telemetry") for r in read_metrics(exp)}
    assert per_step[0] is None
    assert sum(per_step[i]["samples"] for i in (1, 2)) <= tel["samples"]
    # the allocator's peak of allocated bytes is a GPU figure: recorded, empty on a CPU
    assert [r["peak_allocated_bytes"] for r in read_metrics(exp)] == [None] * 3
    if tel["energy_j"] is None:
        assert per_step[1]["energy_j"] is None and per_step[2]["energy_j"] is None
    result = summarize_experiment(exp)
    assert result.throttled == tel["throttled"]
    assert result.energy_per_token_j == tel["energy_per_token_j"]
    assert "throttled" not in result.verdict


@pytest.mark.slow
def test_results_flag_a_throttled_run_and_show_its_energy(secret_run, tmp_path):
    """The real run's directory, its run.json telemetry as a GPU node would write it."""
    _, exp = secret_run
    copy = Path(shutil.copytree(exp, tmp_path / exp.name))
    run = json.loads((copy / "run.json").read_text())
    plain = summarize_experiment(copy)
    run["telemetry"].update(source="nvml", energy_j=12.5, energy_per_token_j=0.25,
                            throttled=True,
                            throttle_reasons=["hw slowdown", "sw thermal slowdown"])
    (copy / "run.json").write_text(json.dumps(run))
    result = summarize_experiment(copy)
    assert result.throttled is True
    assert result.energy_per_token_j == 0.25
    assert result.comparable
    assert result.verdict == f"throttled: {plain.verdict}"
    assert ("GPU throttled during the timed window (hw slowdown, sw thermal slowdown): "
            "its timings reflect lowered clocks") in result.notes
    from rich.console import Console

    from trainbench.results.report import print_table
    console = Console(record=True, width=400)
    print_table([result], console, "published")
    text = console.export_text()
    assert "J/token" in text and "0.25" in text and "throttled:" in text


def test_the_allocator_setting_names_each_variable_set():
    assert conditions.allocator_setting({"PATH": "/usr/bin"}) == "torch default"
    assert (conditions.allocator_setting({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
            == "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    both = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
            "PYTORCH_ALLOC_CONF": "max_split_size_mb:128"}
    assert conditions.allocator_setting(both) == ("PYTORCH_ALLOC_CONF=max_split_size_mb:128, "
                                                  "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
