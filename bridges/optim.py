"""Training with bfloat16 weights (`--precision bfloat16`): AdamW and the EMA for parameters
stored in bfloat16, with every update rounded stochastically.

Why: a float32 8B model in training holds 20 bytes per parameter (weights, gradients, AdamW's
two moments, the EMA), 161 GB for Llama-3.1-8B, more than one H200. With the weights, their
gradients and the EMA in bfloat16 and the moments kept in float32 it is 14 bytes (112 GB).
Rounding each update to the nearest bfloat16 would lose it wherever it is smaller than half a
unit in the last place (2^-9 of the weight: a step of lr 1e-4 on a weight of 1 vanishes), so
the update is computed in float32 and rounded up or down with the probabilities that make the
stored weight equal the float32 result in expectation (Zamirai et al. 2020, "Revisiting
BFloat16 Training", show this recovers float32 training's accuracy without a float32 master
copy). The EMA is rounded the same way. float32 parameters in the same model (the DSL's token
table and converter) get the exact float32 update.

The random bits of a step come from a generator seeded by (seed, step) on the parameters'
device, so a resumed run repeats an uninterrupted one.
"""

from __future__ import annotations

import math

import torch

LOW_BITS = (1 << 16) - 1  # the float32 mantissa bits a bfloat16 drops


def round_stochastic(x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """float32 `x` -> bfloat16, each value rounded to one of its two bfloat16 neighbours with
    probability proportional to its nearness (unbiased: E[result] = x). Adds random low bits to
    the float32 bit pattern and truncates them; in sign-magnitude this rounds the magnitude, so
    negative values are handled alike, and a carry moves into the exponent as it should."""
    bits = x.float().contiguous().view(torch.int32)  # a view of a contiguous float32 tensor, no copy
    noise = torch.randint(0, LOW_BITS + 1, x.shape, dtype=torch.int32, device=x.device, generator=generator)
    noise.add_(bits).bitwise_and_(~LOW_BITS)  # in place: one temporary as large as x, not three
    return noise.view(torch.float32).to(torch.bfloat16)  # exact: the low bits are zero


def step_generator(seed: int, step: int, device: torch.device, stream: str = "adamw") -> torch.Generator:
    """The rounding bits of one step, on `device`; each `stream` (the optimiser's, the EMA's) its own."""
    return torch.Generator(device=device).manual_seed(hash((seed, step, stream == "ema")) & (2 ** 63 - 1))


class StochasticAdamW(torch.optim.Optimizer):
    """AdamW (decoupled weight decay, bias-corrected moments: torch.optim.AdamW's arithmetic)
    with float32 moments; a bfloat16 parameter gets its float32 result rounded stochastically.
    `step()` draws from a generator seeded by (seed, its step count)."""

    def __init__(self, params, lr: float, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
                 seed: int = 0):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay, "seed": seed})

    @torch.no_grad()
    def step(self, closure=None):
        generator = None
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:  # the step count on the host (no device wait to read it), moments in float32
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32)
                state["step"] += 1
                t = int(state["step"])
                # float32 temporaries of at most three times the parameter's size at once (the
                # 8B model's embedding: 2 GB each), released as soon as they are used
                grad = p.grad.float()
                state["exp_avg"].lerp_(grad, 1 - beta1)
                state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                del grad
                denom = state["exp_avg_sq"].sqrt().div_(math.sqrt(1 - beta2 ** t)).add_(group["eps"])
                updated = p.float().mul_(1 - group["lr"] * group["weight_decay"])
                updated.addcdiv_(state["exp_avg"], denom, value=-group["lr"] / (1 - beta1 ** t))
                del denom
                if p.dtype == torch.bfloat16:
                    if generator is None:
                        generator = step_generator(group["seed"], t, p.device)
                    p.copy_(round_stochastic(updated, generator))
                else:
                    p.copy_(updated)


@torch.no_grad()
def update_ema(ema: dict, params: dict, weight: float, generator_for) -> None:
    """ema <- ema + weight (param - ema) for every entry: one foreach kernel for the float32
    ones, and for bfloat16 ones the float32 result rounded stochastically (a plain rounding
    would freeze an EMA of decay 0.999 wherever a step moves it by less than half a unit).
    `generator_for(device)`: the step's generator, called only when a bfloat16 entry needs it."""
    exact = [k for k, v in ema.items() if v.dtype != torch.bfloat16]
    if exact:
        torch._foreach_lerp_([ema[k] for k in exact], [params[k].detach().float() for k in exact], weight)
    generator = None
    for k, v in ema.items():
        if v.dtype == torch.bfloat16:
            generator = generator or generator_for(v.device)
            v.copy_(round_stochastic(v.float().lerp_(params[k].detach().float(), weight), generator))
