"""Functions that tests/test_distributed.py runs in several gloo processes (spawned, so they
live in an importable module). Each writes its result to a file the test reads."""

from __future__ import annotations

import os
import pickle
import traceback
from pathlib import Path

import torch
import torch.distributed as dist


def join(rank: int, world_size: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def geometry_worker(rank: int, world_size: int, port: int, data: str, out: str) -> None:
    """layer_geometry on this rank's contiguous share of the rows in `data`."""
    from geoprobe.distributed import world_from
    from geoprobe.geometry import layer_geometry

    join(rank, world_size, port)
    try:
        x, docs, settings, counts = pickle.loads(Path(data).read_bytes())
        world = world_from()
        lo, hi = world.share(len(x))
        result = layer_geometry(x[lo:hi], docs, settings, counts, rng_key=5, layer=0, world=world)
        Path(f"{out}.{rank}").write_bytes(pickle.dumps(result))
    except BaseException:
        traceback.print_exc()  # a rank's own error: the others only see a closed connection
        raise
    finally:
        dist.destroy_process_group()
