"""Distributed checkpoints: save, resume exactly, reshard, survive an interrupted save.

Real gloo ranks through the CLI. Iterations 0-4 of the tiny Llama run inside the
5-step learning-rate warm-up, so a resumed run and an uninterrupted one see the same
learning rates and their losses can be compared bit for bit.
"""

from __future__ import annotations

import json
import re
import shutil
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


# Save in one layout, resume in another: (scale, --set) of each, and how the log names it.
LAYOUTS = {"DP1": (1, (), "TP1 PP1 CP1 DP1"), "DP2": (2, (), "TP1 PP1 CP1 DP2"),
           "TP2": (2, ("--set", "tp=2"), "TP2 PP1 CP1 DP1"),
           "PP2": (2, ("--set", "pp=2"), "TP1 PP2 CP1 DP1")}
FAMILIES = ["pretrain_llama3.1", "pretrain_nemotron4", "pretrain_nemotronh"]
RESHARDS = [("DP2", "TP2"), ("TP2", "DP1"), ("PP2", "DP2")]
# What Nemotron-4 adds over Llama is its TP plan (an ungated MLP, LayerNorm with bias),
# exercised by TP2 -> DP1; FSDP and PP split it by whole parameters and layers as Llama.
# A checkpoint saved under the transformer TP plan is read back by Nemotron-4's TP2 -> DP1
# (Llama's attention and gated MLP under TP are loaded by its DP2 -> TP2), so Llama skips
# TP2 -> DP1 (suite time). Nemotron-H keeps both directions: its Mamba rows were once
# stored by TP in another order than DP.
CASES = [(w, src, dst) for w in FAMILIES for src, dst in RESHARDS
         if (w, src, dst) != ("pretrain_llama3.1", "TP2", "DP1")
         and (w != "pretrain_nemotron4" or (src, dst) == ("TP2", "DP1"))]
# In the quick set: DP2 -> TP2 for Llama (its DP2 run is shared with the tests above) and
# for Nemotron-H, whose Mamba rows TP once stored in another order than DP.
QUICK = {("pretrain_llama3.1", "DP2", "TP2"), ("pretrain_nemotronh", "DP2", "TP2")}
# Each family's TP2 and DP2 runs match one process to a few 1e-7 (test_parallel_parity).
ACROSS_LAYOUTS_RTOL = 1e-5


@pytest.fixture(scope="module")
def saved(tmp_path_factory, uninterrupted):
    """(workload, layout) -> a 4-step fp32 run in that layout saving step-2 and step-4."""
    cache = {(WORKLOAD, "DP2"): uninterrupted[1]}

    def get(workload: str, layout: str) -> Path:
        if (workload, layout) not in cache:
            scale, extra, _ = LAYOUTS[layout]
            cache[workload, layout] = train(tmp_path_factory.mktemp("saved"), workload, scale,
                                            *extra, "--checkpoint-interval", "2", steps=4)
        return cache[workload, layout]
    return get


@pytest.mark.dist
@pytest.mark.parametrize("workload,source,target", [
    pytest.param(w, src, dst, id=f"{w.removeprefix('pretrain_')}-{src}-to-{dst}",
                 marks=() if (w, src, dst) in QUICK else pytest.mark.slow)
    for w, src, dst in CASES])
def test_checkpoint_resumes_in_another_layout(saved, tmp_path, workload, source, target):
    """Iteration 2 checks the weights, iteration 3 the optimizer state: both must equal
    the uninterrupted run's, whichever layout saved and whichever loads."""
    exp = saved(workload, source)
    scale, extra, described = LAYOUTS[target]
    resumed = train(tmp_path, workload, scale, *extra, "--load-checkpoint",
                    str(exp / "checkpoints" / "step-2"), steps=2)
    assert [r["iteration"] for r in read_metrics(resumed)] == [2, 3]
    assert losses(resumed) == pytest.approx(losses(exp)[2:], rel=ACROSS_LAYOUTS_RTOL)
    assert [r["grad_norm"] for r in read_metrics(resumed)] == pytest.approx(
        [r["grad_norm"] for r in read_metrics(exp)[2:]], rel=ACROSS_LAYOUTS_RTOL)
    assert f"saved with {LAYOUTS[source][2]} on 2 ranks, resharded to {described})" \
        in log_text(resumed)


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


def test_checkpoint_without_a_recorded_architecture_is_refused(tmp_path):
    """A marker from before checkpoints recorded their model cannot be checked against
    this one (and may store tensors in another order): refused, not guessed."""
    ckpt = tmp_path / "checkpoints" / "step-3"
    ckpt.mkdir(parents=True)
    (ckpt / ".metadata").write_bytes(b"x")
    (ckpt / "COMPLETE").write_text(json.dumps({"step": 3, "workload": WORKLOAD,
                                               "size": "tiny"}))
    res = run_cli("run", "-w", WORKLOAD, "-s", "tiny", "--gpu", "cpu", "--scale", "1",
                  "--load-checkpoint", str(ckpt), root=tmp_path)
    assert res.returncode == 2
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith(f"trainbench: error: checkpoint {ckpt} ")
    assert "older trainbench whose checkpoints record no model architecture" in line
    assert not (tmp_path / "experiments").exists()


@pytest.fixture(scope="module")
def two_layer_checkpoint(tmp_path_factory):
    """One bf16 step of the tiny Llama cut to 2 layers (`--set layers=2`), saved."""
    root = tmp_path_factory.mktemp("two_layers")
    exp = train(root, WORKLOAD, 1, "--set", "layers=2", "--checkpoint", steps=1, dtype="bf16")
    return exp / "checkpoints" / "step-1"


def one_error_line(res) -> str:
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-2000:]
    assert "Traceback" not in res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith("trainbench: error: ")
    return line


@pytest.mark.dist
def test_checkpoint_records_the_model_architecture(two_layer_checkpoint):
    from trainbench.catalog.models import get_model
    record = json.loads((two_layer_checkpoint / "COMPLETE").read_text())
    arch, tiny = record["architecture"], get_model(WORKLOAD, "tiny")
    assert arch["layers"] == 2 != tiny.layers  # the override, not the catalog's depth
    for field in ("family", "vocab_size", "hidden", "ffn", "heads", "kv_heads", "head_dim",
                  "mlp", "norm", "rope_base", "rope_scaling", "pattern"):
        assert arch[field] == getattr(tiny, field), field
    # bf16 computes from fp32 master weights: the record says what the parameters were.
    assert arch["master_dtype"] == "float32"
    on_disk = {f.name: f.stat().st_size for f in two_layer_checkpoint.iterdir()
               if f.name != "COMPLETE"}
    assert record["file_sizes"] == on_disk and ".metadata" in on_disk


@pytest.mark.dist
def test_checkpoint_of_another_architecture_is_refused_before_launch(two_layer_checkpoint,
                                                                     tmp_path):
    res = run_cli("run", "-w", WORKLOAD, "-s", "tiny", "--gpu", "cpu", "--scale", "1",
                  "--dtype", "fp32", "--load-checkpoint", str(two_layer_checkpoint),
                  root=tmp_path)
    line = one_error_line(res)
    assert f"checkpoint {two_layer_checkpoint} holds a different model" in line
    assert "layers 2 (checkpoint) vs 4 (this run)" in line
    assert not (tmp_path / "experiments").exists()
    # The same architecture is accepted (the plan is all --dry-run makes).
    res = run_cli("run", "-w", WORKLOAD, "-s", "tiny", "--gpu", "cpu", "--scale", "1",
                  "--dtype", "fp32", "--set", "layers=2", "--dry-run",
                  "--load-checkpoint", str(two_layer_checkpoint), root=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]


def _garbage(path: Path, start: int = 0) -> None:
    """Same size, other bytes from `start` on: a file overwritten, not truncated."""
    data = bytearray(path.read_bytes())
    data[start:] = bytes((i * 151 + 7) % 256 for i in range(len(data) - start))
    path.write_bytes(bytes(data))


@pytest.mark.dist
@pytest.mark.parametrize("damage,expected", [
    ("metadata-overwritten", "its .metadata changed since it was saved"),
    ("shard-truncated", "__0_0.distcp has"),
    ("shard-missing", "__0_0.distcp is missing"),
    ("marker-garbage", "marker is unreadable"),
])
def test_damaged_checkpoint_is_refused_before_launch(two_layer_checkpoint, tmp_path, damage,
                                                     expected):
    ckpt = tmp_path / "checkpoints" / "step-1"
    shutil.copytree(two_layer_checkpoint, ckpt)
    shard = ckpt / "__0_0.distcp"
    if damage == "metadata-overwritten":
        _garbage(ckpt / ".metadata")
    elif damage == "shard-truncated":
        shard.write_bytes(shard.read_bytes()[:1000])
    elif damage == "shard-missing":
        shard.unlink()
    else:
        (ckpt / "COMPLETE").write_bytes(b"\x80\x04\x95garbage")
    # Pointing at the step folder or at its checkpoints/ folder: never skipped silently.
    for given in (ckpt, ckpt.parent):
        res = run_cli("run", "-w", WORKLOAD, "-s", "tiny", "--gpu", "cpu", "--scale", "1",
                      "--set", "layers=2", "--load-checkpoint", str(given), root=tmp_path)
        line = one_error_line(res)
        assert f"checkpoint {ckpt}" in line and expected in line, line
        assert not (tmp_path / "experiments").exists()


@pytest.mark.dist
def test_damaged_shard_bytes_end_in_one_clear_engine_line(two_layer_checkpoint, tmp_path):
    """A shard overwritten in place keeps its size, so only reading it can tell: the
    engine names the checkpoint; the terminal gets no traceback."""
    ckpt = tmp_path / "step-1"
    shutil.copytree(two_layer_checkpoint, ckpt)
    _garbage(ckpt / "__0_0.distcp")
    res = run_cli("run", "-w", WORKLOAD, "-s", "tiny", "--gpu", "cpu", "--scale", "1",
                  "--set", "layers=2", "--dtype", "fp32", "--load-checkpoint", str(ckpt),
                  root=tmp_path)
    assert res.returncode != 0
    terminal = res.stdout + res.stderr
    assert "Traceback" not in terminal
    (line,) = [ln for ln in res.stderr.splitlines() if "could not be read" in ln]
    assert f"checkpoint {ckpt} could not be read: its files are damaged" in line
