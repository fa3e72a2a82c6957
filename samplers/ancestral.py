"""Ancestral sampling of Gaussian diffusion over token embeddings: the embedding baselines'
own sampler (Diffusion-LM, SED, CoDAR; geoprobe.bridges.embedding_diffusion).

x_T ~ N(0, I), then `steps` denoiser evaluations on an evenly respaced subset of the model's
T training timesteps (improved-diffusion's respacing, which Diffusion-LM's and SED's samplers
use): each predicts x0 (from x_t, and from its previous estimate where the model is
self-conditioned), optionally clamps it to its nearest token embedding (Diffusion-LM's
clamping trick), and draws x_s from the Gaussian posterior q(x_s | x_t, x0). The last x0
estimate is then decoded by the model: rounding (the tied LM head's argmax) or CoDAR's
autoregressive decoder, which samples left to right under `top_p`.

An `EmbeddingDenoiser` is what these models expose; they do not implement the TokenDenoiser
protocol (their input is not the DSL channel's z), so the token samplers do not apply to them
(bridges/kinds.py lists which sampler applies to which kind).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from geoprobe.errors import BadInput
from geoprobe.samplers.base import Sampler


class EmbeddingDenoiser(Protocol):
    vocab_size: int
    self_condition: bool  # whether predict_x0 reads its previous estimate
    clamp: bool  # whether sampling replaces each estimate by its nearest token embedding

    def alphas_cumprod(self) -> torch.Tensor: ...  # (T,) float64, the noise schedule's abar_t

    def token_table(self) -> torch.Tensor: ...  # (V, d) the embeddings the diffusion runs over

    def predict_x0(self, x_t: torch.Tensor, t: torch.Tensor, previous: torch.Tensor | None) -> torch.Tensor: ...

    def decode(self, x0: torch.Tensor, generator: torch.Generator, top_p: float, top_p_rule: str) -> torch.Tensor: ...


def respaced(alphas_cumprod: torch.Tensor, steps: int) -> torch.Tensor:
    """The `steps` training timesteps (ascending, the first 0 and the last T - 1) a sampler visits:
    improved-diffusion's `space_timesteps` for one section (a float stride added up, each visit
    rounded half to even, as Python's round), so that the same count visits the same steps."""
    total = len(alphas_cumprod)
    count = min(steps, total)
    if count == 1:
        return torch.zeros(1, dtype=torch.long)
    stride, position, visits = (total - 1) / (count - 1), 0.0, []
    for _ in range(count):
        visits.append(round(position))
        position += stride
    return torch.tensor(sorted(set(visits)), dtype=torch.long)


def posterior(x_t: torch.Tensor, x0: torch.Tensor, abar_t: float, abar_s: float):
    """(mean, variance) of q(x_s | x_t, x0) for abar_s > abar_t (DDPM eq. 7 between two
    timesteps of a respaced schedule: alpha = abar_t / abar_s, beta = 1 - alpha)."""
    alpha = abar_t / abar_s
    beta = 1 - alpha
    mean = (abar_s ** 0.5 * beta / (1 - abar_t)) * x0 + (alpha ** 0.5 * (1 - abar_s) / (1 - abar_t)) * x_t
    return mean, beta * (1 - abar_s) / (1 - abar_t)


def nearest_embedding(x0: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Each vector replaced by its nearest row of `table` in Euclidean distance."""
    distance = (x0 ** 2).sum(-1, keepdim=True) - 2 * x0 @ table.T + (table ** 2).sum(-1)
    return table[distance.argmin(-1)]


@dataclass
class Ancestral(Sampler):
    """`steps` is the number of denoiser evaluations (the respaced timesteps); `top_p` filters
    an autoregressive decoder's draws (rounding is an argmax and ignores it)."""

    name = "ancestral"

    def check(self, length: int) -> None:
        if self.steps < 2:  # one visit is t = 0 on pure noise: no diffusion at all
            raise BadInput(f"--sampler ancestral needs at least 2 --steps, got {self.steps}")

    def check_room(self, denoiser: EmbeddingDenoiser, size: int, length: int, batched: bool) -> None:
        """Nothing to refuse: the chain holds embeddings, and only the decoder reads the vocabulary."""

    @torch.no_grad()
    def draw_batch(self, denoiser: EmbeddingDenoiser, num: int, length: int,
                   generator: torch.Generator) -> tuple[torch.Tensor, tuple[int, int, int]]:
        """One batch of the respaced ancestral chain, decoded as the baseline's paper decodes."""
        table = denoiser.token_table()
        abar = denoiser.alphas_cumprod().tolist()
        visits = respaced(denoiser.alphas_cumprod(), self.steps).tolist()[::-1]  # from T - 1 down to 0
        x = torch.randn(num, length, table.shape[1], generator=generator, device=table.device, dtype=table.dtype)
        x0 = None
        for i, t in enumerate(visits):
            x0 = denoiser.predict_x0(x, torch.full((num,), t, device=table.device),
                                     x0 if denoiser.self_condition else None)
            if denoiser.clamp:
                x0 = nearest_embedding(x0, table)
            if i + 1 == len(visits):
                break
            mean, variance = posterior(x, x0, abar[t], abar[visits[i + 1]])
            noise = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
            x = mean + variance ** 0.5 * noise
        return denoiser.decode(x0, generator, self.top_p, self.top_p_rule), (len(visits), 0, num * len(visits))
