"""`trainbench results` in a real terminal keeps to its width (issue 37, class 7).

The command runs under a pseudo-terminal of 80 and of 120 columns (TIOCSWINSZ, and
COLUMNS as a shell exports it): every line fits, the experiment names and statuses are
shown whole (rich used to shrink both columns to nothing at 120 columns), and a line names
the columns left out. Piped, every column stays.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

LOGS = Path(__file__).parent / "data" / "logs" / "nemo2"
NAMES = ("pretrain_llama3.1_70b_bf16_64", "pretrain_llama3.1_8b_bf16_8",
         "pretrain_nemotronh_56b_fp8_gpus128_tp8_pp1_cp1_vpNone_mbs1_gbs768",
         "multi-epoch-config-echo")
_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def in_terminal(columns: int, *args: str, env: dict | None = None) -> list[str]:
    """The CLI's output lines as a terminal of `columns` shows them (escapes removed)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    full = dict(os.environ, TERM="xterm-256color", COLUMNS=str(columns), **(env or {}))
    proc = subprocess.Popen([sys.executable, "-m", "trainbench.cli", *args], stdin=slave,
                            stdout=slave, stderr=slave, env=full, close_fds=True)
    os.close(slave)
    out = b""
    try:
        while select.select([master], [], [], 120)[0]:
            try:
                data = os.read(master, 65536)
            except OSError:  # the terminal closed: the command ended
                break
            if not data:
                break
            out += data
    finally:
        os.close(master)
        proc.wait(timeout=120)
    assert proc.returncode == 0, out.decode(errors="replace")[-2000:]
    return _ESCAPE.sub("", out.decode(errors="replace")).replace("\r", "").splitlines()


def cells(lines: list[str], column: int) -> list[str]:
    """The text of one column of the table's body rows (a name folded over several lines is
    joined)."""
    rows, current = [], None
    for line in lines:
        if not line.startswith("│"):
            continue
        parts = [p.strip() for p in line.strip("│").split("│")]
        if parts[1]:  # a new row (the status cell is only empty on a name's later lines)
            current = [parts[column]]
            rows.append(current)
        elif current is not None:
            current.append(parts[column])
    return ["".join(parts) for parts in rows]


@pytest.mark.parametrize("columns", [80, 120])
def test_results_fits_the_terminal_and_shows_names_and_statuses_whole(columns):
    lines = in_terminal(columns, "results", str(LOGS))
    assert max(len(line) for line in lines) <= columns
    header = next(line for line in lines if "experiment" in line)
    assert [h.strip() for h in header.strip("┃").split("┃")][:2] == ["experiment", "status"]
    assert sorted(cells(lines, 0)) == sorted(NAMES)
    assert sorted(cells(lines, 1)) == ["Failed", "Failed", "Success", "Success"]
    left_out = next(line for line in lines if line.startswith("left out to fit"))
    assert left_out.startswith(f"left out to fit {columns} columns: ")
    assert "J/token" in " ".join(lines[lines.index(left_out):])


def test_a_wide_terminal_keeps_every_column():
    lines = in_terminal(400, "results", str(LOGS))
    header = next(line for line in lines if "experiment" in line)
    assert "J/token" in header and not any(line.startswith("left out") for line in lines)


def test_piped_output_keeps_every_column(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    res = subprocess.run([sys.executable, "-m", "trainbench.cli", "results", str(LOGS)],
                         capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    header = next(line for line in res.stdout.splitlines() if "experiment" in line)
    assert "J/token" in header and "left out" not in res.stdout
