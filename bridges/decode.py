"""Left-to-right decoding through a bridge: text read the way its causal upper stack reads it.

Each step the bridge reconstructs h_l of the known prefix (BOS and the tokens drawn so far,
all clean: the one-hot source its regression share trains on), the frozen upper stack and its
head give the next token's logits over the converter's vocabulary, and the sampler (`ltr`,
samplers/ltr.py) draws the token. Two ways to run a step:

* `RecomputedDecoding`, for any bridge. A bidirectional bridge's state at position j reads the
  positions after j, so a new token changes the whole prefix's reconstruction: each step runs
  the bridge (its K sampler steps, fresh noise where it is stochastic) and the upper stack over
  the whole prefix. Step n reads n + 1 positions; a sequence of L tokens, about L^2 / 2.
* `CachedDecoding`, for a causal bridge (`BridgeConfig.attention` "causal"). Position j reads
  positions <= j only, so the prefix's states stay what they were when each position was added.
  Each step runs the bridge on the new position alone, its attention reading the keys and values
  kept from the prefix at each of the K sampler steps (one `KVCache` per step), and the upper
  stack on that one state with its own key-value cache (`Backbone.run_from`'s `cache`): one
  position a step. Its sampler steps are `HiddenBridge.sample`'s, run on the new positions
  (`follow`, tested against it); each position's noise is drawn once, when it is added.

Neither reads a position to the right of the one it draws: there is none yet. Both name the ids
the sampler never draws (`unsampled`: EOS, the unknown token, untrained rows), as the `ar` row
suppresses them; their logits stay the stack's own.
"""

from __future__ import annotations

import torch

from geoprobe.bridges.path import bridge_path_sample
from geoprobe.bridges.nn import KVCache
from geoprobe.tokens import unsampled_ids


def noise_generator(generator: torch.Generator | None) -> torch.Generator | None:
    """A CPU generator for the bridge's noise, seeded from the sampler's (which may live on a GPU):
    the bridge draws its noise on the CPU."""
    if generator is None:
        return None
    seed = int(torch.randint(2 ** 62, (1,), generator=generator, device=generator.device))
    return torch.Generator().manual_seed(seed)


def follow(bridge, a_std: torch.Tensor, caches: list[KVCache], generator: torch.Generator | None = None) -> torch.Tensor:
    """`HiddenBridge.sample`'s K = len(caches) steps for standardised sources `a_std` (B, m, .)
    of the m positions after those the caches have read, in the backbone's coordinates; step k
    reads and extends cache k. With empty caches, on a whole sequence, it is `sample` itself: both
    run `bridge_path_sample`."""
    step = iter(caches)
    y = bridge_path_sample(lambda y, tau: bridge.predict(y, tau, a_std, next(step)), bridge.start(a_std),
                           len(caches), bridge.cfg.sigma_b, generator)
    return y * bridge.target_scale + bridge.target_mean


class RecomputedDecoding:
    """Left-to-right decoding through any bridge, the whole prefix reconstructed each step.

    Args:
        hybrid: a HybridDenoiser (its bridge, teacher, BOS state and K).
        num: sequences decoded side by side.
        length: the most tokens each will get.
        generator: the sampler's; the bridge's noise is drawn from a generator seeded by it.
    """

    def __init__(self, hybrid, num: int, length: int, generator: torch.Generator | None = None):
        self.hybrid, self.length, self.noise = hybrid, length, noise_generator(generator)
        self.tokens = torch.empty(num, 0, dtype=torch.long, device=hybrid.bos_state.device)
        tokenizer = hybrid.teacher.backbone.tokenizer  # the ids the sampler never draws, as the AR row
        self.unsampled = torch.tensor(unsampled_ids(tokenizer, hybrid.vocab_size) if tokenizer is not None else [],
                                      dtype=torch.long, device=self.tokens.device)

    def logits(self) -> torch.Tensor:
        """(B, V): the next token's logits given BOS and the tokens appended so far."""
        hidden = self.hybrid.clean_hidden(self.tokens, self.noise)
        backbone = self.hybrid.teacher.backbone
        # the head on the last position only: B x V logits, not B x (n + 1) x V
        logits = backbone.head(backbone.final_from(self.hybrid.bridge.cfg.layer, hidden)[:, -1])
        return self.hybrid.readable(logits.float())

    def append(self, tokens: torch.Tensor) -> None:
        """Append one token (B,) to each sequence."""
        if self.tokens.shape[1] >= self.length:
            raise ValueError(f"this decoding holds at most {self.length} tokens")
        self.tokens = torch.cat([self.tokens, tokens[:, None]], dim=1)


class CachedDecoding(RecomputedDecoding):
    """Left-to-right decoding through a causal bridge, each position read once (module doc)."""

    def __init__(self, hybrid, num: int, length: int, generator: torch.Generator | None = None):
        super().__init__(hybrid, num, length, generator)
        bridge = hybrid.bridge
        if bridge.cfg.attention != "causal":
            raise ValueError("a bidirectional bridge's prefix changes with each token: it cannot be cached")
        self.caches = [KVCache() for _ in range(hybrid.steps or bridge.cfg.bridge_steps)]
        self.upper = hybrid.teacher.backbone.upper_cache()
        self.offsets = hybrid.teacher.offsets(length + 1)
        # the bridge reads BOS as in training (its attention and convolution see it later); the
        # upper stack reads the backbone's own BOS state there
        bos = torch.full((num, 1), hybrid.bos_id, dtype=torch.long, device=self.tokens.device)
        self.reconstruct(bos)
        self.next = self.upper_logits(hybrid.with_bos(hybrid.bos_state.new_zeros(num, 0, len(hybrid.bos_state))))

    def reconstruct(self, ids: torch.Tensor) -> torch.Tensor:
        """h_l (B, m, d) of clean tokens `ids` (B, m) at the positions after those read so far."""
        start = self.caches[0].length
        a = self.hybrid.clean_source(ids, self.offsets[start:start + ids.shape[1]])
        return follow(self.hybrid.bridge, self.hybrid.bridge.standardise_source(a), self.caches, self.noise)

    def upper_logits(self, h: torch.Tensor) -> torch.Tensor:
        """(B, V): the upper stack's logits at the last of the states `h`, read after the cached ones."""
        logits = self.hybrid.teacher.backbone.run_from(self.hybrid.bridge.cfg.layer, h, cache=self.upper)[:, -1]
        return self.hybrid.readable(logits.float())

    def logits(self) -> torch.Tensor:
        return self.next

    def append(self, tokens: torch.Tensor) -> None:
        super().append(tokens)
        self.next = self.upper_logits(self.reconstruct(tokens[:, None]))
