"""The phase step of bench/gpu_check.sh: one process loads the 8B backbone once, then measures
where the GPU's time goes, phase by phase, each under its own deadline.

    python bench/gpu_phases.py OUT [--tiny] [--model ID] [--deadline SECONDS]

Phases, in order (the first four share the loaded backbone; it is freed before the DSL's):

* `load`: the backbone in bfloat16 from the local fixture, and the bf16 GEMM ceiling of this device.
* `forward`: the backbone's blocks over 8 x 2,048 tokens (no head, as the scan runs them) with
  the deterministic kernels on and off (geoprobe.device `deterministic_cuda`), alternated, best of 3.
* `roar`: `roar` through a default-shape bridge at layer 3 (random weights: speed does not depend on
  them) at --num 4, 16 and 64, 128 tokens; the calls split into bridge (the K-step reconstruction),
  blocks (the upper stack), head (the LM head and the channel's evidence at the drawn positions)
  and host (everything else: the draws, z, Python). --num 4 runs the whole sample; 16 and 64 stop
  after 64 and 24 denoiser calls (each call draws one token per sequence).
* `bridge_steps`: the library's training step (`_Run.update`: autocast, fused AdamW, EMA) of a
  default-shape bridge from cached teacher states: at 8 x 128 from the host pool and from the
  device pool (bridges/states.py), and at 64 x 512 from the device pool; tokens/s, and the step's
  FLOPs (torch.utils.flop_counter) against the GEMM ceiling.
* `dsl_step`: the 8B DSL (`--precision bfloat16`, 8 x 128), the step split into forward, backward,
  clipping, optimiser and EMA (`split_update`, the loop's `_Run.update` with a timer at each
  boundary), its CUDA peak against `dsl_training_bytes`' plan. A config-built model with the 8B's
  shapes and random weights; all 32 blocks where the plan fits the free memory (an H200), else 12
  (an H100: `TRUNCATED_BLOCKS`).
* `fsdp`: the same DSL step under `--fsdp` on one GPU (world size 1: torch's FSDP2 over a process
  group of one), the 8B's shapes with 2 blocks, `--precision auto` (bf16 compute, float32 master
  weights); its split and CUDA peak against the FSDP plan.
* `geometry`: one layer at N = 200,000 x 4,096 (bench/gpu_geometry.py's synthetic states), with
  the massive channels kept and dropped (`--drop-massive-channels`), split into its phases
  (massive rows, spectrum, duplicates, kNN, neighbourhoods, pairs, bootstrap, other).

On CUDA the splits are CUDA events around each region (GPU time between them, read once after a
synchronisation), and host (or other) is the wall-clock total less their sum; on a CPU they are
wall-clock timers. Each phase's figures go into OUT/phases.json as the phase ends (a run cut
short keeps the finished ones), with its status: ok, failed (the error), timed out, or skipped.
A phase that fails or runs out of time does not stop the others. The exit status is 0 when every
phase is ok. `--tiny`: the tiny fixture on the CPU, every size shrunk (seconds).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import sys
import tempfile
import time
import traceback
import warnings
from collections import defaultdict
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
TRUNCATED_BLOCKS = 12  # the 8B DSL's blocks where all 32 do not fit (an H100 80 GB)
FSDP_BLOCKS = 2
PHASES = ("load", "forward", "roar", "bridge_steps", "dsl_step", "fsdp", "geometry")
BUDGET = {"load": 90, "forward": 40, "roar": 90, "bridge_steps": 75, "dsl_step": 120, "fsdp": 60, "geometry": 60}
MARGIN = 10  # seconds kept for the teardown under the step's own timeout
DSL_SPLITS = ("forward", "backward", "clipping", "optimiser", "ema")


@dataclass(frozen=True)
class Shape:
    """Every size of one run: the GPU's, or --tiny's."""

    forward: tuple  # (batch, tokens)
    reps: int
    layer: int
    support: int  # ids of the converter's support (a corpus's distinct tokens)
    length: int  # roar's sample length
    calls: dict  # roar's denoiser calls timed, by --num
    bridge: tuple  # ((batch, seq, pool, steps), ...)
    dsl: tuple  # (batch, seq, steps)
    geometry: tuple  # (rows, d)
    gemm: int


GPU = Shape(forward=(8, 2048), reps=3, layer=3, support=10_000, length=128, calls={4: 128, 16: 64, 64: 24},
            bridge=((8, 128, 64, 20), (64, 512, 128, 8)), dsl=(8, 128, 5), geometry=(200_000, 4096), gemm=8192)
TINY = Shape(forward=(2, 64), reps=2, layer=2, support=200, length=8, calls={4: 8, 16: 4, 64: 2},
             bridge=((4, 16, 16, 3), (8, 32, 16, 2)), dsl=(4, 16, 2), geometry=(2000, 64), gemm=256)


# --- timing -------------------------------------------------------------------------------------


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Splits:
    """Named regions of one timed run: CUDA events around each on CUDA (read after one
    synchronisation), wall-clock timers on a CPU. Regions must not nest."""

    def __init__(self, device: torch.device):
        self.device, self.marks = device, defaultdict(list)

    @contextmanager
    def __call__(self, name: str):
        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            try:
                yield
            finally:
                end.record()
                self.marks[name].append((start, end))
        else:
            began = time.perf_counter()
            try:
                yield
            finally:
                self.marks[name].append(time.perf_counter() - began)

    def wrap(self, name: str, fn):
        def timed(*args, **kwargs):
            with self(name):
                return fn(*args, **kwargs)
        return timed

    def seconds(self, total: float, rest: str) -> dict:
        """{region: seconds} and `rest`: the total less their sum (never below 0)."""
        synchronize(self.device)
        found = {}
        for name, marks in self.marks.items():
            found[name] = sum(start.elapsed_time(end) / 1000 for start, end in marks) \
                if marks and isinstance(marks[0], tuple) else sum(marks)
        found[rest] = max(total - sum(found.values()), 0.0)
        return {name: round(value, 6) for name, value in found.items()}


def peak_gib(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def gemm_tflops(n: int, device: torch.device) -> float:
    """This device's matrix rate at n^3 (bf16 on CUDA, float32 on a CPU), best of 3 after a warm-up."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    a @ b
    best = float("inf")
    for _ in range(3):
        synchronize(device)
        began = time.perf_counter()
        for _ in range(5):
            a @ b
        synchronize(device)
        best = min(best, time.perf_counter() - began)
    return 5 * 2 * n ** 3 / best / 1e12


# --- the phases ---------------------------------------------------------------------------------


class Context:
    """What the phases share: the device, the shapes, the loaded backbone, the work folder."""

    def __init__(self, device: torch.device, shape: Shape, model: str, tiny: bool, work: Path):
        self.device, self.shape, self.model, self.tiny, self.work = device, shape, model, tiny, work
        self.backbone = None
        self.gemm = None
        self.rng = np.random.default_rng(0)

    def support(self) -> torch.Tensor:
        """A corpus-sized support: `shape.support` ids of the vocabulary, the start token among them."""
        vocab = self.backbone.config.vocab_size
        ids = self.rng.choice(vocab, size=min(self.shape.support, vocab), replace=False)
        return torch.from_numpy(np.unique(np.append(ids, self.bos()))).long()

    def bos(self) -> int:
        from geoprobe.tokens import start_token

        start = start_token(self.backbone.tokenizer, self.backbone.config)
        return 0 if start is None else start


def load_phase(ctx: Context, found: dict) -> None:
    from geoprobe.backbone import load_backbone

    began = time.perf_counter()
    ctx.backbone = load_backbone(ctx.model, device=str(ctx.device), dtype="float32" if ctx.tiny else "bfloat16")
    synchronize(ctx.device)
    found.update(load_seconds=round(time.perf_counter() - began, 2), layers=ctx.backbone.num_layers,
                 hidden_size=ctx.backbone.hidden_size, dtype=str(ctx.backbone.dtype).removeprefix("torch."))
    ctx.gemm = gemm_tflops(ctx.shape.gemm, ctx.device)
    found["gemm_tflops"] = round(ctx.gemm, 3)


@torch.no_grad()
def forward_phase(ctx: Context, found: dict) -> None:
    from geoprobe.device import deterministic_cuda

    batch, tokens = ctx.shape.forward
    ids = torch.randint(0, ctx.backbone.config.vocab_size, (batch, tokens)).to(ctx.device)
    blocks = ctx.backbone.model.base_model

    def once() -> float:
        synchronize(ctx.device)
        began = time.perf_counter()
        blocks(input_ids=ids, use_cache=False)
        synchronize(ctx.device)
        return time.perf_counter() - began

    best, warned = {True: float("inf"), False: float("inf")}, 0
    try:
        for rep in range(ctx.shape.reps + 1):  # the first round warms up
            for on in (True, False):
                deterministic_cuda(on)
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    seconds = once()
                warned += sum("deterministic" in str(w.message) for w in caught)
                if rep:
                    best[on] = min(best[on], seconds)
    finally:
        deterministic_cuda(False)  # training and sampling run without them (their default)
    found.update(tokens=batch * tokens, deterministic_seconds=round(best[True], 4),
                 nondeterministic_seconds=round(best[False], 4),
                 deterministic_tokens_per_second=round(batch * tokens / best[True], 1),
                 nondeterministic_tokens_per_second=round(batch * tokens / best[False], 1),
                 determinism_cost=round(best[True] / best[False], 4), nondeterministic_op_warnings=warned,
                 cublas_workspace_config=os.environ.get("CUBLAS_WORKSPACE_CONFIG"))


class Enough(Exception):
    """Raised at a denoiser call past the number timed: the sample stops there."""


@contextmanager
def instrumented(hybrid, splits: Splits, calls: int, counted: list):
    """The hybrid's bridge, upper blocks and head timed as `splits` regions; the `calls + 1`-th
    denoiser call raises Enough."""
    backbone = hybrid.teacher.backbone
    bridge = splits.wrap("bridge", hybrid.hidden)

    def hidden(*args, **kwargs):
        if counted[0] == calls:
            raise Enough
        counted[0] += 1
        return bridge(*args, **kwargs)

    hybrid.hidden = hidden
    backbone.final_from = splits.wrap("blocks", backbone.final_from)
    hybrid.logits_of = splits.wrap("head", hybrid.logits_of)
    try:
        yield
    finally:
        for owner, name in ((hybrid, "hidden"), (backbone, "final_from"), (hybrid, "logits_of")):
            owner.__dict__.pop(name, None)


def roar_once(hybrid, num: int, length: int, calls: int, device: torch.device) -> dict:
    from geoprobe.samplers import make_sampler

    splits, counted = Splits(device), [0]
    reset_peak(device)
    synchronize(device)
    began = time.perf_counter()
    with instrumented(hybrid, splits, calls, counted):
        try:
            make_sampler("roar").sample(hybrid, num, length)
        except Enough:
            pass
    synchronize(device)
    seconds = time.perf_counter() - began
    return {"num": num, "length": length, "calls": counted[0], "seconds": round(seconds, 4),
            "tokens_per_second": round(num * counted[0] / seconds, 2),
            "ms_per_call": round(1000 * seconds / max(counted[0], 1), 3),
            "splits_seconds": splits.seconds(seconds, "host"), "peak_allocated_gib": peak_gib(device)}


def default_bridge(ctx: Context, support: torch.Tensor):
    from geoprobe.bridges.hidden import BridgeConfig, HiddenBridge

    backbone = ctx.backbone
    cfg = BridgeConfig(layer=ctx.shape.layer, vocab_size=backbone.config.vocab_size,
                       hidden_size=backbone.hidden_size, support_size=len(support))
    bridge = HiddenBridge(cfg).to(ctx.device)
    bridge.set_support(support.to(ctx.device))
    return bridge


def roar_phase(ctx: Context, found: dict) -> None:
    from geoprobe.bridges.hidden import HybridDenoiser, Teacher

    bridge = default_bridge(ctx, ctx.support()).eval()
    hybrid = HybridDenoiser(bridge, Teacher(ctx.backbone, ctx.shape.layer), ctx.bos())
    found.update(layer=ctx.shape.layer, bridge_width=bridge.cfg.d_model, bridge_blocks=bridge.cfg.n_layers,
                 bridge_steps=bridge.cfg.bridge_steps, support=bridge.cfg.support_size, runs=[])
    for num, calls in ctx.shape.calls.items():
        roar_once(hybrid, num, ctx.shape.length, 1 if ctx.tiny else 2, ctx.device)  # warm-up: this batch's shapes
        found["runs"].append(roar_once(hybrid, num, ctx.shape.length, calls, ctx.device))


def blocks_of(ctx: Context, count: int, seq: int) -> list:
    """`count` blocks of `seq` tokens: the start token, then ids drawn from the support."""
    from geoprobe.corpus import Block

    support = ctx.support().numpy()
    return [Block(i, 0, np.append(ctx.bos(), ctx.rng.choice(support, size=seq - 1)).astype(np.int64))
            for i in range(count)]


def step_flops(model, loss_fn, device: torch.device) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    from geoprobe.bridges.train import Shard, mixed_precision, step_generator

    counter = FlopCounterMode(display=False)
    with counter, mixed_precision(device):
        loss_fn(model, step_generator(0, 0), Shard()).backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def fitted_bridge(ctx: Context, states):
    """A default-shape bridge over the states' own support, its statistics fitted from them."""
    from geoprobe.bridges.fit import fit_statistics

    bridge = default_bridge(ctx, torch.unique(torch.cat([states.train.ids, states.val.ids])))
    fit_statistics(bridge, states)
    return bridge


def bridge_run(ctx: Context, bridge, states, batch: int, seq: int, steps: int, pool: str) -> dict:
    """The library's bridge step at batch x seq from `states` (pooled on the device or not)."""
    from geoprobe.bridges.fit import training_loss
    from geoprobe.bridges.hidden import Teacher
    from geoprobe.bridges.parallel import Execution
    from geoprobe.bridges.train import Shard, TrainConfig, _Run
    from geoprobe.distributed import SINGLE

    loss_fn = training_loss(bridge, Teacher(ctx.backbone, ctx.shape.layer), states, batch)
    flops = step_flops(bridge, loss_fn, ctx.device)
    cfg = TrainConfig(steps=10**6, batch_size=batch, lr=1e-4, warmup=1, save_every=0)
    run = _Run.start(bridge, loss_fn, cfg, ctx.work, ctx.device, SINGLE, Execution())
    try:
        reset_peak(ctx.device)
        for step in range(2):  # warm-up
            run.update(step, Shard())
        synchronize(ctx.device)
        began = time.perf_counter()
        for step in range(2, steps + 2):
            run.update(step, Shard())
        synchronize(ctx.device)
        seconds = time.perf_counter() - began
    finally:
        run.close()
    rate = flops * steps / seconds / 1e12
    return {"pool": pool, "batch": batch, "seq": seq, "steps": steps, "support": bridge.cfg.support_size,
            "width": bridge.cfg.d_model, "blocks": bridge.cfg.n_layers, "seconds": round(seconds, 4),
            "tokens_per_second": round(steps * batch * seq / seconds, 1),
            "ms_per_step": round(1000 * seconds / steps, 3), "gflop_per_step": round(flops / 1e9, 2),
            "achieved_tflops": round(rate, 4), "gemm_fraction": round(rate / ctx.gemm, 5) if ctx.gemm else None,
            "peak_allocated_gib": peak_gib(ctx.device)}


def bridge_phase(ctx: Context, found: dict) -> None:
    from geoprobe.bridges.states import teacher_states

    found["runs"] = []
    for number, (batch, seq, pool, steps) in enumerate(ctx.shape.bridge):
        blocks = blocks_of(ctx, pool + 2, seq)
        states = teacher_states(ctx.backbone, blocks[:pool], [], blocks[pool:], [ctx.shape.layer])
        if number == 0:  # the host pool (each batch copied row by row, then uploaded) beside the device pool
            found["runs"].append(bridge_run(ctx, fitted_bridge(ctx, states), states, batch, seq, steps, "host"))
        bridge = fitted_bridge(ctx, states)  # from the host's states, as a sweep fits them
        for split in (states.train, states.stop, states.val):
            split.to_device(ctx.device)
        found["runs"].append(bridge_run(ctx, bridge, states, batch, seq, steps, "device"))
        del states, bridge


def split_update(run, step: int, shard, splits: Splits) -> torch.Tensor:
    """`_Run.update` (bridges/train.py) for one micro-batch, with `splits` regions at the
    boundaries of its forward, backward, clipping, optimiser and EMA: the same step (tested)."""
    from geoprobe.bridges.optim import update_ema
    from geoprobe.bridges.parallel import average_replicated, local, mixed_tensors
    from geoprobe.bridges.train import mixed_precision, round_generator, step_generator

    cfg, fsdp = run.cfg, run.execution.fsdp
    if run.execution.grad_accum != 1:
        raise ValueError("split_update times one micro-batch a step")
    autocast = nullcontext() if fsdp else mixed_precision(run.device, cfg.precision)
    run.optimizer.zero_grad(set_to_none=True)
    with splits("forward"), autocast:
        loss = run.step_loss(step_generator(cfg.seed, step), shard)
    with splits("backward"):
        loss.backward()
        if fsdp:
            average_replicated(run.model)
    with mixed_tensors() if fsdp else nullcontext():
        with splits("clipping"):
            torch.nn.utils.clip_grad_norm_(list(run.params.values()), cfg.clip)
        with splits("optimiser"):
            run.optimizer.step()
    run.scheduler.step()
    decay_now = min(cfg.ema, (1 + step) / (10 + step))
    with splits("ema"):
        update_ema({k: local(v) for k, v in run.ema.items()}, {k: local(p) for k, p in run.params.items()},
                   1 - decay_now, lambda device: round_generator(cfg.seed, step, device, "ema"))
    return loss.detach().float()


def eightb_config(ctx: Context, blocks: int | None = None):
    """The 8B's config (geoprobe.fixtures' published numbers; --tiny: the tiny fixture's), with
    `blocks` decoder blocks."""
    from geoprobe.fixtures import config_for

    config = config_for(ctx.model, ctx.tiny)
    if blocks is not None:
        config.num_hidden_layers = blocks
    return config


def dsl_plan(config, batch: int, seq: int, precision: str, cuda: bool, fsdp: bool = False) -> int:
    from geoprobe.memory import dsl_training_bytes

    mixed = cuda and precision != "float32"
    return dsl_training_bytes(config, d_tok=64, batch_size=batch, seq_len=seq, precision=precision if not fsdp else
                              "float32", ranks=1, fsdp=fsdp, mixed=mixed)


def dsl_blocks(config, free: int, batch: int, seq: int, cuda: bool = True) -> int:
    """All of the model's blocks where the 8B DSL's plan (--precision bfloat16) fits `free` bytes,
    else TRUNCATED_BLOCKS (an H100 80 GB holds 12 of the 8B's 32, an H200 all of them)."""
    full = config.num_hidden_layers
    if dsl_plan(config, batch, seq, "bfloat16", cuda) <= free or full <= TRUNCATED_BLOCKS:
        return full
    return TRUNCATED_BLOCKS


def random_dsl(config, precision: str):
    """A DSL over a causal LM of `config` whose LM weights are left for `randomise` (built on
    the host without initialising them, as loading a checkpoint does)."""
    from geoprobe.bridges.dsl import DSLConfig, DSLModel

    dtype = torch.bfloat16 if precision == "bfloat16" else torch.float32
    cfg = DSLConfig(vocab_size=config.vocab_size, d_tok=64, d_model=config.hidden_size,
                    n_layers=config.num_hidden_layers, n_heads=config.num_attention_heads, backbone=config.to_dict(),
                    bos_id=config.bos_token_id or 0)
    return DSLModel(cfg, dtype=dtype, lm_weights_follow=True)


@torch.no_grad()
def randomise(model, seed: int = 0) -> None:
    """The LM's weights where they now live (on the device, or this rank's shards): norms at 1,
    the rest N(0, 0.02^2), as the fixture draws them."""
    from geoprobe.bridges.parallel import local

    generator = None
    for name, p in model.lm.named_parameters():
        t = local(p)
        if t.numel() == 0:
            continue
        if generator is None:
            generator = torch.Generator(t.device).manual_seed(seed)
        t.fill_(1.0) if name.endswith("norm.weight") else t.normal_(0.0, 0.02, generator=generator)


def optimiser_bytes(run) -> int:
    """Bytes of this rank's trained weights, their gradients and AdamW's state tensors."""
    from geoprobe.bridges.parallel import local

    size = lambda t: local(t).numel() * local(t).element_size() if t is not None else 0
    params = list(run.params.values())
    state = [v for s in run.optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor) and v.dim()]
    return sum(size(p) + size(p.grad) for p in params) + sum(size(v) for v in state)


def dsl_run(ctx: Context, config, precision: str, fsdp: bool, found: dict) -> None:
    """Steps of the DSL over `config` at the shape's batch, timed and split, into `found`."""
    from geoprobe.bridges.dsl import DSLTrainSettings, dsl_objective
    from geoprobe.bridges.parallel import Execution, local
    from geoprobe.bridges.train import Shard, TrainConfig, _Run
    from geoprobe.distributed import SINGLE

    batch, seq, steps = ctx.shape.dsl
    cuda = ctx.device.type == "cuda"
    planned = dsl_plan(config, batch, seq, precision, cuda, fsdp)
    found.update(blocks=config.num_hidden_layers, vocab=config.vocab_size, batch=batch, seq=seq, precision=precision,
                 planned_gib=round(planned / 2**30, 3))
    began = time.perf_counter()
    model = random_dsl(config, precision)
    data = torch.randint(0, config.vocab_size, (4 * batch, seq), generator=torch.Generator().manual_seed(0))
    settings = DSLTrainSettings(seq_len=seq, train=TrainConfig(steps=10**6, batch_size=batch, lr=1e-4, warmup=1,
                                                               save_every=0, precision=precision))
    reset_peak(ctx.device)
    loss_fn, _ = dsl_objective(model, data, settings, ctx.device, sharded=fsdp)
    run = _Run.start(model, loss_fn, settings.train, ctx.work, ctx.device, SINGLE, Execution(fsdp=fsdp))
    randomise(model)  # where the weights now are (the device; under FSDP, this rank's shards), then the EMA's copy
    with torch.no_grad():
        for key, value in run.ema.items():
            local(value).copy_(local(run.params[key]))
    found.update(parameters=sum(p.numel() for p in model.parameters()),
                 build_seconds=round(time.perf_counter() - began, 2))
    try:
        split_update(run, 0, Shard(), Splits(ctx.device))  # warm-up: the optimiser's state, the kernels
        splits = Splits(ctx.device)
        synchronize(ctx.device)
        began = time.perf_counter()
        for step in range(1, steps + 1):
            loss = split_update(run, step, Shard(), splits)
        synchronize(ctx.device)
        seconds = time.perf_counter() - began
        found.update(steps=steps, seconds=round(seconds, 4), steps_per_second=round(steps / seconds, 4),
                     tokens_per_second=round(steps * batch * seq / seconds, 1), loss=float(loss),
                     splits_seconds=splits.seconds(seconds, "host"), peak_allocated_gib=peak_gib(ctx.device))
        # what AdamW reads at least once a step: this rank's weights, gradients and moments
        held = optimiser_bytes(run)
        optimiser = max(found["splits_seconds"]["optimiser"], 1e-9)
        found.update(optimiser_state_gib=round(held / 2**30, 3),
                     optimiser_gb_per_second=round(held * steps / optimiser / 1e9, 2))
        if found["peak_allocated_gib"] is not None:
            found["peak_over_plan"] = round(found["peak_allocated_gib"] / found["planned_gib"], 4)
    finally:
        run.close()


def dsl_phase(ctx: Context, found: dict) -> None:
    from geoprobe.memory import memory_available

    batch, seq, _ = ctx.shape.dsl
    full = eightb_config(ctx)
    free = memory_available(ctx.device)
    found["free_gib"] = round(free / 2**30, 2)
    blocks = dsl_blocks(full, free, batch, seq, ctx.device.type == "cuda")
    found["truncated"] = blocks < full.num_hidden_layers
    dsl_run(ctx, eightb_config(ctx, blocks), "bfloat16", False, found)


def fsdp_phase(ctx: Context, found: dict) -> None:
    import torch.distributed as dist

    try:
        dsl_run(ctx, eightb_config(ctx, FSDP_BLOCKS), "auto", True, found)
        found["world_size"] = dist.get_world_size()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


GEOMETRY_PARTS = {"_without_massive_states": "massive_rows", "_centred_spectrum": "spectrum",
                  "_distinct_reference": "duplicates", "knn_candidates": "knn",
                  "_neighbourhood_lambda_shared": "neighbourhoods", "_pair_monotonicity": "pairs",
                  "_bootstrap": "bootstrap"}


@contextmanager
def geometry_split(splits: Splits):
    """geoprobe.geometry's phases timed as `splits` regions (its module functions wrapped)."""
    import geoprobe.geometry as geometry

    saved = {name: getattr(geometry, name) for name in GEOMETRY_PARTS}
    for name, part in GEOMETRY_PARTS.items():
        setattr(geometry, name, splits.wrap(part, saved[name]))
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(geometry, name, fn)


def geometry_phase(ctx: Context, found: dict) -> None:
    from dataclasses import replace

    from gpu_geometry import states

    from geoprobe.geometry import GeometrySettings, bootstrap_counts, layer_geometry, peak_bytes

    n, d = ctx.shape.geometry
    base = GeometrySettings(anchors=128, pairs=512, bootstrap=20) if ctx.tiny else GeometrySettings()
    x = states(n, d, ctx.device, torch.Generator(ctx.device).manual_seed(0))
    docs = torch.arange(n, device=ctx.device) // 32
    counts = torch.from_numpy(bootstrap_counts(n // 32 + (n % 32 > 0), base.bootstrap, 0)).to(ctx.device)
    found.update(rows=n, d=d, runs=[])
    for drop in (False, True):
        settings = replace(base, drop_massive_channels=drop)
        warm = min(n, 4096) // 2
        layer_geometry(x[:warm].clone(), docs[:warm], settings, counts[:, : int(docs[warm - 1]) + 1])
        splits = Splits(ctx.device)
        reset_peak(ctx.device)
        before = torch.cuda.memory_allocated(ctx.device) if ctx.device.type == "cuda" else 0
        synchronize(ctx.device)
        began = time.perf_counter()
        with geometry_split(splits):
            result = layer_geometry(x, docs, settings, counts)
        synchronize(ctx.device)
        seconds = time.perf_counter() - began
        planned = peak_bytes(n, d, settings) - 4 * n * d  # the layer itself is already allocated
        run = {"drop_massive_channels": drop, "seconds": round(seconds, 4),
               "splits_seconds": splits.seconds(seconds, "other"),
               "massive_channels": len(result["massive_channels"]), "channels_used": result["channels_used"],
               "planned_gib": round(planned / 2**30, 3)}
        if ctx.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(ctx.device) - before
            run.update(peak_allocated_gib=round(peak / 2**30, 3), peak_over_plan=round(peak / planned, 4))
        found["runs"].append(run)


RUNNERS = {"load": load_phase, "forward": forward_phase, "roar": roar_phase, "bridge_steps": bridge_phase,
           "dsl_step": dsl_phase, "fsdp": fsdp_phase, "geometry": geometry_phase}
NEEDS_BACKBONE = ("forward", "roar", "bridge_steps")


# --- running them -------------------------------------------------------------------------------


class PhaseTimeout(Exception):
    """A phase ran past its deadline (SIGALRM)."""


def _alarm(signum, frame):
    raise PhaseTimeout


def run_phase(record: dict, path: Path, name: str, runner, budget: float, left: float, device=None) -> dict:
    """Run `runner(found)` under min(budget, left) seconds; record its figures (those it put
    into `found` before failing too) and status in `record["phases"][name]`, and write `path`."""
    found, limit = {}, min(budget, left)
    if limit < 1:
        status, seconds = "skipped (deadline)", 0.0
    else:
        previous = signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, limit)
        began = time.perf_counter()
        try:
            runner(found)
            status = "ok"
        except PhaseTimeout:
            status = f"timed out after {limit:.0f} s"
        except Exception as exc:  # noqa: BLE001 -- recorded, and the next phase runs
            status = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:400]
            print(f"== phase {name}: {status}", file=sys.stderr)
            traceback.print_exc(file=sys.stderr)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        seconds = time.perf_counter() - began
    record["phases"][name] = {"status": status, "wall_seconds": round(seconds, 2), "budget_seconds": round(limit, 1),
                              **found}
    gc.collect()
    if device is not None and device.type == "cuda":
        torch.cuda.empty_cache()
    write(record, path)
    print(f"phase {name:13s} {status:40s} {seconds:7.1f} s", flush=True)
    return record["phases"][name]


def write(record: dict, path: Path) -> None:
    from geoprobe.files import write_json_atomic

    record["figures"] = headline(record["phases"])
    write_json_atomic(path, record)


def headline(phases: dict) -> dict:
    """The flat figures bench/gpu_figures.py adds to gpu_check.json (phases.json holds the rest)."""
    found = {}
    get = lambda name: phases.get(name, {})
    if "gemm_tflops" in get("load"):
        found["phases_gemm_tflops"] = get("load")["gemm_tflops"]
    if "determinism_cost" in get("forward"):
        forward = get("forward")
        found.update(forward_deterministic_tokens_per_second=forward["deterministic_tokens_per_second"],
                     forward_nondeterministic_tokens_per_second=forward["nondeterministic_tokens_per_second"],
                     forward_determinism_cost=forward["determinism_cost"])
    for run in get("roar").get("runs", []):
        found[f"roar_num{run['num']}_tokens_per_second"] = run["tokens_per_second"]
    for run in get("bridge_steps").get("runs", []):
        key = f"bridge_{run['pool']}_{run['batch']}x{run['seq']}"
        found[f"{key}_tokens_per_second"] = run["tokens_per_second"]
        found[f"{key}_gemm_fraction"] = run["gemm_fraction"]
    for name in ("dsl_step", "fsdp"):
        phase = get(name)
        if "steps_per_second" in phase:
            found.update({f"{name}_blocks": phase["blocks"], f"{name}_steps_per_second": phase["steps_per_second"],
                          f"{name}_peak_over_plan": phase.get("peak_over_plan")})
    for run in get("geometry").get("runs", []):
        key = "drop" if run["drop_massive_channels"] else "keep"
        found[f"geometry_{key}_channels_seconds"] = run["seconds"]
        if "peak_over_plan" in run:
            found["geometry_peak_over_plan"] = max(found.get("geometry_peak_over_plan", 0), run["peak_over_plan"])
    found["phases_ok"] = sum(p.get("status") == "ok" for p in phases.values())
    return found


def arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the folder phases.json is written into")
    parser.add_argument("--tiny", action="store_true", help="the tiny fixture on the CPU, every size shrunk")
    parser.add_argument("--model", default=MODEL, help="the backbone (a fixture in HF_HOME)")
    parser.add_argument("--deadline", type=float, default=float(os.environ.get("GPU_CHECK_LIMIT", 0)) or None,
                        help="seconds for every phase together (default: bench/gpu_check.sh's step timeout)")
    parser.add_argument("--only", help="comma-separated phases to run (default: all)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = arguments(argv)
    # as a deterministic scan sets it, before any CUDA work: the same cuBLAS workspace both ways
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    from geoprobe.backbone import resolve_device
    from geoprobe.device import choose_determinism

    choose_determinism(False)
    # cuda:0, not cuda: bridges/parallel.py's join_group (FSDP in one process) needs the index
    device = resolve_device("cpu" if args.tiny or not torch.cuda.is_available() else "cuda:0")
    shape = TINY if args.tiny else GPU
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "phases.json"
    record = {"tiny": args.tiny, "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "model": args.model, "phases": {}}
    chosen = PHASES if args.only is None else tuple(args.only.split(","))
    deadline = time.perf_counter() + (args.deadline - MARGIN if args.deadline else float("inf"))
    with tempfile.TemporaryDirectory(prefix="geoprobe-phases-") as work:
        ctx = Context(device, shape, args.model, args.tiny, Path(work))
        for name in PHASES:
            if name not in chosen:
                continue
            if name in NEEDS_BACKBONE and ctx.backbone is None:
                record["phases"][name] = {"status": "skipped (needs load)", "wall_seconds": 0}
                write(record, path)
                continue
            if name == "dsl_step":  # the backbone's 16 GB go before the DSL's training state comes
                ctx.backbone = None
                gc.collect()
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            run_phase(record, path, name, lambda found, name=name: RUNNERS[name](ctx, found), BUDGET[name],
                      deadline - time.perf_counter(), device)
    return 0 if all(p["status"] == "ok" for p in record["phases"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
