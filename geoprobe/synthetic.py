"""A corpus with a known distribution: a seeded hidden Markov model over pseudo-words.

Every text it emits has an exact log-probability (the forward algorithm, in log space), so a
generator's samples can be scored under the true distribution, and the entropy rate of the
source, estimated as -log p(x_1..n) / n on long emitted sequences (consistent by the
Shannon-McMillan-Breiman theorem, with exact probabilities), is the floor any model's NLL is
measured against. Spec: `synthetic:hmm?states=8&vocab=200&docs=400&length=80&seed=0`.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qsl

import numpy as np
from scipy.special import logsumexp

from geoprobe.errors import BadInput

SYLLABLES = ["ba", "be", "bi", "bo", "da", "de", "di", "do", "ka", "ke", "ki", "ko", "la", "le", "li", "lo", "ma",
             "me", "mi", "mo", "na", "ne", "ni", "no", "ra", "re", "ri", "ro", "sa", "se", "si", "so", "ta", "te",
             "ti", "to", "va", "ve", "vi", "vo"]


@dataclass
class HMM:
    initial: np.ndarray  # (S,)
    transition: np.ndarray  # (S, S), rows sum to 1
    emission: np.ndarray  # (S, V), rows sum to 1
    words: list[str]

    @classmethod
    def random(cls, states: int = 8, vocab: int = 200, seed: int = 0, concentration: float = 0.1) -> "HMM":
        if states < 1 or vocab < 2:
            raise BadInput("synthetic:hmm needs states >= 1 and vocab >= 2")
        rng = np.random.default_rng(seed)
        words, seen = [], set()
        while len(words) < vocab:
            word = "".join(rng.choice(SYLLABLES, size=rng.integers(1, 4)))
            if word not in seen:
                seen.add(word)
                words.append(word)
        transition = rng.dirichlet(np.full(states, 0.5), size=states)
        emission = rng.dirichlet(np.full(vocab, concentration), size=states)
        return cls(rng.dirichlet(np.ones(states)), transition, emission, words)

    def sample(self, length: int, rng: np.random.Generator) -> list[int]:
        state = rng.choice(len(self.initial), p=self.initial)
        out = []
        for _ in range(length):
            out.append(int(rng.choice(self.emission.shape[1], p=self.emission[state])))
            state = rng.choice(len(self.initial), p=self.transition[state])
        return out

    def text(self, ids: list[int]) -> str:
        return " ".join(self.words[i] for i in ids)

    def encode(self, text: str) -> list[int] | None:
        """Word ids of a text, or None when a word is not in the vocabulary (probability 0)."""
        index = {w: i for i, w in enumerate(self.words)}
        ids = [index.get(w) for w in text.split()]
        return None if any(i is None for i in ids) else ids

    def log_prob(self, ids: list[int]) -> float:
        """log p(x_1..n) by the forward algorithm in log space."""
        if not ids:
            return 0.0
        log_t, log_e = np.log(self.transition), np.log(self.emission)
        alpha = np.log(self.initial) + log_e[:, ids[0]]
        for word in ids[1:]:
            alpha = logsumexp(alpha[:, None] + log_t, axis=0) + log_e[:, word]
        return float(logsumexp(alpha))

    def text_log_prob(self, text: str) -> float:
        ids = self.encode(text)
        return float("-inf") if ids is None else self.log_prob(ids)

    def entropy_rate(self, length: int = 20000, seed: int = 1) -> float:
        """Nats per word: -log p(x_1..n) / n on one long emitted sequence."""
        ids = self.sample(length, np.random.default_rng(seed))
        return -self.log_prob(ids) / length


def parse_spec(spec: str) -> dict:
    kind, _, query = spec[len("synthetic:"):].partition("?")
    if kind != "hmm":
        raise BadInput(f"unknown synthetic corpus {kind!r} (available: synthetic:hmm?states=8&vocab=200&docs=400)")
    options = {"states": 8, "vocab": 200, "docs": 400, "length": 80, "seed": 0}
    for key, value in parse_qsl(query):
        if key not in options or not value.isdigit():
            raise BadInput(f"malformed synthetic option {key}={value} (numbers for: {', '.join(options)})")
        options[key] = int(value)
    return options


def hmm_from_spec(spec: str) -> HMM:
    o = parse_spec(spec)
    return HMM.random(o["states"], o["vocab"], o["seed"])


def documents(spec: str) -> list[str]:
    o = parse_spec(spec)
    hmm = HMM.random(o["states"], o["vocab"], o["seed"])
    rng = np.random.default_rng([o["seed"], 1])
    return [hmm.text(hmm.sample(o["length"], rng)) for _ in range(o["docs"])]
