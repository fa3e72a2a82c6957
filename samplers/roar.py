"""Random-order autoregressive sampling: a random permutation per sequence; each step reveals
the next `per_step` positions of the order, drawn from the denoiser given all revealed ones."""

from __future__ import annotations

import math

import torch

from geoprobe.errors import BadInput
from samplers.base import RevealState, Sampler, check_flags


class ROAR(Sampler):
    name = "roar"

    def __init__(self, steps: int | None = None, top_p: float = 1.0, cache: bool = True, per_step: int | None = None):
        super().__init__(steps or 1, top_p, cache)
        check_flags(per_step=per_step)
        self.requested_steps, self.per_step = steps, per_step

    def check(self, length: int) -> None:
        if self.requested_steps is not None and self.requested_steps > length:
            raise BadInput(f"roar reveals at least one token per step: --steps {self.requested_steps} "
                           f"exceeds --length {length}")

    def plan(self, length: int) -> int:
        """Tokens revealed per step: --per-step, else what --steps needs, else one."""
        if self.per_step is not None:
            return self.per_step
        if self.requested_steps is not None:
            return math.ceil(length / self.requested_steps)
        return 1

    def run(self, model, num, length, generator):
        k = self.plan(length)
        self.steps = math.ceil(length / k)
        state = RevealState(model.denoiser.token_table(), model.denoiser.s_max, num, length, generator)
        order = torch.rand(num, length, generator=generator, device=generator.device).argsort(dim=1)
        rows = torch.arange(num, device=state.tokens.device)[:, None]
        for start in range(0, length, k):
            logits = model(state.z())
            cols = order[:, start:start + k]
            state.tokens[rows, cols] = self.draw(logits[rows, cols], generator)
        return state.tokens
