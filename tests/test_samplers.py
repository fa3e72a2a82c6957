"""Every sampler on a toy oracle denoiser (the exact posterior of an i.i.d. prior), the
remasking transitions by hand, nucleus and Gumbel sampling, and bad sampler options."""

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from bridges.channel import TokenTable, posterior_logits
from geoprobe.errors import BadInput
from samplers import SAMPLERS, make_sampler
from samplers.base import gumbel_sample, nucleus
from samplers.masked import remdm_transition, sigma_max


class Oracle:
    """The exact denoiser of a corpus of i.i.d. tokens with a known prior."""

    def __init__(self, prior, dim=16, seed=0, s_max=100.0):
        g = torch.Generator().manual_seed(seed)
        self.table = TokenTable(len(prior), dim, generator=g)()
        self.log_prior = torch.tensor(prior, dtype=torch.float32).log()
        self.vocab_size, self.s_max = len(prior), s_max

    def token_table(self):
        return self.table

    def __call__(self, z):
        return posterior_logits(z, self.table, self.log_prior)


PRIOR = [0.4, 0.25, 0.15, 0.1, 0.06, 0.04]


def test_nucleus_and_gumbel():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    p = logits.double().softmax(-1)[0]
    kept = nucleus(logits, 0.7)
    assert torch.isfinite(kept[0, :2]).all() and torch.isinf(kept[0, 2:]).all()  # 0.64 < 0.7 <= 0.88
    assert torch.isfinite(nucleus(logits, 0.5)[0, 0]) and torch.isinf(nucleus(logits, 0.5)[0, 1])
    g = torch.Generator().manual_seed(1)
    draws = gumbel_sample(logits.expand(40000, 4), g)
    freq = torch.bincount(draws, minlength=4).float() / 40000
    assert chisquare(torch.bincount(draws, minlength=4).numpy(), p.numpy() * 40000).pvalue > 1e-3
    assert (freq.double() - p).abs().max() < 0.01


def test_remdm_transitions_by_hand():
    # MDLM, log-linear: t = 0.75 -> s = 0.5: alpha_t = 0.25, alpha_s = 0.5, reveal (0.5 - 0.25)/0.75 = 1/3
    assert remdm_transition(0.5, 0.25, 0.0) == pytest.approx((0.0, 1 / 3))
    # sigma_max = min(1, (1 - 0.5)/0.25) = 1; with sigma = 0.2: reveal (0.5 - 0.8 * 0.25)/0.75 = 0.4
    assert sigma_max(0.5, 0.25) == 1.0
    assert remdm_transition(0.5, 0.25, 0.2) == pytest.approx((0.2, 0.4))
    # a late step: alpha_t = 0.8, alpha_s = 0.9: sigma_max = 0.125; sigma = 0.1 -> (0.9 - 0.72)/0.2 = 0.9
    assert sigma_max(0.9, 0.8) == pytest.approx(0.125)
    assert remdm_transition(0.9, 0.8, 0.1) == pytest.approx((0.1, 0.9))
    with pytest.raises(ValueError):
        remdm_transition(0.9, 0.8, 0.2)
    # a 3-token sequence, one step of remdm-cap from t = 1/2 to 1/4 with eta_cap = 0.3:
    # alpha_t = 1/2, alpha_s = 3/4, sigma = min(0.3, (1/4)/(1/2)) = 0.3, reveal = (3/4 - 0.35)/(1/2) = 0.8
    sampler = make_sampler("remdm-cap", steps=4, eta_cap=0.3)
    steps = list(sampler.transitions(4))
    assert steps[2] == pytest.approx((0.3, 0.8))
    assert steps[-1][1] == pytest.approx(1.0) and steps[-1][0] == 0.0  # the last step reveals everything


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_every_sampler_valid_ids_budget_and_determinism(name):
    oracle = Oracle(PRIOR)
    sampler = make_sampler(name, steps=12)
    a = sampler.sample(oracle, num=5, length=12, seed=3)
    b = make_sampler(name, steps=12).sample(oracle, num=5, length=12, seed=3)
    c = make_sampler(name, steps=12).sample(oracle, num=5, length=12, seed=4)
    assert a.tokens.shape == (5, 12) and a.tokens.dtype == torch.long
    assert a.tokens.min() >= 0 and a.tokens.max() < len(PRIOR)
    assert 1 <= a.nfe <= 12
    assert torch.equal(a.tokens, b.tokens) and not torch.equal(a.tokens, c.tokens)


def test_roar_reveals_one_token_per_step():
    oracle = Oracle(PRIOR)
    seen = []

    class Spy:
        vocab_size, s_max = oracle.vocab_size, oracle.s_max
        token_table = oracle.token_table

        def __call__(self, z):
            seen.append(int((z.abs().sum(-1) > 0).sum(1)[0]))
            return oracle(z)

    result = make_sampler("roar", cache=False).sample(Spy(), num=2, length=9, seed=0)
    assert seen == list(range(9)) and result.nfe == 9
    two = make_sampler("roar", per_step=2).sample(oracle, num=2, length=9, seed=0)
    assert two.nfe == 5


def test_skipping_unchanged_states_saves_calls_without_changing_samples():
    oracle = Oracle(PRIOR)
    cached = make_sampler("mdlm", steps=64).sample(oracle, num=2, length=8, seed=5)
    uncached = make_sampler("mdlm", steps=64, cache=False).sample(oracle, num=2, length=8, seed=5)
    assert torch.equal(cached.tokens, uncached.tokens)
    assert uncached.nfe == 64 and cached.nfe < 64 and cached.nfe + cached.skipped == 64
    assert cached.rows < 2 * cached.nfe  # only the sequences that changed are recomputed
    assert uncached.rows == 2 * 64


def test_hybrid_respects_its_total_budget():
    oracle = Oracle(PRIOR)
    for steps in (3, 10, 48):
        result = make_sampler("hybrid", steps=steps, cache=False).sample(oracle, num=3, length=16, seed=0)
        assert result.nfe == steps


@pytest.mark.parametrize("name,steps", [("mdlm", 16), ("remdm-loop", 32), ("roar", None), ("continuous", 200)])
def test_oracle_denoiser_reproduces_the_token_prior(name, steps):
    """With the exact posterior of an i.i.d. prior, sampled tokens follow the prior (chi-square).

    Not the hybrid: committing only the *confident* positions and re-drawing the rest selects
    on the token itself, so its marginal is biased by design (towards confident tokens)."""
    oracle = Oracle(PRIOR)
    kwargs = {} if steps is None else {"steps": steps}
    result = make_sampler(name, **kwargs).sample(oracle, num=200, length=16, seed=11)
    counts = torch.bincount(result.tokens.reshape(-1), minlength=len(PRIOR)).numpy()
    expected = np.array(PRIOR) * counts.sum()
    assert chisquare(counts, expected).pvalue > 1e-3, (counts, expected)


def test_bad_sampler_options():
    with pytest.raises(BadInput, match="unknown sampler 'beam' \\(valid: mdlm, remdm-cap"):
        make_sampler("beam")
    with pytest.raises(BadInput, match="--top-p must be in"):
        make_sampler("mdlm", top_p=0.0)
    with pytest.raises(BadInput, match="--steps must be at least 1"):
        make_sampler("mdlm", steps=0)
    with pytest.raises(BadInput, match="exceeds --length"):
        make_sampler("roar", steps=20).sample(Oracle(PRIOR), num=1, length=10)
