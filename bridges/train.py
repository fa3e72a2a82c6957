"""One training loop for every trainable model: a fixed budget, AdamW, linear warmup then
cosine decay, gradient clipping, an EMA of the weights, bf16 autocast on CUDA, and resumable
single-file checkpoints.

Everything random in step t is drawn from a generator seeded by (seed, t), so a run resumed
from a checkpoint at step k repeats exactly what an uninterrupted run does from step k on.
A checkpoint is one safetensors file (weights, EMA, optimizer state; the scheduler state and
the loss curve in its metadata), written under a temporary name and renamed into place.

Data parallel (torchrun): the model is wrapped in DistributedDataParallel, `batch_size` is the
global batch, and each rank draws the global batch's random numbers and keeps its rows (a
`Shard`), so gradients averaged over W ranks equal one process's on the whole batch and a
checkpoint (written by rank 0) resumes on any world size.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, safe_open, save_file

from geoprobe.distributed import SINGLE, World
from geoprobe.errors import BadInput

CHECKPOINT = "checkpoint.safetensors"
WEIGHTS = "model.safetensors"  # the EMA weights: what sampling and evaluation load


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
    save_every: int = 200

    def validate(self) -> None:
        if self.steps < 1:
            raise BadInput(f"--steps must be at least 1, got {self.steps}")
        if self.batch_size < 1:
            raise BadInput(f"--batch-size must be at least 1, got {self.batch_size}")
        if not 0 < self.lr < 1:
            raise BadInput(f"--lr must be in (0, 1), got {self.lr}")
        if not 0 <= self.ema < 1:
            raise BadInput(f"--ema must be in [0, 1), got {self.ema}")


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
        progress = (step - warmup) / max(1, cfg.steps - warmup)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return factor


def trainable(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def _save(path: Path, model, ema: dict, optimizer, scheduler, step: int, curve: list) -> None:
    names = {id(p): name for name, p in trainable(model).items()}
    tensors = {f"model.{k}": v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    tensors.update({f"ema.{k}": v.contiguous().cpu() for k, v in ema.items()})
    groups = []
    for group in optimizer.param_groups:
        groups.append({k: v for k, v in group.items() if k != "params"})
        for p in group["params"]:
            for key, value in optimizer.state.get(p, {}).items():
                tensors[f"opt.{names[id(p)]}.{key}"] = value.detach().contiguous().cpu()
    meta = {"step": str(step), "curve": json.dumps(curve), "scheduler": json.dumps(scheduler.state_dict()),
            "param_groups": json.dumps(groups)}
    tmp = path.with_name(f".{path.name}.tmp")
    save_file(tensors, tmp, metadata=meta)
    os.replace(tmp, path)


def _load(path: Path, model, ema: dict, optimizer, scheduler) -> tuple[int, list]:
    tensors = load_file(path)
    with safe_open(path, "pt") as handle:
        meta = handle.metadata()
    model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
    for k in ema:
        ema[k].copy_(tensors[f"ema.{k}"])
    params = trainable(model)
    for name, p in params.items():
        state = {key.rsplit(".", 1)[1]: v.to(p.device) for key, v in tensors.items()
                 if key.startswith(f"opt.{name}.") and key[len(f"opt.{name}."):].count(".") == 0}
        if state:
            optimizer.state[p] = state
    for group, saved in zip(optimizer.param_groups, json.loads(meta["param_groups"])):
        group.update(saved)
    scheduler.load_state_dict(json.loads(meta["scheduler"]))
    return int(meta["step"]), json.loads(meta["curve"])


def train(model: torch.nn.Module, loss_fn: Callable, cfg: TrainConfig, out: Path, device: torch.device,
          progress=None, log: Callable[[int, float], None] | None = None, world: World = SINGLE) -> list:
    """Train `model` in place; `loss_fn(model, generator, shard) -> scalar loss` draws the
    global batch's random numbers from `generator` and computes the loss on `shard.rows` of it.

    Resumes from `out/checkpoint.safetensors` when present. Returns the loss curve
    [[step, loss], ...] (this rank's losses) and leaves the EMA weights in `out/model.safetensors`.
    """
    cfg.validate()
    if cfg.batch_size % world.size:
        raise BadInput(f"--batch-size {cfg.batch_size} (the global batch) must be a multiple of the "
                       f"{world.size} ranks")
    shard = Shard(world.rank, world.size)
    step_loss: torch.nn.Module = _StepLoss(model, loss_fn)
    if world.connected:
        from torch.nn.parallel import DistributedDataParallel

        step_loss = DistributedDataParallel(step_loss, device_ids=[device.index] if device.type == "cuda" else None,
                                            find_unused_parameters=True)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    params = trainable(model)
    decay = [p for n, p in params.items() if p.ndim >= 2]
    no_decay = [p for n, p in params.items() if p.ndim < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))
    ema = {k: v.detach().clone().float() for k, v in params.items()}
    start, curve = 0, []
    if (out / CHECKPOINT).is_file():
        start, curve = _load(out / CHECKPOINT, model, ema, optimizer, scheduler)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()
    model.train()
    if progress is not None:
        progress.start(total=cfg.steps, completed=start)
    began = time.perf_counter()
    for step in range(start, cfg.steps):
        with autocast:
            loss = step_loss(step_generator(cfg.seed, step), shard)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(params.values()), cfg.clip)
        optimizer.step()
        scheduler.step()
        # EMA with a warmup, (1 + t) / (10 + t): a short run is not dominated by its initial weights
        decay_now = min(cfg.ema, (1 + step) / (10 + step))
        with torch.no_grad():
            for k, p in params.items():
                ema[k].lerp_(p.detach().float(), 1 - decay_now)
        value = loss.item()
        curve.append([step, value])
        if log is not None:
            log(step, value)
        if progress is not None:
            progress.advance(1)
        if ((step + 1) % cfg.save_every == 0 or step + 1 == cfg.steps) and world.is_main:
            _save(out / CHECKPOINT, model, ema, optimizer, scheduler, step + 1, curve)
    model.eval()
    if world.is_main:
        weights = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
        weights.update({k: v.to(weights[k].dtype).cpu() for k, v in ema.items()})
        save_file(weights, out / WEIGHTS, metadata={"steps": str(cfg.steps),
                                                    "seconds": f"{time.perf_counter() - began:.3f}"})
    world.barrier()  # the other ranks may read the weights from here on
    return curve
