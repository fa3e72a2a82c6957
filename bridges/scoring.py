"""Which positions a bridge (and each control) is fitted on and scored on, and the two state losses.

A bridge generates every block's positions >= 1 (position 0, the BOS, is the backbone's own
state). Rows whose state is massive by the scan's rule (norm above `massive_factor` times the
median norm) are left out of fitting and of scoring, so the bridges and the controls are judged
on the states the geometry measured. One owner for these rules: geoprobe.bridges.fit (training,
validation) and geoprobe.bridges.controls (the closed-form controls) both read them from here.
"""

from __future__ import annotations

import torch

from geoprobe.bridges.states import Split


def generated_rows(split: Split) -> torch.Tensor:
    """Flat indices of every block's positions >= 1 (position 0, the BOS, is the backbone's)."""
    keep = torch.ones(len(split.ids), dtype=torch.bool)
    keep[split.starts[:-1][split.starts[:-1] < len(split.ids)]] = False
    return keep.nonzero(as_tuple=True)[0]


def massive_threshold(states: torch.Tensor, massive_factor: float | None) -> float:
    """The norm above which a row is massive by the scan's rule (inf without one)."""
    if not massive_factor:
        return float("inf")
    return float(massive_factor * states.norm(dim=1).median())


def state_losses(target: torch.Tensor, error: torch.Tensor) -> dict:
    """nmse = sum |h^ - h|^2 / sum |h - mean|^2 and nmse_dim = the mean over varying channels of
    that ratio per channel, for (n, d) targets and squared errors (float64)."""
    var_dim = ((target - target.mean(0)) ** 2).sum(0)
    total_var = float(var_dim.sum())
    varying = var_dim > 1e-12 * total_var  # a constant channel has nothing to reconstruct
    err_dim = error.sum(0)
    return {"nmse": float(err_dim.sum()) / total_var,
            "nmse_dim": float((err_dim[varying] / var_dim[varying]).mean())}


def scored_rows(target: torch.Tensor, massive_factor: float | None) -> torch.Tensor:
    """Validation's rows: those whose norm is within `massive_factor` times the median (all with None)."""
    return target.norm(dim=1) <= massive_threshold(target, massive_factor)


def fitted_rows(split, layer: int, massive_factor: float | None) -> torch.Tensor:
    """A split's positions >= 1 whose state at `layer` is not massive by the scan's rule."""
    rows = generated_rows(split)
    if not len(rows):
        return rows
    norms = split.states[layer][rows].norm(dim=1)
    return rows[norms <= massive_threshold(split.states[layer][rows], massive_factor)]
