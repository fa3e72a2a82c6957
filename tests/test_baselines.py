"""The embedding-diffusion baselines (Diffusion-LM, SED, CoDAR): the schedules against their
closed forms, each objective against an independent numpy computation, what each paper trains
and what it leaves alone, the ancestral sampler's posterior, learning, exact resumption (kill -9
too), and the one-line refusals."""

import json

import numpy as np
import pytest
import torch

from geoprobe.bridges.embedding_diffusion import (PRESETS, BaselineTrainSettings, EmbeddingDiffusion,
    alphas_cumprod, held_out_losses, load_baseline, preset, schedule_function)
from geoprobe.bridges.kinds import KINDS
from geoprobe.bridges.train import CHECKPOINT, TrainConfig, train
from geoprobe.samplers import EMBEDDING_SAMPLERS, TOKEN_SAMPLERS
from geoprobe.samplers.ancestral import Ancestral, nearest_embedding, posterior, respaced
from tests.helpers import assert_one_line_error, invoke
from tests.test_dsl import V, markov_sequences
from tests.test_faults import finish, finished, kill_when, reference, same_weights, start

KINDS_HERE = tuple(PRESETS)


def small(kind: str, seed: int = 0, **shape) -> EmbeddingDiffusion:
    return EmbeddingDiffusion(preset(kind, vocab_size=V, d_model=32, n_layers=1, n_heads=2, **shape), seed=seed)


# --- the schedules and the sampler's algebra ----------------------------------------------------------

@pytest.mark.parametrize("name", ["sqrt", "cosine"])
def test_the_discretised_schedule_telescopes_to_its_closed_form(name):
    steps = 2000
    abar = alphas_cumprod(name, steps).numpy()
    f = schedule_function(name)
    closed = np.array([f((i + 1) / steps) / f(0) for i in range(steps)])
    clipped = np.array([1 - f((i + 1) / steps) / f(i / steps) > 0.999 for i in range(steps)])
    assert clipped.sum() <= 1 and clipped[-1]  # only the last beta is clipped (f(1) <= 0 for sqrt, = 0 for cosine)
    np.testing.assert_allclose(abar[:-1], closed[:-1], rtol=1e-9)
    assert np.all(np.diff(abar) < 0) and abar[-1] < 1e-3 and 0.98 < abar[0] < 1
    if name == "sqrt":  # Diffusion-LM's x_start noise: sqrt(1 - abar_0) = 0.121 at T = 2000
        assert abs(np.sqrt(1 - abar[0]) - 0.121) < 1e-3
    else:  # SED's: cosine with beta_1 = 2e-3 (the cosine's own first beta is 4e-5 at T = 1000)
        sed = alphas_cumprod(name, 1000, preset("sed", vocab_size=V).beta_min).numpy()
        betas = 1 - sed / np.concatenate([[1.0], sed[:-1]])
        assert abs(betas[0] - 2e-3) < 1e-12 and 1 - alphas_cumprod(name, 1000).numpy()[0] < 5e-5
        assert np.all(betas >= 2e-3 - 1e-12) and np.all(np.diff(betas) >= -1e-12)


def test_the_posterior_is_gaussian_conditioning():
    """q(x_s | x_t, x0) from Bayes' rule on x_s ~ N(sqrt(abar_s) x0, 1 - abar_s) and
    x_t | x_s ~ N(sqrt(alpha) x_s, 1 - alpha), alpha = abar_t / abar_s."""
    rng = np.random.default_rng(0)
    x0, x_t = rng.normal(size=5), rng.normal(size=5)
    for abar_t, abar_s in ((0.3, 0.7), (0.01, 0.5), (0.9, 0.95)):
        alpha = abar_t / abar_s
        precision = 1 / (1 - abar_s) + alpha / (1 - alpha)
        mean = (np.sqrt(abar_s) * x0 / (1 - abar_s) + np.sqrt(alpha) * x_t / (1 - alpha)) / precision
        got_mean, got_var = posterior(torch.tensor(x_t), torch.tensor(x0), abar_t, abar_s)
        np.testing.assert_allclose(got_mean.numpy(), mean, rtol=1e-10)
        assert abs(got_var - 1 / precision) < 1e-12


def test_nearest_embedding_and_respacing():
    rng = np.random.default_rng(1)
    table, x = rng.normal(size=(50, 6)), rng.normal(size=(3, 7, 6))
    brute = table[np.linalg.norm(x[:, :, None] - table[None, None], axis=-1).argmin(-1)]
    np.testing.assert_allclose(nearest_embedding(torch.tensor(x), torch.tensor(table)).numpy(), brute)
    visits = respaced(torch.ones(2000), 32)
    assert len(visits) == 32 and visits[0] == 0 and visits[-1] == 1999 and torch.all(visits.diff() > 0)
    # improved-diffusion's space_timesteps adds up a float stride (49.95): the 11th visit is
    # round(499.49999999999994) = 499 there, where an exact 10 x 49.95 = 499.5 would round to 500
    visits = respaced(torch.ones(1000), 21).tolist()
    assert 499 in visits and 500 not in visits and visits[-1] == 999
    assert len(respaced(torch.ones(10), 64)) == 10  # never more visits than the schedule has steps


# --- the objectives against numpy ----------------------------------------------------------------

def log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


@pytest.mark.parametrize("kind", KINDS_HERE)
def test_each_objective_against_an_independent_computation(kind):
    model = small(kind).double()
    cfg = model.cfg
    tokens = markov_sequences(4, 12, seed=1)
    draws = model.draw(tokens, torch.Generator().manual_seed(5))
    draws["t"][0] = 0  # Diffusion-LM scores row 0 against the clean embedding
    draws = {k: v.double() if v.is_floating_point() else v for k, v in draws.items()}
    with torch.no_grad():
        got = {k: float(v) for k, v in model.losses(tokens, draws).items()}

    E = model.embedding.weight.detach().numpy()
    abar = alphas_cumprod(cfg.schedule, cfg.diffusion_steps, cfg.beta_min).numpy()
    t, eps0, eps = draws["t"].numpy(), draws["eps0"].numpy(), draws["eps"].numpy()
    e = E[tokens.numpy()]
    sigma0 = np.sqrt(1 - abar[0]) if cfg.sigma0 is None else cfg.sigma0
    x_start = e + sigma0 * eps0
    x_t = np.sqrt(abar[t])[:, None, None] * x_start + np.sqrt(1 - abar[t])[:, None, None] * eps
    target = x_start.copy()
    if kind == "diffusion-lm":
        target[t == 0] = e[t == 0]
    with torch.no_grad():
        net = lambda x, prev=None: model.predict_x0(torch.tensor(x), torch.tensor(t), prev).numpy()  # noqa: E731
        first = net(x_t)
        expected = {"diffusion": ((first - target) ** 2).mean()}
        estimate = first
        if cfg.self_condition:
            second = net(x_t, torch.tensor(first))
            expected["diffusion"] = (expected["diffusion"] + ((second - target) ** 2).mean()) / 2
            estimate = second
        if kind == "diffusion-lm":
            expected["prior"] = ((np.sqrt(abar[-1]) * x_start) ** 2).mean()
            logits = x_start @ E.T + model.head_bias.numpy()
        elif kind == "sed":
            assert model.readout.bias is None  # SED's R is a matrix
            logits = x_start @ model.readout.weight.numpy().T
        else:
            logits = model.decoder(torch.tensor(estimate), tokens[:, :-1]).numpy()
    nll = -np.take_along_axis(log_softmax(logits), tokens.numpy()[..., None], -1).mean()
    expected["rounding"] = nll
    expected["loss"] = sum(expected.values())
    assert got.keys() == expected.keys()
    for key in expected:
        assert abs(got[key] - expected[key]) < 1e-5 * max(1, abs(expected[key])), key  # float32 inside the loss
    if kind != "diffusion-lm":  # frozen embeddings of norm sqrt(d_emb)
        np.testing.assert_allclose(np.linalg.norm(E, axis=1), np.sqrt(cfg.d_emb), rtol=1e-6)


@pytest.mark.parametrize("kind", KINDS_HERE)
def test_each_loss_term_trains_what_its_paper_trains(kind):
    model = small(kind)
    tokens = markov_sequences(4, 12, seed=2)
    parts = model.losses(tokens, model.draw(tokens, torch.Generator().manual_seed(0)))

    def reaches(term, module) -> bool:
        params = [p for p in module.parameters() if p.requires_grad]
        if not params:
            return False
        grads = torch.autograd.grad(parts[term], params, retain_graph=True, allow_unused=True)
        return any(g is not None and g.abs().sum() > 0 for g in grads)

    assert reaches("diffusion", model.transformer) and not reaches("rounding", model.transformer)
    if kind == "diffusion-lm":  # the embedding learns from every term (the head is tied to it)
        assert all(reaches(term, model.embedding) for term in ("diffusion", "prior", "rounding"))
    else:  # frozen, and the rounding's own module learns from the rounding alone
        assert not model.embedding.weight.requires_grad
        rounding = model.readout if kind == "sed" else model.decoder
        assert reaches("rounding", rounding) and not reaches("diffusion", rounding)


def test_an_untrained_self_conditioned_model_reads_its_previous_estimate():
    model = small("sed")
    x, t = torch.randn(2, 5, model.cfg.d_emb), torch.tensor([10, 500])
    with torch.no_grad():
        assert not torch.equal(model.predict_x0(x, t), model.predict_x0(x, t, torch.randn_like(x)))
        assert torch.equal(model.predict_x0(x, t), model.predict_x0(x, t, torch.zeros_like(x)))


def test_the_codar_decoder_is_causal():
    """Output i never moves with a token at i or later: sampling left to right scores what teacher forcing scores."""
    model = small("codar").eval()
    x0, tokens = torch.randn(2, 6, model.cfg.d_emb), markov_sequences(2, 6, seed=3)
    with torch.no_grad():
        full = model.decoder(x0, tokens[:, :-1])
        changed = tokens.clone()
        changed[:, 3:] = (changed[:, 3:] + 1) % V
        other = model.decoder(x0, changed[:, :-1])
        torch.testing.assert_close(full[:, :4], other[:, :4])
        assert not torch.allclose(full[:, 4:], other[:, 4:])
        torch.testing.assert_close(model.decoder(x0, tokens[:, :2])[:, -1], full[:, 2])


@pytest.mark.parametrize("kind", KINDS_HERE)
def test_the_ancestral_sampler_valid_ids_budget_and_determinism(kind):
    model = small(kind).eval()
    a, b, c = (Ancestral(steps=12).sample(model, num=5, length=12, seed=seed) for seed in (3, 3, 4))
    assert a.tokens.shape == (5, 12) and a.tokens.dtype == torch.long
    assert a.tokens.min() >= 0 and a.tokens.max() < V and a.nfe == 12 and a.nfe_per_sample == 12
    assert torch.equal(a.tokens, b.tokens) and not torch.equal(a.tokens, c.tokens)
    # --batch: the first batch is the unbatched draw of that many; every batch makes the 12 visits
    batched = Ancestral(steps=12).sample(model, num=5, length=12, seed=3, batch=2)
    assert torch.equal(batched.tokens[:2], Ancestral(steps=12).sample(model, num=2, length=12, seed=3).tokens)
    assert batched.tokens.shape == (5, 12) and batched.nfe == 12 and batched.nfe_per_sample == 12


# --- learning and resuming --------------------------------------------------------------------------

def fit(kind: str, out, data, steps: int, seed: int = 0, model_seed: int = 0, save_every: int = 0,
        interrupt_at: int | None = None):
    """`steps` of the one training loop on rows of `data`; `interrupt_at`: die inside that step's loss."""
    cfg = TrainConfig(steps=steps, batch_size=16, lr=2e-3, warmup=10, save_every=save_every, seed=seed)
    model = small(kind, seed=model_seed)
    calls = iter(range(10 ** 9))

    def loss_fn(m, generator, shard):
        if next(calls) == interrupt_at:
            raise KeyboardInterrupt
        rows = torch.randint(0, len(data), (cfg.batch_size,), generator=generator)
        return m.losses(data[rows], m.draw(data[rows], generator))["loss"]

    train(model, loss_fn, cfg, out=out, device=torch.device("cpu"))
    return model


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS_HERE)
def test_a_trained_baseline_beats_its_untrained_self_on_held_out_rows(kind, tmp_path):
    data, held_out = markov_sequences(512, 16, seed=0), markov_sequences(64, 16, seed=1)
    before = held_out_losses(small(kind).eval(), held_out)
    model = fit(kind, tmp_path, data, steps=400).eval()
    after = held_out_losses(model, held_out)
    assert after["loss"] < 0.8 * before["loss"], (before, after)
    # (not every term: random embeddings round almost perfectly from the start, and Diffusion-LM's
    # embeddings then trade a little of that for the denoiser's error)
    assert after["diffusion"] < 0.5 * before["diffusion"]
    # its samples follow the chain (x_{i+1} = x_i + 1 with probability 0.9) more than chance (1/V) does
    # (0.21-0.43 here at 300-400 steps, 0.55 at 1,500; 64 x 15 transitions put chance's sd at 0.011)
    samples = Ancestral(steps=32).sample(model, num=64, length=16, seed=0).tokens
    follows = ((samples[:, 1:] - samples[:, :-1]) % V == 1).float().mean().item()
    assert follows > 1.5 / V, follows


@pytest.mark.parametrize("kind", KINDS_HERE)
def test_training_resumes_to_the_result_of_an_uninterrupted_run(kind, tmp_path):
    data = markov_sequences(128, 16, seed=2)
    full = fit(kind, tmp_path / "full", data, steps=20, seed=3, save_every=10)
    cut = tmp_path / "cut"
    with pytest.raises(KeyboardInterrupt):  # cut inside step 15, after the checkpoint at step 10
        fit(kind, cut, data, steps=20, seed=3, save_every=10, interrupt_at=15)
    assert (cut / CHECKPOINT).is_file()
    resumed = fit(kind, cut, data, steps=20, seed=3, model_seed=99, save_every=10)  # weights from the checkpoint
    a, b = full.state_dict(), resumed.state_dict()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=key)


TRAIN = ["--tokenizer", "words", "--batch-size", 8, "--seq-len", 32, "--warmup", 10, "--d-model", 32, "--n-layers", 1,
         "--n-heads", 2, "--device", "cpu"]


@pytest.mark.slow
def test_kill_9_during_baseline_train_then_rerun_equals_an_uninterrupted_run(tmp_path, corpus_txt):
    args = ["baseline", "train", "codar", "--corpus", corpus_txt, *TRAIN, "--steps", 600, "--save-every", 200]
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    uninterrupted = reference([*args, "--out", clean])
    victim = start([*args, "--out", killed])
    kill_when(victim, (killed / CHECKPOINT).is_file)  # after step 200 of 600
    done = finish([*args, "--out", killed])
    assert done.returncode == 0, done.stderr
    finished(uninterrupted)
    assert same_weights(killed / "model.safetensors", clean / "model.safetensors")
    timing = ("train_seconds", "steps_per_second")  # clocks: two sessions and a kill differ from one run
    a, b = (json.loads((root / "metrics.json").read_text()) for root in (killed, clean))
    assert {k: v for k, v in a.items() if k not in timing} == {k: v for k, v in b.items() if k not in timing}
    assert a["steps_run"] == 600


# --- the command line: train, sample, refuse ------------------------------------------------------

@pytest.fixture(scope="module")
def baselines(tmp_path_factory, corpus_txt):
    """One tiny trained model of each kind, with the plateau rule's evaluations."""
    root = tmp_path_factory.mktemp("baselines")
    for kind in KINDS_HERE:
        code, _, err = invoke("-q", "baseline", "train", kind, "--corpus", corpus_txt, *TRAIN, "--steps", 40,
                              "--eval-every", 10, "--out", root / kind)
        assert code == 0, err
    return root


@pytest.mark.parametrize("kind", KINDS_HERE)
def test_baseline_train_then_sample_end_to_end(kind, baselines, tmp_path):
    folder = baselines / kind
    record = json.loads((folder / "config.json").read_text())
    metrics = json.loads((folder / "metrics.json").read_text())
    assert record["kind"] == kind and record["network"]["d_emb"] == PRESETS[kind]["d_emb"]
    assert record["budget"] == {"steps": 40, "batch_size": 8, "seq_len": 32}
    assert [s for s, _ in metrics["val_curve"]] == [10, 20, 30, 40] and metrics["val_loss"] > 0
    assert load_baseline(folder).cfg.rounding == PRESETS[kind]["rounding"]
    code, out, err = invoke("--format", "json", "sample", "--model", folder, "--sampler", "ancestral", "--steps", 8,
                            "--num", 3, "--length", 10, "--out", tmp_path / "s", "--device", "cpu")
    assert code == 0, err
    meta = json.loads(out)["meta"]
    assert meta["nfe"] == 8 and meta["nfe_per_sample"] == 8
    rows = [json.loads(line) for line in (tmp_path / "s" / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(len(r["token_ids"]) == 10 for r in rows)


def test_baseline_samples_go_through_eval_and_compare_as_any_generators_do(baselines, tmp_path, tiny_models, corpus_txt):
    """What `--generation` does with them (experiments/smollm2_results.py): eval under an evaluator,
    then one compare table with their budgets matched."""
    files = []
    for kind in KINDS_HERE:
        out = tmp_path / kind
        assert invoke("-q", "sample", "--model", baselines / kind, "--sampler", "ancestral", "--steps", 4, "--num", 4,
                      "--length", 8, "--out", out, "--device", "cpu")[0] == 0
        files.append(out / "samples.jsonl")
    code, _, err = invoke("-q", "eval", *files, "--evaluator", tiny_models("llama"), "--references", corpus_txt,
                          "--device", "cpu")
    assert code == 0, err
    code, out, err = invoke("--format", "json", "compare", *files, "--out", tmp_path / "cmp")
    assert code == 0, err
    rows = json.loads(out)["rows"]
    assert sorted(r["generator"].rsplit("/", 1)[-1] for r in rows) == sorted(KINDS_HERE)
    assert {r["train_tokens"] for r in rows} == {40 * 8 * 32} and all(r["gen_ppl"] > 0 for r in rows)


def test_the_registry_gives_the_baselines_their_own_sampler():
    for kind in KINDS_HERE:
        assert KINDS[kind].samplers == EMBEDDING_SAMPLERS and not KINDS[kind].text_likelihood
    assert KINDS["dsl"].samplers == TOKEN_SAMPLERS and "ancestral" not in TOKEN_SAMPLERS


@pytest.mark.parametrize("args,fragment", [
    (["baseline", "train", "ld4lg"], "unknown baseline 'ld4lg' (use diffusion-lm, sed, codar)"),
    (["baseline", "train", "sed", "--d-model", 30, "--n-heads", 4], "must split into --n-heads 4 even head sizes"),
    (["baseline", "train", "sed", "--steps", 0], "Invalid value for '--steps'"),
])
def test_baseline_train_bad_flags_are_one_line(args, fragment, tmp_path, corpus_txt):
    code, _, err = invoke(*args, "--corpus", corpus_txt, "--out", tmp_path / "x")
    assert_one_line_error(code, err, 2, fragment)
    assert not (tmp_path / "x").exists()


def test_a_sampler_that_does_not_apply_and_another_run_are_refused(baselines, tmp_path, corpus_txt):
    code, _, err = invoke("sample", "--model", baselines / "sed", "--sampler", "mdlm", "--out", tmp_path / "s")
    assert_one_line_error(code, err, 2, "--sampler mdlm does not apply to a SED model")
    code, _, err = invoke("sample", "--model", baselines / "sed", "--sampler", "ancestral", "--steps", 1,
                          "--out", tmp_path / "s")
    assert_one_line_error(code, err, 2, "--sampler ancestral needs at least 2 --steps")
    code, _, err = invoke("nll", "--model", baselines / "codar", "--corpus", corpus_txt, "--device", "cpu")
    assert_one_line_error(code, err, 2, "nll scores")
    code, _, err = invoke("baseline", "train", "sed", "--corpus", corpus_txt, *TRAIN, "--steps", 40,
                          "--out", baselines / "codar")
    assert_one_line_error(code, err, 2, "holds a 'codar' checkpoint, not a 'sed' one")
    code, _, err = invoke("baseline", "train", "codar", "--corpus", corpus_txt, *TRAIN, "--steps", 41,
                          "--out", baselines / "codar")
    assert_one_line_error(code, err, 2, "holds another training run")
