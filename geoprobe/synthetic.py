"""A corpus with a known distribution: a seeded hidden Markov model over pseudo-words.

Every text it emits has an exact log-probability (the forward algorithm, in log space), so a
generator's samples can be scored under the true distribution, and the entropy rate of the
source, estimated as -log p(x_1..n) / n on long emitted sequences (consistent by the
Shannon-McMillan-Breiman theorem, with exact probabilities), is the floor any model's NLL is
measured against. Spec: `synthetic:hmm?states=8&vocab=200&docs=400&length=80&seed=0`, plus three
optional shape parameters: `emission` and `transition` (Dirichlet concentrations of the rows,
default 0.1 and 0.5: smaller is peakier) and `stick` (probability of staying in the current
state, default 0). A sticky HMM with peaked emissions is one whose next word depends on a long
context: its entropy rate lies well below what a unigram or bigram model can reach, which makes
"within 10% of the entropy rate" a test a model can fail (see `baselines`).
"""

from __future__ import annotations

import math
import re
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
    def random(cls, states: int = 8, vocab: int = 200, seed: int = 0, concentration: float = 0.1,
               transition: float = 0.5, stick: float = 0.0) -> "HMM":
        if states < 1 or vocab < 2:
            raise BadInput("synthetic:hmm needs states >= 1 and vocab >= 2")
        if concentration <= 0 or transition <= 0 or not 0 <= stick < 1:
            raise BadInput("synthetic:hmm needs emission > 0, transition > 0 and 0 <= stick < 1")
        rng = np.random.default_rng(seed)
        words, seen = [], set()
        while len(words) < vocab:
            word = "".join(rng.choice(SYLLABLES, size=rng.integers(1, 4)))
            if word not in seen:
                seen.add(word)
                words.append(word)
        moves = stick * np.eye(states) + (1 - stick) * rng.dirichlet(np.full(states, transition), size=states)
        emission = rng.dirichlet(np.full(vocab, concentration), size=states)
        # a tiny floor: small concentrations draw exact zeros, and a word of probability 0 would
        # make any model's sample that uses it infinitely unlikely rather than merely unlikely
        emission = (emission + 1e-9) / (emission + 1e-9).sum(1, keepdims=True)
        return cls(rng.dirichlet(np.ones(states)), moves, emission, words)

    def sample(self, length: int, rng: np.random.Generator) -> list[int]:
        state = rng.choice(len(self.initial), p=self.initial)
        out = []
        for _ in range(length):
            out.append(int(rng.choice(self.emission.shape[1], p=self.emission[state])))
            state = rng.choice(len(self.initial), p=self.transition[state])
        return out

    def sample_from(self, start: np.ndarray, length: int, rng: np.random.Generator) -> list[int]:
        """One `length`-word text from the state distribution `start`."""
        return HMM(start, self.transition, self.emission, self.words).sample_many(1, length, rng)[0].tolist()

    def sample_many(self, count: int, length: int, rng: np.random.Generator) -> np.ndarray:
        """(count, length) word ids of `count` independent sequences, vectorised over sequences."""
        cum_t, cum_e = np.cumsum(self.transition, 1), np.cumsum(self.emission, 1)
        state = rng.choice(len(self.initial), size=count, p=self.initial)
        out = np.empty((count, length), dtype=np.int64)
        for t in range(length):
            out[:, t] = draw_rows(cum_e[state], rng)
            state = draw_rows(cum_t[state], rng)
        return out

    def stationary(self) -> np.ndarray:
        values, vectors = np.linalg.eig(self.transition.T)
        pi = np.abs(np.real(vectors[:, np.argmin(np.abs(values - 1))]))
        return pi / pi.sum()

    def word_models(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The best unigram and bigram models of the stationary chain: (p(x), p(x_t, x_t+1),
        p(x_t+1 | x_t))."""
        marginal = self.stationary() @ self.emission
        joint = (self.emission.T * self.stationary()) @ self.transition @ self.emission
        return marginal, joint, joint / joint.sum(1, keepdims=True)

    def baselines(self) -> dict:
        """Exact nats per word of the best unigram and bigram models of the stationary chain:
        what a model reaches with no context, or with one word of it."""
        marginal, joint, conditional = self.word_models()
        return {"unigram": float(-(marginal * np.log(marginal)).sum()),
                "bigram": float(-(joint * np.log(conditional)).sum())}

    def text(self, ids: list[int]) -> str:
        return " ".join(self.words[i] for i in ids)

    def encode(self, text: str) -> list[int] | None:
        """Word ids of a text, or None when a word is not in the vocabulary (probability 0)."""
        index = {w: i for i, w in enumerate(self.words)}
        ids = [index.get(w) for w in text.split()]
        return None if any(i is None for i in ids) else ids

    def state_distributions(self, start: np.ndarray, length: int) -> np.ndarray:
        """(length, S): the hidden state's distribution at positions 0..length-1 from `start`."""
        out = np.empty((length, len(start)))
        out[0] = start
        for t in range(1, length):
            out[t] = out[t - 1] @ self.transition
        return out

    def start(self, where: str, document_length: int) -> np.ndarray:
        """The state distribution a text starts from: `document` (a document's first word: what
        an AR model prompted with BOS, or a model trained on whole documents, starts from),
        `anywhere` (a uniformly random word of a `document_length`-word document: about where
        a row cut from the concatenated corpus starts; a row that crosses a document boundary
        is still scored as one chain) or `blocks:K` (the even mixture of words 0, K, 2K, ...:
        where per-document blocks of K words start)."""
        if check_oracle_start(where) == "auto":
            raise BadInput("the oracle start 'auto' is chosen per samples file (workflows.evaluate.oracle_start_for)")
        if where == "document":
            return self.initial
        states = self.state_distributions(self.initial, document_length)
        return states.mean(0) if where == "anywhere" else states[::int(where.partition(":")[2])].mean(0)

    def bigram_distribution(self, start: np.ndarray, length: int) -> np.ndarray:
        """(V, V): the expected share of each bigram among the bigrams of a `length`-word text
        that starts in state distribution `start` (exact, averaged over its positions)."""
        states = self.state_distributions(start, max(length - 1, 1)).mean(0)
        return (self.emission.T * states) @ self.transition @ self.emission

    def log_prob(self, ids: list[int], start: np.ndarray | None = None) -> float:
        """log p(x_1..n) by the forward algorithm in log space, from the state distribution
        `start` (default: the document start, `initial`)."""
        if not ids:
            return 0.0
        log_t, log_e = np.log(self.transition), np.log(self.emission)
        alpha = np.log(self.initial if start is None else start) + log_e[:, ids[0]]
        for word in ids[1:]:
            alpha = logsumexp(alpha[:, None] + log_t, axis=0) + log_e[:, word]
        return float(logsumexp(alpha))

    def text_log_prob(self, text: str, start: np.ndarray | None = None) -> float:
        ids = self.encode(text)
        return float("-inf") if ids is None else self.log_prob(ids, start)

    def entropy_rate(self, length: int = 20000, seed: int = 1) -> float:
        """Nats per word: -log p(x_1..n) / n on one long emitted sequence."""
        ids = self.sample(length, np.random.default_rng(seed))
        return -self.log_prob(ids) / length


def check_oracle_start(where: str) -> str:
    """An --oracle-start value, checked without an HMM: auto, document, anywhere or blocks:K."""
    size = where.partition(":")[2]
    if where in ("auto", "document", "anywhere") or (where.startswith("blocks:") and size.isdigit() and int(size) > 0):
        return where
    raise BadInput(f"unknown oracle start {where!r} (use auto, document, anywhere or blocks:K)")


def parse_spec(spec: str) -> dict:
    kind, _, query = spec[len("synthetic:"):].partition("?")
    if kind != "hmm":
        raise BadInput(f"unknown synthetic corpus {kind!r} (available: synthetic:hmm?states=8&vocab=200&docs=400)")
    options = {"states": 8, "vocab": 200, "docs": 400, "length": 80, "seed": 0}
    shape = {"emission": 0.1, "transition": 0.5, "stick": 0.0}
    for key, value in parse_qsl(query):
        if key in options and value.isdigit():
            options[key] = int(value)
        elif key in shape and re.fullmatch(r"\d+(\.\d*)?|\.\d+", value):
            shape[key] = float(value)
        else:
            raise BadInput(f"malformed synthetic option {key}={value} (whole numbers for: {', '.join(options)}; "
                           f"decimals for: {', '.join(shape)})")
    return {**options, **shape}


def hmm_from_spec(spec: str) -> HMM:
    o = parse_spec(spec)
    return HMM.random(o["states"], o["vocab"], o["seed"], o["emission"], o["transition"], o["stick"])


def documents(spec: str) -> list[str]:
    o = parse_spec(spec)
    hmm = hmm_from_spec(spec)
    ids = hmm.sample_many(o["docs"], o["length"], np.random.default_rng([o["seed"], 1]))
    return [hmm.text(row) for row in ids]


def draw_rows(cumulative: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One index per row of `cumulative` (row-wise cumulative probabilities), by inverse CDF."""
    return np.minimum((rng.random(len(cumulative))[:, None] > cumulative).sum(1), cumulative.shape[1] - 1)


def oracle_scores(hmm: HMM, texts: list[str], start: str, document_length: int, eos: str | None = None) -> dict:
    """Exact NLL per word of generated texts under the true HMM, from the state distribution
    the generator's training blocks start from (`HMM.start`), and the total-variation distance
    between the samples' pooled bigram frequencies and the HMM's expected bigram distribution
    for texts of their length, beside the same distance for as many texts of that length drawn
    from the HMM itself (its finite-sample floor). The NLL rewards repeating a likely word; the
    bigram distance does not.

    A text holding `eos` (the samples file's EOS string) is several documents: the first is
    scored from the generator's start, each later one from a document start
    (`HMM.start("document")`), their log-probabilities and words summed (the EOS is not a
    word); bigrams are counted within documents, never across a break, and compared with the
    mixture of the two starts' expected distributions, weighted by their bigrams.

    A text holding a word the HMM cannot emit (an unknown or special token such as "<unk>") has
    probability 0; such texts are counted (`oracle_invalid`) and the NLL is over the others, so
    that one stray token does not turn a generator's whole row into infinity, nor hide."""
    origin = hmm.start(start, document_length)
    fresh = hmm.start("document", document_length)
    per_sample, words_per_sample, firsts, laters = [], [], [], []
    for text in texts:
        docs = [hmm.encode(d) for d in (text.split(eos) if eos else [text])]
        words = sum(len(ids) for ids in docs if ids is not None)
        if any(ids is None for ids in docs) or not words:
            per_sample.append(math.inf)
            words_per_sample.append(0 if any(ids is None for ids in docs) else words)
            continue
        log_p = sum(hmm.log_prob(ids, origin if k == 0 else fresh) for k, ids in enumerate(docs))
        per_sample.append(-log_p / words)
        words_per_sample.append(words)
        if math.isfinite(log_p):
            firsts += [docs[0]] if len(docs[0]) >= 2 else []
            laters += [ids for ids in docs[1:] if len(ids) >= 2]
    valid = [(v, n) for v, n in zip(per_sample, words_per_sample) if n and math.isfinite(v)]
    words = sum(n for _, n in valid)
    result = {"oracle_nll_per_word": sum(v * n for v, n in valid) / words if words else math.inf,
              "oracle_nll_per_sample": per_sample, "oracle_words_per_sample": words_per_sample,
              "oracle_invalid": len(texts) - len(valid), "oracle_start": start}
    groups = [(docs, where) for docs, where in ((firsts, origin), (laters, fresh)) if docs]
    if groups:
        expected, own = 0.0, []
        bigrams = sum(len(ids) - 1 for docs, _ in groups for ids in docs)
        for docs, where in groups:  # each start's documents at their median length
            length = int(np.median([len(ids) for ids in docs]))
            share = sum(len(ids) - 1 for ids in docs) / bigrams
            expected = expected + share * hmm.bigram_distribution(where, length)
            rng = np.random.default_rng([len(docs), length])
            own += [hmm.sample_from(where, length, rng) for _ in docs]
        result.update(bigram_tv=bigram_tv(firsts + laters, expected), bigram_tv_hmm=bigram_tv(own, expected))
    return result


def bigram_tv(texts: list[list[int]], expected: np.ndarray) -> float:
    """Total-variation distance between the pooled bigram frequencies of word-id texts and `expected`."""
    counts = np.zeros_like(expected)
    for ids in texts:
        np.add.at(counts, (np.asarray(ids[:-1]), np.asarray(ids[1:])), 1)
    return float(0.5 * np.abs(counts / counts.sum() - expected).sum())


def reference_sample_scores(hmm: HMM, length: int, count: int = 200, seed: int = 0) -> dict:
    """Oracle NLL per word of `length`-word samples from the HMM itself and from its best
    bigram and unigram models: where a generator's `oracle_nll_per_word` sits between them."""
    rng = np.random.default_rng([seed, 0x0AC1E])
    marginal, _, conditional = hmm.word_models()
    vocab = len(marginal)
    bigram = np.empty((count, length), dtype=np.int64)
    bigram[:, 0] = rng.choice(vocab, size=count, p=marginal)
    cumulative = np.cumsum(conditional, 1)
    for t in range(1, length):
        bigram[:, t] = draw_rows(cumulative[bigram[:, t - 1]], rng)
    samples = {"hmm": hmm.sample_many(count, length, rng), "bigram": bigram,
               "unigram": rng.choice(vocab, size=(count, length), p=marginal)}
    return {k: float(np.mean([-hmm.log_prob(row.tolist()) for row in v]) / length) for k, v in samples.items()}
