"""The Kneser–Ney evaluator (geoprobe.metrics.ngram) against its definition: every conditional
sums to 1 over the vocabulary, and each probability equals a slow dictionary implementation of
Chen & Goodman's interpolated Kneser–Ney written from the formula, not from the module."""

from collections import Counter, defaultdict

import numpy as np
import pytest

from geoprobe.metrics.ngram import KneserNey


def slow_kneser_ney(stream, vocab, order):
    """p(w | h) by dictionaries: raw counts at the top order, continuation counts below."""
    start = vocab
    s = [start] * (order - 1) + list(stream)
    grams = {k: Counter(tuple(s[i:i + k]) for i in range(len(s) - k + 1)) for k in range(1, order + 1)}
    counts = {order: grams[order]}
    for k in range(1, order):
        counts[k] = Counter(g[1:] for g in grams[k + 1])  # distinct tokens before each k-gram
    counts = {k: Counter({g: v for g, v in c.items() if g[-1] != start}) for k, c in counts.items()}  # never predicted

    def discount(c):
        n1 = sum(v == 1 for v in c.values())
        n2 = sum(v == 2 for v in c.values())
        return n1 / (n1 + 2 * n2) if n1 else 0.75

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
    contexts += [(vocab,) * (order - 1), (vocab,) * (order - 2) + (6,) if order > 1 else ()]  # start; unseen
    for context in contexts:
        rows = np.array([context] * vocab, dtype=np.int64).reshape(vocab, order - 1)
        p = np.exp(model.log_probs(rows, np.arange(vocab)))
        assert p.sum() == pytest.approx(1.0, abs=1e-12)
        assert p == pytest.approx([slow(w, context, order) for w in range(vocab)], rel=1e-12)
        assert p[6] > 0  # an unseen token keeps the uniform share


def test_a_sequences_nll_scores_only_its_weighted_positions_after_the_start_symbols():
    stream = [0, 1, 2, 0, 1, 2, 0, 1, 3]
    model = KneserNey(stream, 5, 3)
    nll, n = model.sequence_nll([0, 1, 2, 0], [0, 1, 1, 0])
    start = model.start
    expected = -model.log_probs(np.array([[start, 0], [0, 1]]), np.array([1, 2])).sum()
    assert (nll, n) == (pytest.approx(expected), 2)
    # the repeated pattern is likelier than a permutation of it
    assert nll < model.sequence_nll([0, 2, 1, 0], [0, 1, 1, 0])[0]


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
    texts = ["and the word was light<eos>let there", "light word the was and"]
    samples.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    (samples.parent / "samples.meta.jsonl").write_text(json.dumps(
        {"sampler": "x", "steps": 4, "nfe": 4, "seconds": 1.0, "num": 2, "model": str(tmp_path / "none"),
         "file": str(samples), "eos": "<eos>"}) + "\n")
    name = f"ngram:{corpus}"
    code, out, err = invoke("--format", "json", "eval", samples, "--evaluator", f"{tiny_models('llama')},{name}",
                            "--device", "cpu")
    assert code == 0, err
    row = json.loads(out)[str(samples)]

    # by hand: the corpus as one stream, BOS, the documents joined by the evaluator's EOS; each
    # sample the same way, its first EOS scored, BOS not
    tok = llama.tokenizer
    encode = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    bos, eos = tok.bos_token_id, tok.eos_token_id
    stream = [bos] + sum(([eos] + encode(d) for d in documents[1:]), encode(documents[0]))
    model = KneserNey(stream, len(tok), 3)
    first = [bos] + encode("and the word was light") + [eos] + encode("let there")
    second = [bos] + encode("light word the was and")
    scored = [model.sequence_nll(ids, [0] + [1] * (len(ids) - 1)) for ids in (first, second)]
    expected = math.exp(sum(n for n, _ in scored) / sum(c for _, c in scored))
    assert row["gen_ppl_by_evaluator"][name] == pytest.approx(expected, rel=1e-9)
    assert row["nll_by_evaluator"][name]["tokens_per_sample"] == [c for _, c in scored]
    assert row["gen_ppl"] == row["gen_ppl_by_evaluator"][str(tiny_models("llama"))]  # the LM stays the first
    # the corpus's own sentence is likelier than its words shuffled
    assert scored[0][0] / scored[0][1] < scored[1][0] / scored[1][1]
    other = comparison_row(samples)["other_evaluators"]
    assert other.startswith(f"{name}: {expected:.4g} (") and other.endswith(")")  # with its 95% interval
    ppl, lo, hi = other_gen_ppl(other)[name]  # and it reads back
    assert ppl == pytest.approx(expected, rel=1e-3) and lo < ppl < hi

    code, _, err = invoke("eval", samples, "--evaluator", f"{name},{tiny_models('llama')}", "--device", "cpu")
    assert_one_line_error(code, err, 2, "scores with the tokenizer of an LM evaluator listed before it")
    code, _, err = invoke("eval", samples, "--evaluator", f"{tiny_models('llama')},ngram:{tmp_path / 'no.txt'}")
    assert_one_line_error(code, err, 2, "no.txt")
