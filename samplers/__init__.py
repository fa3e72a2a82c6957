"""Generation paths over the TokenDenoiser protocol: one class per sampler (`SAMPLERS`)."""

from __future__ import annotations

import inspect

from geoprobe.errors import BadInput
from samplers.base import SampleResult, Sampler, TokenDenoiser, check_flags
from samplers.continuous import Continuous
from samplers.hybrid import Hybrid
from samplers.masked import MDLM, ReMDMCap, ReMDMLoop, ReMDMRescale
from samplers.roar import ROAR

SAMPLERS: dict[str, type[Sampler]] = {cls.name: cls for cls in
                                      (MDLM, ReMDMCap, ReMDMRescale, ReMDMLoop, ROAR, Continuous, Hybrid)}


FINISHERS = ("mdlm", "remdm-cap", "remdm-rescale", "remdm-loop")
# the causal LM itself, left to right with its KV cache: a generator like the others, but it
# samples a backbone rather than a denoiser, so geoprobe.generate runs it
AUTOREGRESSIVE = "ar"
NAMES = (*SAMPLERS, AUTOREGRESSIVE)  # every --sampler, in the order --help lists them


def check_options(finisher: str = "mdlm", **flags) -> None:
    """Every sampling flag in range (`check_flags`), whichever sampler uses it, and the finisher named."""
    check_flags(**flags)
    if finisher not in FINISHERS:
        raise BadInput(f"unknown --finisher {finisher!r} (use {', '.join(FINISHERS)})")


def make_sampler(name: str, **options) -> Sampler:
    if name not in SAMPLERS:
        raise BadInput(f"unknown sampler {name!r} (valid: {', '.join(SAMPLERS)})")
    return SAMPLERS[name](**options)


def sampler_from_flags(name: str, finisher: str = "mdlm", **flags) -> Sampler:
    """The sampler `name` from every sampling flag: each takes the flags it has (None: its own
    default); the hybrid's finishing sampler is built from the same flags."""
    if name not in SAMPLERS:
        raise BadInput(f"unknown sampler {name!r} (valid: {', '.join(NAMES)})")
    options = dict(flags)
    if name == "hybrid":
        options["finisher"] = sampler_from_flags(finisher, **flags)
    accepted = inspect.signature(SAMPLERS[name]).parameters
    return make_sampler(name, **{k: v for k, v in options.items() if k in accepted and v is not None})


__all__ = ["AUTOREGRESSIVE", "FINISHERS", "NAMES", "SAMPLERS", "check_options", "sampler_from_flags", "SampleResult", "Sampler", "TokenDenoiser", "make_sampler"]
