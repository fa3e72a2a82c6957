"""Left-to-right decoding through a bridge (`ltr`, bridges/decode.py) and the hybrid's channel
evidence: an exact bridge decodes with the backbone's own AR distribution, decoding never reads
to the right, a causal bridge reads only its left and its cached decoding is the recomputed one,
and z_i enters the hybrid's logits at i by exactly <e_v, z_i>."""

import json
import shutil

import pytest
import torch

from geoprobe.bridges.decode import follow
from geoprobe.bridges.hidden import BridgeConfig, HiddenBridge, HybridDenoiser, Teacher
from geoprobe.bridges.kinds import KINDS
from geoprobe.bridges.nn import KVCache
from geoprobe.samplers import make_sampler
from geoprobe.samplers.base import gumbel_sample, nucleus
from tests.helpers import assert_one_line_error, invoke

LAYER = 2


def bridge(llama, seed=0, **kw) -> HiddenBridge:
    """A tiny bridge whose network matters: its zero-initialised output layer and adaLN are drawn
    at random, so every position's update reads its context."""
    cfg = BridgeConfig(layer=LAYER, vocab_size=llama.config.vocab_size, hidden_size=llama.hidden_size, d_model=64,
                       n_layers=2, n_heads=4, **kw)
    made = HiddenBridge(cfg, seed=seed).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in [*made.out.parameters(), *(b.modulation.bias for b in made.net.blocks)]:
            p.copy_(0.2 * torch.randn(p.shape, generator=generator))
    return made


def hybrid(llama, **kw) -> HybridDenoiser:
    return HybridDenoiser(bridge(llama, **kw), Teacher(llama, LAYER), llama.tokenizer.bos_token_id)


def with_bos(llama, tokens):
    return torch.cat([torch.full((len(tokens), 1), llama.tokenizer.bos_token_id), tokens], dim=1)


def forced(decoding, tokens) -> torch.Tensor:
    """(B, n + 1, V): the decoding's logits before each token of `tokens` (B, n) and after the last."""
    steps = []
    for i in range(tokens.shape[1]):
        steps.append(decoding.logits())
        decoding.append(tokens[:, i])
    return torch.stack([*steps, decoding.logits()], dim=1)


def exact(llama, model: HybridDenoiser):
    """Replace the bridge by the teacher: the states of the clean tokens its source holds."""
    d, embeddings = llama.hidden_size, model.teacher.embeddings

    def sample(a, steps=None, generator=None):
        ids = torch.cdist(a[..., :d], embeddings, compute_mode="donot_use_mm_for_euclid_dist").argmin(-1)
        assert torch.equal(a[..., :d], embeddings[ids])  # clean tokens (llama: no position offsets): their rows
        return model.teacher.states(ids).target

    model.bridge.sample = sample


def test_an_exact_bridge_decodes_left_to_right_with_the_backbones_ar_distribution(llama):
    model = hybrid(llama)
    exact(llama, model)
    tokens = torch.randint(5, 300, (2, 7), generator=torch.Generator().manual_seed(1))
    expected = llama.model(input_ids=with_bos(llama, tokens)).logits
    torch.testing.assert_close(forced(model.left_to_right(2, 7), tokens), expected, rtol=0, atol=1e-5)
    # the sampler's own draws: at every step, the backbone's logits of BOS and what it drew before
    seen = []

    class Recording:  # the decoding, its logits kept
        def __init__(self, decoding):
            self.decoding = decoding

        def logits(self):
            seen.append(self.decoding.logits())
            return seen[-1]

        def __getattr__(self, name):
            return getattr(self.decoding, name)

    decode = model.left_to_right
    model.left_to_right = lambda *args, **kw: Recording(decode(*args, **kw))
    drawn = make_sampler("ltr", top_p=0.9).sample(model, num=3, length=6, seed=2)
    expected = llama.model(input_ids=with_bos(llama, drawn.tokens)).logits[:, :-1]
    torch.testing.assert_close(torch.stack(seen, dim=1), expected, rtol=0, atol=1e-5)
    assert drawn.nfe == 6 and drawn.settings["steps"] == 6


def test_ltr_never_draws_what_the_ar_row_suppresses_and_otherwise_draws_the_same(llama):
    """EOS, the unknown token and untrained rows are never drawn, even where the stack puts nearly
    all its mass on EOS; the decoding's own logits stay the stack's; a draw that picks none of them
    is the unfiltered draw, token for token (Gumbel-max: a -inf only matters where it would win)."""
    from geoprobe.tokens import unsampled_ids

    tok = llama.tokenizer
    ids = unsampled_ids(tok, llama.config.vocab_size)
    assert tok.eos_token_id in ids and set(range(len(tok), llama.config.vocab_size)) <= set(ids)
    model = hybrid(llama)
    assert model.left_to_right(2, 3).unsampled.tolist() == ids
    decode = model.left_to_right

    def biased(*args, **kw):  # EOS nearly certain at every step
        decoding = decode(*args, **kw)
        logits = decoding.logits
        eos = torch.tensor([tok.eos_token_id])
        decoding.logits = lambda: logits().index_add(-1, eos, torch.full((len(decoding.tokens), 1), 50.0))
        return decoding

    model.left_to_right = biased
    drawn = make_sampler("ltr").sample(model, num=4, length=5, seed=3).tokens
    assert not torch.isin(drawn, torch.tensor(ids)).any()
    model.left_to_right = decode
    plain = make_sampler("ltr").sample(model, num=4, length=5, seed=3).tokens

    def unfiltered_decoding(*args, **kw):
        decoding = decode(*args, **kw)
        decoding.unsampled = decoding.unsampled[:0]
        return decoding

    model.left_to_right = unfiltered_decoding
    unfiltered = make_sampler("ltr").sample(model, num=4, length=5, seed=3).tokens
    assert not torch.isin(unfiltered, torch.tensor(ids)).any()  # this seed draws none of them unfiltered...
    assert torch.equal(plain, unfiltered)  # ...so the filter changes nothing
    # with a nucleus filter, as the ar row's processors run: the suppressed ids first, then the
    # nucleus of what is left (EOS holding 90 % of the mass would otherwise fill the nucleus alone)
    model.left_to_right = biased
    seen = []
    sampler = make_sampler("ltr", top_p=0.5)
    draw = sampler.draw

    def recorded(logits, generator):
        seen.append((logits, draw(logits, generator)))
        return seen[-1][1]

    sampler.draw = recorded
    drawn = sampler.sample(model, num=4, length=3, seed=5).tokens
    assert not torch.isin(drawn, torch.tensor(ids)).any() and len(seen) == 3
    for logits, tokens in seen:  # what the sampler filtered: EOS and the rest already at -inf
        assert torch.isinf(logits[:, ids]).all()
        kept = torch.isfinite(nucleus(logits, 0.5))
        assert kept.gather(1, tokens[:, None]).all()  # each draw from the nucleus of what is left
    unsuppressed = decode(4, 3).logits().index_add(-1, torch.tensor([tok.eos_token_id]), torch.full((4, 1), 50.0))
    assert torch.isfinite(nucleus(unsuppressed, 0.5)).sum(-1).eq(1).all()  # the other order keeps EOS alone


@pytest.mark.parametrize("attention", ["bidirectional", "causal"])
def test_left_to_right_decoding_never_reads_to_the_right(llama, attention):
    """Two sequences that part at token 4: every logit up to the one that draws token 4 is the
    same bit for bit, the next differs; and a longer decoding begins as the shorter one."""
    model = hybrid(llama, attention=attention)
    tokens = torch.randint(5, 300, (1, 8), generator=torch.Generator().manual_seed(3))
    other = tokens.clone()
    other[:, 4:] = torch.randint(5, 300, (1, 4), generator=torch.Generator().manual_seed(4))
    assert (other[:, 4] != tokens[:, 4]).all()
    # the bridge's noise from one seed for both (the default bridge is stochastic: its samples are draws)
    got, changed = (forced(model.left_to_right(1, 8, torch.Generator().manual_seed(0)), x) for x in (tokens, other))
    assert torch.equal(got[:, :5], changed[:, :5])
    assert not torch.allclose(got[:, 5], changed[:, 5])
    short = make_sampler("ltr").sample(model, num=2, length=5, seed=0).tokens
    long = make_sampler("ltr").sample(model, num=2, length=9, seed=0).tokens
    assert torch.equal(long[:, :5], short)


def test_a_causal_bridge_reads_only_its_left(llama):
    ids = torch.randint(5, 300, (2, 10), generator=torch.Generator().manual_seed(5))
    poisoned = ids.clone()
    poisoned[:, 6:] = torch.randint(5, 300, (2, 4), generator=torch.Generator().manual_seed(6))
    for attention in ("causal", "bidirectional"):
        model = hybrid(llama, attention=attention)
        offsets = model.teacher.offsets(10)
        h, h_poisoned = (model.bridge.sample(model.clean_source(x, offsets), generator=torch.Generator().manual_seed(0))
                         for x in (ids, poisoned))  # one noise draw for both: the default bridge is stochastic
        if attention == "causal":
            assert torch.equal(h[:, :6], h_poisoned[:, :6])
        else:  # the bidirectional bridge's states to the left do read the right
            assert not torch.allclose(h[:, :6], h_poisoned[:, :6])
        assert not torch.allclose(h[:, 6:], h_poisoned[:, 6:])


@pytest.mark.parametrize("arch,steps", [("llama", 1), ("llama", 3), ("gpt2", 1)])
def test_cached_decoding_equals_recomputed_decoding(tiny_models, arch, steps):
    """A causal bridge decoded with its prefix kept (the bridge's keys and values at each of its
    K sampler steps and the upper stack's cache) draws the same tokens as one that reconstructs
    the prefix at every step; the logits agree to float32 rounding (the kernels see other shapes).
    GPT-2: absolute positions, so the offsets of each new position count."""
    from geoprobe.backbone import load_backbone

    backbone = load_backbone(str(tiny_models(arch)), device="cpu")
    # deterministic (sigma_b = 0): a stochastic bridge's cached path draws each position's noise
    # once, the recomputed one redraws the prefix's every step, so they are different samplers
    model = hybrid(backbone, attention="causal", bridge_steps=steps, sigma_b=0.0)
    runs = {}
    for cached in (True, False):
        generator = torch.Generator().manual_seed(7)
        decoding = model.left_to_right(3, 12, generator, cached=cached)
        logits = []
        for _ in range(12):
            logits.append(decoding.logits())
            decoding.append(gumbel_sample(logits[-1], generator))
        runs[cached] = decoding.tokens, torch.stack(logits)
    assert torch.equal(runs[True][0], runs[False][0])
    torch.testing.assert_close(runs[True][1], runs[False][1], rtol=0, atol=1e-5)
    assert type(model.left_to_right(1, 2)).__name__ == "CachedDecoding"  # the default for a causal bridge


def test_the_cached_steps_are_the_bridge_sampler(llama):
    """`follow` over empty caches is `HiddenBridge.sample`, the noise of a stochastic bridge included."""
    model = hybrid(llama, attention="causal", sigma_b=0.5, bridge_steps=4, tau_zero=0.5)
    ids = torch.randint(5, 300, (2, 9), generator=torch.Generator().manual_seed(8))
    a = model.clean_source(ids, model.teacher.offsets(9))
    sampled = model.bridge.sample(a, 4, torch.Generator().manual_seed(3))
    followed = follow(model.bridge, model.bridge.standardise_source(a), [KVCache() for _ in range(4)],
                      torch.Generator().manual_seed(3))
    torch.testing.assert_close(followed, sampled, rtol=0, atol=1e-6)
    assert not torch.allclose(sampled, model.bridge.sample(a, 4, torch.Generator().manual_seed(4)))  # it is noisy


def test_the_channel_evidence_enters_the_hybrids_logits_at_its_own_position(llama):
    """With a causal bridge, z_i reaches no logit at i through the states (they are of positions
    < i): the stack's logits alone do not move when z_i does, and with the evidence they move by
    exactly <e_v, z_i' - z_i>. A deterministic bridge, so that two calls on one z agree."""
    model = hybrid(llama, attention="causal", sigma_b=0.0)
    table = model.token_table()
    generator = torch.Generator().manual_seed(9)
    z = 3 * torch.randn(2, 6, table.shape[1], generator=generator)
    moved = z.clone()
    moved[:, 3] += 5 * torch.randn(2, table.shape[1], generator=generator)
    model.evidence = False
    before, after = model(z), model(moved)
    assert torch.equal(before[:, :4], after[:, :4]) and not torch.allclose(before[:, 4:], after[:, 4:])
    model.evidence = True
    with_evidence, moved_evidence = model(z), model(moved)
    torch.testing.assert_close(with_evidence - before, z @ table.T, rtol=0, atol=1e-4)
    torch.testing.assert_close(moved_evidence[:, 3] - with_evidence[:, 3], (moved - z)[:, 3] @ table.T,
                               rtol=0, atol=1e-4)
    assert torch.equal(moved_evidence[:, :3], with_evidence[:, :3])


@pytest.mark.parametrize("name", ["roar", "mdlm"])
def test_a_stochastic_bridges_random_order_samples_follow_the_seed_not_the_global_rng(llama, name):
    """A stochastic bridge (σ_b > 0, K steps) draws its noise from a generator the sampler seeds:
    the same seed gives the same samples whatever the process's global RNG holds (before, the
    noise came from the global RNG: the same seed, other samples), and another seed other ones.
    A deterministic bridge gets no noise generator, nor does `ltr`, whose decoding seeds its own
    noise."""
    model = hybrid(llama, sigma_b=1.0, bridge_steps=4)

    def draw(seed, global_seed):
        torch.manual_seed(global_seed)
        return make_sampler(name, steps=4).sample(model, 3, 6, seed=seed, batch=2).tokens

    first = draw(0, global_seed=1)
    assert torch.equal(first, draw(0, global_seed=2))
    assert not torch.equal(first, draw(1, global_seed=1))
    for sigma_b, sampler, seeded in ((0.0, "roar", False), (1.0, "roar", True), (1.0, "ltr", False)):
        model = hybrid(llama, sigma_b=sigma_b, bridge_steps=4)
        make_sampler(sampler).seed_denoiser(model, 5)
        assert (model.noise is not None) == seeded, (sigma_b, sampler)


def test_a_draw_through_a_stochastic_bridge_resumed_from_any_batch_seeds_its_noise_as_the_unbroken_draw(llama):
    """A resumed draw seeds each later batch's bridge noise from that batch's absolute first
    sample, as the unbroken draw did (not from its index within the resumed run, which would draw
    the first batch's noise again), and gives the unbroken draw's samples from every boundary."""
    from samplers.base import noise_seed

    model = hybrid(llama, sigma_b=1.0, bridge_steps=4)
    seeds, seed_noise = [], model.seed_noise
    model.seed_noise = lambda seed: (seeds.append(seed), seed_noise(seed))

    def draw(**kw):
        seeds.clear()
        return make_sampler("roar", steps=4).sample(model, 5, 6, seed=2, batch=2, **kw)

    kept = []
    whole, unbroken = draw(on_batch=kept.append), list(seeds)
    assert unbroken == [noise_seed(2, first) for first in (0, 2, 4)] and len(set(unbroken)) == 3
    assert [k["done"] for k in kept] == [2, 4]
    for progress, tail in zip(kept, (unbroken[1:], unbroken[2:])):
        assert torch.equal(draw(resume=progress).tokens, whole.tokens) and seeds == tail, progress["done"]


def test_a_corpus_support_keeps_the_hybrids_tokens_inside_it(llama):
    """The converter names only its support: the evidence and left-to-right decoding put every
    other token at -inf, and the stack-only composition is left as it was."""
    support = torch.arange(10, 110)
    model = hybrid(llama, support_size=len(support))
    model.bridge.set_support(support)
    z = torch.randn(1, 5, model.bridge.cfg.d_tok)
    outside = torch.ones(llama.config.vocab_size, dtype=torch.bool)
    outside[support] = False
    assert torch.isinf(model(z)[..., outside]).all() and torch.isfinite(model(z)[..., support]).all()
    model.evidence = False
    assert torch.isfinite(model(z)).all()
    drawn = make_sampler("ltr").sample(model, num=4, length=8, seed=0).tokens
    assert ((drawn >= 10) & (drawn < 110)).all()


def train_flags(tiny_models, corpus_txt, out):
    return ["bridge", "--model", tiny_models("llama"), "--corpus", corpus_txt, "--layer", 1, "--steps", 2,
            "--batch-size", 2, "--seq-len", 32, "--d-model", 32, "--n-layers", 1, "--attention", "causal",
            "--out", out, "--device", "cpu"]


@pytest.fixture(scope="module")
def causal_bridge(tiny_models, corpus_txt, tmp_path_factory):
    out = tmp_path_factory.mktemp("ltr")
    code, _, err = invoke("-q", *train_flags(tiny_models, corpus_txt, out))
    assert code == 0, err
    return out / "bridges" / "layer-01" / "seed-0"


def test_a_bridge_recorded_before_attention_existed_is_bidirectional(causal_bridge, tiny_models, corpus_txt, tmp_path):
    from geoprobe.bridges.hidden import load_bridge

    root = tmp_path / "old"
    shutil.copytree(causal_bridge.parents[2], root)
    path = root / "bridges" / "layer-01" / "seed-0" / "config.json"
    record = json.loads(path.read_text())
    del record["network"]["attention"]
    path.write_text(json.dumps(record))
    assert load_bridge(path.parent)[0].cfg.attention == "bidirectional"
    code, _, err = invoke("bridge", *train_flags(tiny_models, corpus_txt, root)[1:])
    assert_one_line_error(code, err, 2, "differs in: bridge.attention")


def test_sample_decodes_a_bridge_left_to_right_and_other_kinds_refuse(causal_bridge, tmp_path):
    assert json.loads((causal_bridge / "config.json").read_text())["network"]["attention"] == "causal"
    common = ["--num", 2, "--length", 5, "--device", "cpu"]
    code, out, err = invoke("--format", "json", "sample", "--model", causal_bridge, "--sampler", "ltr", *common,
                            "--out", tmp_path / "s")
    assert code == 0, err
    meta = json.loads(out)["meta"]
    assert meta["sampler"] == "ltr" and meta["nfe"] == 5 and meta["steps"] == 5
    code, _, err = invoke("sample", "--model", causal_bridge, "--sampler", "ltr", "--decode", "round", *common,
                          "--out", tmp_path / "r")
    assert_one_line_error(code, err, 2, "--sampler ltr decodes through the upper stack")
    code, _, err = invoke("sample", "--model", causal_bridge, "--sampler", "ltr", "--steps", 3, *common,
                          "--out", tmp_path / "r")
    assert_one_line_error(code, err, 2, "ltr draws one token per step")
    assert [name for name, kind in KINDS.items() if "ltr" in kind.samplers] == ["bridge"]


def test_sample_refuses_ltr_for_a_dsl_model(tmp_path, corpus_txt):
    dsl = tmp_path / "dsl"
    assert invoke("-q", "dsl", "train", "--corpus", corpus_txt, "--tokenizer", "words", "--steps", 1, "--batch-size", 2,
                  "--seq-len", 16, "--d-model", 16, "--n-layers", 1, "--out", dsl, "--device", "cpu")[0] == 0
    code, _, err = invoke("sample", "--model", dsl, "--sampler", "ltr", "--out", tmp_path / "s", "--device", "cpu")
    assert_one_line_error(code, err, 2, "--sampler ltr does not apply to a DSL model")
