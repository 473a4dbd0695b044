"""One experiment's results: parse its steps, compute its status, window statistics and
metrics, and compare them with the published reference.

An experiment is a trainbench run directory (plan.json, metrics.jsonl, log-<name>.out,
run.json, exit.json) or a single log file from another framework. The library entry
point is `summarize_experiment(path, ...)`; `find_experiments` walks a directory tree.
Pure Python, no torch.
"""

from __future__ import annotations

from pathlib import Path

from .. import flops as fl, metrics
from ..catalog import hardware, models, recipes, references
from ..files import describe_read_error, is_regular
from ..overrides import MAX_INT
from ..plan import DTYPES, Layout
from ..rundir import METRICS_FILE, launcher_gone
from .experiment import ExperimentResult
from .failure import find_failure
from .infer import Identity, infer_identity
from .metrics_jsonl import read_metrics_jsonl
from .observations import profiling_overhead, straggler_note, telemetry
from .parse import LogScan, scan_log
from .predicted import predict_beside
from .rundir import (RunFacts, experiment_name, find_experiments, not_regular, read_run_dir,
                     run_dir_log, still_running)
from .window import NO_PEAK_CPU_FP8, window_metrics

__all__ = ["ExperimentResult", "NO_PEAK_CPU_FP8", "check_options", "find_experiments",
           "reference_mfu_pct", "speed_verdict", "summarize_experiment", "summarize_paths"]
from .status import (FAILED, INCOMPLETE, INVALID, RUNNING, SUCCESS, UNRECOGNISED, classify_failure,
                     compute_status)

_CAUSE_TAIL = 8 * 2**20
"""How far back from its end a log not named log-* is searched for a cause of failure
before it is taken for a batch script's output."""
DEFAULT_GPU = "h100"
"""GPU assumed for foreign logs: every seed measured on H100 (shown in the gpu column)."""
DEFAULT_TOLERANCE_PCT = 5.0




def check_options(convention: str = "published", workload: str | None = None,
                  size: str | None = None, dtype: str | None = None, scale: int | None = None,
                  gpu: str | None = None) -> None:
    """ValueError naming what is wrong with user-given options, and what would be right."""
    if convention not in fl.CONVENTIONS:
        raise ValueError(f"unknown FLOPs convention {convention!r}; use one of "
                         f"{', '.join(fl.CONVENTIONS)}")
    if workload is not None and workload not in models.WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; known workloads: "
                         f"{', '.join(models.WORKLOADS)}")
    if size is not None:
        known = models.sizes(workload) if workload else sorted(
            {s for w in models.WORKLOADS for s in models.sizes(w)})
        if size.lower() not in known:
            raise ValueError(f"unknown size {size!r}" + (f" for {workload}" if workload else "")
                             + f"; known sizes: {', '.join(known)}")
    if dtype is not None and dtype.lower() not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    if scale is not None and scale < 1:
        raise ValueError(f"scale {scale} must be at least 1")
    if gpu is not None and gpu.lower() not in hardware.GPUS and gpu.lower() != hardware.CPU:
        raise ValueError(f"unknown GPU type {gpu!r}; known types: {', '.join(hardware.GPUS)}")


# --- the summary -----------------------------------------------------------------------------

def summarize_experiment(path: str | Path, *, window: tuple[int, int] | None = None,
                         convention: str = "published", workload: str | None = None,
                         size: str | None = None, dtype: str | None = None,
                         scale: int | None = None, gpu: str | None = None,
                         tolerance_pct: float = DEFAULT_TOLERANCE_PCT,
                         scan: LogScan | None = None) -> ExperimentResult:
    """Status, window statistics, metrics and reference comparison of one experiment.

    path: a trainbench run directory, or a log file of any supported framework.
    window: 0-based iterations (inclusive); default: the seeds' 11-44 of 50, scaled to
    the run length. convention: FLOPs convention for TFLOPS and MFU ('published' or
    'causal'). workload/size/dtype/scale/gpu describe a foreign log when its name does not
    (they override what the name says; trainbench runs take them from plan.json).
    scan: a scan already made of this log file (saves reading it twice).
    ValueError for an unknown convention, workload, size, dtype or GPU.
    """
    check_options(convention, workload, size, dtype, scale, gpu)
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    notes: list[str] = []
    result = ExperimentResult(name=experiment_name(path), path=str(path), notes=notes)

    facts, log_file, scan = _read_sources(path, scan, result)
    result.format = scan.format
    result.records = scan.records
    notes.extend(scan.notes)

    _identify(result, facts, scan, path, workload, size, dtype, scale, gpu)
    spec = _model_spec(result, facts, notes)

    # Run length and window.
    total = scan.total_iterations
    # A run resumed from a checkpoint at step N logs iterations N..N+steps-1.
    first = _count((facts.run or {}).get("first_iteration")) or 0
    if facts.plan and _count(facts.plan.get("steps")):
        total = first + _count(facts.plan["steps"])
    iterations = [r.iteration for r in scan.records]
    result.steps_logged = len(iterations)
    result.last_iteration = iterations[-1] if iterations else None
    result.total_iterations = total
    if not total and iterations and facts.plan is None:
        # No run length printed: the log may be an excerpt, so the window is scaled to
        # the iterations it holds rather than to 0..last.
        first = iterations[0]
    length = (total - first) if total else (iterations[-1] - first + 1 if iterations else None)
    win = window
    if win is None and length:
        start, end = metrics.default_window(length)
        win = (first + start, first + end)
    if win:
        result.window_start, result.window_end = win

    if _settle_status(result, facts, scan, path, log_file, total, win) == RUNNING:
        return result
    failed_after_last_step = result.exit_code and result.status == SUCCESS
    _comparability(result, facts, scan)
    window_metrics(result, scan, spec, convention, facts, window_given=window is not None)
    telemetry(result, facts)
    profiling_overhead(result, facts)
    straggler_note(result, facts)
    if failed_after_last_step:
        # Every step logged, then a non-zero exit (a crash in the final checkpoint, a rank
        # killed at teardown): its steps' timings stand, but the run did not end as it
        # should, so it is never a Success.
        result.status = FAILED
    _compare(result, spec, convention, tolerance_pct)
    if facts.parsed_plan is not None:  # a plan with a model's sizes
        predict_beside(result, facts.parsed_plan, facts.run)
    return result


def _read_sources(path: Path, scan: LogScan | None, result: ExperimentResult
                  ) -> tuple[RunFacts, Path | None, LogScan]:
    """(the run's records, its log, the scan of its steps) for a run directory (its
    metrics.jsonl, else its log) or a log file (scan: one already made of it); sets the
    result's log_file."""
    notes = result.notes
    facts = RunFacts()
    log_file: Path | None = None
    if path.is_dir():
        scan = None  # a run directory's own files decide what is read
        facts = read_run_dir(path, notes)
        metrics_file = path / METRICS_FILE
        log_file = run_dir_log(path, facts.plan, notes)
        if metrics_file.exists() and not is_regular(metrics_file):
            notes.append(not_regular(metrics_file, METRICS_FILE))
        elif metrics_file.is_file():
            scan = read_metrics_jsonl(metrics_file)
            if scan.truncated_last_line:
                notes.append("metrics.jsonl ends mid-line (run still writing or killed)")
            result.log_file = str(metrics_file)
        if (scan is None or not scan.records) and log_file is not None:
            scan = scan_log(log_file)
            result.log_file = str(log_file)
    else:
        log_file = path
        scan = scan if scan is not None else scan_log(path)
        result.log_file = str(path)
    if scan is None:
        scan = LogScan(path)
        notes.append("no metrics.jsonl and no log file")
    return facts, log_file, scan


def _settle_status(result: ExperimentResult, facts: RunFacts, scan: LogScan, path: Path,
                   log_file: Path | None, total: int | None,
                   win: tuple[int, int] | None) -> str:
    """Set the result's status, its detail, exit code and failure class; its status.

    A run directory without exit.json is Running while its run goes on (still_running;
    nothing more is computed for it); its launcher killed, it failed. The log's last error
    line is looked up only when something went wrong. A non-zero exit code after the last
    step leaves the status Success here, with the detail saying so: the caller computes
    the timings of its steps, then marks it Failed."""
    notes = result.notes
    if facts.exit is not None:
        code = facts.exit.get("exit_code")
        if isinstance(code, int) and not isinstance(code, bool) and -2**31 <= code < 2**31:
            result.exit_code = code
        else:
            notes.append("exit.json has no integer exit_code")
    elif path.is_dir():
        running = still_running(path)
        if running is not None:
            _running(result, scan, facts, running)
            return RUNNING
        if launcher_gone(path):
            # Killed with SIGKILL, the launcher wrote no exit.json: the run ended, and failed.
            facts.exit = {"reason": "launcher killed: it ended without writing exit.json"}
    failed_end = facts.exit is not None and result.exit_code != 0
    recognised = scan.recognised or facts.plan is not None
    provisional = compute_status(scan.records, total, win or (0, 0), recognised=recognised)
    if provisional.status != SUCCESS or (result.exit_code or 0) != 0:
        result.failure_class, result.last_error = _last_error(log_file, facts.exit)
    # A log whose end states a known cause of failure (an OOM, a NCCL timeout, Slurm's
    # time limit) failed, as an exit.json with a non-zero code says for trainbench's runs.
    failed_end = failed_end or result.failure_class is not None
    status = compute_status(scan.records, total, win or (0, 0), result.last_error, failed_end,
                            recognised=recognised)
    if status.status == INVALID:
        result.failure_class = "NaN/Inf"
    elif status.status not in (FAILED, INCOMPLETE):
        result.failure_class = None
    result.status, result.status_detail = status.status, status.detail
    if result.exit_code and status.status == SUCCESS:
        result.status_detail = (f"exit code {result.exit_code} after the last step"
                                + (f": {result.last_error}" if result.last_error else ""))
    return result.status


def _running(result: ExperimentResult, scan: LogScan, facts: RunFacts, why: str) -> None:
    """A run in progress: its steps so far, no verdict on them, not in the success rate."""
    records = scan.records
    result.status = RUNNING
    result.status_detail = (f"in progress ({why}): "
                            + (f"{len(records)} step(s) logged, the last iteration "
                               f"{records[-1].iteration}" if records else "no step logged yet"))
    result.verdict = "running"
    peaks = [r.peak_memory_bytes for r in records if r.peak_memory_bytes]
    if peaks:
        result.peak_memory_gib = max(peaks) / 2**30
    _comparability(result, facts, scan)


def _identify(result: ExperimentResult, facts: RunFacts, scan: LogScan, path: Path,
              workload, size, dtype, scale, gpu) -> None:
    """What ran: from plan.json where the run has one, else from the log, its name and
    the user's options."""
    if facts.plan is not None:
        _identify_from_plan(result, facts)
    else:
        _identify_from_log(result, scan, path, workload, size, dtype, scale, gpu)


def _identify_from_plan(result: ExperimentResult, facts: RunFacts) -> None:
    plan = facts.plan
    result.workload, result.size = plan.get("workload"), plan.get("size")
    result.dtype, result.gpu_type = plan.get("dtype"), plan.get("gpu_type")
    # Counts past any plan's (a plan.json edited by hand) are no identity: left unknown.
    result.gpus, result.gbs, result.seq_len = (_size(plan.get(key))
                                               for key in ("gpus", "gbs", "seq_len"))
    layout = plan.get("layout") or {}
    if layout:
        try:
            result.layout = Layout(**layout).describe()
        except TypeError:
            result.layout = None
    result.identity_source = "plan.json"
    run = facts.run or {}
    if run.get("world_size") and run["world_size"] != result.gpus:
        result.notes.append(f"run.json world size {run['world_size']} differs from the "
                            f"plan's {result.gpus}")
    # The device actually used decides which reference applies.
    device = run.get("device_name")
    if device and result.gpu_type != hardware.CPU:
        found = hardware.gpu_from_device_name(device)
        if found and found.key != result.gpu_type:
            result.notes.append(f"planned for {result.gpu_type}, ran on {device}")
            result.gpu_type = found.key


def _identify_from_log(result: ExperimentResult, scan: LogScan, path: Path,
                       workload, size, dtype, scale, gpu) -> None:
    given = Identity(workload, size.lower() if size else None,
                     dtype.lower() if dtype else None, scale)
    inferred = infer_identity(path, scan.format)
    facts_ = scan.facts
    result.facts = dict(facts_)
    # What the log states beats what its file name suggests; the user's options beat both.
    stated = Identity(None, None, _fact_str(facts_, "dtype"), _fact_int(facts_, "world_size"))
    ident = given.merged_over(stated).merged_over(inferred)
    result.workload, result.size, result.dtype, result.gpus = (
        ident.workload, ident.size, ident.dtype, ident.gpus)
    result.gpu_type = (gpu or DEFAULT_GPU).lower()
    sources = []
    if not given.is_empty():
        sources.append("options")
    if any(getattr(stated, k) is not None and getattr(given, k) is None
           for k in ("dtype", "gpus")):
        sources.append("log")
    if any(getattr(inferred, k) is not None and getattr(given, k) is None
           for k in ("workload", "size", "dtype", "gpus")):
        sources.append("name")
    result.identity_source = "+".join(sources)

    row = None
    if result.workload and result.size and result.dtype and result.gpus:
        try:
            row = recipes.find_row(result.workload, result.size, result.dtype, result.gpus,
                                   result.gpu_type)
        except LookupError:
            row = None
    if row is not None:
        result.layout = (f"TP{row.tp} PP{row.pp} CP{row.cp} DP{row.dp}"
                         + (f" VP{row.vp}" if row.vp > 1 else "") + " (recipe)")
    # The log's own batch and sequence length, where it prints them, describe the run
    # better than the recipe.
    logged_gbs = next((r.global_batch_size for r in reversed(scan.records)
                       if r.global_batch_size), None) or _fact_int(facts_, "gbs")
    seq = _fact_int(facts_, "seq_len")
    tp, pp, cp = (_fact_int(facts_, k) for k in ("tp", "pp", "cp"))
    if tp or pp or cp:
        tp, pp, cp = tp or 1, pp or 1, cp or 1
        dp = f" DP{result.gpus // (tp * pp * cp)}" if result.gpus else ""
        result.layout = f"TP{tp} PP{pp} CP{cp}{dp} (log)"
    if seq is None and row is not None:
        seq = row.seq_len
    if seq is None and result.workload and result.size:
        try:
            seq = models.get_model(result.workload, result.size).seq_len
        except LookupError:
            pass
    result.seq_len = seq
    result.gbs = logged_gbs or (row.gbs if row else None)
    if logged_gbs and row and logged_gbs != row.gbs:
        result.notes.append(f"GBS {logged_gbs} in the log, {row.gbs} in the recipe")


def _fact_int(facts: dict, key: str) -> int | None:
    value = facts.get(key)
    return value if isinstance(value, int) and value > 0 else None


def _fact_str(facts: dict, key: str) -> str | None:
    value = facts.get(key)
    return value if isinstance(value, str) and value else None


def _model_spec(result: ExperimentResult, facts: RunFacts, notes: list[str]):
    if facts.model is not None:
        return facts.model
    if facts.model_refused or not (result.workload and result.size):
        return None
    try:
        spec = models.get_model(result.workload, result.size)
    except LookupError as err:
        notes.append(str(err))
        return None
    if not spec.is_hybrid and result.dtype and result.gpus:
        try:  # the 405B proxies take their depth from the recipe row of their scale
            row = recipes.find_row(result.workload, result.size, result.dtype, result.gpus,
                                   result.gpu_type or DEFAULT_GPU)
            spec = spec.with_layers(row.layers)
        except LookupError:
            pass
    return spec


def _size(value) -> int | None:
    """A plan's count (GPUs, GBS, sequence length) as an int from 1 to MAX_INT (`--set`'s
    bound), or None."""
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_INT:
        return value
    return None


def _count(value) -> int | None:
    """A record's step count as an int, None where it is none (a string, a float, a
    number past any run's length)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 10**12:
        return value
    return None


def _last_error(log_file: Path | None, exit_info: dict | None) -> tuple[str | None, str | None]:
    """(failure class, line) of a run: the log's line of its most specific known cause,
    or its last error line; exit.json's reason (trainbench's own launcher: disk full, a
    killed rank or launcher) comes first."""
    cls, line = None, None
    if log_file is not None and log_file.is_file():
        cls, line = find_failure(log_file)
    if exit_info and exit_info.get("reason"):
        # Cut as a log's error line is: the failure patterns run over it.
        reason = " ".join(str(exit_info["reason"])[:500].split())
        cls = classify_failure(reason) or cls
        if exit_info.get("executor") == "local":
            return cls, reason  # the local launcher already named the cause, from every rank
        line = f"{reason} ({line})" if line and line not in reason else reason
    return cls, line


def _comparability(result: ExperimentResult, facts: RunFacts, scan: LogScan) -> None:
    features = (facts.plan or {}).get("features") or {}
    if features.get("profile"):
        result.comparable = False
        result.notes.append(f"profiled run ({features['profile']}): not valid for "
                            "performance comparison")
    elif features.get("nccl_trace"):
        result.comparable = False
        result.notes.append("NCCL-traced run: not valid for performance comparison")
    elif facts.plan is None:
        # The seeds name their profiling runs `..._nsys` and trace into `..._nccltrace`.
        text = result.path.lower()
        if "_nsys" in text or "nccltrace" in text:
            result.comparable = False
            result.notes.append("profiling run (by its name): not valid for performance "
                                "comparison")
        elif scan.profiled:
            result.comparable = False
            result.notes.append(f"profiled run (the log says `{scan.profiled[:120]}`): not "
                                "valid for performance comparison")


def reference_mfu_pct(ref: references.Reference, convention: str) -> float | None:
    """A reference's MFU recomputed under a FLOPs convention (the seed's own figure is in
    the published one), so both sides of a comparison count FLOPs the same way."""
    try:
        row = recipes.find_row(ref.workload, ref.size, ref.dtype, ref.gpus, ref.gpu_type)
        spec = models.get_model(ref.workload, ref.size)
    except LookupError:
        return None
    if not spec.is_hybrid:
        spec = spec.with_layers(row.layers)
    peak = hardware.GPUS[ref.gpu_type].peak(ref.dtype)
    f = fl.flops_per_sequence(spec, row.seq_len, convention)
    return 100 * metrics.mfu(row.gbs, f, ref.step_time_s, ref.gpus, peak)


def speed_verdict(time_ratio: float, tolerance_pct: float = DEFAULT_TOLERANCE_PCT) -> str:
    """time_ratio = our time per token / the reference's (1.10 = 10% slower)."""
    if abs(time_ratio - 1) * 100 <= tolerance_pct:
        return f"within {tolerance_pct:g}%"
    if time_ratio > 1:
        return f"{(time_ratio - 1) * 100:.0f}% slower"
    return f"{(1 - time_ratio) * 100:.0f}% faster"


def _compare(result: ExperimentResult, spec, convention: str, tolerance_pct: float) -> None:
    ref = None
    if result.workload and result.size and result.dtype and result.gpus and result.gpu_type:
        ref = references.find_reference(result.workload, result.size, result.dtype,
                                        result.gpus, result.gpu_type)
    if ref is not None:
        result.ref_step_time_s = ref.step_time_s
        result.ref_tokens_per_s = ref.tokens_per_s
        result.ref_mfu_pct = reference_mfu_pct(ref, convention)
        if result.step_time_mean_s:
            result.pct_of_ref_step_time = 100 * result.step_time_mean_s / ref.step_time_s
        if result.tokens_per_s:
            result.pct_of_ref_tokens_per_s = 100 * result.tokens_per_s / ref.tokens_per_s
    if result.status == FAILED:
        result.verdict = "failed"
    elif result.status == INVALID:
        result.verdict = "invalid"
    elif result.status == UNRECOGNISED:
        result.verdict = "format not read"
    elif not result.comparable:
        result.verdict = "not comparable (profiled)"
    elif ref is None:
        result.verdict = "no reference"
    elif result.step_time_mean_s is None:
        result.verdict = "no data in window"
    else:
        # Throughput decides where the log gives a batch size; with the recipe's batch it
        # is the same as comparing step times.
        if result.pct_of_ref_tokens_per_s:
            ratio = 100 / result.pct_of_ref_tokens_per_s
        else:
            ratio = result.pct_of_ref_step_time / 100
        result.verdict = speed_verdict(ratio, tolerance_pct)
        if result.status == INCOMPLETE:
            result.verdict += " (incomplete run)"
    if result.throttled and result.verdict not in ("failed", "invalid"):
        # Still compared (the clocks are a fact of the machine), never silently.
        result.verdict = f"throttled: {result.verdict}"


def summarize_paths(paths: list[str | Path], skipped: list[str] | None = None,
                    **options) -> list[ExperimentResult]:
    """summarize_experiment over every experiment found under paths (see
    find_experiments); a log file not named log-* is kept only if it has step lines.

    An experiment that cannot be read (a metrics.jsonl without read permission, a log
    replaced by a FIFO) is left out, and a line naming it and why goes to `skipped`: one
    unreadable run never hides the others."""
    skipped = skipped if skipped is not None else []
    results = []
    for path, certain in find_experiments(paths, skipped):
        try:
            scan = None
            if not certain:
                scan = scan_log(path)
                if not (scan.records or scan.recognised or scan.step_like_lines >= 3
                        or find_failure(path, max_bytes=_CAUSE_TAIL)[0]):
                    continue  # a batch script's output, not a training log
            results.append(summarize_experiment(path, scan=scan, **options))
        except OSError as err:
            skipped.append(f"{path}: {describe_read_error(err)}, not read")
    return results
