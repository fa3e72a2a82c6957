"""The DSL denoiser: z -> converter -> bidirectional transformer -> logits over V.

From scratch the transformer is `geoprobe.bridges.nn`'s; initialised from a pretrained causal LM
(`DSLConfig.backbone`, `geoprobe dsl train --init-from MODEL`) it is that model's own blocks run
with bidirectional attention, the converter's output matrix starts as its input embedding (the
mask slot is learned), the head as its LM head, and a clean BOS position is prepended so that
position i's output scores token i as the causal head's next-token prediction did.

One network for every SNR (there is no time input: with unit-norm token embeddings the Bayes
posterior does not depend on s), trained with cross-entropy on all positions against the clean
tokens under a mixture of SNR distributions (`geoprobe.bridges.channel`). It implements the
`TokenDenoiser` protocol of `geoprobe.samplers.base`.

The MDLM baseline is the same network under `--snr endpoint` (s = 0 masked, s_max revealed),
trained on MDLM's own objective (`--mdlm-objective mdlm`, the default): t drawn antithetically
in [1e-3, 1], each token masked with the log-linear schedule's probability (1 - 1e-3) t, and
the cross-entropy of the masked tokens only, weighted by dσ/expm1(σ) = 1/t, summed and divided
by every position. That is MDLM's SUBS parameterisation in continuous time: its logits never
put mass on the mask (here the output has no mask class), and a revealed token is carried
over, so it adds no loss. `--mdlm-objective legacy` keeps geoprobe's earlier endpoint objective
(t ~ U(0, 1) per row, unweighted cross-entropy over all positions, revealed ones included);
records written before the flag existed read as legacy.

A checkpoint directory holds `config.json` (kind "dsl", model and training settings),
`model.safetensors` (EMA weights), `checkpoint.safetensors` (resumable state) and the
tokenizer files.
"""

from __future__ import annotations

import json
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from geoprobe.bridges.channel import SNR_SCHEMES, S_MAX, TokenTable, channel, draw_snr
from geoprobe.bridges.checkpoint import CONFIG, build_network, load_weights, read_config, save_config
from geoprobe.bridges.converter import Converter
from geoprobe.bridges.likelihood import mdlm_elbo
from geoprobe.bridges.nn import Transformer, TransformerConfig
from geoprobe.bridges.parallel import SHARDED_CHECKPOINT, Execution
from geoprobe.bridges.train import CHECKPOINT, TrainConfig, Trained, fit_model, train, with_loop_flags
from geoprobe.backbone import (find_blocks, load_backbone, load_config, load_tokenizer, resolve_device,
    resolve_source)
from geoprobe.corpus import split_documents
from geoprobe.device import Precision, choose_determinism, upload
from geoprobe.distributed import SINGLE, World
from geoprobe.errors import BadInput
from geoprobe.files import clear, holding, human, is_empty
from geoprobe.memory import (DSL_BYTES_PER_PARAMETER, dsl_training_bytes, fewest_ranks, memory_available,
    parameter_count)
from geoprobe.settings import split_flags
from geoprobe.tracking import check_log_to, tracking
from geoprobe.tokens import (char_tokenizer, load_saved_tokenizer, save_tokenizer, start_token, token_stream,
    train_bpe, untrained_ids, word_tokenizer)


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
    backbone: dict | None = None  # a pretrained causal LM's config: its blocks are the denoiser
    bos_id: int = 0  # the clean first position prepended for a pretrained backbone
    # the ids the tokenizer produces, where fewer than vocab_size (a checkpoint's padding rows): the
    # logits of the others are the dtype's minimum, so no sampler draws them; None: every id
    tokenizer_size: int | None = None


class DSLModel(nn.Module):
    def __init__(self, cfg: DSLConfig, table_init: torch.Tensor | None = None, seed: int = 0,
                 dtype: torch.dtype = torch.float32, lm_weights_follow: bool = False):
        """`lm_weights_follow`: a pretrained LM's weights are loaded next (pretrained_dsl,
        load_dsl, a resumed run), so their random initialisation is skipped (about 20 s per
        billion parameters on two cores)."""
        super().__init__()
        self.cfg = cfg
        with torch.random.fork_rng(devices=[]):  # the initial weights depend on `seed` alone
            torch.manual_seed(seed)
            self.table = TokenTable(cfg.vocab_size, cfg.d_tok, learn=cfg.learn_table, init=table_init)
            self.converter = Converter(cfg.vocab_size)
            self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
            self.lm = None if cfg.backbone is None else causal_lm(cfg.backbone, dtype, not lm_weights_follow)
            d_model = cfg.d_model if self.lm is None else self.lm.config.hidden_size
            self.embed = nn.Embedding(cfg.vocab_size, d_model)
            self.mask_vector = nn.Parameter(torch.zeros(d_model))
            self.norm_proj = nn.Linear(1, d_model) if cfg.norm_input else None
            if self.lm is None:
                self.transformer = Transformer(TransformerConfig(cfg.d_model, cfg.n_layers, cfg.n_heads))
                self.head = nn.Linear(cfg.d_model, cfg.vocab_size)
        self.network_to(dtype)

    def network_to(self, dtype: torch.dtype) -> None:
        """The network's parameters (blocks, head, embedding matrix: nearly all of them) in
        `dtype`; the channel's token table and the converter stay float32 (the posterior over V
        is a softmax of logits up to s_max = 100, where bfloat16 keeps 2 significant digits).
        Buffers keep their dtype (a rotary table in bfloat16 would misplace long positions)."""
        network = [self.embed] + ([self.lm] if self.lm is not None else [self.transformer, self.head])
        for module in network:
            for p in module.parameters():
                if p.is_floating_point() and p.dtype != dtype:
                    p.data = p.data.to(dtype)

    @torch.no_grad()
    def init_from(self, pretrained: nn.Module) -> None:
        """Blocks and head from a pretrained causal LM of this config's architecture, and the
        converter's output matrix from its input embedding."""
        weights = pretrained.state_dict()
        weights.pop(input_embedding_key(pretrained))  # this model's is empty: the converter feeds inputs_embeds
        missing = self.lm.load_state_dict(weights, strict=False).missing_keys  # a tied head has no key of its own
        head = self.lm.get_output_embeddings().weight
        unset = set(missing) - {input_embedding_key(self.lm)} - {n for n, p in self.lm.named_parameters() if p is head}
        if unset:  # built without initialisation (lm_weights_follow): they would hold whatever memory held
            raise ValueError(f"the pretrained LM has no weights for {sorted(unset)}")
        head.copy_(pretrained.get_output_embeddings().weight)
        # the embedding module's output, not its weight: Gemma3's scales by sqrt(d) inside it
        table = pretrained.get_input_embeddings()
        self.embed.weight.copy_(table(torch.arange(self.cfg.vocab_size, device=table.weight.device)))

    def pretrained_states(self, x: torch.Tensor, causal: bool = False) -> torch.Tensor:
        """(B, L, d) inputs -> (B, L, d) final states of the pretrained blocks (bidirectional unless
        `causal`) after a clean BOS position; position i is read at output i - 1."""
        bos = self.embed.weight[self.cfg.bos_id].to(x.dtype).expand(len(x), 1, -1)
        x = torch.cat([bos, x], dim=1)
        # a 4-D mask is used as given by every architecture's mask builder: all zeros = full attention
        mask = None if causal else torch.zeros(len(x), 1, x.shape[1], x.shape[1], dtype=x.dtype, device=x.device)
        return self.lm.base_model(inputs_embeds=x, attention_mask=mask, use_cache=False).last_hidden_state[:, :-1]

    def pretrained_logits(self, x: torch.Tensor, causal: bool = False) -> torch.Tensor:
        """(B, L, d) inputs -> (B, L, V) logits through the pretrained blocks and head
        (`pretrained_states`, then the head)."""
        return self.lm.get_output_embeddings()(self.pretrained_states(x, causal))

    def decoder_blocks(self) -> list[nn.Module]:
        """The blocks FSDP shards one by one and activation checkpointing recomputes."""
        return list(self.transformer.blocks if self.lm is None else find_blocks(self.lm))

    def replicated_parts(self) -> list[nn.Module]:
        """What FSDP leaves whole and float32 on every rank: the channel's table and the converter."""
        return [self.table, self.converter]

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
        return self.logits_of(self.features(z), z)

    def features(self, z: torch.Tensor) -> torch.Tensor:
        """(B, L, d): the final states the head reads at each position (for a pretrained LM, the
        state one position to the left: output i - 1 scores position i). A sampler keeps these and
        runs `logits_of` only where it draws a token (samplers/base.py `CountingDenoiser`)."""
        probs = self.converter(z, self.table())
        x = Converter.mix(probs, self.embed.weight, self.mask_vector)
        if self.norm_proj is not None:
            x = x + self.norm_proj(torch.log1p(z.norm(dim=-1, keepdim=True)).to(self.norm_proj.weight.dtype))
        x = x.to(self.embed.weight.dtype)  # the network's dtype (bfloat16 under --precision bfloat16)
        return self.pretrained_states(x) if self.lm is not None else self.transformer(x)

    def logits_of(self, features: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """Logits (..., V) of the positions whose `features` (..., d) are given, in the network's
        dtype; ids past the tokenizer's vocabulary at the dtype's lowest value. `z` is unused (the
        head reads the features alone) and kept for the protocol."""
        head = self.head if self.lm is None else self.lm.get_output_embeddings()
        logits = head(features)
        known = self.cfg.tokenizer_size
        if known is not None and known < logits.shape[-1]:  # out of place: the logits may be a view
            padding = torch.arange(known, logits.shape[-1], device=logits.device)
            logits = logits.index_fill(-1, padding, torch.finfo(logits.dtype).min)
        return logits

    def loss(self, tokens: torch.Tensor, snr: torch.Tensor, generator: torch.Generator | None = None,
             noise: torch.Tensor | None = None) -> torch.Tensor:
        z = channel(self.table(), tokens, upload(snr, tokens.device), generator=generator, noise=noise)
        logits = self(z)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), tokens.reshape(-1))

    def mdlm_loss(self, tokens: torch.Tensor, masked: torch.Tensor, weight: torch.Tensor,
                  noise: torch.Tensor | None = None) -> torch.Tensor:
        """MDLM's objective (`mdlm_objective`) for rows whose `masked` (B, L) positions sit at
        s = 0 and the rest at s_max, each row weighted by `weight` (B,)."""
        masked, weight = upload(masked, tokens.device), upload(weight, tokens.device)
        snr = torch.where(masked, 0.0, self.s_max)
        logits = self(channel(self.table(), tokens, snr, noise=noise))
        return mdlm_objective(logits, tokens, masked, weight)


# --- MDLM's objective (kuleshov-group/mdlm, diffusion.py: SUBS, continuous time, log-linear) ---

MDLM_OBJECTIVES = ("mdlm", "legacy")
SAMPLING_EPS = 1e-3  # MDLM's training.sampling_eps: t in [1e-3, 1]
LOGLINEAR_EPS = 1e-3  # MDLM's LogLinearNoise eps: sigma(t) = -log(1 - (1 - eps) t)


def antithetic_times(n: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """n mask times, one in each stratum [k/n, (k+1)/n) (MDLM's antithetic sampling: one uniform
    per row, shrunk into its stratum), then mapped onto [SAMPLING_EPS, 1]."""
    u = torch.rand(n, generator=generator, dtype=torch.float64)
    t = (u / n + torch.arange(n, dtype=torch.float64) / n) % 1
    return ((1 - SAMPLING_EPS) * t + SAMPLING_EPS).float()


def loglinear(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the probability a token is masked at time t, the loss weight dσ/expm1(σ)) of the
    log-linear schedule σ(t) = -log(1 - (1 - eps) t): (1 - eps) t and 1/t."""
    t = t.double()
    sigma = -torch.log1p(-(1 - LOGLINEAR_EPS) * t)
    dsigma = (1 - LOGLINEAR_EPS) / (1 - (1 - LOGLINEAR_EPS) * t)
    return (-torch.expm1(-sigma)).float(), (dsigma / torch.expm1(sigma)).float()


def mdlm_objective(logits: torch.Tensor, tokens: torch.Tensor, masked: torch.Tensor,
                   weight: torch.Tensor) -> torch.Tensor:
    """MDLM's loss per token: sum over masked positions of weight x (-log p(x_i)), over B x L.
    A revealed position adds exactly 0 (SUBS carries it over), whatever its logits."""
    ce = F.cross_entropy(logits.float().transpose(1, 2), tokens, reduction="none")
    return torch.where(masked, ce * weight[:, None].to(ce.dtype), torch.zeros_like(ce)).sum() / tokens.numel()


def causal_lm(config: dict, dtype: torch.dtype = torch.float32, initialise: bool = True) -> nn.Module:
    """A causal LM of this config (a `PretrainedConfig.to_dict()`) with random `dtype` weights (its
    rotary buffers float32, as transformers builds them) and an
    untied head (the head and the converter's matrix train apart). Its input embedding is
    replaced by an empty one: the converter feeds `inputs_embeds`, so the vocabulary-wide table
    would only be dead weight in every checkpoint (113 MB for SmolLM2, 2 GB for Llama-3.1-8B)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in config.items() if k != "model_type"}
    hf_config = AutoConfig.for_model(config["model_type"], **{**fields, "tie_word_embeddings": False})
    from transformers.initialization import no_init_weights

    with nullcontext() if initialise else no_init_weights():  # skipped: weights to be loaded next
        lm = AutoModelForCausalLM.from_config(hf_config, dtype=dtype)
    lm.set_input_embeddings(nn.Embedding(0, hf_config.hidden_size, dtype=dtype).requires_grad_(False))
    return lm


def input_embedding_key(lm: nn.Module) -> str:
    """The state-dict key of a causal LM's input embedding weight."""
    table = lm.get_input_embeddings()
    return next(f"{name}.weight" for name, module in lm.named_modules() if module is table)


def pretrained_dsl(spec: str, tokenizer, d_tok: int, learn_table: bool = True, table_init: str = "random",
                   seed: int = 0, dtype: torch.dtype = torch.float32) -> DSLModel:
    """A DSL denoiser whose blocks, head and converter matrix start from the causal LM `spec`;
    `tokenizer` must be that model's (one line otherwise). `table_init="pca"` takes the token
    table from the same loaded weights (the model is read once). The model is loaded, and the
    network built, in `dtype`: two copies of the weights on the host at once."""

    own = load_tokenizer(spec)  # checked before the weights load
    if own.get_vocab() != tokenizer.get_vocab():
        raise BadInput(f"tokenizer mismatch: --tokenizer has another vocabulary ({len(tokenizer):,} tokens) than "
                       f"--init-from {spec} ({len(own):,}); leave --tokenizer out to use the model's")
    backbone = load_backbone(spec, device="cpu", dtype=str(dtype).removeprefix("torch."))
    lm, hf = backbone.model, backbone.model.config
    embeddings = lm.get_input_embeddings().weight.detach()
    padding = untrained_ids(backbone.tokenizer, len(embeddings))
    cfg = DSLConfig(vocab_size=len(embeddings), d_tok=d_tok, d_model=hf.hidden_size,
                    n_layers=backbone.num_layers, n_heads=hf.num_attention_heads, learn_table=learn_table,
                    backbone=hf.to_dict(), bos_id=start_of(spec, backbone.tokenizer, hf),
                    tokenizer_size=padding.start if len(padding) else None)
    table = TokenTable.pca_init(embeddings, d_tok) if check_table_init(table_init) == "pca" else None
    model = DSLModel(cfg, table_init=table, seed=seed, dtype=dtype, lm_weights_follow=True)
    model.init_from(lm)
    return model


def start_of(spec: str, tokenizer, config) -> int:
    """The clean first position a DSL on `spec`'s blocks prepends (geoprobe.tokens.start_token),
    or one line: the model has none."""
    start = start_token(tokenizer, config)
    if start is None:
        raise BadInput(f"--init-from {spec} has no start token (its tokenizer's bos_token_id and its config's are "
                       "None): the DSL prepends one clean first position; use a model that names one")
    return start


def check_init_fits(spec: str, d_tok: int, batch_size: int, seq_len: int, device: torch.device,
                    precision: str = "auto", ranks: int = 1, execution: Execution = Execution()) -> int:
    """The device memory per rank `--init-from spec` will train in (geoprobe.memory.dsl_training_bytes;
    `batch_size` the global batch over `ranks`, laid out as `execution` says), or one line before
    any weight loads when it will not fit the device or its loading the host (two copies of the
    weights per process: the loaded model and the DSL's). The line names what would fit:
    --precision bfloat16, or on CUDA the fewest GPUs of this size with --fsdp (the plan's own count)."""

    config = load_config(resolve_source(spec), False)
    count = parameter_count(config)  # once: counting builds an empty model
    kind, free = Precision.parse(precision).weights, memory_available(device)
    mixed = device.type == "cuda" and Precision.parse(precision) is not Precision.FLOAT32

    def need(n: int, micro: int, checkpointing: bool, fsdp: bool = execution.fsdp, weights: str = kind) -> int:
        return dsl_training_bytes(config, d_tok=d_tok, batch_size=micro, seq_len=seq_len, parameters=count,
                                  precision=weights, ranks=n, fsdp=fsdp, checkpointing=checkpointing, mixed=mixed)

    planned = need(ranks, batch_size // (ranks * execution.grad_accum), execution.activation_checkpointing)
    if planned > free:
        what = ("bfloat16 weights, gradients and EMA, float32 AdamW moments" if kind == "bfloat16"
                else "float32 weights, gradients, AdamW moments and EMA")
        share = f" / {ranks} ranks" if execution.fsdp else ""
        raise BadInput(f"dsl train --init-from {spec} needs about {human(planned)} per rank on {device} ({what}: "
                       f"{DSL_BYTES_PER_PARAMETER[kind]} bytes x {count / 1e9:.2f} B parameters{share}, and one "
                       f"batch's activations) but {human(free)} is free; use "
                       f"{_way_out(need, free, batch_size, ranks, device, kind, execution)}")
    weights = Precision.parse(precision).weights_dtype
    host, ram = 2 * torch.finfo(weights).bits // 8 * count, memory_available(torch.device("cpu"))
    if host > ram:
        raise BadInput(f"loading --init-from {spec} holds two {kind} copies of its weights ({human(host)}) "
                       f"but {human(ram)} of RAM is available")
    return planned


def _way_out(need, free: int, batch_size: int, ranks: int, device: torch.device, kind: str,
             execution: Execution) -> str:
    """The advice of check_init_fits's refusal, each option computed by the same plan."""
    options = []
    if kind == "float32" and not execution.fsdp:
        bf16 = need(ranks, batch_size // (ranks * execution.grad_accum), execution.activation_checkpointing,
                    weights="bfloat16")
        if bf16 <= free:
            options.append(f"--precision bfloat16 (about {human(bf16)})")
    if device.type == "cuda":
        layout = fewest_ranks(lambda n, micro, ckpt: need(n, micro, ckpt, fsdp=True, weights="float32"), free,
                              batch_size, execution.grad_accum, execution.activation_checkpointing)
        if layout is not None:
            n, ckpt = layout
            each = need(n, batch_size // (n * execution.grad_accum), ckpt, fsdp=True, weights="float32")
            options.append(f"--fsdp on {n} GPU{'s' if n > 1 else ''} of this size (about {human(each)} each"
                           f"{', with --activation-checkpointing' if ckpt and not execution.activation_checkpointing else ''}"
                           f"{', --precision auto' if kind == 'bfloat16' else ''})")
    return ", ".join(options + ["a smaller model or --batch-size (or --grad-accum)"])


@dataclass
class DSLTrainSettings:
    snr: str = "mixed"
    roar_frac: float = 0.1
    seq_len: int = 128
    mdlm_objective: str = "mdlm"  # --snr endpoint's loss: MDLM's own, or geoprobe's legacy one
    train: TrainConfig = field(default_factory=TrainConfig)

    def validate(self) -> None:
        if not 0 <= self.roar_frac <= 1:  # also refuses NaN
            raise BadInput(f"--roar-frac must be in [0, 1], got {self.roar_frac}")
        if self.mdlm_objective not in MDLM_OBJECTIVES:
            raise BadInput(f"unknown --mdlm-objective {self.mdlm_objective!r} (use {', '.join(MDLM_OBJECTIVES)})")
        self.train.validate()

    @property
    def mdlm(self) -> bool:
        """Whether this run trains on MDLM's objective (endpoint SNRs, `mdlm_objective` mdlm)."""
        return self.snr == "endpoint" and self.mdlm_objective == "mdlm"


def with_loop_defaults(training: dict | None) -> dict | None:
    """A recorded DSL training dict with the loop settings added since it was written at their
    defaults (what the loop did before they existed), so that an older run still resumes."""
    if not training or "train" not in training:
        return training
    return {**training, "train": {**json.loads(json.dumps(asdict(TrainConfig()))), **training["train"]}}


def mdlm_objective_of(training: dict | None) -> str:
    """The endpoint objective a recorded DSL training dict names; a record written before
    `--mdlm-objective` existed trained the legacy one."""
    return (training or {}).get("mdlm_objective", "legacy")


def run_identity(training: dict | None) -> dict | None:
    """What makes two DSL training dicts the same run: the recorded settings with the loop's
    later defaults (`with_loop_defaults`), an older record's objective read as legacy, and the
    objective left out where the SNR is not endpoint (it has no effect there)."""
    training = with_loop_defaults(training)
    if not training:
        return training
    training = {**training, "mdlm_objective": mdlm_objective_of(training)}
    if training.get("snr") != "endpoint":
        training.pop("mdlm_objective")
    return training


def dsl_settings(**flags) -> tuple[DSLTrainSettings, DSLConfig]:
    """(training settings, network shape) of `dsl train` from its flags by name (TrainConfig's,
    DSLTrainSettings' and DSLConfig's fields, and `until`: bridges/train.py `with_loop_flags`);
    the rest keep their class defaults."""

    train, run, shape = split_flags(with_loop_flags(flags), TrainConfig, DSLTrainSettings, DSLConfig)
    shape.setdefault("vocab_size", 0)  # the tokenizer's, set when the run starts
    return DSLTrainSettings(**run, train=TrainConfig(**train)), DSLConfig(**shape)


def sequences(ids: list[int], seq_len: int) -> torch.Tensor:
    """The id stream cut into (n, seq_len) rows (the tail that does not fill a row is dropped)."""
    n = len(ids) // seq_len
    if n == 0:
        raise BadInput(f"the corpus has {len(ids)} tokens, fewer than one sequence of --seq-len {seq_len}")
    return torch.tensor(np.asarray(ids[: n * seq_len], dtype=np.int64)).view(n, seq_len)


def train_dsl(model: DSLModel, data: torch.Tensor, settings: DSLTrainSettings, *, out: Path, device: torch.device,
              progress=None, world: World = SINGLE, stop_rows: torch.Tensor | None = None,
              execution: Execution = Execution()) -> Trained:
    """Train on rows of `data` (n, L); each step draws its batch and SNRs from its own seed.
    With `settings.train.eval_every` > 0 the plateau rule watches the MDLM bound of the EMA
    weights on `stop_rows` (fixed Monte-Carlo draws, so the curve moves only with the weights)
    and keeps the best. Writes `config.json` first when the directory has none, so the result
    always loads."""
    if not (Path(out) / CONFIG).is_file() and world.is_main:
        Path(out).mkdir(parents=True, exist_ok=True)
        save_config(out, "dsl", model.cfg, asdict(settings), budget(settings), {})
    loss_fn, watch = dsl_objective(model, data, settings, device, stop_rows, sharded=execution.fsdp)
    return train(model, loss_fn, settings.train, out=out, device=device, progress=progress, world=world, evaluate=watch,
                 execution=execution)


def dsl_objective(model: DSLModel, data: torch.Tensor, settings: DSLTrainSettings, device: torch.device,
                  stop_rows: torch.Tensor | None = None, sharded: bool = False):
    """(loss_fn, watch) of the one training loop for a DSL model, moved to `device` in its
    weights' precision: the channel's loss on random rows at drawn SNRs, and the MDLM bound on
    `stop_rows` the plateau rule watches (None without evaluations). `sharded` (--fsdp): only
    the replicated parts move here; fully_shard moves each unit as it shards it, so the whole
    model is never on the device at once."""
    # a caller's float32 model trains as asked
    model.network_to(Precision.parse(settings.train.precision).weights_dtype)
    for part in model.replicated_parts() if sharded else [model]:
        part.to(device)
    data = data.to(device)

    def loss_fn(m, generator, shard):
        # the global batch's draws, then this rank's rows: any world size trains on the same numbers
        size, length = settings.train.batch_size, data.shape[1]
        rows = shard.rows(torch.randint(0, len(data), (size,), generator=generator))
        if settings.mdlm:  # MDLM's objective: antithetic t, log-linear masking, masked tokens weighted 1/t
            masking, weight = loglinear(antithetic_times(size, generator))
            masked = torch.rand((size, length), generator=generator) < masking[:, None]
            noise = shard.rows(torch.randn((size, length, m.cfg.d_tok), generator=generator))
            return m.mdlm_loss(data[upload(rows, device)], shard.rows(masked), shard.rows(weight), noise=noise)
        snr = shard.rows(draw_snr(settings.snr, (size, length), generator=generator, roar_frac=settings.roar_frac))
        noise = shard.rows(torch.randn((size, length, m.cfg.d_tok), generator=generator))
        return m.loss(data[upload(rows, device)], snr, noise=noise)

    if settings.train.eval_every <= 0:
        return loss_fn, None
    if stop_rows is None:
        raise BadInput("--eval-every needs held-out rows for the plateau rule to watch")
    rows = stop_rows.to(device)

    def watch(m):  # in batches of 64 rows: a (B, L, V) logits tensor per Monte-Carlo draw
        return torch.cat([mdlm_elbo(m, rows[i:i + 64]) for i in range(0, len(rows), 64)]).mean().item()

    return loss_fn, watch


def budget(settings: DSLTrainSettings) -> dict:
    """The training budget every checkpoint records (geoprobe.bridges.checkpoint); any settings
    with a `train` TrainConfig and a `seq_len` (the embedding baselines' too)."""
    return {"steps": settings.train.steps, "batch_size": settings.train.batch_size, "seq_len": settings.seq_len}


def load_dsl(folder: Path, device: torch.device | str = "cpu") -> DSLModel:
    """The EMA weights of a trained DSL checkpoint directory, ready to sample."""
    cfg = build_network(DSLConfig, read_config(folder, "dsl"), folder)
    model = DSLModel(cfg, lm_weights_follow=cfg.backbone is not None)  # every weight is in the file
    load_weights(model, folder)
    return model.to(device).eval()


def load_dsl_denoiser(folder: Path, device: str = "auto", decode: str = "stack"):
    """(TokenDenoiser, tokenizer) of a DSL checkpoint directory: the model decodes through its own
    token table, whatever `decode` says."""

    return load_dsl(folder, resolve_device(device)), load_saved_tokenizer(folder)


def dsl_generator_backbone(config: dict) -> str | None:
    """The causal LM a DSL model was initialised from (`--init-from`), if any."""
    return config.get("identity", {}).get("init_from")


def dsl_oracle_start(config: dict, document_length: int) -> str:
    """Where the testbed's HMM starts a DSL model's samples: at a document start where its rows
    are whole documents (seq_len = document + <eos>), anywhere otherwise (rows cut from the
    concatenated documents)."""
    return "document" if (config.get("budget") or {}).get("seq_len") == document_length + 1 else "anywhere"


# --- one training run in a checkpoint directory (what `geoprobe dsl train` calls) -------------

def dsl_tokenizer(spec: str, documents: list[str] | None = None):
    """`char`, `words`, `train:V` (both need the documents), a model/tokenizer folder, a hub id, or
    builtin:NAME."""

    if spec == "char":
        return char_tokenizer()
    if spec == "words":
        return word_tokenizer(documents or [])
    if spec.startswith("train:"):
        size = spec.split(":", 1)[1]
        if not size.isdigit():
            raise BadInput(f"malformed tokenizer spec {spec!r}: use train:V with V a number")
        return train_bpe(documents or [], int(size))
    return load_tokenizer(spec)  # a model's own tokenizer: the loader every command uses


def fit_dsl(out: Path, corpus: str, tokenizer: str | None, *, settings: DSLTrainSettings, shape: DSLConfig,
            table_init: str = "random", init: Path | None = None, init_from: str | None = None, force: bool = False,
            device: str = "auto", progress=None, world: World = SINGLE, execution: Execution = Execution(),
            log_to: str = "none", deterministic: bool = False) -> dict | None:
    """Train (or resume) a DSL model in `out`: from scratch, from a DSL checkpoint (`init`) or
    from a pretrained causal LM (`init_from`, which sets the network's size itself); evaluate it
    on the held-out documents and write metrics.json and the curve. `shape` is the network of a
    new run (its vocab_size is the tokenizer's, whatever it says; a resumed run keeps its own).
    Returns the metrics (None on data-parallel ranks other than 0). A directory holding another
    run is refused in one line, as is every bad setting, before anything loads. `execution`:
    FSDP, accumulation, activation checkpointing; `log_to`: geoprobe.tracking's destination;
    `deterministic`: deterministic CUDA kernels (geoprobe.device)."""

    if settings.snr not in SNR_SCHEMES:
        raise BadInput(f"unknown --snr {settings.snr!r} (use {', '.join(SNR_SCHEMES)})")
    if init is not None and init_from is not None:
        raise BadInput("--init (a DSL checkpoint) and --init-from (a pretrained LM) exclude each other")
    check_table_init(table_init)
    settings.validate()
    execution.validate(settings.train.batch_size, world.size, settings.train.precision)
    check_log_to(log_to)
    choose_determinism(deterministic)
    target = resolve_device(world.device(device))
    planned = None
    if init_from is not None:
        planned = check_init_fits(init_from, shape.d_tok, settings.train.batch_size, settings.seq_len, target,
                                  settings.train.precision, world.size, execution)
    tokenizer = tokenizer or init_from or "train:4096"
    out = Path(out)
    train_docs, val_docs = split_documents(corpus, settings.train.seed)
    seed, dtype = settings.train.seed, Precision.parse(settings.train.precision).weights_dtype
    identity = {"corpus": corpus, "tokenizer_spec": tokenizer, "init": str(init) if init else None,
                **({"init_from": init_from} if init_from else {})}
    with holding(out, "geoprobe dsl train", world.rank):
        try:
            if force and world.is_main:
                clear(out)
            world.barrier()
            if (out / CONFIG).is_file():
                old = read_config(out)
                if run_identity(old.get("training")) != run_identity(json.loads(json.dumps(asdict(settings)))) \
                        or old.get("identity") != identity:
                    raise BadInput(f"{out} holds another training run; use another --out or --force")
                tok = load_saved_tokenizer(out)
                model = _resumed_model(old, out, tok, tokenizer=tokenizer, table_init=table_init, init=init,
                                       init_from=init_from, seed=seed, dtype=dtype)
            else:
                if not is_empty(out):
                    raise BadInput(f"output directory {out} is not empty and holds no checkpoint; use another --out")
                tok = dsl_tokenizer(tokenizer, train_docs)
                model = _new_model(tok, tokenizer, shape, table_init, init, init_from, seed, dtype)
                world.barrier()  # every rank has looked at the directory before rank 0 fills it
                if world.is_main:
                    out.mkdir(parents=True, exist_ok=True)
                    save_tokenizer(tok, out)
                    save_config(out, "dsl", model.cfg, asdict(settings), budget(settings), identity)
            data = sequences(token_stream(train_docs, tok), settings.seq_len)
            watched, disjoint = stopping_rows(val_docs, tok, settings.seq_len)
            loss_fn, watch = dsl_objective(model, data, settings, target, stop_rows=watched, sharded=execution.fsdp)

            def score(_model, _trained) -> dict:  # the saved weights in float32, as sampling loads them
                peak = torch.cuda.max_memory_allocated(target) if target.type == "cuda" else None  # training's
                metrics = evaluate_dsl(out, val_docs, tok, settings.seq_len, device)
                if planned is not None:  # the memory plan beside what the device measured (CUDA counts its peak)
                    metrics.update(device_bytes_planned=planned, device_bytes_peak=peak)
                if settings.train.eval_every > 0:
                    metrics["stop_rows_disjoint"] = disjoint
                return metrics

            with tracking(log_to, settings.train.batch_size * settings.seq_len):
                return fit_model(model, loss_fn, settings.train, out=out, device=target, score=score, title="DSL model",
                                 progress=progress, world=world, watch=watch, reload=False, execution=execution)
        finally:
            if progress is not None:
                progress.stop()


def _new_model(tok, tokenizer: str, shape: DSLConfig, table_init: str, init: Path | None, init_from: str | None,
               seed: int, dtype: torch.dtype) -> DSLModel:

    if init_from is not None:
        return pretrained_dsl(init_from, tok, shape.d_tok, shape.learn_table, table_init=table_init, seed=seed,
                              dtype=dtype)
    cfg = replace(shape, vocab_size=len(tok))
    model = DSLModel(cfg, table_init=pca_table(tokenizer, len(tok), cfg.d_tok) if table_init == "pca" else None,
                     seed=seed, dtype=dtype)
    if init is not None:
        start = load_dsl(init)
        if load_saved_tokenizer(init).get_vocab() != tok.get_vocab():
            raise BadInput(f"tokenizer mismatch: {init} was trained with another vocabulary than --tokenizer {tokenizer}")
        if start.cfg != cfg:
            raise BadInput(f"--init {init} has another model shape ({start.cfg}) than the flags ask for")
        model.load_state_dict(start.state_dict())  # cast into the network's dtype as it is copied
    return model


def _resumed_model(old: dict, out: Path, tok, *, tokenizer: str, table_init: str, init: Path | None,
                   init_from: str | None, seed: int, dtype: torch.dtype) -> DSLModel:
    """The model of a directory's run: its weights come from the checkpoint when there is one;
    a run stopped before its first checkpoint starts as a new one (from its pretrained LM too)."""
    shape = build_network(DSLConfig, old, out)
    if (out / CHECKPOINT).is_file() or (out / SHARDED_CHECKPOINT).is_dir():
        return DSLModel(shape, seed=seed, dtype=dtype, lm_weights_follow=shape.backbone is not None)
    return _new_model(tok, tokenizer, shape, table_init, init, init_from, seed, dtype)


def check_table_init(kind: str) -> str:
    if kind not in ("random", "pca"):
        raise BadInput(f"unknown --table-init {kind!r} (use random or pca)")
    return kind


def pca_table(tokenizer_spec: str, vocab_size: int, d_tok: int) -> torch.Tensor:
    """The token table from the PCA of a backbone's input embeddings (`--table-init pca`)."""
    if tokenizer_spec == "char" or tokenizer_spec.startswith("train:") or tokenizer_spec == "words":
        raise BadInput("--table-init pca needs --tokenizer to name a model whose embeddings to use")

    embeddings = load_backbone(tokenizer_spec, device="cpu").model.get_input_embeddings().weight.detach()
    if len(embeddings) < vocab_size:
        raise BadInput(f"the model's embedding table has {len(embeddings)} rows, fewer than the vocabulary ({vocab_size})")
    return TokenTable.pca_init(embeddings[:vocab_size], d_tok)


REPORTED_ROWS = 32  # held-out rows evaluate_dsl reports on; the plateau rule stops on the rows after them
STOPPING_ROWS = 256  # at most this many: each evaluation scores them 16 times


def stopping_rows(documents: list[str], tokenizer, seq_len: int) -> tuple[torch.Tensor, bool]:
    """(the held-out rows the plateau rule watches, whether they are apart from the reported
    ones): at most STOPPING_ROWS of the rows after the REPORTED_ROWS that metrics.json reports,
    so that the reported bound is not the one training stopped on; a held-out set too small for
    both shares them."""

    ids = token_stream(documents, tokenizer)
    rows = sequences(ids, min(seq_len, len(ids)))
    if len(rows) > REPORTED_ROWS:
        return rows[REPORTED_ROWS:REPORTED_ROWS + STOPPING_ROWS], True
    return rows[:STOPPING_ROWS], False


def reported_rows(documents: list[str], tokenizer, seq_len: int, max_seqs: int = REPORTED_ROWS) -> torch.Tensor:
    """The held-out rows metrics.json reports on: the first `max_seqs` rows of the documents."""
    ids = token_stream(documents, tokenizer)
    return sequences(ids, min(seq_len, len(ids)))[:max_seqs]


def evaluate_dsl(folder: Path, documents: list[str], tokenizer, seq_len: int, device: str,
                 max_seqs: int = REPORTED_ROWS) -> dict:
    """The MDLM bound of the trained model on (at most `max_seqs` sequences of) held-out documents."""
    import math


    model = load_dsl(folder, resolve_device(device))
    data = reported_rows(documents, tokenizer, seq_len, max_seqs).to(resolve_device(device))
    nats = mdlm_elbo(model, data).mean().item()
    return {"val_sequences": len(data), "val_mdlm_elbo_nats_per_token": nats,
            "val_mdlm_elbo_bits_per_token": nats / math.log(2)}
