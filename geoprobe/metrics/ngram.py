"""An interpolated Kneser–Ney n-gram LM over an evaluator's token ids: a Gen.PPL evaluator that is
no generator's backbone (`geoprobe eval --evaluator builtin:smollm2,ngram:kjv`).

Gen.PPL under a pretrained LM whose upper stack writes a generator's text (a bridge's backbone)
measures agreement with itself. A count model of the reference corpus has no such tie: it asks
only how often the text's token sequences occur in that corpus. It rewards copying the corpus
and cannot score sense beyond n tokens, so it is a control beside the LM's score, not a
replacement for it.

The model (Chen & Goodman 1999, interpolated Kneser–Ney, one discount per order):

  p_1(w)     = max(N(•w) − D_1, 0) / N(••) + D_1 · |{w: N(•w) > 0}| / N(••) · 1/V
  p_k(w | h) = max(c_k(hw) − D_k, 0) / c_k(h•) + D_k · |{w: c_k(hw) > 0}| / c_k(h•) · p_{k−1}(w | h')

where h' drops h's first token, c_n are raw counts, c_k for k < n the continuation counts
N(•hw) (how many distinct tokens precede hw), a context never seen at order k backs off to
p_{k−1} whole, and D_k = n_1 / (n_1 + 2 n_2) from the counts of counts at that order (0.75 where
no gram occurs once or none twice: a small corpus's degenerate estimate). Each p_k sums to 1 over
the V tokens. The model is fitted on one stream of ids. A position with fewer than n − 1 tokens
before it is scored with the context it has: the missing tokens are a symbol past the vocabulary
(`NONE`) that no table holds, so those orders back off.
"""

from __future__ import annotations

import numpy as np


def _windows(stream: np.ndarray, k: int, base: int) -> np.ndarray:
    """The keys of every k-gram of `stream`: sum of its tokens times base^(k - 1 - i)."""
    keys = np.zeros(len(stream) - k + 1, dtype=np.int64)
    for i in range(k):
        keys = keys * base + stream[i:len(stream) - k + 1 + i]
    return keys


def _discount(counts: np.ndarray) -> float:
    once, twice = int(np.sum(counts == 1)), int(np.sum(counts == 2))
    return once / (once + 2 * twice) if once and twice else 0.75


class KneserNey:
    """Interpolated Kneser–Ney of `order` over ids 0..vocab-1, fitted on one id stream."""

    def __init__(self, stream: list[int] | np.ndarray, vocab: int, order: int = 3):
        stream = np.asarray(stream, dtype=np.int64)
        if order < 1:
            raise ValueError(f"order must be at least 1, got {order}")
        if len(stream) < order:
            raise ValueError(f"a {order}-gram model needs at least {order} tokens, got {len(stream)}")
        check_ids(stream, vocab)
        self.vocab, self.order, self.none = vocab, order, vocab  # `none`: a missing token of a context
        self.base = vocab + 1
        if self.base ** order >= 2 ** 63:
            raise ValueError(f"a {order}-gram of a {vocab}-token vocabulary does not fit one int64 key")
        types = {k: np.unique(_windows(stream, k, self.base), return_counts=True) for k in range(1, order + 1)}
        # order n: raw counts; each lower order: continuation counts, how many distinct tokens
        # precede the gram among the next order's types
        self.grams = {order: types[order]}
        for k in range(1, order):
            self.grams[k] = np.unique(types[k + 1][0] % self.base ** k, return_counts=True)
        self.discounts = {k: _discount(counts) for k, (_, counts) in self.grams.items()}
        self.contexts = {}  # per order >= 2: (context keys, their count totals, their numbers of types)
        for k in range(2, order + 1):
            keys, counts = self.grams[k]
            context, first = np.unique(keys // self.base, return_index=True)
            self.contexts[k] = (context, np.add.reduceat(counts, first), np.diff(np.append(first, len(keys))))
        keys, counts = self.grams[1]
        unigram = np.zeros(vocab)
        unigram[keys] = counts
        total, d = unigram.sum(), self.discounts[1]
        self.unigram = np.maximum(unigram - d, 0) / total + d * np.count_nonzero(unigram) / total / vocab

    @staticmethod
    def _lookup(table: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(index of each key in the sorted `table`, whether it is there)."""
        where = np.minimum(np.searchsorted(table, keys), len(table) - 1)
        return where, table[where] == keys

    def log_probs(self, contexts: np.ndarray, targets: np.ndarray) -> np.ndarray:
        """ln p(target | context) for each row: `contexts` (N, order - 1) ids, `self.none` for a
        missing token (the orders whose context holds one back off), `targets` (N,) ids."""
        contexts, targets = np.asarray(contexts, dtype=np.int64), np.asarray(targets, dtype=np.int64)
        check_ids(targets, self.vocab)
        check_ids(contexts, self.vocab + 1)
        p = self.unigram[targets]
        for k in range(2, self.order + 1):
            history = contexts[:, self.order - k:]  # the last k - 1 tokens
            context_keys = np.zeros(len(targets), dtype=np.int64)
            for column in history.T:
                context_keys = context_keys * self.base + column
            table, totals, kinds = self.contexts[k]
            at, seen = self._lookup(table, context_keys)
            keys, counts = self.grams[k]
            gram_at, found = self._lookup(keys, context_keys * self.base + targets)
            count = np.where(found, counts[gram_at], 0)
            d, total = self.discounts[k], totals[at]
            p = np.where(seen, (np.maximum(count - d, 0) + d * kinds[at] * p) / np.where(seen, total, 1), p)
        return np.log(p)

    def sequence_nll(self, ids: list[int], weights: list[int]) -> tuple[float, int]:
        """(−Σ ln p over the positions whose weight is 1, how many) of one id sequence, each
        position after the (up to order − 1) tokens before it."""
        padded = np.concatenate([np.full(self.order - 1, self.none), np.asarray(ids, dtype=np.int64)])
        scored = np.flatnonzero(np.asarray(weights)) + self.order - 1
        if not len(scored):
            return 0.0, 0
        contexts = np.stack([padded[scored - self.order + 1 + i] for i in range(self.order - 1)], axis=1) \
            if self.order > 1 else np.zeros((len(scored), 0), dtype=np.int64)
        return float(-self.log_probs(contexts, padded[scored]).sum()), len(scored)


def check_ids(ids: np.ndarray, vocab: int) -> None:
    if ids.size and (ids.min() < 0 or ids.max() >= vocab):
        raise ValueError(f"token ids must lie in 0..{vocab - 1}, got {ids.min()}..{ids.max()}")
