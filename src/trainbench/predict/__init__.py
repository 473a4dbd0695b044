"""Predict before you launch: step time, throughput and memory per GPU of a plan on a GPU
type (perf, memory), the best layouts for a workload (search), and fitting the model to a
cluster's measured runs (calibrate). Pure Python, no torch.
"""

from .memory import fits, predict_memory
from .perf import predict_step

__all__ = ["fits", "predict_memory", "predict_step"]
