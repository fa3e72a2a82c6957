"""Generation paths over the TokenDenoiser protocol: one class per sampler (`SAMPLERS`)."""

from __future__ import annotations

from geoprobe.errors import BadInput
from samplers.base import SampleResult, Sampler, TokenDenoiser, check_flags
from samplers.continuous import Continuous
from samplers.hybrid import Hybrid
from samplers.masked import MDLM, ReMDMCap, ReMDMLoop, ReMDMRescale
from samplers.roar import ROAR

SAMPLERS: dict[str, type[Sampler]] = {cls.name: cls for cls in
                                      (MDLM, ReMDMCap, ReMDMRescale, ReMDMLoop, ROAR, Continuous, Hybrid)}


FINISHERS = ("mdlm", "remdm-cap", "remdm-rescale", "remdm-loop")


def check_options(finisher: str = "mdlm", **flags) -> None:
    """Every sampling flag in range (`check_flags`), whichever sampler uses it, and the finisher named."""
    check_flags(**flags)
    if finisher not in FINISHERS:
        raise BadInput(f"unknown --finisher {finisher!r} (use {', '.join(FINISHERS)})")


def make_sampler(name: str, **options) -> Sampler:
    if name not in SAMPLERS:
        raise BadInput(f"unknown sampler {name!r} (valid: {', '.join(SAMPLERS)})")
    return SAMPLERS[name](**options)


__all__ = ["FINISHERS", "SAMPLERS", "check_options", "SampleResult", "Sampler", "TokenDenoiser", "make_sampler"]
