"""Parsers of results/parse.py on real-looking logs of each framework: noise between the
step lines, truncated last lines, several run lengths, files read in tiny chunks."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from trainbench.engine.log import StepMetrics, format_step_line
from trainbench.results.failure import find_failure, find_last_error
from trainbench.results.formats.maxtext import parse_maxtext_line
from trainbench.results.formats.megatron import parse_megatron_line
from trainbench.results.formats.nemo import parse_nemo1_segment, parse_nemo2_line
from trainbench.results.metrics_jsonl import read_metrics_jsonl
from trainbench.results.parse import scan_log
from trainbench.results.summary import summarize_experiment

LOGS = Path(__file__).parent / "data" / "logs"
NEMO2_8B = next(LOGS.glob("nemo2/experiments/pretrain_llama3.1_8b_bf16_8/*/*/log-*.out"))
NEMO2_FAILED = next(LOGS.glob("nemo2/experiments/pretrain_llama3.1_70b_bf16_64/*/*/log-*.out"))
NEMOTRONH = next(LOGS.glob("nemo2/experiments/pretrain_nemotronh_*/*/log-*.out"))
NEMO1 = next(LOGS.glob("nemo1/**/log-*.out"))
MAXTEXT = next(LOGS.glob("maxtext/**/log-maxtext-*.out"))
MEGATRON = LOGS / "megatron" / "megatron-bridge-llama3-8b.log"

NCCL = ("node003:4242:4290 [5] NCCL INFO AllReduce: opCount 1f sendbuff 0x7ffb4713c200 "
        "recvbuff 0x7ffb4713c200 count 1 datatype 1 op 0 root 0 comm 0x55556b100660 "
        "[nranks=128] stream 0x5555630c58b0")


def nemo2_lines(n: int, times: list[float] | None = None) -> list[str]:
    times = times or [2.0 + 0.01 * i for i in range(n)]
    return [f"Training epoch 0, iteration {i}/{n - 1} | lr: 1e-05 | global_batch_size: 64 | "
            f"global_step: {i} | peak_memory_usage: 1000 | memory_allocated: 500 | "
            f"reduced_train_loss: {10 - i * 0.01:.3f} | train_step_timing in s: {times[i]} | "
            f"consumed_samples: {64 * (i + 1)}" for i in range(n)]


def with_noise(lines: list[str]) -> list[str]:
    out = ["[NeMo W 2025-04-11 14:30:02 nemo_logging:405] some warning", NCCL]
    for line in lines:
        out += [line, NCCL, NCCL]
    return out


def write(path: Path, lines: list[str], end: str = "\n") -> Path:
    path.write_text("\n".join(lines) + end)
    return path


# --- one line per parser ------------------------------------------------------------------

def test_nemo2_line_of_the_seed():
    rec = parse_nemo2_line(
        "Training epoch 0, iteration 49/49 | lr: 7.496e-06 | global_batch_size: 128 | "
        "global_step: 49 | peak_memory_usage: 70833405952 | memory_allocated: 44271689728 | "
        "reduced_train_loss: 11.96 | train_step_timing in s: 12.39 | consumed_samples: 6400")
    assert (rec.iteration, rec.total_iterations) == (49, 50)
    assert rec.step_time_s == 12.39 and rec.loss == 11.96
    assert rec.peak_memory_bytes == 70833405952 and rec.memory_allocated_bytes == 44271689728
    assert rec.global_batch_size == 128 and rec.consumed_samples == 6400
    assert rec.tflops_per_gpu is None and rec.grad_norm is None


def test_trainbench_line_is_read_by_the_nemo2_parser():
    m = StepMetrics(iteration=7, total_iterations=20, lr=3e-4, global_batch_size=8, loss=5.25,
                    grad_norm=1.5, step_time_s=0.125, tflops_per_gpu=0.5, tokens_per_s=8192.0,
                    peak_memory_bytes=123456, memory_allocated_bytes=65432, consumed_samples=64,
                    time=1.0)
    rec = parse_nemo2_line(format_step_line(m))
    assert (rec.iteration, rec.total_iterations) == (7, 20)
    assert rec.step_time_s == pytest.approx(0.125, abs=1e-4)
    assert rec.grad_norm == pytest.approx(1.5) and rec.tflops_per_gpu == pytest.approx(0.5)
    assert rec.loss == pytest.approx(5.25)


def test_nemo1_segment():
    rec = parse_nemo1_segment(
        "Epoch 0: : 100%|██████████| 100/100 [07:57<00:00, reduced_train_loss=7.310, "
        "global_step=99.00, consumed_samples=25600.0, train_step_timing in s=3.590]")
    assert (rec.iteration, rec.total_iterations) == (99, 100)
    assert rec.step_time_s == 3.59 and rec.loss == 7.31 and rec.consumed_samples == 25600


def test_megatron_line_is_one_based():
    rec = parse_megatron_line(
        " [2025-01-01 00:00:00] iteration       12/      50 | consumed samples:         1536 | "
        "elapsed time per iteration (ms): 20289.1 | throughput per GPU (TFLOP/s/GPU): 420.5 | "
        "learning rate: 1.5E-04 | global batch size:   128 | lm loss: 1.043E+01 | "
        "loss scale: 1.0 | grad norm: 5.123 | number of skipped iterations:   0 |")
    assert (rec.iteration, rec.total_iterations) == (11, 50)
    assert rec.step_time_s == pytest.approx(20.2891)
    assert rec.tflops_per_gpu == 420.5 and rec.loss == pytest.approx(10.43)
    assert rec.grad_norm == 5.123 and rec.global_batch_size == 128
    assert rec.consumed_samples == 1536


def test_maxtext_line():
    rec = parse_maxtext_line("completed step: 49, seconds: 7.908, TFLOP/s/device: 460.480, "
                             "Tokens/s/device: 1035.970, total_weights: 524288, loss: 0.000")
    assert rec.iteration == 49 and rec.total_iterations is None
    assert rec.step_time_s == 7.908 and rec.tflops_per_gpu == 460.48 and rec.loss == 0.0


def test_nan_values_are_read_as_nan():
    rec = parse_megatron_line("iteration 3/50 | elapsed time per iteration (ms): 1000.0 | "
                              "lm loss: nan | grad norm: inf |")
    assert math.isnan(rec.loss) and math.isinf(rec.grad_norm)
    assert rec.nonfinite_field() == "loss"


# --- whole files: the fixtures -------------------------------------------------------------

def test_nemo2_fixture():
    scan = scan_log(NEMO2_8B)
    assert scan.format == "nemo2"
    assert [r.iteration for r in scan.records] == list(range(50))
    assert scan.total_iterations == 50
    assert scan.records[0].step_time_s == 48.2  # the slow first step as written
    assert all(r.global_batch_size == 128 for r in scan.records)
    assert scan.records[-1].consumed_samples == 6400


def test_nemo2_fixture_with_tflops_and_max_memory_names():
    scan = scan_log(NEMOTRONH)
    assert scan.format == "nemo2"
    assert [r.iteration for r in scan.records] == list(range(38))
    assert scan.total_iterations == 50
    assert all(r.tflops_per_gpu is not None for r in scan.records)
    assert scan.records[5].peak_memory_bytes == 76001337344  # max_memory_reserved
    assert scan.records[5].memory_allocated_bytes == 51234567890  # max_memory_allocated


def test_nemo1_fixture_progress_bar_with_carriage_returns():
    raw = NEMO1.read_bytes()
    assert raw.count(b"\r") > 90  # the bar really is redrawn on shared lines
    scan = scan_log(NEMO1)
    assert scan.format == "nemo1"
    assert [r.iteration for r in scan.records] == list(range(100))
    assert scan.total_iterations == 100
    assert scan.records[0].step_time_s == 60.0
    assert scan.records[-1].consumed_samples == 3200


def test_maxtext_fixture_takes_run_length_and_batch_from_config():
    scan = scan_log(MAXTEXT)
    assert scan.format == "maxtext"
    assert [r.iteration for r in scan.records] == list(range(50))
    assert scan.config["steps"] == "50" and scan.total_iterations == 50
    assert scan.config["global_batch_size_to_train_on"] == "128"
    assert scan.records[0].step_time_s == 60.0


def test_megatron_bridge_fixture_matches_tflops_lines_to_iterations():
    scan = scan_log(MEGATRON)
    assert scan.format == "megatron"
    assert [r.iteration for r in scan.records] == list(range(20))
    assert scan.total_iterations == 20
    for rec in scan.records:
        # The Step Time line before each iteration line carries 128*4.74e14/t/8 TFLOPS.
        expected = 128 * 4.74e14 / rec.step_time_s / 8 / 1e12
        assert rec.tflops_per_gpu == pytest.approx(expected, rel=2e-3)
    assert scan.peak_memory_bytes == int(71234.0 * 2**20)  # `max reserved` of memory (MB)
    assert scan.records[3].grad_norm == pytest.approx(0.054)


@pytest.mark.parametrize("path", [
    NEMO2_8B, NEMOTRONH, NEMO1, MAXTEXT, MEGATRON,
    LOGS / "nemo1" / "nan-loss-progress-bar.log", LOGS / "megatron" / "interleaved-ranks.log",
    LOGS / "torchtitan" / "every-rank-prints.log", LOGS / "megatron" / "arguments-dump.log",
    LOGS / "megatron" / "bridge-step-time-only.log"], ids=lambda p: p.name)
def test_tiny_chunks_give_the_same_records(path):
    """Chunk edges falling inside lines, markers and \\r segments change nothing."""
    whole = scan_log(path)
    for chunk in (7, 64, 1000):
        small = scan_log(path, chunk_size=chunk)
        assert small.format == whole.format
        # repr: a NaN loss equals itself there, not under ==.
        assert [repr(r) for r in small.records] == [repr(r) for r in whole.records]


# --- lengths, noise, truncation --------------------------------------------------------------

@pytest.mark.parametrize("n", [20, 100])
def test_nemo2_other_run_lengths_among_noise(tmp_path, n):
    scan = scan_log(write(tmp_path / "log-x.out", with_noise(nemo2_lines(n))))
    assert len(scan.records) == n and scan.total_iterations == n
    assert scan.records[-1].step_time_s == pytest.approx(2.0 + 0.01 * (n - 1))


def test_truncated_number_at_the_end_is_not_read(tmp_path):
    lines = nemo2_lines(20)
    cut = lines[-1].index("train_step_timing in s: ") + len("train_step_timing in s: 2.")
    path = write(tmp_path / "log-x.out", with_noise(lines[:-1]) + [lines[-1][:cut]], end="")
    scan = scan_log(path)
    assert scan.truncated_last_line
    assert [r.iteration for r in scan.records] == list(range(19))  # '2.' is not 2.0


def test_truncated_line_keeps_its_complete_fields(tmp_path):
    lines = nemo2_lines(20)
    cut = lines[-1].index("consumed_samples") + 5
    scan = scan_log(write(tmp_path / "log-x.out", lines[:-1] + [lines[-1][:cut]], end=""))
    last = scan.records[-1]
    assert last.iteration == 19 and last.step_time_s == pytest.approx(2.19)
    assert last.consumed_samples is None


def test_noise_only_file_has_no_format(tmp_path):
    scan = scan_log(write(tmp_path / "x.log", [NCCL] * 100))
    assert scan.format is None and scan.records == []


def test_nemo1_redraws_of_one_step_count_once_and_truncated_segment_is_dropped(tmp_path):
    seg = ("Epoch 0: : {p}%|#| {d}/20 [00:01<00:10, reduced_train_loss=9.000, global_step={i}.00, "
           "consumed_samples={c}.0, train_step_timing in s={t}]")
    segs = []
    for i in range(20):
        for _ in range(2):  # tqdm redraws the same step
            segs.append(seg.format(p=5 * (i + 1), d=i + 1, i=i, c=8 * (i + 1), t=1.5))
    text = "\r".join(segs) + "\r" + segs[0][:60]  # killed mid-redraw
    path = tmp_path / "log-n1.out"
    path.write_text(NCCL + "\n" + text)
    scan = scan_log(path)
    assert [r.iteration for r in scan.records] == list(range(20))
    assert scan.total_iterations == 20


def test_megatron_tflops_line_after_the_iteration_line(tmp_path):
    lines = []
    for it in range(1, 11):
        lines.append(f"iteration {it:5d}/{10:5d} | elapsed time per iteration (ms): 2000.0 | "
                     f"lm loss: 5.0 | grad norm: 1.0 |")
        lines.append(f"Step Time : 2.00s GPU utilization: {300 + it}.0MODEL_TFLOP/s/GPU")
    scan = scan_log(write(tmp_path / "mlm.log", with_noise(lines)))
    assert [r.tflops_per_gpu for r in scan.records] == [300.0 + it for it in range(1, 11)]


def test_megatron_second_line_per_iteration_adds_tflops(tmp_path):
    lines = []
    for it in range(1, 6):
        lines.append(f" iteration {it}/ 5 | elapsed time per iteration (ms): {1000 + it} |")
        lines.append(f" iteration {it}/ 5 | throughput {500 + it} TFLOP/s/GPU")
    scan = scan_log(write(tmp_path / "mb.log", lines))
    assert [r.step_time_s for r in scan.records] == pytest.approx([1.001 + i / 1000 for i in range(5)])
    assert [r.tflops_per_gpu for r in scan.records] == [501.0, 502.0, 503.0, 504.0, 505.0]


def test_metrics_jsonl_with_nan_and_truncated_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = []
    for i in range(5):
        rows.append(StepMetrics(iteration=i, total_iterations=5, lr=1e-3, global_batch_size=8,
                                loss=float("nan") if i == 3 else 4.0, grad_norm=1.0,
                                step_time_s=0.5, tflops_per_gpu=0.1, tokens_per_s=2048.0,
                                peak_memory_bytes=10, memory_allocated_bytes=5,
                                consumed_samples=8 * (i + 1), time=float(i)).to_json())
    path.write_text("\n".join(rows[:4]) + "\n" + rows[4][:30])
    scan = read_metrics_jsonl(path)
    assert scan.format == "trainbench" and scan.truncated_last_line
    assert [r.iteration for r in scan.records] == [0, 1, 2, 3]
    assert math.isnan(scan.records[3].loss) and scan.records[3].nonfinite_field() == "loss"
    assert scan.total_iterations == 5


# --- the last error line --------------------------------------------------------------------

def test_failure_of_the_failed_fixture_is_its_out_of_memory_line():
    """The OOM that caused the failure, not the `srun: error:` line that followed it."""
    cls, line = find_failure(NEMO2_FAILED)
    assert cls == "CUDA out of memory"
    assert line.startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.50")
    assert find_last_error(NEMO2_FAILED) == line


def test_exception_line_preferred_over_traceback_header(tmp_path):
    lines = [NCCL] * 50 + ["Traceback (most recent call last):", '  File "x.py", line 1',
                           "RuntimeError: CUDA error: an illegal memory access was encountered",
                           "Traceback (most recent call last):", NCCL]
    path = write(tmp_path / "log-x.out", lines)
    expected = "RuntimeError: CUDA error: an illegal memory access was encountered"
    assert find_last_error(path) == expected
    assert find_last_error(path, chunk_size=50) == expected  # read backwards in small blocks


def test_no_error_line(tmp_path):
    assert find_last_error(write(tmp_path / "x.log", [NCCL] * 10)) is None


# --- issue 16: real and faithfully reconstructed logs (sources in tests/data/logs/README.md) ---

def test_megatron_deepspeed_prints_seconds():
    """Defect 1: `elapsed time per iteration (s): 106.46` is 106.46 s, not ms; the
    `[default7]:` prefix and the `TFLOPs:` figure are read."""
    scan = scan_log(LOGS / "megatron-deepspeed" / "bigscience-tr11-176b-excerpt.log")
    assert scan.format == "megatron-deepspeed"
    assert [r.iteration for r in scan.records] == [31213, 31214, 31215, 31216, 31217]
    assert [r.step_time_s for r in scan.records] == [106.46, 105.90, 106.40, 106.33, 107.53]
    assert [r.tflops_per_gpu for r in scan.records] == [147.29, 148.06, 147.37, 147.46, 145.82]
    assert scan.total_iterations == 115311 and scan.records[0].global_batch_size == 2048


def test_nemo1_nan_dot_zero_and_rounded_global_step():
    """Defect 2: `reduced_train_loss=nan.0` is a NaN loss; `global_step=9e+3` (three
    significant digits) does not merge five steps into one: the bar's count keys them.
    Lightning's running `loss=nan` in the same bar is not the step's loss."""
    scan = scan_log(LOGS / "nemo1" / "nan-loss-progress-bar.log")
    assert scan.format == "nemo1"
    assert [r.iteration for r in scan.records] == [8993, 8994, 8995, 8996, 8997, 8998]
    assert [r.loss for r in scan.records[:5]] == [3.110, 3.090, 3.120, 3.080, 3.100]
    assert math.isnan(scan.records[-1].loss) and scan.records[-1].nonfinite_field() == "loss"
    assert scan.total_iterations == 20000


def test_nemo2_epochs_are_keyed_on_the_global_step():
    """Defect 3: `iteration` restarts each epoch, `global_step` does not; the run length
    is the echoed max_steps, not one epoch's `/9`."""
    scan = scan_log(LOGS / "nemo2" / "multi-epoch-config-echo.log")
    assert [r.iteration for r in scan.records] == list(range(30))
    assert scan.total_iterations == 30
    assert [r.loss for r in scan.records[9:12]] == pytest.approx([10.05, 10.0, 9.95])


def test_glued_rank_lines_keep_the_peak_and_prefixed_lines_are_read():
    """Defect 6: two ranks' memory reports glued on one line give the larger peak
    (26880 MB, not the second rank's 26804); `1:`-prefixed iteration lines are read."""
    scan = scan_log(LOGS / "megatron" / "interleaved-ranks.log")
    assert scan.peak_memory_bytes == 26880 * 2**20
    assert [r.step_time_s for r in scan.records] == pytest.approx(
        [131.0204, 126.9953, 125.5537, 127.8045])


def test_every_rank_printing_a_step_counts_once():
    """Defect 6: torchtitan's ranks each print step 5; one record keeps their values."""
    scan = scan_log(LOGS / "torchtitan" / "every-rank-prints.log")
    assert [r.iteration for r in scan.records] == [4]  # step 4 opens the interval, no time
    rec = scan.records[0]
    assert rec.step_time_s == pytest.approx(19.145 - 17.508)
    assert rec.loss == 7.07623 and rec.grad_norm == 46.5
    assert rec.peak_memory_bytes == int(66.91 * 2**30)


def test_glog_prefixed_maxtext_lines_and_facts():
    """Defects 6 and 7: glog's `I0811 ... metric_logger.py:226]` prefix; Num_devices and
    the config lines are facts."""
    scan = scan_log(LOGS / "maxtext" / "profiled-nsys-glog.log")
    assert [r.step_time_s for r in scan.records] == [41.002, 0.631, 10.228, 10.344]
    assert scan.facts == {"world_size": 64, "dtype": "bf16", "gbs": 384, "tp": 1,
                          "seq_len": 4096, "total_iterations": 4}


def test_megatron_argument_dump_is_read_as_facts():
    """Defect 7: the argument dump states world size, batch, sequence and layout."""
    scan = scan_log(LOGS / "megatron" / "arguments-dump.log")
    assert scan.facts == {"world_size": 8, "gbs": 128, "seq_len": 8192, "tp": 2, "pp": 2,
                          "cp": 1, "total_iterations": 5, "log_interval": 1, "dtype": "bf16"}
    assert scan.profiled is None  # `profile ... False`


def test_nemo_config_echo_is_read_as_facts():
    scan = scan_log(LOGS / "nemo2" / "multi-epoch-config-echo.log")
    facts = {k: v for k, v in scan.facts.items() if not k.startswith("_")}
    assert facts == {"world_size": 16, "total_iterations": 30, "tp": 2, "pp": 2, "cp": 1,
                     "seq_len": 8192, "gbs": 128}


@pytest.mark.parametrize("name, line", [
    ("maxtext/profiled-nsys-glog.log", "Config param profiler: nsys"),
    ("torchtitan/profiled-every-10-steps.log", "Dumping profiler traces at step 200"),
])
def test_profiling_is_seen_in_the_log(name, line):
    """Defect 8: a profiled run is known by its log's lines, not only by its name."""
    assert line in scan_log(LOGS / name).profiled


def test_nsys_output_at_the_end_of_a_large_log(tmp_path):
    """Defect 8: nsys names its report when the run ends, far past the head of a large
    NCCL-traced log: the tail is searched for it."""
    path = tmp_path / "run.out"
    with open(path, "w") as fh:
        fh.write("\n".join(nemo2_lines(20)) + "\n")
        fh.write((NCCL + "\n") * 40000)  # ~7 MB of trace after the steps
        fh.write("Generated:\n    /results/report1.nsys-rep\n")
    scan = scan_log(path)
    assert len(scan.records) == 20 and scan.profiled == "/results/report1.nsys-rep"


def test_torchtitan_step_time_is_the_interval_between_logged_steps():
    """Defect 9: torchtitan prints no step time; the timestamps of two logged steps give
    it (1.118 s between steps 14 and 15), with loss, grad norm, memory and TFLOPS."""
    scan = scan_log(LOGS / "torchtitan" / "rank0-every-step.log")
    assert scan.format == "torchtitan"
    assert [r.iteration for r in scan.records] == list(range(14, 21))
    assert [r.step_time_s for r in scan.records] == pytest.approx(
        [1.118, 1.121, 1.125, 1.119, 1.121, 1.127, 1.122])
    first = scan.records[0]
    assert (first.loss, first.grad_norm, first.tflops_per_gpu) == (3.10680, 0.8587, 0.53)


def test_torchtitan_logging_every_ten_steps():
    scan = scan_log(LOGS / "torchtitan" / "profiled-every-10-steps.log")
    assert [r.iteration for r in scan.records] == [209, 219, 229, 239, 249]
    assert scan.records[0].step_time_s == pytest.approx((64.970 - 50.322) / 10)


def test_megatron_bridge_step_time_lines_alone():
    """Defect 9: rank 0's output of Megatron-Bridge holds only `Step Time :` lines."""
    scan = scan_log(LOGS / "megatron" / "bridge-step-time-only.log")
    assert scan.format == "megatron"
    assert [r.step_time_s for r in scan.records] == [30.02, 12.78, 12.80, 12.77, 12.79]
    assert [r.tflops_per_gpu for r in scan.records] == [225.1, 528.1, 527.3, 528.5, 527.7]
    assert any("Step Time" in note for note in scan.notes)


def test_unknown_format_has_no_format_but_is_seen_as_training_lines():
    """Defect 4: nanochat's step lines are in no registered format."""
    scan = scan_log(LOGS / "nanochat" / "base-train.log")
    assert scan.format is None and not scan.recognised and scan.step_like_lines == 4


def test_a_format_is_one_registered_class(monkeypatch):
    """Defect 9's design: adding a format is one LogFormat subclass in the registry; the
    scanner needs no change. Here nanochat's `step 00001/01000 ... dt: 1102.51ms` lines."""
    import re

    from trainbench.results import parse

    class NanoChat(parse.LogFormat):
        name, title, markers = "nanochat", "nanochat", (b"| dt: ",)
        line = re.compile(r"step (\d+)/(\d+) .*\| loss: ([\d.]+) .*\| dt: ([\d.]+)ms")

        def read(self, text, state):
            if m := self.line.search(text):
                state.step(self.name, parse.StepRecord(
                    int(m.group(1)), int(m.group(2)), step_time_s=float(m.group(4)) / 1000,
                    loss=float(m.group(3))))

    monkeypatch.setitem(parse.REGISTRY, "nanochat", NanoChat())
    scan = scan_log(LOGS / "nanochat" / "base-train.log")
    assert scan.format == "nanochat" and scan.total_iterations == 1000
    assert [r.step_time_s for r in scan.records] == pytest.approx(
        [24.18773, 1.10251, 1.09816, 1.09902])


FAILURES = LOGS / "failures"


@pytest.mark.parametrize("name, cls, text", [
    ("cuda-oom", "CUDA out of memory", "torch.OutOfMemoryError: CUDA out of memory. Tried"),
    ("nccl-timeout", "NCCL timeout", "Watchdog caught collective operation timeout"),
    ("nccl-error", "NCCL error", "ncclSystemError"),
    ("segfault", "segmentation fault", "failed (exitcode: -11)"),
    ("rank-killed", "rank killed", "Signal 9 (SIGKILL)"),
    ("node-failure", "node failure", "DUE TO NODE FAILURE"),
    ("slurm-time-limit", "Slurm time limit", "DUE TO TIME LIMIT"),
    ("slurm-cancelled", "Slurm cancelled", "CANCELLED AT 2024-11-21T10:02:44 ***"),
])
def test_failure_class_and_line(name, cls, text):
    """Defect 5: the cause of a failed run is classified and its line given; a cause
    beats the consequences printed after it (the OOM before its peers' NCCL timeout,
    Slurm's time limit before the killed tasks)."""
    got_cls, line = find_failure(FAILURES / f"{name}.log")
    assert got_cls == cls and text in line


def test_nccl_watchdog_glued_to_a_progress_bar():
    """Defect 5: the watchdog timeout of pytorch/pytorch#118369, its first line glued to a
    NeMo 1 progress bar."""
    cls, line = find_failure(LOGS / "nemo1" / "watchdog-after-progress-bar.log")
    assert cls == "NCCL timeout" and "Watchdog caught collective operation timeout" in line


def test_colours_and_crlf_change_nothing(tmp_path):
    """torchtitan colours its fields when writing to a terminal; a log copied from Windows
    ends lines with CRLF. Both read as the plain file does."""
    plain = LOGS / "torchtitan" / "rank0-every-step.log"
    coloured = []
    for line in plain.read_text().splitlines():
        for key, colour in (("step:", 31), ("loss:", 32), ("memory:", 33), ("tflops:", 34)):
            line = line.replace(key, f"\x1b[{colour}m{key}\x1b[39m")
        coloured.append(line)
    path = tmp_path / "coloured.log"
    path.write_bytes(("\r\n".join(coloured) + "\r\n").encode())
    assert [r.to_dict() for r in scan_log(path).records] == [
        r.to_dict() for r in scan_log(plain).records]


# --- torchtitan: every logged step counted --------------------------------------------------

def titan_line(when: str, text: str, rank: int = 0) -> str:
    """A line as torchtitan's logger prints it (torchtitan/tools/logging.py: `[titan]
    %(asctime)s - %(name)s - %(levelname)s - %(message)s`), behind torchrun's rank prefix."""
    return f"[rank{rank}]:[titan] {when} - root - INFO - {text}"


def titan_step(step: int, loss: float, tflops: float = 64.9) -> str:
    """MetricsProcessor.log's step line, format for format (pytorch/torchtitan,
    torchtitan/components/metrics.py): f"step: {step:2}  loss: {loss:7.4f}  grad_norm:
    {grad_norm:7.4f}  memory: {gib:5.2f}GiB({pct:.2f}%)  tps: {round(tps):,}  tflops:
    {tflops:,.2f}  mfu: {mfu:.2f}%"."""
    return (f"step: {step:2}  loss: {loss:7.4f}  grad_norm: {0.8:7.4f}  memory: "
            f"{16.91:5.2f}GiB({17.80:.2f}%)  tps: {1234:,}  tflops: {tflops:,.2f}  "
            f"mfu: {6.56:.2f}%")


def titan_log(tmp_path: Path, start_line: str | None, steps=range(1, 11)) -> Path:
    """Steps 1-10 logged every step, 1.5 s apart, after train()'s start line (printed at
    12:00:00,000); the first step took 3.25 s (warm-up and compilation)."""
    lines = [titan_line("2026-11-27 11:59:58,100", "Building llama3 debugmodel")]
    if start_line is not None:
        lines.append(titan_line("2026-11-27 12:00:00,000", start_line))
    for step in steps:
        ms = 3250 + 1500 * (step - 1)
        when = f"2026-11-27 12:00:{ms // 1000:02d},{ms % 1000:03d}"
        lines.append(titan_line(when, titan_step(step, 12.2541 - 0.1 * step)))
        if step == 5:  # the validator's line names a step too, and is none
            lines.append(titan_line(when, "validate step:  5  loss:  9.9000  memory: "
                                          "16.91GiB(17.80%)  tps: 4,321"))
    path = tmp_path / "torchtitan.log"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("start_line", [
    "Training starts at step 1.",  # torchtitan/train.py today
    "Training starts at step 1, with local batch size 8, global batch size 64, sequence "
    "length 2048, total steps 10 (warmup 2)",  # older releases
])
def test_a_torchtitan_log_of_ten_steps_has_ten_steps(tmp_path, start_line):
    """Issue 36: steps 1-10 were read as 9 (the first logged step had no step time). The
    first step is timed from the `Training starts at step 1` line printed just before it."""
    scan = scan_log(titan_log(tmp_path, start_line))
    assert scan.format == "torchtitan"
    assert [r.iteration for r in scan.records] == list(range(10))
    assert [r.step_time_s for r in scan.records] == pytest.approx([3.25] + [1.5] * 9)
    assert scan.records[4].loss == pytest.approx(12.2541 - 0.5)  # not the validator's 9.9
    assert scan.records[0].tflops_per_gpu == 64.9 and not scan.notes
    r = summarize_experiment(titan_log(tmp_path, start_line))
    assert r.steps_logged == 10


def test_a_torchtitan_excerpt_without_the_start_line_says_its_first_step_is_untimed(tmp_path):
    scan = scan_log(titan_log(tmp_path, None, steps=range(3, 11)))
    assert [r.iteration for r in scan.records] == list(range(3, 10))
    assert scan.notes == ["torchtitan: the first logged step (3) has no step time: the log "
                          "holds no `Training starts at step` line before it to time it from"]


def test_torchtitan_tflops_above_a_thousand_keep_their_digits(tmp_path):
    """`tflops: {tflops:,.2f}` prints 1,234.56 on a GPU past a thousand TFLOPS."""
    path = tmp_path / "b200.log"
    path.write_text("\n".join([
        titan_line("2026-11-27 12:00:00,000", "Training starts at step 1."),
        titan_line("2026-11-27 12:00:01,000", titan_step(1, 3.0, tflops=1234.56)),
        titan_line("2026-11-27 12:00:02,000", titan_step(2, 3.0, tflops=1240.0))]) + "\n")
    assert [r.tflops_per_gpu for r in scan_log(path).records] == [1234.56, 1240.0]
