"""Nemotron-H through `trainbench run`: it learns, data parallel matches one process,
and Mamba's fp32 parameters are read in fp32 in a bf16 run in every layout."""

import json
import socket
import subprocess
import sys

import pytest

from helpers import losses, train
from trainbench.planning import build_plan

pytestmark = pytest.mark.dist


def test_nemotronh_dp2_matches_one_process(tmp_path):
    one = losses(train(tmp_path, "pretrain_nemotronh", 1, steps=3))
    two = losses(train(tmp_path, "pretrain_nemotronh", 2, steps=3))
    assert two == pytest.approx(one, rel=1e-5)


# Each rank runs the real trainer (FSDP2, TP, autocast as a run sets them up) and records,
# from a forward pre-hook on every Mamba SSMCore (which runs after FSDP's own pre-forward
# has gathered and cast the parameters), the dtypes of what the scan is about to read.
_PROBE = r'''
import json, sys
from pathlib import Path
import torch
from trainbench.engine.__main__ import exit_now
from trainbench.engine.models.mamba2 import SSMCore
from trainbench.engine.trainer import Trainer
from trainbench.planning import load_plan

torch.set_num_threads(1)
plan_path = Path(sys.argv[1])
trainer = Trainer(load_plan(plan_path), plan_path.parent)
trainer.setup()
seen = []

def record(module, args):
    local = lambda t: t.to_local() if hasattr(t, "to_local") else t
    seen.append({"x": str(args[0].dtype), **{name: str(local(getattr(module, name)).dtype)
                                            for name in ("dt_bias", "A_log", "D")}})

for part in trainer.model_parts:
    for module in part.modules():
        if isinstance(module, SSMCore):
            module.register_forward_pre_hook(record)
trainer.train()
(plan_path.parent / f"ssm_dtypes_{trainer.rank}.json").write_text(json.dumps(seen))
trainer.close()
exit_now(0)  # as the engine's ranks leave: no interpreter teardown of live gloo groups
'''


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("ranks,overrides", [(1, {}), (2, {}), (2, {"tp": 2})],
                         ids=["one-rank-autocast", "fsdp-dp2", "tp2"])
def test_mamba_fp32_parameters_stay_fp32_in_a_bf16_run(tmp_path, ranks, overrides):
    plan = build_plan("pretrain_nemotronh", "tiny", "bf16", ranks, "cpu", steps=1,
                      overrides=overrides)
    (tmp_path / "plan.json").write_text(plan.to_json())
    (tmp_path / "probe.py").write_text(_PROBE)
    res = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={ranks}",
         "--nnodes=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{_free_port()}",
         str(tmp_path / "probe.py"), str(tmp_path / "plan.json")],
        capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    mamba_layers = plan.model.pattern.count("M")
    for rank in range(ranks):
        seen = json.loads((tmp_path / f"ssm_dtypes_{rank}.json").read_text())
        # One forward per microbatch and Mamba layer (GBS 8 / MBS 2 / DP), and one more in
        # the backward, which recomputes the mixer between its projections (the rerun
        # keeps autocast's dtypes, checked below with the first run).
        assert len(seen) == 2 * mamba_layers * plan.ga
        for call in seen:
            # The activations are bf16 (the run really computes in bf16) ...
            assert call["x"] == "torch.bfloat16", call
            # ... and the parameters the scan reads are not.
            assert call["dt_bias"] == call["A_log"] == call["D"] == "torch.float32", call
