"""Generation metrics against hand-computed values and behavioural oracles, `geoprobe eval` bad
input, and the correlation statistics the sweep reports (geoprobe/metrics/correlation.py): rho
and its one-sided permutation p against an exhaustive enumeration and scipy, Holm and the
reliability on hand-made tables, the partial Spearman correlation against its regression form."""

import itertools
import json
import math

import numpy as np
import pytest
import torch
from scipy import stats

from geoprobe.workflows.evaluate import gen_ppl
from geoprobe.metrics.text import (diversity_pooled, diversity_within, repetition, text_metrics, token_metrics,
                                   unigram_entropy, word_text)
from geoprobe.metrics.correlation import holm, partial_spearman, reliability, spearman_rho, spearman_with_uncertainty
from geoprobe.synthetic import documents
from tests.helpers import assert_one_line_error, invoke


def test_diversity_entropy_and_repetition_by_hand():
    texts = ["a b a b", "c d e f"]
    # bigrams: (a b)(b a)(a b) + (c d)(d e)(e f): 5 distinct of 6; trigrams 4 of 4; 4-grams 2 of 2
    d = diversity_pooled(texts)
    assert d["distinct_2"] == pytest.approx(5 / 6) and d["distinct_3"] == 1.0 and d["distinct_4"] == 1.0
    assert d["diversity_pooled"] == pytest.approx(5 / 6)
    assert unigram_entropy("a b a b") == pytest.approx(math.log(2))
    assert unigram_entropy("c d e f") == pytest.approx(math.log(4))
    assert text_metrics(texts)["unigram_entropy"] == pytest.approx((math.log(2) + math.log(4)) / 2)
    # SimCTG's rep-2, pooled sums: 1 - (2 + 3) / (3 + 3); and diversity_within = prod (1 - rep-n)
    assert repetition(texts, 2) == pytest.approx(1 - 5 / 6)
    assert repetition(["a"], 2) == 1.0 and diversity_within(["a"])["diversity_within"] == 0.0  # no bigram at all
    assert diversity_within(texts)["diversity_within"] == pytest.approx(
        math.prod(1 - repetition(texts, n) for n in (2, 3, 4)))
    assert unigram_entropy("x x x") == 0.0


def test_diversity_within_counts_repeats_inside_a_sample_only():
    # SimCTG's definition: distinct n-grams within each sample, summed over samples, over all n-grams
    texts = ["a b a b a", "a b a b a"]
    # each sample: bigrams ab ba ab ba (2 of 4), trigrams aba bab aba (2 of 3), 4-grams abab baba (2 of 2)
    d = diversity_within(texts)
    assert d["diversity_within"] == pytest.approx((4 / 8) * (4 / 6) * (4 / 4))
    assert d["diversity_within_per_sample"] == pytest.approx([0.5 * 2 / 3] * 2)
    # the pooled ratio also counts the second sample's n-grams as repeats of the first's
    assert diversity_pooled(texts)["diversity_pooled"] == pytest.approx((2 / 8) * (2 / 6) * (2 / 4))
    # two different samples without inner repeats: both are 1
    other = ["a b c d", "e f g h"]
    assert diversity_within(other)["diversity_within"] == 1.0 == diversity_pooled(other)["diversity_pooled"]
    # a sample too short for 4-grams contributes nothing to that factor's counts
    assert diversity_within(["a b c d", "x y"])["diversity_within"] == pytest.approx(1.0)


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


def _reference_gen_nll(backbone, ids: list[int], eos_id: int) -> tuple[float, int]:
    """The MDLM/ReMDM Gen.PPL of one id sequence, computed directly: the model's logits over the
    whole sequence, log_softmax, the NLL of each next token ids[1:] summed over their mask
    (token != eos) | (cumsum(token == eos) == 1) (`compute_generative_perplexity`: position 0,
    the text's first token or a BOS, is never a target)."""
    with torch.no_grad():
        logits = backbone.model(input_ids=torch.tensor([ids])).logits[0].float()
    logp = torch.log_softmax(logits, -1)
    text = torch.tensor(ids[1:])  # the targets: everything after BOS
    mask = (text != eos_id) | (torch.cumsum((text == eos_id).long(), 0) == 1)
    nll = -logp[torch.arange(len(text)), text]
    return float(nll[mask].sum()), int(mask.sum())


def test_gen_ppl_scores_every_token_but_eos_and_the_first_eos(llama):
    tok = llama.tokenizer
    enc = lambda piece: tok(piece, add_special_tokens=False)["input_ids"]  # noqa: E731
    end = tok.eos_token_id
    assert tok.eos_token == "<eos>" and tok.bos_token_id is not None
    body = enc("a b") + [end] + enc("c d") + [end] + enc("e")
    # as the references: no BOS, so the text's first token and the second EOS are not scored;
    # --gen-ppl-bos (geoprobe's earlier reading): BOS first, the text's first token scored after it
    for bos, ids in ((False, body), (True, [tok.bos_token_id] + body)):
        nll, count = _reference_gen_nll(llama, ids, end)
        assert count == len(ids) - 2
        # the file's EOS is the evaluator's own string, or another generator's: the same ids either way
        for text, eos in (("a b<eos>c d<eos>e", "<eos>"), ("a b<|endoftext|>c d<|endoftext|>e", "<|endoftext|>")):
            got = gen_ppl(llama, [text], eos=eos, bos=bos)
            assert got["tokens_per_sample"] == [count] and got["scored_tokens"] == count, text
            assert got["nll_per_sample"][0] == pytest.approx(nll, rel=1e-4), text
            assert got["gen_ppl"] == pytest.approx(math.exp(nll / count), rel=1e-4)
            # chunked to a short context, the same tokens are scored (the first EOS once)
            assert gen_ppl(llama, [text], context=4, eos=eos, bos=bos)["scored_tokens"] == count
    # a trailing run of EOS (an MDLM sample's padding) adds one scored token, the first EOS
    assert gen_ppl(llama, ["a b<eos><eos><eos>"], eos="<eos>")["scored_tokens"] == len(enc("a b")) - 1 + 1
    # without an EOS string the text is one document: the foreign string is tokenised as text
    plain = gen_ppl(llama, ["a b<|endoftext|>c d<|endoftext|>e"])
    assert plain["scored_tokens"] == len(enc("a b<|endoftext|>c d<|endoftext|>e")) - 1


def test_word_metrics_read_eos_as_a_word_break_and_keep_other_specials():
    assert word_text("a b<eos>c d", "<eos>") == "a b\nc d" and word_text("a b<eos>c", None) == "a b<eos>c"
    m = text_metrics(["a b<eos>c d"], eos="<eos>")
    assert m["unigram_entropy"] == pytest.approx(math.log(4))  # a b c d; glued ("bc") it would be log 3
    assert m["distinct_2"] == 1.0 and m["diversity_within_per_sample"] == [1.0]
    assert text_metrics(["a b<eos>c d"])["unigram_entropy"] == pytest.approx(math.log(3))  # no eos: "b<eos>c"
    # "<unk>" is what was generated: a word
    assert text_metrics(["x <unk> x <unk>"], eos="<eos>")["unigram_entropy"] == pytest.approx(math.log(2))
    # a break between repeats still repeats the words: rep-2 sees (a b) twice across the break
    assert text_metrics(["a b<eos>a b"], eos="<eos>")["rep_2"] == pytest.approx(1 - 2 / 3)


def test_token_entropy_is_the_entropy_of_each_rows_id_counts():
    rows = [[5, 5, 7, 1, 1, 1, 9], [3, 3, 3, 3], [0, 2, 4, 6, 8, 2]]
    expected = [stats.entropy(np.unique(r, return_counts=True)[1]) for r in rows]  # natural log
    got = token_metrics(rows)
    assert got["token_entropy_per_sample"] == pytest.approx(expected)
    assert got["token_entropy"] == pytest.approx(np.mean(expected))
    assert token_metrics([None, None]) == {"token_entropy": None, "token_entropy_per_sample": None}
    partial = token_metrics([rows[0], None])  # a mean over some rows only would not compare
    assert partial["token_entropy"] is None and partial["token_entropy_per_sample"][1] is None


def test_oracle_scores_each_document_from_its_start_and_counts_special_words_as_invalid():
    from geoprobe.synthetic import bigram_tv, hmm_from_spec, oracle_scores

    hmm = hmm_from_spec("synthetic:hmm?states=4&vocab=40&docs=10&length=20&seed=1")
    first, second = (row.tolist() for row in hmm.sample_many(2, 20, np.random.default_rng(3)))
    text = hmm.text(first) + "<eos>" + hmm.text(second)
    origin = hmm.start("anywhere", 20)
    expected = -(hmm.log_prob(first, origin) + hmm.log_prob(second, hmm.initial))
    assert not np.allclose(origin, hmm.initial)  # otherwise the second document's start would not show
    got = oracle_scores(hmm, [text], "anywhere", 20, eos="<eos>")
    assert got["oracle_words_per_sample"] == [40] and got["oracle_invalid"] == 0  # the EOS is no word
    assert got["oracle_nll_per_sample"][0] * 40 == pytest.approx(expected)
    assert got["oracle_nll_per_word"] == pytest.approx(expected / 40)
    assert got["oracle_nll_per_word"] != pytest.approx(-hmm.log_prob(first + second, origin) / 40)  # one chain
    # bigrams within each document, against the two starts' expected distributions (19 bigrams each)
    mixture = 0.5 * hmm.bigram_distribution(origin, 20) + 0.5 * hmm.bigram_distribution(hmm.initial, 20)
    assert got["bigram_tv"] == pytest.approx(bigram_tv([first, second], mixture))
    assert got["bigram_tv"] != pytest.approx(bigram_tv([first + second], mixture))
    # a trailing EOS ends the last document and adds nothing
    trailing = oracle_scores(hmm, [text + "<eos>"], "anywhere", 20, eos="<eos>")
    assert trailing["oracle_nll_per_sample"] == pytest.approx(got["oracle_nll_per_sample"])
    # a special token the decode keeps is not an HMM word: that sample has probability 0
    unk = hmm.text(first[:10]) + " <unk> " + hmm.text(first[10:])
    mixed = oracle_scores(hmm, [text, unk], "anywhere", 20, eos="<eos>")
    assert mixed["oracle_invalid"] == 1 and mixed["oracle_words_per_sample"] == [40, 0]
    assert mixed["oracle_nll_per_word"] == pytest.approx(expected / 40)
    # without the file's EOS string, "<eos>" glues two words into one the HMM does not know
    assert oracle_scores(hmm, [text], "anywhere", 20)["oracle_invalid"] == 1


def test_eval_reads_eos_and_token_ids_from_the_samples_file_and_compare_shows_them(tmp_path, tiny_models, llama):
    from geoprobe.workflows.evaluate import evaluate_samples, read_samples
    from geoprobe.workflows.compare import COLUMNS, comparison_row

    out = tmp_path / "gen"
    out.mkdir()
    texts = ["a b<eos>c d<eos>e", "light water<eos><eos>"]
    ids = [[5, 5, 6, 1, 2], [7, 8, 1, 1]]
    (out / "samples.jsonl").write_text("".join(json.dumps({"text": t, "token_ids": i}) + "\n"
                                               for t, i in zip(texts, ids)))
    meta = {"sampler": "x", "steps": 4, "nfe": 4, "nfe_per_sample": 3.5, "seconds": 1.0, "num": 2,
            "model": str(tmp_path / "none"), "file": str(out / "samples.jsonl"), "eos": "<eos>"}
    (out / "samples.meta.jsonl").write_text(json.dumps(meta) + "\n")
    results, _ = evaluate_samples([out / "samples.jsonl"], str(tiny_models("llama")), None, None, device="cpu")
    row = results[str(out / "samples.jsonl")]
    assert row["eos"] == "<eos>"
    assert row["scored_tokens"] == gen_ppl(llama, texts, eos="<eos>")["scored_tokens"]
    assert row["gen_ppl"] == pytest.approx(gen_ppl(llama, texts, eos="<eos>")["gen_ppl"], rel=1e-5)
    assert row["unigram_entropy"] == pytest.approx(text_metrics(texts, "<eos>")["unigram_entropy"])
    assert row["unigram_entropy_per_sample"][1] == pytest.approx(math.log(2))  # "light", "water"
    assert row["token_entropy_per_sample"] == pytest.approx([stats.entropy([2, 1, 1, 1]), stats.entropy([1, 1, 2])])
    assert read_samples(out / "samples.jsonl") == texts
    compared = comparison_row(out / "samples.jsonl")
    assert compared["nfe_per_sample"] == 3.5 and compared["token_entropy"] == row["token_entropy"]
    assert COLUMNS.index("nfe_per_sample") == COLUMNS.index("nfe") + 1
    assert COLUMNS.index("token_entropy") == COLUMNS.index("unigram_entropy") + 1
    # an older meta row (no "eos") and an external file (no token ids): one document, null entropy
    meta.pop("eos")
    (out / "samples.meta.jsonl").write_text(json.dumps(meta) + "\n")
    (out / "samples.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    results, _ = evaluate_samples([out / "samples.jsonl"], str(tiny_models("llama")), None, None, device="cpu")
    row = results[str(out / "samples.jsonl")]
    assert row["eos"] is None and row["token_entropy"] is None and row["token_entropy_per_sample"] is None
    assert row["unigram_entropy"] == pytest.approx(text_metrics(texts)["unigram_entropy"])
    assert comparison_row(out / "samples.jsonl")["token_entropy"] is None


@pytest.mark.slow
@pytest.mark.real
def test_mauve_of_references_against_themselves_and_against_shuffled_words(smollm2):
    from geoprobe.corpus import read_documents
    from geoprobe.workflows.evaluate import features, mauve_score

    docs = read_documents("kjv")[:200]
    texts = [" ".join(d.split()[:30]) for d in docs]
    rng = np.random.default_rng(0)
    shuffled = [" ".join(rng.permutation(t.split())) for t in texts]
    # 60 texts a side (MAUVE 0.91 vs 0.12 here; 100 a side gave 0.96 vs 0.10 at twice the time)
    ref = features(smollm2, texts[:60])
    same = mauve_score(features(smollm2, texts[100:160]), ref)
    garbled = mauve_score(features(smollm2, shuffled[100:160]), ref)
    assert same["mauve"] > 0.8, same
    assert garbled["mauve"] < same["mauve"] - 0.3, (same, garbled)


def test_eval_end_to_end_and_bad_input(tmp_path, tiny_models):
    # 400 documents: their 5 % held out give MAUVE more references than the 12 samples
    spec = "synthetic:hmm?states=4&vocab=40&docs=400&length=20&seed=1"
    samples = tmp_path / "samples.jsonl"
    samples.write_text("".join(json.dumps({"text": t}) + "\n" for t in documents(spec)[:12]))
    code, out, err = invoke("--format", "json", "eval", samples, "--evaluator", tiny_models("llama"),
                            "--references", spec, "--device", "cpu")
    assert code == 0, err
    row = json.loads(out)[str(samples)]
    for key in ("gen_ppl", "diversity_within", "diversity_pooled", "unigram_entropy", "mauve", "mauve_std",
                "oracle_nll_per_word", "bigram_tv", "bigram_tv_hmm"):
        assert math.isfinite(row[key]), key
    assert row["oracle_nll_per_word"] == pytest.approx(row["oracle_entropy_rate"], rel=0.25)
    # no generator record: MAUVE's references are cut to the samples' median length in the evaluator's ids
    assert row["mauve_references_cut_in"] == "evaluator" and row["mauve_reference_tokens"] > 20 and row["gen_ppl_first_token"] == "unscored"
    assert (tmp_path / "samples.metrics.json").is_file()
    assert row["evaluator"] == str(tiny_models("llama")) and row["evaluator_is_generator"] == []

    # several evaluators: each scores Gen.PPL, the first one's is `gen_ppl`; an AR sample set of
    # the llama itself is flagged (and warned about) under the llama, not under the other one
    llama, qwen = str(tiny_models("llama")), str(tiny_models("qwen2"))
    ar = tmp_path / "ar"
    assert invoke("-q", "sample", "--model", llama, "--sampler", "ar", "--num", 4, "--length", 12, "--out", ar,
                  "--device", "cpu")[0] == 0
    code, out, err = invoke("--format", "json", "eval", samples, ar / "samples.jsonl", "--evaluator",
                            f"{llama},{qwen}", "--device", "cpu")
    assert code == 0, err
    rows = json.loads(out)
    assert list(rows[str(samples)]["gen_ppl_by_evaluator"]) == [llama, qwen]
    assert rows[str(samples)]["gen_ppl"] == rows[str(samples)]["gen_ppl_by_evaluator"][llama]
    assert rows[str(samples)]["gen_ppl_by_evaluator"][llama] != rows[str(samples)]["gen_ppl_by_evaluator"][qwen]
    assert rows[str(ar / "samples.jsonl")]["evaluator_is_generator"] == [llama]
    assert "the generator's own backbone" in " ".join(err.split()) and rows[str(samples)]["evaluator_is_generator"] == []
    code, _, err = invoke("eval", samples, "--evaluator", f"{llama},", "--device", "cpu")
    assert_one_line_error(code, err, 2, "--evaluator needs one or more models")
    code, _, err = invoke("eval", samples, "--evaluator", llama, "--references", spec, "--oracle-start", "middle")
    assert_one_line_error(code, err, 2, "unknown oracle start")

    code, _, err = invoke("eval", tmp_path / "none.jsonl", "--evaluator", tiny_models("llama"))
    assert_one_line_error(code, err, 2, "samples file not found")
    (tmp_path / "empty.jsonl").write_text("\n")
    code, _, err = invoke("eval", tmp_path / "empty.jsonl", "--evaluator", tiny_models("llama"))
    assert_one_line_error(code, err, 2, "is empty")
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"text": oops}\n')
    code, _, err = invoke("eval", tmp_path / "bad.jsonl", "--evaluator", tiny_models("llama"))
    assert_one_line_error(code, err, 2, "bad.jsonl:2: not valid JSON")
    (tmp_path / "ids.jsonl").write_text('{"text": "ok", "token_ids": [1, 2]}\n{"text": "ok", "token_ids": "1 2"}\n')
    code, _, err = invoke("eval", tmp_path / "ids.jsonl", "--evaluator", tiny_models("llama"))
    assert_one_line_error(code, err, 2, "ids.jsonl:2: 'token_ids' must be a list of integers")
    (tmp_path / "few.txt").write_text("light water earth king stone bread wine tree field road\n")
    code, _, err = invoke("eval", samples, "--evaluator", tiny_models("llama"), "--references",
                          tmp_path / "few.txt", "--device", "cpu")
    assert_one_line_error(code, err, 2, "MAUVE needs at least as many references as samples (or 500)")
    import shutil

    no_tok = tmp_path / "no-tokenizer"
    shutil.copytree(tiny_models("llama"), no_tok)
    for f in no_tok.glob("tokenizer*"):
        f.unlink()
    code, _, err = invoke("eval", samples, "--evaluator", no_tok, "--device", "cpu")
    assert_one_line_error(code, err, 2, "has no usable tokenizer")


def test_one_sided_permutation_p_is_the_exhaustive_count():
    x = np.array([0.3, -1.2, 2.0, 0.8, -0.4, 1.5])
    y = np.array([1.0, 2.5, 0.2, 0.9, 1.9, 0.1])
    result = spearman_with_uncertainty(x, y, alternative="less")
    rho = stats.spearmanr(x, y).statistic
    assert result["rho"] == pytest.approx(rho)
    every = [stats.spearmanr(x[list(p)], y).statistic for p in itertools.permutations(range(6))]
    assert result["p"] == pytest.approx(np.mean(np.array(every) <= rho + 1e-12))  # exact: 6! <= 9999
    greater = spearman_with_uncertainty(x, y, alternative="greater", interval=False)
    assert greater["p"] == pytest.approx(np.mean(np.array(every) >= rho - 1e-12))
    assert "ci" not in greater


def test_two_sided_spearman_against_scipy():
    x = np.arange(6.0)
    y = np.array([0.1, 0.5, 0.3, 0.9, 1.2, 1.1])
    result = spearman_with_uncertainty(x, y, seed=0)
    assert result["rho"] == pytest.approx(stats.spearmanr(x, y).statistic)
    # perfectly monotone, n = 5: the exact two-sided permutation p-value is 2/5! = 1/60
    perfect = spearman_with_uncertainty(np.arange(5.0), -np.arange(5.0) ** 2)
    assert perfect["rho"] == pytest.approx(-1.0) and perfect["p"] == pytest.approx(2 / 120)
    one = spearman_with_uncertainty(np.arange(5.0), -np.arange(5.0) ** 2, alternative="less")
    assert one["p"] == pytest.approx(1 / 120)
    rng = np.random.default_rng(0)
    a = rng.standard_normal(40)
    noisy = spearman_with_uncertainty(a, a + 0.5 * rng.standard_normal(40))
    low, high = noisy["ci"]
    assert low < noisy["rho"] < high and 0 < noisy["p"] < 0.01
    # a constant has no ranks: no rho, and p 1 whatever the alternative (scipy's test would give p 0 here)
    for flat in (spearman_with_uncertainty(np.arange(5.0), np.ones(5), alternative="less"),
                 spearman_with_uncertainty(np.ones(5), np.arange(5.0), interval=False)):
        assert np.isnan(flat["rho"]) and flat["p"] == 1.0 and flat["constant"]
    # by hand: ranks (1, 2, 3) against (1, 3, 2) differ by 0, 1, 1, so rho = 1 - 6 * 2 / (3 * 8) = 0.5
    assert spearman_rho([10.0, 20.0, 30.0], [1.0, 9.0, 4.0]) == pytest.approx(0.5)
    assert spearman_rho([1.0, 2.0, 3.0], [7.0, 7.0, 7.0]) is None and spearman_rho([2.0, 2.0], [1.0, 5.0]) is None


def test_holm_on_a_hand_made_table():
    # sorted: a 0.01 x 4 = 0.04; c 0.03 x 3 = 0.09; b 0.04 x 2 = 0.08 -> 0.09 (monotone); d 0.5 x 1
    adjusted = holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": 0.5})
    assert adjusted == pytest.approx({"a": 0.04, "b": 0.09, "c": 0.09, "d": 0.5})
    assert holm({"x": 0.4, "y": 0.6}) == pytest.approx({"x": 0.8, "y": 0.8})  # capped, then monotone


def test_reliability_on_a_hand_made_table():
    values = [[1.0, 1.2], [2.0, 2.2], [3.0, 3.4]]
    # seed variances (ddof 1): 0.02, 0.02, 0.08 -> mean 0.04; layer means 1.1, 2.1, 3.2 -> variance 1.1033...
    means = np.array([1.1, 2.1, 3.2])
    expected = 1 - 0.04 / (2 * means.var(ddof=1))  # ICC(1,k): MSB = k var(means), k = 2 seeds
    assert reliability(values) == pytest.approx(expected)
    assert reliability([[1.0], [2.0]]) is None  # one seed: not measured
    assert reliability([[1.0, 3.0], [3.0, 1.0]]) == float("-inf")  # layers identical, seeds differ
    assert reliability([[2.0, 2.0], [2.0, 2.0]]) == 0.0  # nothing differs: no layer effect (not "one seed")
    rng = np.random.default_rng(0)  # pure seed noise: the seed mean's reliability is about 0, not above 0.5
    assert abs(np.median([reliability(rng.standard_normal((8, 3))) for _ in range(400)])) < 0.1


def test_partial_spearman_is_the_correlation_of_rank_residuals():
    rng = np.random.default_rng(1)
    z = rng.standard_normal(30)
    x = z + rng.standard_normal(30)
    y = -z + rng.standard_normal(30)
    rx, ry, rz = (stats.rankdata(v) for v in (x, y, z))

    def residual(a):
        slope, intercept = np.polyfit(rz, a, 1)
        return a - (slope * rz + intercept)
    expected = stats.pearsonr(residual(rx), residual(ry)).statistic
    assert partial_spearman(x, y, z) == pytest.approx(expected)


def test_freedman_lane_partial_test():
    from geoprobe.metrics.correlation import partial_spearman_test

    rng = np.random.default_rng(2)
    z = np.arange(12.0)
    y = z + 2.0 * rng.standard_normal(12)
    tracking = z + 2.0 * rng.standard_normal(12)  # a score that only tracks depth (noise independent of y)
    result = partial_spearman_test(-tracking, y, z, resamples=2000)
    assert result["rho"] == pytest.approx(partial_spearman(-tracking, y, z))
    assert result["p"] > 0.05  # no association beyond depth: not significant
    naive = spearman_with_uncertainty(-tracking, y, alternative="less", interval=False)
    assert naive["p"] < 0.01  # whereas the plain test passes through depth
    extra = rng.standard_normal(12)
    y2 = z + 2 * extra
    strong = partial_spearman_test(-extra, y2, z, resamples=2000)
    assert strong["rho"] < -0.5 and strong["p"] < 0.05


def test_bootstrap_interval_matches_the_normal_theory_and_overlapping_rows_are_not_ranked():
    from geoprobe.workflows.compare import bootstrap_interval, distinguishable

    values = np.random.default_rng(0).normal(3.0, 1.0, 400)
    lo, hi = bootstrap_interval(list(values))
    half = 1.96 * values.std() / math.sqrt(len(values))
    assert lo == pytest.approx(values.mean() - half, abs=0.02) and hi == pytest.approx(values.mean() + half, abs=0.02)
    assert bootstrap_interval([1.0]) == (None, None) and bootstrap_interval([1.0, math.inf]) == (None, None)
    lo, hi = bootstrap_interval([0.0, math.log(4)], None, math.exp)  # through a transform: geometric means
    assert 1.0 <= lo <= hi <= 4.0
    # a ratio of sums, as a per-token perplexity is: one long sample weighs more than a short one
    lo, hi = bootstrap_interval([10.0, 1.0, 10.0, 1.0], [10, 10, 10, 10])
    assert 0.1 <= lo < 0.55 < hi <= 1.0
    lo, hi = bootstrap_interval([30.0, 30.0], [10, 10])
    assert lo == hi == 3.0
    rows = [{"generator": g, "oracle_nll_lo": lo, "oracle_nll_hi": hi}
            for g, lo, hi in (("a", 3.0, 3.2), ("b", 3.1, 3.4), ("c", 3.5, 3.6), ("d", None, None))]
    pairs, compared = distinguishable(rows, "oracle_nll")
    assert compared == 3  # the row without an interval is not compared
    assert sorted((a["generator"], b["generator"]) for a, b in pairs) == [("a", "c"), ("b", "c")]


class _BigramEvaluator:
    """An evaluator with known log-probabilities: p(next | previous) = TABLE[previous, next], read
    from a one-hot state of the previous token (what `score` needs of a Backbone)."""

    def __init__(self, tokenizer, table: torch.Tensor):
        from types import SimpleNamespace

        self.tokenizer, self.table = tokenizer, table
        self.hidden_size, self.input_device = table.shape[0], torch.device("cpu")
        self.config = SimpleNamespace(max_position_embeddings=64)
        self.base = lambda input_ids, attention_mask, use_cache: SimpleNamespace(
            last_hidden_state=torch.nn.functional.one_hot(input_ids, self.hidden_size).float())

    def token_losses(self, final: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return -torch.log(self.table[final.argmax(-1), targets])


def _hand_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<eos>": 0, "<bos>": 1, "a": 2, "b": 3, "c": 4, "<unk>": 5}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", bos_token="<bos>", unk_token="<unk>")


def test_gen_ppl_mask_on_a_hand_built_sequence_with_known_log_probs():
    """"a b<eos>c<eos><eos>" reads as the ids a b EOS c EOS EOS. As MDLM/ReMDM score it (no BOS),
    the targets are positions 1-5; the first token a is never one, the first EOS is, the later two
    are not: p(b|a) = 1/2, p(EOS|b) = 1/4, p(c|EOS) = 1/8, so NLL = 6 ln 2 over 3 tokens and
    Gen.PPL = 4. With --gen-ppl-bos, BOS first and p(a|BOS) = 1/16: 10 ln 2 over 4, Gen.PPL 2^2.5."""
    tok = _hand_tokenizer()
    table = torch.full((6, 6), 1e-3)
    for previous, following, p in ((2, 3, 1 / 2), (3, 0, 1 / 4), (0, 4, 1 / 8), (1, 2, 1 / 16)):
        table[previous, following] = p
    table[0, 0] = 1e-6  # a second EOS would cost ln 10^6 if it were scored
    evaluator = _BigramEvaluator(tok, table)
    text = "a b<eos>c<eos><eos>"
    from geoprobe.workflows.evaluate import _ids

    ids, weights = _ids(evaluator, text, "<eos>")
    assert ids == [2, 3, 0, 4, 0, 0] and weights == [0, 1, 1, 1, 0, 0]
    got = gen_ppl(evaluator, [text], eos="<eos>")
    assert got["scored_tokens"] == 3 and got["nll_per_sample"][0] == pytest.approx(6 * math.log(2), rel=1e-6)
    assert got["gen_ppl"] == pytest.approx(4.0, rel=1e-6)
    ids, weights = _ids(evaluator, text, "<eos>", bos=True)
    assert ids == [1, 2, 3, 0, 4, 0, 0] and weights == [0, 1, 1, 1, 1, 0, 0]
    old = gen_ppl(evaluator, [text], eos="<eos>", bos=True)
    assert old["scored_tokens"] == 4 and old["gen_ppl"] == pytest.approx(2 ** 2.5, rel=1e-6)


def test_mauve_references_are_cut_in_the_generators_tokenizer_at_the_samples_length(tmp_path, tiny_models,
                                                                                    monkeypatch):
    """A samples file whose generator saved its tokenizer: its references are the held-out stream
    in that tokenizer's ids, cut at the samples' own token length (9), read as the samples are;
    the evaluator's tokenizer (the tiny Llama's) never decides where they are cut."""
    import geoprobe.workflows.evaluate as evaluate
    from geoprobe.tokens import save_tokenizer, token_stream, word_tokenizer

    spec = "synthetic:hmm?states=4&vocab=40&docs=400&length=20&seed=1"
    tok = word_tokenizer(documents(spec))
    gen = tmp_path / "generator"
    save_tokenizer(tok, gen)
    stream = token_stream(documents(spec)[:20], tok)
    ids = [stream[i:i + 9] for i in range(0, 12 * 9, 9)]
    samples = tmp_path / "set" / "samples.jsonl"
    samples.parent.mkdir()
    samples.write_text("".join(json.dumps({"text": tok.decode(i, skip_special_tokens=False), "token_ids": i}) + "\n"
                               for i in ids))
    (samples.parent / "samples.meta.jsonl").write_text(json.dumps({"model": str(gen), "file": str(samples),
                                                                   "eos": "<eos>"}) + "\n")
    # the same generator on record, but rows without their ids: cut in the evaluator's ids, no crash
    bare = tmp_path / "bare" / "samples.jsonl"
    bare.parent.mkdir()
    bare.write_text("".join(json.dumps({"text": tok.decode(i, skip_special_tokens=False)}) + "\n" for i in ids))
    (bare.parent / "samples.meta.jsonl").write_text(json.dumps({"model": str(gen), "file": str(bare),
                                                                "eos": "<eos>"}) + "\n")
    twin = tmp_path / "twin" / "samples.jsonl"  # a second file of the same generator: the same references
    twin.parent.mkdir()
    twin.write_text(samples.read_text())
    (twin.parent / "samples.meta.jsonl").write_text(json.dumps({"model": str(gen), "file": str(twin),
                                                                "eos": "<eos>"}) + "\n")
    seen, cuts = [], []
    real, real_cut = evaluate.features, evaluate.references_like
    monkeypatch.setattr(evaluate, "features", lambda backbone, texts, **kw: seen.append((texts, kw)) or
                        real(backbone, texts, **kw))
    monkeypatch.setattr(evaluate, "references_like", lambda spec, tok, length, seed: cuts.append((tok, length)) or
                        real_cut(spec, tok, length, seed))
    code, out, err = invoke("--format", "json", "eval", samples, bare, twin, "--evaluator", tiny_models("llama"),
                            "--references", spec, "--device", "cpu")
    assert code == 0, err
    # the held-out text is cut once per tokenizer and length, and featurised once per reference set
    assert len(cuts) == 2 and cuts[0][0] is not cuts[1][0] and len(seen) == 2
    assert json.loads(out)[str(twin)]["mauve"] == json.loads(out)[str(samples)]["mauve"]
    row = json.loads(out)[str(samples)]
    assert row["mauve_references_cut_in"] == "generator" and row["mauve_reference_tokens"] == 9
    assert json.loads(out)[str(bare)]["mauve_references_cut_in"] == "evaluator"
    assert json.loads(out)[str(bare)]["eos_per_sample"] is None
    breaks = [i.count(tok.eos_token_id) for i in ids]  # the samples' own document breaks, counted from their ids
    assert row["eos_per_sample"] == pytest.approx(sum(breaks) / 12) and sum(breaks) > 0
    assert row["samples_with_eos"] == pytest.approx(sum(b > 0 for b in breaks) / 12)
    want = real_cut(spec, tok, 9, 0)[:12]
    assert seen[0] == (want, {"eos": "<eos>", "bos": False})  # the reference set, split at the samples' EOS
    assert all(len(tok(r, add_special_tokens=False)["input_ids"]) == 9 for r in want)
    # (a file without a generator record: test_eval_end_to_end_and_bad_input, cut in the evaluator's ids)
    # --reference-features: the first call keeps each reference set's features (2 files); a later
    # call, file by file, reads them (no features pass over references) and gives the same MAUVE
    store = tmp_path / "features"
    seen.clear()
    code, out, err = invoke("--format", "json", "eval", samples, bare, "--evaluator", tiny_models("llama"),
                            "--references", spec, "--reference-features", store, "--device", "cpu")
    assert code == 0, err
    assert len(seen) == 2  # the two reference sets (the samples' features come from the scoring pass)
    kept = sorted(store.glob("*.npy"))
    assert len(kept) == 2 and not list(store.glob(".*"))
    assert len({tuple(map(tuple, np.load(k)[:2])) for k in kept}) == 2
    first = json.loads(out)
    for path in (samples, bare):
        seen.clear()
        code, out, err = invoke("--format", "json", "eval", path, "--evaluator", tiny_models("llama"),
                                "--references", spec, "--reference-features", store, "--device", "cpu")
        assert code == 0, err
        assert seen == []  # no pass over the references
        assert json.loads(out)[str(path)]["mauve"] == first[str(path)]["mauve"]
    assert sorted(store.glob("*.npy")) == kept


def test_special_tokens_are_counted_from_the_ids_on_a_hand_built_set():
    from geoprobe.metrics.text import special_token_metrics
    from geoprobe.tokens import word_tokenizer

    tok = word_tokenizer(["a b c d"])  # <eos> 0, <unk> 1, a-d 2-5
    got = special_token_metrics([[0, 2, 3, 0], [2, 1, 3, 4], [2, 3, 4, 5]], tok)
    assert got == pytest.approx({"eos_per_sample": 2 / 3, "samples_with_eos": 1 / 3, "specials_per_sample": 1 / 3})
    assert special_token_metrics([[2, 3], None], tok)["eos_per_sample"] is None  # an external row: no ids
    assert special_token_metrics([[2, 3]], None)["specials_per_sample"] is None  # no tokenizer on record


def test_mauve_references_come_only_from_held_out_documents_cut_as_samples_are(tmp_path):
    from geoprobe.corpus import split_documents
    from geoprobe.tokens import token_stream, word_tokenizer
    from geoprobe.workflows.evaluate import references_like

    # document i is its own tag word then filler: a reference's tags say which documents it holds
    docs = [f"doc{i} " + " ".join(["w"] * (3 + i % 5)) for i in range(200)]
    corpus = tmp_path / "docs.txt"
    corpus.write_text("\n\n".join(docs) + "\n")
    tok = word_tokenizer(docs)
    for seed in (0, 3):
        train, held_out = split_documents(str(corpus), seed)
        assert 0 < len(held_out) < 30 and not set(train) & set(held_out)
        refs = references_like(str(corpus), tok, 7, seed)
        tags = {w for r in refs for w in r.replace("<eos>", " ").split() if w.startswith("doc")}
        assert tags <= {d.split()[0] for d in held_out}  # never a training document
        assert len(tags) > 0.8 * len(held_out)
        # each piece is 7 ids of the held-out stream (EOS after each document), decoded whole:
        # pieces cross document breaks, as samples do
        stream = token_stream(held_out, tok)
        pieces = [tok(r, add_special_tokens=False)["input_ids"] for r in refs]
        assert all(len(p) == 7 for p in pieces) and len(pieces) == len(stream) // 7
        assert sorted(pieces) == sorted(stream[i:i + 7] for i in range(0, len(stream) - 6, 7))
        assert any(tok.eos_token_id in p[:-1] for p in pieces)  # a document break inside a piece
    assert references_like(str(corpus), tok, 7, 0) != references_like(str(corpus), tok, 7, 3)


def test_compare_names_a_bridges_decodings_apart_and_matches_only_an_ltr_rows_training_tokens(tmp_path):
    """One bridge's hybrid (16 steps), stack-only hybrid and ltr (its 32 tokens' 32 steps) rows:
    three generator-sampler pairs, one matched budget; a hybrid at 32 steps is a mismatch."""
    from geoprobe.errors import BadInput
    from geoprobe.workflows.compare import compare

    def trained(layer, steps):
        folder = tmp_path / "bridges" / f"layer-{layer:02d}" / "seed-0"
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps({"kind": "bridge", "budget": {
            "steps": steps, "batch_size": 8, "seq_len": 32}}))
        return folder

    bridge, longer = trained(3, 100), trained(5, 200)

    def sample_set(name, sampler, steps, decode="stack", bridge=bridge):
        out = tmp_path / "samples" / name
        out.mkdir(parents=True)
        (out / "samples.jsonl").write_text(json.dumps({"text": "a b"}) + "\n")
        (out / "samples.meta.jsonl").write_text(json.dumps({
            "sampler": sampler, "steps": steps, "nfe": steps, "seconds": 1.0, "num": 1, "decode": decode,
            "model": str(bridge), "file": str(out / "samples.jsonl")}) + "\n")
        (out / "samples.metrics.json").write_text(json.dumps({"results": {str(out / "samples.jsonl"): {
            "evaluator": "x", "gen_ppl": 2.0, "samples": 1}}}))
        return out / "samples.jsonl"

    files = [sample_set("hybrid", "hybrid", 16), sample_set("stack-only", "hybrid", 16, "stack-only"),
             sample_set("ltr", "ltr", 32)]
    rows = compare(files)
    assert [(r["generator"], r["sampler"]) for r in rows] == [
        ("bridges/layer-03/seed-0", "hybrid"), ("bridges/layer-03/seed-0 (stack-only)", "hybrid"),
        ("bridges/layer-03/seed-0", "ltr")]
    assert {r["budget"] for r in rows} == {"matched"} and {r["train_tokens"] for r in rows} == {100 * 8 * 32}
    with pytest.raises(BadInput, match="different budgets"):
        compare([*files, sample_set("hybrid-32", "hybrid", 32)])
    with pytest.raises(BadInput, match="different budgets"):  # an ltr row's steps are free, its tokens are not
        compare([*files, sample_set("ltr-longer", "ltr", 32, bridge=longer)])


def test_compare_writes_each_row_beside_its_samples_and_takes_that_row_file_in_their_place(tmp_path):
    """compare_run writes SAMPLES.row.json beside each compared file (the curve's too); a later
    compare given the row files, with the samples, the model and the metrics gone, gives the same
    rows and tables; a recorded budget mark is set again, not carried over."""
    import shutil
    from pathlib import Path

    from geoprobe.errors import BadInput
    from geoprobe.workflows.compare import compare_run, row_path

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"kind": "bridge", "budget": {"steps": 10, "batch_size": 2,
                                                                                "seq_len": 8}}))

    def sample_set(name, steps, ppl):
        out = tmp_path / "samples" / name
        out.mkdir(parents=True)
        (out / "samples.jsonl").write_text(json.dumps({"text": "a b"}) + "\n")
        (out / "samples.meta.jsonl").write_text(json.dumps({
            "sampler": "hybrid", "steps": steps, "nfe": steps, "seconds": 2.0, "num": 1, "model": str(model),
            "file": str(out / "samples.jsonl")}) + "\n")
        (out / "samples.metrics.json").write_text(json.dumps({"results": {str(out / "samples.jsonl"): {
            "evaluator": "x", "gen_ppl": ppl, "samples": 1}}}))
        return out / "samples.jsonl"

    files, point = [sample_set("a", 16, 2.0), sample_set("b", 16, 3.0)], sample_set("c", 4, 5.0)
    first = compare_run(files, tmp_path / "one", curve=[point])
    rows = [json.loads(row_path(f).read_text()) for f in files]
    assert [r["gen_ppl"] for r in rows] == [2.0, 3.0] and rows == first["rows"]
    assert json.loads(row_path(point).read_text())["steps"] == 4
    assert "text" not in row_path(files[0]).read_text()  # numbers and names only
    table = Path(first["table"]).read_text()
    shutil.rmtree(model)
    for f in [*files, point]:
        f.unlink()
        f.with_suffix(".metrics.json").unlink()
    again = compare_run([row_path(f) for f in files], tmp_path / "two", curve=[row_path(point)])
    assert again["rows"] == first["rows"] and Path(again["table"]).read_text() == table
    assert Path(again["steps_table"]).read_text() == Path(first["steps_table"]).read_text()
    # a row recorded under a mismatched compare is matched again here
    mismatched = json.loads(row_path(files[0]).read_text())
    row_path(files[0]).write_text(json.dumps({**mismatched, "budget": "MISMATCH"}))
    assert {r["budget"] for r in compare_run([row_path(f) for f in files], tmp_path / "three")["rows"]} == {"matched"}
    with pytest.raises(BadInput, match="recorded row not found"):
        compare_run([tmp_path / "gone.row.json"], tmp_path / "four")


def test_two_sample_sets_of_one_model_keep_their_files_their_labels_and_the_tokens_used(tmp_path, tiny_models,
                                                                                       corpus_txt):
    """`sample --sampler roar`, then `--sampler mdlm` (the README tour's pattern): two files, each
    with its one meta row; a third into a folder holding another set is refused without --force;
    eval and compare name each row by its generator and sample set; compare shows the tokens a
    model trained on (its plateau stopped it at step 30 of 40) beside its cap; -q prints the path."""
    from pathlib import Path

    from geoprobe.workflows.generate import sample_label

    dsl = tmp_path / "dsl"
    code, _, err = invoke("-q", "dsl", "train", "--corpus", corpus_txt, "--tokenizer", "words", "--steps", 40,
                          "--batch-size", 4, "--seq-len", 16, "--d-model", 16, "--n-layers", 1, "--n-heads", 2,
                          "--d-tok", 8, "--eval-every", 5, "--min-steps", 10, "--plateau-rel", 0.99, "--out", dsl,
                          "--device", "cpu")
    assert code == 0, err
    assert json.loads((dsl / "metrics.json").read_text())["steps_run"] == 30  # 0.99: the first step it may judge
    files = {}
    for sampler in ("roar", "mdlm"):
        code, out, err = invoke("-q", "sample", "--model", dsl, "--sampler", sampler, "--num", 4, "--length", 16,
                                "--steps", 16, "--device", "cpu")
        assert code == 0, err
        files[sampler] = Path(out.strip())
        assert files[sampler] == dsl / "samples" / f"{sampler}-steps-16-num-4-length-16" / "samples.jsonl"
    for sampler, path in files.items():
        rows = [json.loads(l) for l in path.with_name("samples.meta.jsonl").read_text().splitlines()]
        assert [r["sampler"] for r in rows] == [sampler] and rows[0]["file"] == str(path)
    first = files["roar"].read_text()
    code, _, err = invoke("sample", "--model", dsl, "--sampler", "mdlm", "--num", 4, "--length", 16, "--steps", 16,
                          "--out", files["roar"].parent, "--device", "cpu")
    assert_one_line_error(code, err, 2, "holds another sample set (roar from ")
    assert "differs in: sampler); pass --force to replace it" in err and files["roar"].read_text() == first
    code, _, err = invoke("-q", "sample", "--model", dsl, "--sampler", "roar", "--num", 4, "--length", 16, "--steps",
                          16, "--device", "cpu")  # the same set again: written in place, still one meta row
    assert code == 0, err
    assert len(files["roar"].with_name("samples.meta.jsonl").read_text().splitlines()) == 1
    code, out, err = invoke("eval", *files.values(), "--evaluator", tiny_models("llama"), "--device", "cpu")
    assert code == 0, err
    assert "samples.jsonl" not in out and "generator · sample set" in out  # rows named by what made them
    for sampler, path in files.items():
        assert sample_label(path) == f"{tmp_path.name}/dsl · {sampler}-steps-16-num-4-length-16"
    code, out, err = invoke("--format", "json", "compare", *files.values(), "--out", tmp_path / "cmp")
    assert code == 0, err
    rows = json.loads(out)["rows"]
    assert [r["budget"] for r in rows] == ["matched", "matched"] and [r["sampler"] for r in rows] == ["roar", "mdlm"]
    assert [(r["used_tokens"], r["train_tokens"]) for r in rows] == [(30 * 4 * 16, 40 * 4 * 16)] * 2
    code, out, err = invoke("compare", *files.values(), "--out", tmp_path / "cmp")
    assert code == 0 and "tokens used" in out and "1920" in out and "token cap" in out, out


def test_mauve_scores_as_many_samples_as_there_are_references_down_to_half_its_minimum():
    from geoprobe.errors import BadInput
    from geoprobe.workflows.evaluate import MAUVE_MIN_SAMPLES, mauve_count

    assert mauve_count(1000, 1200) == 1000 and mauve_count(300, 300) == 300  # every sample
    assert mauve_count(1000, 990) == 990  # the held-out text is short for this length: the first 990
    assert mauve_count(1000, MAUVE_MIN_SAMPLES // 2) == 500
    with pytest.raises(BadInput, match="at least as many references as samples .or 500.: 499 found"):
        mauve_count(1000, 499, "499 found")
    with pytest.raises(BadInput):
        mauve_count(300, 299)  # fewer samples than the floor: every one needs its reference
