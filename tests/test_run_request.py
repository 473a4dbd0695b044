"""launch/request.py: a run request becomes a validated plan without Typer, creating nothing."""

from __future__ import annotations

import pytest

from trainbench.launch.request import RunRequest, RunRequestError, plan_run


@pytest.fixture(autouse=True)
def _no_user_config(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINBENCH_CONFIG", str(tmp_path / "no-cluster.yaml"))


def request(tmp_path, **fields) -> RunRequest:
    base = dict(workload="pretrain_llama3.1", size="tiny", scale=2, dtype="fp32", gpu="cpu",
                root=tmp_path / "root", environ={})
    return RunRequest(**{**base, **fields})


def test_a_valid_request_plans_the_recipe_row_and_creates_nothing(tmp_path):
    planned = plan_run(request(tmp_path, settings=("gbs=16",), steps=7))
    plan = planned.plan
    assert (plan.workload, plan.size, plan.dtype, plan.gpus) == ("pretrain_llama3.1", "tiny",
                                                                  "fp32", 2)
    assert (plan.gbs, plan.steps, plan.layout.dp) == (16, 7, 2)
    assert planned.root == tmp_path / "root"
    # Planning checks the root but writes nothing there: no experiment, no job history.
    assert not (tmp_path / "root").exists() or not any((tmp_path / "root").rglob("*"))


def test_seed_variables_come_from_the_request_environment(tmp_path):
    planned = plan_run(request(tmp_path, environ={"ENABLE_PROFILE": "true",
                                                  "PROFILE_START_STEP": "3",
                                                  "PROFILE_STOP_STEP": "4"}))
    f = planned.plan.features
    assert (f.profile, f.profile_start, f.profile_stop) == ("torch", 3, 4)
    # Profiling shortens the default run to 25 steps, as the seeds' launcher does.
    assert planned.plan.steps == 25


@pytest.mark.parametrize("fields, words", [
    (dict(environ={"ENABLE_PROFILE": "maybe"}), "ENABLE_PROFILE='maybe' is not a boolean"),
    (dict(environ={"PROFILE_START_STEP": "x"}), "PROFILE_START_STEP='x' is not an integer"),
    (dict(scale=0), "--scale 0"),
    (dict(executor="kubernetes"), "unknown executor 'kubernetes'"),
    (dict(profile_ranks="5"), "ranks must be in 0-1"),
    (dict(settings=("tp=0",)), "--set tp=0: parallel degrees must be at least 1"),
    (dict(env=("LD_PRELOAD=/tmp/x.so",)), "LD_PRELOAD"),
])
def test_bad_requests_are_refused_with_the_problem_named(tmp_path, fields, words):
    with pytest.raises(RunRequestError) as caught:
        plan_run(request(tmp_path, **fields))
    assert any(words in problem for problem in caught.value.problems), caught.value.problems
    assert not (tmp_path / "root").exists()


def test_a_root_that_is_a_file_is_refused_before_a_real_run_but_not_a_dry_run(tmp_path):
    (tmp_path / "root").write_text("not a directory")
    with pytest.raises(RunRequestError) as caught:
        plan_run(request(tmp_path))
    assert str(tmp_path / "root") in caught.value.problems[0]
    assert plan_run(request(tmp_path, dry_run=True)).plan.gpus == 2
