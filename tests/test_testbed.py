"""The testbed: the HMM (its forward algorithm against brute force, seeded synthetic corpora),
one whose structure makes the acceptance band meaningful, and a trained backbone that lands
inside it, measured again here on fresh held-out sequences."""

import itertools
import math

import numpy as np
import pytest

from geoprobe.synthetic import HMM, documents, hmm_from_spec, parse_spec
from geoprobe.testbed import CORPUS, held_out_nll, tokenizer_for


def test_sticky_hmm_baselines_match_their_empirical_counterparts_and_leave_room_above_the_rate():
    hmm = hmm_from_spec(CORPUS)
    ids = hmm.sample_many(400, 250, np.random.default_rng(3)).reshape(-1)
    freq = np.bincount(ids, minlength=hmm.emission.shape[1]) / len(ids)
    empirical = -(freq[freq > 0] * np.log(freq[freq > 0])).sum()
    base = hmm.baselines()
    assert base["unigram"] == pytest.approx(empirical, abs=0.03)
    rate = hmm.entropy_rate()
    # a model that ignores context, or sees one word of it, is outside the 10% band
    assert base["unigram"] > base["bigram"] > 1.1 * rate
    # the vectorised sampler draws from the same chain as the scalar one: same per-word likelihood
    scalar = [hmm.sample(250, np.random.default_rng(i)) for i in range(40)]
    per_word = np.mean([-hmm.log_prob(s) / 250 for s in scalar])
    vector = np.mean([-hmm.log_prob(s.tolist()) / 250 for s in hmm.sample_many(40, 250, np.random.default_rng(9))])
    assert per_word == pytest.approx(vector, abs=0.1)


def test_synthetic_spec_takes_shape_parameters_and_refuses_bad_ones():
    spec = parse_spec("synthetic:hmm?states=4&vocab=30&emission=0.05&stick=0.5")
    assert spec["emission"] == 0.05 and spec["stick"] == 0.5 and spec["transition"] == 0.5
    hmm = HMM.random(4, 30, 0, 0.05, 0.5, 0.5)
    assert np.all(np.diag(hmm.transition) >= 0.5)
    from geoprobe.errors import BadInput

    with pytest.raises(BadInput, match="malformed synthetic option stick=x"):
        parse_spec("synthetic:hmm?stick=x")
    with pytest.raises(BadInput, match="0 <= stick < 1"):
        hmm_from_spec("synthetic:hmm?stick=1.5")


def test_testbed_is_within_ten_percent_of_the_entropy_rate_on_fresh_text(testbed):
    import torch
    from transformers import AutoModelForCausalLM

    folder, record = testbed
    hmm = hmm_from_spec(record["corpus"])
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    fit = held_out_nll(model, hmm, tokenizer_for(hmm), sequences=128, seed=12345)  # not the build's held-out seed
    rate = hmm.entropy_rate()
    assert fit["model_nll"] <= 1.10 * rate, (fit, rate)
    assert fit["model_nll"] >= fit["hmm_nll"] - 0.05  # nothing beats the true distribution (up to sampling noise)
    assert fit["model_nll"] < hmm.baselines()["bigram"]  # it uses more than one word of context
    assert math.isclose(record["entropy_rate"], rate, rel_tol=1e-9)  # the record is reproducible


def test_hmm_forward_equals_brute_force_enumeration():
    hmm = HMM.random(states=3, vocab=4, seed=5, concentration=1.0)
    ids = [0, 3, 1, 1, 2]
    total = 0.0
    for path in itertools.product(range(3), repeat=len(ids)):
        p = hmm.initial[path[0]] * hmm.emission[path[0], ids[0]]
        for prev, cur, word in zip(path, path[1:], ids[1:]):
            p *= hmm.transition[prev, cur] * hmm.emission[cur, word]
        total += p
    assert hmm.log_prob(ids) == pytest.approx(math.log(total), rel=1e-10)
    # probabilities of all sequences of length 3 sum to one
    assert sum(math.exp(hmm.log_prob(list(s))) for s in itertools.product(range(4), repeat=3)) == pytest.approx(1.0)
    assert hmm.text_log_prob(hmm.text(ids)) == pytest.approx(hmm.log_prob(ids))
    assert hmm.text_log_prob("zzz") == float("-inf")


def test_synthetic_corpus_is_seeded_and_its_entropy_rate_is_below_the_uniform_rate():
    spec = "synthetic:hmm?states=4&vocab=50&docs=5&length=20&seed=3"
    assert documents(spec) == documents(spec)
    assert len(documents(spec)) == 5 and all(len(d.split()) == 20 for d in documents(spec))
    assert documents(spec) != documents(spec.replace("seed=3", "seed=4"))
    assert 0 < hmm_from_spec(spec).entropy_rate(4000) < math.log(50)


def test_oracle_start_distributions_and_expected_bigrams_against_enumeration():
    hmm = HMM.random(states=3, vocab=4, seed=5, concentration=1.0, transition=1.0)
    # "anywhere" in a 3-word document: the text x_1..n is the document's words from a uniform
    # position on, so p(text) = mean over positions o of p(x | state distribution at o)
    ids = [2, 0]
    at = [hmm.initial @ np.linalg.matrix_power(hmm.transition, o) for o in range(3)]
    expected = np.mean([math.exp(hmm.log_prob(ids, a)) for a in at])
    assert math.exp(hmm.log_prob(ids, hmm.start("anywhere", 3))) == pytest.approx(expected, rel=1e-10)
    assert np.allclose(hmm.start("document", 3), hmm.initial)
    # per-document blocks of 2 words in a 3-word document start at words 0 and 2
    assert np.allclose(hmm.start("blocks:2", 3), (at[0] + at[2]) / 2)
    # the expected bigram distribution of a 3-word text: the mean of its two bigrams' exact joint
    # distributions, by enumerating all 4^3 texts
    table = np.zeros((4, 4))
    for text in itertools.product(range(4), repeat=3):
        p = math.exp(hmm.log_prob(list(text)))
        table[text[0], text[1]] += p / 2
        table[text[1], text[2]] += p / 2
    assert np.allclose(hmm.bigram_distribution(hmm.initial, 3), table, atol=1e-12)


def test_oracle_scores_bigram_distance_by_hand_and_repetition_cannot_win_it():
    from geoprobe.synthetic import bigram_tv, oracle_scores

    expected = np.array([[0.5, 0.0], [0.25, 0.25]])
    # bigrams of [0, 0, 1] and [1, 0]: (0,0) (0,1) (1,0): frequencies 1/3 each
    assert bigram_tv([[0, 0, 1], [1, 0]], expected) == pytest.approx(0.5 * (1 / 6 + 1 / 3 + 1 / 12 + 1 / 4))
    hmm = hmm_from_spec(CORPUS)
    likely = int(np.argmax(hmm.emission[np.argmax(hmm.initial)]))
    repeated = [" ".join([hmm.words[likely]] * 32)] * 32
    own = [hmm.text(row) for row in hmm.sample_many(32, 32, np.random.default_rng(4))]
    rep, real = oracle_scores(hmm, repeated, "document", 64), oracle_scores(hmm, own, "document", 64)
    assert rep["oracle_nll_per_word"] < real["oracle_nll_per_word"]  # the NLL alone rewards repetition
    assert rep["bigram_tv"] > 0.9 > real["bigram_tv"]  # the bigram distance does not
    assert real["bigram_tv"] == pytest.approx(real["bigram_tv_hmm"], abs=0.1)  # the HMM's own text sits at its floor
    assert len(real["oracle_nll_per_sample"]) == 32 and real["oracle_invalid"] == 0
    with pytest.raises(Exception, match="unknown oracle start"):
        oracle_scores(hmm, own, "middle", 64)


def test_the_testbed_script_retires_legacy_mdlm_models_and_writes_the_recipe_section(tmp_path):
    """experiments/testbed_results.py: an MDLM folder recorded before --mdlm-objective (legacy) is
    moved aside with the MDLM -> DSL model and both models' samples, a current one stays; the
    recipe section shows each arm's bound and a sampler's oracle NLL as mean ± sd over seeds."""
    import json

    from experiments.testbed_results import SAMPLERS, recipe_section, retire_legacy

    def model(name, seed, training):
        folder = tmp_path / "models" / f"{name}-seed{seed}"
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps({"kind": "dsl", "training": training}))
        (tmp_path / "samples" / f"{name}-seed{seed}" / "mdlm-4").mkdir(parents=True)

    model("mdlm", 0, {"snr": "endpoint"})  # legacy: no objective recorded
    model("mdlm-dsl", 0, {"snr": "mixed"})
    model("dsl", 0, {"snr": "mixed"})
    model("mdlm", 1, {"snr": "endpoint", "mdlm_objective": "mdlm"})
    model("mdlm-dsl", 1, {"snr": "mixed"})
    moved = retire_legacy(tmp_path)
    assert sorted(moved) == ["models/mdlm-dsl-seed0", "models/mdlm-seed0", "samples/mdlm-dsl-seed0",
                             "samples/mdlm-seed0"]
    assert (tmp_path / "legacy-objective" / "models" / "mdlm-seed0" / "config.json").is_file()
    assert {p.name for p in (tmp_path / "models").iterdir()} == {"dsl-seed0", "mdlm-seed1", "mdlm-dsl-seed1"}
    assert retire_legacy(tmp_path) == []

    rows = [{"arm": arm, "seed": seed, "bound": bound + 0.01 * seed, "sampler": s, "oracle_nll_per_word": 4.0 + seed}
            for arm, bound in (("recipe", 3.6), ("mdlm-long", 3.7)) for seed in (0, 1, 2) for s in SAMPLERS]
    text = "\n".join(recipe_section({"steps": [1500, 500], "num": 32, "sample_steps": 32, "rows": rows}))
    assert "MDLM for 1,500 steps then DSL (mixed SNR) fine-tuned from it for 500" in text and "MDLM for 2,000" in text
    assert "| `recipe` | 3.610 ± 0.010 | 5.00 ± 1.00 |" in text and "| `mdlm-long` | 3.710 ± 0.010 |" in text
    assert "p = " in text and "p = nan" not in text
