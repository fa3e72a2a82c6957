"""Generation metrics against hand-computed values and behavioural oracles; the HMM against
brute force; `geoprobe eval` bad input."""

import itertools
import json
import math

import numpy as np
import pytest
import torch

from geoprobe.metrics.evaluator import gen_ppl
from geoprobe.metrics.text import diversity, repetition, text_metrics, unigram_entropy
from geoprobe.synthetic import HMM, documents, hmm_from_spec
from tests.helpers import assert_one_line_error, invoke


def test_diversity_entropy_and_repetition_by_hand():
    texts = ["a b a b", "c d e f"]
    # bigrams: (a b)(b a)(a b) + (c d)(d e)(e f): 5 distinct of 6; trigrams 4 of 4; 4-grams 2 of 2
    d = diversity(texts)
    assert d["distinct_2"] == pytest.approx(5 / 6) and d["distinct_3"] == 1.0 and d["distinct_4"] == 1.0
    assert d["diversity"] == pytest.approx(5 / 6)
    assert unigram_entropy("a b a b") == pytest.approx(math.log(2))
    assert unigram_entropy("c d e f") == pytest.approx(math.log(4))
    assert text_metrics(texts)["unigram_entropy"] == pytest.approx((math.log(2) + math.log(4)) / 2)
    assert repetition(texts, 2) == pytest.approx((1 - 2 / 3 + 0) / 2)
    assert unigram_entropy("x x x") == 0.0


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


def test_gen_ppl_is_lower_on_the_evaluators_own_greedy_text(llama):
    backbone = llama
    tok = backbone.tokenizer
    start = torch.tensor([[tok.bos_token_id, 40]])
    greedy = backbone.model.generate(start, max_new_tokens=40, do_sample=False, pad_token_id=0)[0, 1:].tolist()
    rng = np.random.default_rng(0)
    shuffled = [greedy[0]] + list(rng.permutation(greedy[1:]))
    texts = [tok.decode(greedy)], [tok.decode(shuffled)]
    a, b = gen_ppl(backbone, texts[0]), gen_ppl(backbone, texts[1])
    assert a["gen_ppl"] < b["gen_ppl"], (a["gen_ppl"], b["gen_ppl"])
    assert a["scored_tokens"] > 10
    # chunking to a short context scores every token too
    assert gen_ppl(backbone, texts[0], context=8)["scored_tokens"] == a["scored_tokens"]


@pytest.mark.real
def test_mauve_of_references_against_themselves_and_against_shuffled_words(smollm2):
    from geoprobe.corpus import read_documents
    from geoprobe.metrics.evaluator import features, mauve_score

    docs = read_documents("kjv")[:200]
    texts = [" ".join(d.split()[:30]) for d in docs]
    rng = np.random.default_rng(0)
    shuffled = [" ".join(rng.permutation(t.split())) for t in texts]
    ref = features(smollm2, texts[:100])
    same = mauve_score(features(smollm2, texts[100:]), ref)
    garbled = mauve_score(features(smollm2, shuffled[100:]), ref)
    assert same["mauve"] > 0.8, same
    assert garbled["mauve"] < same["mauve"] - 0.3, (same, garbled)


def test_eval_end_to_end_and_bad_input(tmp_path, tiny_models):
    spec = "synthetic:hmm?states=4&vocab=40&docs=60&length=20&seed=1"
    samples = tmp_path / "samples.jsonl"
    samples.write_text("".join(json.dumps({"text": t}) + "\n" for t in documents(spec)[:12]))
    code, out, err = invoke("--format", "json", "eval", samples, "--evaluator", tiny_models("llama"),
                            "--references", spec, "--device", "cpu")
    assert code == 0, err
    row = json.loads(out)[str(samples)]
    for key in ("gen_ppl", "diversity", "unigram_entropy", "mauve", "mauve_std", "oracle_nll_per_word"):
        assert math.isfinite(row[key]), key
    assert row["oracle_nll_per_word"] == pytest.approx(row["oracle_entropy_rate"], rel=0.25)
    assert (tmp_path / "samples.metrics.json").is_file()

    code, _, err = invoke("eval", tmp_path / "none.jsonl", "--evaluator", tiny_models("llama"))
    assert_one_line_error(code, err, 2, "samples file not found")
    (tmp_path / "empty.jsonl").write_text("\n")
    code, _, err = invoke("eval", tmp_path / "empty.jsonl", "--evaluator", tiny_models("llama"))
    assert_one_line_error(code, err, 2, "is empty")
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"text": oops}\n')
    code, _, err = invoke("eval", tmp_path / "bad.jsonl", "--evaluator", tiny_models("llama"))
    assert_one_line_error(code, err, 2, "bad.jsonl:2: not valid JSON")
    (tmp_path / "few.txt").write_text("light water earth king stone bread wine tree field road\n")
    code, _, err = invoke("eval", samples, "--evaluator", tiny_models("llama"), "--references",
                          tmp_path / "few.txt", "--device", "cpu")
    assert_one_line_error(code, err, 2, "MAUVE needs at least as many references as samples")
    import shutil

    no_tok = tmp_path / "no-tokenizer"
    shutil.copytree(tiny_models("llama"), no_tok)
    for f in no_tok.glob("tokenizer*"):
        f.unlink()
    code, _, err = invoke("eval", samples, "--evaluator", no_tok, "--device", "cpu")
    assert_one_line_error(code, err, 2, "has no usable tokenizer")
