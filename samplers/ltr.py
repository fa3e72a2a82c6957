"""Left-to-right decoding through a bridge (`ltr`): one token a step, each from the frozen upper
stack over the bridge's reconstruction of the prefix, drawn as the `ar` row draws: EOS, the
unknown token and untrained rows never (a fixed-length sample has no end), then the nucleus
filter of every sampler. It needs more than the TokenDenoiser protocol: a denoiser that
decodes left to right (`left_to_right`, the bridge's hybrid: bridges/decode.py), so
bridges/kinds.py lists it for bridges only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from geoprobe.errors import BadInput
from geoprobe.samplers.base import Sampler


class LeftToRightDecoding(Protocol):
    tokens: torch.Tensor  # (B, n): the tokens appended so far
    unsampled: torch.Tensor  # ids never drawn (EOS, the unknown token, untrained rows), as the ar row

    def logits(self) -> torch.Tensor: ...  # (B, V): the next token's

    def append(self, tokens: torch.Tensor) -> None: ...  # (B,)


@dataclass
class LeftToRight(Sampler):
    """`steps` None: one per token (the only budget it has; --steps, where given, must be --length)."""

    name = "ltr"
    steps: int | None = None

    def check(self, length: int) -> None:
        if self.steps is not None and self.steps != length:
            raise BadInput(f"ltr draws one token per step: --steps {self.steps} must equal --length {length} "
                           "or be left out")

    def settings(self) -> dict:
        return {**super().settings(), "steps": getattr(self, "_steps_run", self.steps)}

    def logit_rows(self, num: int, length: int) -> int:
        return num  # the next token's logits of each sequence

    def seed_denoiser(self, denoiser, seed: int) -> None:
        """Nothing: the decoding seeds its bridge's noise from the sampler's generator itself
        (bridges/decode.py)."""

    def run(self, model, num, length, generator):
        decode = getattr(model.denoiser, "left_to_right", None)
        if decode is None:
            raise BadInput("--sampler ltr decodes through a bridge's upper stack; this model has none")
        decoding: LeftToRightDecoding = decode(num, length, generator)
        for _ in range(length):  # the ar row's order: the suppressed ids first, then the nucleus filter
            logits = decoding.logits()
            decoding.append(self.draw(logits.index_fill(-1, decoding.unsampled.to(logits.device), float("-inf")),
                                      generator))
            model.nfe += 1  # one pass of the bridge (its K steps) and the upper stack per token
            model.rows += num
        self._steps_run = length
        return decoding.tokens
