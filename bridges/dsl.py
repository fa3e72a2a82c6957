"""The DSL denoiser: z -> converter -> bidirectional transformer -> logits over V.

One network for every SNR (there is no time input: with unit-norm token embeddings the Bayes
posterior does not depend on s), trained with cross-entropy on all positions against the clean
tokens under a mixture of SNR distributions (`bridges.channel`). It implements the
`TokenDenoiser` protocol of `samplers.base`.

A checkpoint directory holds `config.json` (kind "dsl", model and training settings),
`model.safetensors` (EMA weights), `checkpoint.safetensors` (resumable state) and the
tokenizer files.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bridges.channel import S_MAX, TokenTable, channel, draw_snr
from bridges.converter import Converter
from bridges.nn import Transformer, TransformerConfig
from bridges.train import WEIGHTS, TrainConfig, Trained, train
from geoprobe.distributed import SINGLE, World
from geoprobe.errors import BadInput
from geoprobe.rundir import CONFIG, build, load_weights, read_config, write_config



@dataclass
class DSLConfig:
    vocab_size: int
    d_tok: int = 64
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    norm_input: bool = False  # feed log(1 + |z|) per token as an extra input
    learn_table: bool = True
    s_max: float = S_MAX


class DSLModel(nn.Module):
    def __init__(self, cfg: DSLConfig, table_init: torch.Tensor | None = None, seed: int = 0):
        super().__init__()
        self.cfg = cfg
        with torch.random.fork_rng(devices=[]):  # the initial weights depend on `seed` alone
            torch.manual_seed(seed)
            self.table = TokenTable(cfg.vocab_size, cfg.d_tok, learn=cfg.learn_table, init=table_init)
            self.converter = Converter(cfg.vocab_size)
            self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
            self.mask_vector = nn.Parameter(torch.zeros(cfg.d_model))
            self.norm_proj = nn.Linear(1, cfg.d_model) if cfg.norm_input else None
            self.transformer = Transformer(TransformerConfig(cfg.d_model, cfg.n_layers, cfg.n_heads))
            self.head = nn.Linear(cfg.d_model, cfg.vocab_size)

    # --- the TokenDenoiser protocol ---
    @property
    def vocab_size(self) -> int:
        return self.cfg.vocab_size

    @property
    def s_max(self) -> float:
        return self.cfg.s_max

    def token_table(self) -> torch.Tensor:
        return self.table()

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        probs = self.converter(z, self.table())
        x = Converter.mix(probs, self.embed.weight, self.mask_vector)
        if self.norm_proj is not None:
            x = x + self.norm_proj(torch.log1p(z.norm(dim=-1, keepdim=True)))
        return self.head(self.transformer(x))

    def loss(self, tokens: torch.Tensor, snr: torch.Tensor, generator: torch.Generator | None = None,
             noise: torch.Tensor | None = None) -> torch.Tensor:
        z = channel(self.table(), tokens, snr.to(tokens.device), generator=generator, noise=noise)
        logits = self(z)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), tokens.reshape(-1))


@dataclass
class DSLTrainSettings:
    snr: str = "mixed"
    roar_frac: float = 0.1
    seq_len: int = 128
    train: TrainConfig = field(default_factory=TrainConfig)

    def validate(self) -> None:
        if not 0 <= self.roar_frac <= 1:  # also refuses NaN
            raise BadInput(f"--roar-frac must be in [0, 1], got {self.roar_frac}")
        self.train.validate()


def sequences(ids: list[int], seq_len: int) -> torch.Tensor:
    """The id stream cut into (n, seq_len) rows (the tail that does not fill a row is dropped)."""
    n = len(ids) // seq_len
    if n == 0:
        raise BadInput(f"the corpus has {len(ids)} tokens, fewer than one sequence of --seq-len {seq_len}")
    return torch.tensor(np.asarray(ids[: n * seq_len], dtype=np.int64)).view(n, seq_len)


def train_dsl(model: DSLModel, data: torch.Tensor, settings: DSLTrainSettings, out: Path, device: torch.device,
              progress=None, world: World = SINGLE) -> Trained:
    """Train on rows of `data` (n, L); each step draws its batch and SNRs from its own seed.
    Writes `config.json` first when the directory has none, so the result always loads."""
    if not (Path(out) / CONFIG).is_file() and world.is_main:
        Path(out).mkdir(parents=True, exist_ok=True)
        save_config(out, model.cfg, settings, {})
    model.to(device)
    data = data.to(device)

    def loss_fn(m, generator, shard):
        # the global batch's draws, then this rank's rows: any world size trains on the same numbers
        size, length = settings.train.batch_size, data.shape[1]
        rows = shard.rows(torch.randint(0, len(data), (size,), generator=generator))
        snr = shard.rows(draw_snr(settings.snr, (size, length), generator=generator, roar_frac=settings.roar_frac))
        noise = shard.rows(torch.randn((size, length, m.cfg.d_tok), generator=generator))
        return m.loss(data[rows.to(device)], snr, noise=noise)

    return train(model, loss_fn, settings.train, out, device, progress=progress, world=world)


def save_config(out: Path, cfg: DSLConfig, settings: DSLTrainSettings, extra: dict) -> None:
    record = {"kind": "dsl", "model": asdict(cfg), "training": {**asdict(settings)}, **extra}
    write_config(out, record)


def load_dsl(folder: Path, device: torch.device | str = "cpu") -> DSLModel:
    """The EMA weights of a trained DSL checkpoint directory, ready to sample."""
    record = read_config(folder)
    if record.get("kind") != "dsl":
        raise BadInput(f"{folder} holds a {record.get('kind')!r} checkpoint, not a DSL model")
    model = DSLModel(build(DSLConfig, record.get("model", {}), Path(folder) / CONFIG))
    load_weights(model, Path(folder) / WEIGHTS)
    return model.to(device).eval()
