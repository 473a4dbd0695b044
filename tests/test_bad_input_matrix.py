"""Every invalid invocation ends in one line `trainbench: error: ...`, exit code 2, no
traceback, and nothing created: no experiment directory, no job row, no config file.

Each case runs the real CLI (or the engine's entry point) in a subprocess, in a fresh
HOME, experiments root and cluster config, and compares the whole tree before and after.
None of them may launch training, so the matrix stays quick.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainbench.launch.jobs import JobsDB

RUN = ["run", "-w", "pretrain_llama3.1", "-s", "tiny", "--gpu", "cpu", "--scale", "2",
       "--dtype", "fp32"]
PREDICT = ["predict", "-w", "pretrain_llama3.1", "-s", "8b", "--dtype", "bf16", "--scale", "8"]
FLOPS = ["flops", "-w", "pretrain_llama3.1", "-s", "8b"]
LOGS = str(Path(__file__).parent / "data" / "logs" / "nemo2")
# Variables of the user's shell that would change what a case means.
SCRUB = ("TRAINBENCH_ROOT", "TRAINBENCH_CONFIG", "DTYPE", "MODEL_SIZE", "JOB_TOTAL_GPUS",
         "GPUS_PER_NODE", "ENABLE_PROFILE", "PROFILE_START_STEP", "PROFILE_STOP_STEP",
         "ENABLE_NCCLTRACE", "ENABLE_CHECKPOINT", "LOAD_CHECKPOINT_PATH",
         "TRAINBENCH_FAIL_AT_STEP")


# --- what a case finds on disk before it runs --------------------------------------------

def binary(path: Path) -> None:
    path.write_bytes(bytes(range(256)) * 8)


def jobs_db(root: Path) -> Path:
    db = JobsDB(root)
    db.add("local", "1", "pretrain_llama3.1_tiny_fp32_gpus2", str(root / "x"), "{}", "COMPLETED")
    return db.path


def corrupt_db(t: Path) -> None:
    (t / "root").mkdir(parents=True, exist_ok=True)
    binary(t / "root" / "jobs.sqlite")


def truncated_db(t: Path) -> None:
    path = jobs_db(t / "root")
    for n in range(40):  # enough rows for more than one page
        JobsDB(t / "root").add("local", str(n), "n", "/x", "{}" * 500, "COMPLETED")
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])


def config(text: str):
    def setup(t: Path) -> None:
        (t / "home" / "cluster.yaml").write_text(text)
    return setup


def file_at(rel: str, content: bytes | None = None):
    def setup(t: Path) -> None:
        path = t / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if content is None:
            binary(path)
        else:
            path.write_bytes(content)
    return setup


def dir_at(rel: str):
    def setup(t: Path) -> None:
        (t / rel).mkdir(parents=True, exist_ok=True)
    return setup


def both(*setups):
    def setup(t: Path) -> None:
        for s in setups:
            s(t)
    return setup


def with_db(t: Path) -> None:
    jobs_db(t / "root")


def fifo_at(rel: str):
    def setup(t: Path) -> None:
        path = t / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(path)
    return setup


def symlink_loop(t: Path) -> None:
    """home/l1 -> home/l2 -> home/l1: a path with no directory at its end."""
    (t / "home" / "l1").symlink_to(t / "home" / "l2")
    (t / "home" / "l2").symlink_to(t / "home" / "l1")


def sweep(text: str):
    return file_at("home/sweep.yaml", text.encode())


TINY_TASK = "{workload: pretrain_llama3.1, size: tiny, dtype: fp32, scale: 2, gpu: cpu}"
GOOD_SWEEP = f"tasks:\n  - {TINY_TASK}\n"
NOT_UTF8 = os.fsdecode(b"/not-utf8-\xff\xfe")
"""A path component whose bytes are not UTF-8 (as str: surrogate escapes; a subprocess
gets the raw bytes back)."""


def bomb(leaf: str) -> str:
    """A YAML alias bomb as a flow sequence: nine anchors, each nine aliases of the one
    before, 9**9 values once expanded."""
    names = "abcdefghi"
    return "[" + ", ".join(f"&{n} [" + ", ".join([f"*{names[k - 1]}" if k else leaf] * 9) + "]"
                           for k, n in enumerate(names)) + "]"


CHECK = ["check", "-w", "pretrain_llama3.1", "-s", "8b", "--scale", "8", "--no-trace"]


# --- the cases: (id, argv, extra environment, setup, words the line must contain) -----------
# argv[0] == "ENGINE" runs `python -m trainbench.engine` instead of the CLI.

CASES = [
    # run: the plan
    ("run-tp0", RUN + ["--set", "tp=0"], {}, None, "tp=0"),
    ("run-pp-negative", RUN + ["--set", "pp=-1"], {}, None, "pp=-1"),
    ("run-layers0", RUN + ["--set", "layers=0"], {}, None, "layers"),
    ("run-lr-nan", RUN + ["--set", "lr=nan"], {}, None, "lr"),
    ("run-lr-zero", RUN + ["--set", "lr=0"], {}, None, "learning rate"),
    ("run-lr-negative", RUN + ["--set", "lr=-0.1"], {}, None, "learning rate"),
    ("run-min-lr-inf", RUN + ["--set", "min_lr=inf"], {}, None, "finite"),
    ("run-set-unknown-key", RUN + ["--set", "foo=1"], {}, None, "unknown key"),
    ("run-set-not-int", RUN + ["--set", "tp=two"], {}, None, "integer"),
    ("run-set-huge-int", RUN + ["--set", "gbs=99999999999999"], {}, None, "too large"),
    ("run-steps-huge", RUN + ["--steps", "1000000000000"], {}, None, "--steps"),
    ("run-steps-zero", RUN + ["--steps", "0"], {}, None, "--steps"),
    ("run-checkpoint-interval-negative", RUN + ["--checkpoint-interval", "-1"], {}, None,
     "--checkpoint-interval"),
    ("run-scale-zero", RUN[:7] + ["--scale", "0"], {}, None, "scale"),
    ("run-scale-negative", RUN[:7] + ["--scale", "-4"], {}, None, "scale"),
    ("run-scale-not-int", RUN[:7] + ["--scale", "abc"], {}, None, "--scale"),
    ("run-unknown-option", RUN + ["--bogus"], {}, None, "--bogus"),
    ("run-missing-workload", ["run", "-s", "tiny", "--scale", "2"], {}, None, "--workload"),
    ("run-unknown-dtype", RUN[:-1] + ["fp4"], {}, None, "dtype"),
    ("run-unknown-size", ["run", "-w", "pretrain_llama3.1", "-s", "9b", "--scale", "2"], {},
     None, "sizes"),
    ("run-unknown-executor", RUN + ["--executor", "k8s"], {}, None, "executor"),
    ("run-unknown-profiler", RUN + ["--profile", "perf"], {}, None, "profiler"),
    # run: where it would be recorded
    ("run-root-proc", RUN + ["--root", "/proc"], {}, None, "/proc"),
    ("run-root-is-file", RUN + ["--root", "{t}/home/afile"], {}, file_at("home/afile"),
     "is a file"),
    ("run-root-under-file", RUN + ["--root", "{t}/home/afile/sub"], {}, file_at("home/afile"),
     "is a file"),
    ("run-jobs-db-corrupt", RUN, {}, corrupt_db, "jobs.sqlite"),
    ("run-jobs-db-truncated", RUN, {}, truncated_db, "damaged"),
    ("run-jobs-db-is-dir", RUN, {}, dir_at("root/jobs.sqlite"), "jobs.sqlite"),
    # run: environment variables
    ("env-profile-start-not-int", RUN, {"ENABLE_PROFILE": "1", "PROFILE_START_STEP": "x"}, None,
     "PROFILE_START_STEP"),
    ("env-profile-stop-not-int", RUN, {"ENABLE_PROFILE": "1", "PROFILE_STOP_STEP": "2.5"}, None,
     "PROFILE_STOP_STEP"),
    ("env-enable-profile-maybe", RUN, {"ENABLE_PROFILE": "maybe"}, None, "ENABLE_PROFILE"),
    ("env-enable-checkpoint-maybe", RUN, {"ENABLE_CHECKPOINT": "maybe"}, None,
     "ENABLE_CHECKPOINT"),
    ("env-job-total-gpus-not-int", RUN[:7], {"JOB_TOTAL_GPUS": "eight"}, None,
     "JOB_TOTAL_GPUS"),
    ("env-config-is-dir", RUN, {"TRAINBENCH_CONFIG": "{t}/home/cfgdir"}, dir_at("home/cfgdir"),
     "cfgdir"),
    ("env-config-is-binary", RUN, {"TRAINBENCH_CONFIG": "{t}/home/cfg.bin"},
     file_at("home/cfg.bin"), "cfg.bin"),
    ("run-env-ld-preload", RUN + ["--env", "LD_PRELOAD=/tmp/x.so"], {}, None, "LD_PRELOAD"),
    ("run-env-ld-library-path", RUN + ["--env", "LD_LIBRARY_PATH=/tmp"], {}, None,
     "LD_LIBRARY_PATH"),
    ("run-env-dyld", RUN + ["--env", "DYLD_INSERT_LIBRARIES=x"], {}, None, "DYLD_INSERT"),
    ("run-env-prompt-command", RUN + ["--env", "PROMPT_COMMAND=touch x"], {}, None,
     "PROMPT_COMMAND"),
    ("run-env-bash-env", RUN + ["--env", "BASH_ENV=/tmp/x"], {}, None, "BASH_ENV"),
    ("run-env-secret", RUN + ["--env", "HF_TOKEN=abc"], {}, None, "HF_TOKEN"),
    ("run-env-not-kv", RUN + ["--env", "NOEQUALS"], {}, None, "KEY=VALUE"),
    # the cluster config
    ("config-gpus-per-node-string", RUN, {}, config('gpus_per_node: "8; rm -rf ~"\n'),
     "gpus_per_node"),
    ("config-env-not-mapping", RUN, {}, config("env: [A, B]\n"), "env"),
    ("config-not-yaml", RUN, {}, config("slurm: [unclosed\n"), "YAML"),
    ("config-not-mapping", RUN, {}, config("- a\n- b\n"), "mapping"),
    ("config-env-ld-preload", RUN, {}, config("env: {LD_PRELOAD: /tmp/x.so}\n"), "LD_PRELOAD"),
    ("config-bad-type-jobs", ["jobs", "list"], {}, config("experiments_root: [1]\n"),
     "experiments_root"),
    ("config-bad-type-predict", PREDICT, {}, config("gpus_per_node: many\n"), "gpus_per_node"),
    # predict
    ("predict-tp0", PREDICT + ["--set", "tp=0"], {}, None, "tp=0"),
    ("predict-layers0", PREDICT + ["--set", "layers=0"], {}, None, "layers"),
    ("predict-scale0", PREDICT[:-1] + ["0"], {}, None, "scale"),
    # Sizes that a per-layer or per-microbatch walk would hang or exhaust memory on.
    ("predict-two-billion-layers", PREDICT + ["--set", "layers=2000000000"], {}, None,
     "at most 1,024"),
    ("predict-a-billion-microbatches", PREDICT + ["--set", "gbs=2000000000"], {}, None,
     "microbatches"),
    ("run-two-billion-experts", ["run", "-w", "pretrain_qwen3", "-s", "tiny", "--gpu", "cpu",
                                 "--scale", "1", "--set", "experts=2000000000"], {}, None,
     "at most 4,096"),
    ("check-two-billion-layers", CHECK + ["--set", "layers=2000000000"], {}, None,
     "at most 1,024"),
    ("predict-format", PREDICT + ["--format", "xml"], {}, None, "format"),
    ("predict-missing", ["predict", "-w", "pretrain_llama3.1"], {}, None, "needs"),
    ("predict-headroom", PREDICT + ["--headroom", "1.5"], {}, None, "headroom"),
    # show, list, flops
    ("show-unknown-workload", ["show", "-w", "pretrain_gpt", "-s", "8b"], {}, None,
     "unknown workload"),
    ("show-scale-not-int", ["show", "-w", "pretrain_llama3.1", "-s", "8b", "--scale", "x"], {},
     None, "--scale"),
    ("show-unknown-gpu", ["show", "-w", "pretrain_llama3.1", "-s", "8b", "--gpu", "v100"], {},
     None, "unknown GPU"),
    ("list-unknown-workload", ["list", "-w", "nope"], {}, None, "unknown workload"),
    ("list-unknown-option", ["list", "--bogus"], {}, None, "--bogus"),
    ("flops-partial-mfu", FLOPS + ["--gbs", "8"], {}, None, "needs all of"),
    ("flops-step-time-not-number", FLOPS + ["--step-time", "fast"], {}, None, "--step-time"),
    ("flops-convention", FLOPS + ["--convention", "mine"], {}, None, "convention"),
    ("flops-seq-len-zero", FLOPS + ["--seq-len", "0"], {}, None, "--seq-len"),
    ("flops-negative-gpus", FLOPS + ["--gbs", "8", "--step-time", "1", "--gpus", "-1"], {},
     None, "--gpus"),
    ("flops-step-time-inf", FLOPS + ["--gbs", "8", "--step-time", "inf", "--gpus", "8"], {},
     None, "--step-time"),
    ("flops-step-time-nan", FLOPS + ["--gbs", "8", "--step-time", "nan", "--gpus", "8"], {},
     None, "--step-time"),
    ("unknown-command", ["benchmark"], {}, None, "benchmark"),
    # results and plot
    ("results-o-proc", ["results", LOGS, "-o", "/proc/out.csv"], {}, None, "/proc"),
    ("results-o-under-file", ["results", LOGS, "-o", "{t}/home/afile/out.csv"], {},
     file_at("home/afile"), "afile"),
    ("results-o-exists", ["results", LOGS, "-o", "{t}/home/afile"], {}, file_at("home/afile"),
     "already exists"),
    ("results-format", ["results", LOGS, "--format", "xml"], {}, None, "--format"),
    ("results-window", ["results", LOGS, "--window", "abc"], {}, None, "--window"),
    ("results-missing-path", ["results", "{t}/home/nothing"], {}, None, "nothing"),
    ("plot-o-proc", ["plot", LOGS, "-o", "/proc/charts"], {}, None, "/proc"),
    ("plot-o-is-file", ["plot", LOGS, "-o", "{t}/home/afile"], {}, file_at("home/afile"),
     "is a file"),
    ("plot-o-under-file", ["plot", LOGS, "-o", "{t}/home/afile/charts"], {},
     file_at("home/afile"), "afile"),
    # init
    ("init-no-terminal", ["init"], {}, None, "--account"),
    ("init-from-binary", ["init", "--from", "{t}/home/in.yaml"], {}, file_at("home/in.yaml"),
     "in.yaml"),
    ("init-from-malformed", ["init", "--from", "{t}/home/in.yaml"], {},
     file_at("home/in.yaml", b"account: [oops\n"), "in.yaml"),
    ("init-from-dir", ["init", "--from", "{t}/home"], {}, None, "home"),
    ("init-from-unknown-key", ["init", "--from", "{t}/home/in.yaml"], {},
     file_at("home/in.yaml", b"acount: perf\n"), "acount"),
    ("init-unwritable-config", ["init", "--account", "perf"],
     {"TRAINBENCH_CONFIG": "/proc/trainbench/cluster.yaml"}, None, "cluster config"),
    ("init-config-under-file", ["init", "--account", "perf"],
     {"TRAINBENCH_CONFIG": "{t}/home/afile/cluster.yaml"}, file_at("home/afile"), "afile"),
    ("init-experiments-root-file", ["init", "--experiments-root", "{t}/home/afile"], {},
     file_at("home/afile"), "is a file"),
    ("init-bad-account", ["init", "--account", "perf;rm"], {}, None, "account"),
    ("init-env-ld-preload", ["init", "--account", "perf", "--env", "LD_PRELOAD=/x.so"], {},
     None, "LD_PRELOAD"),
    ("init-gpus-per-node-not-int", ["init", "--gpus-per-node", "eight"], {}, None,
     "--gpus-per-node"),
    # bulk
    ("bulk-binary", ["bulk", "{t}/home/sweep.yaml"], {}, file_at("home/sweep.yaml"),
     "sweep.yaml"),
    ("bulk-malformed", ["bulk", "{t}/home/sweep.yaml"], {},
     file_at("home/sweep.yaml", b"tasks: [\n"), "sweep.yaml"),
    ("bulk-missing-file", ["bulk", "{t}/home/none.yaml"], {}, None, "none.yaml"),
    ("bulk-no-tasks", ["bulk", "{t}/home/sweep.yaml"], {},
     file_at("home/sweep.yaml", b"defaults: {gpu: cpu}\n"), "tasks"),
    ("bulk-repeats-huge", ["bulk", "{t}/home/sweep.yaml"], {},
     file_at("home/sweep.yaml", b"tasks:\n  - {workload: pretrain_llama3.1, size: tiny, "
                                b"dtype: fp32, scale: 2, gpu: cpu, repeats: 1000000000}\n"),
     "repeats"),
    ("bulk-steps-huge", ["bulk", "{t}/home/sweep.yaml"], {},
     file_at("home/sweep.yaml", b"tasks:\n  - {workload: pretrain_llama3.1, size: tiny, "
                                b"dtype: fp32, scale: 2, gpu: cpu, steps: 1000000000000}\n"),
     "steps"),
    ("bulk-tp0", ["bulk", "{t}/home/sweep.yaml"], {},
     file_at("home/sweep.yaml", b"tasks:\n  - {workload: pretrain_llama3.1, size: tiny, "
                                b"dtype: fp32, scale: 2, gpu: cpu, set: [tp=0]}\n"), "tp=0"),
    # jobs
    ("jobs-list-corrupt", ["jobs", "list"], {}, corrupt_db, "jobs.sqlite"),
    ("jobs-show-corrupt", ["jobs", "show", "1"], {}, corrupt_db, "jobs.sqlite"),
    ("jobs-refresh-corrupt", ["jobs", "refresh"], {}, corrupt_db, "jobs.sqlite"),
    ("jobs-default-corrupt", ["jobs"], {}, corrupt_db, "jobs.sqlite"),
    ("jobs-list-truncated", ["jobs", "list"], {}, truncated_db, "damaged"),
    ("jobs-root-before-subcommand-corrupt", ["jobs", "--root", "{t}/home/other", "list"], {},
     both(file_at("home/other/jobs.sqlite")), "other"),
    ("jobs-show-not-int", ["jobs", "show", "abc"], {}, with_db, "job"),
    ("jobs-show-unknown-id", ["jobs", "show", "99"], {}, with_db, "no job 99"),
    ("jobs-root-is-file", ["jobs", "--root", "{t}/home/afile", "list"], {},
     file_at("home/afile"), "afile"),
    # the engine's entry point
    ("engine-no-args", ["ENGINE"], {}, None, "usage"),
    ("engine-missing-plan", ["ENGINE", "{t}/home/plan.json"], {}, None, "plan.json"),
    ("engine-plan-is-dir", ["ENGINE", "{t}/home"], {}, None, "directory"),
    ("engine-plan-partial", ["ENGINE", "{t}/home/plan.json"], {},
     file_at("home/plan.json", b'{"workload": "pretrain_llama3.1", "si'), "not valid JSON"),
    ("engine-plan-binary", ["ENGINE", "{t}/home/plan.json"], {}, file_at("home/plan.json"),
     "plan.json"),
    ("engine-plan-incomplete", ["ENGINE", "{t}/home/plan.json"], {},
     file_at("home/plan.json", b'{"workload": "pretrain_llama3.1"}'), "incomplete"),
    # issue 37, class 1: bounds checked before anything expands
    ("check-ranks-a-billion", CHECK + ["--ranks", "0-999999999"], {}, None, "0-7"),
    ("check-ranks-backwards", CHECK + ["--ranks", "7-3"], {}, None, "lower rank"),
    ("check-ranks-fullwidth", CHECK + ["--ranks", "\uff12"], {}, None, "--ranks"),
    ("check-ranks-negative", CHECK + ["--ranks", "-1"], {}, None, "--ranks"),
    ("check-ranks-huge-text", CHECK + ["--ranks", "0-7," * 20_000 + "8"], {}, None, "0-7"),
    ("config-alias-bomb-run", RUN, {}, config(f"x: {bomb('8')}\ngpus_per_node: *i\n"),
     "alias"),
    ("config-alias-bomb-jobs", ["jobs", "list"], {}, config(f"env: {{A: {bomb('x')}}}\n"),
     "alias"),
    ("config-alias-recursive", PREDICT, {}, config("slurm: &s {x: *s}\n"), "alias"),
    ("config-integer-of-5000-digits", RUN, {}, config("gpus_per_node: " + "9" * 5000 + "\n"),
     "beyond"),
    ("config-gpus-per-node-a-list", RUN, {}, config("gpus_per_node: [" + "8, " * 5000 + "8]\n"),
     "a list of 5001 item(s)"),
    ("bulk-alias-bomb-sizes", ["bulk", "{t}/home/sweep.yaml"], {},
     sweep("tasks:\n  - {workload: pretrain_llama3.1, dtype: fp32, scale: 2, gpu: cpu, "
           f"sizes: {bomb('tiny')}}}\n"), "alias"),
    ("bulk-alias-bomb-scales", ["bulk", "{t}/home/sweep.yaml", "--dry-run"], {},
     sweep("tasks:\n  - {workload: pretrain_llama3.1, size: tiny, dtype: fp32, gpu: cpu, "
           f"scales: {bomb('2')}}}\n"), "alias"),
    ("bulk-alias-recursive", ["bulk", "{t}/home/sweep.yaml"], {}, sweep("tasks: &t [*t]\n"),
     "alias"),
    ("bulk-nested-3000-deep", ["bulk", "{t}/home/sweep.yaml"], {},
     sweep("tasks: " + "[" * 3000 + "]" * 3000 + "\n"), "nested"),
    ("bulk-sizes-a-nested-list", ["bulk", "{t}/home/sweep.yaml"], {},
     sweep("tasks:\n  - {workload: pretrain_llama3.1, sizes: [[tiny, tiny]], dtype: fp32, "
           "scale: 2, gpu: cpu}\n"), "a list of 2 item(s)"),
    ("bulk-scale-1e400", ["bulk", "{t}/home/sweep.yaml"], {},
     sweep("tasks:\n  - {workload: pretrain_llama3.1, size: tiny, dtype: fp32, scale: 1e400, "
           "gpu: cpu}\n"), "scale"),
    # class 2: only regular files are read
    ("results-log-is-a-fifo", ["results", "{t}/home/logs"], {}, fifo_at("home/logs/log-x.out"),
     "FIFO"),
    ("results-dev-null", ["results", "/dev/null"], {}, None, "character device"),
    ("config-is-a-fifo", RUN, {}, fifo_at("home/cluster.yaml"), "FIFO"),
    ("config-is-dev-zero", PREDICT, {"TRAINBENCH_CONFIG": "/dev/zero"}, None,
     "character device"),
    ("config-5-mib", RUN, {}, config("# padding\n" * 500_000), "MiB"),
    ("bulk-file-is-a-fifo", ["bulk", "{t}/home/sweep.yaml"], {}, fifo_at("home/sweep.yaml"),
     "FIFO"),
    ("bulk-file-dev-zero", ["bulk", "/dev/zero"], {}, None, "character device"),
    ("init-from-fifo", ["init", "--from", "{t}/home/in.yaml"], {}, fifo_at("home/in.yaml"),
     "FIFO"),
    # class 3: paths that cannot be recorded or resolved
    ("run-root-not-utf8", RUN + ["--root", "{t}/home" + NOT_UTF8], {}, None, "UTF-8"),
    ("run-env-root-not-utf8", RUN, {"TRAINBENCH_ROOT": "{t}/home" + NOT_UTF8}, None, "UTF-8"),
    ("bulk-env-root-not-utf8", ["bulk", "{t}/home/sweep.yaml"],
     {"TRAINBENCH_ROOT": "{t}/home" + NOT_UTF8}, sweep(GOOD_SWEEP), "UTF-8"),
    ("run-root-symlink-loop", RUN + ["--root", "{t}/home/l1/x"], {}, symlink_loop,
     "symlink loop"),
    ("run-env-root-symlink-loop", RUN, {"TRAINBENCH_ROOT": "{t}/home/l1"}, symlink_loop,
     "symlink loop"),
    ("jobs-root-symlink-loop", ["jobs", "--root", "{t}/home/l1", "list"], {}, symlink_loop,
     "symlink loop"),
    ("results-root-symlink-loop", ["results", "--root", "{t}/home/l1"], {}, symlink_loop,
     "symlink loop"),
    # class 5: bulk refuses once, before anything starts
    ("bulk-root-is-a-file", ["bulk", "{t}/home/sweep.yaml"],
     {"TRAINBENCH_ROOT": "{t}/home/afile"}, both(sweep(GOOD_SWEEP), file_at("home/afile")),
     "is a file"),
    ("bulk-tasks-are-numbers", ["bulk", "{t}/home/sweep.yaml"], {}, sweep("tasks: [1, 2, 3]\n"),
     "tasks[1], tasks[2], tasks[3]"),
    ("bulk-set-twice", ["bulk", "{t}/home/sweep.yaml"], {},
     sweep("tasks:\n  - {workload: pretrain_llama3.1, size: tiny, dtype: fp32, scale: 2, "
           "gpu: cpu, set: [tp=1, tp=2]}\n"), "twice"),
    # class 6: --set numbers in ASCII digits, each key once
    ("run-set-fullwidth-digit", RUN + ["--set", "tp=\uff12"], {}, None, "ASCII"),
    ("run-set-arabic-indic-digits", RUN + ["--set", "gbs=\u0661\u0666"], {}, None, "ASCII"),
    ("run-set-digit-grouping", RUN + ["--set", "gbs=1_6"], {}, None, "ASCII"),
    ("run-set-float-arabic-indic", RUN + ["--set", "lr=\u0661.\u0665"], {}, None, "ASCII"),
    ("run-set-key-twice", RUN + ["--set", "tp=1 tp=2"], {}, None, "twice"),
    ("run-set-key-twice-two-options", RUN + ["--set", "tp=1", "--set", "tp=2"], {}, None,
     "twice"),
    ("run-set-5000-digits", RUN + ["--set", "gbs=" + "9" * 5000], {}, None, "too large"),
    ("predict-set-key-twice", PREDICT + ["--set", "tp=2 tp=4"], {}, None, "twice"),
    ("check-set-fullwidth-digit", CHECK + ["--set", "tp=\uff12"], {}, None, "ASCII"),
    ("run-profile-ranks-fullwidth", RUN + ["--profile", "torch", "--profile-ranks", "\uff11"],
     {}, None, "--profile-ranks"),
]
ISSUE_37_CASES = 44
"""The cases above added for issue 37 (hostile but realistic input)."""


def snapshot(top: Path) -> dict[str, str]:
    """Every path under top with a digest of its content (directories as 'dir', symbolic
    links by their target, FIFOs as 'fifo': reading one would wait for a writer)."""
    out = {}
    for path in sorted(top.rglob("*")):
        rel = str(path.relative_to(top))
        if path.is_symlink():
            out[rel] = f"link {os.readlink(path)}"
        elif path.is_dir():
            out[rel] = "dir"
        elif path.is_fifo():
            out[rel] = "fifo"
        else:
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def environment(t: Path, extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SCRUB}
    env.update(HOME=str(t / "home"), TRAINBENCH_ROOT=str(t / "root"),
               TRAINBENCH_CONFIG=str(t / "home" / "cluster.yaml"),
               # matplotlib's font cache lives outside the tree under test.
               MPLCONFIGDIR=str(t.parent / "mpl"))
    env.update({k: v.replace("{t}", str(t)) for k, v in extra.items()})
    return env


def invoke(t: Path, argv: list[str], extra: dict[str, str]) -> subprocess.CompletedProcess:
    argv = [a.replace("{t}", str(t)) for a in argv]
    if argv and argv[0] == "ENGINE":
        cmd = [sys.executable, "-m", "trainbench.engine", *argv[1:]]
    else:
        cmd = [sys.executable, "-m", "trainbench.cli", *argv]
    return subprocess.run(cmd, capture_output=True, text=True, env=environment(t, extra),
                          cwd=t / "work", stdin=subprocess.DEVNULL, timeout=120)


def prepare(tmp_path: Path, setup) -> Path:
    t = tmp_path / "case"
    for sub in ("home", "root", "work"):
        (t / sub).mkdir(parents=True)
    if setup is not None:
        setup(t)
    return t


def assert_one_clean_line(res: subprocess.CompletedProcess, needle: str) -> None:
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:], res.stdout[-2000:])
    assert len(lines) == 1, res.stderr[-3000:]
    assert lines[0].startswith("trainbench: error: "), lines[0][:2000]
    # One line a person reads: a value in it is shown briefly, never in full.
    assert len(lines[0]) < 1000, lines[0][:2000]
    assert needle.lower() in lines[0].lower(), (needle, lines[0])


def test_the_matrix_is_large_enough():
    assert len(CASES) >= 60 + ISSUE_37_CASES >= 100
    assert len({c[0] for c in CASES}) == len(CASES)
    first = next(i for i, c in enumerate(CASES) if c[0] == "check-ranks-a-billion")
    assert len(CASES) - first == ISSUE_37_CASES


@pytest.mark.parametrize("name,argv,extra,setup,needle", CASES, ids=[c[0] for c in CASES])
def test_invalid_invocation(tmp_path, name, argv, extra, setup, needle):
    t = prepare(tmp_path, setup)
    before = snapshot(t)
    res = invoke(t, argv, extra)
    assert_one_clean_line(res, needle)
    assert snapshot(t) == before, "the command created or changed files"


# --- a job history locked by another process ---------------------------------------------------

LOCKED = [("run", RUN), ("jobs-list", ["jobs", "list"]), ("jobs-show", ["jobs", "show", "1"]),
          ("jobs-refresh", ["jobs", "refresh"]), ("jobs-default", ["jobs"])]


def test_locked_job_history_gets_one_line(tmp_path):
    """Another process holds an exclusive lock on jobs.sqlite (an open sqlite3 shell, a hung
    command): every command that reads or writes the history says so after a short wait
    instead of a traceback after 30 s. The commands wait out the lock side by side."""
    from concurrent.futures import ThreadPoolExecutor
    t = prepare(tmp_path, with_db)
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sqlite3, sys, time\n"
         f"c = sqlite3.connect({str(t / 'root' / 'jobs.sqlite')!r}, isolation_level=None)\n"
         "c.execute('BEGIN EXCLUSIVE')\nprint('locked', flush=True)\ntime.sleep(120)\n"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = snapshot(t)
        with ThreadPoolExecutor(len(LOCKED)) as pool:
            results = list(pool.map(lambda argv: invoke(t, argv, {}), [c[1] for c in LOCKED]))
        for (name, _), res in zip(LOCKED, results):
            try:
                assert_one_clean_line(res, "locked by another process")
            except AssertionError as err:
                raise AssertionError(f"{name}: {err}") from err
        assert snapshot(t) == before
    finally:
        holder.kill()
        holder.wait()
    # Once the lock is gone the history is intact and holds only the job it had.
    assert [j["id"] for j in JobsDB(t / "root").list()] == [1]


def test_read_only_root_is_refused(tmp_path):
    """A read-only mount (made in a private mount namespace, so nothing outside sees it)."""
    t = prepare(tmp_path, None)
    ro = t / "home" / "ro"
    ro.mkdir()
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o ro tmpfs '{ro}'"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a read-only file system here: {probe.stderr.strip()}")
    before = snapshot(t)
    argv = [sys.executable, "-m", "trainbench.cli", *RUN, "--root", str(ro)]
    res = subprocess.run(["unshare", "-rm", "sh", "-c",
                          f"mount -t tmpfs -o ro tmpfs '{ro}' && exec \"$@\"", "sh", *argv],
                         capture_output=True, text=True, env=environment(t, {}),
                         cwd=t / "work", stdin=subprocess.DEVNULL, timeout=120)
    assert_one_clean_line(res, "Read-only file system")
    assert snapshot(t) == before


# --- the guarantee holds for the options that are accepted too ----------------------------------

def test_jobs_root_before_the_subcommand_is_honoured(tmp_path):
    """`jobs --root DIR list` reads DIR's history, not $TRAINBENCH_ROOT's."""
    t = prepare(tmp_path, None)
    other = t / "home" / "other"
    JobsDB(other).add("local", "1", "only_in_other", str(other / "x"), "{}", "COMPLETED")
    res = invoke(t, ["jobs", "--root", str(other), "list"], {})
    assert res.returncode == 0, res.stderr
    assert "only_in_other" in res.stdout
    res = invoke(t, ["jobs", "--root", str(other), "show", "1"], {})
    assert res.returncode == 0 and "only_in_other" in res.stdout, res.stderr
    # A --root given to the subcommand itself still wins over the group's.
    res = invoke(t, ["jobs", "--root", str(t / "root"), "list", "--root", str(other)], {})
    assert res.returncode == 0 and "only_in_other" in res.stdout, res.stderr
    res = invoke(t, ["jobs", "list"], {})
    assert res.returncode == 0 and "only_in_other" not in res.stdout
    assert "no jobs recorded" in res.stdout


@pytest.mark.parametrize("key", ["LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "DYLD_LIBRARY_PATH",
                                 "PROMPT_COMMAND", "BASH_ENV", "ENV"])
def test_loader_and_shell_hook_variables_are_reserved(key):
    """Neither --env nor the cluster config may make a job load code: the checks of the
    job environment refuse these names, for a local plan and a Slurm script alike."""
    from trainbench.launch.slurm import SlurmError, check_env, parse_env_items
    assert any(key in p for p in check_env([(key, "/tmp/x")], "cluster config env"))
    with pytest.raises(SlurmError) as err:
        parse_env_items([f"{key}=/tmp/x"], "--env")
    assert key in err.value.problems[0]
    # Ordinary names and look-alikes stay allowed.
    assert check_env([("NCCL_DEBUG", "WARN"), ("OLD_PRELOAD", "x"), ("ENVIRONMENT", "x")],
                     "--env") == []


def test_a_slurm_job_script_never_gets_a_loader_variable(tmp_path):
    """The cluster config's env reaches the job script only through check_env."""
    from trainbench.launch.sbatch import render_sbatch
    from trainbench.launch.slurm import SlurmError, SlurmOptions
    from trainbench.planning import build_plan
    plan = build_plan("pretrain_llama3.1", "tiny", "fp32", 2, "cpu", steps=3)
    with pytest.raises(SlurmError) as err:
        render_sbatch(plan, tmp_path, SlurmOptions(), {"env": {"LD_PRELOAD": "/tmp/evil.so"}})
    assert "LD_PRELOAD" in " ".join(err.value.problems)


def test_plan_bounds_without_the_cli():
    """The plan refuses what the CLI refuses, so bulk and predict get the same lines."""
    from trainbench.overrides import parse_overrides
    from trainbench.plan import PlanError
    from trainbench.planning import build_plan
    for items, word in ((["tp=0"], "tp=0"), (["layers=0"], "layers"), (["lr=nan"], "finite"),
                        (["lr=-1"], "learning rate"), (["steps=0"], "--steps"),
                        (["min_lr=0.1", "lr=0.01"], "min_lr")):
        with pytest.raises(PlanError) as err:
            build_plan("pretrain_llama3.1", "tiny", "fp32", 2, "cpu",
                       overrides=parse_overrides(items))
        assert word in err.value.problems[0], (items, err.value.problems)
    with pytest.raises(PlanError) as err:
        build_plan("pretrain_llama3.1", "tiny", "fp32", 0, "cpu")
    assert "scale" in err.value.problems[0]
    plan = build_plan("pretrain_llama3.1", "tiny", "fp32", 2, "cpu",
                      overrides=parse_overrides(["lr=0.01", "min_lr=0.001"]))
    assert (plan.lr, plan.min_lr) == (0.01, 0.001)


def test_a_saved_plan_round_trips_and_a_broken_one_is_refused(tmp_path):
    from trainbench.plan import PlanError
    from trainbench.planning import build_plan, load_plan
    plan = build_plan("pretrain_llama3.1", "tiny", "fp32", 2, "cpu", steps=3)
    path = tmp_path / "plan.json"
    path.write_text(plan.to_json())
    assert load_plan(path) == plan
    data = plan.to_json().replace('"tp": 1', '"tp": 0')
    path.write_text(data)
    with pytest.raises(PlanError) as err:
        load_plan(path)
    assert "tp=0" in err.value.problems[0]
