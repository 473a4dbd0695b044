"""The memory model against the tensors a tiny CPU training step really holds."""

import pytest
import torch
import torch.nn.functional as F

from trainbench.engine import data
from trainbench.engine.models import build_model
from trainbench.engine.optim import build_optimizer
from trainbench.planning import build_plan
from trainbench.predict.memory import tensor_bytes


def measured_peak_tensor_bytes(plan) -> int:
    """Parameters + gradients + AdamW state + the activations saved for backward at the
    end of one microbatch's forward (the peak of a step), counted tensor by tensor."""
    torch.manual_seed(0)
    model = build_model(plan.model)
    opt = build_optimizer(model, plan.lr)
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor):
        # Count each storage once: views of one tensor share it.
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    inputs, labels = data.microbatch(0, 0, 0, plan.mbs, plan.seq_len, plan.model.vocab_size)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = model(inputs)
        loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(0, 1))
    activations = sum(saved.values())
    loss.backward()
    opt.step()  # creates the two Adam moments
    state = sum(p.numel() * p.element_size() for p in model.parameters())
    grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters())
    moments = sum(v.numel() * v.element_size() for s in opt.state.values()
                  for v in s.values() if torch.is_tensor(v) and v.ndim > 0)
    return state + grads + moments + activations


@pytest.mark.parametrize("workload", ["pretrain_llama3.1", "pretrain_nemotron4"])
def test_memory_model_within_25_percent_of_a_tiny_cpu_run(workload):
    plan = build_plan(workload, "tiny", "fp32", 1, "cpu")
    predicted = tensor_bytes(plan)
    measured = measured_peak_tensor_bytes(plan)
    assert predicted == pytest.approx(measured, rel=0.25), (predicted, measured)
