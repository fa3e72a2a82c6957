"""Random-order autoregressive sampling: a random permutation per sequence; each step reveals
the next `per_step` positions of the order, drawn from the denoiser given all revealed ones."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from geoprobe.errors import BadInput
from geoprobe.samplers.base import RevealState, Sampler


@dataclass
class ROAR(Sampler):
    """`steps` None: one token per step (or `per_step`); the steps run are in the sample's settings."""

    name = "roar"
    steps: int | None = None
    per_step: int | None = None

    def check(self, length: int) -> None:
        if self.steps is not None and self.steps > length:
            raise BadInput(f"roar reveals at least one token per step: --steps {self.steps} exceeds --length {length}")

    def plan(self, length: int) -> int:
        """Tokens revealed per step: --per-step, else what --steps needs, else one."""
        if self.per_step is not None:
            return self.per_step
        if self.steps is not None:
            return math.ceil(length / self.steps)
        return 1

    def settings(self) -> dict:
        return {**super().settings(), "steps": getattr(self, "_steps_run", self.steps)}

    def logit_rows(self, num: int, length: int) -> int:
        return num * min(length, self.plan(length))

    def run(self, model, num, length, generator):
        """Each step changes every sequence, so every call runs on all rows, and the head runs on
        the `k` positions a sequence draws: the step reads nothing back from the device."""
        k = self.plan(length)
        self._steps_run = math.ceil(length / k)
        state = RevealState(model.denoiser.token_table(), model.denoiser.s_max, num, length, generator)
        order = torch.rand(num, length, generator=generator, device=generator.device).argsort(dim=1)
        rows = torch.arange(num, device=state.tokens.device)[:, None]
        for start in range(0, length, k):
            model.evaluate(state.z())
            cols = order[:, start:start + k]
            at = rows.expand_as(cols)
            logits = model.logits_at(at.flatten(), cols.flatten())
            state.tokens[at, cols] = self.draw(logits, generator).view(cols.shape)
        return state.tokens
