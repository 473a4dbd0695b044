"""Nemotron-H through `trainbench run`: it learns, and data parallel matches one process."""

import pytest

from helpers import losses, train

pytestmark = pytest.mark.dist


def test_tiny_nemotronh_learns_over_50_steps(tmp_path):
    curve = losses(train(tmp_path, "pretrain_nemotronh", 1, steps=50))
    assert len(curve) == 50
    # Uniform guessing over the 512-token vocabulary costs ln(512) = 6.24; the synthetic
    # task is learnable, so the last steps must be clearly below the first.
    first, last = sum(curve[:5]) / 5, sum(curve[-5:]) / 5
    assert last < first - 1.0, curve


def test_nemotronh_dp2_matches_one_process(tmp_path):
    one = losses(train(tmp_path, "pretrain_nemotronh", 1, steps=3))
    two = losses(train(tmp_path, "pretrain_nemotronh", 2, steps=3))
    assert two == pytest.approx(one, rel=1e-5)
