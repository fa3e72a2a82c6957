"""DSL training's memory per rank under DDP and under FSDP (`dsl train --fsdp`), side by side in
one run on 2 CPU processes (gloo): the training state each rank holds, measured by adding up its
tensors after two steps (weights, gradients, AdamW's moments, the EMA; for a sharded tensor this
rank's shard), beside geoprobe.memory.dsl_training_bytes's plan of the whole footprint per rank
(the activations and, under DDP, its gradient buckets included, which the count cannot see).

    python bench/fsdp_memory.py          # the tiny benchmark Llama (d = 256, 8 blocks, V = 320) as the DSL's blocks

On a CPU the ranks share one host's RAM, so nothing here saves memory on this machine; the
figures are what each GPU would hold.
"""

from __future__ import annotations

import os
import pickle
import socket
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

BATCH, SEQ, D_TOK, RANKS = 8, 64, 16, 2


def held_bytes(run) -> dict:
    """This rank's bytes of each part of the training state."""
    from geoprobe.bridges.parallel import local

    def size(tensors) -> int:
        return sum(local(t).numel() * local(t).element_size() for t in tensors if t is not None)

    params = list(run.params.values())
    return {"weights": size(params), "gradients": size(p.grad for p in params),
            "AdamW": size(v for state in run.optimizer.state.values() for v in state.values()
                          if isinstance(v, torch.Tensor) and v.dim() > 0),
            "EMA": size(run.ema.values())}


def worker(rank: int, port: int, model: str, fsdp: bool, out: str) -> None:
    from geoprobe.backbone import load_tokenizer
    from geoprobe.bridges.dsl import DSLTrainSettings, dsl_objective, pretrained_dsl
    from geoprobe.bridges.parallel import Execution
    from geoprobe.bridges.train import Shard, TrainConfig, _Run
    from geoprobe.distributed import world_from

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(RANKS),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=RANKS)
    try:
        dsl = pretrained_dsl(model, load_tokenizer(model), d_tok=D_TOK)
        data = torch.randint(0, dsl.cfg.vocab_size, (64, SEQ), generator=torch.Generator().manual_seed(0))
        settings = DSLTrainSettings(seq_len=SEQ, train=TrainConfig(steps=2, batch_size=BATCH, precision="float32"))
        cpu, world = torch.device("cpu"), world_from()
        loss_fn, _ = dsl_objective(dsl, data, settings, cpu, sharded=fsdp)
        run = _Run.start(dsl, loss_fn, settings.train, Path(out), cpu, world, Execution(fsdp=fsdp))
        for step in range(2):
            run.update(step, Shard(world.rank, world.size))
        measured = held_bytes(run)
        run.close()
        Path(f"{out}/{'fsdp' if fsdp else 'ddp'}-{rank}.pkl").write_bytes(pickle.dumps(measured))
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    from common import tiny_llama

    from geoprobe.backbone import load_config, resolve_source
    from geoprobe.memory import dsl_training_bytes

    work = Path(tempfile.mkdtemp(prefix="geoprobe-bench-fsdp-"))
    model, _ = tiny_llama(work, n_docs=1)
    for fsdp in (False, True):
        mp.start_processes(worker, args=(free_port(), str(model), fsdp, str(work)), nprocs=RANKS, join=True,
                           start_method="spawn")
    measured = {kind: [pickle.loads((work / f"{kind}-{r}.pkl").read_bytes()) for r in range(RANKS)]
                for kind in ("ddp", "fsdp")}
    config = load_config(resolve_source(str(model)))
    micro = BATCH // RANKS
    plans = {"one process": dsl_training_bytes(config, d_tok=D_TOK, batch_size=BATCH, seq_len=SEQ),
             "ddp": dsl_training_bytes(config, d_tok=D_TOK, batch_size=micro, seq_len=SEQ, ranks=RANKS),
             "fsdp": dsl_training_bytes(config, d_tok=D_TOK, batch_size=micro, seq_len=SEQ, ranks=RANKS, fsdp=True)}
    print(f"DSL on the tiny Llama (d = 256, 8 blocks, V = 320, d_tok {D_TOK}), float32, global batch {BATCH} x {SEQ} "
          f"on {RANKS} gloo ranks; bytes per rank (rank 0 / rank 1)")
    print(f"  {'':26s} {'DDP':>21s} {'FSDP':>21s}")
    for part in ("weights", "gradients", "AdamW", "EMA"):
        row = [" / ".join(f"{m[part] / 1e6:.2f}" for m in measured[kind]) + " MB" for kind in ("ddp", "fsdp")]
        print(f"  {part + ' (measured)':26s} {row[0]:>21s} {row[1]:>21s}")
    total = [" / ".join(f"{sum(m.values()) / 1e6:.2f}" for m in measured[kind]) + " MB" for kind in ("ddp", "fsdp")]
    print(f"  {'training state (measured)':26s} {total[0]:>21s} {total[1]:>21s}")
    print(f"  {'whole plan per rank':26s} {plans['ddp'] / 1e6:>18.2f} MB {plans['fsdp'] / 1e6:>18.2f} MB"
          f"   (one process: {plans['one process'] / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
