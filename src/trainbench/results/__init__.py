"""Results: parse any run's logs, compute status, window statistics and metrics, compare
them with the published references, and print tables or draw charts.

Library entry points (for the Slurm job history and other callers):

    from trainbench.results import summarize_experiment, summarize_paths
    result = summarize_experiment("experiments/<name>/<name>_<timestamp>")
    result.status, result.step_time_mean_s, result.to_dict()

Modules: parse (the scanner -> StepRecord), formats (one module per log format),
metrics_jsonl (trainbench's own records), failure (why a run failed), status, infer
(workload from seed names),
summary (ExperimentResult), report (table/CSV/JSON), plot (PNG charts), cli.
The names below load on first use, so `import trainbench.results` costs nothing.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "summarize_experiment": "summary",
    "summarize_paths": "summary",
    "find_experiments": "rundir",
    "ExperimentResult": "summary",
    "StepRecord": "parse",
    "LogScan": "parse",
    "scan_log": "parse",
    "read_metrics_jsonl": "metrics_jsonl",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
