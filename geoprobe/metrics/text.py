"""Surface statistics of generated text, on whitespace-separated words.

* diversity_within (the definition of SimCTG, Su et al. 2022, "A Contrastive Framework for
  Neural Text Generation", used by contrastive decoding and the diffusion-LM papers that report
  "diversity"): prod_{n=2..4} (sum over samples of the distinct n-grams within the sample /
  sum over samples of its n-grams). Repetition inside a sample lowers it; two samples that
  are the same text do not. (SimCTG's code also drops each sample's last n-gram, an off-by-one
  not reproduced here.) Its per-sample values (the product within one sample) give intervals.
* diversity_pooled: the same product over the whole sample set pooled, so that samples that
  repeat each other lower it too (what this project reported as "diversity" before).
* unigram entropy: the entropy (nats) of each sample's word distribution, averaged;
* repetition rate rep-n: per sample 1 - distinct n-grams / total n-grams, averaged.
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
    rates = []
    for t in texts:
        grams = ngrams(t.split(), n)
        if grams:
            rates.append(1 - len(set(grams)) / len(grams))
    return sum(rates) / len(rates) if rates else 0.0


def text_metrics(texts: list[str]) -> dict:
    entropies = [unigram_entropy(t) for t in texts]
    return {**diversity_within(texts), **diversity_pooled(texts), "unigram_entropy": sum(entropies) / len(texts),
            "unigram_entropy_per_sample": entropies,
            **{f"rep_{n}": repetition(texts, n) for n in (2, 3, 4)}}
