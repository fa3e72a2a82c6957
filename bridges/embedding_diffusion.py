"""The embedding-diffusion baselines of the DiHAL comparison: Diffusion-LM, SED and CoDAR.

All three run Gaussian diffusion over token embeddings, x_t = sqrt(abar_t) x0 + sqrt(1 - abar_t)
eps, with a network that predicts x0 from x_t and t; they differ in where the embeddings come
from, the schedule, what else the loss holds and how an estimate becomes tokens. Those
differences are the rows of `PRESETS`, each with its source; one model class, one loss and one
fit serve the three kinds (bridges/kinds.py lists them), so that the comparison varies only
what the papers vary. docs/method.md ("The embedding-diffusion baselines") lists what each
paper states and what we chose where it does not.

* Diffusion-LM (Li et al. 2022; XiangLi1999/Diffusion-LM, improved-diffusion's
  `training_losses_e2e`): learned embeddings (N(0, 1) initialised, trained by every term),
  the sqrt schedule over T = 2000, x_start = emb + sqrt(1 - abar_0) eps0, the loss
  mse(x_start, x0_hat) (against the clean embedding at t = 0) + |sqrt(abar_T) x_start|^2 +
  CE(lm_head(x_start), w) with the head tied to the embedding (and a bias of its own);
  sampling clamps each x0 estimate to its nearest embedding and rounds by the head's argmax.
* SED (Strudel et al. 2022): frozen embeddings of norm sqrt(D) (the paper's come from a BERT
  trained apart; ours are random directions, which is what can be had offline), the cosine
  schedule over T = 1000, sigma0 = 0.01, the L2 loss on x0 plus a reconstruction CE through a
  readout R initialised to E^T (only R learns from it), and self-conditioning: the network
  also reads its own previous estimate (concatenated to x_t); both passes' losses count.
* CoDAR (Shen et al. 2026): diffusion over frozen embeddings as SED's, without
  self-conditioning, decoded by a small autoregressive transformer that cross-attends to the
  denoised sequence ("contextual rounding"). Its decoder learns from the denoiser's own
  estimates (detached: the diffusion trains as it would alone), at the step's noise level.

Every model here is one bidirectional transformer of `geoprobe.bridges.nn` with adaLN time
conditioning (the comparison holds the network fixed across rows: docs/baselines.md). It
implements the `EmbeddingDenoiser` protocol of `geoprobe.samplers.ancestral`.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from geoprobe.bridges.checkpoint import CONFIG, build_network, load_weights, read_config, save_config
from geoprobe.bridges.dsl import (budget, dsl_oracle_start, dsl_tokenizer, reported_rows, sequences, split_documents,
    stopping_rows, with_loop_defaults)
from geoprobe.bridges.nn import Transformer, TransformerConfig, apply_rotary, rotary_tables, timestep_embedding
from geoprobe.bridges.train import TrainConfig, fit_model, with_loop_flags
from geoprobe.backbone import resolve_device
from geoprobe.device import choose_determinism, upload
from geoprobe.distributed import SINGLE, World
from geoprobe.errors import BadInput
from geoprobe.files import clear, holding, is_empty
from geoprobe.samplers.ancestral import nearest_embedding
from geoprobe.samplers.base import gumbel_sample, nucleus
from geoprobe.settings import split_flags
from geoprobe.tokens import load_saved_tokenizer, save_tokenizer, token_stream
from geoprobe.tracking import check_log_to, tracking

SCHEDULES = ("sqrt", "cosine")
EMBEDDINGS = ("learned", "sphere")  # trained with the model; frozen random directions of norm sqrt(d_emb)
ROUNDINGS = ("tied", "readout", "decoder")

# What each paper fixes (see the module docstring; the values the papers leave open are ours,
# stated in docs/method.md). The network's size is the comparison's, not a paper's.
PRESETS: dict[str, dict] = {
    "diffusion-lm": dict(d_emb=16, schedule="sqrt", diffusion_steps=2000, embedding="learned", sigma0=None,
                         self_condition=False, clamp=True, rounding="tied", prior_loss=True, clean_target_at_0=True,
                         decoder_layers=0),
    "sed": dict(d_emb=32, schedule="cosine", diffusion_steps=1000, beta_min=2e-3, embedding="sphere", sigma0=0.01,
                self_condition=True, clamp=False, rounding="readout", prior_loss=False, clean_target_at_0=False,
                decoder_layers=0),
    "codar": dict(d_emb=32, schedule="cosine", diffusion_steps=1000, beta_min=2e-3, embedding="sphere",
                  sigma0=0.01,
                  self_condition=False, clamp=False, rounding="decoder", prior_loss=False, clean_target_at_0=False,
                  decoder_layers=1),
}
TITLES = {"diffusion-lm": "a Diffusion-LM model", "sed": "a SED model", "codar": "a CoDAR model"}


@dataclass
class EmbeddingDiffusionConfig:
    vocab_size: int
    d_emb: int
    schedule: str
    diffusion_steps: int
    embedding: str
    sigma0: float | None  # x0 ~ N(emb, sigma0^2); None: sqrt(1 - abar_0), Diffusion-LM's get_x_start
    self_condition: bool
    clamp: bool
    rounding: str
    prior_loss: bool
    clean_target_at_0: bool
    decoder_layers: int
    beta_min: float = 0.0  # SED's beta_1 = 2e-3: the cosine's betas clipped below (its own first is 4e-5)
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4

    def validate(self) -> None:
        if self.schedule not in SCHEDULES:
            raise BadInput(f"unknown schedule {self.schedule!r} (use {', '.join(SCHEDULES)})")
        if self.embedding not in EMBEDDINGS or self.rounding not in ROUNDINGS:
            raise BadInput(f"unknown embedding {self.embedding!r} or rounding {self.rounding!r}")
        if (self.rounding == "decoder") != (self.decoder_layers > 0):
            raise BadInput("a decoder's rounding needs decoder layers, and only it uses them")
        if self.d_emb < 2 or self.diffusion_steps < 2:
            raise BadInput(f"--d-emb must be at least 2 and the schedule 2 steps long, got {self.d_emb}, "
                           f"{self.diffusion_steps}")
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise BadInput(f"--d-model {self.d_model} must split into --n-heads {self.n_heads} even head sizes")


def preset(kind: str, **shape) -> EmbeddingDiffusionConfig:
    """The config of `kind` (a key of PRESETS) with the network's shape; one line for another kind."""
    if kind not in PRESETS:
        raise BadInput(f"unknown baseline {kind!r} (use {', '.join(PRESETS)})")
    cfg = EmbeddingDiffusionConfig(**{"vocab_size": 0, **PRESETS[kind], **shape})
    cfg.validate()
    return cfg


def schedule_function(name: str):
    """abar(t) for t in [0, 1]: Diffusion-LM's sqrt (1 - sqrt(t + 1e-4)), or the cosine of
    Nichol & Dhariwal (s = 0.008), which SED uses."""
    if name == "sqrt":
        return lambda t: 1 - math.sqrt(t + 1e-4)
    return lambda t: math.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2


def alphas_cumprod(name: str, steps: int, beta_min: float = 0.0) -> torch.Tensor:
    """(T,) float64 abar_i = prod_{j <= i} (1 - beta_j), beta_j = min(1 - f((j+1)/T) / f(j/T),
    0.999): improved-diffusion's `betas_for_alpha_bar`, which Diffusion-LM's code discretises
    with (the product telescopes to f((i+1)/T) / f(0) wherever no beta is clipped); `beta_min`
    clips the betas below (SED states beta_1 = 2e-3 for its cosine, not how it gets there)."""
    f = schedule_function(name)
    betas = torch.tensor([min(max(1 - f((i + 1) / steps) / f(i / steps), beta_min), 0.999) for i in range(steps)],
                         dtype=torch.float64)
    return torch.cumprod(1 - betas, 0)


class CrossAttention(nn.Module):
    """Each decoder position attends to the denoised sequence, both sides rotated by their
    positions (so position i finds embedding i by their distance, as contextual rounding needs)."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.norm = nn.LayerNorm(d_model)
        self.q = nn.Linear(d_model, d_model, bias=False)
        self.kv = nn.Linear(d_model, 2 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x, memory, cos, sin):
        b, length, d = x.shape
        heads = lambda t: t.view(b, -1, self.n_heads, d // self.n_heads).transpose(1, 2)  # noqa: E731
        q = apply_rotary(heads(self.q(self.norm(x))), cos[:length], sin[:length])
        k, v = self.kv(memory).chunk(2, dim=-1)
        k = apply_rotary(heads(k), cos[:memory.shape[1]], sin[:memory.shape[1]])
        attended = F.scaled_dot_product_attention(q, k, heads(v))
        return x + self.proj(attended.transpose(1, 2).reshape(b, length, d))


class Decoder(nn.Module):
    """CoDAR's contextual rounding: a causal transformer over the tokens so far (after a BOS
    slot) that cross-attends to the denoised embedding sequence; output i scores token i."""

    def __init__(self, vocab_size: int, d_emb: int, d_model: int, n_layers: int, n_heads: int):
        super().__init__()
        cfg = TransformerConfig(d_model, n_layers, n_heads)
        self.inputs = nn.Embedding(vocab_size + 1, d_model)  # the last id is BOS
        self.memory = nn.Sequential(nn.Linear(d_emb, d_model), nn.LayerNorm(d_model))
        self.causal = Transformer(cfg)
        self.cross = nn.ModuleList(CrossAttention(d_model, n_heads) for _ in range(n_layers))
        self.head = nn.Linear(d_model, vocab_size)
        self.bos = vocab_size

    def forward(self, x0: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """(B, L, d_emb) estimates and (B, k) tokens so far -> (B, k + 1, V): the next token's logits
        at every position up to k (teacher forcing with k = L - 1 scores all L)."""
        bos = torch.full((len(tokens), 1), self.bos, dtype=tokens.dtype, device=tokens.device)
        x = self.inputs(torch.cat([bos, tokens], 1))
        memory = self.memory(x0.to(x.dtype))
        length = max(x.shape[1], memory.shape[1])
        cos, sin = rotary_tables(length, self.causal.cfg.d_model // self.causal.cfg.n_heads,
                                 self.causal.cfg.rope_base, x.device, x.dtype)
        causal = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool, device=x.device).tril()
        for block, cross in zip(self.causal.blocks, self.cross):
            x = cross(x, memory, cos, sin)
            x = block(x, cos[:x.shape[1]], sin[:x.shape[1]], attn_mask=causal)
        return self.head(self.causal.norm(x))


class EmbeddingDiffusion(nn.Module):
    """x0-predicting denoiser over token embeddings, with its rounding (tied head, readout, or
    CoDAR's decoder). Implements `geoprobe.samplers.ancestral.EmbeddingDenoiser`."""

    def __init__(self, cfg: EmbeddingDiffusionConfig, seed: int = 0):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        with torch.random.fork_rng(devices=[]):  # the initial weights depend on `seed` alone
            torch.manual_seed(seed)
            self.embedding = nn.Embedding(cfg.vocab_size, cfg.d_emb)  # N(0, 1), Diffusion-LM's
            if cfg.embedding == "sphere":
                with torch.no_grad():
                    self.embedding.weight.copy_(F.normalize(self.embedding.weight, dim=-1) * cfg.d_emb ** 0.5)
                self.embedding.weight.requires_grad_(False)
            self.head_bias = None  # Diffusion-LM's tied head keeps nn.Linear's bias, and its initialisation
            if cfg.rounding == "tied":
                bound = cfg.d_emb ** -0.5
                self.head_bias = nn.Parameter(torch.empty(cfg.vocab_size).uniform_(-bound, bound))
            self.readout = None
            if cfg.rounding == "readout":  # SED's R: a V x D matrix (no bias) that starts as E^T
                self.readout = nn.Linear(cfg.d_emb, cfg.vocab_size, bias=False)
                with torch.no_grad():
                    self.readout.weight.copy_(self.embedding.weight)
            inputs = cfg.d_emb * (2 if cfg.self_condition else 1)
            self.in_proj = nn.Linear(inputs, cfg.d_model)
            self.time = nn.Sequential(nn.Linear(cfg.d_model, cfg.d_model), nn.SiLU(),
                                      nn.Linear(cfg.d_model, cfg.d_model))
            self.transformer = Transformer(TransformerConfig(cfg.d_model, cfg.n_layers, cfg.n_heads,
                                                             cond_dim=cfg.d_model))
            self.out_proj = nn.Linear(cfg.d_model, cfg.d_emb)
            self.decoder = (Decoder(cfg.vocab_size, cfg.d_emb, cfg.d_model, cfg.decoder_layers, cfg.n_heads)
                            if cfg.decoder_layers else None)
        self.register_buffer("abar", alphas_cumprod(cfg.schedule, cfg.diffusion_steps, cfg.beta_min),
                             persistent=False)

    # --- the EmbeddingDenoiser protocol ---
    @property
    def vocab_size(self) -> int:
        return self.cfg.vocab_size

    @property
    def self_condition(self) -> bool:
        return self.cfg.self_condition

    @property
    def clamp(self) -> bool:
        return self.cfg.clamp

    def alphas_cumprod(self) -> torch.Tensor:
        return self.abar

    def token_table(self) -> torch.Tensor:
        return self.embedding.weight

    def predict_x0(self, x_t: torch.Tensor, t: torch.Tensor, previous: torch.Tensor | None = None) -> torch.Tensor:
        """x0 estimates (B, L, d_emb) from x_t at integer timesteps t (B,); `previous` is the
        self-conditioning input (zeros: none), read only by a self-conditioned model."""
        if self.cfg.self_condition:
            x_t = torch.cat([x_t, torch.zeros_like(x_t) if previous is None else previous.to(x_t.dtype)], -1)
        # t * 1000 / T as the network sees it: improved-diffusion's rescale_timesteps
        features = timestep_embedding(t.float() / self.cfg.diffusion_steps, self.cfg.d_model)
        cond = self.time(features.to(self.in_proj.weight.dtype))
        return self.out_proj(self.transformer(self.in_proj(x_t), cond))

    def logits(self, x0: torch.Tensor) -> torch.Tensor:
        """Rounding's per-position logits: the tied head (E x + b) or the readout R x."""
        if self.readout is not None:
            return self.readout(x0)
        return x0 @ self.embedding.weight.T + self.head_bias

    def decode(self, x0: torch.Tensor, generator: torch.Generator, top_p: float = 1.0,
               top_p_rule: str = "hf") -> torch.Tensor:
        """Token ids (B, L) of the final estimate: rounding's argmax, or CoDAR's decoder sampled
        left to right (nucleus-filtered)."""
        if self.decoder is None:
            return self.logits(x0).argmax(-1)
        tokens = torch.empty(len(x0), 0, dtype=torch.long, device=x0.device)
        for _ in range(x0.shape[1]):
            logits = self.decoder(x0, tokens)[:, -1].float()
            tokens = torch.cat([tokens, gumbel_sample(nucleus(logits, top_p, top_p_rule), generator)[:, None]], 1)
        return tokens

    # --- training ---
    def draw(self, tokens: torch.Tensor, generator: torch.Generator) -> dict:
        """A step's random numbers for `tokens` (B, L), drawn on the CPU: the timesteps and the two noises."""
        batch, length = tokens.shape
        shape = (batch, length, self.cfg.d_emb)
        return {"t": torch.randint(0, self.cfg.diffusion_steps, (batch,), generator=generator),
                "eps0": torch.randn(shape, generator=generator), "eps": torch.randn(shape, generator=generator)}

    def losses(self, tokens: torch.Tensor, draws: dict) -> dict:
        """Each term of the kind's loss, a mean over the batch's tokens (B, L): `diffusion` (the
        per-element squared error of x0, averaged over both passes when self-conditioned), `prior`
        (Diffusion-LM's |sqrt(abar_T) x_start|^2), `rounding` (the tied head's or the readout's CE
        on x_start, or the decoder's CE on the denoiser's estimate); `loss` is their sum."""
        cfg = self.cfg
        t, eps0, eps = (upload(draws[k], tokens.device) for k in ("t", "eps0", "eps"))
        e = self.embedding(tokens)
        abar = self.abar.to(e.dtype)
        sigma0 = cfg.sigma0 if cfg.sigma0 is not None else float((1 - abar[0]).sqrt())
        x_start = e + sigma0 * eps0
        scale = abar[t].sqrt()[:, None, None]
        x_t = scale * x_start + (1 - abar[t]).sqrt()[:, None, None] * eps
        target = torch.where((t == 0)[:, None, None], e, x_start) if cfg.clean_target_at_0 else x_start
        estimate = self.predict_x0(x_t, t)
        diffusion = ((estimate.float() - target) ** 2).mean()
        if cfg.self_condition:  # SED: the second pass reads the first's estimate, stopped
            second = self.predict_x0(x_t, t, estimate.detach())
            diffusion = (diffusion + ((second.float() - target) ** 2).mean()) / 2
            estimate = second
        parts = {"diffusion": diffusion}
        if cfg.prior_loss:
            parts["prior"] = ((abar[-1].sqrt() * x_start) ** 2).mean()
        if cfg.rounding == "decoder":
            logits = self.decoder(estimate.detach(), tokens[:, :-1])
        else:  # Diffusion-LM's head trains the embedding too; SED's readout learns alone (E is frozen)
            logits = self.logits(x_start if cfg.rounding == "tied" else x_start.detach())
        parts["rounding"] = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tokens.reshape(-1))
        parts["loss"] = sum(parts.values())
        return parts


@torch.no_grad()
def held_out_losses(model: EmbeddingDiffusion, rows: torch.Tensor, seed: int = 0, batch: int = 64) -> dict:
    """The kind's loss terms on held-out rows at fixed draws (a seeded CPU generator): what the
    plateau rule watches, and what metrics.json reports."""
    generator = torch.Generator().manual_seed(seed)
    totals: dict[str, float] = {}
    for i in range(0, len(rows), batch):
        part = rows[i:i + batch]
        for k, v in model.losses(part, model.draw(part, generator)).items():
            totals[k] = totals.get(k, 0.0) + float(v) * len(part)
    return {k: v / len(rows) for k, v in totals.items()}


# --- a training run in a checkpoint directory (what `geoprobe baseline train` calls) ----------

@dataclass
class BaselineTrainSettings:
    seq_len: int = 128
    train: TrainConfig = field(default_factory=TrainConfig)

    def validate(self) -> None:
        if self.seq_len < 2:
            raise BadInput(f"--seq-len must be at least 2, got {self.seq_len}")
        self.train.validate()


def baseline_settings(kind: str, **flags) -> tuple[BaselineTrainSettings, EmbeddingDiffusionConfig]:
    """(training settings, the kind's config) from flags by name (TrainConfig's, the settings'
    and the network's shape, and `until`: bridges/train.py `with_loop_flags`); the rest keep
    their defaults and the kind's preset."""
    train, run, shape = split_flags(with_loop_flags(flags), TrainConfig, BaselineTrainSettings,
                                    EmbeddingDiffusionConfig)
    return BaselineTrainSettings(**run, train=TrainConfig(**train)), preset(kind, **shape)


def fit_baseline(out: Path, kind: str, corpus: str, *, tokenizer: str | None, settings: BaselineTrainSettings,
                 shape: EmbeddingDiffusionConfig, force: bool = False, device: str = "auto", progress=None,
                 world: World = SINGLE, log_to: str = "none", deterministic: bool = False) -> dict | None:
    """Train (or resume) a `kind` baseline in `out` on `corpus`; score the kept weights' loss terms
    on held-out rows (metrics.json). The plateau rule, when `settings.train.eval_every` > 0,
    watches the same loss on other held-out rows at fixed draws. A directory holding another run,
    and every bad setting, is refused in one line before anything loads. `log_to`:
    geoprobe.tracking's destination; `deterministic`: deterministic CUDA kernels (geoprobe.device)."""
    if kind not in PRESETS:
        raise BadInput(f"unknown baseline {kind!r} (use {', '.join(PRESETS)})")
    settings.validate()
    shape.validate()
    check_log_to(log_to)
    choose_determinism(deterministic)
    target = resolve_device(world.device(device))
    tokenizer = tokenizer or "train:4096"
    out = Path(out)
    train_docs, val_docs = split_documents(corpus, settings.train.seed)
    identity = {"corpus": corpus, "tokenizer_spec": tokenizer}
    with holding(out, "geoprobe baseline train", world.rank):
        try:
            if force and world.is_main:
                clear(out)
            world.barrier()
            if (out / CONFIG).is_file():
                old = read_config(out, kind)  # another kind's directory is refused by name
                if old.get("identity") != identity or \
                        with_loop_defaults(old.get("training")) != json.loads(json.dumps(asdict(settings))):
                    raise BadInput(f"{out} holds another training run; use another --out or --force")
                tok = load_saved_tokenizer(out)
                cfg = build_network(EmbeddingDiffusionConfig, old, out)
            else:
                if not is_empty(out):
                    raise BadInput(f"output directory {out} is not empty and holds no checkpoint; use another --out")
                tok = dsl_tokenizer(tokenizer, train_docs)
                cfg = replace(shape, vocab_size=len(tok))
                world.barrier()
                if world.is_main:
                    out.mkdir(parents=True, exist_ok=True)
                    save_tokenizer(tok, out)
                    save_config(out, kind, cfg, asdict(settings), budget(settings), identity)
            model = EmbeddingDiffusion(cfg, seed=settings.train.seed).to(target)
            data = sequences(token_stream(train_docs, tok), settings.seq_len).to(target)
            watched, disjoint = stopping_rows(val_docs, tok, settings.seq_len)
            reported = reported_rows(val_docs, tok, settings.seq_len).to(target)

            def loss_fn(m, generator, shard):  # the global batch's draws, then this rank's rows
                rows = torch.randint(0, len(data), (settings.train.batch_size,), generator=generator)
                tokens = data[upload(rows, target)]
                draws = m.draw(tokens, generator)
                return m.losses(shard.rows(tokens), {k: shard.rows(v) for k, v in draws.items()})["loss"]

            watch = None
            if settings.train.eval_every > 0:
                stop_rows = watched.to(target)
                watch = lambda m: held_out_losses(m, stop_rows)["loss"]  # noqa: E731

            def score(m, _trained) -> dict:
                held_out = held_out_losses(m, reported)
                return {"val_sequences": len(reported), **{f"val_{k}": v for k, v in held_out.items()},
                        **({"stop_rows_disjoint": disjoint} if watch is not None else {})}

            with tracking(log_to, settings.train.batch_size * settings.seq_len):
                return fit_model(model, loss_fn, settings.train, out=out, device=target, score=score,
                                 title=TITLES[kind], progress=progress, world=world, watch=watch)
        finally:
            if progress is not None:
                progress.stop()


def load_baseline(folder: Path, device: torch.device | str = "cpu") -> EmbeddingDiffusion:
    """The kept weights of a trained baseline directory, ready to sample."""
    record = read_config(folder)
    model = EmbeddingDiffusion(build_network(EmbeddingDiffusionConfig, record, folder))
    load_weights(model, folder)
    return model.to(device).eval()


def load_baseline_denoiser(folder: Path, device: str = "auto", decode: str = "stack"):
    """(EmbeddingDenoiser, tokenizer) of a baseline directory: it decodes its own way (rounding or
    its decoder), whatever `decode` says."""
    return load_baseline(folder, resolve_device(device)), load_saved_tokenizer(folder)


def no_backbone(config: dict) -> None:
    """A baseline's text passes through no pretrained model."""
    return None


baseline_oracle_start = dsl_oracle_start  # rows cut as a DSL model's are: the same rule
