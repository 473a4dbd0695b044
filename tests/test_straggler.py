"""Stragglers (issue #18 item 4): each rank's compute time apart from its waits in
collectives, and the rank more than 5% slower than the median rank named in the log, the
run's summary, run.json and `trainbench results`.

Two real runs of two gloo ranks (DP2 and TP2) with rank 1 slowed by the engine's test
hook; the verdict's arithmetic on hand-made rank records."""

from __future__ import annotations

import json
import shutil

import pytest

from helpers import experiment_dirs, run_cli, train
from trainbench.engine.straggler import instrumented_steps, probe_command, summarize
from trainbench.engine.straggler_text import describe, parse_slow_rank
from trainbench.results import summarize_experiment

SLOW = {"TRAINBENCH_SLOW_RANK": "1:0.1"}  # rank 1: 0.1 s more in each microbatch's forward


def ranks(*medians: float, stages: tuple[int, ...] | None = None) -> list[dict]:
    """Rank records as the engine gathers them: two steps per rank around a median."""
    out = []
    for rank, m in enumerate(medians):
        out.append({"rank": rank, "host": f"node{rank // 2}", "local_rank": rank % 2,
                    "stage": stages[rank] if stages else 0,
                    "steps": [{"step": 45, "compute_s": m - 0.01, "blocked_s": 0.3},
                              {"step": 46, "compute_s": m + 0.01, "blocked_s": 0.2},
                              {"step": 47, "compute_s": m, "blocked_s": 0.1}]})
    return out


# --- the verdict -------------------------------------------------------------------------

def test_the_rank_above_five_percent_is_named_with_the_probe_command():
    s = summarize(ranks(1.0, 1.02, 1.2, 1.01), "trainbench probe --scale 4 --gpu h100")
    # per-rank medians 1.0, 1.02, 1.2, 1.01: the median rank is 1.015
    assert s["flagged"] is True
    assert s["slowest"]["rank"] == 2 and s["slowest"]["host"] == "node1"
    assert s["slowest"]["local_rank"] == 0
    assert s["slowest"]["pct_above_median"] == pytest.approx(100 * (1.2 / 1.015 - 1))
    assert s["groups"][0]["spread_pct"] == pytest.approx(20.0)
    assert s["probe_command"] == "trainbench probe --scale 4 --gpu h100"
    line = describe(s)
    assert line.startswith("straggler: rank 2 (host node1, local rank 0)")
    assert "18.2% above the median rank" in line
    assert "`trainbench probe --scale 4 --gpu h100`" in line


def test_below_five_percent_nobody_is_named_but_the_spread_is_kept():
    s = summarize(ranks(1.0, 1.049), "trainbench probe --scale 2 --gpu cpu")
    # median of 1.0 and 1.049 is 1.0245: rank 1 is 2.4% above it, 4.9% above rank 0
    assert s["flagged"] is False and "probe_command" not in s
    assert s["slowest"]["rank"] == 1
    assert s["slowest"]["pct_above_median"] == pytest.approx(100 * (1.049 / 1.0245 - 1))
    assert s["groups"][0]["spread_pct"] == pytest.approx(4.9)
    assert describe(s).startswith("no straggler: every rank's compute time within 5%")
    assert summarize(ranks(1.0, 1.11), "p")["flagged"] is True  # 5.2% above 1.055


def test_pipeline_stages_are_compared_within_a_stage():
    # Stage 1 holds more layers (twice the compute): not a straggler. Within stage 1,
    # rank 3 is 10% slower than rank 2 (4.8% above their median 2.1): not flagged;
    # within stage 0 rank 1 is 20% slower than rank 0 (9.1% above 1.1): flagged.
    s = summarize(ranks(1.0, 1.2, 2.0, 2.2, stages=(0, 0, 1, 1)), "p")
    assert [g["ranks"] for g in s["groups"]] == [[0, 1], [2, 3]]
    assert s["flagged"] is True and s["slowest"]["rank"] == 1
    assert s["slowest"]["pct_above_median"] == pytest.approx(100 * (1.2 / 1.1 - 1))
    assert not summarize(ranks(1.0, 1.0, 2.0, 2.0, stages=(0, 0, 1, 1)), "p")["flagged"]


def test_instrumented_steps_lie_outside_the_window():
    assert instrumented_steps(0, 50, (11, 44)) == [45, 46, 47]
    assert instrumented_steps(0, 46, (10, 44)) == [8, 9, 45]  # one after, two before
    assert instrumented_steps(0, 13, (3, 11)) == [1, 2, 12]
    assert instrumented_steps(0, 7, (2, 6)) == [1]  # never the run's first step
    assert instrumented_steps(0, 6, (1, 5)) == []
    assert instrumented_steps(0, 3, (1, 2)) == []
    assert instrumented_steps(20, 70, (31, 64)) == [65, 66, 67]  # resumed at iteration 20
    assert instrumented_steps(20, 23, (21, 22)) == []


def test_slow_rank_hook_and_probe_command_parsing():
    assert parse_slow_rank("1:0.05") == (1, 0.05)
    assert parse_slow_rank(None) is None and parse_slow_rank("") is None
    for bad in ("1", "a:0.1", "1:x", "-1:0.1", "1:-2", "1:nan", "1:inf", "1:0.1:2"):
        with pytest.raises(ValueError, match="TRAINBENCH_SLOW_RANK"):
            parse_slow_rank(bad)
    assert probe_command(16, "h100", 2, 8) == \
        "trainbench probe --scale 16 --gpu h100 --nodes 2 --gpus-per-node 8"


# --- real runs ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def slowed_dp2(tmp_path_factory):
    root = tmp_path_factory.mktemp("straggler")
    # 13 steps: the window is 3-11, steps 1, 2 and 12 are instrumented
    res = run_cli("run", "-w", "pretrain_llama3.1", "-s", "tiny", "--dtype", "fp32", "--scale",
                  "2", "--steps", "13", "--gpu", "cpu", root=root, env=SLOW)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (exp,) = experiment_dirs(root)
    return root, exp, res.stdout


def rank_records(exp) -> dict[int, dict]:
    record = json.loads((exp / "run.json").read_text())["straggler"]
    return record, {r["rank"]: r for r in record["ranks"]}


@pytest.mark.slow
@pytest.mark.dist
def test_a_slowed_rank_is_named_in_the_log_run_json_and_results(slowed_dp2):
    root, exp, stdout = slowed_dp2
    record, by_rank = rank_records(exp)
    assert record["steps"] == [1, 2, 12]
    assert record["flagged"] is True and record["slowest"]["rank"] == 1
    assert record["probe_command"] == "trainbench probe --scale 2 --gpu cpu"
    # GA 2: rank 1 computes 0.2 s more per step (CPU time, not charged while it waits)
    gap = by_rank[1]["median_compute_s"] - by_rank[0]["median_compute_s"]
    assert 0.15 < gap < 0.3, gap
    # ... and rank 0 waits for it inside the collectives: its wait is taken out
    assert min(by_rank[0]["blocked_s"]) > 0.15, by_rank[0]["blocked_s"]
    log = next(exp.glob("log-*")).read_text()
    assert "trainbench: straggler: rank 1 (host " in log
    # the run's final summary (its table may wrap the line)
    assert "STRAGGLER" in stdout and "straggler: rank 1 (host" in stdout
    res = run_cli("results", str(exp), "--format", "json", root=root)
    assert res.returncode == 0, res.stderr
    (row,) = json.loads(res.stdout)["experiments"]
    assert row["straggler_rank"] == 1 and row["rank_compute_spread_pct"] > 5
    assert any(n.startswith("straggler: rank 1") and "trainbench probe --scale 2 --gpu cpu"
               in n for n in row["notes"])


@pytest.mark.slow
@pytest.mark.dist
def test_below_the_threshold_results_name_nobody(slowed_dp2, tmp_path):
    """The same real run directory with its record made even (as a run of equal ranks
    writes it): results keep the spread and name no rank."""
    _, exp, _ = slowed_dp2
    copy = tmp_path / exp.name
    shutil.copytree(exp, copy)
    info = json.loads((copy / "run.json").read_text())
    even = [{"rank": rank, "host": "vm", "local_rank": rank,
             "steps": [{"step": s, "compute_s": c, "blocked_s": 0.1} for s in (1, 2, 12)]}
            for rank, c in enumerate((0.2, 0.204))]
    info["straggler"] = summarize(even, "trainbench probe --scale 2 --gpu cpu")
    (copy / "run.json").write_text(json.dumps(info))
    r = summarize_experiment(copy)
    assert r.straggler is None and r.straggler_rank is None
    assert r.rank_compute_spread_pct == pytest.approx(100 * (0.204 / 0.202 - 1))
    assert not any("straggler" in n for n in r.notes)
    r = summarize_experiment(exp)
    assert r.straggler_rank == 1 and r.straggler.startswith("straggler: rank 1")


@pytest.mark.slow
@pytest.mark.dist
def test_tp2_slowed_rank_is_named(tmp_path):
    """Under TP the ranks meet in every layer's collectives, forward and backward. A
    7-step run: its only step outside the window 2-6 is step 1."""
    exp = train(tmp_path, "pretrain_llama3.1", 2, "--set", "tp=2 mbs=1 gbs=2 seq_len=64",
                steps=7, env=SLOW)
    record, by_rank = rank_records(exp)
    assert record["steps"] == [1]
    assert record["flagged"] is True and record["slowest"]["rank"] == 1
    # GA 2 microbatches of 0.1 s each
    gap = by_rank[1]["median_compute_s"] - by_rank[0]["median_compute_s"]
    assert 0.15 < gap < 0.3, gap



def test_a_bad_slow_rank_hook_is_refused_before_anything_starts(tmp_path):
    for value, says in (("1:x", "is not RANK:SECONDS"), ("2:0.1", "names rank 2 of a 2-rank")):
        res = run_cli("run", "-w", "pretrain_llama3.1", "-s", "tiny", "--scale", "2", "--gpu",
                      "cpu", "--steps", "7", root=tmp_path / "root",
                      env={"TRAINBENCH_SLOW_RANK": value})
        assert res.returncode == 2
        (line,) = res.stderr.strip().splitlines()
        assert line.startswith("trainbench: error: TRAINBENCH_SLOW_RANK=") and says in line
        assert not (tmp_path / "root").exists()  # no experiment directory, no job row
