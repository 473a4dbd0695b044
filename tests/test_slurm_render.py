"""The Slurm executor without a Slurm: the rendered job script, its validation and
quoting, the job history database and bulk sweeps.

Scripts are not only inspected but executed by bash, with stand-ins for the two Slurm
commands a job script calls (srun, scontrol) that record the argv and environment srun
would have been given: that proves what the ranks receive, and that no hostile string
ever runs. tests/slurm/ runs the same scripts under a real slurmctld/slurmd.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainbench.cli import app
from trainbench.launch import bulk
from trainbench.launch.jobs import (JobsDB, jobcomp_record, normalise_state, parse_elapsed,
                                    parse_exit_code, refresh)
from trainbench.launch.sbatch import render_sbatch
from trainbench.launch.slurm import SlurmError, SlurmOptions, check_extra_arg, check_options
from trainbench.plan import PlanError
from trainbench.planning import build_plan

HOSTILE = ["$(touch {c})", "`touch {c}`", "'; touch {c}; '", '"; touch {c}; "',
           "a b\\ $HOME {c}", "${{IFS}}touch${{IFS}}{c}", "x & touch {c} &", "|touch {c}"]


def llama70b_fp8_256(**env):
    return build_plan("pretrain_llama3.1", "70b", "fp8", 256, "h100", env=env)


def tiny_cpu(scale=2, **env):
    return build_plan("pretrain_llama3.1", "tiny", "bf16", scale, "cpu", steps=5, env=env)


def directives(script: str) -> list[str]:
    return [line[len("#SBATCH "):] for line in script.splitlines() if line.startswith("#SBATCH ")]


# --- running a rendered script with stand-ins for srun and scontrol ------------------------

def fake_slurm_bin(tmp: Path) -> Path:
    """srun that records argv (NUL-separated) and environment, then exits with $FAKE_RC;
    scontrol that expands the job's hostlist into numbered node names."""
    bin_dir = tmp / "fake-bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(
        "#!/bin/bash\n"
        'printf "%s\\0" "$@" > "$CAPTURE/argv"\n'
        'env -0 > "$CAPTURE/env"\n'
        'exit "${FAKE_RC:-0}"\n')
    (bin_dir / "scontrol").write_text(
        "#!/bin/bash\n"
        '[ "$1 $2" = "show hostnames" ] || exit 1\n'
        'for i in $(seq -f %03g "$SLURM_JOB_NUM_NODES"); do echo "node$i"; done\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return bin_dir


def run_script(script: str, tmp: Path, exp_dir: Path, nodes: int, rc: int = 0):
    """Execute the job script as sbatch would on the first node; (exit code, argv, env)."""
    bin_dir = fake_slurm_bin(tmp)
    capture = tmp / "capture"
    capture.mkdir()
    path = tmp / "job.sh"
    path.write_text(script)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "CAPTURE": str(capture),
           "FAKE_RC": str(rc), "SLURM_JOB_ID": "4242", "SLURM_JOB_NUM_NODES": str(nodes),
           "SLURM_JOB_NODELIST": f"node[001-{nodes:03d}]", "HOME": str(tmp)}
    proc = subprocess.run(["bash", str(path)], env=env, cwd=tmp, capture_output=True,
                          text=True, timeout=30)
    if not (capture / "argv").exists():  # the script broke before reaching srun
        return proc.returncode, None, None
    argv = (capture / "argv").read_bytes().decode().split("\0")[:-1]
    job_env = dict(item.split("=", 1) for item in
                   (capture / "env").read_bytes().decode().split("\0") if "=" in item)
    return proc.returncode, argv, job_env


# --- a seed row at real scale -------------------------------------------------------------

def test_llama31_70b_fp8_256_gpus_script(tmp_path):
    plan = llama70b_fp8_256(NCCL_IB_HCA="mlx5_0,mlx5_1")
    exp_dir = tmp_path / "exp"
    exp_dir.mkdir()
    opts = SlurmOptions(account="perf", partition="batch", gres="gpu:8", time_limit="01:00:00",
                        extra_args=("--qos=high",))
    script = render_sbatch(plan, exp_dir, opts, {"env": {"NCCL_DEBUG": "WARN"}})
    d = directives(script)
    assert plan.num_nodes == 32
    assert d == [f"--job-name={plan.name}", "--nodes=32", "--ntasks-per-node=1",
                 "--time=01:00:00", f"--output=sbatch_{plan.name}.out", "--account=perf",
                 "--partition=batch", "--gres=gpu:8", "--exclusive", "--qos=high"]
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)

    code, argv, env = run_script(script, tmp_path, exp_dir, nodes=32)
    assert code == 0
    assert argv == [
        "--kill-on-bad-exit=1", sys.executable, "-m", "torch.distributed.run",
        "--nnodes=32", "--nproc-per-node=8", "--rdzv-backend=c10d",
        f"--rdzv-endpoint=node001:{20000 + 4242 % 20000}", "--rdzv-id=4242",
        "--max-restarts=0", "-m", "trainbench.engine", str(exp_dir / "plan.json")]
    assert env["NCCL_DEBUG"] == "WARN" and env["NCCL_IB_HCA"] == "mlx5_0,mlx5_1"
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["PYTORCH_ALLOC_CONF"] == "expandable_segments:True"
    record = json.loads((exp_dir / "exit.json").read_text())
    assert record["exit_code"] == 0 and record["executor"] == "slurm"
    assert record["job_id"] == "4242"


@pytest.mark.parametrize("name", ["PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"])
def test_an_allocator_setting_of_the_user_is_kept_and_a_cpu_job_gets_none(tmp_path, name):
    """trainbench's allocator default (expandable segments) stands only where neither of
    torch's two variables comes from the plan's --env, the cluster config or the
    submitting shell; a CPU job has no CUDA allocator to configure."""
    from trainbench.launch.sbatch import job_environment
    ours = "PYTORCH_ALLOC_CONF"
    user = dict(job_environment(llama70b_fp8_256(**{name: "max_split_size_mb:512"}), {}))
    assert user[name] == "max_split_size_mb:512"
    assert ours not in user or name == ours
    config = dict(job_environment(llama70b_fp8_256(), {"env": {name: "garbage_collection_threshold:0.8"}}))
    assert config[name] == "garbage_collection_threshold:0.8"
    assert ours not in config or name == ours
    assert ours not in dict(job_environment(tiny_cpu(), {}))


def test_the_local_executor_sets_the_same_allocator_default(monkeypatch):
    from trainbench.launch.local import rank_environment
    for name in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        monkeypatch.delenv(name, raising=False)
    assert rank_environment(llama70b_fp8_256())["PYTORCH_ALLOC_CONF"] == "expandable_segments:True"
    assert "PYTORCH_ALLOC_CONF" not in rank_environment(tiny_cpu())
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")
    env = rank_environment(llama70b_fp8_256())
    assert "PYTORCH_ALLOC_CONF" not in env
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:False"


def test_ranks_per_node_and_nodes():
    # Fewer ranks than a node holds: one node, as many ranks as the plan has.
    plan = build_plan("pretrain_llama3.1", "8b", "bf16", 8, "h100", gpus_per_node=8)
    script = render_sbatch(replace(plan, layout=replace(plan.layout, dp=2, cp=2)),
                           Path("/x"), SlurmOptions(), {})
    assert "--nodes=1" in directives(script) and "TB_NPROC_PER_NODE=4" in script
    script = render_sbatch(tiny_cpu(2), Path("/x"), SlurmOptions(exclusive=False), {})
    assert "--nodes=1" in directives(script) and "TB_NPROC_PER_NODE=2" in script
    assert "--exclusive" not in directives(script)
    assert not any(d.startswith("--gres") for d in directives(script))


def test_failed_run_writes_its_exit_code(tmp_path):
    exp_dir = tmp_path / "exp"
    exp_dir.mkdir()
    script = render_sbatch(tiny_cpu(), exp_dir, SlurmOptions(), {})
    code, _, _ = run_script(script, tmp_path, exp_dir, nodes=1, rc=3)
    assert code == 3
    record = json.loads((exp_dir / "exit.json").read_text())
    assert record["exit_code"] == 3 and record["reason"] == "exit code 3"


def test_nsys_profile_wraps_each_rank(tmp_path):
    from trainbench.plan import Features
    plan = build_plan("pretrain_llama3.1", "8b", "bf16", 16, "h100",
                      features=Features(profile="nsys"))
    exp_dir = tmp_path / "e $(touch CANARY)"
    exp_dir.mkdir()
    code, argv, _ = run_script(render_sbatch(plan, exp_dir, SlurmOptions(), {}), tmp_path,
                               exp_dir, nodes=2)
    assert code == 0 and not (tmp_path / "CANARY").exists()
    assert argv[argv.index("--no-python") + 1:argv.index("--no-python") + 3] == ["nsys", "profile"]
    assert f"--output={exp_dir}/profile/nsys-rank%q{{RANK}}" in argv
    assert argv[-4:] == [sys.executable, "-m", "trainbench.engine", str(exp_dir / "plan.json")]
    assert (exp_dir / "profile").is_dir()


def test_cluster_config_fills_account_partition_gres():
    cluster = {"slurm": {"account": "acc", "partition": "gpu", "gres": "gpu:4",
                         "extra_args": ["--qos=low"]}}
    d = directives(render_sbatch(tiny_cpu(), Path("/x"), SlurmOptions(), cluster))
    assert {"--account=acc", "--partition=gpu", "--gres=gpu:4", "--qos=low"} <= set(d)
    d = directives(render_sbatch(tiny_cpu(), Path("/x"),
                                 SlurmOptions(account="mine", partition="p2"), cluster))
    assert "--account=mine" in d and "--partition=p2" in d and "--account=acc" not in d


# --- injection: neutralised by quoting -----------------------------------------------------

def test_hostile_env_values_and_path_never_run(tmp_path):
    canary = tmp_path / "CANARY"
    values = [h.format(c=canary) for h in HOSTILE]
    env = {f"V{i}": v for i, v in enumerate(values)}
    # A directory name made of the same characters (all legal in a file name).
    exp_dir = tmp_path / f"run $(touch {canary.name}) `touch {canary.name}` 'q' \"d\" ;x"
    exp_dir.mkdir()
    cluster_value = f"c $(touch {canary}) '"
    script = render_sbatch(tiny_cpu(**env), exp_dir, SlurmOptions(job_name="hostile-test"),
                           {"env": {"FROM_CLUSTER": cluster_value}})
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    code, argv, job_env = run_script(script, tmp_path, exp_dir, nodes=1)
    assert not canary.exists(), "a hostile string was executed"
    assert not (exp_dir / canary.name).exists() and not (tmp_path / canary.name).exists()
    assert code == 0
    for key, value in env.items():
        assert job_env[key] == value  # arrives byte for byte
    assert job_env["FROM_CLUSTER"] == cluster_value
    assert argv[-1] == str(exp_dir / "plan.json")
    assert json.loads((exp_dir / "exit.json").read_text())["exit_code"] == 0
    # Nothing path-like reaches a #SBATCH line (sbatch cannot quote).
    assert all(str(tmp_path) not in d for d in directives(script))


# --- injection: refused ----------------------------------------------------------------------

@pytest.mark.parametrize("env", [
    {"A": "line1\ntouch /tmp/x"}, {"A": "cr\rx"}, {"A;touch x": "1"}, {"A B": "1"},
    {"1A": "1"}, {"$(x)": "1"}, {"": "1"},
    # names the script or Slurm use themselves
    {"TB_EXP_DIR": "/elsewhere"}, {"TB_PYTHON": "/bin/sh"}, {"SLURM_JOB_ID": "1"},
    {"PATH": "/x"}, {"IFS": "x"}, {"BASH_ENV": "/tmp/x.sh"}])
def test_bad_env_refused(env):
    with pytest.raises(SlurmError):
        render_sbatch(tiny_cpu(**env), Path("/x"), SlurmOptions(), {})


@pytest.mark.parametrize("key", ["HF_TOKEN", "WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY",
                                 "DB_PASSWORD", "github_token"])
def test_secrets_refused_in_plan_and_config_env(key, monkeypatch):
    monkeypatch.setenv(key, "s3cr3t-value")
    with pytest.raises(SlurmError) as err:
        render_sbatch(tiny_cpu(**{key: "s3cr3t-value"}), Path("/x"), SlurmOptions(), {})
    assert f"{key} looks like a secret" in err.value.problems[0]
    assert "export" in err.value.problems[0]
    with pytest.raises(SlurmError):
        render_sbatch(tiny_cpu(), Path("/x"), SlurmOptions(), {"env": {key: "s3cr3t-value"}})
    # Set in the submitting shell it is fine, and still not written into the script.
    assert "s3cr3t-value" not in render_sbatch(tiny_cpu(), Path("/x"), SlurmOptions(), {})


def test_token_looking_value_refused_and_lookalike_names_allowed():
    with pytest.raises(SlurmError):
        render_sbatch(tiny_cpu(X="hf_" + "a1B2" * 9), Path("/x"), SlurmOptions(), {})
    script = render_sbatch(tiny_cpu(TOKENIZERS_PARALLELISM="false", HF_TOKEN_PATH="/p"),
                           Path("/x"), SlurmOptions(), {})
    assert "export TOKENIZERS_PARALLELISM=false" in script


@pytest.mark.parametrize("arg", [
    "--qos=a\ntouch /tmp/x", "--comment=$(touch x)", "--comment=`x`", "--qos=high;rm",
    "--qos high", "-q high", "--comment='x'", "--output=/tmp/o", "--out=/tmp/o",
    "--chdir=/", "--export=NONE", "--wrap=id", "--time=1", "--nodes=2", "--exclusive=user",
    "--qos=a#b", "--comment=a\\b"])
def test_bad_slurm_args_refused(arg):
    assert check_extra_arg(arg) is not None
    with pytest.raises(SlurmError):
        render_sbatch(tiny_cpu(), Path("/x"), SlurmOptions(extra_args=(arg,)), {})


@pytest.mark.parametrize("arg", ["--qos=high", "--constraint=h100&ib", "--mem=0", "--requeue",
                                 "--signal=USR1@90", "--switches=1@00:10:00"])
def test_good_slurm_args_pass_through(arg):
    assert check_extra_arg(arg) is None
    assert arg in directives(render_sbatch(tiny_cpu(), Path("/x"),
                                           SlurmOptions(extra_args=(arg,)), {}))


@pytest.mark.parametrize("field,value", [
    ("job_name", "a b"), ("job_name", "x\n#SBATCH --wrap=id"), ("job_name", "$(id)"),
    ("account", "acc;id"), ("account", "a\nb"), ("partition", "p q"), ("partition", "`id`"),
    ("reservation", "r$(id)"), ("nodelist", "n1\ntouch x"), ("nodelist", "/etc/hosts"),
    ("nodelist", "n[1-2];id"), ("exclude", "n1 n2"), ("gres", "gpu:8;id"),
    ("time_limit", "1h"), ("time_limit", "00:30:00\nid")])
def test_bad_option_values_refused(field, value):
    with pytest.raises(SlurmError):
        render_sbatch(tiny_cpu(), Path("/x"), SlurmOptions(**{field: value}), {})


def test_good_option_values_accepted():
    opts = SlurmOptions(nodelist="node[001-004,007]", exclude="node9", reservation="bench_1",
                        partition="gpu,gpu-long", time_limit="1-00:00:00", gres="gpu:h100:8")
    d = directives(render_sbatch(tiny_cpu(), Path("/x"), opts, {}))
    assert {"--nodelist=node[001-004,007]", "--exclude=node9", "--reservation=bench_1",
            "--partition=gpu,gpu-long", "--time=1-00:00:00", "--gres=gpu:h100:8"} <= set(d)


def test_newline_in_path_or_plan_name_refused():
    with pytest.raises(SlurmError):
        render_sbatch(tiny_cpu(), Path("/tmp/a\nb"), SlurmOptions(), {})
    with pytest.raises(SlurmError):
        render_sbatch(replace(tiny_cpu(), name="x;id"), Path("/x"), SlurmOptions(), {})


def test_every_problem_listed_at_once():
    with pytest.raises(SlurmError) as err:
        check_options(tiny_cpu(HF_TOKEN="x"), SlurmOptions(account="a b", partition="$(x)"), {})
    assert len(err.value.problems) == 3
    assert isinstance(err.value, PlanError)


# --- the job history database --------------------------------------------------------------

def test_jobs_db_roundtrip(tmp_path):
    db = JobsDB(tmp_path)
    a = db.add("slurm", "17", "n1", str(tmp_path / "e1"), "{}", "PENDING")
    b = db.add("local", "999", "n2", str(tmp_path / "e2"), "{}", "RUNNING")
    db.update(a, state="RUNNING", slurm_state="RUNNING")
    assert [j["id"] for j in JobsDB(tmp_path).list()] == [a, b]  # persisted on disk
    assert db.get(a)["state"] == "RUNNING" and db.find("17")["id"] == a
    assert db.get(12345) is None
    with pytest.raises(ValueError):
        db.update(a, colour="red")
    with pytest.raises(KeyError):
        db.update(12345, state="FAILED")


def test_refresh_local_jobs_from_exit_json(tmp_path):
    db = JobsDB(tmp_path)
    ok, bad = tmp_path / "ok", tmp_path / "bad"
    for d, code in ((ok, 0), (bad, 1)):
        d.mkdir()
        (d / "exit.json").write_text(json.dumps({"exit_code": code, "elapsed_s": 2.5}))
    a = db.add("local", "1", "n", str(ok), "{}", "RUNNING")
    b = db.add("local", "2", "n", str(bad), "{}", "RUNNING")
    # A live process whose command line names trainbench stands for a running launcher.
    launcher = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                                 "trainbench"])
    try:
        c = db.add("local", str(launcher.pid), "n", str(tmp_path / "still-running"), "{}",
                   "RUNNING")
        refresh(db)
        assert db.get(c)["state"] == "RUNNING"
    finally:
        launcher.kill()
        launcher.wait()
    assert (db.get(a)["state"], db.get(a)["exit_code"], db.get(a)["elapsed_s"]) == \
        ("COMPLETED", 0, 2.5)
    assert (db.get(b)["state"], db.get(b)["exit_code"]) == ("FAILED", 1)
    # Finished jobs get results, or a note saying why there are none.
    assert db.get(a)["results_json"] is not None or db.get(a)["note"]


def test_refresh_without_slurm_keeps_state_or_reads_exit_json(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # a machine without Slurm commands
    db = JobsDB(tmp_path)
    running = db.add("slurm", "5", "n", str(tmp_path / "a"), "{}", "RUNNING")
    done_dir = tmp_path / "b"
    done_dir.mkdir()
    (done_dir / "exit.json").write_text(json.dumps({"exit_code": 0, "elapsed_s": 7}))
    done = db.add("slurm", "6", "n", str(done_dir), "{}", "RUNNING")
    refresh(db)
    assert db.get(running)["state"] == "RUNNING"
    assert "squeue is not available" in db.get(running)["note"]
    assert (db.get(done)["state"], db.get(done)["elapsed_s"]) == ("COMPLETED", 7)


def test_slurm_field_parsers():
    assert parse_exit_code("0:0") == 0 and parse_exit_code("2:0") == 2
    assert parse_exit_code("0:15") == 128 + 15 and parse_exit_code("junk") is None
    assert parse_elapsed("1-02:03:04") == 93784 and parse_elapsed("05:06") == 306
    assert normalise_state("CANCELLED by 0") == "CANCELLED"
    assert normalise_state("NODE_FAIL") == "FAILED" and normalise_state("COMPLETING") == "RUNNING"


def test_jobcomp_record_first_field_wins(tmp_path):
    """A WorkDir that contains ' JobState=COMPLETED' must not fake the job's state."""
    path = tmp_path / "jobcomp.txt"
    path.write_text(
        "JobId=7 UserId=root(0) Name=x JobState=COMPLETED StartTime=2026-01-01T00:00:00 "
        "EndTime=2026-01-01T00:00:09 ExitCode=0:0\n"
        "JobId=71 UserId=root(0) Name=y JobState=FAILED StartTime=2026-01-01T00:00:00 "
        "EndTime=2026-01-01T00:01:00 WorkDir=/a JobState=COMPLETED ExitCode=1:0 ExitCode=0:0\n")
    assert jobcomp_record("7", path) == {"slurm_state": "COMPLETED", "exit_code": 0,
                                         "elapsed_s": 9.0}
    rec = jobcomp_record("71", path)
    assert rec["slurm_state"] == "FAILED" and rec["exit_code"] == 1
    assert jobcomp_record("8", path) is None


# --- bulk sweeps -----------------------------------------------------------------------------

SWEEP = {
    "defaults": {"gpu": "h100", "env": {"NCCL_DEBUG": "WARN"}, "steps": 10},
    "tasks": [{"workload": "pretrain_llama3.1", "size": "8b", "dtypes": ["bf16", "fp8"],
               "scales": [8, 16], "repeats": 2, "set": ["mbs=1"], "env": {"X": "1"}}],
}


def test_bulk_expands_product_with_overrides():
    tasks = bulk.expand(SWEEP, {}, "slurm")
    assert len(tasks) == 2 * 2 * 2
    assert [(t.dtype, t.scale, t.repeat) for t in tasks[:3]] == \
        [("bf16", 8, 1), ("bf16", 8, 2), ("bf16", 16, 1)]
    plans = bulk.validate(tasks, {}, "slurm")
    assert [p.gpus for p in plans] == [t.scale for t in tasks]
    assert all(p.steps == 10 and dict(p.env) == {"NCCL_DEBUG": "WARN", "X": "1"} for p in plans)
    cmd = tasks[0].run_command("local")
    assert cmd[:2] == ["trainbench", "run"] and ["--set", "mbs=1"] == cmd[-6:-4]
    assert ["--env", "NCCL_DEBUG=WARN"] == cmd[-4:-2]


def test_bulk_reports_every_bad_task_before_launching():
    data = {"tasks": [
        {"workload": "pretrain_llama3.1", "size": "8b", "dtype": "bf16", "scales": [8, 12],
         "repeats": 3, "gpu": "h100"},
        {"workload": "nope", "size": "8b", "dtype": "bf16", "scale": 8, "gpu": "h100"},
        {"workload": "pretrain_llama3.1", "size": "tiny", "dtype": "bf16", "scale": 2,
         "gpu": "cpu", "env": {"HF_TOKEN": "x"}},
        {"size": "8b", "colour": "red", "slurm": {"time_limit": 3600}}]}
    with pytest.raises(PlanError) as err:
        bulk.validate(bulk.expand(data, {}, "slurm"), {}, "slurm")
    problems = err.value.problems
    # The last task is malformed: expand refuses the file before planning anything.
    assert any("tasks[4]" in p and "colour" in p for p in problems)
    assert any("tasks[4]" in p and "missing workload" in p for p in problems)
    assert any("tasks[4]" in p and "time_limit must be quoted" in p for p in problems)
    data["tasks"].pop()
    with pytest.raises(PlanError) as err:
        bulk.validate(bulk.expand(data, {}, "slurm"), {}, "slurm")
    problems = err.value.problems
    assert sum("x12" in p for p in problems) == 1  # three repeats, said once
    assert any(p.startswith("tasks[2]") and "nope" in p for p in problems)
    assert any(p.startswith("tasks[3]") and "HF_TOKEN" in p for p in problems)
    assert not any(p.startswith("tasks[1]") and "x8:" in p for p in problems)


def test_bulk_cli_dry_run_slurm(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINBENCH_CONFIG", str(tmp_path / "cluster.yaml"))
    monkeypatch.setenv("TRAINBENCH_ROOT", str(tmp_path))
    sweep = tmp_path / "sweep.yaml"
    import yaml
    sweep.write_text(yaml.safe_dump({**SWEEP, "executor": "slurm"}))
    result = CliRunner().invoke(app, ["bulk", str(sweep), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "8 run(s) planned, nothing launched" in result.output
    assert "#SBATCH --nodes=1" in result.output and "srun" in result.output
    assert not (tmp_path / "experiments").exists() and not (tmp_path / "jobs.sqlite").exists()


def test_bulk_cli_bad_file_is_one_line_per_problem(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINBENCH_CONFIG", str(tmp_path / "cluster.yaml"))
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("tasks: [{workload: pretrain_llama3.1, size: 8b, dtype: bf16, scale: 12, "
                     "gpu: h100}]\n")
    result = CliRunner().invoke(app, ["bulk", str(sweep), "--executor", "slurm"])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert lines and all(line.startswith("trainbench: error: tasks[1]") for line in lines)


# --- trainbench init -------------------------------------------------------------------------

def test_init_from_file_keeps_other_keys(tmp_path, monkeypatch):
    import yaml
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text(yaml.safe_dump({"calibration": {"h100": 0.5}}))
    monkeypatch.setenv("TRAINBENCH_CONFIG", str(cfg))
    monkeypatch.setenv("PATH", str(tmp_path))  # no sinfo/sacctmgr: nothing detected
    src = tmp_path / "in.yaml"
    src.write_text(yaml.safe_dump({"account": "perf", "partition": "batch", "gpu_type": "h100",
                                   "gpus_per_node": 8, "gres": "gpu:8",
                                   "env": {"NCCL_DEBUG": "WARN"}}))
    result = CliRunner().invoke(app, ["init", "--from", str(src),
                                      "--experiments-root", str(tmp_path / "exp")])
    assert result.exit_code == 0, result.output
    data = yaml.safe_load(cfg.read_text())
    assert data == {"calibration": {"h100": 0.5}, "gpu_type": "h100", "gpus_per_node": 8,
                    "env": {"NCCL_DEBUG": "WARN"}, "experiments_root": str(tmp_path / "exp"),
                    "slurm": {"account": "perf", "partition": "batch", "gres": "gpu:8"}}


@pytest.mark.parametrize("args", [["--env", "HF_TOKEN=hf_x"], ["--account", "a;b"],
                                  ["--slurm-arg", "--output=/x"], ["--gpu-type", "tpu"],
                                  ["--env", "A=$(x)\ny"]])
def test_init_refuses_bad_input_and_writes_nothing(args, tmp_path, monkeypatch):
    cfg = tmp_path / "cluster.yaml"
    monkeypatch.setenv("TRAINBENCH_CONFIG", str(cfg))
    monkeypatch.setenv("PATH", str(tmp_path))
    result = CliRunner().invoke(app, ["init", *args])
    assert result.exit_code == 2
    assert result.output.startswith("trainbench: error: ")
    assert not cfg.exists()



def test_bulk_local_runs_each_task_through_trainbench_run(tmp_path):
    """One real local run (1 rank, 2 steps) through `trainbench bulk`."""
    import yaml
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({"tasks": [
        {"workload": "pretrain_llama3.1", "size": "tiny", "dtype": "bf16", "scale": 1,
         "steps": 2, "gpu": "cpu", "env": {"X": "a $(b)"}}]}))
    env = {**os.environ, "TRAINBENCH_ROOT": str(tmp_path),
           "TRAINBENCH_CONFIG": str(tmp_path / "cluster.yaml")}
    proc = subprocess.run([sys.executable, "-m", "trainbench.cli", "bulk", str(sweep)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "bulk: 1 run(s), 1 succeeded, 0 failed" in proc.stdout
    [job] = JobsDB(tmp_path).list()
    assert job["executor"] == "local" and job["state"] == "COMPLETED"
    assert dict(json.loads(job["plan_json"])["env"]) == {"X": "a $(b)"}


# --- what a script lacks without a cluster config (real CLI runs) ----------------------------

def _warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("trainbench: warning:")]


def test_run_dry_run_without_cluster_config_names_what_is_missing(tmp_path):
    from helpers import run_cli
    res = run_cli("run", "-w", "pretrain_llama3.1", "-s", "8b", "--dtype", "bf16", "--scale",
                  "16", "--gpu", "h100", "--executor", "slurm", "--dry-run", root=tmp_path)
    assert res.returncode == 0, res.stderr
    (warning,) = _warnings(res.stderr)
    assert "no account, partition or GRES set (no cluster config at" in warning
    assert "`trainbench init --account ACCOUNT --partition PARTITION --gres gpu:8`" in warning
    # The script it warns about: no account, partition or GRES line.
    assert "#SBATCH --nodes=2" in res.stdout
    assert "--account" not in res.stdout and "--partition" not in res.stdout
    assert "--gres" not in res.stdout
    assert not (tmp_path / "experiments").exists()


def test_run_dry_run_with_a_full_cluster_config_is_quiet(tmp_path):
    from helpers import run_cli
    (tmp_path / "cluster.yaml").write_text(
        "slurm: {account: perf, partition: batch, gres: 'gpu:8'}\n")
    res = run_cli("run", "-w", "pretrain_llama3.1", "-s", "8b", "--dtype", "bf16", "--scale",
                  "16", "--gpu", "h100", "--executor", "slurm", "--dry-run", root=tmp_path)
    assert res.returncode == 0, res.stderr
    assert _warnings(res.stderr) == []
    assert "#SBATCH --account=perf" in res.stdout and "#SBATCH --gres=gpu:8" in res.stdout


def test_configured_cluster_is_warned_only_about_gres_of_a_gpu_job(tmp_path):
    from helpers import run_cli
    (tmp_path / "cluster.yaml").write_text("slurm: {partition: batch}\n")
    gpu = run_cli("run", "-w", "pretrain_llama3.1", "-s", "8b", "--dtype", "bf16", "--scale",
                  "8", "--gpu", "h100", "--executor", "slurm", "--dry-run", root=tmp_path)
    (warning,) = _warnings(gpu.stderr)
    assert "no GRES set in the cluster config" in warning and "account" not in warning
    assert "`trainbench init --gres gpu:8`" in warning
    # A CPU job needs no GRES, and an account left out after `init` is the user's choice.
    cpu = run_cli("run", "-w", "pretrain_llama3.1", "-s", "tiny", "--dtype", "fp32", "--scale",
                  "2", "--gpu", "cpu", "--executor", "slurm", "--dry-run", root=tmp_path)
    assert cpu.returncode == 0 and _warnings(cpu.stderr) == []


def test_real_submission_without_cluster_config_warns_before_sbatch(tmp_path):
    from helpers import run_cli
    # No Slurm here: sbatch is not on PATH, so the submission itself fails after the warning.
    res = run_cli("run", "-w", "pretrain_llama3.1", "-s", "8b", "--dtype", "bf16", "--scale",
                  "8", "--gpu", "h100", "--executor", "slurm", root=tmp_path,
                  env={"PATH": str(tmp_path / "no-bin")})
    (warning,) = _warnings(res.stderr)
    assert "no account, partition or GRES set" in warning
    assert res.returncode == 2 and "sbatch not found" in res.stderr
    assert not list(tmp_path.glob("experiments/*/*"))  # no experiment directory kept


def test_bulk_dry_run_without_cluster_config_warns_once(tmp_path):
    from helpers import run_cli
    import yaml
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({
        "executor": "slurm", "defaults": {"gpu": "h100"},
        "tasks": [{"workload": "pretrain_llama3.1", "size": "8b", "dtype": "bf16",
                   "scales": [8, 16]}]}))
    res = run_cli("bulk", str(sweep), "--dry-run", root=tmp_path)
    assert res.returncode == 0, res.stderr
    (warning,) = _warnings(res.stderr)  # two jobs, one line
    assert "no account, partition or GRES set" in warning
    assert "trainbench init --account ACCOUNT --partition PARTITION --gres gpu:8" in warning
    assert "2 run(s) planned, nothing launched" in res.stdout
