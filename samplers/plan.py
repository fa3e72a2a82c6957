"""A sampler step's logits memory, planned before the first denoiser call.

The head runs where a step draws a token (`CountingDenoiser.logits_at`): roar's `per_step`
positions a sequence, the positions a masked sampler reveals, every position where a step reads
the whole posterior (the continuous phase, the hybrid's commit) or where the denoiser has no
separate head. Each such position holds V logits through the draw: the head's output (at most
4 bytes), the float32 logits, and the larger of the nucleus filter's working set (sorted values,
their int64 order, probabilities and cumulative sums) and the float64 Gumbel noise beside the
float64 logits. `LOGIT_BYTES` is that sum, an estimate from the tensors the step keeps alive.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from geoprobe.errors import BadInput
from geoprobe.files import human
from geoprobe.memory import host_override_hint, memory_available

LOGIT_BYTES = 36  # head output 4 + float32 logits 4 + max(nucleus 28, Gumbel 16 + 8) per position and token


def logits_bytes(positions: int, vocab: int) -> int:
    """The peak bytes of one step's logits at `positions` positions of a `vocab`-token vocabulary."""
    return positions * vocab * LOGIT_BYTES


def check_logits_room(positions: Callable[[int], int], num: int, vocab: int, device: torch.device,
                      batched: bool = False) -> None:
    """Refuse, in one line naming a --batch that fits, a step whose logits exceed what `device` has free.

    Args:
        positions: samples drawn together -> the most positions one step applies the head to.
        num: the samples drawn together (--num, or --batch where `batched`).
        vocab: the denoiser's vocabulary.
        device: where the logits live (a CPU: its available RAM, GEOPROBE_HOST_MEMORY_GIB where set).
        batched: whether `num` is a --batch (the message names that flag).
    """
    need, free = logits_bytes(positions(num), vocab), memory_available(torch.device(device))
    if need <= free:
        return
    fits = _largest_num(lambda n: logits_bytes(positions(n), vocab) <= free, num - 1)
    advice = f"use --batch {fits} or fewer" if fits else (
        f"even one sample needs {human(logits_bytes(positions(1), vocab))}: use a shorter --length")
    hint = host_override_hint() if torch.device(device).type == "cpu" else ""
    flag = "--batch" if batched else "--num"
    raise BadInput(f"sampling needs about {human(need)} of logits a step at {flag} {num} "
                   f"({positions(num):,} positions x "
                   f"{vocab:,} tokens x {LOGIT_BYTES} bytes) and {torch.device(device).type} has {human(free)} free: "
                   f"{advice}{hint}")


def _largest_num(fits: Callable[[int], bool], most: int) -> int:
    """The largest n in 1..most with fits(n) (fits decreasing in n), or 0 when none."""
    low, high = 0, most
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    return low
