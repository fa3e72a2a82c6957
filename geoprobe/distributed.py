"""Several processes, one job: the rank/world-size picture every command shares.

Launched by `torchrun`, a command finds RANK, WORLD_SIZE and LOCAL_RANK in its environment and
joins the process group (NCCL when each rank has a GPU, gloo otherwise); `--rank` and
`--world-size` set the same picture by hand, for extraction only (it needs no messages: ranks
split the work by shard index and the last one to finish merges the manifest). A world of one
is the plain single process, and every collective below is then the identity, so one code path
serves both.
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch
import torch.distributed as dist

from geoprobe.errors import BadInput

T = TypeVar("T")


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def connected(self) -> bool:
        """True when a process group carries collectives between the ranks."""
        return self.size > 1 and dist.is_available() and dist.is_initialized()

    def device(self, requested: str, device_map: str | None = None) -> str:
        """Each rank on its own GPU when there are several (`auto` or `cuda`: the GPU of its local
        rank); the request otherwise. Placements that would put every rank on the same GPUs are
        refused: `--device cuda:N` with several ranks, and `--device-map` with several ranks (each
        would spread its own copy over every GPU) or with `--device cuda:N` (it ignores N)."""
        if self.size > 1 and requested.startswith("cuda:"):
            raise BadInput(f"--device {requested} would put all {self.size} ranks on one GPU; use --device cuda "
                           "(each rank takes the GPU of its local rank)")
        if device_map is not None and self.size > 1:
            raise BadInput("--device-map spreads one copy of the model over every GPU; with several ranks each "
                           "would do so: run one process with --device-map auto, or one rank per GPU without it")
        if device_map is not None and requested.startswith("cuda:"):
            raise BadInput(f"--device-map {device_map} places the model over every GPU and would ignore "
                           f"--device {requested}; pass one of them")
        if self.size > 1 and requested in ("auto", "cuda") and torch.cuda.is_available():
            return f"cuda:{self.local_rank % torch.cuda.device_count()}"
        return requested

    def barrier(self) -> None:
        if self.connected:
            dist.barrier()

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """The element-wise sum over ranks, on every rank (in place)."""
        if self.connected:
            moved = tensor.to(self._wire)
            dist.all_reduce(moved)
            tensor.copy_(moved)
        return tensor

    def gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's tensor (their first dimensions may differ), in rank order, on every rank."""
        if not self.connected:
            return [tensor]
        sizes = [torch.zeros(1, dtype=torch.int64, device=self._wire) for _ in range(self.size)]
        dist.all_gather(sizes, torch.tensor([len(tensor)], dtype=torch.int64, device=self._wire))
        longest = int(max(s.item() for s in sizes))
        padded = torch.zeros((longest, *tensor.shape[1:]), dtype=tensor.dtype, device=self._wire)
        padded[: len(tensor)] = tensor.to(self._wire)
        parts = [torch.empty_like(padded) for _ in range(self.size)]
        dist.all_gather(parts, padded)
        return [p[: int(s.item())].to(tensor.device) for p, s in zip(parts, sizes)]

    def share(self, n: int) -> tuple[int, int]:
        """This rank's contiguous range [lo, hi) of n items (sizes differ by at most one)."""
        return n * self.rank // self.size, n * (self.rank + 1) // self.size

    def any(self, flag: bool) -> bool:
        """Whether `flag` holds on any rank (the same answer on every rank)."""
        return bool(self.sum(torch.tensor([float(flag)])).item())

    def together(self, work: Callable[[], T], meet: Path | None = None) -> T:
        """`work()` on every rank, then one sum: where it raised on any rank, every rank raises (that
        rank its own error, the others one naming the failed ranks) instead of waiting for the
        failed ranks at the next collective.

        Args:
            meet: a folder all ranks see. A rank that finishes first waits there, polling for the
                others' marks, rather than inside the collective, whose timeout (6 hours) a long
                uneven share of work (a day-long sweep on CPU ranks) can pass.
        """
        token = int(self.sum(torch.tensor([float(time.time_ns() % 2**40) if self.is_main else 0.0],
                                          dtype=torch.float64)).item()) if meet is not None and self.connected else 0
        error = None
        try:
            result = work()
        except Exception as exc:  # noqa: BLE001 (re-raised below, after the other ranks know)
            error = exc
        if meet is not None and self.connected:
            self._wait_for_all(Path(meet), token)
        failed = torch.zeros(self.size)
        failed[self.rank] = error is not None
        failed = [r for r, flag in enumerate(self.sum(failed).tolist()) if flag]
        if meet is not None and self.connected and self.is_main:  # every rank is past its wait
            for r in range(self.size):
                (Path(meet) / f"{token}-rank-{r}.done").unlink(missing_ok=True)
        if error is not None:
            raise error
        if failed:
            ranks = ", ".join(map(str, failed))
            raise RuntimeError(f"rank {ranks} stopped with an error (above); rank {self.rank} stops too")
        return result

    def _wait_for_all(self, meet: Path, token: int, every: float = 5.0) -> None:
        """Mark this rank done in `meet` (for this call's `token`), then wait until every rank has."""
        meet.mkdir(parents=True, exist_ok=True)
        (meet / f"{token}-rank-{self.rank}.done").touch()
        while not all((meet / f"{token}-rank-{r}.done").exists() for r in range(self.size)):
            time.sleep(every)

    @property
    def _wire(self) -> torch.device:
        return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


SINGLE = World()


def world_from(rank: int | None = None, world_size: int | None = None, connect: bool = True) -> World:
    """The world of this process: torchrun's environment, else the flags, else a single process.
    Under torchrun (and `connect`), the process group is started once (idempotent)."""
    env_size = int(os.environ.get("WORLD_SIZE", "1"))
    env_rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if env_size > 1:
        if world_size not in (None, env_size) or rank not in (None, env_rank):
            raise BadInput(f"--rank/--world-size ({rank}/{world_size}) disagree with torchrun's "
                           f"RANK/WORLD_SIZE ({env_rank}/{env_size}); pass neither under torchrun")
        rank, world_size = env_rank, env_size
    world_size = 1 if world_size is None else world_size
    rank = 0 if rank is None else rank
    if world_size < 1:
        raise BadInput(f"--world-size must be at least 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise BadInput(f"--rank must be in 0..{world_size - 1}, got {rank}")
    if env_size <= 1:  # ranks started by hand have no LOCAL_RANK: one machine, GPU = rank modulo the GPUs
        local = rank
    world = World(rank, world_size, local)
    if connect and env_size > 1 and not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"
        bound = {}
        if backend == "nccl":  # bound before the first collective: a barrier then knows its GPU
            bound["device_id"] = torch.device("cuda", local % torch.cuda.device_count())
            torch.cuda.set_device(bound["device_id"])
        # extraction of a large model can keep ranks apart for a long time before they meet again
        dist.init_process_group(backend, timeout=datetime.timedelta(hours=6), **bound)
    return world
