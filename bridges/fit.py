"""Train one hidden-state bridge at a layer of a frozen backbone, then validate it.

The teacher states h_l come from the frozen prefix on the fly (early stop after block l); the
condition SNRs from the DSL mixed distribution, with a `clean_frac` share of sequences at
clean condition and a `tau_zero` share at tau = 0. The plateau rule watches a held-out split of
its own and keeps the best EMA weights by it. Validation runs on other held-out blocks with a
fixed seed and writes `metrics.json`: nmse at clean condition (1 - R^2), per-channel nmse, the
upper stack's next-token cross-entropy on the reconstruction (`ce`) and on the true states
(`ref_ce`), their difference, nmse averaged over a grid of condition SNRs, and the training
objective itself.
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch

from bridges.channel import channel, draw_snr
from bridges.hidden import BridgeConfig, HiddenBridge, Teacher
from bridges.nn import full_precision
from bridges.checkpoint import CONFIG, METRICS, load_weights, read_config, save_config, write_record
from bridges.train import TrainConfig, train, training_summary
from geoprobe.device import upload
from geoprobe.distributed import SINGLE, World
from geoprobe.errors import BadInput
from geoprobe.extract import pad_batch
from geoprobe.geometry import GeometrySettings
from geoprobe.store import differing_keys

NOISY_SNRS = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)


def bridge_training(steps: int, batch_size: int, lr: float, seed: int, until: str, eval_every: int,
                    precision: str = "auto") -> TrainConfig:
    """A bridge run's training settings, checked: warmup a tenth of the steps, EMA 0.99 (a bridge
    trains for hundreds of steps, not the DSL's thousands), checkpoints every <= 100 steps, and
    with `until` "plateau" the plateau rule every `eval_every` steps (default steps/40) from 5
    evaluations or twice the warmup on."""
    if until not in ("plateau", "steps"):
        raise BadInput(f"--until must be plateau or steps, got {until!r}")
    warmup = max(1, steps // 10)
    every = (eval_every or max(1, steps // 40)) if until == "plateau" else 0
    cfg = TrainConfig(steps=steps, batch_size=batch_size, lr=lr, warmup=warmup, seed=seed,
                      save_every=max(1, min(100, steps)), ema=0.99, eval_every=every,
                      min_steps=max(2 * warmup, 5 * every), precision=precision)
    cfg.validate()
    return cfg


def positions_weight(mask: torch.Tensor) -> torch.Tensor:
    """Positions >= 1 that are not padding: what the bridge generates and is scored on."""
    weight = mask.clone().float()
    weight[:, 0] = 0
    return weight


class BlockBatches:
    """Padded batches of corpus blocks on the backbone's device."""

    def __init__(self, blocks, pad_id: int, device):
        if not blocks:
            raise BadInput("no training blocks: the corpus is empty or too short")
        self.blocks, self.pad_id, self.device = blocks, pad_id, device

    def pick(self, size: int, generator: torch.Generator) -> list:
        """`size` blocks drawn uniformly with replacement."""
        return [self.blocks[i] for i in torch.randint(0, len(self.blocks), (size,), generator=generator).tolist()]

    def draw(self, size: int, generator: torch.Generator):
        return pad_batch(self.pick(size, generator), self.pad_id, self.device)

    def fixed(self, size: int):
        for start in range(0, len(self.blocks), size):
            yield pad_batch(self.blocks[start:start + size], self.pad_id, self.device)


def corpus_support(blocks, tokenizer) -> torch.Tensor:
    """The sorted backbone ids that occur in `blocks`, with the tokenizer's special tokens: the
    tokens a converter restricted to the corpus can put mass on."""
    ids = np.unique(np.concatenate([np.asarray(b.tokens) for b in blocks] + [np.asarray(tokenizer.all_special_ids)]))
    return torch.from_numpy(ids.astype(np.int64))


def fit_statistics(bridge: HiddenBridge, teacher: Teacher, batches: BlockBatches, batch_size: int, seed: int,
                   passes: int = 8) -> None:
    g = torch.Generator().manual_seed(seed)
    sources, targets = [], []
    for _ in range(passes):
        ids, mask = batches.draw(batch_size, g)
        h0, hl = teacher.states(ids, mask)
        keep = positions_weight(mask).bool()
        sources.append(h0[keep])
        targets.append(hl[keep])
    bridge.set_statistics(torch.cat(sources), torch.cat(targets))


def draw_conditions(cfg: BridgeConfig, batch: int, length: int, generator: torch.Generator) -> dict:
    """The random numbers of one evaluation of the bridge's objective, for a whole (global) batch,
    always in this order: condition SNRs from the DSL mixed distribution, which sequences sit at
    clean condition, the channel noise, tau (0 for a `tau_zero` share, else U[0, 1]) and the
    bridge noise (drawn last, and only when sigma_b > 0: skipping it changes nothing else)."""
    snr = draw_snr("mixed", (batch, length), generator=generator)
    clean = torch.rand(batch, generator=generator) < cfg.clean_frac
    noise = torch.randn((batch, length, cfg.d_tok), generator=generator)
    tau = torch.rand(batch, generator=generator)
    tau = torch.where(torch.rand(batch, generator=generator) < cfg.tau_zero, torch.zeros_like(tau), tau)
    eps = torch.randn((batch, length, cfg.hidden_size), generator=generator) if cfg.sigma_b > 0 else None
    return {"snr": snr, "clean": clean, "noise": noise, "tau": tau, "eps": eps}


def objective(model: HiddenBridge, teacher: Teacher, ids: torch.Tensor, mask: torch.Tensor, target: torch.Tensor,
              draws: dict, denominator: float | None = None) -> torch.Tensor:
    """The bridge's training objective on (ids, mask) with true states `target` (h_l) and the
    random numbers `draws` (draw_conditions, already cut to these rows)."""
    # the converter's mixture in float32 even under the loop's bf16 autocast (CUDA): validation
    # computes it in float32 too, and the target must not move with it
    with full_precision(ids.device):
        z = channel(model.table(), ids, upload(draws["snr"], ids.device), noise=draws["noise"])
        a = model.source(z, teacher.embeddings, teacher.offsets(ids.shape[1]), ids, draws["clean"])
    return model.loss(a, target, positions_weight(mask), tau=draws["tau"], eps=draws["eps"], denominator=denominator)


def training_loss(bridge: HiddenBridge, teacher: Teacher, batches: BlockBatches, batch_size: int):
    """The loss of one step. Every random number is drawn for the global batch and a rank keeps
    its rows (`shard`), padded to the global batch's length: any world size computes the same
    loss, and the frozen backbone runs only on the rank's own rows."""
    def loss_fn(model, generator, shard):
        chosen = batches.pick(batch_size, generator)
        length = max(len(b.tokens) for b in chosen)
        positions = sum(len(b.tokens) - 1 for b in chosen)  # what positions_weight keeps, whole batch
        ids, mask = pad_batch(shard.rows(chosen), batches.pad_id, batches.device, length=length)
        draws = {k: None if v is None else shard.rows(v)
                 for k, v in draw_conditions(model.cfg, batch_size, length, generator).items()}
        with full_precision(ids.device):  # the target in float32, as validation's
            target = teacher.states(ids, mask)[1]
        return objective(model, teacher, ids, mask, target, draws, denominator=max(positions, 1) / shard.count)

    return loss_fn


def reconstruct(bridge: HiddenBridge, teacher: Teacher, ids: torch.Tensor, target: torch.Tensor,
                generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(h^ at clean condition, position offsets); position 0 (BOS) is the backbone's, never generated."""
    offsets = teacher.offsets(ids.shape[1])
    clean = torch.ones(len(ids), dtype=torch.bool)  # on the host, as source() wants it
    z = torch.zeros(*ids.shape, bridge.cfg.d_tok, device=ids.device)
    h_hat = bridge.sample(bridge.source(z, teacher.embeddings, offsets, ids, clean), generator=generator)
    h_hat[:, 0] = target[:, 0]
    return h_hat, offsets


MASSIVE_FACTOR = GeometrySettings.massive_factor  # the scan's default rule for massive rows


@torch.no_grad()
def validate(bridge: HiddenBridge, teacher: Teacher, val: BlockBatches, batch_size: int, seed: int = 0,
             full: bool = True, massive_factor: float | None = MASSIVE_FACTOR) -> dict:
    """Validation losses on fixed held-out blocks, with a fixed seed. `full=False` computes the
    clean-condition nmse and nmse_dim only (what the stopping rule watches); `full` adds the rest.

    The state losses (nmse, nmse_dim, nmse_noisy) score the positions >= 1 whose true state is
    not massive (norm above `massive_factor` times the median norm: the scan's rule, so the
    bridge is scored on the states the geometry measured; None scores every position, as a scan
    with massive rows kept). ce and the objective are over every position >= 1.
    nmse = sum |h^ - h|^2 / sum |h - mean|^2 (scalar standardisation: a channel with most of the
    variance dominates both sums); nmse_dim = the mean over channels of that ratio
    taken per channel (each channel standardised by its own variance, so no single channel
    dominates); objective = the training loss itself (over tau and condition SNR, seeded draws)."""
    g = torch.Generator().manual_seed(seed)
    layer = bridge.cfg.layer
    targets, errors, noisy, rounded = [], [], {s: [] for s in NOISY_SNRS}, []
    sums = {"ce": 0.0, "ref_ce": 0.0, "ce_count": 0.0, "objective": 0.0, "objective_count": 0.0}
    for ids, mask in val.fixed(batch_size):
        hl = teacher.states(ids, mask)[1]
        h_hat, offsets = reconstruct(bridge, teacher, ids, hl, g)
        weight = positions_weight(mask)
        keep = weight.bool()
        targets.append(hl[keep].cpu())
        errors.append(((h_hat - hl) ** 2)[keep].cpu())
        if not full:
            continue
        draws = draw_conditions(bridge.cfg, *ids.shape, g)
        sums["objective"] += float(objective(bridge, teacher, ids, mask, hl, draws) * weight.sum())
        sums["objective_count"] += float(weight.sum())
        if layer == 0:  # the rounding baseline's decoder: nearest token embedding
            e = teacher.embeddings
            plain = h_hat - offsets
            nearest = ((plain * plain).sum(-1, keepdim=True) - 2 * plain @ e.T + (e * e).sum(-1)).argmin(-1)
            rounded.append((nearest == ids)[keep].cpu())
        # next-token cross-entropy of the frozen upper stack: position i predicts i + 1
        pair = mask[:, 1:].float()
        for key, states in (("ce", h_hat), ("ref_ce", hl)):
            final = teacher.backbone.final_from(layer, states, attention_mask=mask)[:, :-1]
            ce = teacher.backbone.token_losses(final, ids[:, 1:])  # the head in chunks: no B x L x V tensor
            sums[key] += float((ce * pair).sum())
        sums["ce_count"] += float(pair.sum())
        for s in NOISY_SNRS:
            z = channel(bridge.table(), ids, torch.full(ids.shape, s, device=ids.device), generator=g)
            noisy_hat = bridge.sample(bridge.source(z, teacher.embeddings, offsets), generator=g)
            noisy[s].append(((noisy_hat - hl) ** 2).sum(-1)[keep].cpu())
    target = torch.cat(targets).double()
    norms = target.norm(dim=1)
    scored = norms <= massive_factor * norms.median() if massive_factor else torch.ones_like(norms, dtype=torch.bool)
    target, error = target[scored], torch.cat(errors).double()[scored]
    var_dim = ((target - target.mean(0)) ** 2).sum(0)
    total_var = float(var_dim.sum())
    nmse = float(error.sum()) / total_var
    varying = var_dim > 1e-12 * total_var  # a constant channel has nothing to reconstruct
    err_dim = error.sum(0)
    nmse_dim = float((err_dim[varying] / var_dim[varying]).mean())
    if not full:
        return {"layer": layer, "nmse": nmse, "nmse_dim": nmse_dim}
    ce, ref_ce = sums["ce"] / sums["ce_count"], sums["ref_ce"] / sums["ce_count"]
    by_snr = {str(s): float(torch.cat(v).double()[scored].sum()) / total_var for s, v in noisy.items()}
    return {"layer": layer, "nmse": nmse, "nmse_dim": nmse_dim,
            "ce": ce, "ref_ce": ref_ce, "delta_ce": ce - ref_ce,
            "nmse_noisy": sum(by_snr.values()) / len(by_snr), "nmse_by_snr": by_snr,
            "objective": sums["objective"] / sums["objective_count"],
            "val_positions": int(scored.sum()), "val_massive_rows": int((~scored).sum()), "val_seed": seed,
            **({"round_accuracy": float(torch.cat(rounded)[scored].float().mean())} if layer == 0 else {})}


def fit_bridge(backbone, layer: int, train_blocks, val_blocks, cfg: BridgeConfig, train_cfg: TrainConfig,
               out: Path, identity: dict, progress=None, world: World = SINGLE, stop_blocks=None,
               massive_factor: float | None = MASSIVE_FACTOR) -> dict:
    """Train (or resume) the bridge at `layer` into `out`, validate, write metrics and the curve
    (with several ranks: data parallel; rank 0 writes every file).

    `stop_blocks` (held-out blocks never reported) drive the plateau rule on the per-channel nmse
    (the primary loss; the scalar nmse is dominated by massive channels), whose best EMA weights
    are the ones kept and validated on `val_blocks`; without them the rule watches `val_blocks`.
    A directory holding a bridge trained with other settings is refused, naming the keys that
    differ: its weights are never handed back under new settings."""
    out = Path(out)
    teacher = Teacher(backbone, layer)
    device = backbone.input_device
    pad_id = backbone.tokenizer.pad_token_id if backbone.tokenizer.pad_token_id is not None else 0
    batches, val = BlockBatches(train_blocks, pad_id, device), BlockBatches(val_blocks, pad_id, device)
    support = corpus_support([*train_blocks, *val_blocks, *(stop_blocks or [])], backbone.tokenizer) \
        if cfg.vocab == "corpus" else None
    if support is not None:
        cfg = replace(cfg, support_size=len(support))
    record = {"network": asdict(cfg), "training": asdict(train_cfg), "identity": identity}
    if (out / CONFIG).is_file():
        old = read_config(out, "bridge")
        if old.get("identity") != identity or old["network"] != record["network"]:
            keys = differing_keys(old.get("identity", {}), identity) or [
                f"bridge.{k}" for k in differing_keys(old["network"], record["network"])]
            raise BadInput(f"{out} holds a bridge for another backbone, layer or shape "
                           f"(differs in: {', '.join(keys)}); use another --out or --force")
        if old.get("training") != record["training"]:
            keys = differing_keys(old.get("training") or {}, record["training"])
            raise BadInput(f"{out} holds a bridge trained with other settings (differs in: {', '.join(keys)}); "
                           "use another --out, or --force to train it anew")
        if (out / METRICS).is_file():
            return json.loads((out / METRICS).read_text())  # finished (a resumed sweep keeps such layers)
    world.barrier()  # every rank has checked the directory before rank 0 writes into it
    bridge = HiddenBridge(cfg, seed=train_cfg.seed).to(device)
    if support is not None:
        bridge.set_support(support.to(device))
    fit_statistics(bridge, teacher, batches, train_cfg.batch_size, train_cfg.seed)
    if world.is_main:
        out.mkdir(parents=True, exist_ok=True)
        budget = {"steps": train_cfg.steps, "batch_size": train_cfg.batch_size, "seq_len": identity.get("seq_len")}
        save_config(out, "bridge", cfg, record["training"], budget, identity)
    watched = BlockBatches(stop_blocks, pad_id, device) if stop_blocks else val
    trained = train(bridge, training_loss(bridge, teacher, batches, train_cfg.batch_size), train_cfg, out, device,
                    progress=progress, world=world,
                    evaluate=lambda model: validate(model, teacher, watched, train_cfg.batch_size, full=False,
                                                    massive_factor=massive_factor)["nmse_dim"])
    load_weights(bridge, out)  # the kept EMA weights (the best by the stopping split)
    bridge.eval()
    metrics = validate(bridge, teacher, val, train_cfg.batch_size, massive_factor=massive_factor)
    metrics.update(training_summary(trained), seed=train_cfg.seed)
    metrics["stop_positions"] = sum(len(b.tokens) - 1 for b in stop_blocks) if stop_blocks else 0
    if world.is_main:
        write_record(out, metrics, trained, f"bridge at layer {layer}")
    return metrics
