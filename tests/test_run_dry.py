"""`trainbench run --dry-run`: the plan, the memory verdict, nothing launched or written."""

from helpers import run_cli


def test_dry_run_warns_when_predicted_not_to_fit(tmp_path):
    res = run_cli("run", "-w", "pretrain_llama3.1", "-s", "405b", "--scale", "64", "--gpu", "h100",
                  "--set", "tp=8 pp=8 cp=1 dp=1 gbs=64", "--dry-run", root=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "predicted not to fit" in res.stdout and "exceeds" in res.stdout
    assert "dry run: nothing launched" in res.stdout
    assert not (tmp_path / "experiments").exists()


def test_dry_run_of_a_seed_row_fits_quietly(tmp_path):
    res = run_cli("run", "-w", "pretrain_llama3.1", "-s", "8b", "--scale", "8", "--gpu", "h100",
                  "--dry-run", root=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "predicted not to fit" not in res.stdout
    assert "TP1 PP1 CP2 DP4" in res.stdout


def test_cpu_run_too_big_for_this_machine_is_refused_before_anything_is_written(tmp_path):
    res = run_cli("run", "-w", "pretrain_llama3.1", "-s", "8b", "--scale", "8", "--gpu", "cpu",
                  root=tmp_path)
    assert res.returncode == 2
    assert "GiB of memory but this machine has" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "experiments").exists()


def test_local_gpu_run_on_a_machine_without_gpus_is_refused(tmp_path):
    res = run_cli("run", "-w", "pretrain_llama3.1", "-s", "tiny", "--scale", "2", "--gpu", "h100",
                  root=tmp_path, env={"PATH": str(tmp_path / "no-bin")})  # no nvidia-smi
    assert res.returncode == 2
    assert "this machine has no NVIDIA GPU" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "experiments").exists()
