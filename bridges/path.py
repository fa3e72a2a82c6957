"""The Brownian-bridge sampler of the hidden-state bridge: one owner for its update rule, which
`HiddenBridge.sample` and the cached left-to-right decoding (bridges/decode.py) both run."""

from __future__ import annotations

import torch

from geoprobe.device import upload


def bridge_path_sample(predict, start: torch.Tensor, steps: int, sigma_b: float,
                       generator: torch.Generator | None = None) -> torch.Tensor:
    """K steps of the Brownian bridge from `start` (tau = 0) towards the predicted endpoint.

    Each step moves y_tau to tau' = tau + 1/K with the bridge's posterior given the endpoint,
    the endpoint replaced by `predict(y, tau)` (its estimate of E[h | y_tau]):
    y' = y + (tau' - tau)/(1 - tau) (h^ - y) + sigma_b sqrt((tau' - tau)(1 - tau')/(1 - tau)) eps.
    The last step lands on h^ (no noise). With sigma_b = 0 the path is deterministic; with the exact
    posterior mean as `predict`, the samples' law tends to p(h | start) as K grows (tested on a
    linear-Gaussian model).

    Args:
        predict: (y (B, ...), tau (B,)) -> the endpoint estimate, same shape as y.
        start: where the path starts (tau = 0).
        steps: K >= 1.
        sigma_b: the bridge noise (0: deterministic).
        generator: the noise's generator (CPU), or None for the global one.
    """
    y = start
    for k in range(steps):
        tau, tau_next = k / steps, (k + 1) / steps
        predicted = predict(y, torch.full((len(y),), tau, device=y.device))
        y = y + (tau_next - tau) / (1 - tau) * (predicted - y)
        if sigma_b > 0 and k < steps - 1:
            # drawn on the host, copied without the host waiting for the device (`upload`)
            noise = upload(torch.randn(y.shape, generator=generator), y.device).to(y.dtype)
            y = y + sigma_b * ((tau_next - tau) * (1 - tau_next) / (1 - tau)) ** 0.5 * noise
    return y
