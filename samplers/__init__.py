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


def make_sampler(name: str, **options) -> Sampler:
    if name not in SAMPLERS:
        raise BadInput(f"unknown sampler {name!r} (valid: {', '.join(SAMPLERS)})")
    return SAMPLERS[name](**options)


__all__ = ["SAMPLERS", "SampleResult", "Sampler", "TokenDenoiser", "make_sampler"]
