"""Generation paths over the TokenDenoiser protocol: one class per sampler (`SAMPLERS`)."""

from __future__ import annotations

from geoprobe.errors import BadInput
from samplers.base import SampleResult, Sampler, TokenDenoiser
from samplers.continuous import Continuous
from samplers.hybrid import Hybrid
from samplers.masked import MDLM, ReMDMCap, ReMDMLoop, ReMDMRescale
from samplers.roar import ROAR

SAMPLERS: dict[str, type[Sampler]] = {cls.name: cls for cls in
                                      (MDLM, ReMDMCap, ReMDMRescale, ReMDMLoop, ROAR, Continuous, Hybrid)}


FINISHERS = ("mdlm", "remdm-cap", "remdm-rescale", "remdm-loop")


def check_options(steps=None, top_p=1.0, per_step=None, eta=0.02, eta_cap=0.02, switch_snr=5.0, finisher="mdlm",
                  num=1, length=1) -> None:
    """Every sampling flag in range, whichever sampler uses it (an out-of-range flag is a mistake
    even where the chosen sampler ignores it). NaN fails every comparison and is refused too."""
    if steps is not None and not steps >= 1:
        raise BadInput(f"--steps must be at least 1, got {steps}")
    if not 0 < top_p <= 1:
        raise BadInput(f"--top-p must be in (0, 1], got {top_p}")
    if per_step is not None and not per_step >= 1:
        raise BadInput(f"--per-step must be at least 1, got {per_step}")
    for flag, value in (("--eta", eta), ("--eta-cap", eta_cap)):
        if not 0 <= value <= 1:
            raise BadInput(f"{flag} must be in [0, 1], got {value}")
    if not 0 < switch_snr < float("inf"):
        raise BadInput(f"--switch-snr must be positive and finite, got {switch_snr}")
    if finisher not in FINISHERS:
        raise BadInput(f"unknown --finisher {finisher!r} (use {', '.join(FINISHERS)})")
    if not (num >= 1 and length >= 1):
        raise BadInput(f"--num and --length must be positive, got {num} and {length}")


def make_sampler(name: str, **options) -> Sampler:
    if name not in SAMPLERS:
        raise BadInput(f"unknown sampler {name!r} (valid: {', '.join(SAMPLERS)})")
    return SAMPLERS[name](**options)


__all__ = ["FINISHERS", "SAMPLERS", "check_options", "SampleResult", "Sampler", "TokenDenoiser", "make_sampler"]
