"""Surface statistics of generated text, on whitespace-separated words.

* diversity = prod_{n=2..4} (distinct n-grams / total n-grams) over the whole sample set,
  with each factor reported;
* unigram entropy: the entropy (nats) of each sample's word distribution, averaged;
* repetition rate rep-n: per sample 1 - distinct n-grams / total n-grams, averaged.
"""

from __future__ import annotations

import math
from collections import Counter


def ngrams(words: list[str], n: int) -> list[tuple]:
    return [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]


def diversity(texts: list[str]) -> dict:
    result, product = {}, 1.0
    for n in (2, 3, 4):
        grams = [g for t in texts for g in ngrams(t.split(), n)]
        ratio = len(set(grams)) / len(grams) if grams else 0.0
        result[f"distinct_{n}"] = ratio
        product *= ratio
    result["diversity"] = product
    return result


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
    return {**diversity(texts), "unigram_entropy": sum(map(unigram_entropy, texts)) / len(texts),
            **{f"rep_{n}": repetition(texts, n) for n in (2, 3, 4)}}
