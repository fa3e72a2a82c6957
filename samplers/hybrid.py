"""Hybrid: localize continuously up to a switch SNR, commit the tokens whose posterior is
confident, mask the rest, and finish them with a masked sampler (mdlm or a ReMDM variant).
`steps` is the whole budget: continuous steps + one call to commit + finishing steps."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from geoprobe.errors import BadInput
from geoprobe.samplers.base import RevealState, Sampler
from geoprobe.samplers.continuous import localize, snr_grid
from geoprobe.samplers.masked import MDLM


@dataclass
class Hybrid(Sampler):
    """`continuous_steps` None: half the budget; the finisher gets what the rest leaves."""

    name = "hybrid"
    steps: int = 48
    switch_snr: float = 5.0
    continuous_steps: int | None = None
    confidence: float = 0.9
    finisher: MDLM | None = None

    def __post_init__(self):
        super().__post_init__()
        if self.continuous_steps is None:
            self.continuous_steps = self.steps // 2
        if self.steps < 3 or not 1 <= self.continuous_steps <= self.steps - 2:
            raise BadInput(f"hybrid needs --steps >= 3 with 1 <= --continuous-steps <= steps - 2, got "
                           f"{self.steps} and {self.continuous_steps}")
        if self.finisher is None:
            self.finisher = MDLM(self.steps, self.top_p, self.top_p_rule, self.cache)

    def settings(self) -> dict:
        return {**super().settings(), "finisher": {**self.finisher.settings(), "steps": self.finishing_steps}}

    @property
    def finishing_steps(self) -> int:
        return self.steps - self.continuous_steps - 1

    def run(self, model, num, length, generator):
        table = model.denoiser.token_table()
        z = torch.zeros(num, length, table.shape[1], device=table.device, dtype=table.dtype)
        z = localize(model, z, snr_grid(self.continuous_steps, self.switch_snr), generator, table)
        logits = model(z)
        commit = logits.softmax(-1).max(-1).values >= self.confidence
        state = RevealState(table, model.denoiser.s_max, num, length, generator)
        rows, cols = commit.nonzero(as_tuple=True)  # once a sample: the committed positions
        if len(rows):  # drawn from the posterior, not its argmax, which would favour frequent tokens
            self.reveal(state, rows, cols, logits[rows, cols], generator)
        self.finisher.top_p, self.finisher.top_p_rule = self.top_p, self.top_p_rule
        return self.finisher.refine(model, state, self.finishing_steps, generator)
