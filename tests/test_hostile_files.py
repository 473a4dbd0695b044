"""Files built to hang, blow up or slow down a reader: each is handed to the real CLI in a
subprocess under a 3 GiB address-space limit (RLIMIT_AS) and a timeout that only a hang or
a quadratic scan would reach. Each ends in one line and exit 2, or in the right result.

The cases come from issue 37: a FIFO where a log is expected (a reader blocks forever), a
2 MB line (the old key/value pattern was quadratic in it: 100 KB took over a minute), a YAML
alias bomb (a few hundred bytes that expand to a billion values), an integer of 400 digits
(float() overflows), and the same mechanisms one step further (a 5,000-digit iteration, a
run length of a billion, a JSON line nested 100,000 deep).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

MEMORY_LIMIT = 3 * 2**30
HANG = 120  # seconds: every case here ends in about one


def limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def cli(tmp_path: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("TRAINBENCH_ROOT", "COLUMNS")}
    full.update(TRAINBENCH_CONFIG=str(tmp_path / "none.yaml"), HOME=str(tmp_path),
                MPLCONFIGDIR=str(tmp_path / "mpl"))
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "trainbench.cli", *args], capture_output=True,
                          text=True, env=full, cwd=tmp_path, timeout=HANG, preexec_fn=limited,
                          stdin=subprocess.DEVNULL)


def one_line(res: subprocess.CompletedProcess, *words: str) -> str:
    assert "Traceback" not in res.stderr and "MemoryError" not in res.stderr, res.stderr[-2000:]
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode == 2 and len(lines) == 1, (res.returncode, res.stderr[-2000:])
    assert lines[0].startswith("trainbench: error: ") and len(lines[0]) < 400, lines[0][:500]
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


def results_json(res: subprocess.CompletedProcess) -> dict:
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-2000:]
    return json.loads(res.stdout)


NEMO_STEP = ("Training epoch 0, iteration {i}/{last} | lr: 0.0001 | global_step: {i} | "
             "reduced_train_loss: 3.5 | train_step_timing in s: 1.25 | consumed_samples: 8")


def nemo_log(path: Path, steps: int, extra: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [NEMO_STEP.format(i=i, last=steps - 1) for i in range(steps)]
    path.write_text("\n".join(lines) + "\n" + extra)
    return path


def alias_bomb(leaf: str) -> list[str]:
    """Nine anchored lists, each nine aliases of the one before (the first: nine `leaf`s),
    as YAML flow sequences: 9**9 (387 million) values once expanded."""
    names = "abcdefghi"
    return [f"&{name} [" + ", ".join([f"*{names[n - 1]}" if n else leaf] * 9) + "]"
            for n, name in enumerate(names)]


ALIAS_BOMB = "".join(f"{anchor[1]}: {anchor}\n" for anchor in alias_bomb("lol"))


# --- a FIFO where a file is expected --------------------------------------------------------------

def test_a_fifo_named_like_a_log_is_skipped_with_a_word_and_the_real_log_is_read(tmp_path):
    logs = tmp_path / "logs"
    os.mkfifo(nemo_log(logs / "log-real.out", 50).parent / "log-pipe.out")
    res = cli(tmp_path, "results", str(logs), "--format", "json")
    (row,) = results_json(res)["experiments"]
    assert row["name"] == "real" and row["status"] == "Success"
    assert "log-pipe.out: a FIFO (named pipe), not a regular file, not read" in res.stderr
    assert results_json(res)["unread"] == [f"{logs}/log-pipe.out: a FIFO (named pipe), not a "
                                           "regular file, not read"]


def test_a_fifo_alone_is_one_line(tmp_path):
    (tmp_path / "logs").mkdir()
    os.mkfifo(tmp_path / "logs" / "log-x.out")
    one_line(cli(tmp_path, "results", str(tmp_path / "logs")), "FIFO", "log-x.out")
    os.mkfifo(tmp_path / "named.log")
    one_line(cli(tmp_path, "results", str(tmp_path / "named.log")), "FIFO", "named.log")


def test_a_fifo_metrics_jsonl_leaves_the_log_to_be_read(tmp_path):
    run = tmp_path / "run"
    nemo_log(run / "log-run.out", 20)
    (run / "plan.json").write_text("{}")
    os.mkfifo(run / "metrics.jsonl")
    (row,) = results_json(cli(tmp_path, "results", str(run), "--format", "json"))["experiments"]
    assert row["format"] == "nemo2" and row["steps_logged"] == 20
    assert "metrics.jsonl: a FIFO (named pipe), not a regular file, not read" in row["notes"]


@pytest.mark.parametrize("command", [
    ("predict", "-w", "pretrain_llama3.1", "-s", "8b", "--scale", "8"),
    ("jobs", "list"),
])
def test_a_fifo_cluster_config_is_one_line(tmp_path, command):
    os.mkfifo(tmp_path / "cluster.yaml")
    one_line(cli(tmp_path, *command, env={"TRAINBENCH_CONFIG": str(tmp_path / "cluster.yaml")}),
             "FIFO", "cluster.yaml")


def test_a_fifo_sweep_file_and_init_from_are_one_line(tmp_path):
    os.mkfifo(tmp_path / "sweep.yaml")
    one_line(cli(tmp_path, "bulk", str(tmp_path / "sweep.yaml")), "FIFO", "sweep.yaml")
    one_line(cli(tmp_path, "init", "--from", str(tmp_path / "sweep.yaml")), "FIFO")


# --- a 2 MB line ------------------------------------------------------------------------------

@pytest.mark.parametrize("filler", ["a" * 2_000_000, "ab c" * 500_000, ":" * 2_000_000,
                                    "k: " + "1" * 2_000_000, "x=1 " * 500_000])
def test_a_2mb_line_costs_what_its_size_does(tmp_path, filler):
    """A step line with 2 MB after it: read in about a second (the old pattern took over two
    minutes on the first filler), its step kept, the rest of the file read too."""
    log = tmp_path / "logs" / "log-long.out"
    nemo_log(log, 50)
    with log.open("a") as fh:
        fh.write(NEMO_STEP.format(i=50, last=99) + " " + filler + "\n")
        fh.write(NEMO_STEP.format(i=51, last=99) + "\n")
    (row,) = results_json(cli(tmp_path, "results", str(log), "--format", "json"))["experiments"]
    assert row["steps_logged"] == 52 and row["last_iteration"] == 51


def test_a_2mb_metrics_line_without_a_newline_is_skipped_with_a_note(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    good = [json.dumps({"iteration": i, "step_time_s": 0.5, "loss": 3.0}) for i in range(10)]
    (run / "metrics.jsonl").write_text("\n".join(good) + "\n" + "[" * 2_000_000 + "\n"
                                       + "{" * 3_000_000)
    (row,) = results_json(cli(tmp_path, "results", str(run), "--format", "json"))["experiments"]
    assert row["steps_logged"] == 10
    assert "metrics.jsonl: 2 line(s) longer than 1 MiB skipped" in row["notes"]


def test_a_json_line_nested_100000_deep_is_skipped(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"iteration": 0, "step_time_s": 1.0}) + "\n"
                                       + "[" * 100_000 + "]" * 100_000 + "\n")
    (row,) = results_json(cli(tmp_path, "results", str(run), "--format", "json"))["experiments"]
    assert row["steps_logged"] == 1


# --- YAML alias bombs ------------------------------------------------------------------------------

def test_the_alias_bomb_is_as_large_as_it_claims():
    """The fixture is a real bomb: PyYAML builds its anchors as shared lists, whose expanded
    size is 9**9 (counted here without expanding them)."""
    import yaml
    data = yaml.safe_load(ALIAS_BOMB)

    def expanded(value, memo={}):  # noqa: B006 - a memo by identity, for this count only
        if not isinstance(value, list):
            return 1
        if id(value) not in memo:
            memo[id(value)] = sum(expanded(v) for v in value)
        return memo[id(value)]
    assert expanded(data["i"]) == 9**9


def test_an_alias_bomb_in_a_sweeps_sizes_is_one_line(tmp_path):
    (tmp_path / "sweep.yaml").write_text(
        "tasks:\n  - {workload: pretrain_llama3.1, dtype: fp32, scale: 2, gpu: cpu, sizes: ["
        + ", ".join(alias_bomb("tiny")) + "]}\n")
    one_line(cli(tmp_path, "bulk", str(tmp_path / "sweep.yaml"), "--dry-run"), "sweep.yaml",
             "alias")


@pytest.mark.parametrize("command", [
    ("predict", "-w", "pretrain_llama3.1", "-s", "8b", "--scale", "8"),
    ("run", "-w", "pretrain_llama3.1", "-s", "tiny", "--gpu", "cpu", "--scale", "2",
     "--dry-run"),
])
def test_an_alias_bomb_in_the_cluster_config_is_one_line(tmp_path, command):
    (tmp_path / "cluster.yaml").write_text(ALIAS_BOMB + "gpus_per_node: *i\n")
    one_line(cli(tmp_path, *command, env={"TRAINBENCH_CONFIG": str(tmp_path / "cluster.yaml")}),
             "cluster.yaml", "alias")


def test_a_recursive_alias_and_deep_nesting_are_one_line(tmp_path):
    for name, text in (("loop.yaml", "tasks: &t [*t]\n"),
                       ("deep.yaml", "tasks: " + "[" * 3000 + "]" * 3000 + "\n")):
        (tmp_path / name).write_text(text)
        one_line(cli(tmp_path, "bulk", str(tmp_path / name)), name)


# --- values beyond a type's range ------------------------------------------------------------------

def test_a_400_digit_integer_is_refused_for_its_field_only(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"iteration": i, "step_time_s": 0.5, "loss": 3.0} for i in range(10)]
    rows[3]["step_time_s"] = int("1" + "0" * 400)
    rows[4]["peak_memory_bytes"] = -int("9" * 400)
    rows.append({"iteration": int("7" * 400), "step_time_s": 0.5})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (row,) = results_json(cli(tmp_path, "results", str(run), "--format", "json"))["experiments"]
    # Iteration 3 lost its step time, so it is not a timed step; the others are.
    assert row["steps_logged"] == 9
    assert ("metrics.jsonl: 3 value(s) beyond their field's range left out (first: "
            "step_time_s at iteration 3)") in row["notes"]


def test_an_iteration_of_5000_digits_and_a_billion_step_run_end_quickly(tmp_path):
    """Megatron's 1-based iterations 1, 2 and 1,000,000,000 of a billion: the window's gaps
    (660 million iterations) are counted, never listed; a 5,000-digit iteration (which
    int() refuses) is left out and counted."""
    log = tmp_path / "megatron.log"
    lines = [f" iteration {i}/1000000000 | elapsed time per iteration (ms): 900.0 | "
             "lm loss: 2.0 |" for i in (1, 2, 1_000_000_000)]
    lines.append(f" iteration {'9' * 5000}/50 | elapsed time per iteration (ms): 900.0 |")
    log.write_text("\n".join(lines) + "\n")
    (row,) = results_json(cli(tmp_path, "results", str(log), "--format", "json"))["experiments"]
    assert row["steps_logged"] == 3 and row["status"] == "Incomplete"
    # The seeds' window 11-44 of 50, scaled to a billion steps: 220,000,000-880,000,000.
    assert row["status_detail"] == (
        "window 220000000-880000000 misses 660000001 iteration(s): 220000000, 220000001, "
        "220000002, 220000003, 220000004 ...")
    assert "1 step line(s) with an iteration or value out of range left out" in row["notes"]


def test_jobs_show_of_a_failed_run_whose_log_is_a_fifo_says_so(tmp_path):
    """`jobs show` prints a failed run's last log lines: from the last 64 KiB of a regular
    file, and for a FIFO one line saying what it is (it read the whole file before)."""
    from trainbench.launch.jobs import JobsDB
    exp = tmp_path / "root" / "experiments" / "x" / "x_1"
    exp.mkdir(parents=True)
    os.mkfifo(exp / "log-x.out")
    JobsDB(tmp_path / "root").add("local", "1", "x", str(exp), "{}", "FAILED")
    res = cli(tmp_path, "jobs", "show", "1", env={"TRAINBENCH_ROOT": str(tmp_path / "root")})
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert f"log-x.out: {exp}/log-x.out is a FIFO (named pipe), not a regular file" in res.stdout
