"""Masked refinement: MDLM ancestral sampling and the ReMDM remasking family.

State: every position is either a revealed token or the mask (s = 0). From time t to s < t,
with the schedule alpha (the probability that a position is revealed) and a remasking rate
sigma in [0, min(1, (1 - alpha_s) / alpha_t)] (ReMDM), each revealed position is remasked with
probability sigma and each masked position is revealed, its token drawn from the denoiser,
with probability (alpha_s - (1 - sigma) alpha_t) / (1 - alpha_t). sigma = 0 is MDLM.

* `mdlm`: log-linear schedule alpha(t) = 1 - t, no remasking;
* `remdm-cap`: sigma = min(eta_cap, sigma_max);
* `remdm-rescale`: sigma = eta * sigma_max;
* `remdm-loop`: MDLM up to alpha_on at t_on, then alpha held at alpha_on while remasking at
  rate eta until t_off, then MDLM to the end.
"""

from __future__ import annotations

import torch

from geoprobe.errors import BadInput
from samplers.base import MASK, CountingDenoiser, RevealState, Sampler, check_flags


def sigma_max(alpha_s: float, alpha_t: float) -> float:
    return 1.0 if alpha_t <= 0 else min(1.0, (1.0 - alpha_s) / alpha_t)


def remdm_transition(alpha_s: float, alpha_t: float, sigma: float) -> tuple[float, float]:
    """(probability a revealed position is remasked, probability a masked one is revealed)."""
    if not 0 <= sigma <= sigma_max(alpha_s, alpha_t) + 1e-12:
        raise ValueError(f"sigma {sigma} outside [0, {sigma_max(alpha_s, alpha_t)}]")
    if alpha_t >= 1:
        return sigma, 1.0
    return sigma, (alpha_s - (1 - sigma) * alpha_t) / (1 - alpha_t)


class MDLM(Sampler):
    name = "mdlm"

    def alpha(self, t: float) -> float:
        return 1.0 - t

    def sigma(self, alpha_s: float, alpha_t: float, t: float) -> float:
        return 0.0

    def transitions(self, steps: int):
        """(remask, reveal) probabilities of each step on the grid t = 1 - k / steps.

        A finisher that starts from a partially revealed state (the hybrid sampler) runs the
        same grid on the time rescaled to its start: with the log-linear schedule the reveal
        probability of step k is 1 / (steps - k) whatever that start."""
        for k in range(steps):
            t, s = 1.0 - k / steps, 1.0 - (k + 1) / steps
            a_t, a_s = self.alpha(t), self.alpha(s)
            yield remdm_transition(a_s, a_t, self.sigma(a_s, a_t, t))

    def refine(self, model: CountingDenoiser, state: RevealState, steps: int, generator: torch.Generator):
        for remask_p, reveal_p in self.transitions(steps):
            logits = model(state.z())
            masked = state.masked
            u = torch.rand(masked.shape, generator=generator, device=generator.device)
            reveal = masked & (u < reveal_p)
            remask = ~masked & (u < remask_p)
            if reveal.any():
                state.tokens[reveal] = self.draw(logits[reveal], generator)
            state.tokens[remask] = MASK
        return state.tokens

    def run(self, model, num, length, generator):
        state = RevealState(model.denoiser.token_table(), model.denoiser.s_max, num, length, generator)
        return self.refine(model, state, self.steps, generator)


class ReMDMCap(MDLM):
    name = "remdm-cap"

    def __init__(self, steps: int = 64, top_p: float = 1.0, cache: bool = True, eta_cap: float = 0.02):
        super().__init__(steps, top_p, cache)
        check_flags(eta_cap=eta_cap)
        self.eta_cap = eta_cap

    def sigma(self, alpha_s, alpha_t, t):
        return min(self.eta_cap, sigma_max(alpha_s, alpha_t))


class ReMDMRescale(MDLM):
    name = "remdm-rescale"

    def __init__(self, steps: int = 64, top_p: float = 1.0, cache: bool = True, eta: float = 0.02):
        super().__init__(steps, top_p, cache)
        check_flags(eta=eta)
        self.eta = eta

    def sigma(self, alpha_s, alpha_t, t):
        return self.eta * sigma_max(alpha_s, alpha_t)


class ReMDMLoop(MDLM):
    name = "remdm-loop"

    def __init__(self, steps: int = 64, top_p: float = 1.0, cache: bool = True, t_on: float = 0.55,
                 t_off: float = 0.05, alpha_on: float = 0.9, eta: float = 0.02):
        super().__init__(steps, top_p, cache)
        check_flags(eta=eta)
        if not 0 < t_off < t_on < 1 or not 0 < alpha_on < 1:
            raise BadInput("remdm-loop needs 0 < t_off < t_on < 1 and 0 < alpha_on < 1")
        self.t_on, self.t_off, self.alpha_on, self.eta = t_on, t_off, alpha_on, eta

    def alpha(self, t):
        if t >= self.t_on:
            return self.alpha_on * (1 - t) / (1 - self.t_on)
        if t >= self.t_off:
            return self.alpha_on
        return self.alpha_on + (1 - self.alpha_on) * (self.t_off - t) / self.t_off

    def sigma(self, alpha_s, alpha_t, t):
        if self.t_off < t <= self.t_on:  # the loop: alpha constant, remask and reveal at rate eta
            return min(self.eta, sigma_max(alpha_s, alpha_t))
        return 0.0
