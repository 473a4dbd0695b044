"""Faults end in one clear line and a true, settled state: a full disk, a launcher killed
with SIGKILL, and naming the rank whose failure came first by cause.

Real processes throughout: a real tmpfs that the run fills, a real launcher killed with
SIGKILL, real torchrun output. Nothing here asserts a duration; the polls only keep a
broken run from hanging the suite.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import experiment_dirs, processes_naming, read_metrics, run_cli
from trainbench.rundir import launcher_gone, process_start_ticks
from trainbench.launch.jobs import JobsDB
from trainbench.launch.local import MIN_FREE_BYTES, Progress, RankOutput, describe_failure

TINY_RUN = ("run", "-w", "pretrain_llama3.1", "-s", "tiny", "--dtype", "fp32", "--scale", "2",
            "--gpu", "cpu")


# --- which rank failed first, by cause ---------------------------------------------------------

# torchrun 2.13's own output when rank 1 was killed with SIGKILL and rank 0 died of the
# broken connection before torchrun's monitor looked: both land in the same poll, and
# torchrun's "Root Cause" (and its E-line) name rank 0. Captured from a real run.
RACE_OUTPUT = """\
E1123 06:34:36.827000 8021 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) local_rank: 0 (pid: 8044) of binary: /work/main/.venv/bin/python3
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
trainbench.engine FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-23_06:34:36
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 8045)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 8045
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-23_06:34:36
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 8044)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================""".splitlines()

RESET = ("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] "
         "Read error [127.0.0.1]:19888: Connection reset by peer. This is typically caused by "
         "a remote worker hanging or bugs in the application.")

# The other order, also captured: torchrun saw rank 1 first, stopped rank 0 with SIGTERM
# and listed it too (exit code -15) for bookkeeping.
CLOSED_OUTPUT = """\
W1123 06:31:20.270000 5230 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 5268 closing signal SIGTERM
E1123 06:31:20.302000 5230 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -9) local_rank: 1 (pid: 5269) of binary: /work/main/.venv/bin/python3
Failures:
[1]:
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 5268)  (SIGTERM)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 5269)  (SIGKILL)""".splitlines()


def test_a_killed_rank_is_named_even_when_torchrun_lists_its_peer_first():
    reason = describe_failure(1, RACE_OUTPUT, {0: RESET})
    assert reason.startswith("rank 1 failed (killed by SIGKILL)")
    assert "Connection reset" not in reason


def test_a_rank_torchrun_stopped_itself_is_never_the_cause():
    assert describe_failure(1, CLOSED_OUTPUT, {}).startswith("rank 1 failed (killed by SIGKILL)")


def test_an_own_error_beats_a_peer_error_and_a_full_disk_is_named():
    lines = ["  rank      : 0 (local_rank: 0)", "  exitcode  : 1 (pid: 10)",
             "  rank      : 1 (local_rank: 1)", "  exitcode  : 1 (pid: 11)"]
    errors = {0: RESET, 1: "disk full: OSError: [Errno 28] No space left on device"}
    reason = describe_failure(1, lines, errors)
    assert reason.startswith("disk full: rank 1 failed (exit code 1): OSError: [Errno 28]")


def test_a_full_disk_is_named_over_a_lower_ranks_error_about_the_same_save():
    # A checkpoint save fails on every rank at once; rank 0 may not see the disk full.
    lines = ["  rank      : 0 (local_rank: 0)", "  exitcode  : 1 (pid: 10)",
             "  rank      : 1 (local_rank: 1)", "  exitcode  : 1 (pid: 11)"]
    errors = {0: "CheckpointException: CheckpointException ranks:dict_keys([0, 1])",
              1: "disk full: OSError: [Errno 28] No space left on device: 0 bytes free"}
    reason = describe_failure(1, lines, errors)
    assert reason.startswith("disk full: rank 1 failed (exit code 1): OSError: [Errno 28]")


def test_an_error_line_glued_to_a_peers_line_is_still_read(tmp_path):
    # What the CI run of 2026-11-23 lost: rank 1 printed its text, rank 0's whole error
    # line landed before rank 1's newline, and rank 0 was reported with no cause.
    out = RankOutput(Progress(10, interactive=False), tmp_path / "run.log")
    out.line("[rank 1] trainbench engine error: RuntimeError: Connection closed by peer"
             "[rank 0] trainbench engine error: disk full: OSError: [Errno 28] No space left")
    assert out.errors == {1: "RuntimeError: Connection closed by peer",
                          0: "disk full: OSError: [Errno 28] No space left"}


def test_ranks_sharing_one_pipe_never_glue_their_lines():
    # Two unbuffered processes, as torchrun's ranks run, printing onto one pipe at once.
    script = ("import sys; from trainbench.engine.__main__ import whole_lines; whole_lines(); "
              "[print(f'[rank {sys.argv[1]}] line {i} ' + 'x' * 60, file=sys.stderr) "
              "for i in range(20000)]")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    read, write = os.pipe()
    procs = [subprocess.Popen([sys.executable, "-c", script, str(rank)], stderr=write, env=env)
             for rank in (0, 1)]
    os.close(write)
    with os.fdopen(read) as merged:
        lines = merged.read().splitlines()
    assert [p.wait() for p in procs] == [0, 0]
    assert len(lines) == 40000
    assert all(line.count("[rank ") == 1 and line.endswith("x" * 60) for line in lines)


# --- a full disk -------------------------------------------------------------------------------

@pytest.fixture
def small_disk(tmp_path):
    """A 40 MiB tmpfs: room for a tiny run and a few checkpoints of 4 MiB, not for 40."""
    where = tmp_path / "disk"
    where.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=40m", "tmpfs", str(where)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def fill(path: Path) -> None:
    """Write zeros until the disk refuses."""
    chunk = bytes(1 << 16)
    with open(path, "wb", buffering=0) as fh:
        try:
            while True:
                fh.write(chunk)
        except OSError:
            pass


@pytest.mark.slow
@pytest.mark.dist
def test_a_full_disk_ends_the_run_failed_settled_and_cleaned_up(small_disk):
    res = run_cli(*TINY_RUN, "--steps", "40", "--checkpoint-interval", "1", root=small_disk,
                  timeout=900)
    terminal = res.stdout + res.stderr
    assert res.returncode == 1, terminal[-3000:]
    assert "Traceback" not in terminal
    assert res.stderr.strip().splitlines()[-1].startswith(
        "trainbench: error: run failed: disk full: rank ")
    (exp,) = experiment_dirs(small_disk)
    record = json.loads((exp / "exit.json").read_text())
    assert record["exit_code"] == res.returncode and record["reason"].startswith("disk full")
    # The save that hit the full disk left no partial files; the earlier ones are whole.
    saved = sorted((exp / "checkpoints").iterdir())
    assert saved and not [p for p in saved if ".tmp-" in p.name]
    assert all((p / "COMPLETE").is_file() for p in saved)
    assert len(saved) < 40
    (job,) = JobsDB(small_disk).list()
    assert job["state"] == "FAILED" and job["exit_code"] == 1

    fill(small_disk / "filler")
    assert shutil.disk_usage(small_disk).free < 1 << 20
    refreshed = run_cli("jobs", "refresh", root=small_disk)
    assert refreshed.returncode == 0 and "Traceback" not in refreshed.stderr
    assert "FAILED" in refreshed.stdout
    summary = json.loads(run_cli("results", str(exp), "--format", "json").stdout)
    (found,) = summary["experiments"]
    assert found["status"] == "Failed" and "disk full" in found["status_detail"]

    # A new run on the full disk is refused before it creates anything.
    again = run_cli(*TINY_RUN, "--steps", "2", root=small_disk)
    assert again.returncode == 2
    lines = again.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trainbench: error: disk full:")
    assert f"{MIN_FREE_BYTES >> 20} MiB" in lines[0]
    assert experiment_dirs(small_disk) == [exp]
    assert len(JobsDB(small_disk).list()) == 1


def test_a_checkpoint_that_does_not_fit_is_named_disk_full_and_removed(small_disk):
    # torch's zip writer reports a full disk as "unexpected pos", with no errno (CI,
    # 2026-11-26: a run that filled its disk was reported as a bare CheckpointException).
    import torch
    import torch.distributed as dist

    from trainbench.engine.checkpoint import Checkpointer
    from trainbench.engine.run_records import failure_line
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        model = torch.nn.Linear(256, 256)
        optimizer = torch.optim.AdamW(model.parameters())
        model(torch.ones(2, 256)).sum().backward()
        optimizer.step()
        saver = Checkpointer([model], optimizer, torch.device("cpu"), small_disk, "DP1",
                             lambda line: None)
        saver.save(1)  # room for this one
        fill(small_disk / "filler")
        with pytest.raises(BaseException) as failed:
            saver.save(2)
    finally:
        dist.destroy_process_group()
    line = failure_line(failed.value)
    assert line.startswith("disk full: OSError: [Errno 28] No space left on device: "), line
    # weights, exp_avg and exp_avg_sq in fp32; AdamW's two fp32 step counts; the int64
    # step; the CPU RNG state's bytes.
    needed = 3 * (256 * 256 + 256) * 4 + 2 * 4 + 8 + torch.get_rng_state().numel()
    assert line.endswith(f"this rank's part of the checkpoint is {needed} bytes"), line
    assert sorted(p.name for p in (small_disk / "checkpoints").iterdir()) == ["step-1"]


def test_a_slurm_submission_on_a_full_disk_is_refused_before_it_creates_anything(small_disk):
    fill(small_disk / "filler")
    res = run_cli("run", "-w", "pretrain_llama3.1", "-s", "8b", "--scale", "8", "--gpu", "h100",
                  "--executor", "slurm", root=small_disk)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert lines[0].startswith("trainbench: error: disk full:")
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler"]


# --- a launcher killed with SIGKILL -------------------------------------------------------------

def start_long_run(root: Path, stderr) -> subprocess.Popen:
    """The real launcher on a run far longer than any test, in its own session."""
    env = dict(os.environ, TRAINBENCH_ROOT=str(root), TRAINBENCH_CONFIG=str(root / "cluster.yaml"))
    env.pop("TRAINBENCH_FAIL_AT_STEP", None)
    return subprocess.Popen([sys.executable, "-m", "trainbench.cli", *TINY_RUN, "--steps", "5000"],
                            env=env, stdout=subprocess.DEVNULL, stderr=stderr, text=True,
                            start_new_session=True)


def wait_for_two_steps(root: Path, launcher: subprocess.Popen) -> Path:
    """The run's experiment directory once it has logged two steps (ranks up and training)."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and launcher.poll() is None:
        found = experiment_dirs(root) if (root / "experiments").exists() else []
        if found and len(read_metrics(found[0])) >= 2:
            return found[0]
        time.sleep(0.5)
    raise AssertionError("the run never logged two steps")


@pytest.mark.slow
@pytest.mark.dist
def test_a_launcher_killed_with_sigkill_leaves_no_rank_and_a_failed_run(tmp_path):
    launcher = start_long_run(tmp_path, stderr=subprocess.DEVNULL)
    try:
        exp = wait_for_two_steps(tmp_path, launcher)
        assert len(processes_naming(str(exp))) == 3  # torchrun and both ranks run
    finally:
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
    # The ranks notice their launcher is gone; poll until they have (or a long time passed).
    deadline = time.monotonic() + 300
    while processes_naming(str(exp)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert processes_naming(str(exp)) == []
    assert not (exp / "exit.json").exists()

    # Without a manual refresh, the next `jobs` and `results` say the run failed.
    shown = run_cli("jobs", "show", "1", root=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "state: FAILED" in shown.stdout and "launcher killed" in shown.stdout
    summary = json.loads(run_cli("results", str(exp), "--format", "json").stdout)
    (found,) = summary["experiments"]
    assert found["status"] == "Failed" and "launcher killed" in found["status_detail"]


def test_a_recorded_launcher_is_alive_only_with_its_own_start_time(tmp_path):
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen(["true"])
    dead.wait()
    try:
        ticks = process_start_ticks(live.pid)
        assert ticks is not None and process_start_ticks(dead.pid) is None
        cases = {"live": (live.pid, ticks), "recycled": (live.pid, ticks + 1),
                 "dead": (dead.pid, ticks)}
        gone = {}
        for name, (pid, start) in cases.items():
            (tmp_path / name).mkdir()
            (tmp_path / name / "launcher.json").write_text(
                json.dumps({"pid": pid, "start_ticks": start}))
            gone[name] = launcher_gone(tmp_path / name)
        assert gone == {"live": False, "recycled": True, "dead": True}
        assert launcher_gone(tmp_path) is None  # no record: a Slurm job, an older run
    finally:
        live.kill()
        live.wait()


@pytest.mark.slow
@pytest.mark.dist
def test_ranks_die_with_torchrun_and_the_launcher_reports_it(tmp_path):
    """torchrun killed with SIGKILL cannot stop its ranks: they die with their parent."""
    launcher = start_long_run(tmp_path, stderr=subprocess.PIPE)
    exp = None
    try:
        exp = wait_for_two_steps(tmp_path, launcher)
        agents = [p for p in Path("/proc").iterdir() if p.name.isdigit()
                  and b"torch.distributed.run" in _cmdline(p) and str(exp).encode() in _cmdline(p)]
        assert len(agents) == 1
        os.kill(int(agents[0].name), signal.SIGKILL)
        _, stderr = launcher.communicate(timeout=600)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        if exp is not None:  # ranks that outlived torchrun (the failure under test)
            for proc in Path("/proc").iterdir():
                if proc.name.isdigit() and str(exp).encode() in _cmdline(proc):
                    os.kill(int(proc.name), signal.SIGKILL)
    assert processes_naming(str(exp)) == []
    record = json.loads((exp / "exit.json").read_text())
    assert record["exit_code"] == launcher.returncode == 128 + signal.SIGKILL
    assert "torchrun was killed by SIGKILL" in record["reason"]
    assert "Traceback" not in stderr and "torchrun was killed by SIGKILL" in stderr


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""


# --- a double Ctrl-C ---------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.dist
def test_two_ctrl_cs_still_leave_exit_json_and_the_jobs_exit_code(tmp_path):
    """A terminal's Ctrl-C reaches the launcher's whole process group; a second one 0.3 s
    later used to end the launcher before it wrote anything (exit 130, no exit.json, the
    job RUNNING without an exit code, then `results` said "launcher killed"). Now the
    second one only hurries the ranks' end. While the run goes, `results` says Running."""
    launcher = start_long_run(tmp_path, stderr=subprocess.PIPE)
    try:
        exp = wait_for_two_steps(tmp_path, launcher)
        during = json.loads(run_cli("results", str(exp), "--format", "json").stdout)
        (row,) = during["experiments"]
        assert row["status"] == "Running" and during["summary"]["running"] == 1
        os.killpg(launcher.pid, signal.SIGINT)
        time.sleep(0.3)
        os.killpg(launcher.pid, signal.SIGINT)
        _, stderr = launcher.communicate(timeout=600)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode == 130 and "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1].startswith(
        "trainbench: error: run failed: interrupted by SIGINT (Ctrl-C)")
    record = json.loads((exp / "exit.json").read_text())
    assert record["exit_code"] == 130 and record["reason"].startswith("interrupted by SIGINT")
    (job,) = JobsDB(tmp_path).list()
    assert (job["state"], job["exit_code"]) == ("FAILED", 130)
    after = json.loads(run_cli("results", str(exp), "--format", "json").stdout)
    (row,) = after["experiments"]
    assert row["status"] == "Failed" and "interrupted by SIGINT" in row["status_detail"]
    deadline = time.monotonic() + 120  # a bound only: the ranks are normally gone already
    while processes_naming(str(exp)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert processes_naming(str(exp)) == []


@pytest.mark.slow
@pytest.mark.dist
def test_two_ctrl_cs_before_the_ranks_start_still_leave_the_records(tmp_path):
    """Both signals as soon as the experiment directory exists (the launcher may still be
    creating it or starting torchrun): the run ends 130 with exit.json and its job row."""
    launcher = start_long_run(tmp_path, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 300
        while not experiment_dirs(tmp_path) and time.monotonic() < deadline \
                and launcher.poll() is None:
            time.sleep(0.01)
        (exp,) = experiment_dirs(tmp_path)
        os.killpg(launcher.pid, signal.SIGINT)
        time.sleep(0.3)
        os.killpg(launcher.pid, signal.SIGINT)
        launcher.communicate(timeout=600)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode == 130
    assert json.loads((exp / "exit.json").read_text())["exit_code"] == 130
    (job,) = JobsDB(tmp_path).list()
    assert (job["state"], job["exit_code"]) == ("FAILED", 130)
