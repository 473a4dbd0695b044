"""Fixtures several test modules share."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def one_thread():
    """Tiny GEMMs: more threads only contend on a shared 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
