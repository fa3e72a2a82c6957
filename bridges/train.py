"""One training loop for every trainable model: a budget (fixed, or a step cap with a plateau
rule), AdamW, linear warmup then cosine decay, gradient clipping, an EMA of the weights, bf16
autocast where the device computes bf16 natively (or bfloat16 weights themselves, trained with
stochastically rounded updates: bridges/optim.py), and resumable single-file checkpoints.

Plateau rule (`eval_every` > 0 and an `evaluate` function): with `eval_at_start` the initial
weights are scored (step 0: what the run starts from, and the weights kept if training never
beats them), then every `eval_every` steps the EMA weights are scored on fixed validation data; at step t >= `min_steps` training stops when the
best score of the last `plateau_window` share of steps (after 0.8 t by default, and never fewer
than `plateau_evals` evaluations, so that an early flat stretch of two or three points cannot
stop a run) is less than `plateau_rel` (2%) better than the score at the window's start, a
share of that score (`plateau_scale` "window") or of the larger of it and the first evaluation's
("start"). `steps` is then the cap. The validation curve and the reason for stopping ("plateau" or "cap")
are kept in the checkpoint, so a resumed run stops where an uninterrupted one does. A run stopped by
its cap and resumed under a larger one goes on from there (what `geoprobe bridge` does when only
--steps grows); `plateau_summary` keeps the rule's last reading in the record, for the words that
say why a run stopped.

Everything random in step t is drawn from a generator seeded by (seed, t), so a run resumed
from a checkpoint at step k repeats exactly what an uninterrupted run does from step k on.
A checkpoint is one safetensors file (weights, EMA, optimizer state; the scheduler state and
the loss curve in its metadata), written under a temporary name and renamed into place.

Data parallel (torchrun): the model is wrapped in DistributedDataParallel, `batch_size` is the
global batch, and each rank draws the global batch's random numbers and keeps its rows (a
`Shard`), so gradients averaged over W ranks equal one process's on the whole batch and a
checkpoint (written by rank 0) resumes on any world size. With `Execution.fsdp` the model is
sharded instead (bridges/parallel.py: FSDP2, a sharded checkpoint folder written by every rank,
the EMA kept on the shards); with `Execution.grad_accum` = A each rank's rows run as A
micro-batches (shard r x A + a of W x A), so the step is the same one in smaller pieces.
"""

from __future__ import annotations

import gc
import json
import math
import time
import traceback
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch
from safetensors.torch import load_file, safe_open

from geoprobe.bridges.checkpoint import load_weights, save_weights, write_record, write_tensors
from geoprobe.bridges.nn import native_bf16
from geoprobe.bridges.optim import StochasticAdamW, step_generator as round_generator, update_ema
from geoprobe.bridges.parallel import (Execution, ShardedCheckpoint, average_replicated, checkpoint_activations,
    decoder_blocks, host_copy, is_sharded, local, mixed_tensors, release_activations, reshard, shard as shard_model,
    whole)
from geoprobe.device import Precision, machine_name
from geoprobe.distributed import SINGLE, World
from geoprobe.errors import BadInput, short
from geoprobe.tracking import LOG_EVERY, ScalarLog

CHECKPOINT = "checkpoint.safetensors"


@dataclass
class TrainConfig:
    steps: int = 1000
    batch_size: int = 16
    lr: float = 3e-4
    warmup: int = 100
    weight_decay: float = 0.01
    clip: float = 1.0
    ema: float = 0.999
    seed: int = 0
    save_every: int = 200  # 0: no resumable checkpoint (an 8B DSL's is 14 bytes per parameter), final weights only
    eval_every: int = 0  # 0: train for exactly `steps`
    plateau_rel: float = 0.02
    # what plateau_rel is a share of: "window", the score at the window's start; "start", the
    # larger of that and the first evaluation's (with eval_at_start the untrained model's: for a
    # bridge, its token lookup), so it never fires later than "window" on the same curve. A loss whose floor is 0
    # (nmse) and falls like a power of the step improves by the same share in every window, so the
    # "window" rule asks it for ever finer absolute gains and may never fire (docs/baselines.md)
    plateau_scale: str = "window"
    plateau_window: float = 0.2
    plateau_evals: int = 5
    min_steps: int = 0
    # "cosine": warmup then cosine to zero at `steps` (a fixed budget); "constant": warmup then the
    # full rate until the plateau rule stops the run (a cosine over the cap makes its own plateau:
    # the rule would see the rate reach zero, not the model stop improving)
    schedule: str = "cosine"
    eval_at_start: bool = False  # the plateau rule also scores the starting weights (step 0), kept if never beaten
    # auto: bf16 autocast where the device computes bf16 natively; float32: never; bfloat16: the
    # model's bfloat16 parameters trained as such (geoprobe.bridges.optim), no autocast
    precision: str = "auto"

    def validate(self) -> None:
        Precision.parse(self.precision)
        if self.schedule not in ("cosine", "constant"):
            raise BadInput(f"the schedule must be cosine or constant, got {self.schedule!r}")
        if self.save_every < 0:
            raise BadInput(f"--save-every must be >= 0 (0: no resumable checkpoint), got {self.save_every}")
        if self.steps < 1:
            raise BadInput(f"--steps must be at least 1, got {self.steps}")
        if self.batch_size < 1:
            raise BadInput(f"--batch-size must be at least 1, got {self.batch_size}")
        if not 0 < self.lr < 1:
            raise BadInput(f"--lr must be in (0, 1), got {self.lr}")
        if not 0 <= self.ema < 1:
            raise BadInput(f"--ema must be in [0, 1), got {self.ema}")
        if self.plateau_scale not in ("window", "start"):
            raise BadInput(f"the plateau scale must be window or start, got {self.plateau_scale!r}")
        if self.eval_every < 0 or not 0 <= self.plateau_rel < 1 or not 0 < self.plateau_window < 1:
            raise BadInput("the plateau rule needs eval_every >= 0, 0 <= plateau_rel < 1, 0 < plateau_window < 1")


@dataclass
class Trained:
    """What a training run did: the training-loss curve [[step, loss]], the validation curve
    [[step, score]] of the plateau rule (empty without one), the steps run and why it stopped."""
    curve: list
    val_curve: list
    steps: int
    stop: str  # "budget" (fixed steps), "cap" (the plateau rule never fired) or "plateau"
    seconds: float = 0.0  # this session's training loop (a resumed run counts only its own steps)
    session_steps: int = 0
    best_step: int | None = None  # the evaluation whose EMA weights were kept (None: the last weights, no evaluations)
    total_seconds: float = 0.0  # the training loop over every session (checkpoints older than 2026-12-03: the last one's)
    guard_curve: list = field(default_factory=list)  # [[step, score]] of the second score the rule waits on (`train`)


def plateau_reading(val_curve: list, cfg: TrainConfig) -> dict | None:
    """What the plateau rule sees on the validation curve so far (lower is better): the window
    it compares, [the step of its start, the last step], the best score's drop below the start
    and the scale the drop is a share of; None while it cannot judge (before `min_steps`, or
    with no evaluation before the window)."""
    if not val_curve or val_curve[-1][0] < cfg.min_steps:
        return None
    now = val_curve[-1][0]
    boundary = min((1 - cfg.plateau_window) * now, now - cfg.plateau_evals * cfg.eval_every)
    before = [(s, v) for s, v in val_curve if s <= boundary]
    if not before:
        return None
    (start_step, start), best = before[-1], min(v for s, v in val_curve if s > boundary)
    scale = max(val_curve[0][1], start) if cfg.plateau_scale == "start" else start
    return {"window": [start_step, now], "drop": start - best, "scale": abs(scale)}


def plateaued(val_curve: list, cfg: TrainConfig) -> bool:
    """The plateau rule on the validation curve so far (lower is better): the best score of the
    window is less than `plateau_rel` of the scale below the window's start."""
    seen = plateau_reading(val_curve, cfg)
    return seen is not None and seen["drop"] < cfg.plateau_rel * seen["scale"]


def plateau_every(steps: int, until: str | None, eval_every: int = 0) -> int:
    """The interval of the plateau rule's checks as --until and --eval-every mean it in every
    command: under "plateau" every `eval_every` steps (0: steps/40, at most 50; `steps` is then
    the cap); under "steps" none (`steps` exactly). `until` None: "plateau" when `eval_every` is
    given, else "steps" (what `dsl train` and `baseline train` do when given neither)."""
    until = until or ("plateau" if eval_every else "steps")
    if until not in ("plateau", "steps"):
        raise BadInput(f"--until must be plateau or steps, got {until!r}")
    return (eval_every or max(1, min(50, steps // 40))) if until == "plateau" else 0


def warmup_for(steps: int) -> int:
    """The warmup a run takes when none is given: a tenth of its steps, at most 100 (a 100-step
    run warms up for 10 steps, not all 100)."""
    return max(1, min(100, steps // 10))


def with_loop_flags(flags: dict) -> dict:
    """A training command's flags with `until` turned into TrainConfig's `eval_every`
    (`plateau_every`) and a `warmup` of None into `warmup_for(steps)`."""
    flags, steps = dict(flags), flags.get("steps", TrainConfig.steps)
    if "until" in flags:
        flags["eval_every"] = plateau_every(steps, flags.pop("until"), flags.get("eval_every", 0))
    if "warmup" in flags and flags["warmup"] is None:
        flags["warmup"] = warmup_for(steps)
    return flags


def plateau_summary(val_curve: list, cfg: TrainConfig) -> dict | None:
    """The plateau rule's last reading in a record, for the words that say why a run stopped
    (geoprobe.verdict.bridge_lines): from which step it judges, the share it needs, and at the
    last evaluation the window and the share the best score improved on its start (None: no rule)."""
    if cfg.eval_every <= 0 or not val_curve:
        return None
    seen = plateau_reading(val_curve, cfg)
    summary = {"from_step": cfg.min_steps, "needs": cfg.plateau_rel, "ema_steps": round(1 / (1 - cfg.ema))}
    if seen is not None:
        summary.update(window=seen["window"], gain=seen["drop"] / seen["scale"] if seen["scale"] else 0.0)
    return summary


@dataclass(frozen=True)
class Shard:
    """The rows of each step's global batch that this process trains on."""
    index: int = 0
    count: int = 1

    def rows(self, batch):
        size = len(batch) // self.count
        return batch[self.index * size:(self.index + 1) * size]


class _StepLoss(torch.nn.Module):
    """The loss of one step as a module's forward, which is what DDP synchronises on."""

    def __init__(self, model: torch.nn.Module, loss_fn: Callable):
        super().__init__()
        self.model, self.loss_fn = model, loss_fn

    def forward(self, generator: torch.Generator, shard: Shard) -> torch.Tensor:
        return self.loss_fn(self.model, generator, shard)


def step_generator(seed: int, step: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


def lr_lambda(cfg: TrainConfig) -> Callable[[int], float]:
    warmup = max(1, min(cfg.warmup, cfg.steps))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if cfg.schedule == "constant":
            return 1.0
        progress = (step - warmup) / max(1, cfg.steps - warmup)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return factor


def trainable(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


@dataclass
class TrainingState:
    """Where a run stands, as its checkpoint keeps it: the steps done, the training-loss curve
    [[step, loss]], the validation curve [[step, score]] and why it stopped (None: running)."""

    step: int = 0
    curve: list = field(default_factory=list)
    val_curve: list = field(default_factory=list)
    stop: str | None = None
    seconds: float = 0.0  # the training loop's seconds up to this checkpoint, over every session
    guard_curve: list = field(default_factory=list)  # the second score's curve, when `evaluate` gives one

    def under_cap(self, steps: int) -> TrainingState:
        """This state under a cap of `steps`: a run its old cap stopped goes on where the cap is larger."""
        if self.stop == "cap" and steps > self.step:
            self.stop = None
        return self


def _meta(state: TrainingState, scheduler, best: Best) -> dict:
    """What a checkpoint keeps beside the tensors, as strings (safetensors metadata; the sharded
    checkpoint's training.json)."""
    return {"step": str(state.step), "curve": json.dumps(state.curve), "scheduler": json.dumps(scheduler.state_dict()),
            "val_curve": json.dumps(state.val_curve), "stop": state.stop or "",
            "guard_curve": json.dumps(state.guard_curve),
            "best_step": "" if best.step is None else str(best.step), "seconds": f"{state.seconds:.3f}"}


def _restored(meta: dict, scheduler, best: Best, has_best: bool) -> TrainingState:
    """The TrainingState of a checkpoint's meta; the scheduler and the best step's score restored."""
    # older checkpoints wrote best_step 0 for "none" and no best weights
    best.step = int(meta["best_step"]) if has_best else None
    if best.step is not None:
        best.score = dict((int(s), v) for s, v in json.loads(meta.get("val_curve", "[]")))[best.step]
    scheduler.load_state_dict(json.loads(meta["scheduler"]))
    return TrainingState(int(meta["step"]), json.loads(meta["curve"]), json.loads(meta.get("val_curve", "[]")),
                         meta.get("stop") or None, float(meta.get("seconds") or 0),  # older checkpoints: no seconds
                         json.loads(meta.get("guard_curve") or "[]"))


def _save(path: Path, model, ema: dict, optimizer, scheduler, state: TrainingState, best: Best) -> None:
    names = {id(p): name for name, p in trainable(model).items()}
    tensors = {f"model.{k}": v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    tensors.update({f"ema.{k}": v.contiguous().cpu() for k, v in ema.items()})
    tensors.update({f"best.{k}": v.contiguous().cpu() for k, v in (best.weights or {}).items()})
    groups = []
    for group in optimizer.param_groups:
        groups.append({k: v for k, v in group.items() if k != "params"})
        for p in group["params"]:
            for key, value in optimizer.state.get(p, {}).items():
                tensors[f"opt.{names[id(p)]}.{key}"] = value.detach().contiguous().cpu()
    write_tensors(path, tensors, {**_meta(state, scheduler, best), "param_groups": json.dumps(groups)})


def _load(path: Path, model, ema: dict, optimizer, scheduler, best: Best) -> TrainingState:
    if not path.is_file():
        return TrainingState()
    try:
        tensors = load_file(path)
        with safe_open(path, "pt") as handle:
            meta = handle.metadata()
        model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
        for k in ema:
            tensors[f"ema.{k}"]
        int(meta["step"])
    except Exception as exc:  # a file cut short by a full disk or a copy, or written by another version
        raise BadInput(f"checkpoint {path} is truncated, corrupt or from another version ({short(exc)}); "
                       "delete it to train from the start, or use --force") from exc
    for k in ema:
        ema[k].copy_(tensors[f"ema.{k}"])
    resumed = _restored(meta, scheduler, best, any(k.startswith("best.") for k in tensors))
    if best.step is not None:
        best.weights = {k: tensors[f"best.{k}"] for k in ema}  # kept on the host, as Best.offer keeps them
    params = trainable(model)
    fused = bool(optimizer.defaults.get("fused"))
    for name, p in params.items():
        state = {key.rsplit(".", 1)[1]: _state_tensor(key, v, p, fused) for key, v in tensors.items()
                 if key.startswith(f"opt.{name}.") and key[len(f"opt.{name}."):].count(".") == 0}
        if state:
            optimizer.state[p] = state
    for group, saved in zip(optimizer.param_groups, json.loads(meta["param_groups"])):
        group.update(saved)
    return resumed


def _state_tensor(key: str, value: torch.Tensor, param: torch.Tensor, fused: bool) -> torch.Tensor:
    """An AdamW state tensor where the optimizer expects it: moments on the parameter's device;
    the step count on the CPU for the foreach kernels (on the device every step would wait for
    it), but beside the parameter in float32 for the fused kernel, which refuses it elsewhere."""
    if not key.endswith(".step"):
        return value.to(param.device)
    return value.to(param.device, torch.float32) if fused else value


@dataclass
class Best:
    """The best EMA weights the evaluations have seen (lower score is better), and when."""
    step: int | None = None
    score: float = float("inf")
    weights: dict | None = None

    def offer(self, step: int, score: float, ema: dict) -> None:
        if score < self.score:  # a tie keeps the earlier weights
            self.step, self.score = step, score
            # on the host: the device holds only what each step needs (an 8B model's copy is 16 GB);
            # a sharded EMA's copy stays sharded (each rank keeps its own shard)
            self.weights = {k: host_copy(v) for k, v in ema.items()}


def mixed_precision(device: torch.device, precision: str = "auto"):
    """bf16 autocast for the trained network's products where the device computes bf16 natively
    (CUDA; CPUs with AVX512-BF16 or AMX, ~1.9x float32's matrix rate): the same precision on a
    laptop as on the GPU. Inputs and targets a loss computes under `torch.autocast(enabled=False)`
    stay float32. `precision` "float32" turns it off (e.g. to compare runs bit for bit), and so
    does "bfloat16", whose model holds its large weights in bfloat16 itself."""
    if Precision.parse(precision) is Precision.AUTO and native_bf16(device):
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return nullcontext()


def _step_loss(model: torch.nn.Module, loss_fn: Callable, world: World, device: torch.device) -> torch.nn.Module:
    """The module a step calls: the loss, wrapped in DistributedDataParallel under torchrun."""
    step_loss: torch.nn.Module = _StepLoss(model, loss_fn)
    if world.connected:
        from torch.nn.parallel import DistributedDataParallel

        step_loss = DistributedDataParallel(step_loss, device_ids=[device.index] if device.type == "cuda" else None,
                                            find_unused_parameters=True)
    return step_loss


def _optimizer(params: dict, cfg: TrainConfig, device: torch.device):
    """AdamW (no weight decay on vectors) and its warmup-then-cosine schedule; with bfloat16
    weights, AdamW with stochastic rounding (geoprobe.bridges.optim)."""
    decay = [p for n, p in params.items() if p.ndim >= 2]
    no_decay = [p for n, p in params.items() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if Precision.parse(cfg.precision) is Precision.BFLOAT16:
        optimizer = StochasticAdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), seed=cfg.seed)
        return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))
    optimizer = torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95),
                                  fused=device.type in ("cpu", "cuda"))  # one kernel for all parameters: ~3x on a CPU
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))


@dataclass
class _Run:
    """One training session's machinery: the model as each step calls it (plain, under DDP, or
    sharded), AdamW and its schedule, the EMA, and the checkpoint of the run's form."""
    model: torch.nn.Module
    step_loss: Callable
    params: dict
    optimizer: torch.optim.Optimizer
    scheduler: object
    ema: dict
    cfg: TrainConfig
    execution: Execution
    out: Path
    device: torch.device
    world: World

    @classmethod
    def start(cls, model, loss_fn: Callable, cfg: TrainConfig, out: Path, device: torch.device, world: World,
              execution: Execution) -> _Run:
        if execution.activation_checkpointing:
            checkpoint_activations(decoder_blocks(model))
        if execution.fsdp:
            shard_model(model, device, cfg.precision)
            step_loss = partial(loss_fn, model)
        else:
            step_loss = _step_loss(model, loss_fn, world, device)
        params = trainable(model)
        optimizer, scheduler = _optimizer(params, cfg, device)
        ema = {k: v.detach().clone() if v.dtype == torch.bfloat16 else v.detach().clone().float()
               for k, v in params.items()}
        return cls(model, step_loss, params, optimizer, scheduler, ema, cfg, execution, out, device, world)

    @property
    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def update(self, step: int, shard: Shard) -> torch.Tensor:
        """One optimiser step (over `grad_accum` micro-batches) and the EMA's; the step's mean
        loss over this rank's rows, left on the device."""
        cfg, accum = self.cfg, self.execution.grad_accum
        # under FSDP the units compute in bf16 themselves (bridges/parallel.py), without autocast
        autocast = nullcontext() if self.execution.fsdp else mixed_precision(self.device, cfg.precision)
        self.optimizer.zero_grad(set_to_none=True)
        total = None
        for micro in range(accum):
            part = Shard(shard.index * accum + micro, shard.count * accum)
            last = micro == accum - 1  # DDP averages the gradients over the ranks once, at the last
            with nullcontext() if last or not hasattr(self.step_loss, "no_sync") else self.step_loss.no_sync():
                with autocast:
                    loss = self.step_loss(step_generator(cfg.seed, step), part)
                (loss / accum if accum > 1 else loss).backward()
            total = loss.detach() if total is None else total + loss.detach()
        if self.execution.fsdp:
            average_replicated(self.model)
        with mixed_tensors() if self.execution.fsdp else nullcontext():
            torch.nn.utils.clip_grad_norm_(list(self.params.values()), cfg.clip)
            self.optimizer.step()
        self.scheduler.step()
        # EMA with a warmup, (1 + t) / (10 + t): a short run is not dominated by its initial weights
        decay_now = min(cfg.ema, (1 + step) / (10 + step))
        update_ema({k: local(v) for k, v in self.ema.items()}, {k: local(p) for k, p in self.params.items()},
                   1 - decay_now, lambda device: round_generator(cfg.seed, step, device, "ema"))
        return (total / accum if accum > 1 else total).float()

    @torch.no_grad()
    def score(self, evaluate: Callable) -> tuple[float, float | None]:
        """(score, guard) of evaluate(model) with the EMA weights swapped in, then the live weights
        put back (set aside on the host: no second copy of the weights on the device; each rank its
        shards); guard is None when `evaluate` returns one number."""
        model, params = self.model, self.params
        live = {k: local(p).detach().to("cpu", copy=True) for k, p in params.items()}
        for k, p in params.items():
            local(p).copy_(local(self.ema[k]).to(p.dtype))
        model.eval()
        try:
            got = evaluate(model)
            return (float(got[0]), float(got[1])) if isinstance(got, tuple) else (float(got), None)
        finally:
            if self.execution.fsdp:
                reshard(model)  # the root's whole copy from the evaluation holds the EMA weights
            for k, p in params.items():
                local(p).copy_(live[k])
            model.train()

    def load(self, best: Best) -> TrainingState:
        """The run's checkpoint loaded (TrainingState() when there is none); one line when the
        folder holds the other form (a run resumes with the --fsdp it was saved with)."""
        sharded, single = ShardedCheckpoint(self.out, self.world.is_main), self.out / CHECKPOINT
        if not self.execution.fsdp:
            if sharded.found():
                raise BadInput(f"{self.out} holds a sharded checkpoint (trained with --fsdp): resume it with --fsdp")
            return _load(single, self.model, self.ema, self.optimizer, self.scheduler, best)
        if single.is_file():
            raise BadInput(f"{self.out} holds a single-file checkpoint (trained without --fsdp): resume it "
                           "without --fsdp")
        kept: dict = {}
        with mixed_tensors():  # a fresh AdamW takes one zero step to have state to load into
            meta = sharded.load(self.model, self.optimizer, self.ema, kept)
        if meta is None:
            return TrainingState()
        state = _restored(meta, self.scheduler, best, bool(kept))
        best.weights = kept or None
        return state

    def save(self, state: TrainingState, best: Best) -> None:
        if not self.execution.fsdp:
            if self.world.is_main:
                _save(self.out / CHECKPOINT, self.model, self.ema, self.optimizer, self.scheduler, state, best)
            return
        with mixed_tensors():
            ShardedCheckpoint(self.out, self.world.is_main).save(self.model, self.optimizer, self.ema, best.weights,
                                                                 _meta(state, self.scheduler, best))

    def final_weights(self, best: Best) -> dict | None:
        """model.safetensors' tensors on rank 0 (None on the others): the model's state with the
        kept EMA weights (the best, else the last) in place of the trained ones; a sharded
        model's gathered whole, one tensor at a time (every rank takes part)."""
        if not (self.world.is_main or is_sharded(self.model)):
            return None
        kept, weights = best.weights or self.ema, {}
        for k, v in self.model.state_dict().items():
            full = whole(kept.get(k, v), self.device)
            if self.world.is_main:
                weights[k] = full.detach().to("cpu", v.dtype).contiguous()
        return weights if self.world.is_main else None

    def close(self) -> None:
        if self.execution.activation_checkpointing:
            release_activations(decoder_blocks(self.model))
        if self.world.connected:  # free DDP's reducer now: collected later, after the process group is gone, it aborts
            self.step_loss = None
            gc.collect()


def _evaluation(run: _Run, evaluate: Callable, at: int, state: TrainingState, best: Best, log, cfg: TrainConfig) -> bool:
    """One evaluation at step `at`: the score (and the guard, when `evaluate` gives one) appended
    to `state`'s curves, the best weights offered, the score logged. Returns whether the plateau
    rule stops the run: both curves flat."""
    score, guard = run.score(evaluate)
    state.val_curve.append([at, score])
    if guard is not None:
        state.guard_curve.append([at, guard])
    best.offer(at, score, run.ema)
    log.validation(at, score)
    return plateaued(state.val_curve, cfg) and (not state.guard_curve or plateaued(state.guard_curve, cfg))


def train(model: torch.nn.Module, loss_fn: Callable, cfg: TrainConfig, *, out: Path, device: torch.device,
          progress=None, world: World = SINGLE, evaluate: Callable[[torch.nn.Module], float] | None = None,
          execution: Execution = Execution()) -> Trained:
    """Train `model` in place; `loss_fn(model, generator, shard) -> scalar loss` draws the
    global batch's random numbers from `generator` and computes the loss on `shard.rows` of it.
    `evaluate(model) -> score` (lower is better; called with the EMA weights loaded) drives the
    plateau rule when `cfg.eval_every` > 0; it may return (score, guard): the best weights are
    the score's, and the rule stops only when both curves are flat (a score with a floor, such as
    a diffusion objective, flattens while what the guard measures still falls). `execution`:
    FSDP, gradient accumulation and activation checkpointing (bridges/parallel.py); a sharded
    model stays sharded afterwards.

    Resumes from `out/checkpoint.safetensors` (`out/checkpoint/` under FSDP) when present.
    Returns what ran (`Trained`; the loss curve holds this rank's losses) and leaves the EMA
    weights in `out/model.safetensors`: with evaluations, the EMA weights of the best-scoring
    evaluation (a run that got worse after its best keeps the best), else the last. Under
    `geoprobe.tracking.tracking("tensorboard")` the losses, rates and scores go to event files."""
    cfg.validate()
    execution.validate(cfg.batch_size, world.size, cfg.precision)
    shard = Shard(world.rank, world.size)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    run = _Run.start(model, loss_fn, cfg, out, device, world, execution)
    best = Best()
    resumed = run.load(best).under_cap(cfg.steps)  # TrainingState() when there is none
    start, curve, val_curve, stop = resumed.step, resumed.curve, resumed.val_curve, resumed.stop
    plateau_rule = cfg.eval_every > 0 and evaluate is not None
    log = ScalarLog(out, world.is_main, start)
    model.train()
    if progress is not None:
        progress.start(total=cfg.steps, completed=start)
    if plateau_rule and cfg.eval_at_start and start == 0 and stop is None:  # step 0, kept if never beaten
        _evaluation(run, evaluate, 0, resumed, best, log, cfg)
    began = time.perf_counter()
    pending = []  # (step, loss on the device, lr): read back in one transfer at checkpoints, not every step

    def flush():
        if pending:
            losses = torch.stack([l for _, l, _ in pending]).tolist()
            curve.extend([s, v] for (s, _, _), v in zip(pending, losses))
            log.losses([(s, v, lr) for (s, _, lr), v in zip(pending, losses)])
            pending.clear()

    try:
        for step in range(start, cfg.steps if stop is None else start):
            lr = run.lr
            pending.append((step, run.update(step, shard), lr))
            if progress is not None:
                progress.advance(1)
            if plateau_rule and (step + 1) % cfg.eval_every == 0:
                stop = "plateau" if _evaluation(run, evaluate, step + 1, resumed, best, log, cfg) else None
            if step + 1 == cfg.steps and stop is None:
                stop = "cap" if plateau_rule else "budget"
            saving = cfg.save_every > 0 and (stop is not None or (step + 1) % cfg.save_every == 0)
            if stop is not None or saving or (log.active and (step + 1) % LOG_EVERY == 0):
                flush()
            if saving:
                run.save(TrainingState(step + 1, curve, val_curve, stop, resumed.seconds + time.perf_counter() - began,
                                       resumed.guard_curve), best)
            if stop is not None:
                break
        flush()
        model.eval()
        seconds = time.perf_counter() - began
        steps_run = int(curve[-1][0]) + 1 if curve else 0
        weights = run.final_weights(best)
        if weights is not None:
            save_weights(out, weights, {"steps": str(steps_run), "seconds": f"{seconds:.3f}"})
        world.barrier()  # the other ranks may read the weights from here on
    except BaseException as exc:
        if world.connected:  # the traceback's frames hold the DDP wrapper: let it go with them
            traceback.clear_frames(exc.__traceback__)
        raise
    finally:
        log.close()
        run.close()
    return Trained(curve, val_curve, steps_run, stop or "budget", seconds, steps_run - start, best.step,
                   resumed.seconds + seconds, resumed.guard_curve)


def training_summary(trained: Trained, window: int = 20, cfg: TrainConfig | None = None) -> dict:
    """The metrics every trained model records about its training: the mean training loss over
    the last `window` steps, the steps run, why it stopped, the validation curve and (given the
    settings) the plateau rule's last reading (`plateau_summary`)."""
    tail = trained.curve[-window:]
    rule = plateau_summary(trained.val_curve, cfg) if cfg is not None else None
    if rule is not None and trained.guard_curve:  # the second curve's reading too: a stop needs both flat
        guard = plateau_summary(trained.guard_curve, cfg)
        rule["guard_gain"] = guard.get("gain")
    return {"final_train_loss": sum(l for _, l in tail) / max(len(tail), 1), "steps_run": trained.steps,
            "stop": trained.stop, "val_curve": trained.val_curve, "best_step": trained.best_step,
            **({"guard_curve": trained.guard_curve} if trained.guard_curve else {}),
            **({"plateau_rule": rule} if rule is not None else {}),
            "train_seconds": round(trained.total_seconds, 3),
            "steps_per_second": round(trained.session_steps / trained.seconds, 3) if trained.seconds else None}


def fit_model(model: torch.nn.Module, loss_fn: Callable, cfg: TrainConfig, *, out: Path, device: torch.device,
              score: Callable[[torch.nn.Module, Trained], dict], title: str, progress=None, world: World = SINGLE,
              watch: Callable[[torch.nn.Module], float] | None = None, reload: bool = True,
              execution: Execution = Execution()) -> dict | None:
    """The fit every model kind shares, after its directory is checked and its config.json
    written (bridges/checkpoint.py): train or resume (`train`, the plateau rule on `watch`),
    load the kept EMA weights, score them (`score(model, trained)`: the kind's validation),
    add the training summary and write the record (metrics.json last, curve.csv, the curve
    plot). Returns the metrics on rank 0 (None on the other data-parallel ranks, which
    neither score nor write). `reload` False: `score` reads the saved weights itself (a large
    model is then not loaded twice). `execution`: how the training runs (bridges/parallel.py)."""
    trained = train(model, loss_fn, cfg, out=out, device=device, progress=progress, world=world, evaluate=watch,
                    execution=execution)
    if not world.is_main:
        return None
    if reload:
        load_weights(model, out)
    model.eval()
    # the machine that finished the training: a record copied to another machine keeps its times' origin
    metrics = {**score(model, trained), **training_summary(trained, cfg=cfg), "machine": machine_name(device)}
    write_record(out, metrics, trained, title)
    return metrics
