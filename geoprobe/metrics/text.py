"""Surface statistics of generated text, on whitespace-separated words, and the entropy of
the generator's token ids.

A sample's text keeps the special tokens its generator decoded (`decode(ids,
skip_special_tokens=False)`); before any word statistic its EOS string (the samples file's
meta `eos`) is replaced by a line break (`word_text`): a document break is a word break, so the
words on either side are not glued into one. Other specials ("<unk>") stay words: they are
what was generated.

* diversity_within (the definition of SimCTG, Su et al. 2022, "A Contrastive Framework for
  Neural Text Generation", used by contrastive decoding and the diffusion-LM papers that report
  "diversity"): prod_{n=2..4} (sum over samples of the distinct n-grams within the sample /
  sum over samples of its n-grams). Repetition inside a sample lowers it; two samples that
  are the same text do not. (SimCTG's code also drops each sample's last n-gram, an off-by-one
  not reproduced here.) Its per-sample values (the product within one sample) give intervals.
* diversity_pooled: the same product over the whole sample set pooled, so that samples that
  repeat each other lower it too (what this project reported as "diversity" before).
* unigram entropy ("word entropy": unigram, whitespace words): the entropy (nats) of each
  sample's word distribution, averaged;
* repetition rate rep-n (SimCTG's): 1 - the distinct n-grams within each sample, summed over the
  samples, over their n-grams; diversity_within is prod_{n=2..4} (1 - rep-n);
* token entropy ("token entropy": the generator's token ids, as ReMDM/DSL report it): per
  sample the entropy (nats) of the distribution of the ids in its row (every id, specials
  included: ReMDM's `torch.special.entr(counts / counts.sum()).sum()`), averaged. On a 1024-token
  GPT-2 row it is near 5.6; it is not comparable with the word entropy.
"""

from __future__ import annotations

import math
from collections import Counter


def ngrams(words: list[str], n: int) -> list[tuple]:
    return [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]


def diversity_pooled(texts: list[str]) -> dict:
    result, product = {}, 1.0
    for n in (2, 3, 4):
        grams = [g for t in texts for g in ngrams(t.split(), n)]
        ratio = len(set(grams)) / len(grams) if grams else 0.0
        result[f"distinct_{n}"] = ratio
        product *= ratio
    result["diversity_pooled"] = product
    return result


def diversity_within(texts: list[str]) -> dict:
    """SimCTG's diversity (distinct n-grams counted within each sample) and each sample's own product."""
    product, per_sample = 1.0, [1.0] * len(texts)
    for n in (2, 3, 4):
        counts = [(len(set(g)), len(g)) for g in (ngrams(t.split(), n) for t in texts)]
        total = sum(c for _, c in counts)
        product *= sum(u for u, _ in counts) / total if total else 0.0
        per_sample = [v * (u / c if c else 0.0) for v, (u, c) in zip(per_sample, counts)]
    return {"diversity_within": product, "diversity_within_per_sample": per_sample}


def unigram_entropy(text: str) -> float:
    counts = Counter(text.split())
    total = sum(counts.values())
    return -sum(c / total * math.log(c / total) for c in counts.values()) if total else 0.0


def repetition(texts: list[str], n: int) -> float:
    """SimCTG's rep-n: 1 - (sum over samples of the distinct n-grams within the sample) / (sum of
    their n-grams), so that diversity_within = prod_{n=2..4} (1 - rep-n); 1 where no sample has n
    words (diversity_within's factor is then 0)."""
    counts = [(len(set(g)), len(g)) for g in (ngrams(t.split(), n) for t in texts)]
    total = sum(c for _, c in counts)
    return 1 - sum(u for u, _ in counts) / total if total else 1.0


def word_text(text: str, eos: str | None) -> str:
    """The text the word statistics see: each `eos` string replaced by a line break."""
    return text.replace(eos, "\n") if eos else text


def token_entropy(ids: list[int]) -> float:
    """The entropy (nats) of the distribution of the ids in one row (ReMDM's per-sample entropy)."""
    counts = Counter(ids)
    total = sum(counts.values())
    return -sum(c / total * math.log(c / total) for c in counts.values()) if total else 0.0


def token_metrics(token_ids: list[list[int] | None]) -> dict:
    """`token_entropy` (the mean) and `token_entropy_per_sample`: null where a row has no token
    ids (an external file's), and the mean null unless every row has them."""
    per_sample = [None if ids is None else token_entropy(ids) for ids in token_ids]
    known = [v for v in per_sample if v is not None]
    return {"token_entropy": sum(known) / len(known) if known and len(known) == len(per_sample) else None,
            "token_entropy_per_sample": per_sample if known else None}


def special_token_metrics(token_ids: list[list[int] | None], tokenizer) -> dict:
    """How often a set's samples hold its generator's special tokens, from their ids:
    `eos_per_sample` (its EOS: a document break, which an evaluator reads as the end of one
    document and scores the token after it as a document's start), `samples_with_eos` (their
    share) and `specials_per_sample` (every other special or added-special token, e.g. SmolLM2's
    chat and code markers: text no corpus row holds). Null without a tokenizer or token ids."""
    if tokenizer is None or not token_ids or any(ids is None for ids in token_ids):
        return {"eos_per_sample": None, "samples_with_eos": None, "specials_per_sample": None}
    eos = tokenizer.eos_token_id
    special = set(tokenizer.all_special_ids) | {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    special -= {eos}
    counts = [sum(t == eos for t in ids) for ids in token_ids]
    return {"eos_per_sample": sum(counts) / len(counts), "samples_with_eos": sum(c > 0 for c in counts) / len(counts),
            "specials_per_sample": sum(sum(t in special for t in ids) for ids in token_ids) / len(token_ids)}


def text_metrics(texts: list[str], eos: str | None = None) -> dict:
    """The word statistics of `texts`, each `eos` string read as a line break (`word_text`)."""
    texts = [word_text(t, eos) for t in texts]
    entropies = [unigram_entropy(t) for t in texts]
    return {**diversity_within(texts), **diversity_pooled(texts), "unigram_entropy": sum(entropies) / len(texts),
            "unigram_entropy_per_sample": entropies,
            **{f"rep_{n}": repetition(texts, n) for n in (2, 3, 4)}}
