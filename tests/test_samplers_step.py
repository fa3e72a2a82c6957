"""The sampler step through a bridge's hybrid: the head applied only where a token is drawn
draws exactly the tokens of the full-vocabulary step it replaced (kept here as the slow
reference: float32 logits at every position from `run_from`, the changed rows found by comparing
z with the last call's), with the same evaluation counts; and the logits plan refuses a step that
does not fit in one line naming a --num that does."""

import json

import pytest
import torch

from geoprobe.backbone import load_backbone
from geoprobe.bridges.channel import posterior_logits
from geoprobe.errors import BadInput
from geoprobe.samplers import make_sampler
from geoprobe.samplers.base import MASK, RevealState, nucleus
from geoprobe.samplers.continuous import localize, snr_grid
from geoprobe.samplers.plan import LOGIT_BYTES, logits_bytes
from tests.helpers import assert_one_line_error, invoke
from tests.test_decode import causal_bridge, hybrid  # noqa: F401 (a fixture)
from tests.test_samplers import PRIOR, Oracle


def full_logits(model, z):
    """The hybrid's logits as the step computed them before: the upper stack and head at every
    position through `run_from`, shifted, in float32, then the evidence and the support."""
    logits = model.teacher.backbone.run_from(model.bridge.cfg.layer, model.hidden(z, model.noise))[:, :-1].float()
    return model.readable(posterior_logits(z.float(), model.token_table().float(), log_prior=logits))


def gumbel(logits, generator):
    u = torch.rand(logits.shape, generator=generator, dtype=torch.float64)
    tiny = torch.finfo(torch.float64).tiny
    return (logits.double() - torch.log(-torch.log(u.clamp(min=tiny, max=1 - 1e-16)))).argmax(-1)


class Full:
    """The counting wrapper as it was: full logits kept per row, the rows to recompute found by
    comparing z with the last call's."""

    def __init__(self, model, cache=True):
        self.model, self.cache, self.nfe, self.skipped, self.rows, self.z, self.logits = model, cache, 0, 0, 0, None, None

    def __call__(self, z):
        fresh = not self.cache or self.z is None
        changed = torch.ones(len(z), dtype=torch.bool) if fresh else (z != self.z).flatten(1).any(1)
        if not changed.any():
            self.skipped += 1
            return self.logits
        self.nfe, self.rows = self.nfe + 1, self.rows + int(changed.sum())
        logits = self.logits.clone() if not changed.all() else torch.empty(*z.shape[:2], self.model.vocab_size)
        logits[changed] = full_logits(self.model, z[changed])
        self.z, self.logits = z.clone(), logits
        return logits


def draw_at(sampler, state, where, logits, generator):
    filtered = nucleus(logits[where], sampler.top_p, sampler.top_p_rule)
    tokens = gumbel(filtered, generator)
    state.tokens[where] = tokens
    state.probability[where] = filtered.softmax(-1).gather(-1, tokens[:, None]).squeeze(-1)


def refine(sampler, full, state, steps, generator):
    """mdlm and ReMDM's step as it was: the network, then the reveal and remask draws."""
    for alpha_t, alpha_s, t in sampler.schedule(steps):
        remask_p, reveal_p = sampler.probabilities(state, alpha_t, alpha_s, t)
        logits = full(state.z())
        masked = state.masked
        u = torch.rand(masked.shape, generator=generator)
        reveal, remask = masked & (u < reveal_p), ~masked & (u < remask_p)
        if reveal.any():
            draw_at(sampler, state, reveal, logits, generator)
        state.tokens[remask] = MASK
    if sampler.final_argmax and state.masked.any():
        masked = state.masked
        state.tokens[masked] = full(state.z())[masked].argmax(-1)
    return state.tokens


def reference(sampler, model, num, length, seed):
    """(tokens, nfe, skipped, rows) of `sampler` run the old way (the bridge's noise seeded as a
    one-batch draw seeds it)."""
    from geoprobe.samplers.base import noise_seed

    model.seed_noise(noise_seed(seed, 0))
    generator = torch.Generator().manual_seed(seed)
    full, table = Full(model, sampler.cache), model.token_table()
    if sampler.name == "roar":
        k = sampler.plan(length)
        state = RevealState(table, model.s_max, num, length, generator)
        order = torch.rand(num, length, generator=generator).argsort(dim=1)
        rows = torch.arange(num)[:, None]
        for start in range(0, length, k):
            logits = full(state.z())
            cols = order[:, start:start + k]
            state.tokens[rows, cols] = gumbel(nucleus(logits[rows, cols], sampler.top_p, sampler.top_p_rule), generator)
        tokens = state.tokens
    elif sampler.name == "hybrid":
        z = localize(full, torch.zeros(num, length, table.shape[1]), snr_grid(sampler.continuous_steps, sampler.switch_snr),
                     generator, table)
        logits = full(z)
        commit = logits.softmax(-1).max(-1).values >= sampler.confidence
        state = RevealState(table, model.s_max, num, length, generator)
        if commit.any():
            draw_at(sampler, state, commit, logits, generator)
        tokens = refine(sampler.finisher, full, state, sampler.finishing_steps, generator)
    else:
        tokens = refine(sampler, full, RevealState(table, model.s_max, num, length, generator), sampler.steps, generator)
    return tokens, full.nfe, full.skipped, full.rows


CASES = [("roar", {}), ("roar", {"per_step": 3, "top_p": 0.9}), ("mdlm", {"steps": 40}),
         ("mdlm", {"steps": 6, "top_p": 0.8, "top_p_rule": "remdm", "final_argmax": True}),
         ("remdm-conf", {"steps": 12}), ("remdm-cap", {"steps": 30, "eta_cap": 0.1, "cache": False}),
         ("hybrid", {"steps": 10, "confidence": 0.3, "switch_snr": 20.0})]


@pytest.mark.parametrize("name,knobs", CASES)
def test_the_head_where_tokens_are_drawn_draws_the_full_vocabulary_steps_tokens(llama, name, knobs):
    """A stochastic bridge (its noise from a generator seeded by the draw) with a corpus support,
    float32 on the CPU: the same tokens, network calls, skipped calls and rows."""
    model = hybrid(llama, support_size=200)
    model.bridge.set_support(torch.arange(20, 220))
    torch.manual_seed(0)
    expected = reference(make_sampler(name, **knobs), model, 3, 10, seed=4)
    torch.manual_seed(0)
    result = make_sampler(name, **knobs).sample(model, 3, 10, seed=4)
    assert torch.equal(result.tokens, expected[0])
    assert (result.nfe, result.skipped, result.rows) == expected[1:]
    assert ((result.tokens >= 20) & (result.tokens < 220)).all()


@pytest.mark.parametrize("arch", ["llama", "gemma2", "gpt2"])
def test_the_hybrids_head_on_some_positions_is_its_full_logits_there(tiny_models, arch):
    """`logits_of` on chosen positions of `features` equals the full path's logits there (Gemma-2:
    its final soft-capping; GPT-2: position embeddings), and the hybrid's own call is the full path."""
    backbone = load_backbone(str(tiny_models(arch)), device="cpu")
    model = hybrid(backbone, sigma_b=0.0, tau_zero=1.0, bridge_steps=1)
    z = 4 * torch.randn(2, 7, model.bridge.cfg.d_tok, generator=torch.Generator().manual_seed(2))
    full = full_logits(model, z)
    rows, cols = torch.tensor([0, 1, 1]), torch.tensor([6, 0, 3])
    torch.testing.assert_close(model.logits_of(model.features(z)[rows, cols], z[rows, cols]), full[rows, cols],
                               rtol=0, atol=1e-5)
    torch.testing.assert_close(model(z), full, rtol=0, atol=1e-5)
    if arch == "gemma2":  # the cap binds: no logit beyond it
        assert backbone.config.final_logit_softcapping and full.abs().max() < 30.0 + z.abs().sum(-1).max()


class WholeLogits:
    """A DSL model seen as a denoiser without a separate head: the sampler keeps its float32
    logits at every position (the path every DSL model took before `features`)."""

    def __init__(self, model):
        self.model, self.vocab_size, self.s_max = model, model.vocab_size, model.s_max

    def token_table(self):
        return self.model.token_table()

    def __call__(self, z):
        return self.model(z)


def dsl_models(tiny_models):
    """A DSL from scratch with a padded vocabulary, and one from a pretrained tiny Llama."""
    from geoprobe.bridges.dsl import DSLConfig, DSLModel, pretrained_dsl

    scratch = DSLModel(DSLConfig(vocab_size=40, d_tok=8, d_model=32, n_layers=2, n_heads=4, tokenizer_size=37), seed=3)
    backbone = load_backbone(str(tiny_models("llama")), device="cpu", dtype="float32")
    return {"scratch": scratch.eval(), "pretrained": pretrained_dsl(str(tiny_models("llama")), backbone.tokenizer,
                                                                    d_tok=16).eval()}


@pytest.mark.parametrize("which", ["scratch", "pretrained"])
def test_a_dsl_models_head_on_some_positions_is_its_logits_there_and_samples_the_same_tokens(tiny_models, which):
    """The DSL's `logits_of` on chosen positions of `features` equals its own call there (its
    padded ids at the lowest value), and mdlm and roar draw exactly the tokens they drew from
    its logits at every position, with the same network calls."""
    model = dsl_models(tiny_models)[which]
    d_tok, vocab = model.cfg.d_tok, model.vocab_size
    z = 3 * torch.randn(2, 6, d_tok, generator=torch.Generator().manual_seed(1))
    rows, cols = torch.tensor([0, 1, 1]), torch.tensor([5, 0, 2])
    with torch.no_grad():
        full = model(z)
        torch.testing.assert_close(model.logits_of(model.features(z)[rows, cols], z[rows, cols]), full[rows, cols],
                                   rtol=0, atol=1e-5)
    if model.cfg.tokenizer_size:
        assert (full[..., model.cfg.tokenizer_size:] == torch.finfo(full.dtype).min).all()
    for name, knobs in [("mdlm", {"steps": 8}), ("roar", {"per_step": 2})]:
        split = make_sampler(name, **knobs).sample(model, 3, 6, seed=5)
        whole = make_sampler(name, **knobs).sample(WholeLogits(model), 3, 6, seed=5)
        assert torch.equal(split.tokens, whole.tokens), name
        assert (split.nfe, split.rows) == (whole.nfe, whole.rows)
        assert split.tokens.max() < (model.cfg.tokenizer_size or vocab)


def test_the_teachers_offsets_are_computed_once_per_length(tiny_models):
    backbone = load_backbone(str(tiny_models("gpt2")), device="cpu")
    model = hybrid(backbone)
    first = model.teacher.offsets(9)
    assert model.teacher.offsets(9) is first and model.teacher.offsets(5).shape == (5, backbone.hidden_size)
    ids = torch.zeros(1, 9, dtype=torch.long)
    torch.testing.assert_close(first, (backbone.embed(ids).float() - model.teacher.embeddings[ids])[0])
    assert first.abs().sum() > 0  # GPT-2's position embedding


def test_the_plan_counts_the_positions_each_sampler_draws_at():
    assert make_sampler("roar").logit_rows(4, 100) == 4 and make_sampler("roar", per_step=8).logit_rows(4, 100) == 32
    assert make_sampler("continuous").logit_rows(4, 100) == 400 and make_sampler("hybrid").logit_rows(4, 100) == 400
    assert make_sampler("mdlm", steps=1).logit_rows(4, 100) == 400  # one step reveals everything
    assert make_sampler("ltr").logit_rows(4, 100) == 4
    # 64 steps of mdlm: every position is revealed at one step, uniformly: Binomial(400, 1/64),
    # mean 6.25, 6 standard deviations 14.9, then rounded up and one more
    assert make_sampler("mdlm", steps=64).logit_rows(4, 100) == 23
    assert logits_bytes(23, 1000) == 23 * 1000 * LOGIT_BYTES


def test_a_step_that_does_not_fit_is_refused_naming_a_batch_that_does(llama, monkeypatch):
    """The tiny Llama's 320 tokens: roar draws one position a sequence a step, so --num 40 needs
    40 x 320 x 36 = 460,800 bytes of logits; with 200 KiB available (GEOPROBE_HOST_MEMORY_GIB)
    --batch 17 fits (195,840 bytes) and 18 does not (207,360). Refused before the bridge runs once;
    with --batch 17 the 40 samples are drawn 17, 17 and 6 at a time."""
    model = hybrid(llama)
    calls = []
    model.bridge.net.register_forward_pre_hook(lambda *_: calls.append(1))
    monkeypatch.setenv("GEOPROBE_HOST_MEMORY_GIB", str(200 * 1024 / 2**30))
    with pytest.raises(BadInput) as refused:
        make_sampler("roar").sample(model, num=40, length=6)
    line = str(refused.value)
    assert "\n" not in line and "--num 40 (40 positions x 320 tokens x 36 bytes)" in line, line
    assert "use --batch 17 or fewer" in line and "GEOPROBE_HOST_MEMORY_GIB" in line and not calls
    assert make_sampler("roar").sample(model, num=17, length=6).tokens.shape == (17, 6) and calls
    with pytest.raises(BadInput, match="at --batch 18 .18 positions.* use --batch 17 or fewer"):
        make_sampler("roar").sample(model, num=40, length=6, batch=18)
    drawn = make_sampler("roar").sample(model, num=40, length=6, batch=17)
    assert drawn.tokens.shape == (40, 6) and drawn.settings["batch"] == 17
    # every position of a step reads the posterior: even one sequence of 20 needs 20 x 320 x 36
    with pytest.raises(BadInput, match="even one sample needs 225.0 KiB: use a shorter --length"):
        make_sampler("continuous", steps=3).sample(model, num=1, length=20)
    # a denoiser without a separate head computes every position's logits: roar plans all of them
    oracle = Oracle(PRIOR)
    monkeypatch.setenv("GEOPROBE_HOST_MEMORY_GIB", str(6 * 36 * 10 / 2**30))
    assert make_sampler("roar").sample(oracle, num=2, length=5).tokens.shape == (2, 5)
    with pytest.raises(BadInput, match="--num 3 .15 positions.* use --batch 2 or fewer"):
        make_sampler("roar").sample(oracle, num=3, length=5)


def test_sample_refuses_logits_that_do_not_fit_in_one_line(causal_bridge, tmp_path, monkeypatch):
    """40 MiB available: the tiny backbone loads (its own plan needs 38.6 MiB), then mdlm in one
    step draws all 64 x 64 positions at once, 4,096 x 320 x 36 bytes = 45 MiB: refused, and --num
    56 fits (56 x 64 x 320 x 36 = 39.4 MiB) as a --batch."""
    monkeypatch.setenv("GEOPROBE_HOST_MEMORY_GIB", "0.0390625")
    code, _, err = invoke("sample", "--model", causal_bridge, "--sampler", "mdlm", "--steps", 1, "--num", 64,
                          "--length", 64, "--device", "cpu", "--out", tmp_path / "s")
    assert_one_line_error(code, err, 2, "sampling needs about 45.0 MiB of logits a step at --num 64")
    assert "use --batch 56 or fewer" in err and not (tmp_path / "s" / "samples.jsonl").exists()
    code, _, err = invoke("sample", "--model", causal_bridge, "--sampler", "mdlm", "--steps", 1, "--num", 64,
                          "--length", 64, "--batch", 56, "--device", "cpu", "--out", tmp_path / "s")
    assert code == 0, err
    meta = json.loads((tmp_path / "s" / "samples.meta.jsonl").read_text())
    assert meta["batch"] == 56 and meta["num"] == 64 and meta["nfe_per_sample"] == 1


def waits(llama, runs):
    """Host waits of our code (not transformers') per (sampler, knobs, length) of `runs`, each
    sampled through the hybrid on the pretend accelerator (tests/fake_device.py)."""
    from tests.fake_device import DEVICE, accelerator
    from tests.test_device import OURS

    counts = []
    with accelerator() as acc:
        llama.model.to(DEVICE)
        try:
            model = hybrid(llama, support_size=50)
            model.bridge.set_support(torch.arange(20, 70))
            model.bridge.to(DEVICE)
            model.bos_state = model.bos_state.to(DEVICE)
            for name, knobs, length in runs:
                acc.reset()
                make_sampler(name, **knobs).sample(model, 2, length, seed=0)
                counts.append(sum(v for k, v in acc.where.items() if k[1].startswith(tuple(f"['{o}'" for o in OURS))))
        finally:
            llama.model.to("cpu")
    return counts


def test_roar_never_waits_for_the_device_and_mdlm_once_a_step(llama):
    """roar: as many waits at 3 steps as at 6 (the tokens' read-back at the end); mdlm: one more
    a step (its reveal, read back before the network runs). Before, every call read back its count
    of changed rows, and an mdlm step its reveal mask more (`reveal.any()`, boolean indexing).
    transformers' mask builder waits once a forward of the upper stack: not counted here."""
    roar_3, roar_6, mdlm_2, mdlm_4 = waits(llama, [("roar", {}, 3), ("roar", {}, 6), ("mdlm", {"steps": 2}, 6),
                                                   ("mdlm", {"steps": 4}, 6)])
    assert roar_3 == roar_6 == 1 and mdlm_4 - mdlm_2 == 2, (roar_3, roar_6, mdlm_2, mdlm_4)
