"""Small things a new user hits first, each through the real CLI in a subprocess:
--version, what `results` reads by default, `flops` refusing bad options before printing,
`show` printing a long source note once, `run` announcing its plan once, and a closed
pipe (`| head`) ending quietly with exit code 0."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from helpers import experiment_dirs, run_cli

REPO = Path(__file__).resolve().parents[1]
LOGS = REPO / "tests" / "data" / "logs"


def one_error_line(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trainbench: error: "), res.stderr
    assert res.stdout == ""  # nothing printed before the error
    return lines[0]


def test_version_is_the_installed_package_version(tmp_path):
    expected = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    res = run_cli("--version", root=tmp_path)
    assert res.returncode == 0 and res.stdout.strip() == f"trainbench {expected}"


# --- results without a path -----------------------------------------------------------------

def results_in(cwd: Path, *args: str, root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRAINBENCH_ROOT": str(root),
           "TRAINBENCH_CONFIG": str(root / "cluster.yaml")}
    return subprocess.run([sys.executable, "-m", "trainbench.cli", "results", *args],
                          capture_output=True, text=True, env=env, cwd=cwd, timeout=120)


def test_results_without_a_path_reads_root_experiments_not_the_current_directory(tmp_path):
    cwd, root = tmp_path / "cwd", tmp_path / "root"
    shutil.copytree(LOGS / "nemo1", cwd / "nemo1")  # logs lying around here: not read
    # One MaxText run (the seeds' results/ tree), so the expected row count is known.
    shutil.copytree(LOGS / "maxtext" / "results", root / "experiments" / "maxtext")
    res = results_in(cwd, "--format", "csv", root=root)
    assert res.returncode == 0, res.stderr
    rows = res.stdout.strip().splitlines()[1:]
    assert len(rows) == 1 and "maxtext" in rows[0] and "nemotron4" not in res.stdout


def test_results_root_option_and_a_root_without_experiments(tmp_path):
    cwd, root = tmp_path / "cwd", tmp_path / "root"
    cwd.mkdir()
    shutil.copytree(LOGS / "nemo1", cwd / "nemo1")
    line = one_error_line(results_in(cwd, root=root))
    assert f"no experiments yet under {root / 'experiments'}" in line
    other = tmp_path / "other"
    shutil.copytree(LOGS / "maxtext" / "results", other / "experiments" / "maxtext")
    res = results_in(cwd, "--root", str(other), "--format", "csv", root=root)
    assert res.returncode == 0, res.stderr
    assert len(res.stdout.strip().splitlines()) == 2 and "maxtext" in res.stdout


# --- flops ------------------------------------------------------------------------------------

def test_flops_names_the_seeds_only_for_their_convention(tmp_path):
    common = ("flops", "-w", "pretrain_llama3.1", "-s", "8b")
    published = run_cli(*common, root=tmp_path)
    causal = run_cli(*common, "--convention", "causal", root=tmp_path)
    assert published.returncode == causal.returncode == 0
    assert "as the seeds print it" in published.stdout
    assert "as the seeds print it" not in causal.stdout and "(causal)" in causal.stdout


@pytest.mark.parametrize("extra,message", [
    (("--gbs", "128"), "add --step-time, --gpus"),
    (("--gbs", "128", "--gpus", "8"), "add --step-time"),
    (("--step-time", "12.27"), "add --gbs, --gpus"),
])
def test_flops_with_an_incomplete_mfu_option_set_fails_before_the_table(tmp_path, extra,
                                                                           message):
    res = run_cli("flops", "-w", "pretrain_llama3.1", "-s", "8b", *extra, root=tmp_path)
    assert message in one_error_line(res)


@pytest.mark.parametrize("step_time", ["inf", "nan", "0", "-1"])
def test_flops_refuses_a_step_time_that_is_not_a_positive_number(tmp_path, step_time):
    res = run_cli("flops", "-w", "pretrain_llama3.1", "-s", "8b", "--gbs", "128", "--gpus", "8",
                  f"--step-time={step_time}", root=tmp_path)
    assert "--step-time must be a positive number of seconds" in one_error_line(res)


# --- show -------------------------------------------------------------------------------------

def test_show_prints_each_source_note_once(tmp_path):
    res = run_cli("show", "-w", "pretrain_nemotron4", "-s", "340b", root=tmp_path)
    assert res.returncode == 0, res.stderr
    # Seed 003's note sits on 8 rows (bf16 and fp8 at 256-2048 GPUs), seed 000's on 2.
    assert res.stdout.count("the older seed 000 runs the same layout with VP=12") == 1
    assert res.stdout.count("only in the older seed 000, which runs VP=12") == 1
    assert res.stdout.count("[1]") == 3 and res.stdout.count("[2]") == 9  # rows + the note


# --- run --------------------------------------------------------------------------------------

@pytest.mark.slow
def test_run_announces_the_plan_once(tmp_path):
    res = run_cli("run", "-w", "pretrain_llama3.1", "-s", "tiny", "--dtype", "fp32", "--scale",
                  "1", "--gpu", "cpu", "--steps", "2", root=tmp_path)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    name = "pretrain_llama3.1_tiny_fp32_gpus1"
    announcements = [line for line in res.stdout.splitlines()
                     if line.startswith((f"{name}:", f"trainbench: {name} on"))]
    assert announcements == [f"{name}: Llama 3.1 tiny, fp32, 1 ranks on 1 node(s) of 1 (cpu)"]
    # The engine's own line still heads the log, which must stand on its own.
    (exp,) = experiment_dirs(tmp_path)
    log = (exp / f"log-{name}.out").read_text()
    assert f"trainbench: {name} on 1 x " in log


# --- a closed pipe ----------------------------------------------------------------------------

@pytest.mark.parametrize("args", [
    ("list",),
    ("results", str(LOGS), "--format", "table"),
    ("show", "-w", "pretrain_llama3.1", "-s", "405b"),
    ("flops", "-w", "pretrain_llama3.1", "-s", "8b"),
])
def test_a_closed_pipe_ends_quietly_with_exit_code_0(tmp_path, args):
    env = {**os.environ, "TRAINBENCH_ROOT": str(tmp_path),
           "TRAINBENCH_CONFIG": str(tmp_path / "cluster.yaml")}
    proc = subprocess.Popen([sys.executable, "-m", "trainbench.cli", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    # The reader goes away before the command has imported anything, let alone written:
    # its first write meets a closed pipe, as under `| head` with a long output.
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, stderr
    assert stderr == ""
