"""Likelihood estimates (nats per token) of held-out sequences under a TokenDenoiser.

* `mdlm_elbo`: the masked-diffusion bound with the log-linear schedule,
  -log p(x) <= E_t [ (1/t) sum_{i masked at t} -log p(x_i | z_t) ], t ~ U(0, 1), a token masked
  with probability t; Monte Carlo over t with the same draws for every sequence.
* `roar_nll`: the random-order (any-order autoregressive) estimate: for a random order,
  sum_i -log p(x_{o_i} | x_{o_<i}), revealed tokens at s_max, the rest masked; L calls per order.
* `continuous_bound`: the stochastic-localization bound
  int_0^S 1/2 |e_x - x_hat(z_s)|^2 ds + CE(x | z_S), trapezoid on an SNR grid, with z_s = s e_x
  + W_s along one Brownian path per sequence, taking per sequence the best stopping SNR S on
  the grid (each S gives a valid bound).

Their random numbers come from a CPU generator (an estimate does not depend on the device it
ran on) and are moved to the tokens' device; sums stay there in float64 until the one read-back
at the end (no wait for the device per Monte-Carlo sample).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from geoprobe.device import upload
from geoprobe.samplers.base import MASK, RevealState


def _ce(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """(B, L) token cross-entropies."""
    return F.cross_entropy(logits.float().transpose(1, 2), tokens, reduction="none")


@torch.no_grad()
def mdlm_elbo(denoiser, tokens: torch.Tensor, samples: int = 16, seed: int = 0) -> torch.Tensor:
    """Per-sequence bound in nats per token, (B,)."""
    g = torch.Generator().manual_seed(seed)
    batch, length = tokens.shape
    total = torch.zeros(batch, dtype=torch.float64, device=tokens.device)
    table = denoiser.token_table()
    for k in range(samples):
        t = (k + torch.rand((), generator=g).item()) / samples  # stratified in (0, 1); a CPU number
        masked = upload(torch.rand(batch, length, generator=g) < t, tokens.device)
        state = RevealState(table, denoiser.s_max, batch, length, g)
        state.tokens = torch.where(masked, torch.full_like(tokens, MASK), tokens)
        ce = _ce(denoiser(state.z()), tokens).double()
        total += (ce * masked).sum(1) / t
    return (total / samples / length).cpu()


@torch.no_grad()
def roar_nll(denoiser, tokens: torch.Tensor, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    batch, length = tokens.shape
    table = denoiser.token_table()
    order = upload(torch.rand(batch, length, generator=g).argsort(1), tokens.device)
    state = RevealState(table, denoiser.s_max, batch, length, g)
    rows = torch.arange(batch, device=tokens.device)
    total = torch.zeros(batch, dtype=torch.float64, device=tokens.device)
    for i in range(length):
        col = order[:, i]
        logits = denoiser(state.z())[rows, col]
        total += F.cross_entropy(logits.float(), tokens[rows, col], reduction="none").double()
        state.tokens[rows, col] = tokens[rows, col]
    return (total / length).cpu()


@torch.no_grad()
def continuous_bound(denoiser, tokens: torch.Tensor, steps: int = 64, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    table = denoiser.token_table()
    e = table[tokens]
    grid = denoiser.s_max * torch.linspace(0, 1, steps + 1, dtype=torch.float64) ** 2
    brownian = torch.zeros_like(e)
    errors, stops = [], []
    previous = 0.0
    for s in grid.tolist():
        brownian = brownian + (s - previous) ** 0.5 * upload(torch.randn(e.shape, generator=g), e.device)
        previous = s
        z = s * e + brownian
        logits = denoiser(z)
        x_hat = logits.softmax(-1) @ table
        errors.append(0.5 * ((e - x_hat) ** 2).sum(-1).sum(-1).double())  # (B,)
        stops.append(_ce(logits, tokens).sum(-1).double())
    errors, stops = torch.stack(errors).cpu(), torch.stack(stops).cpu()  # (K + 1, B): one read-back
    widths = (grid[1:] - grid[:-1])[:, None]
    integral = torch.cat([torch.zeros(1, errors.shape[1], dtype=torch.float64),
                          torch.cumsum(widths * (errors[1:] + errors[:-1]) / 2, dim=0)])
    return (integral + stops).min(0).values / tokens.shape[1]


# every held-out likelihood estimator by the name `geoprobe nll --estimators` takes
ESTIMATORS = {"mdlm": mdlm_elbo, "roar": roar_nll, "continuous": continuous_bound}
