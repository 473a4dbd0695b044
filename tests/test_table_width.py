"""The main commands' tables fit a 120-column terminal (COLUMNS=120, as a shell exports
it): rich folds long cells instead of drawing lines a laptop's terminal wraps into noise.
`results` in a real pseudo-terminal has its own test (test_results_table_width.py)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from trainbench.cli import app

COMMANDS = [
    ("list",),
    ("show", "-w", "pretrain_qwen3", "-s", "235b_a22b"),
    ("show", "-w", "pretrain_llama3.1", "-s", "8b", "--dtype", "fp8"),
    ("predict", "-w", "pretrain_llama3.1", "-s", "70b", "--scale", "64", "--gpu", "h100"),
    ("predict", "-w", "pretrain_llama3.1", "-s", "70b", "--scale", "64", "--gpu", "h100",
     "--search", "--top", "5"),
    ("predict", "-w", "pretrain_qwen3", "-s", "235b_a22b", "--dtype", "fp8", "--scale", "256",
     "--gpu", "h100", "--sharding", "recipe"),
    ("results", "tests/data/logs/nemo2"),
]


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a[:3]))
def test_tables_fit_120_columns(args):
    res = CliRunner().invoke(app, list(args), env={"COLUMNS": "120"})
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    boxed = [line for line in lines if any(ch in line for ch in "│┃┌┏└┗")]
    assert boxed, "no table printed"
    too_wide = [line for line in lines if len(line) > 120]
    assert not too_wide, f"{len(too_wide)} line(s) over 120 columns, e.g. {too_wide[0]!r}"


def test_piped_output_without_columns_keeps_wide_tables():
    # A log file or `| tee` without COLUMNS keeps the whole row on one line.
    res = CliRunner().invoke(app, ["list"], env={"COLUMNS": None})
    assert res.exit_code == 0
    assert max(len(line) for line in res.stdout.splitlines()) > 120


@pytest.mark.parametrize("columns", ["80", "120"])
def test_jobs_table_keeps_ids_and_states_whole_on_a_narrow_terminal(tmp_path, columns):
    from trainbench.launch.jobs import JobsDB
    db = JobsDB(tmp_path)
    for state, job_id in (("COMPLETED", "1234567"), ("CANCELLED", "7654321")):
        db.add("slurm", job_id, "pretrain_llama3.1_405b_fp8_512_a_long_name",
               str(tmp_path / "pretrain_llama3.1_405b_fp8_512_20261127_190000"), "{}", state)
    res = CliRunner().invoke(app, ["jobs", "list", "--root", str(tmp_path)],
                             env={"COLUMNS": columns, "TRAINBENCH_ROOT": str(tmp_path)})
    assert res.exit_code == 0, res.output
    rows = [[c.strip() for c in line.split("\u2502")[1:-1]] for line in res.stdout.splitlines()]
    keyed = {cells[2]: cells[4] for cells in rows if len(cells) >= 5 and cells[2]}
    assert keyed == {"1234567": "COMPLETED", "7654321": "CANCELLED"}, res.stdout
    assert max(len(line) for line in res.stdout.splitlines()) <= int(columns)
    # Narrower than the whole row: the key columns, and where the rest is.
    assert ("jobs show ID" in res.stdout) == (columns == "80")
