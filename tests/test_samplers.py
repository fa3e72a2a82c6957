"""Every sampler on a toy oracle denoiser (the exact posterior of an i.i.d. prior), the
remasking transitions by hand, nucleus and Gumbel sampling, and bad sampler options."""

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from geoprobe.bridges.channel import TokenTable, posterior_logits
from geoprobe.errors import BadInput
from geoprobe.samplers import TOKEN_SAMPLERS, make_sampler
from geoprobe.samplers.base import gumbel_sample, nucleus
from geoprobe.samplers.masked import remdm_transition, sigma_max


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


@pytest.mark.parametrize("name", TOKEN_SAMPLERS)  # the ancestral one: tests/test_baselines.py
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


def _reference_nucleus(probs, p):
    """The MDLM/ReMDM code's filter, transcribed: sort, keep cumsum <= p (and the top), renormalise."""
    sorted_probs, order = torch.sort(probs, descending=True, dim=-1)
    keep = sorted_probs.cumsum(-1) <= p
    keep[..., 0] = True
    kept = sorted_probs * keep
    kept = kept / kept.sum(-1, keepdim=True)
    return torch.zeros_like(probs).scatter_(-1, order, kept)


def test_both_nucleus_rules_on_a_hand_made_distribution_and_against_their_references():
    from transformers import TopPLogitsWarper

    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    # p = 0.85: hf keeps the token that crosses it (0.5 + 0.3 < 0.85 <= 0.95), remdm drops it
    assert torch.isfinite(nucleus(logits, 0.85, "hf")[0]).tolist() == [True, True, True, False]
    assert torch.isfinite(nucleus(logits, 0.85, "remdm")[0]).tolist() == [True, True, False, False]
    # a top token above p is kept by both
    assert torch.isfinite(nucleus(logits, 0.3, "remdm")[0]).tolist() == [True, False, False, False]
    g = torch.Generator().manual_seed(0)
    random = torch.randn(64, 50, generator=g) * 3
    for p in (0.5, 0.9, 0.99):
        hf = TopPLogitsWarper(p)(None, random.clone())
        assert torch.equal(torch.isfinite(nucleus(random, p, "hf")), torch.isfinite(hf))
        torch.testing.assert_close(nucleus(random, p, "remdm").softmax(-1), _reference_nucleus(random.softmax(-1), p))


def test_remdm_conf_remasks_by_the_softmax_of_minus_the_drawn_probability():
    from geoprobe.samplers.base import RevealState
    from geoprobe.samplers.masked import ReMDMConf

    oracle = Oracle(PRIOR)
    state = RevealState(oracle.table, oracle.s_max, 2, 3, torch.Generator().manual_seed(0))
    state.tokens[0] = torch.tensor([2, -1, 4])
    state.probability[0] = torch.tensor([0.9, float("nan"), 0.5])
    # row 1: nothing revealed; alpha_t = 0.5, alpha_s = 0.75: sigma_max = min(1, 0.25 / 0.5) = 0.5
    remask, reveal = ReMDMConf().probabilities(state, 0.5, 0.75, 0.5)
    e = np.exp([-0.9, -0.5])
    expected = np.array([[e[0] / e.sum() * 0.5, 0.0, e[1] / e.sum() * 0.5], [0.0, 0.0, 0.0]])
    np.testing.assert_allclose(remask.numpy(), expected, rtol=1e-6)
    assert reveal == pytest.approx((0.75 - 0.5) / 0.5)  # masked positions: MDLM's reveal


def test_remdm_conf_remasks_the_least_likely_tokens_more_often():
    """On the i.i.d. oracle each token is drawn with its prior probability, so remdm-conf remasks
    rare tokens first: compared with MDLM at the same budget the rarest token is sampled less."""
    oracle = Oracle(PRIOR)
    conf = make_sampler("remdm-conf", steps=32).sample(oracle, num=300, length=16, seed=2)
    plain = make_sampler("mdlm", steps=32).sample(oracle, num=300, length=16, seed=2)
    rare = len(PRIOR) - 1
    assert (conf.tokens == rare).float().mean() < (plain.tokens == rare).float().mean()


def test_final_argmax_stops_the_grid_at_the_references_eps_and_fills_what_is_left():
    from geoprobe.samplers.base import CountingDenoiser, RevealState
    from geoprobe.samplers.masked import FINAL_T

    sampler = make_sampler("mdlm", steps=4, final_argmax=True)
    steps = list(sampler.transitions(4))
    # t = 1 - 3 (1 - eps) / 4 -> eps: alpha_t = (1 - eps) 3 / 4, reveal (alpha_s - alpha_t) / (1 - alpha_t)
    a_t, a_s = 0.75 * (1 - FINAL_T), 1 - FINAL_T
    assert steps[-1][1] == pytest.approx((a_s - a_t) / (1 - a_t)) and steps[-1][1] < 1
    assert make_sampler("mdlm", steps=4).transitions(4).__next__()[1] == pytest.approx(0.25)
    # the final pass: every still-masked position takes the argmax at its z (masked: z = 0, the prior's mode)
    oracle = Oracle(PRIOR)
    state = RevealState(oracle.table, oracle.s_max, 2, 5, torch.Generator().manual_seed(0))
    state.tokens[0, :2] = torch.tensor([3, 5])
    counting = CountingDenoiser(oracle)
    tokens = sampler.refine(counting, state, 0, torch.Generator().manual_seed(0))
    assert tokens[0].tolist() == [3, 5, 0, 0, 0] and tokens[1].tolist() == [0] * 5 and counting.nfe == 1


def _reference_loop(T, t_on=0.55, t_off=0.05, alpha_on=0.9, eta=0.02, eps=1e-5):
    """ReMDM's remdm-loop step probabilities (remask, reveal), transcribed from its sampling code:
    the phase from t at the step's start; MDLM reveals (m_t - m_s) / m_t of the masked."""
    ts, dt = np.linspace(1, eps, T + 1), (1 - eps) / T
    for t in ts[:-1]:
        if t > t_on:
            m_t, m_s = 1 - (1 - t) * alpha_on / (1 - t_on), 1 - (1 - t + dt) * alpha_on / (1 - t_on)
        elif t <= t_off:
            m_t, m_s = t * (1 - alpha_on) / t_off, (t - dt) * (1 - alpha_on) / t_off
        else:
            yield eta, eta * alpha_on / (1 - alpha_on)
            continue
        yield 0.0, max(0.0, min(1.0, (m_t - m_s) / m_t))


def _masked_at_the_end(steps):
    masked = 1.0
    for remask, reveal in steps:
        masked = masked * (1 - reveal) + (1 - masked) * remask
    return masked


@pytest.mark.parametrize("T", [16, 128, 1024])
def test_remdm_loop_follows_the_reference_except_on_the_steps_that_cross_t_on_and_t_off(T):
    ours = list(make_sampler("remdm-loop", steps=T, final_argmax=True).transitions(T))
    reference = list(_reference_loop(T))
    differ = [k for k, (a, b) in enumerate(zip(ours, reference)) if not np.allclose(a, b, atol=1e-9)]
    if T >= 128:
        assert len(differ) <= 2
        assert abs(_masked_at_the_end(ours) - _masked_at_the_end(reference)) < 1e-3
    else:  # documented in samplers/masked.py: at T = 16 the reference leaves ~8 % for its final argmax
        assert _masked_at_the_end(reference) > 0.05 and _masked_at_the_end(ours) < 1e-3


def test_presets_set_the_references_knobs_and_explicit_flags_win():
    from geoprobe.samplers import sampler_from_flags

    cap = sampler_from_flags("remdm-cap", preset="remdm-paper")
    assert (cap.steps, cap.top_p, cap.top_p_rule, cap.final_argmax, cap.eta_cap) == (1024, 0.9, "remdm", True, 0.008)
    assert sampler_from_flags("remdm-rescale", preset="remdm-paper").eta == 0.015
    loop = sampler_from_flags("remdm-loop", preset="remdm-paper", eta=0.05, steps=128)
    assert (loop.eta, loop.steps, loop.t_on, loop.alpha_on) == (0.05, 128, 0.55, 0.9)
    hybrid = sampler_from_flags("hybrid", "remdm-loop", preset="dsl-paper")
    assert hybrid.steps == 48 and hybrid.finisher.name == "remdm-loop"
    assert sampler_from_flags("hybrid").steps == 48  # the hybrid's own default budget, not another sampler's 64
    assert sampler_from_flags("mdlm", preset=None).final_argmax is False


def test_nfe_per_sample_counts_each_samples_evaluations():
    oracle = Oracle(PRIOR)
    result = make_sampler("mdlm", steps=8, cache=False).sample(oracle, num=3, length=6, seed=0)
    assert result.nfe == 8 and result.nfe_per_sample == 8
    cached = make_sampler("mdlm", steps=64).sample(oracle, num=3, length=6, seed=0)
    assert cached.nfe_per_sample == cached.rows / 3 and cached.nfe_per_sample <= cached.nfe


@pytest.mark.parametrize("name", ["mdlm", "roar", "hybrid"])
def test_batches_draw_from_one_generator_and_count_as_one_unbatched_draw(name):
    """--batch: a batch as large as --num is the unbatched draw, bit for bit; smaller batches
    continue one generator, so their first batch is the unbatched draw of that many samples and a
    rerun gives the same samples; nfe counts one batch's calls, rows every sample's."""
    oracle = Oracle(PRIOR)

    def draw(**kw):
        return make_sampler(name, steps=6, cache=False).sample(oracle, length=6, seed=3, **kw)

    whole = draw(num=10)
    assert torch.equal(draw(num=10, batch=10).tokens, whole.tokens)
    assert torch.equal(draw(num=10, batch=64).tokens, whole.tokens) and draw(num=10, batch=64).settings["batch"] == 10
    batched = draw(num=10, batch=4)
    assert batched.tokens.shape == (10, 6) and batched.settings["batch"] == 4 and "batch" not in whole.settings
    assert torch.equal(batched.tokens[:4], draw(num=4).tokens)  # the first batch starts the same generator
    assert torch.equal(draw(num=10, batch=4).tokens, batched.tokens)
    assert not torch.equal(batched.tokens[4:], whole.tokens[4:])  # the later batches continue it
    assert batched.nfe == whole.nfe and batched.rows == whole.rows == 10 * whole.nfe
    assert batched.nfe_per_sample == whole.nfe_per_sample
    with pytest.raises(BadInput, match="--batch must be at least 1"):
        draw(num=10, batch=0)


@pytest.mark.parametrize("name", ["mdlm", "roar", "hybrid"])
def test_a_batched_draw_resumed_from_any_batch_gives_the_unbroken_draws_samples(name):
    """`on_batch`'s progress, handed back as `resume` to a fresh sampler, continues the draw: the
    same tokens, nfe and rows as the unbroken draw, from every batch boundary; the resumed draw
    reports no progress past its last batch. Progress of another shape is refused in one line."""
    oracle = Oracle(PRIOR)

    def draw(**kw):
        return make_sampler(name, steps=6, cache=False).sample(oracle, num=10, length=6, seed=3, batch=4, **kw)

    kept = []
    whole = draw(on_batch=kept.append)
    assert [k["done"] for k in kept] == [4, 8]  # after every batch but the last
    for progress in kept:
        later = []
        resumed = draw(resume=progress, on_batch=lambda p: later.append(p["done"]))
        assert torch.equal(resumed.tokens, whole.tokens)
        assert (resumed.nfe, resumed.rows, resumed.settings) == (whole.nfe, whole.rows, whole.settings)
        assert resumed.seconds >= progress["seconds"] and later == [d for d in (4, 8) if d > progress["done"]]
    wrong = {**kept[0], "tokens": kept[0]["tokens"][:3]}
    with pytest.raises(BadInput, match="cannot resume a draw of 10 x 6 in batches of 4"):
        draw(resume=wrong)


def test_a_killed_batched_sample_goes_on_from_its_last_batch(tmp_path, corpus_txt, monkeypatch):
    """`geoprobe sample --batch` keeps its progress after each batch: interrupted in its third
    batch, a rerun draws only the rest and writes the unbroken draw's samples (its meta says where it
    resumed), and the progress file is gone. Another set's progress in that folder is refused in
    one line, and --force drops it."""
    import json

    from geoprobe.samplers.base import Sampler
    from geoprobe.workflows.generate import PARTIAL
    from tests.helpers import assert_one_line_error, invoke

    dsl = tmp_path / "dsl"
    assert invoke("-q", "dsl", "train", "--corpus", corpus_txt, "--tokenizer", "words", "--steps", 1, "--batch-size", 2,
                  "--seq-len", 16, "--d-model", 16, "--n-layers", 1, "--out", dsl, "--device", "cpu")[0] == 0
    common = ["sample", "--model", dsl, "--sampler", "mdlm", "--num", 6, "--length", 8, "--steps", 4, "--batch", 2,
              "--device", "cpu"]

    def ids(folder):
        return [json.loads(line)["token_ids"] for line in (folder / "samples.jsonl").read_text().splitlines()]

    assert invoke("-q", *common, "--out", tmp_path / "whole")[0] == 0
    draw_batch, calls = Sampler.draw_batch, []

    def dies_in_the_third(self, *args):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return draw_batch(self, *args)

    monkeypatch.setattr(Sampler, "draw_batch", dies_in_the_third)
    code, _, _ = invoke("-q", *common, "--out", tmp_path / "cut")
    assert code != 0 and (tmp_path / "cut" / PARTIAL).is_file() and not (tmp_path / "cut" / "samples.jsonl").exists()
    code, out, err = invoke("--format", "json", *common, "--out", tmp_path / "cut")
    assert code == 0, err
    assert len(calls) == 4  # the rerun drew the third batch only
    assert ids(tmp_path / "cut") == ids(tmp_path / "whole") and not (tmp_path / "cut" / PARTIAL).exists()
    assert json.loads(out)["meta"]["resumed_at"] == 4
    monkeypatch.setattr(Sampler, "draw_batch", dies_in_the_third)
    calls.clear()
    invoke("-q", *common, "--out", tmp_path / "other")
    code, _, err = invoke(*common[:-4], "--seed", 1, "--batch", 2, "--device", "cpu", "--out", tmp_path / "other")
    assert_one_line_error(code, err, 2, "holds the batches of another sample set (differs in: seed)")
    monkeypatch.setattr(Sampler, "draw_batch", draw_batch)
    code, out, err = invoke("--format", "json", *common[:-4], "--seed", 1, "--batch", 2, "--device", "cpu", "--force",
                            "--out", tmp_path / "other")
    assert code == 0, err
    assert json.loads(out)["meta"]["resumed_at"] is None and not (tmp_path / "other" / PARTIAL).exists()


@pytest.mark.parametrize("rule", ["hf", "remdm"])
def test_the_ar_ceiling_filters_with_the_samplers_nucleus(rule, tiny_models, tmp_path):
    """A nucleus too small for a second token leaves only the top one: sampling is then greedy
    decoding, whichever rule; a rule the samples' meta does not record would be untraceable."""
    import json

    from geoprobe.backbone import load_backbone
    from geoprobe.workflows.generate import SampleSettings, generate

    llama = tiny_models("llama")
    result = generate(llama, "ar", SampleSettings(num=2, length=8, top_p=1e-6, top_p_rule=rule, seed=3), tmp_path,
                      device="cpu")
    backbone = load_backbone(str(llama), device="cpu")
    tok = backbone.tokenizer
    start = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
    prompt = torch.full((2, 1), start)
    suppressed = sorted({t for t in (tok.eos_token_id, tok.unk_token_id) if t is not None})
    greedy = backbone.model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                     max_new_tokens=8, min_new_tokens=8, pad_token_id=start, eos_token_id=None,
                                     suppress_tokens=suppressed or None)
    assert [row["token_ids"] for row in result["samples"]] == greedy[:, 1:].tolist()
    meta = json.loads((tmp_path / "samples.meta.jsonl").read_text())
    assert meta["top_p_rule"] == rule and meta["top_p"] == 1e-6
