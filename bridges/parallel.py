"""How one training run is laid over ranks and memory: fully sharded data parallel (`--fsdp`),
gradient accumulation (`--grad-accum`), activation checkpointing (`--activation-checkpointing`)
and the sharded checkpoint. bridges/train.py's loop calls it; none of it changes what a run
computes, only where and in how many pieces.

FSDP is torch's FSDP2 engine (`torch.distributed.fsdp.fully_shard`). Each decoder block is one
unit, then the root (the embedding matrix, the head, the final norm) is the last. Every rank
holds 1/W of each unit's float32 parameters, gradients, AdamW moments and EMA; a unit's whole
parameters exist only while it computes. On CUDA with `--precision auto` the units compute in
bfloat16 and reduce gradients in float32 (`MixedPrecisionPolicy`): the sharded float32 weights
are the master copy, so no stochastic rounding is needed. On a CPU (gloo), float32 throughout.
The channel's token table and the converter stay replicated and float32 (the posterior over V
is a softmax of logits up to s_max = 100; two of the converter's parameters are scalars, which
`fully_shard` refuses); their gradients are averaged with one all_reduce.

The sharded checkpoint is a folder written by every rank through torch.distributed.checkpoint
(weights, AdamW state, EMA, the best EMA weights), plus `training.json` (the step, the curves,
the scheduler), written under a temporary name and renamed into place. It loads on any number
of ranks.
"""

from __future__ import annotations

import functools
import json
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from geoprobe.errors import BadInput
from geoprobe.files import write_json_atomic

SHARDED_CHECKPOINT = "checkpoint"  # the folder beside config.json
TRAINING_STATE = "training.json"


@dataclass(frozen=True)
class Execution:
    """How a run executes, not what it computes: none of it enters a run's identity, so a run
    may resume under other values (`--fsdp` changes the checkpoint's form, a folder instead of one
    file, so a run resumes with the flag it was saved with).

    `grad_accum`: each rank's share of the global batch runs in this many micro-batches, their
    gradients summed before one optimiser step (the same step, less activation memory).
    `activation_checkpointing`: each decoder block keeps only its input for backward and
    recomputes the rest there (about one more forward per step)."""

    fsdp: bool = False
    grad_accum: int = 1
    activation_checkpointing: bool = False

    def validate(self, batch_size: int, ranks: int, precision: str = "auto") -> None:
        if self.fsdp and precision == "bfloat16":
            raise BadInput("--fsdp keeps float32 master weights on the shards: use --precision auto (bf16 compute "
                           "on CUDA) or float32, not bfloat16")
        if self.grad_accum < 1:
            raise BadInput(f"--grad-accum must be at least 1, got {self.grad_accum}")
        if batch_size % (ranks * self.grad_accum):
            accum = f" x --grad-accum {self.grad_accum}" if self.grad_accum > 1 else ""
            raise BadInput(f"--batch-size {batch_size} (the global batch) must be a multiple of the {ranks} "
                           f"ranks{accum}")


def decoder_blocks(model: nn.Module) -> list[nn.Module]:
    """The model's decoder blocks (its `decoder_blocks()`), or one line: this model has none to shard."""
    blocks = getattr(model, "decoder_blocks", None)
    if blocks is None:
        raise BadInput(f"--fsdp and --activation-checkpointing train a DSL model ({type(model).__name__} has "
                       "no decoder blocks to shard)")
    return list(blocks())


def checkpoint_activations(blocks: list[nn.Module]) -> None:
    """Each block recomputes its activations in backward (torch.utils.checkpoint, non-reentrant),
    keeping only its input; its parameter names, and so every checkpoint, are unchanged."""
    from torch.utils.checkpoint import checkpoint

    for block in blocks:
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)


def release_activations(blocks: list[nn.Module]) -> None:
    """Undo checkpoint_activations (the model is then used for sampling as it was)."""
    for block in blocks:
        block.__dict__.pop("forward", None)


def join_group(device: torch.device) -> None:
    """A process group of one when none was started (FSDP needs one even on a single device)."""
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":  # `cuda` without an index (--device auto) names the current one
            device = torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)
            torch.cuda.set_device(device)
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                                **({"device_id": device} if device.type == "cuda" else {}))


def mixed_policy(device: torch.device, precision: str):
    """bfloat16 compute and float32 gradient reduction on CUDA under --precision auto; None
    (float32) otherwise."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if device.type == "cuda" and precision == "auto":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return None


def shard(model: nn.Module, device: torch.device, precision: str) -> None:
    """fully_shard each decoder block, then the root (the model, already on `device`), leaving
    its `replicated_parts()` (the table and converter) replicated in float32."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    join_group(device)
    # the DSL's logits are a slice of the head's output; nothing writes into them in place
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    policy = mixed_policy(device, precision)
    block_policy = policy or MixedPrecisionPolicy()
    for block in decoder_blocks(model):
        fully_shard(block, mesh=mesh, mp_policy=block_policy)
    # the root's input (z) stays float32: the converter's posterior is computed in float32
    root_policy = MixedPrecisionPolicy(param_dtype=block_policy.param_dtype, reduce_dtype=block_policy.reduce_dtype,
                                       cast_forward_inputs=False)
    ignored = {p for part in model.replicated_parts() for p in part.parameters()}
    fully_shard(model, mesh=mesh, mp_policy=root_policy, ignored_params=ignored)


def is_sharded(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's piece of a sharded tensor (the tensor itself when it is not sharded)."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def host_copy(t: torch.Tensor) -> torch.Tensor:
    """A copy on the host; of a sharded tensor, its own shard on the host (still sharded)."""
    from torch.distributed.tensor import DTensor

    if not isinstance(t, DTensor):
        return t.detach().to("cpu", copy=True)
    return DTensor.from_local(t.to_local().detach().to("cpu", copy=True), t.device_mesh, t.placements,
                              shape=t.shape, stride=t.stride(), run_check=False)


def whole(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The whole tensor on every rank (a collective for a sharded one, gathered on `device`)."""
    from torch.distributed.tensor import DTensor

    if not isinstance(t, DTensor):
        return t
    return DTensor.from_local(t.to_local().to(device), t.device_mesh, t.placements, shape=t.shape,
                              stride=t.stride(), run_check=False).full_tensor()


def reshard(model: nn.Module) -> None:
    """Free every unit's whole parameters: the root keeps them after a forward without backward
    (an evaluation), and a later forward would use that copy, not the shards."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def mixed_tensors():
    """The context in which sharded and replicated tensors meet (gradient clipping, AdamW):
    a plain tensor counts as replicated."""
    from torch.distributed.tensor.experimental import implicit_replication

    return implicit_replication()


def average_replicated(model: nn.Module) -> None:
    """The replicated parts' gradients averaged over the ranks (one all_reduce of them all)."""
    if dist.get_world_size() == 1:
        return
    grads = [p.grad for part in model.replicated_parts() for p in part.parameters() if p.grad is not None]
    if grads:
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat /= dist.get_world_size()
        for g, piece in zip(grads, flat.split([g.numel() for g in grads])):
            g.copy_(piece.view_as(g))


class ShardedCheckpoint:
    """A run's sharded checkpoint folder (`out/checkpoint/`): torch.distributed.checkpoint's
    files and `training.json`. `save` and `load` are collectives: every rank calls them."""

    def __init__(self, out: Path, is_main: bool):
        self.folder, self.is_main = Path(out) / SHARDED_CHECKPOINT, is_main
        self.pending = self.folder.with_name(f".{SHARDED_CHECKPOINT}.tmp")
        self.old = self.folder.with_name(f".{SHARDED_CHECKPOINT}.old")

    def found(self) -> Path | None:
        """The whole checkpoint folder, if any (the old one when a swap was cut short)."""
        for folder in (self.folder, self.old):
            if (folder / TRAINING_STATE).is_file():
                return folder
        return None

    @staticmethod
    def _state(model, optimizer, ema: dict, best: dict | None) -> dict:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

        state = {"model": get_model_state_dict(model), "optimizer": get_optimizer_state_dict(model, optimizer),
                 "ema": ema}
        if best:
            state["best"] = best
        return state

    def save(self, model, optimizer, ema: dict, best: dict | None, meta: dict) -> None:
        import torch.distributed.checkpoint as dcp

        if self.is_main:
            shutil.rmtree(self.pending, ignore_errors=True)
        dist.barrier()
        dcp.save(self._state(model, optimizer, ema, best), checkpoint_id=self.pending)
        dist.barrier()
        if self.is_main:
            write_json_atomic(self.pending / TRAINING_STATE, meta)  # last: a folder with it is whole
            if self.folder.exists():
                shutil.rmtree(self.old, ignore_errors=True)
                self.folder.rename(self.old)
            self.pending.rename(self.folder)
            shutil.rmtree(self.old, ignore_errors=True)
        dist.barrier()

    def load(self, model, optimizer, ema: dict, best: dict) -> dict | None:
        """The saved meta (None: no checkpoint), with the weights, AdamW state, EMA and, when the
        meta names a best step, `best` (filled: sharded like the EMA, on the host) loaded in place."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

        folder = self.found()
        if folder is None:
            return None
        meta = json.loads((folder / TRAINING_STATE).read_text())
        if meta.get("best_step") not in (None, ""):
            best.update({k: host_copy(v) for k, v in ema.items()})
        state = self._state(model, optimizer, ema, best)
        try:
            dcp.load(state, checkpoint_id=folder)
        except Exception as exc:
            raise BadInput(f"sharded checkpoint {folder} is incomplete or from another version ({exc}); "
                           "delete it to train from the start, or use --force") from exc
        set_model_state_dict(model, state["model"])
        set_optimizer_state_dict(model, optimizer, state["optimizer"])
        return meta
