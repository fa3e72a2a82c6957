"""Generation paths over the TokenDenoiser protocol: one class per sampler (`SAMPLERS`), and
the papers' headline settings one flag away (`PRESETS`)."""

from __future__ import annotations

from geoprobe.errors import BadInput
from geoprobe.samplers.ancestral import Ancestral
from geoprobe.samplers.base import SampleResult, Sampler, TokenDenoiser, check_flags
from geoprobe.samplers.continuous import Continuous
from geoprobe.samplers.hybrid import Hybrid
from geoprobe.samplers.ltr import LeftToRight
from geoprobe.samplers.masked import MDLM, ReMDMCap, ReMDMConf, ReMDMLoop, ReMDMRescale
from geoprobe.samplers.roar import ROAR

SAMPLERS: dict[str, type[Sampler]] = {cls.name: cls for cls in
                                      (MDLM, ReMDMCap, ReMDMRescale, ReMDMConf, ReMDMLoop, ROAR, Continuous, Hybrid,
                                       LeftToRight, Ancestral)}
# the samplers over the TokenDenoiser protocol (DSL models, bridges); those that also decode left
# to right through a bridge's upper stack (bridges only); and those over an EmbeddingDenoiser's
# Gaussian diffusion (the embedding baselines): bridges/kinds.py says which a kind takes
TOKEN_SAMPLERS = tuple(name for name in SAMPLERS if name not in (Ancestral.name, LeftToRight.name))
BRIDGE_SAMPLERS = (*TOKEN_SAMPLERS, LeftToRight.name)
EMBEDDING_SAMPLERS = (Ancestral.name,)


FINISHERS = ("mdlm", "remdm-cap", "remdm-rescale", "remdm-conf", "remdm-loop")
# the causal LM itself, left to right with its KV cache: a generator like the others, but it
# samples a backbone rather than a denoiser, so geoprobe.workflows.generate runs it
AUTOREGRESSIVE = "ar"
NAMES = (*SAMPLERS, AUTOREGRESSIVE)  # every --sampler, in the order --help lists them

# The references' headline knobs. "all" applies to every sampler that has the knob, the
# sampler's own entry on top; a flag given explicitly wins over both.
PRESETS: dict[str, dict[str, dict]] = {
    # ReMDM (Wang et al. 2025), scripts/remdm-*.sh of kuleshov-group/remdm: OWT, T = 1,024,
    # nucleus 0.9 with their rule, a final argmax pass; eta per sampler as in the scripts
    "remdm-paper": {"all": {"steps": 1024, "top_p": 0.9, "top_p_rule": "remdm", "final_argmax": True},
                    "remdm-cap": {"eta_cap": 0.008}, "remdm-rescale": {"eta": 0.015},
                    "remdm-loop": {"eta": 0.02, "t_on": 0.55, "t_off": 0.05, "alpha_on": 0.9}},
    # DSL's hybrid at its 48-step budget (half continuous, then commit and the MDLM finish);
    # what the paper does not state (top-p, switch SNR, confidence) stays at geoprobe's defaults
    "dsl-paper": {"all": {"steps": 48}},
}


def knob_default(knob: str):
    """The default of a sampler knob (the first sampler that has it): what `--help` prints."""
    for cls in SAMPLERS.values():
        if knob in cls.knobs():
            return cls.knobs()[knob]
    raise KeyError(knob)


def check_options(finisher: str = "mdlm", preset: str | None = None, **flags) -> None:
    """Every sampling flag in range (`check_flags`), whichever sampler uses it, and the finisher
    and preset named."""
    check_flags(**flags)
    if finisher not in FINISHERS:
        raise BadInput(f"unknown --finisher {finisher!r} (use {', '.join(FINISHERS)})")
    if preset is not None and preset not in PRESETS:
        raise BadInput(f"unknown --preset {preset!r} (use {', '.join(PRESETS)})")


def preset_flags(preset: str | None, name: str, flags: dict) -> dict:
    """The flags with the preset's values where a flag was not given (None)."""
    if preset is None:
        return dict(flags)
    table = PRESETS[preset]
    chosen = {**table.get("all", {}), **table.get(name, {})}
    return {**chosen, **{k: v for k, v in flags.items() if v is not None}}


def make_sampler(name: str, **options) -> Sampler:
    if name not in SAMPLERS:
        raise BadInput(f"unknown sampler {name!r} (valid: {', '.join(SAMPLERS)})")
    return SAMPLERS[name](**options)


def sampler_from_flags(name: str, finisher: str = "mdlm", preset: str | None = None, **flags) -> Sampler:
    """The sampler `name` from every sampling flag and the preset: each sampler takes the knobs it
    has (None: the preset's, else its own default); the hybrid's finishing sampler is built from
    the same flags."""
    if name not in SAMPLERS:
        raise BadInput(f"unknown sampler {name!r} (valid: {', '.join(NAMES)})")
    options = preset_flags(preset, name, flags)
    if name == "hybrid":
        options["finisher"] = sampler_from_flags(finisher, preset=preset, **flags)
    accepted = {*SAMPLERS[name].knobs(), "finisher"}
    return make_sampler(name, **{k: v for k, v in options.items() if k in accepted and v is not None})


__all__ = ["AUTOREGRESSIVE", "BRIDGE_SAMPLERS", "EMBEDDING_SAMPLERS", "FINISHERS", "NAMES", "PRESETS", "SAMPLERS", "check_options", "knob_default",
           "make_sampler", "preset_flags", "sampler_from_flags", "SampleResult", "Sampler", "TOKEN_SAMPLERS", "TokenDenoiser"]
