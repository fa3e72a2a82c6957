"""Masked refinement: MDLM ancestral sampling and the ReMDM remasking family.

State: every position is either a revealed token or the mask (s = 0). From time t to s < t,
with the schedule alpha (the probability that a position is revealed) and a remasking rate
sigma in [0, min(1, (1 - alpha_s) / alpha_t)] (ReMDM), each revealed position is remasked with
probability sigma and each masked position is revealed, its token drawn from the denoiser,
with probability (alpha_s - (1 - sigma) alpha_t) / (1 - alpha_t). sigma = 0 is MDLM.

* `mdlm`: log-linear schedule alpha(t) = 1 - t, no remasking;
* `remdm-cap`: sigma = min(eta_cap, sigma_max);
* `remdm-rescale`: sigma = eta * sigma_max;
* `remdm-conf`: per revealed position sigma = eta_i * sigma_max, eta = softmax over the revealed
  positions of minus the probability each token was drawn with (the least likely are remasked
  first); masked positions are revealed as in MDLM;
* `remdm-loop`: MDLM up to alpha_on at t_on, then alpha held at alpha_on while remasking at
  rate eta until t_off, then MDLM to the end.

The time grid is t_k = 1 - k (1 - t_min) / steps. By default t_min = 0: the last step reveals
every position. `final_argmax` ends as the MDLM/ReMDM code does: t_min = 1e-5, then one more
denoiser call gives every position still masked its argmax (steps + 1 evaluations).

remdm-loop at small T: the reference code picks each step's phase from t at the step's start
and, on the step that crosses t_on, moves alpha linearly past alpha_on (at T = 16 that step
reveals every position, and the loop then runs to the end without its last MDLM phase, leaving
about 8 % masked for the final argmax). Here alpha(t) is the continuous schedule, so alpha_s
on that step is alpha_on. The two agree at T = 128 and 1,024 except on the crossing steps
(tested); at T <= 16 they are different samplers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from geoprobe.device import upload
from geoprobe.samplers.base import MASK, CountingDenoiser, RevealState, Sampler

FINAL_T = 1e-5  # where the references' grid stops before their final argmax pass (their sampling eps)


def read_step(reveal: torch.Tensor, remask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the revealed positions (n, 2), the sequences revealed or remasked in) on the host, from
    one read of the device: a step's only one."""
    both = torch.cat([reveal, (reveal | remask).any(1, keepdim=True)], dim=1).cpu()
    return both[:, :-1].nonzero(), both[:, -1].nonzero().squeeze(1)


def sigma_max(alpha_s: float, alpha_t: float) -> float:
    return 1.0 if alpha_t <= 0 else min(1.0, (1.0 - alpha_s) / alpha_t)


def remdm_transition(alpha_s: float, alpha_t: float, sigma: float) -> tuple[float, float]:
    """(probability a revealed position is remasked, probability a masked one is revealed)."""
    if not 0 <= sigma <= sigma_max(alpha_s, alpha_t) + 1e-12:
        raise ValueError(f"sigma {sigma} outside [0, {sigma_max(alpha_s, alpha_t)}]")
    if alpha_t >= 1:
        return sigma, 1.0
    return sigma, (alpha_s - (1 - sigma) * alpha_t) / (1 - alpha_t)


@dataclass
class MDLM(Sampler):
    name = "mdlm"
    final_argmax: bool = False

    def alpha(self, t: float) -> float:
        return 1.0 - t

    def sigma(self, alpha_s: float, alpha_t: float, t: float) -> float:
        return 0.0

    def schedule(self, steps: int):
        """(alpha_t, alpha_s, t) of each step on the grid t_k = 1 - k (1 - t_min) / steps.

        A finisher that starts from a partially revealed state (the hybrid sampler) runs the
        same grid on the time rescaled to its start: with the log-linear schedule the reveal
        probability of step k is 1 / (steps - k) whatever that start."""
        span = 1.0 - (FINAL_T if self.final_argmax else 0.0)
        for k in range(steps):
            t, s = 1.0 - k * span / steps, 1.0 - (k + 1) * span / steps
            yield self.alpha(t), self.alpha(s), t

    def probabilities(self, state: RevealState, alpha_t: float, alpha_s: float, t: float):
        """(remask, reveal) probabilities of one step: scalars, or per position (remdm-conf)."""
        return remdm_transition(alpha_s, alpha_t, self.sigma(alpha_s, alpha_t, t))

    def transitions(self, steps: int):
        """(remask, reveal) probabilities of each step, for a sampler whose sigma is one number."""
        for alpha_t, alpha_s, t in self.schedule(steps):
            yield remdm_transition(alpha_s, alpha_t, self.sigma(alpha_s, alpha_t, t))

    def logit_rows(self, num: int, length: int) -> int:
        """The most positions one step reveals, planned: a position is revealed at step k with
        probability q_k = m_k r_k (m_k its chance to be still masked, r_k the step's reveal
        probability), independently of the others where sigma is one number, so a step's count is
        Binomial(num x length, q_k): its mean plus six standard deviations at the largest q_k, and
        the final argmax's still-masked share. remdm-conf plans as mdlm (its remasking, about one
        token a sequence a step, is left out)."""
        n, masked, largest = num * length, 1.0, 0.0
        for alpha_t, alpha_s, t in self.schedule(self.steps):
            remask, reveal = remdm_transition(alpha_s, alpha_t, self.sigma(alpha_s, alpha_t, t))
            largest = max(largest, masked * reveal)
            masked = masked * (1 - reveal) + (1 - masked) * remask
        if self.final_argmax:
            largest = max(largest, masked)
        mean = n * largest
        return min(n, math.ceil(mean + 6 * math.sqrt(mean * (1 - largest))) + 1)

    def refine(self, model: CountingDenoiser, state: RevealState, steps: int, generator: torch.Generator):
        """The schedule's steps from `state`. Each step draws its reveal and remask decisions
        before the network runs (the denoiser does not use the sampler's generator, so the draws
        are those of a step that ran it first) and reads them back once: the count of revealed
        positions is the shape of the Gumbel draw, and the sequences it changed are those the next
        call recomputes. The host never waits for the network."""
        changed = None  # the first call: every sequence
        for alpha_t, alpha_s, t in self.schedule(steps):
            remask_p, reveal_p = self.probabilities(state, alpha_t, alpha_s, t)
            masked = state.masked
            u = torch.rand(masked.shape, generator=generator, device=generator.device)
            reveal = masked & (u < reveal_p)
            remask = ~masked & (u < remask_p)
            where, touched = read_step(reveal, remask)
            model.evaluate(state.z(), changed)
            if len(where):
                rows, cols = upload(where, reveal.device).unbind(1)
                self.reveal(state, rows, cols, model.logits_at(rows, cols), generator)
            state.tokens.masked_fill_(remask, MASK)
            changed = touched
        if self.final_argmax:  # no call when nothing is left: NFE counts real work
            where, _ = read_step(state.masked, state.masked)
            if len(where):
                model.evaluate(state.z(), changed)
                rows, cols = upload(where, state.tokens.device).unbind(1)
                state.tokens[rows, cols] = model.logits_at(rows, cols).argmax(-1)
        return state.tokens

    def run(self, model, num, length, generator):
        state = RevealState(model.denoiser.token_table(), model.denoiser.s_max, num, length, generator)
        return self.refine(model, state, self.steps, generator)


@dataclass
class ReMDMCap(MDLM):
    name = "remdm-cap"
    eta_cap: float = 0.02

    def sigma(self, alpha_s, alpha_t, t):
        return min(self.eta_cap, sigma_max(alpha_s, alpha_t))


@dataclass
class ReMDMRescale(MDLM):
    name = "remdm-rescale"
    eta: float = 0.02

    def sigma(self, alpha_s, alpha_t, t):
        return self.eta * sigma_max(alpha_s, alpha_t)


@dataclass
class ReMDMConf(MDLM):
    name = "remdm-conf"

    def probabilities(self, state, alpha_t, alpha_s, t):
        revealed = ~state.masked
        score = torch.where(revealed, -state.probability, float("-inf"))
        # a row with nothing revealed is all -inf: its softmax is NaN, and it remasks nothing
        eta = torch.where(revealed, score.softmax(-1), 0.0).nan_to_num(0.0)
        return eta * sigma_max(alpha_s, alpha_t), remdm_transition(alpha_s, alpha_t, 0.0)[1]


@dataclass
class ReMDMLoop(MDLM):
    name = "remdm-loop"
    t_on: float = 0.55
    t_off: float = 0.05
    alpha_on: float = 0.9
    eta: float = 0.02

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
