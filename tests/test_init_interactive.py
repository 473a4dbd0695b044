"""`trainbench init` asked on a real terminal (a pseudo-terminal), as a person answers it."""

import os
import pty
import select
import subprocess
import sys
import time

import yaml


def test_init_prompts_on_a_terminal_and_writes_the_config(tmp_path):
    config = tmp_path / "cluster.yaml"
    env = dict(os.environ, TRAINBENCH_CONFIG=str(config), COLUMNS="120")
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "trainbench.cli", "init"], stdin=slave,
                            stdout=slave, stderr=slave, env=env, close_fds=True)
    os.close(slave)
    answers = ["acct-perf", "gpu", "h100", "8", "gpu:8", "--qos=high", str(tmp_path / "bench"),
               "NCCL_DEBUG=WARN"]
    screen = b""
    deadline = time.time() + 60
    sent = 0
    while proc.poll() is None and time.time() < deadline:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                screen += os.read(master, 4096)
            except OSError:
                break
        # Answer each prompt once it is on the screen (prompts end with ': ').
        if sent < len(answers) and screen.rstrip().endswith((b":", b"]:")) and \
                screen.count(b": ") > sent:
            os.write(master, answers[sent].encode() + b"\r")
            sent += 1
    proc.wait(timeout=10)
    os.close(master)
    text = screen.decode(errors="replace")
    assert proc.returncode == 0, text
    assert sent == len(answers), text
    assert "GPU partition" in text and "Experiments root" in text
    data = yaml.safe_load(config.read_text())
    assert data["slurm"] == {"account": "acct-perf", "partition": "gpu", "gres": "gpu:8",
                             "extra_args": ["--qos=high"]}
    assert data["gpu_type"] == "h100" and data["gpus_per_node"] == 8
    assert data["experiments_root"] == str(tmp_path / "bench")
    assert data["env"] == {"NCCL_DEBUG": "WARN"}
