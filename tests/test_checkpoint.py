"""Distributed checkpoints: save, resume exactly, reshard, survive an interrupted save.

Real gloo ranks through the CLI. Iterations 0-4 of the tiny Llama run inside the
5-step learning-rate warm-up, so a resumed run and an uninterrupted one see the same
learning rates and their losses can be compared bit for bit.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from helpers import experiment_dirs, losses, read_metrics, run_cli, train

WORKLOAD = "pretrain_llama3.1"
# A different layout changes only the order of floating-point sums (fp32 on a CPU).
RESHARD_RTOL = 1e-6


def log_text(exp: Path) -> str:
    (log,) = exp.glob("log-*.out")
    return log.read_text()


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """A DP2 run of 4 steps saving every 2: checkpoints step-2 and step-4."""
    root = tmp_path_factory.mktemp("ckpt")
    exp = train(root, WORKLOAD, 2, "--checkpoint", "--checkpoint-interval", "2", steps=4)
    return root, exp


@pytest.mark.dist
def test_save_writes_atomic_distcp_checkpoints_and_logs_the_seed_line(uninterrupted):
    _, exp = uninterrupted
    folder = exp / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == ["step-2", "step-4"]  # no leftovers
    for step in (2, 4):
        ckpt = folder / f"step-{step}"
        assert len(list(ckpt.glob("*.distcp"))) == 2 and (ckpt / ".metadata").is_file()
        record = json.loads((ckpt / "COMPLETE").read_text())
        assert record["step"] == step and record["layout"] == "TP1 PP1 CP1 DP2"
        on_disk = sum(f.stat().st_size for f in ckpt.iterdir() if f.name != "COMPLETE")
        assert record["size_bytes"] == on_disk
    log = log_text(exp)
    saves = re.findall(r"Global Checkpoint Save : Rank: 0 : Iteration: (\d+) : Start time: "
                       r"\d+\.\d{3}s : Save duration: \d+\.\d{3}s", log)
    assert saves == ["2", "4"]
    assert re.search(r"Checkpoint saved: .*step-4 \(\d+\.\d\d MiB on disk, 3 files\)", log)


@pytest.mark.dist
def test_resume_continues_exactly(uninterrupted, tmp_path):
    root, exp = uninterrupted
    resumed = train(tmp_path, WORKLOAD, 2, "--load-checkpoint",
                    str(exp / "checkpoints" / "step-2"), steps=2)
    records = read_metrics(resumed)
    assert [r["iteration"] for r in records] == [2, 3]  # iterations continue from N
    # Iteration 2 checks the weights, iteration 3 the restored optimizer state.
    assert losses(resumed) == losses(exp)[2:]
    assert [r["grad_norm"] for r in records] == [r["grad_norm"] for r in read_metrics(exp)[2:]]
    log = log_text(resumed)
    assert re.search(r"Global Checkpoint Load : Rank : 0 : Start time : \d+\.\d{3}s : "
                     r"Time spent in load_checkpoint: \d+\.\d{3}s", log)
    assert "iteration 3/3" in log
    run_info = json.loads((resumed / "run.json").read_text())
    assert run_info["first_iteration"] == 2
    # Results know the run resumed at iteration 2: a complete run, not a gap at 0-1.
    from trainbench.results import summarize_experiment
    result = summarize_experiment(resumed)
    assert result.status == "Success", result.status_detail
    assert result.total_iterations == 4 and result.window_start >= 2


@pytest.mark.dist
def test_resume_into_tensor_parallel(uninterrupted, tmp_path):
    _, exp = uninterrupted
    resumed = train(tmp_path, WORKLOAD, 2, "--set", "tp=2", "--load-checkpoint",
                    str(exp / "checkpoints" / "step-2"), steps=2)
    assert [r["iteration"] for r in read_metrics(resumed)] == [2, 3]
    assert losses(resumed) == pytest.approx(losses(exp)[2:], rel=RESHARD_RTOL)
    assert "resharded to" in log_text(resumed)


@pytest.mark.dist
def test_killed_save_leaves_the_previous_checkpoint_usable(uninterrupted, tmp_path):
    _, reference = uninterrupted
    res = run_cli("run", "-w", WORKLOAD, "-s", "tiny", "--dtype", "fp32", "--scale", "2",
                  "--steps", "2", "--gpu", "cpu", "--checkpoint-interval", "1", root=tmp_path,
                  env={"TRAINBENCH_FAIL_DURING_SAVE": "2", "TRAINBENCH_FAIL_RANK": "1"})
    assert res.returncode != 0
    (killed,) = experiment_dirs(tmp_path)
    folder = killed / "checkpoints"
    (partial,) = folder.glob("step-2.tmp-*")
    assert list(partial.glob("*.distcp"))  # shards were being written ...
    assert not (partial / "COMPLETE").exists() and not (folder / "step-2").exists()

    # The folder resolves to the newest complete checkpoint, naming what it skips; it
    # loads into one process (DP2 -> DP1 resharding).
    resumed_root = tmp_path / "resumed"
    res = run_cli("run", "-w", WORKLOAD, "-s", "tiny", "--dtype", "fp32", "--scale", "1",
                  "--steps", "1", "--gpu", "cpu", "--load-checkpoint", str(folder),
                  root=resumed_root)
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"ignoring interrupted checkpoint save {partial}" in res.stderr
    (resumed,) = experiment_dirs(resumed_root)
    assert [r["iteration"] for r in read_metrics(resumed)] == [1]
    assert losses(resumed) == pytest.approx(losses(reference)[1:2], rel=RESHARD_RTOL)
    assert "resharded to TP1 PP1 CP1 DP1" in log_text(resumed)

    # Pointing at the partial one directly: one clear line, no run.
    res = run_cli("run", "-w", WORKLOAD, "-s", "tiny", "--gpu", "cpu", "--scale", "2",
                  "--load-checkpoint", str(partial), root=tmp_path / "refused")
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trainbench: error: checkpoint ")
    assert str(partial) in lines[0] and "incomplete" in lines[0]
    assert not (tmp_path / "refused" / "experiments").exists()


def test_folder_without_a_complete_checkpoint_fails_loudly(tmp_path):
    empty = tmp_path / "checkpoints"
    (empty / "step-3.tmp-abc123").mkdir(parents=True)
    res = run_cli("run", "-w", WORKLOAD, "-s", "tiny", "--gpu", "cpu", "--scale", "1",
                  "--load-checkpoint", str(empty), root=tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "no complete checkpoint in" in res.stderr and "step-3.tmp-abc123" in res.stderr
    assert not (tmp_path / "experiments").exists()  # never a silent fresh start


def test_resolve_picks_the_newest_complete_checkpoint(tmp_path):
    from trainbench.engine.checkpoint_dirs import CheckpointError, resolve

    folder = tmp_path / "exp" / "checkpoints"
    for step in (5, 10):
        ckpt = folder / f"step-{step}"
        ckpt.mkdir(parents=True)
        (ckpt / ".metadata").write_bytes(b"x")
        (ckpt / "COMPLETE").write_text(json.dumps({"step": step}))
    (folder / "step-15.tmp-1a2b").mkdir()
    (folder / "step-20").mkdir()  # renamed by hand, no marker: not trusted
    for given in (folder, folder.parent):  # the checkpoints/ folder or its experiment
        found, skipped = resolve(given)
        assert found.step == 10 and found.path == folder / "step-10"
        assert sorted(p.name for p in skipped) == ["step-15.tmp-1a2b", "step-20"]
    assert resolve(folder / "step-5")[0].step == 5
    with pytest.raises(CheckpointError, match="no COMPLETE marker"):
        (folder / "step-20" / ".metadata").write_bytes(b"x")
        resolve(folder / "step-20")


def test_checkpoint_of_another_model_is_refused(tmp_path):
    ckpt = tmp_path / "checkpoints" / "step-3"
    ckpt.mkdir(parents=True)
    (ckpt / ".metadata").write_bytes(b"x")
    (ckpt / "COMPLETE").write_text(json.dumps({"step": 3, "workload": "pretrain_nemotron4",
                                               "size": "tiny"}))
    res = run_cli("run", "-w", WORKLOAD, "-s", "tiny", "--gpu", "cpu", "--scale", "1",
                  "--load-checkpoint", str(ckpt), root=tmp_path)
    assert res.returncode == 2
    assert "holds pretrain_nemotron4 tiny, not pretrain_llama3.1 tiny" in res.stderr
    assert not (tmp_path / "experiments").exists()
