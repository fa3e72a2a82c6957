"""The localization channel of DSL: unit-sphere token embeddings, z = s e_x + sqrt(s) eps, the
exact posterior of a known token prior, and the SNR distributions used in training.

Why the unit sphere: p(z | v) is proportional to exp(<e_v, z> - s |e_v|^2 / 2). With |e_v| = 1
the second term is the same for every token, so p(v | z) is proportional to
p(v) exp(<e_v, z>): the posterior, hence the Bayes-optimal denoiser, does not depend on s. One
network then serves every SNR path (masked, random-order, continuous). The norm is therefore a
structural constraint (rows are normalised in the forward pass), never a penalty.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from geoprobe.device import upload

S_MAX = 100.0


class TokenTable(nn.Module):
    """V unit-norm token embeddings of dimension d; learned in direction only, or frozen."""

    def __init__(self, vocab_size: int, dim: int, learn: bool = True, init: torch.Tensor | None = None,
                 generator: torch.Generator | None = None):
        super().__init__()
        raw = init.clone().float() if init is not None else torch.randn(vocab_size, dim, generator=generator)
        self.raw = nn.Parameter(raw, requires_grad=learn)

    def forward(self) -> torch.Tensor:
        return F.normalize(self.raw, dim=-1)

    @staticmethod
    def pca_init(embeddings: torch.Tensor, dim: int) -> torch.Tensor:
        """The top-`dim` principal components of a backbone's input embeddings (V x D)."""
        centred = embeddings.float() - embeddings.float().mean(0)
        _, _, v = torch.linalg.svd(centred, full_matrices=False)
        return centred @ v[:dim].T


def channel(table: torch.Tensor, tokens: torch.Tensor, snr: torch.Tensor,
            generator: torch.Generator | None = None, noise: torch.Tensor | None = None) -> torch.Tensor:
    """z = s e_x + sqrt(s) eps for token ids (B, L) and per-token SNRs (B, L) -> (B, L, d);
    eps is `noise` when given (a data-parallel rank's rows of the global batch's draw)."""
    # F.embedding, not table[tokens]: its CPU backward gives each thread its own rows of the
    # table, while indexing's backward (index_put_ with accumulate) sums in a thread-dependent
    # order, which made two identical training runs end differently
    e = F.embedding(tokens, table)
    if noise is None:  # drawn where the generator lives (the CPU for reproducible runs), then moved
        where = generator.device if generator is not None else e.device
        noise = torch.randn(e.shape, generator=generator, device=where, dtype=e.dtype)
    noise = upload(noise, e.device).to(e.dtype)
    return snr[..., None] * e + snr.clamp(min=0).sqrt()[..., None] * noise


def posterior_logits(z: torch.Tensor, table: torch.Tensor, log_prior: torch.Tensor | None = None) -> torch.Tensor:
    """log p(v | z) up to a constant: log p(v) + <e_v, z> (exact for unit-norm e, any SNR)."""
    logits = z @ table.T
    return logits if log_prior is None else logits + log_prior


def posterior_mean(z: torch.Tensor, table: torch.Tensor, log_prior: torch.Tensor | None = None) -> torch.Tensor:
    """x_hat(z) = sum_v p(v | z) e_v: the oracle denoiser of a corpus with i.i.d. tokens."""
    return posterior_logits(z, table, log_prior).softmax(-1) @ table


# --- SNR distributions (per token, shape (B, L)) --------------------------------------------


def lognormal_snr(shape, mu: float = 1.69, sigma: float = 0.9, s_max: float = 40.0,
                  generator: torch.Generator | None = None) -> torch.Tensor:
    return (mu + sigma * torch.randn(shape, generator=generator)).exp().clamp(max=s_max)


def random_order_snr(shape, s_max: float = S_MAX, generator: torch.Generator | None = None) -> torch.Tensor:
    """A random prefix of a random order revealed at s in [0.8 s_max, s_max], the rest in [0, 1)."""
    batch, length = shape
    order = torch.rand(shape, generator=generator).argsort(dim=1)
    rank = order.argsort(dim=1)  # position -> its place in the order
    prefix = torch.randint(0, length + 1, (batch, 1), generator=generator)
    revealed = rank < prefix
    high = s_max * (0.8 + 0.2 * torch.rand(shape, generator=generator))
    low = torch.rand(shape, generator=generator)
    return torch.where(revealed, high, low)


def endpoint_snr(shape, s_max: float = S_MAX, generator: torch.Generator | None = None) -> torch.Tensor:
    """MDLM: each sequence draws a mask rate t ~ U(0, 1); masked tokens get s = 0, the rest s_max."""
    t = torch.rand(shape[0], 1, generator=generator)
    masked = torch.rand(shape, generator=generator) < t
    return torch.where(masked, torch.zeros(shape), torch.full(shape, s_max))


def mixed_snr(shape, roar_frac: float = 0.1, generator: torch.Generator | None = None, **lognormal) -> torch.Tensor:
    """Per sequence: the random-order endpoint branch with probability roar_frac, else log-normal."""
    use_roar = torch.rand(shape[0], 1, generator=generator) < roar_frac
    return torch.where(use_roar, random_order_snr(shape, generator=generator),
                       lognormal_snr(shape, generator=generator, **lognormal))


SNR_SCHEMES = ("mixed", "lognormal", "endpoint")


def draw_snr(scheme: str, shape, generator: torch.Generator | None = None, roar_frac: float = 0.1) -> torch.Tensor:
    if scheme == "mixed":
        return mixed_snr(shape, roar_frac, generator)
    if scheme == "lognormal":
        return lognormal_snr(shape, generator=generator)
    if scheme == "endpoint":
        return endpoint_snr(shape, generator=generator)
    raise ValueError(f"unknown SNR scheme {scheme!r} (use {', '.join(SNR_SCHEMES)})")
