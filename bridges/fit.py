"""Train one hidden-state bridge at a layer of a frozen backbone, then validate it.

The teacher states h_l come from the frozen prefix on the fly (early stop after block l); the
condition SNRs from the DSL mixed distribution, with a `clean_frac` share of sequences at
clean condition. Validation runs on fixed held-out blocks with a fixed seed and writes
`metrics.json`: nmse at clean condition (1 - R^2), the upper stack's next-token cross-entropy
on the reconstruction (`ce`) and on the true states (`ref_ce`), their difference, and nmse
averaged over a grid of condition SNRs.
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from bridges.channel import channel, draw_snr
from bridges.hidden import BridgeConfig, HiddenBridge, Teacher, save_bridge_config
from bridges.train import WEIGHTS, TrainConfig, train, training_summary, write_training_record
from geoprobe.distributed import SINGLE, World
from geoprobe.errors import BadInput
from geoprobe.extract import pad_batch
from geoprobe.rundir import CONFIG, METRICS, load_weights, read_config

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


def training_loss(bridge: HiddenBridge, teacher: Teacher, batches: BlockBatches, batch_size: int):
    """The loss of one step. Every random number is drawn for the global batch and a rank keeps
    its rows (`shard`), padded to the global batch's length: any world size computes the same
    loss, and the frozen backbone runs only on the rank's own rows."""
    def loss_fn(model, generator, shard):
        chosen = batches.pick(batch_size, generator)
        length = max(len(b.tokens) for b in chosen)
        positions = sum(len(b.tokens) - 1 for b in chosen)  # what positions_weight keeps, whole batch
        ids, mask = pad_batch(shard.rows(chosen), batches.pad_id, batches.device, length=length)
        snr = shard.rows(draw_snr("mixed", (batch_size, length), generator=generator))
        clean = shard.rows(torch.rand(batch_size, generator=generator) < model.cfg.clean_frac).to(ids.device)
        noise = shard.rows(torch.randn((batch_size, length, model.table().shape[1]), generator=generator))
        # the teacher's states and the converter's mixture in float32 even under the loop's bf16
        # autocast (CUDA): validation computes both in float32, and the target must not move with it
        with torch.autocast(ids.device.type, enabled=False):
            h0, hl = teacher.states(ids, mask)
            z = channel(model.table(), ids, snr.to(ids.device), noise=noise)
            a = model.source(z, teacher.embeddings, teacher.offsets(length), ids, clean)
        tau = shard.rows(torch.rand(batch_size, generator=generator))
        eps = (shard.rows(torch.randn((batch_size, length, hl.shape[-1]), generator=generator))
               if model.cfg.sigma_b > 0 else None)  # the last draw of the step: skipping it changes nothing else
        return model.loss(a, hl, positions_weight(mask), tau=tau, eps=eps,
                          denominator=max(positions, 1) / shard.count)

    return loss_fn


def reconstruct(bridge: HiddenBridge, teacher: Teacher, ids: torch.Tensor, mask: torch.Tensor,
                generator: torch.Generator):
    """(h^ at clean condition, the true h_l, the scored positions' weight, position offsets)."""
    h0, hl = teacher.states(ids, mask)
    offsets = teacher.offsets(ids.shape[1])
    clean = torch.ones(len(ids), dtype=torch.bool, device=ids.device)
    z = torch.zeros(*ids.shape, bridge.cfg.d_tok, device=ids.device)
    h_hat = bridge.sample(bridge.source(z, teacher.embeddings, offsets, ids, clean), generator=generator)
    h_hat[:, 0] = hl[:, 0]  # BOS is the backbone's, never generated
    return h_hat, hl, positions_weight(mask), offsets


@torch.no_grad()
def validate(bridge: HiddenBridge, teacher: Teacher, val: BlockBatches, batch_size: int, seed: int = 0,
             full: bool = True) -> dict:
    """Validation losses on the fixed held-out blocks. `full=False` computes the clean-condition
    nmse only (what the plateau rule watches); `full` adds the per-dimension nmse, the upper
    stack's cross-entropy and the noisy-condition nmse.

    nmse = sum |h^ - h|^2 / sum |h - mean|^2 (scalar standardisation: a channel with most of the
    variance dominates both sums); nmse_dim = the mean over channels of that ratio taken per
    channel (each channel standardised by its own variance, so no single channel dominates)."""
    g = torch.Generator().manual_seed(seed)
    layer = bridge.cfg.layer
    sums = {"err": 0.0, "ce": 0.0, "ref_ce": 0.0, "ce_count": 0.0}
    err_dim = torch.zeros(bridge.cfg.hidden_size, dtype=torch.float64)
    noisy = {s: [0.0, 0.0] for s in NOISY_SNRS}
    all_targets = []
    for ids, mask in val.fixed(batch_size):
        h_hat, hl, weight, offsets = reconstruct(bridge, teacher, ids, mask, g)
        all_targets.append(hl[weight.bool()].double())
        squared = (h_hat - hl) ** 2 * weight[..., None]
        sums["err"] += float(squared.sum())
        if not full:
            continue
        err_dim += squared.double().sum((0, 1)).cpu()
        if layer == 0:  # the rounding baseline's decoder: nearest token embedding
            e = teacher.embeddings
            plain = h_hat - offsets
            nearest = ((plain * plain).sum(-1, keepdim=True) - 2 * plain @ e.T + (e * e).sum(-1)).argmin(-1)
            sums["round_correct"] = sums.get("round_correct", 0.0) + float(((nearest == ids).float() * weight).sum())
        # next-token cross-entropy of the frozen upper stack: position i predicts i + 1
        pair = mask[:, 1:].float()
        for key, states in (("ce", h_hat), ("ref_ce", hl)):
            logits = teacher.backbone.run_from(layer, states, attention_mask=mask)[:, :-1].float()
            ce = F.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
            sums[key] += float((ce * pair).sum())
        sums["ce_count"] += float(pair.sum())
        for s in NOISY_SNRS:
            z = channel(bridge.table(), ids, torch.full(ids.shape, s, device=ids.device), generator=g)
            noisy_hat = bridge.sample(bridge.source(z, teacher.embeddings, offsets), generator=g)
            noisy[s][0] += float((((noisy_hat - hl) ** 2).sum(-1) * weight).sum())
    targets = torch.cat(all_targets)
    var_dim = ((targets - targets.mean(0)) ** 2).sum(0).cpu()
    total_var = float(var_dim.sum())
    nmse = sums["err"] / total_var
    if not full:
        return {"layer": layer, "nmse": nmse}
    varying = var_dim > 1e-12 * total_var  # a constant channel has nothing to reconstruct
    ce, ref_ce = sums["ce"] / sums["ce_count"], sums["ref_ce"] / sums["ce_count"]
    return {"layer": layer, "nmse": nmse, "nmse_dim": float((err_dim[varying] / var_dim[varying]).mean()),
            "ce": ce, "ref_ce": ref_ce, "delta_ce": ce - ref_ce,
            "nmse_noisy": sum(v[0] / total_var for v in noisy.values()) / len(noisy),
            "nmse_by_snr": {str(s): v[0] / total_var for s, v in noisy.items()},
            "val_positions": int(targets.shape[0]), "seed": seed,
            **({"round_accuracy": sums["round_correct"] / int(targets.shape[0])} if layer == 0 else {})}


def fit_bridge(backbone, layer: int, train_blocks, val_blocks, cfg: BridgeConfig, train_cfg: TrainConfig,
               out: Path, identity: dict, progress=None, world: World = SINGLE) -> dict:
    """Train (or resume) the bridge at `layer` into `out`, validate, write metrics and the curve
    (with several ranks: data parallel; rank 0 writes every file)."""
    out = Path(out)
    teacher = Teacher(backbone, layer)
    device = backbone.input_device
    pad_id = backbone.tokenizer.pad_token_id if backbone.tokenizer.pad_token_id is not None else 0
    batches, val = BlockBatches(train_blocks, pad_id, device), BlockBatches(val_blocks, pad_id, device)
    support = corpus_support([*train_blocks, *val_blocks], backbone.tokenizer) if cfg.vocab == "corpus" else None
    if support is not None:
        cfg = replace(cfg, support_size=len(support))
    record = {"kind": "bridge", "bridge": asdict(cfg), "training": asdict(train_cfg), "identity": identity}
    if (out / CONFIG).is_file():
        old = read_config(out)
        if old.get("identity") != identity or old.get("bridge") != record["bridge"]:
            keys = sorted(k for k in {**old.get("identity", {}), **identity}
                          if old.get("identity", {}).get(k) != identity.get(k))
            raise BadInput(f"{out} holds a bridge for another backbone, layer or shape "
                           f"(differs in: {', '.join(keys) or 'bridge settings'}); use another --out or --force")
        if old.get("training") == record["training"] and (out / METRICS).is_file():
            return json.loads((out / METRICS).read_text())  # finished (a resumed sweep keeps such layers)
    world.barrier()  # every rank has checked the directory before rank 0 writes into it
    bridge = HiddenBridge(cfg, seed=train_cfg.seed).to(device)
    if support is not None:
        bridge.set_support(support.to(device))
    fit_statistics(bridge, teacher, batches, train_cfg.batch_size, train_cfg.seed)
    if world.is_main:
        out.mkdir(parents=True, exist_ok=True)
        save_bridge_config(out, cfg, {"training": record["training"], "identity": identity})
    # the plateau rule watches the clean-condition nmse on (at most) the first 8 validation blocks
    watched = BlockBatches(val_blocks[:8], pad_id, device)
    trained = train(bridge, training_loss(bridge, teacher, batches, train_cfg.batch_size), train_cfg, out, device,
                    progress=progress, world=world,
                    evaluate=lambda model: validate(model, teacher, watched, train_cfg.batch_size, full=False)["nmse"])
    load_weights(bridge, out / WEIGHTS)  # validate the EMA weights
    bridge.eval()
    metrics = validate(bridge, teacher, val, train_cfg.batch_size)
    metrics.update(training_summary(trained))
    if world.is_main:
        write_training_record(out, metrics, trained, f"bridge at layer {layer}")
    return metrics
