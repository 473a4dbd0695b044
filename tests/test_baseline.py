"""Repeats with confidence and baseline/reference verdicts (issue #17 items 4-5): the
statistics against published table values and hand-derived figures, repeats of real NeMo
logs, and three real tiny runs from one `trainbench bulk` sweep (repeats: 3) checked
against a baseline of themselves, a baseline twice as fast and a different loss curve."""

from __future__ import annotations

import json
import math
import re
import shutil
import statistics
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainbench.cli import app
from trainbench.results import baseline as bl
from trainbench.results import repeats, stats
from trainbench.results.summary import summarize_paths

from helpers import run_cli

LOGS = Path(__file__).parent / "data" / "logs"
NEMO_8B = (LOGS / "nemo2" / "experiments" / "pretrain_llama3.1_8b_bf16_8"
           / "pretrain_llama3.1_8b_bf16_8_1744400000" / "pretrain_llama3.1_8b_bf16_8"
           / "log-pretrain_llama3.1_8b_bf16_8.out")
runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, [str(a) for a in args])


def error_line(res) -> str:
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trainbench: error: "), res.stderr
    return lines[0]


# --- statistics ------------------------------------------------------------------------------

# Two-sided 95% critical values of Student's t as printed in the NIST/SEMATECH e-Handbook
# of Statistical Methods, 1.3.6.7.2 (and any textbook table), against the code's t
# distribution (computed, not tabled): printed rows, rows between them (35, 45, 90) and
# towards the normal limit (200: 1.972, infinity: 1.960).
@pytest.mark.parametrize("dof, published", [
    (1, 12.706), (2, 4.303), (4, 2.776), (9, 2.262), (30, 2.042),
    (35, 2.030), (45, 2.014), (90, 1.987), (200, 1.972), (10**6, 1.960)])
def test_t_quantiles_match_the_published_table(dof, published):
    assert stats.t_quantile_975(dof) == pytest.approx(published, abs=1.5e-3)


def test_t_quantile_needs_a_degree_of_freedom():
    with pytest.raises(ValueError, match="at least 1"):
        stats.t_quantile_975(0)


def test_interval_by_hand():
    # 1, 2, 3: mean 2, s = 1, half-width t_{0.975,2} / sqrt(3) = 4.3027 / 1.73205 = 2.4842
    # (t to four decimals, as four-decimal tables print it).
    iv = stats.interval([1.0, 2.0, 3.0])
    assert (iv.n, iv.mean, iv.std) == (3, 2.0, 1.0)
    assert iv.low == pytest.approx(2 - 2.4842, abs=1e-4)
    assert iv.high == pytest.approx(2 + 2.4842, abs=1e-4)
    # 10..18 step 2: s = sqrt(10), half-width 2.7764 * sqrt(10) / sqrt(5) = 3.9264.
    iv = stats.interval([10.0, 12.0, 14.0, 16.0, 18.0])
    assert (iv.low, iv.high) == (pytest.approx(10.0736, abs=1e-4), pytest.approx(17.9264, abs=1e-4))
    one = stats.interval([5.0])
    assert (one.n, one.mean, one.std, one.low) == (1, 5.0, None, None)


@pytest.mark.parametrize("low, high, mean, expected", [
    (0.97, 1.03, 1.0, "within 5%"),
    (1.10, 1.20, 1.15, "15% slower"),
    (0.80, 0.90, 0.85, "15% faster"),
    (1.02, 1.08, 1.05, repeats.INCONCLUSIVE),   # straddles the +5% edge
    (0.90, 1.10, 1.00, repeats.INCONCLUSIVE),   # straddles both edges
])
def test_a_verdict_only_when_the_whole_interval_supports_it(low, high, mean, expected):
    assert repeats.interval_verdict(low, high, mean, 5.0) == expected


def test_pearson_and_the_loss_rule():
    assert bl.pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    assert bl.pearson([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    # x = 1..4, y = 1, 3, 2, 4: sxy = 4, sxx = syy = 5 -> r = 0.8.
    assert bl.pearson([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    falling = {0: 6.25, 1: 6.10, 2: 5.90, 3: 5.80}
    ok, said = bl.loss_check(falling, {i: v + 0.01 for i, v in falling.items()})
    assert ok and "loss correlation 1.000 over 4 iterations" in said
    rising = {0: 5.0, 1: 5.5, 2: 6.0, 3: 6.2}
    ok, said = bl.loss_check(falling, rising)
    assert not ok and "loss curve correlation" in said and "< 0.95" in said
    ok, said = bl.loss_check(falling, {0: 6.25, 1: 6.10, 9: 1.0})
    assert not ok and "cannot be computed: 2 common iteration(s)" in said


# --- repeats of real logs --------------------------------------------------------------------

def _scaled_copy(dest: Path, factor: float) -> None:
    """The NeMo 2 8B log with every step time multiplied by factor."""
    dest.mkdir(parents=True)
    text = NEMO_8B.read_text()
    text = re.sub(r"(train_step_timing in s: )([0-9.]+)",
                  lambda m: f"{m.group(1)}{float(m.group(2)) * factor!r}", text)
    (dest / NEMO_8B.name).write_text(text)


def _group(tmp_path: Path, factors: list[float]) -> tuple[repeats.RepeatGroup, list]:
    for i, f in enumerate(factors):
        _scaled_copy(tmp_path / f"run{i}", f)
    results = summarize_paths([tmp_path])
    (group,) = repeats.group_results(results)
    return group, results


def test_repeats_of_a_nemo_log_within_the_reference(tmp_path):
    group, results = _group(tmp_path, [1.0, 1.01, 0.99])
    assert len(group.used) == 3 and group.key["source"] == "inferred"
    tokens = [r.tokens_per_s for r in results]
    half = 4.303 * statistics.stdev(tokens) / math.sqrt(3)
    assert group.tokens_per_s.mean == pytest.approx(statistics.fmean(tokens))
    assert group.tokens_per_s.low == pytest.approx(statistics.fmean(tokens) - half, rel=1e-3)
    assert group.tokens_per_s.high == pytest.approx(statistics.fmean(tokens) + half, rel=1e-3)
    # The reference is 85,459 tokens/s; the whole interval is within 5% of it.
    assert 85459 / group.tokens_per_s.high > 0.95 and 85459 / group.tokens_per_s.low < 1.05
    assert group.verdict == "within 5%"


def test_repeats_too_spread_are_inconclusive_and_clearly_slow_ones_are_slower(tmp_path):
    group, _ = _group(tmp_path / "wide", [1.0, 1.3, 0.9])
    assert group.verdict == repeats.INCONCLUSIVE
    group, _ = _group(tmp_path / "slow", [1.20, 1.21, 1.19])
    assert group.verdict.endswith("% slower")
    ratio = 85459 / group.tokens_per_s.mean
    assert group.verdict == f"{(ratio - 1) * 100:.0f}% slower" and ratio > 1.15


def test_one_run_keeps_its_own_verdict_and_says_it_is_one_run(tmp_path):
    group, results = _group(tmp_path, [1.0])
    assert results[0].verdict == "within 5%"
    assert group.verdict == "within 5% (1 run)"
    assert group.step_time.n == 1 and group.step_time.low is None


def test_results_table_shows_repeats_only_when_a_plan_has_several(tmp_path):
    _scaled_copy(tmp_path / "one" / "run0", 1.0)
    res = invoke("results", tmp_path / "one")
    assert res.exit_code == 0 and "repeats (" not in res.stdout
    for i, f in enumerate([1.0, 1.3, 0.9]):
        _scaled_copy(tmp_path / "three" / f"run{i}", f)
    res = invoke("results", tmp_path / "three")
    assert res.exit_code == 0, res.output
    assert "n=3/3" in res.stdout and repeats.INCONCLUSIVE in res.stdout


def test_reference_mode_against_the_published_table(tmp_path):
    # The NeMo 2 8B log runs 84,583 tokens/s against the seed's 85,459: 99.0%.
    _scaled_copy(tmp_path / "as_logged" / "run0", 1.0)
    res = invoke("results", tmp_path / "as_logged", "--reference")
    assert res.exit_code == 0, res.output
    assert "PASS" in res.stdout and "99.0% of the reference's 85,459 tokens/s" in res.stdout
    # 10% longer steps: 84,583 / 1.1 / 85,459 = 90.0%, under the 95% a certification asks.
    _scaled_copy(tmp_path / "slow" / "run0", 1.1)
    res = invoke("results", tmp_path / "slow", "--reference")
    assert res.exit_code == 1, res.output
    assert "FAIL" in res.stdout and "90.0% of the reference's" in res.stdout
    assert invoke("results", tmp_path / "slow", "--reference", "--tolerance", "11"
                  ).exit_code == 0


# --- three real tiny runs from one bulk sweep -------------------------------------------------

@pytest.fixture(scope="module")
def tiny_repeats(tmp_path_factory) -> Path:
    """Three real runs of one tiny plan (`bulk` with repeats: 3, the real path)."""
    root = tmp_path_factory.mktemp("repeats")
    sweep = root / "sweep.yaml"
    sweep.write_text("defaults: {gpu: cpu, steps: 3}\n"
                     "tasks:\n  - {workload: pretrain_llama3.1, size: tiny, dtype: fp32, "
                     "scale: 1, repeats: 3}\n")
    res = run_cli("bulk", str(sweep), root=root, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    runs = sorted((root / "experiments").glob("*/*/plan.json"))
    assert len(runs) == 3
    return root / "experiments"


@pytest.mark.slow
def test_three_repeats_give_a_confidence_interval(tiny_repeats):
    res = invoke("results", tiny_repeats, "--format", "json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    (plan,) = data["plans"]
    assert (plan["runs"], plan["runs_used"]) == (3, 3)
    means = [r["step_time_mean_s"] for r in data["experiments"]]
    st = plan["step_time_s"]
    assert st["mean"] == pytest.approx(statistics.fmean(means))
    assert st["std"] == pytest.approx(statistics.stdev(means))
    half = 4.303 * statistics.stdev(means) / math.sqrt(3)  # t_{0.975,2}, published
    assert st["ci95_low"] == pytest.approx(st["mean"] - half, rel=1e-3)
    assert st["ci95_high"] == pytest.approx(st["mean"] + half, rel=1e-3)
    assert plan["verdict"] == "no reference"  # a tiny CPU plan has no published number
    table = invoke("results", tiny_repeats)
    assert "n=3/3" in table.stdout and "llama3.1 tiny fp32 1xcpu" in table.stdout
    rows = invoke("results", tiny_repeats, "--format", "csv").stdout.splitlines()
    assert "plan_step_time_ci95_low_s" in rows[0] and len(rows) == 4


@pytest.mark.slow
def test_a_run_passes_against_itself_and_fails_against_half_the_step_time(tiny_repeats,
                                                                           tmp_path):
    saved = tmp_path / "baseline.json"
    res = invoke("results", tiny_repeats, "--save-baseline", saved)
    assert res.exit_code == 0, res.output
    doc = json.loads(saved.read_text())
    (entry,) = doc["plans"]
    assert (doc["format"], doc["version"], entry["step_time_s"]["n"]) == (bl.FORMAT, 1, 3)
    assert len(entry["loss"]["values"]) == 3 and entry["conditions"]["torch"]

    res = invoke("results", tiny_repeats, "--baseline", saved)
    assert res.exit_code == 0, res.output
    assert "PASS" in res.stdout and "1 of 1 plan(s) pass" in res.stdout
    # Earlier experiment directories as the baseline: the same verdict.
    assert invoke("results", tiny_repeats, "--baseline", tiny_repeats).exit_code == 0

    entry["step_time_s"]["mean"] /= 2
    half = tmp_path / "half.json"
    half.write_text(json.dumps(doc))
    res = invoke("results", tiny_repeats, "--baseline", half)
    assert res.exit_code == 1, res.output
    (line,) = [x for x in res.stdout.splitlines() if x.strip().startswith("FAIL")]
    assert "100.0% slower, beyond the 5% tolerance" in line
    # A baseline 4% faster than the runs: inside the default 5%, outside --tolerance 3.
    entry["step_time_s"]["mean"] *= 2 / 1.04
    near = tmp_path / "near.json"
    near.write_text(json.dumps(doc))
    assert invoke("results", tiny_repeats, "--baseline", near).exit_code == 0
    res = invoke("results", tiny_repeats, "--baseline", near, "--tolerance", "3")
    assert res.exit_code == 1 and "4.0% slower, beyond the 3% tolerance" in res.stdout
    res = invoke("results", tiny_repeats, "--baseline", half, "--format", "json")
    assert res.exit_code == 1
    assert json.loads(res.stdout)["baseline_check"]["passed"] is False


@pytest.mark.slow
def test_a_different_loss_curve_or_plan_fails(tiny_repeats, tmp_path):
    saved = tmp_path / "baseline.json"
    assert invoke("results", tiny_repeats, "--save-baseline", saved).exit_code == 0
    doc = json.loads(saved.read_text())
    doc["plans"][0]["loss"]["values"] = [5.0, 5.5, 6.0]  # rising: another training
    other = tmp_path / "other_loss.json"
    other.write_text(json.dumps(doc))
    res = invoke("results", tiny_repeats, "--baseline", other)
    assert res.exit_code == 1 and "loss curve correlation" in res.stdout

    doc = json.loads(saved.read_text())
    doc["plans"][0]["key"]["mbs"] = 1  # the baseline measured another plan
    moved = tmp_path / "other_plan.json"
    moved.write_text(json.dumps(doc))
    res = invoke("results", tiny_repeats, "--baseline", moved)
    assert res.exit_code == 1
    assert "NO BASELINE" in res.stdout and "MISSING" in res.stdout

    res = invoke("results", tiny_repeats, "--reference")
    assert res.exit_code == 1 and "NO REFERENCE" in res.stdout


@pytest.mark.slow
def test_bad_baseline_input_is_one_line(tiny_repeats, tmp_path):
    assert "does not exist" in error_line(invoke("results", tiny_repeats, "--baseline",
                                                 tmp_path / "none.json"))
    foreign = tmp_path / "foreign.json"
    foreign.write_text('{"plans": []}')
    assert "is not a trainbench baseline file" in error_line(
        invoke("results", tiny_repeats, "--baseline", foreign))
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"format": bl.FORMAT, "version": 99, "plans": []}))
    assert "version 99" in error_line(invoke("results", tiny_repeats, "--baseline", old))
    (tmp_path / "empty").mkdir()
    assert "no experiments found" in error_line(invoke("results", tiny_repeats, "--baseline",
                                                       tmp_path / "empty"))
    saved = tmp_path / "b.json"
    saved.write_text("keep me")
    line = error_line(invoke("results", tiny_repeats, "--save-baseline", saved))
    assert "already exists" in line and "choose another file name" in line
    assert saved.read_text() == "keep me"


@pytest.mark.slow
def test_a_copied_run_is_the_same_plan_and_an_override_another(tiny_repeats, tmp_path):
    """out_dir and the environment are not the plan; an --set override (here mbs) is."""
    run = sorted(p.parent for p in tiny_repeats.glob("*/*/plan.json"))[0]
    shutil.copytree(run, tmp_path / "copy")
    shutil.copytree(run, tmp_path / "mbs1")
    plan = json.loads((tmp_path / "mbs1" / "plan.json").read_text())
    plan.update(mbs=1, ga=8, out_dir=str(tmp_path / "mbs1"), env=[["NCCL_ALGO", "Ring"]])
    (tmp_path / "mbs1" / "plan.json").write_text(json.dumps(plan))
    copy = json.loads((tmp_path / "copy" / "plan.json").read_text())
    copy.update(out_dir=str(tmp_path / "copy"), env=[["NCCL_ALGO", "Ring"]])
    (tmp_path / "copy" / "plan.json").write_text(json.dumps(copy))
    groups = repeats.group_results(summarize_paths([run, tmp_path / "copy", tmp_path / "mbs1"]))
    assert sorted(len(g.results) for g in groups) == [1, 2]
    assert any("MBS1" in g.label for g in groups)
