"""The per-token and per-layer costs that docs/scaling.md extrapolates from, measured here.

1. Extraction of the real SmolLM2-135M (all 31 layers, float16 shards) on the KJV: tokens
   forwarded per second, and bytes written per row.
2. Geometry of one layer of those states (k=32, 2,048 anchors, 4,096 pairs) without and with
   200 bootstrap replicates: seconds per layer.
3. The same geometry split over 2 gloo ranks on this machine, against 1 rank: the price of the
   collectives (on 2 CPU cores the ranks share the cores, so this is overhead, not speed-up).

Run: .venv/bin/python bench/scaling.py
"""

from __future__ import annotations

import os
import pickle
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch
import torch.multiprocessing as mp

from geoprobe.backbone import load_backbone
from geoprobe.extract import ExtractConfig, extract
from geoprobe.geometry import GeometrySettings, bootstrap_counts, layer_geometry
from geoprobe.store import RunReader

TOKENS = 8000


def _rank(rank: int, world_size: int, port: int, data: str, out: str) -> None:
    import torch.distributed as dist

    from geoprobe.distributed import world_from

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    x, docs, settings, counts = pickle.loads(Path(data).read_bytes())
    world = world_from()
    lo, hi = world.share(len(x))
    dist.barrier()
    started = time.perf_counter()
    layer_geometry(x[lo:hi], docs, settings, counts, rng_key=1, world=world)
    Path(f"{out}.{rank}").write_text(str(time.perf_counter() - started))
    dist.destroy_process_group()


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="geoprobe-scaling-"))
    backbone = load_backbone("builtin:smollm2", device="cpu")
    cfg = ExtractConfig(model="builtin:smollm2", corpus="kjv", tokens=TOKENS, seq_len=256, device="cpu")
    started = time.perf_counter()
    manifest = extract(cfg, work / "run", backbone=backbone)
    seconds = time.perf_counter() - started
    forwarded = manifest["tokens_forwarded"]
    disk = sum(p.stat().st_size for p in (work / "run" / "hidden").glob("*.parquet"))
    print(f"extract SmolLM2-135M, 31 layers, float16 shards : {forwarded} tokens in {seconds:.1f} s = "
          f"{forwarded / seconds:.0f} tokens/s; {disk / manifest['rows'] / 1024:.1f} KiB per row "
          f"({disk / 2**20:.0f} MiB)")

    reader = RunReader(work / "run")
    x = torch.from_numpy(reader.read_layer(15)).double()
    _, docs = np.unique(reader.read_meta()["doc_id"], return_inverse=True)
    docs = torch.from_numpy(docs.astype(np.int64))
    counts = torch.from_numpy(bootstrap_counts(int(docs.max()) + 1, 200, 0))
    for reps in (0, 200):
        settings = GeometrySettings(bootstrap=reps)
        started = time.perf_counter()
        layer_geometry(x, docs, settings, counts if reps else None, rng_key=1)
        print(f"geometry of one layer (N={len(x)}, d={x.shape[1]}, bootstrap {reps:3d}) : "
              f"{time.perf_counter() - started:.2f} s")

    settings = GeometrySettings(bootstrap=0)
    data = work / "layer.pkl"
    data.write_bytes(pickle.dumps((x, docs, settings, None)))
    for world_size in (1, 2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.start_processes(_rank, args=(world_size, port, str(data), str(work / f"t{world_size}")),
                           nprocs=world_size, join=True, start_method="spawn")
        took = max(float(Path(f"{work}/t{world_size}.{r}").read_text()) for r in range(world_size))
        print(f"geometry of one layer, {world_size} gloo rank(s), 1 thread each : {took:.2f} s")


if __name__ == "__main__":
    main()
