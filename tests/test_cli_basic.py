"""The light CLI commands, run as a user would (a real subprocess)."""

import subprocess
import sys
import time
from pathlib import Path

import pytest


def tb(*args, env=None):
    return subprocess.run([sys.executable, "-m", "trainbench.cli", *args], capture_output=True,
                          text=True, env=env)


def test_help_is_fast_and_does_not_import_torch():
    code = ("import sys, time; t = time.perf_counter(); import trainbench.cli; "
            "assert 'torch' not in sys.modules, 'torch imported'; "
            "assert 'matplotlib' not in sys.modules; print(time.perf_counter() - t)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    t0 = time.perf_counter()
    res = tb("--help")
    assert res.returncode == 0 and "show" in res.stdout
    assert time.perf_counter() - t0 < 2.0  # includes interpreter start; the import alone is above


LOGS = str(Path(__file__).parent / "data" / "logs" / "nemo2")


@pytest.mark.parametrize("args,exit_code", [
    (["list"], 0), (["show", "-w", "pretrain_llama3.1", "-s", "8b"], 0),
    (["flops", "-w", "pretrain_llama2", "-s", "70b"], 0),
    # results reads files; every `trainbench run` prints them after its run.
    (["results", LOGS], 0),
    # bad run input is answered before anything would need torch
    (["run", "-w", "pretrain_llama3.1", "-s", "tiny", "--gpu", "cpu", "--scale", "2",
      "--dtype", "fp32", "--set", "tp=0"], 2)])
def test_light_commands_do_not_import_torch(args, exit_code):
    code = ("import sys; sys.argv = ['trainbench'] + %r; import trainbench.cli as c\n"
            "try:\n    c.app()\nexcept SystemExit as e:\n    assert (e.code or 0) == %d, e.code\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n") % (args, exit_code)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr + out.stdout


def test_show_prints_seed_examples():
    res = tb("show", "-w", "pretrain_llama3.1", "-s", "8b", "--dtype", "fp8", "--scale", "8")
    assert res.returncode == 0, res.stderr
    assert "4.744e+14" in res.stdout and "8,030,261,248" in res.stdout
    assert "9.33" in res.stdout and "41.07%" in res.stdout


def test_flops_command_reproduces_mfu_example():
    res = tb("flops", "-w", "pretrain_nemotronh", "-s", "56b", "--gbs", "768", "--step-time",
             "15.892", "--gpus", "256", "--dtype", "fp8")
    assert res.returncode == 0, res.stderr
    assert "2.82e+15" in res.stdout and "395,888" in res.stdout and "26.86%" in res.stdout


@pytest.mark.parametrize("args,needle", [
    (["show", "-w", "pretrain_gpt", "-s", "8b"], "unknown workload"),
    (["show", "-w", "pretrain_llama3.1", "-s", "9b"], "known sizes"),
    (["show", "-w", "pretrain_llama3.1", "-s", "8b", "--dtype", "fp4"], "dtypes"),
    (["show", "-w", "pretrain_llama3.1", "-s", "8b", "--scale", "12"], "scales"),
    (["show", "-w", "pretrain_llama3.1", "-s", "8b", "--gpu", "v100"], "unknown GPU"),
    (["flops", "-w", "pretrain_llama3.1", "-s", "8b", "--gbs", "8"], "needs all of"),
])
def test_bad_input_gets_one_line_and_exit_2(args, needle):
    res = tb(*args)
    assert res.returncode == 2
    assert needle in res.stderr and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_show_405b_proxy_uses_the_depth_of_its_scale():
    # Counted by hand from architectures.md (Llama 3.1 405B, 30 layers at 64 GPUs): per layer
    # q and o 16384^2 each, k and v 16384 x 8 x 128 each, SwiGLU 3 x 16384 x 53248, two
    # RMSNorm weights; untied embedding and head 128256 x 16384 each; the final norm.
    hidden, ffn, vocab, kv = 16384, 53248, 128256, 8 * 128
    per_layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * ffn + 2 * hidden
    proxy30 = 30 * per_layer + 2 * vocab * hidden + hidden
    assert proxy30 == 99_833_823_232
    res = tb("show", "-w", "pretrain_llama3.1", "-s", "405b-proxy", "--scale", "64")
    assert res.returncode == 0, res.stderr
    assert "99,833,823,232" in res.stdout
    res = tb("show", "-w", "pretrain_llama3.1", "-s", "405b-proxy")
    assert "8 at 32 GPUs, 30 at 64 GPUs, 62 at 128 GPUs" in res.stdout
