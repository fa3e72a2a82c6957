"""Forward hooks that copy the residual stream at chosen layers and stop the pass early.

Layer 0 is what the first block receives (embedding output, including model-specific
scaling or position embeddings); layer l >= 1 is the output of block l, before the final
norm. Hooks sit on the blocks themselves, so no architecture-specific code is needed, and
the forward pass is aborted right after the deepest requested layer: the upper blocks, the
final norm and the LM head never run.
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import torch


class _StopForward(Exception):
    """Raised inside a hook once every requested layer has been seen."""


def stream_arg(args, kwargs) -> torch.Tensor:
    """The residual-stream tensor a block receives (positional or keyword)."""
    return args[0] if args else kwargs["hidden_states"]


def _output_stream(output) -> torch.Tensor:
    # transformers 5.x blocks return a tensor; older ones (and some remote code) a tuple.
    return output[0] if isinstance(output, (tuple, list)) else output


@contextmanager
def layer_taps(blocks, layers):
    """Register hooks that store layer -> tensor in the yielded dict.

    The deepest requested layer raises `_StopForward`; callers run the model inside
    `run_until_stopped`.
    """
    wanted = sorted(set(layers))
    deepest = wanted[-1]
    seen: dict[int, torch.Tensor] = {}
    handles = []

    def store(layer, tensor):
        seen[layer] = tensor
        if layer == deepest:
            raise _StopForward

    if 0 in wanted:
        handles.append(blocks[0].register_forward_pre_hook(
            lambda module, args, kwargs: store(0, stream_arg(args, kwargs)), with_kwargs=True))
    for layer in wanted:
        if layer >= 1:
            handles.append(blocks[layer - 1].register_forward_hook(
                lambda module, args, output, layer=layer: store(layer, _output_stream(output))))
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()


def run_until_stopped(forward, *args, **kwargs) -> None:
    try:
        forward(*args, **kwargs)
    except _StopForward:
        return
    raise RuntimeError("the forward pass never reached the deepest requested layer")


@torch.no_grad()
def capture(backbone, input_ids, attention_mask=None, layers=(0,), position_ids=None):
    """Residual stream at `layers` for a batch: {layer: (B, L, d) tensor on its device}."""
    with layer_taps(backbone.blocks, layers) as seen:
        run_until_stopped(backbone.base, input_ids=input_ids, attention_mask=attention_mask,
                          position_ids=position_ids, use_cache=False)
    return seen


def select_positions(tokens: np.ndarray, special_ids: np.ndarray, skip_first: int, mode: str,
                     rng: np.random.Generator | None = None) -> np.ndarray:
    """Sorted positions of one sequence that become rows.

    Special tokens (BOS, padding, ...) and the first `skip_first` positions (the attention
    sink) are never selected; mode "all" keeps the rest, "random:K" draws K of them without
    replacement with `rng`.
    """
    eligible = np.flatnonzero(~np.isin(tokens, special_ids))
    eligible = eligible[eligible >= skip_first]
    if mode != "all":
        k = int(mode.split(":", 1)[1])
        if len(eligible) > k:
            eligible = np.sort(rng.choice(eligible, size=k, replace=False))
    return eligible
