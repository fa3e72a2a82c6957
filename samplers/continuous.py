"""Stochastic localization: z follows dz = x_hat(z) ds + dW on an SNR grid from 0 to s_max,
x_hat(z) = sum_v p(v | z) e_v from the denoiser, then the most probable token of the final z."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from geoprobe.samplers.base import Sampler


def snr_grid(steps: int, s_end: float) -> torch.Tensor:
    """Quadratic grid: small increments at low SNR, where the posterior moves the most."""
    return s_end * torch.linspace(0, 1, steps + 1, dtype=torch.float64) ** 2


def localize(model, z: torch.Tensor, grid: torch.Tensor, generator: torch.Generator, table: torch.Tensor):
    """Euler-Maruyama steps of the localization SDE along `grid`; one denoiser call per step."""
    for s, s_next in zip(grid[:-1].tolist(), grid[1:].tolist()):
        ds = s_next - s
        x_hat = model(z).softmax(-1) @ table
        noise = torch.randn(z.shape, generator=generator, dtype=z.dtype, device=generator.device)
        z = z + ds * x_hat + ds ** 0.5 * noise
    return z


@dataclass
class Continuous(Sampler):
    name = "continuous"

    def run(self, model, num, length, generator):
        table = model.denoiser.token_table()
        z = torch.zeros(num, length, table.shape[1], device=table.device, dtype=table.dtype)
        z = localize(model, z, snr_grid(max(1, self.steps - 1), model.denoiser.s_max), generator, table)
        return model(z).argmax(-1)
