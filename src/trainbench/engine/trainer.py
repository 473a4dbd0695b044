"""The training loop every rank runs: a short sequence of small steps (torchtitan style).

setup -> step_batches -> (forward_backward_step)* -> optimizer step -> log, per step.
Each step is timed with the device synchronised; rank 0 writes the NeMo-style log line
and a metrics.jsonl record.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor.parallel import loss_parallel

from .. import flops as flops_mod
from ..metrics import default_window
from ..plan import FP8_DTYPES, Plan
from ..rundir import METRICS_FILE, log_file_name, update_run_record, write_run_record
from . import data, sdpa
from .checkpoint import checkpointer_for
from .log import StepMetrics, format_step_line
from .loss import cross_entropy
from .loss import describe as describe_loss
from .materialize import materialize
from .models import build_model
from .models.mamba2 import choose_scan
from .models.moe import moe_layers, update_expert_biases
from .optim import build_optimizer, lr_at
from .parallel import clip_grad_norm_, compile_report, float8, parallelize
from .parallel.cp import local_positions, shard_sequence
from .parallel.mesh import ParallelDims
from .parallel.pp import build_schedule, split_into_stages
from .profiling import StepTracer
from .run_info import run_info, run_peak, startup_lines
from .run_records import (WindowTelemetry, record_conditions, report_stragglers,
                          straggler_monitor)
from .step_metrics import reduce_step_metrics
from .straggler import install_slow_hook

COMPUTE_DTYPES = {"bf16": torch.bfloat16, "fp8": torch.bfloat16, "mxfp8": torch.bfloat16,
                  "fp32": torch.float32}


class Trainer:
    def __init__(self, plan: Plan, exp_dir: Path):
        self.plan = plan
        self.exp_dir = Path(exp_dir)
        self.compute_dtype = COMPUTE_DTYPES[plan.dtype]
        self.log_path = self.exp_dir / log_file_name(plan.name)
        self.step = 0  # steps completed (a loaded checkpoint advances it)
        self.total_steps = plan.steps  # the last iteration + 1: a load adds its step

    # --- set-up --------------------------------------------------------------------------

    def init_distributed(self) -> None:
        self.rank = int(os.environ.get("RANK", 0))
        self.world_size = int(os.environ.get("WORLD_SIZE", 1))
        self.local_rank = int(os.environ.get("LOCAL_RANK", 0))
        if self.plan.device == "cuda":
            if not torch.cuda.is_available():
                raise RuntimeError(f"the plan targets {self.plan.gpu_type} GPUs but CUDA is not "
                                   "available here; plan the run with --gpu cpu")
            self.device = torch.device("cuda", self.local_rank)
            torch.cuda.set_device(self.device)
            backend = "nccl"
        else:
            self.device = torch.device("cpu")
            backend = "gloo"
        if self.world_size != self.plan.gpus:
            raise RuntimeError(f"the plan needs {self.plan.gpus} ranks but {self.world_size} "
                               "were started")
        if not dist.is_initialized():
            dist.init_process_group(backend=backend, device_id=self.device
                                    if backend == "nccl" else None)
        self.dims = ParallelDims.from_layout(self.plan.layout, self.world_size)
        self.dims.build_mesh(self.device.type)

    def build_model(self, materialize: bool = True) -> None:
        """Build on meta, cut into pipeline stages, parallelize and materialise each part.

        `model_parts` holds this rank's modules: the whole model, or its pipeline stages
        (VP of them with interleaving), whose parameters keep the full model's names.
        `model` is the one module the optimizer sees: the only part, or a ModuleList of
        the stages (whose own names gain a "0."/"1." prefix: checkpoint code should
        iterate `model_parts`).

        `materialize=False` keeps every parameter on the meta device: `trainbench check`
        builds a rank of a real-size plan this way under a fake process group.
        """
        with torch.device("meta"):
            model = build_model(self.plan.model)
        self.ssd_scan = choose_scan(model, self.plan.ssd_scan, self.device.type)
        if self.dims.pp_enabled:
            stages = split_into_stages(model, self.plan, self.dims.coordinate("pp"))
        else:
            stages = [(0, model)]
        self.model_parts = []
        for _, part in stages:
            part = parallelize(part, self.plan, self.dims, self.compute_dtype)
            if materialize:
                part = self.materialize(part)
            part.train()
            self.model_parts.append(part)
        self.model = (self.model_parts[0] if len(self.model_parts) == 1
                      else torch.nn.ModuleList(self.model_parts))
        # The balance loss's gradient is scaled as each microbatch's loss is: by 1/GA
        # before its backward, or under a pipeline not at all, since the schedule then
        # divides every accumulated gradient by the microbatch count (scale_grads).
        aux_scale = 1.0 if self.dims.pp_enabled else 1.0 / self.plan.ga
        self.moe_layers = moe_layers(self.model)
        for moe in self.moe_layers:
            moe.aux_grad_scale = aux_scale
        self.pipeline = None
        # Looked up once: indexing a DeviceMesh builds the sub-mesh again, reading its
        # rank table on the host, at every call (once per step in timed_step otherwise).
        self.pp_mesh = self.dims["pp"] if self.dims.pp_enabled else None
        if self.dims.pp_enabled:
            indices = [index for index, _ in stages]
            last = self.plan.layout.pp * self.plan.layout.vp - 1
            self.has_first_stage, self.has_last_stage = 0 in indices, last in indices
            self.pipeline = build_schedule(list(zip(indices, self.model_parts)), self.plan,
                                           self.dims["pp"], self.device, self.loss_fn)

    def materialize(self, model: torch.nn.Module) -> torch.nn.Module:
        return materialize(model, self.plan, self.device)

    def setup(self) -> None:
        self.init_distributed()
        self.select_kernels()
        torch.manual_seed(self.plan.seed)
        self.build_model()
        self.optimizer = build_optimizer(self.model, self.plan.lr,
                                         moments=self.plan.adam_moments)
        self.fp8_info = None
        if self.plan.dtype in FP8_DTYPES:
            self.fp8_info = float8.summary(self.model_parts, self.plan, dist.get_backend())
        spec = self.plan.model
        self.flops_per_seq = flops_mod.flops_per_sequence(spec, self.plan.seq_len, "published")
        self.peak = run_peak(self.plan, self.device, self.compute_dtype)
        self.conditions = record_conditions(self.exp_dir) if self.local_rank == 0 else None
        if self.rank == 0:
            self.exp_dir.mkdir(parents=True, exist_ok=True)
            self.log_file = open(self.log_path, "a", buffering=1)
            self.metrics_file = open(self.exp_dir / METRICS_FILE, "a", buffering=1)
            self.write_run_info()
            for line in startup_lines(self):
                self.log(line)
        self.setup_features()

    def select_kernels(self) -> None:
        """The SDPA order on CUDA (sdpa.py) and the kernels run.json records."""
        sdpa.use_engine_order(self.device.type)
        spec, lay = self.plan.model, self.plan.layout
        self.sdpa_backend = sdpa.chosen_backend(
            self.device, self.compute_dtype, max(1, spec.heads // lay.tp),
            max(1, spec.kv_heads // lay.tp), spec.head_dim, self.plan.seq_len, lay.cp)
        self.loss_kind = describe_loss(-(-spec.vocab_size // lay.tp),  # this rank's vocabulary
                                       self.plan.mbs * self.plan.seq_len // lay.cp, lay.tp > 1)

    def setup_features(self) -> None:
        """Checkpointing (and the load that sets the first iteration), then tracing,
        the window's telemetry and the straggler monitor."""
        f = self.plan.features
        self.checkpointer = checkpointer_for(self.plan, self.model_parts, self.optimizer,
                                             self.device, self.exp_dir, self.log)
        if f.load_checkpoint:
            # The loaded step counts: iterations continue from it for plan.steps more.
            self.step = self.checkpointer.load(f.load_checkpoint)
            self.total_steps = self.step + self.plan.steps
            if self.rank == 0:  # results read the iterations a resumed run covers here
                update_run_record(self.exp_dir, {"first_iteration": self.step,
                                                 "loaded_checkpoint": f.load_checkpoint})
        self.tracer = StepTracer(self.plan, self.rank, self.world_size, self.device,
                                 self.exp_dir, self.dims, self.log, self.step,
                                 self.total_steps - 1)
        # Telemetry covers the window results analyse (the seeds' 11-44 of 50, scaled).
        start, end = default_window(self.plan.steps)
        self.telemetry = WindowTelemetry(self.plan, (self.step + start, self.step + end),
                                         self.device, self.rank, self.local_rank,
                                         self.world_size, self.exp_dir, self.log)
        install_slow_hook(self.model_parts, self.rank)
        self.straggler = straggler_monitor(self.dims, self.device, self.rank,
                                           self.local_rank, self.step, self.total_steps,
                                           self.telemetry.window, self.tracer, self.log)

    def write_run_info(self) -> None:
        write_run_record(self.exp_dir, run_info(self))

    def log(self, line: str) -> None:
        """Rank 0 only: one line to the log file and to stdout (the launcher streams it)."""
        if self.rank != 0:
            return
        self.log_file.write(line + "\n")
        print(line, flush=True)

    # --- one step ------------------------------------------------------------------------

    @property
    def dp_rank(self) -> int:
        return self.dims.coordinate("dp")

    def step_batches(self, step: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's microbatches for a step, (inputs, labels) each [mbs, seq], already
        on the device: made before the step's timer starts, so the timed step holds no
        batch generation and no host-to-device copy."""
        p = self.plan
        samples = data.rank_sample_range(p.gbs, p.layout.dp, self.dp_rank)
        batches = []
        for first in range(samples.start, samples.stop, p.mbs):
            inputs, labels = data.microbatch(p.seed, step, first, p.mbs, p.seq_len,
                                             p.model.vocab_size)
            batches.append((inputs.to(self.device, non_blocking=True),
                            labels.to(self.device, non_blocking=True)))
        return batches

    def loss_fn(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        # In chunks, each upcast to fp32 only inside its checkpointed loss (loss.py): the
        # full fp32 logits of a 128k vocabulary would cost more memory than the model.
        return cross_entropy(logits, labels)

    def compute_context(self):
        """bf16 autocast for a one-rank run, which has no FSDP mixed-precision policy."""
        if self.plan.one_rank_without_fsdp and self.compute_dtype != torch.float32:
            return torch.autocast(self.device.type, dtype=self.compute_dtype)
        return contextlib.nullcontext()

    def loss_context(self):
        """Under TP the logits stay sharded over the vocabulary: cross-entropy (and its
        backward) must run inside loss_parallel, which never gathers them."""
        if self.dims.tp_enabled:
            return loss_parallel()
        return contextlib.nullcontext()

    def context_shard(self, inputs: torch.Tensor, labels: torch.Tensor):
        """This rank's part of each sequence: without CP the whole sequence; with CP the
        load-balanced pair of chunks (parallel/cp.py)."""
        if self.dims.cp_enabled:
            cp, rank = self.dims.cp, self.dims.coordinate("cp")
            inputs, labels = shard_sequence(inputs, cp, rank), shard_sequence(labels, cp, rank)
        return inputs, labels

    def positions(self) -> torch.Tensor:
        """The positions of this rank's tokens in the full sequence, made once. They are
        always passed: under sequence parallelism the model cannot infer them from its
        (sequence-sharded) hidden states."""
        if getattr(self, "_positions", None) is None:
            self._positions = torch.arange(self.plan.seq_len, device=self.device)
            if self.dims.cp_enabled:
                self._positions = local_positions(self.plan.seq_len, self.dims.cp,
                                                  self.dims.coordinate("cp"), device=self.device)
        return self._positions

    def forward_backward_step(self, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Loss of one microbatch (mean over its tokens, inputs and labels already this
        rank's part of the sequence); gradients accumulate / GA."""
        with self.loss_context():
            with self.compute_context():
                logits = self.model(inputs, self.positions())
            loss = self.loss_fn(logits, labels)
            (loss / self.plan.ga).backward()
        return _plain(loss.detach())

    def before_microbatch(self, last: bool) -> None:
        """Before each microbatch of a step without a pipeline: under dp_sharding=gradients
        or optimizer keep the weights gathered until the step's last backward reshards
        them; under optimizer also keep the gradients whole and unreduced until then, so
        they are reduce-scattered once a step (a pipeline's schedule sets the same FSDP2
        flags itself)."""
        if self.plan.dp_sharding == "full" or self.pipeline is not None:
            return
        for part in self.model_parts:
            if isinstance(part, FSDPModule):
                part.set_reshard_after_backward(last)
                if self.plan.dp_sharding == "optimizer":
                    part.set_requires_gradient_sync(last)

    def pipeline_step(self, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """All of a step's microbatches (concatenated) through the pipeline schedule.

        Returns the sum of the microbatch losses on a rank holding the last stage, zero
        elsewhere (step_metrics sums over the pipeline ranks).
        """
        # The schedule splits every tensor argument along dim 0 into microbatches.
        positions = self.positions().expand(inputs.shape[0], -1)
        losses: list[torch.Tensor] = []
        args = (inputs,) if self.has_first_stage else ()
        target = labels if self.has_last_stage else None
        with self.loss_context():
            self.pipeline.step(*args, target=target, losses=losses, positions=positions,
                               return_outputs=False)
        total = torch.zeros((), device=self.device)
        for loss in losses:
            total += _plain(loss.detach())
        return total

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def train_step(self, step: int) -> StepMetrics:
        p = self.plan
        self.maybe_fail(step)
        lr = lr_at(step, p.lr, p.min_lr, p.warmup_steps, max(self.total_steps, p.warmup_steps))
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        # train_step_timing covers the forward and backward passes of every microbatch
        # (with their collectives), gradient clipping and the optimizer step. The batches
        # are made, cut to this rank's part and on the device before it starts; the loss
        # and gradient norm are read (a host sync) only after it stops, in step_metrics.
        batches = self.timed_step_inputs(step)
        self.synchronize()
        straggler = getattr(self, "straggler", None)
        start = time.perf_counter()
        with straggler.context(step) if straggler else contextlib.nullcontext():
            loss_sum, grad_norm = self.timed_step(batches)
        self.synchronize()
        elapsed = time.perf_counter() - start
        metrics = self.step_metrics(step, lr, loss_sum / p.ga, grad_norm, elapsed)
        if straggler:
            report_stragglers(self.straggler, step, elapsed, self.plan, self.exp_dir,
                              self.log)
        return metrics

    def timed_step_inputs(self, step: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The step's microbatches as timed_step takes them (this rank's part of each
        sequence, all at once for a pipeline), and the positions made."""
        batches = self.step_batches(step)
        if self.pipeline is not None:  # the schedule takes all microbatches at once
            batches = [(torch.cat([i for i, _ in batches]), torch.cat([t for _, t in batches]))]
        batches = [self.context_shard(inputs, labels) for inputs, labels in batches]
        self.positions()
        return batches

    def timed_step(self, batches: list[tuple[torch.Tensor, torch.Tensor]]
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward, backward, clipping and optimizer step: (loss sum, grad norm) as tensors.

        Nothing here reads a tensor's value on the host (no .item(), float(), bool() or
        copy to the CPU): on a GPU each such read would stall the CPU until the queued
        kernels finish, leaving the GPU idle while the next kernels are launched. The
        values are read once, after the step's timing sync (step_metrics).
        tests/test_host_sync.py guards this.
        """
        loss_sum = torch.zeros((), device=self.device)
        if self.pipeline is not None:
            loss_sum += self.pipeline_step(*batches[0])
        else:
            for index, (inputs, labels) in enumerate(batches):
                self.before_microbatch(last=index == len(batches) - 1)
                loss_sum += self.forward_backward_step(inputs, labels)
        grad_norm = clip_grad_norm_(self.model.parameters(), max_norm=1.0,
                                    pp_mesh=self.pp_mesh)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.moe_layers:
            update_expert_biases(self.moe_layers)
        if self.plan.dtype in FP8_DTYPES:
            float8.after_optimizer_step(self.model_parts, self.plan, dist.get_backend())
        return loss_sum, grad_norm

    def step_metrics(self, step: int, lr: float, local_loss: torch.Tensor,
                     grad_norm: torch.Tensor, elapsed: float) -> StepMetrics:
        """The step's record, its loss averaged over data-parallel ranks and its time the
        slowest rank's (the step's host reads happen here, after its timing sync)."""
        return reduce_step_metrics(self.plan, self.dims, self.device, self.flops_per_seq,
                                   step, self.total_steps, lr, local_loss, grad_norm, elapsed)

    def maybe_fail(self, step: int) -> None:
        """Crash injection for tests: TRAINBENCH_FAIL_AT_STEP=n TRAINBENCH_FAIL_RANK=r
        makes rank r die by SIGKILL at step n, as a real hardware fault would."""
        at = os.environ.get("TRAINBENCH_FAIL_AT_STEP")
        if at is not None and int(at) == step and \
                int(os.environ.get("TRAINBENCH_FAIL_RANK", "0")) == self.rank:
            os.kill(os.getpid(), signal.SIGKILL)

    # --- the loop ------------------------------------------------------------------------

    def train(self) -> None:
        f = self.plan.features
        interval = f.checkpoint_interval
        saving = f.checkpoint or interval > 0
        while self.step < self.total_steps:
            self.tracer.before_step(self.step)
            self.telemetry.before_step(self.step)
            metrics = self.train_step(self.step)
            self.step += 1
            if self.rank == 0:
                self.log(format_step_line(metrics))
                if self.step == 1 and self.plan.compile:
                    self.log(f"trainbench: {compile_report()}")
                self.metrics_file.write(self.telemetry.record(metrics) + "\n")
            self.telemetry.after_step(self.step - 1)
            self.tracer.after_step(self.step - 1)
            if saving and (self.step == self.total_steps
                           or (interval > 0 and self.step % interval == 0)):
                self.checkpointer.save(self.step)
        # Leave together: no rank tears its groups down while a peer still waits on it.
        # (A rank must still leave through __main__.exit_now, whose comment says why.)
        if dist.is_initialized():
            dist.barrier()

    def close(self) -> None:
        """Closes the run's files and destroys the process groups. A script driving a
        Trainer itself should then leave as the engine does (engine/__main__.exit_now):
        the interpreter's own teardown can abort a rank after a complete run."""
        if hasattr(self, "tracer"):
            self.tracer.close()
        if getattr(self, "telemetry", None) is not None:  # a run that ended inside the window
            self.telemetry.stop()
        if getattr(self, "rank", 1) == 0 and hasattr(self, "log_file"):
            self.log_file.close()
            self.metrics_file.close()
        if dist.is_initialized():
            dist.destroy_process_group()


def _plain(t: torch.Tensor) -> torch.Tensor:
    """A replicated DTensor (the loss under loss_parallel) as a plain tensor."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t
