"""Hybrid: localize continuously up to a switch SNR, commit the tokens whose posterior is
confident, mask the rest, and finish them with a masked sampler (mdlm or a ReMDM variant).
`steps` is the whole budget: continuous steps + one call to commit + finishing steps."""

from __future__ import annotations

import torch

from geoprobe.errors import BadInput
from samplers.base import RevealState, Sampler, check_flags
from samplers.continuous import localize, snr_grid
from samplers.masked import MDLM


class Hybrid(Sampler):
    name = "hybrid"

    def __init__(self, steps: int = 48, top_p: float = 1.0, cache: bool = True, switch_snr: float = 5.0,
                 continuous_steps: int | None = None, confidence: float = 0.9, finisher: MDLM | None = None):
        super().__init__(steps, top_p, cache)
        self.continuous_steps = continuous_steps if continuous_steps is not None else steps // 2
        if steps < 3 or not 1 <= self.continuous_steps <= steps - 2:
            raise BadInput(f"hybrid needs --steps >= 3 with 1 <= continuous steps <= steps - 2, got {steps}")
        check_flags(switch_snr=switch_snr)
        if not 0 < confidence <= 1:
            raise BadInput(f"hybrid needs a confidence in (0, 1], got {confidence}")
        self.switch_snr, self.confidence = switch_snr, confidence
        self.finisher = finisher or MDLM(steps, top_p, cache)

    def settings(self) -> dict:
        return {**super().settings(), "finisher": self.finisher.name}

    def run(self, model, num, length, generator):
        table = model.denoiser.token_table()
        z = torch.zeros(num, length, table.shape[1], device=table.device, dtype=table.dtype)
        z = localize(model, z, snr_grid(self.continuous_steps, self.switch_snr), generator, table)
        logits = model(z)
        commit = logits.softmax(-1).max(-1).values >= self.confidence
        state = RevealState(table, model.denoiser.s_max, num, length, generator)
        if commit.any():  # drawn from the posterior, not its argmax, which would favour frequent tokens
            state.tokens[commit] = self.draw(logits[commit], generator)
        finishing = self.steps - self.continuous_steps - 1
        self.finisher.top_p = self.top_p
        return self.finisher.refine(model, state, finishing, generator)
