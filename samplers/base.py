"""What every sampler shares: the TokenDenoiser protocol, nucleus filtering, float64 Gumbel
sampling (the noise drawn on the denoiser's device), a denoiser wrapper that counts evaluations (NFE) and skips a call when its input did
not change, and the state of a partially revealed sequence.

A `TokenDenoiser` maps noisy token states z (B, L, d_tok) to logits (B, L, V); it exposes
`vocab_size`, `s_max` and `token_table()` (the unit-norm channel embeddings). The DSL model
and the bridge's hybrid denoiser both implement it, so every sampler drives both.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields
from typing import Protocol

import numpy as np
import torch

from geoprobe.device import upload
from geoprobe.errors import BadInput
from geoprobe.samplers.plan import check_logits_room

MASK = -1


class TokenDenoiser(Protocol):
    vocab_size: int
    s_max: float

    def token_table(self) -> torch.Tensor: ...

    def __call__(self, z: torch.Tensor) -> torch.Tensor: ...


TOP_P_RULES = ("hf", "remdm")


def nucleus(logits: torch.Tensor, top_p: float, rule: str = "hf") -> torch.Tensor:
    """Nucleus filtering, the top token always kept. `hf` (transformers' TopPLogitsWarper): the
    smallest set whose probability reaches top_p, so the token that crosses top_p stays; `remdm`
    (the MDLM/ReMDM sampling code): the tokens whose cumulative probability is at most top_p, so
    that token goes. At the same top_p `hf` keeps one token more and samples hotter."""
    if top_p >= 1.0:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(-1)
    cumulative = probs.cumsum(-1)
    outside = cumulative - probs > top_p if rule == "hf" else cumulative > top_p
    outside[..., 0] = False
    sorted_logits = sorted_logits.masked_fill(outside, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


def gumbel_sample(logits: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Categorical draws via argmax(logits + Gumbel noise), the noise in float64 (float32 noise
    cannot produce the rare tail draws a large vocabulary needs); computed in place, so that the
    peak is the noise and the float64 logits, 16 bytes an entry."""
    u = torch.rand(logits.shape, generator=generator, dtype=torch.float64, device=generator.device)
    tiny = torch.finfo(torch.float64).tiny
    gumbel = u.clamp_(min=tiny, max=1 - 1e-16).log_().neg_().log_().neg_()
    return gumbel.add_(logits.double()).argmax(-1)


class SplitDenoiser(TokenDenoiser, Protocol):
    """A TokenDenoiser whose logits are a per-position head over per-position features (the
    bridge's hybrid: the upper stack's final states, then the LM head): a sampler keeps the
    features and applies the head only where it draws a token."""

    def features(self, z: torch.Tensor) -> torch.Tensor: ...  # (B, L, F)

    def logits_of(self, features: torch.Tensor, z: torch.Tensor) -> torch.Tensor: ...  # (n, F), (n, d_tok) -> (n, V)


def is_split(denoiser) -> bool:
    """Whether a denoiser computes features apart from its head (`SplitDenoiser`): a sampler then
    applies the head only at the positions it draws."""
    return callable(getattr(denoiser, "features", None))


class CountingDenoiser:
    """Counts denoiser evaluations and skips work whose input did not change.

    Sequences are independent under the denoiser, so a call recomputes only the rows of z that
    changed since the last call and the others keep what it computed then; a call where no row
    changed costs nothing. The sampler says which rows it changed (`changed`, row indices on the
    host; None: every row), so that no call waits for the device. What is kept per row is the
    denoiser's features where it has them (`SplitDenoiser`; `logits_at` then applies the head at
    the positions asked for only), else its float32 logits. `nfe` counts calls that ran the
    network, `rows` the sequences it processed.
    """

    def __init__(self, denoiser: TokenDenoiser, cache: bool = True):
        self.denoiser = denoiser
        self.cache = cache
        self.split = is_split(denoiser)
        self.nfe = 0
        self.skipped = 0
        self.rows = 0
        self._z = None
        self._kept = None

    @torch.no_grad()
    def evaluate(self, z: torch.Tensor, changed: torch.Tensor | None = None) -> None:
        """Run the network on the rows of z in `changed` (None: all), keeping the other rows' results."""
        network = self.denoiser.features if self.split else (lambda x: self.denoiser(x).float())
        if changed is None or not self.cache or self._z is None or self._z.shape != z.shape:
            self._kept = network(z)
            self.rows += len(z)
        elif len(changed) == 0:
            self.skipped += 1
            return
        else:
            rows = upload(torch.as_tensor(changed, dtype=torch.long), z.device)
            self._kept = self._kept.index_put((rows,), network(z[rows]))
            self.rows += len(changed)
        self.nfe += 1
        self._z = z

    @torch.no_grad()
    def logits_at(self, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """(n, V) float32 logits of the last evaluated z at positions (rows[i], cols[i])."""
        if not self.split:
            return self._kept[rows, cols]
        return self.denoiser.logits_of(self._kept[rows, cols], self._z[rows, cols]).float()

    @torch.no_grad()
    def __call__(self, z: torch.Tensor, changed: torch.Tensor | None = None) -> torch.Tensor:
        """(B, L, V) float32 logits at every position (`evaluate`, then the head everywhere)."""
        self.evaluate(z, changed)
        if not self.split:
            return self._kept
        return self.denoiser.logits_of(self._kept, self._z).float()


def noise_seed(seed: int, first: int) -> int:
    """The seed of a denoiser's own noise in the batch of a draw seeded `seed` that starts at
    sample `first`: from host integers, so that seeding it never waits for the device, and the same
    for a resumed draw."""
    return int(np.random.SeedSequence([seed, first]).generate_state(1, dtype=np.uint64)[0] >> 1)


@dataclass
class SampleResult:
    tokens: torch.Tensor  # (num, length) token ids
    nfe: int
    skipped: int
    rows: int  # sequences the network processed, summed over calls
    seconds: float
    settings: dict

    @property
    def nfe_per_sample(self) -> float:
        """Network evaluations each sample received, on average: the papers' NFE (they sample one
        sequence per batch); `nfe` counts batched calls."""
        return self.rows / max(1, len(self.tokens))


class RevealState:
    """Token ids with MASK for hidden positions, and the z the denoiser sees: revealed tokens
    at s_max with noise drawn once per position (so an unchanged state gives an identical z
    and the denoiser call can be skipped), masked tokens at s = 0, i.e. z = 0."""

    def __init__(self, table: torch.Tensor, s_max: float, num: int, length: int, generator: torch.Generator):
        self.table, self.s_max = table, s_max
        self.tokens = torch.full((num, length), MASK, dtype=torch.long, device=table.device)
        # drawn where the generator lives (the samplers': the table's device; the likelihoods': the
        # CPU, so that an estimate does not depend on the device), then moved to the table
        self.noise = torch.randn(num, length, table.shape[1], generator=generator, dtype=table.dtype,
                                 device=generator.device)
        self.noise = upload(self.noise, table.device)
        # the (filtered) probability each revealed token was drawn with: remdm-conf's confidence
        self.probability = torch.full((num, length), float("nan"), device=table.device)

    @property
    def masked(self) -> torch.Tensor:
        return self.tokens == MASK

    def z(self) -> torch.Tensor:
        revealed = ~self.masked
        e = self.table[self.tokens.clamp(min=0)]
        z = self.s_max * e + self.s_max ** 0.5 * self.noise
        return z * revealed[..., None]


def check_flags(*, steps=None, top_p=None, per_step=None, eta=None, eta_cap=None, switch_snr=None, num=None,
                length=None, top_p_rule=None, t_on=None, t_off=None, alpha_on=None, continuous_steps=None,
                confidence=None, batch=None, **_) -> None:
    """The range of every sampling flag, in one place (None: not given). Each sampler checks its
    own when it is built; `geoprobe sample` checks all of them, since a flag out of range is a
    mistake even where the chosen sampler ignores it. NaN fails every comparison and is refused."""
    for flag, value in (("--steps", steps), ("--per-step", per_step), ("--continuous-steps", continuous_steps),
                        ("--batch", batch)):
        if value is not None and not value >= 1:
            raise BadInput(f"{flag} must be at least 1, got {value}")
    if top_p is not None and not 0 < top_p <= 1:
        raise BadInput(f"--top-p must be in (0, 1], got {top_p}")
    if top_p_rule is not None and top_p_rule not in TOP_P_RULES:
        raise BadInput(f"unknown --top-p-rule {top_p_rule!r} (use {', '.join(TOP_P_RULES)})")
    for flag, value in (("--eta", eta), ("--eta-cap", eta_cap)):
        if value is not None and not 0 <= value <= 1:
            raise BadInput(f"{flag} must be in [0, 1], got {value}")
    for flag, value in (("--t-on", t_on), ("--t-off", t_off), ("--alpha-on", alpha_on)):
        if value is not None and not 0 < value < 1:
            raise BadInput(f"{flag} must be in (0, 1), got {value}")
    if t_on is not None and t_off is not None and not t_off < t_on:
        raise BadInput(f"remdm-loop needs --t-off < --t-on, got {t_off} and {t_on}")
    if confidence is not None and not 0 < confidence <= 1:
        raise BadInput(f"--confidence must be in (0, 1], got {confidence}")
    if switch_snr is not None and not 0 < switch_snr < float("inf"):
        raise BadInput(f"--switch-snr must be positive and finite, got {switch_snr}")
    if (num is not None or length is not None) and not (num >= 1 and length >= 1):
        raise BadInput(f"--num and --length must be positive, got {num} and {length}")


@dataclass
class Sampler:
    """One generation path, its knobs as dataclass fields (every one a flag of `geoprobe sample`).
    Subclasses implement `run(model, num, length, generator)` over a `CountingDenoiser` and
    return token ids."""

    name = "base"
    steps: int = 64
    top_p: float = 1.0
    top_p_rule: str = "hf"
    cache: bool = True

    def __post_init__(self):
        check_flags(**{f.name: getattr(self, f.name) for f in fields(self)})

    def settings(self) -> dict:
        return {"sampler": self.name, **{k: v for k, v in vars(self).items() if not k.startswith("_")}}

    def check(self, length: int) -> None:
        """Refuse a budget that makes no sense for this sampler at this length."""

    def logit_rows(self, num: int, length: int) -> int:
        """The most positions one step applies the head to (samplers/plan.py): every position here,
        as a step that reads the whole posterior does."""
        return num * length

    def draw(self, logits: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        return gumbel_sample(nucleus(logits, self.top_p, self.top_p_rule), generator)

    def reveal(self, state: "RevealState", rows: torch.Tensor, cols: torch.Tensor, logits: torch.Tensor,
               generator: torch.Generator):
        """Draw the tokens at positions (rows[i], cols[i]) from their filtered logits (n, V);
        record each one's probability."""
        filtered = nucleus(logits, self.top_p, self.top_p_rule)
        tokens = gumbel_sample(filtered, generator)
        state.tokens[rows, cols] = tokens
        state.probability[rows, cols] = filtered.softmax(-1).gather(-1, tokens[:, None]).squeeze(-1)

    @torch.no_grad()
    def sample(self, denoiser: TokenDenoiser, num: int, length: int, seed: int = 0,
               batch: int | None = None, resume: dict | None = None, on_batch=None) -> SampleResult:
        """`num` samples of `length` tokens, drawn `batch` at a time (None: all at once).

        One generator runs through the batches, so a given `batch` gives the same samples wherever
        it runs; a smaller `batch` bounds a step's logits (a large vocabulary's) at the cost of more,
        smaller network calls. `nfe` and `skipped` count one batch's calls (the most any batch
        made), as an unbatched draw counts them; `rows` sums over the batches.

        Args:
            resume: a draw's progress as `on_batch` gave it (same denoiser, seed, num, length and
                batch): the draw goes on from it, with the samples an unbroken draw gives.
            on_batch: called after each batch but the last with the progress so far: {"done": samples
                drawn, "tokens", "counts": each batch's (nfe, skipped, rows), "generator": the
                generator's state, "seconds"}.
        """
        check_flags(num=num, length=length, batch=batch)
        self.check(length)
        size = num if batch is None else min(batch, num)
        self.check_room(denoiser, size, length, batched=batch is not None)
        # on the denoiser's device: V-wide float64 noise drawn on the CPU and copied over would
        # cost a transfer and a sync per step (the same seed gives other samples on another device)
        generator = torch.Generator(device=denoiser.token_table().device).manual_seed(seed)
        parts, counts, before, done = [], [], 0.0, 0
        if resume is not None:
            done = resume["done"]
            if not (0 < done < num and done % size == 0 and tuple(resume["tokens"].shape) == (done, length)):
                raise BadInput(f"cannot resume a draw of {num} x {length} in batches of {size} from "
                               f"{tuple(resume['tokens'].shape)} samples")
            generator.set_state(resume["generator"])
            parts, counts, before = [resume["tokens"]], [tuple(c) for c in resume["counts"]], resume["seconds"]
        start = time.perf_counter()
        for first in range(done, num, size):
            self.seed_denoiser(denoiser, noise_seed(seed, first))
            tokens, counted = self.draw_batch(denoiser, min(size, num - first), length, generator)
            parts.append(tokens.cpu())
            counts.append(counted)
            if on_batch is not None and first + size < num:
                on_batch({"done": first + size, "tokens": torch.cat(parts), "counts": list(counts),
                          "generator": generator.get_state(), "seconds": before + time.perf_counter() - start})
        nfe, skipped, rows = zip(*counts)
        settings = {**self.settings(), "seed": seed, "num": num, "length": length,
                    **({} if batch is None else {"batch": size})}
        return SampleResult(torch.cat(parts), max(nfe), max(skipped), sum(rows), before + time.perf_counter() - start,
                            settings)

    def check_room(self, denoiser: TokenDenoiser, size: int, length: int, batched: bool) -> None:
        """Refuse, in one line, a batch whose logits would not fit in memory (samplers/plan.py)."""
        split = is_split(denoiser)
        # a denoiser without a separate head computes its logits at every position of every call
        check_logits_room(lambda n: self.logit_rows(n, length) if split else n * length, size,
                          denoiser.vocab_size, denoiser.token_table().device, batched=batched)

    def draw_batch(self, denoiser: TokenDenoiser, num: int, length: int,
                   generator: torch.Generator) -> tuple[torch.Tensor, tuple[int, int, int]]:
        """One batch's tokens and its (nfe, skipped, rows), drawn with `run` over a fresh
        `CountingDenoiser`."""
        model = CountingDenoiser(denoiser, self.cache)
        tokens = self.run(model, num, length, generator)
        return tokens, (model.nfe, model.skipped, model.rows)

    def seed_denoiser(self, denoiser: TokenDenoiser, seed: int) -> None:
        """Seed the denoiser's own noise, where it has some (a stochastic bridge's K steps:
        `HybridDenoiser.seed_noise`), for the next batch (`noise_seed`): its samples then follow
        the draw's seed, not the process's global RNG."""
        if (seed_noise := getattr(denoiser, "seed_noise", None)) is not None:
            seed_noise(seed)

    @classmethod
    def knobs(cls) -> dict:
        """{flag name: default} of this sampler's knobs."""
        return {f.name: f.default for f in fields(cls)}

    def run(self, model: CountingDenoiser, num: int, length: int, generator: torch.Generator) -> torch.Tensor:
        raise NotImplementedError
