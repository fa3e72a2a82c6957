"""The DiHAL hidden-state bridge and the hybrid TokenDenoiser built on it.

The lower prefix of a causal LM (embeddings + blocks 1..l) is replaced by a conditional
diffusion bridge that reconstructs h_l from the tokens seen through the DSL channel:

* condition: z_i = s_i e(x_i) + sqrt(s_i) eps on a unit-norm token table; the converter turns z_i
  into a mixture pi_i over the tokens and a mask slot, and the source state is
  a_i = sum_v pi_iv E[v] + pi_i,mask m + p_i, with E the backbone's own input embedding (frozen),
  m learned, and p_i = embed(.)_i - E[.] the backbone's additive position embedding (zero for
  rotary models, GPT-2's wpe otherwise). At clean SNR (pi one-hot) a is exactly layer 0.
  The mixture covers the tokens the corpus contains (and the specials), not the whole vocabulary:
  the exact posterior under a prior that gives the others probability 0, and ~5x cheaper on
  SmolLM2's 49,152 tokens with the KJV's 9,578.
* carry: each token's mean training state at layer l (the token-lookup control's table T),
  mixed by the same posterior: c_i = sum_v pi_iv T[v] + pi_i,mask mu_l. At clean SNR it is the
  lookup's prediction, so an untrained bridge scores exactly the lookup control and what the
  network adds is what context adds (docs/bridge-design.md: with the least-squares carry from
  layer 0 a 2-block bridge was still above the lookup after 1,100 steps).
* bridge, in standardised coordinates (each channel by its own mean and spread): the interpolant
  y_tau = (1 - tau) c~ + tau h~ + sigma_b sqrt(tau (1 - tau)) eps, a Brownian bridge from the carry
  to the true state; a bidirectional transformer D(y_tau, tau, a~, c~) with adaLN on tau predicts
  the endpoint h~ (its update over c~); loss = MSE over positions >= 1. By default sigma_b = 1,
  a quarter of the training sequences at tau = 0 and the rest at tau ~ U[0, 1], and K = 32
  sampler steps: the bridge diffuses in the hidden-state space, its tau = 0 prediction is the
  posterior mean E[h_l | z] and its K-step samples draw from the posterior (the design study's
  confirmed choice, docs/bridge-design.md; experiments/records/bridge-design/choice.json). `--regression` (REGRESSION) is the
  deterministic bridge: sigma_b = 0, every row at tau = 0, one step. Then a tau > 0 row is solved
  exactly by rearranging y_tau, so the K-step sample is the tau = 0 prediction (tested) and the
  bridge is the regression E[h_l | z].
* sampling (`bridge_path_sample`): K steps from tau = 0 with the Brownian bridge's posterior
  towards the predicted endpoint, y' = y + (tau' - tau)/(1 - tau) (h^ - y)
  + sigma_b sqrt((tau' - tau)(1 - tau')/(1 - tau)) eps. With the exact posterior mean as the network
  its samples tend to the exact conditional law as K grows (tests/test_diffusion_bridge.py).
  Position 0 (BOS) is not generated: its state is the backbone's.

`HybridDenoiser` = converter -> bridge (K steps) -> backbone.run_from(l, h^) -> LM head, logits
shifted so that position i scores token x_i, plus the channel's evidence <e_v, z_i>: any DSL
sampler can generate with it, and `ltr` decodes with it left to right (bridges/decode.py).
`attention` "causal" makes position i of the bridge read positions <= i only, as the input
convolution does, so a prefix's reconstruction does not change when tokens follow it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
from torch import nn
from torch.nn import functional as F

from geoprobe.bridges.channel import S_MAX, TokenTable, posterior_logits
from geoprobe.bridges.checkpoint import build_network, load_weights, read_config
from geoprobe.bridges.converter import Converter
from geoprobe.bridges.decode import CachedDecoding, RecomputedDecoding
from geoprobe.bridges.nn import KVCache, Transformer, TransformerConfig, native_bf16, timestep_embedding
from geoprobe.bridges.path import bridge_path_sample
from geoprobe.backbone import check_bridge_layer, load_backbone, locate_backbone
from geoprobe.capture import capture
from geoprobe.device import Precision, upload
from geoprobe.errors import BadInput
from geoprobe.tokens import start_token


def pinned_shape(hidden_size: int, layer: int) -> tuple[int, int, int]:
    """The (width, depth, heads) rule the SmolLM2 sweep of `make results` started with: width d / 2 rounded up to a multiple of 64, within 128..1024 (no 64x input
    bottleneck at d = 4,096), depth 2 + layer // 4 blocks up to 6 (deeper states need more
    update), heads of 64 channels. Kept by name for the runs pinned to it (the sweep, the shape
    study's variants), whatever bridge_shape becomes."""
    width = min(1024, max(128, 64 * math.ceil(hidden_size / 128)))
    return width, min(6, 2 + layer // 4), width // 64


def bridge_shape(hidden_size: int, layer: int) -> tuple[int, int, int]:
    """The default (width, depth, heads) of a bridge standing in for blocks 1..`layer` of a
    d = `hidden_size` model, chosen by the shape study of docs/bridge-design.md (bridges at their
    plateau, SmolLM2 layers 3 and 9, paired with the sweep's): the sweep's pinned width
    (pinned_shape) x 1.6, rounded to a multiple of 64 halves up as the study scaled it
    (320 -> 512 at d = 576, 1,024 -> 1,664 at d = 4,096, 128 -> 192), because width x 1.6 was
    better at both layers at seed 0 (r 0.88, 0.91) and again at seed 1 (r 0.90, 0.93), each by
    more than the sweep's own seed spread, while every cheaper shape was worse; depth stays
    2 + layer // 4 up to 6 (depth x 2 was better too, and waits for its own confirmation)."""
    width, depth, _ = pinned_shape(hidden_size, layer)
    width = 64 * math.floor(1.6 * width / 64 + 0.5)
    return width, depth, width // 64


@dataclass
class BridgeConfig:
    layer: int
    vocab_size: int
    hidden_size: int
    d_tok: int = 64
    # the shape: 0 = bridge_shape(hidden_size, layer), a function of d and the layer
    # (docs/bridge-design.md); every command reads it from here
    d_model: int = 0
    n_layers: int = 0
    n_heads: int = 0
    # the bridge noise in standardised units (0: a deterministic path, the regression E[h_l | z])
    sigma_b: float = 1.0
    # sampler steps K (1 for the regression, whose later steps add nothing: the module doc)
    bridge_steps: int = 32
    clean_frac: float = 0.25
    # share of training sequences at tau = 0 (the source alone); the others draw tau from U[0, 1]
    tau_zero: float = 0.25
    # share of training sequences that are the plain clean regression: clean condition *and*
    # tau = 0; 1 = the ceiling control
    regression_frac: float = 0.0
    residual: bool = True  # predict h~ as the carry (below) plus a learned update
    # where the path starts and what the update is added to: "lookup" = each token's mean training
    # state at layer l (the token-lookup control), mixed by the converter's posterior like the
    # source; "channel" = the source's channels carried by their least-squares slopes (older bridges)
    carry: str = "lookup"
    # standardisation of source and target: "channel" (each channel by its own mean and spread, so
    # the loss weighs channels as nmse_dim does) or "scalar" (one scale per layer: older bridges)
    scale: str = "channel"
    # the converter's vocabulary: "corpus" = the tokens of the corpus's blocks (every split) and the
    # specials (support_size of them, ids in the `support` buffer), "train" = those of the training
    # blocks alone and the specials (no held-out token in the support; a token outside it is read,
    # at clean condition, as the lookup's overall mean), "all" = the backbone's whole vocabulary
    vocab: str = "corpus"
    support_size: int = 0  # 0: the whole vocabulary
    precision: str = "auto"  # auto: the mixture's product in bf16 where the device has it natively
    # previous positions a causal convolution over the network's input reads directly (0: none,
    # older bridges): the lookup + ridge control finds linear context in a short window, which
    # attention alone must first learn to reach (docs/bridge-design.md)
    conv_window: int = 4
    # the network's attention: "bidirectional" (each position reads every other) or "causal" (position
    # i reads positions <= i, as the input convolution does): a causal bridge's states of a prefix do
    # not change when a token is added after it, so left-to-right decoding keeps them (bridges/decode.py)
    attention: str = "bidirectional"

    def __post_init__(self):
        if self.hidden_size and not (self.d_model and self.n_layers and self.n_heads):
            width, depth, heads = bridge_shape(self.hidden_size, self.layer)
            self.d_model = self.d_model or width
            self.n_layers = self.n_layers or depth
            # about 64 channels a head, and a count that divides the width (a --d-model of 200: 2)
            self.n_heads = self.n_heads or next(h for h in range(max(1, self.d_model // 64), 0, -1)
                                                if self.d_model % h == 0)


# the deterministic bridge, the regression of h_l on the noisy condition (`--regression`): the
# default before the diffusion bridge, and the regression sweep's bridges (docs/results.md)
REGRESSION = {"sigma_b": 0.0, "tau_zero": 1.0, "bridge_steps": 1, "regression_frac": 0.5}
# the default diffusion bridge before the design study's confirmation (2026-12-06): the pages
# made with it (testbed.md's DiHAL rows, bench/README's ltr table) pin it to stay reproducible
FIRST_DIFFUSION = {"sigma_b": 1.0, "tau_zero": 0.0, "bridge_steps": 16}
# the ceiling control: the same network as the plain clean regression (every row clean, tau = 0)
CEILING = {**REGRESSION, "regression_frac": 1.0}
ATTENTIONS = ("bidirectional", "causal")
VOCABS = ("corpus", "train", "all")


def check_bridge_flags(cfg: BridgeConfig) -> None:
    """The flags a BridgeConfig was made from, checked before the backbone is known."""
    vocab, sigma_b, tau_zero, precision = cfg.vocab, cfg.sigma_b, cfg.tau_zero, cfg.precision
    regression_frac, carry, bridge_steps, conv_window = cfg.regression_frac, cfg.carry, cfg.bridge_steps, cfg.conv_window
    if Precision.parse(precision) is Precision.BFLOAT16:  # a bridge is small beside its frozen backbone
        raise BadInput("--precision bfloat16 is for dsl train; a bridge trains with auto or float32")
    if carry not in ("lookup", "channel"):
        raise BadInput(f"--carry must be lookup or channel, got {carry!r}")
    if vocab not in VOCABS:
        raise BadInput(f"--vocab must be one of {', '.join(VOCABS)}, got {vocab!r}")
    if not 0 <= sigma_b < float("inf"):  # also refuses NaN
        raise BadInput(f"--sigma-b must be finite and >= 0, got {sigma_b}")
    if not 0 <= tau_zero <= 1:
        raise BadInput(f"--tau-zero must be in [0, 1], got {tau_zero}")
    if cfg.attention not in ATTENTIONS:
        raise BadInput(f"--attention must be {' or '.join(ATTENTIONS)}, got {cfg.attention!r}")
    if not 0 <= conv_window <= 64:
        raise BadInput(f"--conv-window must be in [0, 64], got {conv_window}")
    if sigma_b > 0 and bridge_steps < 2:  # one step adds no noise: the bridge would stay deterministic
        raise BadInput("--sigma-b > 0 makes the bridge stochastic, which one sampler step cannot show: "
                       "give --bridge-steps 2 or more (e.g. 8)")
    if sigma_b > 0 and tau_zero == 1:
        raise BadInput("--sigma-b > 0 samples the bridge at tau > 0, which --tau-zero 1 never trains: "
                       "give --tau-zero below 1 (e.g. 0.5)")
    if not 0 <= regression_frac <= 1:
        raise BadInput(f"--regression-frac must be in [0, 1], got {regression_frac}")


class HiddenBridge(nn.Module):
    def __init__(self, cfg: BridgeConfig, seed: int = 0):
        super().__init__()
        self.cfg = cfg
        d = cfg.hidden_size
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.table = TokenTable(cfg.vocab_size, cfg.d_tok)
            self.converter = Converter(cfg.support_size or cfg.vocab_size)
            self.mask_vector = nn.Parameter(torch.zeros(d))
            self.time_mlp = nn.Sequential(nn.Linear(cfg.d_model, cfg.d_model), nn.SiLU())
            # the network reads the path and the whole source: with a lookup carry that is layer 0's
            # mixture and the carry itself, so at tau > 0 it can tell y_tau's share of the carry from
            # the target's (without c~ it would have to learn the lookup table to do so)
            self.inp = nn.Linear(d + self.source_width, cfg.d_model)
            self.net = Transformer(TransformerConfig(cfg.d_model, cfg.n_layers, cfg.n_heads, cond_dim=cfg.d_model,
                                                     causal=cfg.attention == "causal"))
            self.out = nn.Linear(cfg.d_model, d)
            if cfg.residual:  # start from the carried source: the update is learned from zero
                nn.init.zeros_(self.out.weight)
                nn.init.zeros_(self.out.bias)
            if cfg.conv_window:  # made last: the modules above draw the same initial weights as without it
                self.conv = nn.Conv1d(cfg.d_model, cfg.d_model, cfg.conv_window + 1, bias=False)
                with torch.no_grad():  # starts as the identity (its last tap is the position itself)
                    self.conv.weight.zero_()
                    self.conv.weight[:, :, -1] = torch.eye(cfg.d_model)
        if cfg.support_size:
            self.register_buffer("support", torch.zeros(cfg.support_size, dtype=torch.long))
        # standardisation of the source (layer-0 space) and the target (layer l): a mean and a
        # scale per channel (or one scalar scale), the carry's gain per channel, and the norm above
        # which a target row is massive (left out of the loss, as validation leaves it out)
        shape = (d,) if cfg.scale == "channel" else ()
        for name in ("source_mean", "target_mean"):
            self.register_buffer(name, torch.zeros(d))
        for name in ("source_scale", "target_scale"):
            self.register_buffer(name, torch.ones(shape))
        if cfg.scale == "channel":
            self.register_buffer("carry_gain", torch.ones(d))
            self.register_buffer("massive_norm", torch.tensor(float("inf")))
        if cfg.carry == "lookup":  # one row per token the converter can name, in backbone units (and,
            # with a training support, one more: the overall mean, for a token outside it)
            self.register_buffer("lookup", torch.zeros((cfg.support_size or cfg.vocab_size) + self.unseen_row, d))

    def set_statistics(self, source: torch.Tensor, target: torch.Tensor, massive_norm: float = float("inf")) -> None:
        """From (n, d) samples of layer 0 and layer l at the same positions: each channel's mean
        and spread (or sqrt(tr(Sigma)/d) for a scalar scale) and, per channel, the least-squares
        slope of the standardised target on the standardised source (their correlation): the
        carry then predicts each channel as well as its source channel can, nmse_dim =
        mean_c(1 - rho_c^2) <= 1 before any training (at layer 0, rho = 1: exact)."""
        centred = {}
        for prefix, states in (("source", source), ("target", target)):
            mean = states.double().mean(0)
            centred[prefix] = states.double() - mean
            spread = centred[prefix].pow(2).mean(0)
            scale = spread.sqrt() if self.cfg.scale == "channel" else spread.mean().sqrt()
            getattr(self, f"{prefix}_mean").copy_(mean.float())
            getattr(self, f"{prefix}_scale").copy_(scale.float().clamp(min=1e-8 * float(scale.max()) + 1e-30))
        if self.cfg.scale == "channel":
            s, t = centred["source"], centred["target"]
            gain = (s * t).mean(0) / (s.pow(2).mean(0) * t.pow(2).mean(0)).sqrt().clamp(min=1e-300)
            self.carry_gain.copy_(gain.float())
            self.massive_norm.fill_(massive_norm)
        self._kept = None  # the mixture's table is centred on the target mean

    @property
    def source_width(self) -> int:
        """Channels of `source`'s output: layer 0's mixture, and with a lookup carry the carry
        and the converter's two doubt channels."""
        return 2 * self.cfg.hidden_size + 2 if self.cfg.carry == "lookup" else self.cfg.hidden_size

    @property
    def unseen_row(self) -> int:
        """1 when a token may fall outside the support (a training support): the lookup then has a
        last row for it."""
        return int(self.cfg.vocab == "train" and self.cfg.support_size > 0)

    def set_lookup(self, table: torch.Tensor) -> None:
        """Each support token's (or each vocabulary token's) mean training state at layer l,
        (support_size or vocab_size, d) in the backbone's units: geoprobe.bridges.controls.token_lookup."""
        self.lookup.copy_(table)
        self._kept = None

    def scored(self, target: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """`weight` without the massive target rows (none for a scalar-scale bridge)."""
        if self.cfg.scale != "channel":
            return weight
        return weight * (target.norm(dim=-1) <= self.massive_norm)

    def set_support(self, ids: torch.Tensor) -> None:
        """The backbone ids the converter can put mass on (sorted, unique, `support_size` of them)."""
        self.support.copy_(ids)
        self._kept = None

    def _kept_embeddings(self, embeddings: torch.Tensor) -> torch.Tensor:
        """The rows the mixture uses (the support's, or all) of the backbone's embedding table,
        beside the lookup's rows with a lookup carry, in the mixture's dtype: gathered and cast
        once per table."""
        kept = getattr(self, "_kept", None)
        if kept is None or kept[0] is not embeddings:
            rows = embeddings[self.support] if self.cfg.support_size else embeddings
            if self.cfg.carry == "lookup":
                # centred, so that a bf16 table rounds each channel at the scale of its spread,
                # not of its mean (massive channels); `source` adds the mean back, exactly, as
                # the mixture's weights sum to 1
                named = self.lookup[:len(self.lookup) - self.unseen_row]  # the support's rows
                rows = torch.cat([rows, named - self.target_mean], dim=1)
            fast = Precision.parse(self.cfg.precision) is Precision.AUTO and native_bf16(embeddings.device)
            self._kept = kept = (embeddings, rows.to(torch.bfloat16 if fast else rows.dtype))
        return kept[1]

    def source(self, z: torch.Tensor, embeddings: torch.Tensor, offsets: torch.Tensor,
               clean_tokens: torch.Tensor | None = None, clean: torch.Tensor | None = None) -> torch.Tensor:
        """a = pi E + pi_mask m + p, and with a lookup carry beside it (a (B, L, 2d + 2) source)
        the same mixture of the lookup's rows, c = pi T + pi_mask mu_l (the mask slot, a token not
        known, gets the mean state: c is the state layer l would hold if context changed nothing),
        and the converter's doubt, (1 - max_v pi_v, pi_mask): 0 for a clean token, so the network
        can tell a clean row, whose carry is right up to context, from a noisy one that needs a
        large correction. (Added to stop the noisy rows' corrections spilling onto the clean ones;
        at SmolLM2's layer 3 it did not: docs/bridge-design.md.) Rows flagged `clean` (a (B,) bool mask, best on the host:
        which rows are clean is then decided without waiting for the device) use the one-hot
        mixture of their tokens.

        With a corpus support the posterior covers only the tokens the corpus contains: exactly
        the full-vocabulary converter whose prior (bias) is -inf on every other token, at a
        fraction of the cost (the B x L x V mixture is the bridge step's largest product). Where
        the device computes bf16 natively the product pi E takes bf16 inputs with float32
        accumulation (0.2% relative error in a, far below the channel's noise; 2x faster);
        training, validation and sampling compute it the same way."""
        table = self.table()
        if self.cfg.support_size:
            table = F.embedding(self.support, table)
        kept = self._kept_embeddings(embeddings)
        lookup = self.cfg.carry == "lookup"
        mask_row = torch.cat([self.mask_vector, torch.zeros_like(self.target_mean)]) if lookup else self.mask_vector

        def mixed(noisy_z):
            probs = self.converter(noisy_z, table)
            a = Converter.mix(probs, kept, mask_row)
            if not lookup:
                return a
            d = self.cfg.hidden_size
            return torch.cat([a[..., :d], a[..., d:] + self.target_mean, 1 - probs[..., :-1].amax(-1, keepdim=True),
                              probs[..., -1:]], dim=-1)

        clean = None if clean is None else clean.cpu()
        if clean is None or not clean.any():
            a = mixed(z)
        else:
            # a clean row's one-hot mixture is its token's row: index it, and spend the mixture
            # only on the noisy rows (a quarter of the batch is clean in training)
            a = embeddings[clean_tokens].to(table.dtype)
            if lookup:
                slots = self.lookup_slots(clean_tokens)
                a = torch.cat([a, self.lookup[slots], a.new_zeros(*a.shape[:-1], 2)], dim=-1)
            noisy = upload((~clean).nonzero(as_tuple=True)[0], z.device)
            if len(noisy):
                a = a.index_put((noisy,), mixed(z[noisy]))
        return a + F.pad(offsets, (0, self.source_width - self.cfg.hidden_size))

    def lookup_slots(self, tokens: torch.Tensor) -> torch.Tensor:
        """Each token's row in `lookup`: its support slot, or (a training support) the last row,
        the overall mean, for a token outside the support."""
        if not self.cfg.support_size:
            return tokens
        slots = torch.searchsorted(self.support, tokens)
        if not self.unseen_row:
            return slots
        slots = slots.clamp(max=self.cfg.support_size - 1)
        return torch.where(self.support[slots] == tokens, slots, self.cfg.support_size)

    def standardise_source(self, a):
        if self.cfg.carry == "lookup":
            d = self.cfg.hidden_size
            return torch.cat([(a[..., :d] - self.source_mean) / self.source_scale,
                              self.standardise_target(a[..., d:2 * d]), a[..., 2 * d:]], dim=-1)
        return (a - self.source_mean) / self.source_scale

    def carried(self, a_std: torch.Tensor) -> torch.Tensor:
        """The residual's base in the target's standardised coordinates: the lookup mixture, or
        the source carried channel by channel (or by one scalar scale, the oldest bridges)."""
        if self.cfg.carry == "lookup":
            return a_std[..., self.cfg.hidden_size:2 * self.cfg.hidden_size]
        if self.cfg.scale == "channel":
            return self.carry_gain * a_std
        return (a_std * self.source_scale + self.source_mean - self.target_mean) / self.target_scale

    def start(self, a_std: torch.Tensor) -> torch.Tensor:
        """Where the bridge's path starts (tau = 0): the lookup mixture, or the source itself."""
        return self.carried(a_std) if self.cfg.carry == "lookup" else a_std

    def standardise_target(self, h):
        return (h - self.target_mean) / self.target_scale

    def predict(self, y: torch.Tensor, tau: torch.Tensor, a: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """D(y_tau, tau, a~) -> h~ prediction, all standardised, tau per sequence (B,).

        Residual (the default): the prediction is the carry (`carried`) plus the network's
        output, as the residual stream adds the blocks' updates to what came before: a zero
        update (the output layer starts at zero) predicts the lookup, so training starts at the
        control and the update is what context adds. A causal bridge given a `cache` reads the
        positions after those the cache has read (their attention and convolution see those)."""
        cond = self.time_mlp(timestep_embedding(tau, self.cfg.d_model))
        x = self.with_left_context(self.inp(torch.cat([y, a], dim=-1)), cache)
        update = self.out(self.net(x, cond=cond, cache=cache))
        return self.carried(a) + update if self.cfg.residual else update

    def with_left_context(self, x: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """The network's input (B, L, d_model) through the causal convolution (left-padded:
        position i reads i - conv_window .. i, never a later one); unchanged without one. With a
        `cache`, the rows it keeps from the positions read before pad instead, and it keeps the last ones."""
        window = self.cfg.conv_window
        if not window:
            return x
        if cache is None:
            return self.conv(F.pad(x.transpose(1, 2), (window, 0))).transpose(1, 2)
        left = x.new_zeros(len(x), window, x.shape[-1]) if cache.left is None else cache.left
        x = torch.cat([left, x], dim=1)
        cache.left = x[:, -window:]
        return self.conv(x.transpose(1, 2)).transpose(1, 2)

    def loss(self, a: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, generator: torch.Generator | None = None,
             tau: torch.Tensor | None = None, eps: torch.Tensor | None = None,
             denominator: float | None = None) -> torch.Tensor:
        """Interpolant MSE; `weight` (B, L) selects positions >= 1 that are not padding. A
        data-parallel rank passes its rows of the global draws (tau, eps) and the global batch's
        weight / world size as `denominator`, so averaging the ranks' gradients is exact."""
        tau = torch.rand(len(a), generator=generator) if tau is None else tau
        if self.cfg.sigma_b > 0 and eps is None:  # a deterministic path (sigma_b = 0) draws no B x L x d noise
            eps = torch.randn(h.shape, generator=generator)
        err = self.position_errors(a, h, tau, eps)
        weight = self.scored(h, weight)
        return (err * weight).sum() / (weight.sum().clamp(min=1) if denominator is None else denominator)

    def position_errors(self, a: torch.Tensor, h: torch.Tensor, tau: torch.Tensor,
                        eps: torch.Tensor | None) -> torch.Tensor:
        """Each position's squared error of the endpoint prediction from y_tau, standardised and
        averaged over channels, (B, L).

        Args:
            a: the sources (B, L, source_width); h: the true states (B, L, d).
            tau: (B,) one path time per sequence.
            eps: (B, L, d) the bridge noise (needed when sigma_b > 0).
        """
        a_std, h_std = self.standardise_source(a), self.standardise_target(h)
        tau = upload(tau, a.device)
        t = tau[:, None, None]
        y = (1 - t) * self.start(a_std) + t * h_std
        if self.cfg.sigma_b > 0:
            y = y + self.cfg.sigma_b * (t * (1 - t)).sqrt() * upload(eps, a.device).to(a.dtype)
        return ((self.predict(y, tau, a_std) - h_std) ** 2).mean(-1)

    @torch.no_grad()
    def sample(self, a: torch.Tensor, steps: int | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
        """h^_l for sources a (B, L, source_width), in the backbone's coordinates."""
        a_std = self.standardise_source(a)
        y = bridge_path_sample(lambda y, tau: self.predict(y, tau, a_std), self.start(a_std),
                               steps or self.cfg.bridge_steps, self.cfg.sigma_b, generator)
        return y * self.target_scale + self.target_mean


class LayerStates(NamedTuple):
    """A batch's hidden states (B, L, d) float32, on the bridge's device: at layer 0 and at the
    bridge's layer (a tuple, so `source, target = teacher.states(ids)` reads them too)."""

    source: torch.Tensor  # layer 0: what the bridge starts from
    target: torch.Tensor  # layer l: what it reconstructs


class Teacher:
    """What the frozen backbone contributes: the embedding table, additive position offsets,
    the BOS state at layer l, and teacher states h_l from the prefix with early stop."""

    def __init__(self, backbone, layer: int):
        check_bridge_layer(layer, backbone.num_layers)
        self.backbone, self.layer = backbone, layer
        device = backbone.input_device
        with torch.no_grad():
            self.embeddings = backbone.model.get_input_embeddings()(torch.arange(backbone.config.vocab_size,
                                                                                 device=device)).float()
        self._offsets: dict[tuple[int, str], torch.Tensor] = {}

    @torch.no_grad()
    def offsets(self, length: int) -> torch.Tensor:
        """embed(x)_i - E[x_i]: the additive position embedding (zero for rotary models), (length, d).
        Computed once per (length, device) and kept: the backbone is frozen, and a sampler asks for
        the same length at every denoiser call. Callers read it and never write into it."""
        device = self.backbone.input_device
        key = (length, str(device))
        if key not in self._offsets:
            ids = torch.zeros(1, length, dtype=torch.long, device=device)
            self._offsets[key] = (self.backbone.embed(ids).float() - self.embeddings[ids])[0]
        return self._offsets[key]

    @torch.no_grad()
    def states(self, ids: torch.Tensor, mask: torch.Tensor | None = None) -> LayerStates:
        """The frozen prefix's states of `ids` at layer 0 (the bridge's source) and at its layer."""

        got = capture(self.backbone, ids, mask, layers=sorted({0, self.layer}))
        # with device_map="auto" layer l lives on the GPU of block l: bring both to the input device,
        # where the bridge, the embeddings and the offsets are
        device = self.backbone.input_device
        return LayerStates(got[0].float().to(device), got[self.layer].float().to(device))


# how `geoprobe sample --decode` turns a bridge's reconstruction into logits
DECODES = {
    "stack": "the frozen upper blocks and head, plus the channel's evidence <e_v, z_i> for each token",
    "stack-only": "the frozen upper blocks and head alone (z_i reaches position i only through the bridge's states)",
    "round": "the nearest token embedding (the layer-0 Diffusion-LM baseline)",
}


class HybridDenoiser(nn.Module):
    """A TokenDenoiser: z (B, L, d_tok) -> logits (B, L, V) through the bridge and the frozen
    upper stack. A BOS position is prepended and its state is the backbone's own.

    The causal upper stack predicts token i from the states of positions < i (the head at i - 1),
    so z_i, the token's own evidence, would reach its logits only through what a bidirectional
    bridge carries leftwards. With `evidence` (the default, `--decode stack`) the logits at i add
    the channel's exact log-likelihood <e_v, z_i> (`posterior_logits`, the DSL posterior's term,
    e the unit-norm token table): p(x_i = v | left, z_i) is proportional to
    p_stack(v | left) p(z_i | v). They cover the converter's vocabulary (with a corpus support
    the other tokens are at -inf: the bridge cannot read them back). Without it (`--decode
    stack-only`) the logits are the stack's alone. Right context still does not count as it
    should: the exact posterior also weighs how each v explains the tokens to its right,
    p(x_>i | v, x_<i), which a causal stack gives only by a pass per candidate.

    `left_to_right` decodes as the causal stack can: one token a step, from the bridge's
    reconstruction of the clean prefix (bridges/decode.py)."""

    def __init__(self, bridge: HiddenBridge, teacher: Teacher, bos_id: int, steps: int | None = None,
                 evidence: bool = True):
        super().__init__()
        self.bridge, self.teacher, self.bos_id = bridge, teacher, bos_id
        self.steps, self.evidence = steps, evidence
        self.noise = None  # the generator of the bridge's noise in `features` (`seed_noise`)
        ids = torch.tensor([[bos_id]], device=teacher.backbone.input_device)
        self.bos_state = teacher.states(ids).target[0, 0]

    def seed_noise(self, seed: int) -> None:
        """Draw the bridge's K-step noise in `features` from a generator seeded `seed` (the sampler
        gives one per batch: samplers/base.py `noise_seed`), so that a stochastic bridge's samples
        follow the draw's seed and not the process's global RNG. A deterministic bridge (σ_b = 0)
        draws no noise."""
        self.noise = torch.Generator().manual_seed(seed) if self.bridge.cfg.sigma_b > 0 else None

    @property
    def vocab_size(self) -> int:
        return self.bridge.cfg.vocab_size

    @property
    def s_max(self) -> float:
        return S_MAX

    def token_table(self) -> torch.Tensor:
        return self.bridge.table()

    def hidden(self, z: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """(B, L + 1, d): BOS state, then the bridge's reconstruction of h_l for each position."""
        b, length, _ = z.shape
        offsets = self.teacher.offsets(length + 1)
        # the bridge reads the BOS position as it did in training and validation (a clean token at
        # position 0: its attention and its input convolution see it), and its output there is replaced
        a_bos = self.clean_source(torch.full((b, 1), self.bos_id, dtype=torch.long, device=z.device), offsets[:1])
        a = torch.cat([a_bos, self.bridge.source(z, self.teacher.embeddings, offsets[1:])], dim=1)
        return self.with_bos(self.bridge.sample(a, self.steps, generator)[:, 1:])

    def clean_source(self, tokens: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """The bridge's source of clean tokens (B, n) at the positions of `offsets` (n, d)."""
        b, n = tokens.shape
        return self.bridge.source(self.teacher.embeddings.new_zeros(b, n, self.bridge.cfg.d_tok), self.teacher.embeddings,
                                  offsets, tokens, torch.ones(b, dtype=torch.bool))

    def with_bos(self, h: torch.Tensor) -> torch.Tensor:
        """(B, n + 1, d): the backbone's own BOS state, then `h` (B, n, d)."""
        return torch.cat([self.bos_state.expand(len(h), 1, -1).to(h.dtype), h], dim=1)

    def clean_hidden(self, tokens: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """(B, n + 1, d): BOS state, then the bridge's reconstruction of h_l from the clean tokens
        (B, n) that follow BOS (K sampler steps where the bridge is stochastic)."""
        bos = torch.full((len(tokens), 1), self.bos_id, dtype=torch.long, device=tokens.device)
        ids = torch.cat([bos, tokens], dim=1)
        a = self.clean_source(ids, self.teacher.offsets(ids.shape[1]))
        return self.with_bos(self.bridge.sample(a, self.steps, generator)[:, 1:])

    def readable(self, logits: torch.Tensor) -> torch.Tensor:
        """`logits` (..., V) with every token outside the converter's vocabulary at -inf (none
        where it is the whole vocabulary): the tokens the bridge can read back."""
        if not self.bridge.cfg.support_size:
            return logits
        kept = torch.full_like(logits, float("-inf"))
        kept[..., self.bridge.support] = logits[..., self.bridge.support]
        return kept

    @torch.no_grad()
    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.logits_of(self.features(z), z)

    @torch.no_grad()
    def features(self, z: torch.Tensor) -> torch.Tensor:
        """(B, L, d): what the head reads for each sample position, the upper stack's final-normed
        state one position to its left (the causal head at backbone position i predicts token
        i + 1, so sample position i is read at backbone position i). A sampler keeps these and
        runs `logits_of` only where it draws a token (samplers/base.py `CountingDenoiser`)."""
        return self.teacher.backbone.final_from(self.bridge.cfg.layer, self.hidden(z, self.noise))[:, :-1]

    @torch.no_grad()
    def logits_of(self, features: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """float32 logits (..., V) of the positions whose `features` (..., d) and z (..., d_tok) are
        given: the head in the backbone's dtype, then, in float32, the channel's evidence
        <e_v, z_i> and the converter's vocabulary (`--decode stack`), or nothing more (`stack-only`)."""
        logits = self.teacher.backbone.head(features).float()
        if not self.evidence:
            return logits
        return self.readable(posterior_logits(z.float(), self.token_table().float(), log_prior=logits))

    def left_to_right(self, num: int, length: int, generator: torch.Generator | None = None,
                      cached: bool | None = None):
        """A left-to-right decoding of `num` sequences of up to `length` tokens (`ltr`): each
        step's logits come from the upper stack over the bridge's states of BOS and the tokens
        appended so far. `cached` (None: where the bridge's attention is causal) keeps the
        prefix's bridge states and the upper stack's keys and values; otherwise every step
        reconstructs the whole prefix, as a bidirectional bridge must."""
        if cached is None:
            cached = self.bridge.cfg.attention == "causal"
        return (CachedDecoding if cached else RecomputedDecoding)(self, num, length, generator)


class RoundingDenoiser(HybridDenoiser):
    """The Diffusion-LM-style baseline in the same framework: a bridge at layer 0 whose
    reconstruction is decoded by rounding to the nearest token embedding instead of by the
    upper stack. Logits are -|h^ - E[v]|^2 / T (T = the mean squared distance between
    neighbouring embeddings would be a natural scale; T = 1 here in the backbone's units)."""

    def __init__(self, bridge: HiddenBridge, teacher: Teacher, bos_id: int, steps: int | None = None,
                 temperature: float = 1.0):
        if bridge.cfg.layer != 0:
            raise BadInput(f"--decode round is the layer-0 baseline; this bridge is at layer {bridge.cfg.layer}")
        super().__init__(bridge, teacher, bos_id, steps)
        self.temperature = temperature

    @torch.no_grad()
    def features(self, z: torch.Tensor) -> torch.Tensor:
        """(B, L, d): the reconstruction of each position without its position part, to be compared
        against the token table."""
        h = self.hidden(z, self.noise)[:, 1:]
        return h - self.teacher.offsets(h.shape[1] + 1)[1:]

    @torch.no_grad()
    def logits_of(self, features: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """-|h - E[v]|^2 / T of the positions whose `features` (..., d) are given."""
        e = self.teacher.embeddings
        distance = (features * features).sum(-1, keepdim=True) - 2 * features @ e.T + (e * e).sum(-1)
        return -distance / self.temperature

    def left_to_right(self, num: int, length: int, generator: torch.Generator | None = None,
                      cached: bool | None = None):
        raise BadInput("--sampler ltr decodes through the upper stack, which --decode round does without: "
                       "use --decode stack")


# the values of fields a bridge record written before the field existed had: no skip connection,
# a whole-vocabulary converter, one scalar scale, no regression share, the channel carry, no
# convolution, bidirectional attention
OLDER_BRIDGES = {"residual": False, "vocab": "all", "scale": "scalar", "regression_frac": 0.0, "carry": "channel",
                 "conv_window": 0, "attention": "bidirectional"}


def load_bridge(folder: Path, device="cpu") -> tuple[HiddenBridge, dict]:
    record = read_config(folder, "bridge")
    bridge = HiddenBridge(build_network(BridgeConfig, record, folder, older=OLDER_BRIDGES))
    load_weights(bridge, folder)
    return bridge.to(device).eval(), record


def load_bridge_denoiser(folder: Path, device: str = "auto", decode: str = "stack"):
    """(TokenDenoiser, tokenizer) of a bridge directory: the hybrid through the frozen upper stack
    of its backbone with the channel's evidence (decode "stack") or without it ("stack-only"),
    or the nearest-embedding rounding ("round", the layer-0 Diffusion-LM baseline): `DECODES`.
    The backbone must still be the one it was trained on."""

    if decode not in DECODES:
        raise BadInput(f"unknown --decode {decode!r} (use {', '.join(DECODES)})")
    bridge, record = load_bridge(folder)
    # the backbone where the record's spec still points, else by its config hash (a moved folder)
    spec = locate_backbone(record["identity"]["model"], record["identity"]["model_config_sha256"], str(folder))
    backbone = load_backbone(spec, device=device)
    if backbone.identity["config_sha256"] != record["identity"]["model_config_sha256"]:
        raise BadInput(f"{folder} was trained on another backbone than {record['identity']['model']} is now")
    bridge.to(backbone.input_device)
    teacher = Teacher(backbone, bridge.cfg.layer)
    bos = start_token(backbone.tokenizer, backbone.config)  # Qwen3: its config's <|endoftext|>, not id 0
    bos = bos if bos is not None else 0
    if decode == "round":
        return RoundingDenoiser(bridge, teacher, bos), backbone.tokenizer
    return HybridDenoiser(bridge, teacher, bos, evidence=decode == "stack"), backbone.tokenizer


def bridge_generator_backbone(config: dict) -> str | None:
    """The causal LM a bridge's text passes through: its backbone's upper stack."""
    return config.get("identity", {}).get("model")


def bridge_oracle_start(config: dict, document_length: int) -> str:
    """Where the testbed's HMM starts a bridge's samples: at its per-document blocks (BOS, then
    seq_len - 1 tokens of one document)."""
    seq_len = (config.get("budget") or {}).get("seq_len")
    return f"blocks:{seq_len - 1}" if seq_len else "anywhere"
