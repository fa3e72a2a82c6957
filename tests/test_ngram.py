"""The Kneser–Ney evaluator (geoprobe.metrics.ngram) against its definition: every conditional
sums to 1 over the vocabulary, and each probability equals a slow dictionary implementation of
Chen & Goodman's interpolated Kneser–Ney written from the formula, not from the module."""

from collections import Counter, defaultdict

import numpy as np
import pytest

from geoprobe.metrics.ngram import KneserNey


def slow_kneser_ney(stream, vocab, order):
    """p(w | h) by dictionaries: raw counts at the top order, continuation counts below."""
    s = list(stream)
    grams = {k: Counter(tuple(s[i:i + k]) for i in range(len(s) - k + 1)) for k in range(1, order + 1)}
    counts = {order: grams[order]}
    for k in range(1, order):
        counts[k] = Counter(g[1:] for g in grams[k + 1])  # distinct tokens before each k-gram

    def discount(c):
        n1 = sum(v == 1 for v in c.values())
        n2 = sum(v == 2 for v in c.values())
        return n1 / (n1 + 2 * n2) if n1 and n2 else 0.75

    d = {k: discount(c) for k, c in counts.items()}
    totals, kinds = {}, {}
    for k in range(2, order + 1):
        totals[k], kinds[k] = defaultdict(int), defaultdict(int)
        for g, c in counts[k].items():
            totals[k][g[:-1]] += c
            kinds[k][g[:-1]] += 1
    uni = {w: counts[1].get((w,), 0) for w in range(vocab)}
    n_uni = sum(uni.values())

    def p(w, h, k):
        if k == 1:
            seen = sum(v > 0 for v in uni.values())
            return max(uni[w] - d[1], 0) / n_uni + d[1] * seen / n_uni / vocab
        h = tuple(h[-(k - 1):])
        lower = p(w, h, k - 1)
        if totals[k].get(h, 0) == 0:
            return lower
        return (max(counts[k].get(h + (w,), 0) - d[k], 0) + d[k] * kinds[k][h] * lower) / totals[k][h]

    return p


@pytest.mark.parametrize("order", [1, 2, 3, 4])
def test_kneser_ney_matches_the_formula_and_each_conditional_sums_to_one(order):
    rng = np.random.default_rng(order)
    vocab = 7
    stream = rng.choice(vocab, size=300, p=[0.3, 0.25, 0.2, 0.1, 0.1, 0.05, 0.0])  # token 6 never occurs
    model = KneserNey(stream, vocab, order)
    slow = slow_kneser_ney(stream, vocab, order)
    contexts = [tuple(rng.choice(vocab, order - 1)) for _ in range(6)]
    contexts += [(vocab,) * (order - 1), (vocab,) * (order - 2) + (6,) if order > 1 else ()]  # none; unseen
    for context in contexts:
        rows = np.array([context] * vocab, dtype=np.int64).reshape(vocab, order - 1)
        p = np.exp(model.log_probs(rows, np.arange(vocab)))
        assert p.sum() == pytest.approx(1.0, abs=1e-12)
        assert p == pytest.approx([slow(w, context, order) for w in range(vocab)], rel=1e-12)
        assert p[6] > 0  # an unseen token keeps the uniform share


def test_a_sequences_nll_scores_only_its_weighted_positions_each_after_the_tokens_it_has():
    stream = [0, 1, 2, 0, 1, 2, 0, 1, 3]
    model = KneserNey(stream, 5, 3)
    nll, n = model.sequence_nll([0, 1, 2, 0], [0, 1, 1, 0])
    none = model.none  # position 1 has one token before it: the trigram backs off to the bigram
    expected = -model.log_probs(np.array([[none, 0], [0, 1]]), np.array([1, 2])).sum()
    assert (nll, n) == (pytest.approx(expected), 2)
    # the repeated pattern is likelier than a permutation of it
    assert nll < model.sequence_nll([0, 2, 1, 0], [0, 1, 1, 0])[0]
    with pytest.raises(ValueError, match="token ids must lie in 0..4"):
        KneserNey([0, 1, 5], 5, 2)
    with pytest.raises(ValueError, match="token ids must lie in 0..4"):
        model.log_probs(np.array([[0, 1]]), np.array([5]))
    with pytest.raises(ValueError, match="needs at least 3 tokens"):
        KneserNey([0, 1], 5, 3)


def test_eval_scores_gen_ppl_under_a_kneser_ney_trigram_of_a_corpus_in_the_first_evaluators_tokens(
        tmp_path, tiny_models, llama):
    import json
    import math

    from geoprobe.workflows.compare import comparison_row, other_gen_ppl
    from tests.helpers import assert_one_line_error, invoke

    corpus = tmp_path / "corpus.txt"
    documents = ["in the beginning was the word", "and the word was light", "let there be light"]
    corpus.write_text("\n\n".join(documents) + "\n")
    samples = tmp_path / "gen" / "samples.jsonl"
    samples.parent.mkdir()
    texts = ["and the word was light<eos>let there<eos>", "light word the was and"]
    samples.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    (samples.parent / "samples.meta.jsonl").write_text(json.dumps(
        {"sampler": "x", "steps": 4, "nfe": 4, "seconds": 1.0, "num": 2, "model": str(tmp_path / "none"),
         "file": str(samples), "eos": "<eos>"}) + "\n")
    name = f"ngram:{corpus}"
    code, out, err = invoke("--format", "json", "eval", samples, "--evaluator", f"{tiny_models('llama')},{name}",
                            "--device", "cpu")
    assert code == 0, err
    row = json.loads(out)[str(samples)]

    # by hand: the corpus as one stream, each document after the evaluator's EOS (the leading
    # BOS read as one); each sample as the LM reads it: no BOS, its first token unscored, its
    # first EOS scored and later ones not; with --gen-ppl-bos after an EOS (the BOS read as one),
    # its first token scored
    tok = llama.tokenizer
    encode = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    eos = tok.eos_token_id
    assert tok.bos_token_id is not None and tok.bos_token_id != eos
    stream = sum(([eos] + encode(d) for d in documents), [])
    model = KneserNey(stream, len(tok), 3)

    def by_hand(start: list[int]) -> tuple[list[tuple[float, int]], float]:
        first = start + encode("and the word was light") + [eos] + encode("let there") + [eos]
        second = start + encode("light word the was and")
        scored = [model.sequence_nll(first, [0] + [1] * (len(first) - 2) + [0]),
                  model.sequence_nll(second, [0] + [1] * (len(second) - 1))]
        return scored, math.exp(sum(n for n, _ in scored) / sum(c for _, c in scored))

    scored, expected = by_hand([])
    assert row["gen_ppl_by_evaluator"][name] == pytest.approx(expected, rel=1e-9)
    code, out, err = invoke("--format", "json", "eval", samples, "--evaluator", f"{tiny_models('llama')},{name}",
                            "--device", "cpu", "--gen-ppl-bos")
    assert code == 0, err
    old = json.loads(out)[str(samples)]
    assert old["gen_ppl_by_evaluator"][name] == pytest.approx(by_hand([eos])[1], rel=1e-9)
    assert old["nll_by_evaluator"][name]["tokens_per_sample"] == [c + 1 for _, c in scored]
    assert old["gen_ppl_first_token"] == "scored after BOS" and row["gen_ppl_first_token"] == "unscored"
    code, out, err = invoke("--format", "json", "eval", samples, "--evaluator", f"{tiny_models('llama')},{name}",
                            "--device", "cpu")  # rewritten under the default, which comparison_row reads
    assert row["nll_by_evaluator"][name]["tokens_per_sample"] == [c for _, c in scored]
    assert row["gen_ppl"] == row["gen_ppl_by_evaluator"][str(tiny_models("llama"))]  # the LM stays the first
    assert row["nll_by_evaluator"][str(tiny_models("llama"))]["tokens_per_sample"] == [c for _, c in scored]
    # the corpus's own sentence is likelier than its words shuffled
    assert scored[0][0] / scored[0][1] < scored[1][0] / scored[1][1]
    other = comparison_row(samples)["other_evaluators"]
    assert other.startswith(f"{name}: {expected:.6g} (") and other.endswith(")")  # with its 95% interval
    ppl, lo, hi = other_gen_ppl(other)[name]  # and it reads back
    assert ppl == pytest.approx(expected, rel=1e-5) and lo < ppl < hi

    code, _, err = invoke("eval", samples, "--evaluator", f"{name},{tiny_models('llama')}", "--device", "cpu")
    assert_one_line_error(code, err, 2, "scores with the tokenizer of an LM evaluator listed before it")
    code, _, err = invoke("eval", samples, "--evaluator", f"{tiny_models('llama')},ngram:{tmp_path / 'no.txt'}")
    assert_one_line_error(code, err, 2, "no.txt")


def test_position_zero_is_never_a_target_even_for_a_tokenizer_without_bos(llama):
    import copy
    from types import SimpleNamespace

    from geoprobe.workflows.evaluate import _ids

    tok = copy.deepcopy(llama.tokenizer)
    tok.bos_token = None
    assert tok.bos_token_id is None
    ids, weights = _ids(SimpleNamespace(tokenizer=tok), "light water")
    assert ids == tok("light water", add_special_tokens=False)["input_ids"] and weights[0] == 0 and all(weights[1:])
