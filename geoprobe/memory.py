"""What fits where: a model's parameter count from its config alone, the memory free on a
device, and the dtype a model can be loaded in there (checked before any weight is read).

The backbone loader and the scan planner both use it; it imports neither.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from geoprobe.device import Precision
from geoprobe.errors import BadInput
from geoprobe.events import note
from geoprobe.files import human


def empty_model(config):
    """The model of `config` with meta-device weights: shapes and counts, no memory."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights():
        return AutoModelForCausalLM.from_config(config)


def parameter_count(config) -> int:
    return sum(p.numel() for p in empty_model(config).parameters())


# psutil's available RAM starts small and grows on some VMs: this many GiB is taken instead
HOST_MEMORY_OVERRIDE = "GEOPROBE_HOST_MEMORY_GIB"


def memory_available(device: torch.device) -> int:
    """Free GPU memory, or the RAM available on a CPU (GEOPROBE_HOST_MEMORY_GIB when set)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    override = os.environ.get(HOST_MEMORY_OVERRIDE)
    if override:
        try:
            return int(float(override) * 2**30)
        except ValueError:
            raise BadInput(f"{HOST_MEMORY_OVERRIDE}={override!r} is not a number of GiB") from None
    import psutil

    return psutil.virtual_memory().available


def host_override_hint() -> str:
    """The end of a refusal over host RAM: how to say the RAM is there when psutil undercounts it."""
    return f" ({HOST_MEMORY_OVERRIDE}=<GiB> overrides this figure)"


def working_bytes(config, width: int, batch_size: int, seq_len: int) -> int:
    """One forward batch: the residual stream, one block's attention scores and MLP."""
    d, heads = config.hidden_size, config.num_attention_heads
    intermediate = getattr(config, "intermediate_size", None) or 4 * d
    tokens = batch_size * seq_len
    return tokens * d * width * 2 + batch_size * heads * seq_len ** 2 * width + tokens * 2 * intermediate * width


DSL_BYTES_PER_PARAMETER = {"float32": 20, "bfloat16": 14}  # weights, gradients, AdamW's moments (float32), EMA
WHOLE_UNIT_BYTES = 8  # an FSDP unit held whole: its weights and their gradient before the reduce-scatter
DDP_BUCKET_BYTES = 4  # DistributedDataParallel's gradient buckets: a float32 copy of every gradient


def dsl_training_bytes(config, *, d_tok: int, batch_size: int, seq_len: int, parameters: int | None = None,
                       precision: str = "float32", ranks: int = 1, fsdp: bool = False, checkpointing: bool = False,
                       mixed: bool = False) -> int:
    """Device memory per rank of `dsl train --init-from` a causal LM of `config` (bridges/train.py's
    loop), `batch_size` the sequences one rank computes at once (a micro-batch under --grad-accum).
    Per parameter of the LM (its input embedding becomes the DSL's own, as large): 20 bytes in
    float32 (weights, gradients, AdamW's two moments, the EMA copy), 14 with bfloat16 weights,
    gradients and EMA beside float32 moments (geoprobe.bridges.optim); the d_tok-wide token table always
    20 (the plateau rule's best weights, and the live ones while the EMA's are scored, wait on the
    host). Then the activations backward keeps (twice each block's working set at the weights'
    width, the prepended BOS position included) and the
    vocabulary-wide tensors per token: four float32 ones (the converter's posterior and its
    gradient, the logits and theirs), and with bfloat16 weights five bfloat16 ones (the posterior
    cast for the embedding product and its gradient, the network's logits and their gradient,
    and one temporary of the head's backward); and bfloat16's optimiser step holds float32
    temporaries of three times its largest parameter (vocabulary x width), 12 bytes each.
    Measured on a pretend device (tests/test_device.py). `parameters`: the LM's count when the
    caller has it (counting builds an empty model).

    `ranks` > 1 without `fsdp` is DDP: every rank holds all of the above and DDP's gradient
    buckets (4 more bytes per parameter). With `fsdp` (bridges/parallel.py) each rank holds 1/ranks
    of the 20 bytes, plus the units held whole at once (`WHOLE_UNIT_BYTES` per parameter): the root
    (embedding matrix and head) and two blocks (the one computing and the next, gathered ahead);
    `mixed` (bf16 compute on CUDA) puts activations and the head's logits in bfloat16.
    `checkpointing` keeps one input per block and one block's working set for its recompute."""
    held = Precision.parse(precision).weights  # what the weights are held in: "float32" or "bfloat16"
    bf16 = held == "bfloat16"
    vocab = config.vocab_size
    lm = parameters or parameter_count(config)
    width = 2 if bf16 or (fsdp and mixed) else 4
    activations = _activation_bytes(config, width, batch_size, seq_len + 1, checkpointing)
    if fsdp:
        root = 2 * vocab * config.hidden_size  # the embedding matrix and the untied head
        block = max(0, lm - root) / config.num_hidden_layers
        wide = (4 * 4 + (2 * 2 if mixed else 0)) * batch_size * seq_len * vocab
        whole = WHOLE_UNIT_BYTES * (root + 2 * block)
        return int(20 * lm / ranks + 20 * vocab * d_tok + whole + activations + wide)
    weights = DSL_BYTES_PER_PARAMETER[held] * lm + 20 * vocab * d_tok
    wide = (4 * 4 + (5 * 2 if bf16 else 0)) * batch_size * seq_len * vocab
    step = 12 * vocab * config.hidden_size if bf16 else 0
    buckets = DDP_BUCKET_BYTES * lm if ranks > 1 else 0
    return weights + activations + wide + step + buckets


def _activation_bytes(config, width: int, batch_size: int, positions: int, checkpointing: bool) -> int:
    """What backward keeps of the blocks: twice each block's working set, or with activation
    checkpointing each block's input and one block's working set twice (its recompute)."""
    if checkpointing:
        inputs = config.num_hidden_layers * batch_size * positions * config.hidden_size * width
        return inputs + 2 * working_bytes(config, width, batch_size, positions)
    return 2 * config.num_hidden_layers * working_bytes(config, width, batch_size, positions)


def fewest_ranks(need: Callable[[int, int, bool], int], free: int, batch_size: int, grad_accum: int = 1,
                 checkpointing: bool = False, most: int = 4096) -> tuple[int, bool] | None:
    """(ranks, activation checkpointing) of the FSDP layout with the fewest ranks that fits `free`
    bytes per rank, activation checkpointing only where that count needs it: `need(ranks, per-rank
    micro-batch, checkpointing)` is the plan, and the ranks must divide the global batch with the
    accumulation (so that the run is accepted as advised). None when none up to `most` ranks fits."""
    for n in range(1, most + 1):
        if batch_size % (n * grad_accum):
            continue
        for ckpt in (checkpointing,) if checkpointing else (False, True):
            if need(n, batch_size // (n * grad_accum), ckpt) <= free:
                return n, ckpt
    return None


def load_dtype(config, dtype: torch.dtype, requested: str, device: torch.device, batch_size: int = 8,
               seq_len: int = 512) -> torch.dtype:
    """The dtype to load a model in on `device` (the CPU or one GPU), checked before any weight is
    read: `dtype` when the weights and one batch fit its free memory; bfloat16 when `requested` is
    auto and only bfloat16 fits (said in one line); otherwise a one-line refusal naming what
    would fit."""
    count, available = parameter_count(config), memory_available(device)
    memory = "RAM" if device.type == "cpu" else f"free memory on {device}"
    spread = ("--device-map auto (offloads layers to disk)" if device.type == "cpu"
              else "--device-map auto (spreads the layers over the GPUs)")

    def need(d: torch.dtype) -> int:
        width = torch.finfo(d).bits // 8
        return count * width + working_bytes(config, width, batch_size, seq_len)

    if need(dtype) <= available:
        return dtype
    if requested == "auto" and dtype == torch.float32 and need(torch.bfloat16) <= available:
        note(f"note: float32 weights and one batch need {human(need(dtype))}, {human(available)} of {memory} is "
            f"available: loading in bfloat16 ({human(need(torch.bfloat16))}); --dtype float32 insists")
        return torch.bfloat16
    smaller = " --dtype bfloat16," if dtype == torch.float32 and need(torch.bfloat16) <= available else ""
    raise BadInput(f"the model ({count:,} parameters) and one batch need {human(need(dtype))} of {memory} in "
                   f"{str(dtype).removeprefix('torch.')} but only {human(available)} is available; use{smaller} "
                   f"{spread}, or a smaller --batch-size"
                   + (host_override_hint() if device.type == "cpu" else ""))
