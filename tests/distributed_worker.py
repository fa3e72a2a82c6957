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


def regression_problem():
    """A seeded linear model and data: enough to tell whether two trainings took the same steps."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(64, 8, generator=g), torch.randn(8, 1, generator=g)
    torch.manual_seed(0)
    return torch.nn.Linear(8, 1), x, x @ w + 0.1 * torch.randn(64, 1, generator=g)


def train_worker(rank: int, world_size: int, port: int, out: str, stop_at: int) -> None:
    """Train 6 steps of global batch 8 in `out` (resuming its checkpoint); stop_at > 0 makes
    every rank fail at that step, as a crash would, after the checkpoint of step 4."""
    from geoprobe.bridges.train import TrainConfig, train
    from geoprobe.distributed import world_from

    join(rank, world_size, port)
    try:
        model, x, y = regression_problem()

        def loss_fn(m, generator, shard):
            rows = shard.rows(torch.randint(0, len(x), (8,), generator=generator))
            noise = shard.rows(torch.randn(8, 1, generator=generator))
            if stop_at and generator.initial_seed() == stop_at:  # step_generator(seed 0, step) = step
                raise RuntimeError("simulated crash")
            return ((m(x[rows]) - y[rows] - 0.01 * noise) ** 2).mean()

        cfg = TrainConfig(steps=6, batch_size=8, lr=0.05, warmup=2, save_every=2, precision="float32")
        try:
            train(model, loss_fn, cfg, out=Path(out), device=torch.device("cpu"), world=world_from())
        except RuntimeError as exc:
            if "simulated crash" not in str(exc):
                raise
    except BaseException:
        traceback.print_exc()
        raise
    finally:
        dist.destroy_process_group()


def dsl_problem(backbone: str | None):
    """(model, data, settings) of a tiny DSL training: on the tiny Llama's blocks (`backbone`, a
    model folder) or from scratch; float32, clipping active, the plateau rule scoring every 2 steps."""
    from geoprobe.bridges.dsl import DSLConfig, DSLModel, DSLTrainSettings, pretrained_dsl
    from geoprobe.bridges.train import TrainConfig

    if backbone:
        from geoprobe.backbone import load_tokenizer

        model = pretrained_dsl(backbone, load_tokenizer(backbone), d_tok=8)
    else:
        model = DSLModel(DSLConfig(vocab_size=40, d_tok=8, d_model=32, n_layers=2, n_heads=2), seed=0)
    data = torch.randint(0, model.cfg.vocab_size, (48, 12), generator=torch.Generator().manual_seed(0))
    settings = DSLTrainSettings(seq_len=12, train=TrainConfig(steps=6, batch_size=8, lr=3e-3, warmup=2, save_every=2,
                                                              eval_every=2, clip=0.5, precision="float32"))
    return model, data, settings


def train_dsl_problem(out: str, backbone: str | None, execution, world, stop_at: int = 0):
    """Train dsl_problem in `out` (resuming its checkpoint); stop_at > 0 makes every rank fail at
    that step, as a crash would. Returns what ran (None after the crash)."""
    from geoprobe.bridges.dsl import dsl_objective
    from geoprobe.bridges.train import train

    model, data, settings = dsl_problem(backbone)
    loss_fn, watch = dsl_objective(model, data, settings, torch.device("cpu"), stop_rows=data[:4],
                                   sharded=execution.fsdp)

    def crashing(m, generator, shard):
        if stop_at and generator.initial_seed() == stop_at:  # step_generator(seed 0, step) = step
            raise RuntimeError("simulated crash")
        return loss_fn(m, generator, shard)

    try:
        return train(model, crashing, settings.train, out=Path(out), device=torch.device("cpu"), world=world,
                     evaluate=watch, execution=execution)
    except RuntimeError as exc:
        if "simulated crash" not in str(exc):
            raise
        return None


def fsdp_worker(rank: int, world_size: int, port: int, out: str, backbone: str | None, stop_at: int,
                grad_accum: int = 1, fsdp: bool = True) -> None:
    """dsl_problem trained with --fsdp (or DDP) on every rank; rank 0 writes what ran to out/trained.pkl."""
    from geoprobe.bridges.parallel import Execution
    from geoprobe.distributed import world_from

    join(rank, world_size, port)
    try:
        trained = train_dsl_problem(out, backbone, Execution(fsdp=fsdp, grad_accum=grad_accum), world_from(),
                                    stop_at)
        if rank == 0 and trained is not None:
            (Path(out) / "trained.pkl").write_bytes(pickle.dumps(trained))
    except BaseException:
        traceback.print_exc()
        raise
    finally:
        dist.destroy_process_group()
