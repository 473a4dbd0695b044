"""Fixtures several test modules share."""

from __future__ import annotations

import pytest
import torch

from helpers import FP8_RUN_TIMEOUT, FP8_SEQ, read_metrics, train


@pytest.fixture
def one_thread():
    """Tiny GEMMs: more threads only contend on a shared 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def one_fp8_run(tmp_path_factory):
    """workload -> the experiment directory of one FP8 process over 3 steps of the tiny
    size on 32-token sequences (helpers.FP8_SEQ), run once a session: the reference of
    every parallel FP8 layout and of the long runs' first steps, and a run whose records
    the FP8 tests read (tests/test_fp8.py, tests/test_fp8_saved_input.py)."""
    root = tmp_path_factory.mktemp("one_fp8")
    cache = {}

    def get(workload: str):
        if workload not in cache:
            cache[workload] = train(root, workload, 1, "--set", FP8_SEQ, dtype="fp8",
                                    steps=3, timeout=FP8_RUN_TIMEOUT)
        return cache[workload]
    return get


@pytest.fixture(scope="session")
def one_fp8_process(one_fp8_run):
    """workload -> the metrics of one_fp8_run."""
    return lambda workload: read_metrics(one_fp8_run(workload))
