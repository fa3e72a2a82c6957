"""Train one hidden-state bridge at a layer of a frozen backbone, then validate it.

The teacher states h_l come from a run's `TeacherStates` (bridges/states.py: the frozen prefix
run once per run for every layer its bridges need). The condition SNRs from the DSL mixed
distribution: a `regression_frac` share of sequences is the plain regression validation scores
(clean condition and tau = 0 together), the rest has a `clean_frac` share at clean condition and
a `tau_zero` share at tau = 0. The plateau rule watches the stopping split (step 0 included)
and keeps the best EMA weights by it. Validation runs on the validation split with a fixed seed
and writes `metrics.json`: nmse at clean condition (1 - R^2) and per-channel nmse, both for the
K-step sampler (the bridge as sampled) and its first step alone (the tau = 0 prediction), the
upper stack's next-token cross-entropy on the reconstruction (`ce`) and on the true states
(`ref_ce`, once per run), their difference, nmse averaged over a grid of condition SNRs, and
the training objective itself (and at tau = 0 alone: the posterior mean's part).
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch

from geoprobe.bridges.channel import channel, draw_snr
from geoprobe.bridges.checkpoint import CONFIG, METRICS, read_config, save_config
from geoprobe.bridges.controls import token_lookup
from geoprobe.bridges.hidden import BridgeConfig, HiddenBridge, OLDER_BRIDGES, Teacher
from geoprobe.bridges.nn import full_precision
from geoprobe.bridges.scoring import fitted_rows, generated_rows, massive_threshold, scored_rows, state_losses
from geoprobe.bridges.states import Split, TeacherStates
from geoprobe.bridges.train import TrainConfig, fit_model, plateau_every, warmup_for
from geoprobe.device import upload
from geoprobe.distributed import SINGLE, World
from geoprobe.errors import BadInput
from geoprobe.geometry import GeometrySettings
from geoprobe.store import differing_keys
from geoprobe.verdict import beats_lookup

NOISY_SNRS = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
STATISTICS_ROWS = 65_536  # training positions the standardisation and the carry are fitted on


def bridge_training(*, steps: int, batch_size: int, lr: float, seed: int, until: str, eval_every: int,
                    precision: str = "auto", plateau_rel: float = TrainConfig.plateau_rel,
                    min_steps: int | None = None, plateau_scale: str = TrainConfig.plateau_scale) -> TrainConfig:
    """A bridge run's training settings, checked: warmup a tenth of the steps (at most 100), EMA
    0.99 (a bridge trains for hundreds of steps, not the DSL's thousands), checkpoints every <=
    100 steps, and with `until` "plateau" a constant rate after the warmup and the plateau rule
    every `eval_every` steps (default steps/40, at most 50) from 5 evaluations, twice the warmup
    and twice the 1 / (1 - EMA) = 100 steps the kept EMA weights average over on (a run shorter
    than 200 steps trains to its cap: the curve the rule watches would still be the average
    catching up); with "steps" a cosine to zero over exactly `steps`. `plateau_rel`,
    `plateau_scale` and `min_steps` (None: the rule above) let a comparison hold every row to one
    stopping rule (docs/baselines.md). A bridge whose cap grows keeps the keys derived from its
    old cap (geoprobe.workflows.sweep.training_for), so a larger --steps only moves the cap."""
    warmup, ema, every = warmup_for(steps), 0.99, plateau_every(steps, until, eval_every)
    first = max(2 * warmup, 5 * every, 2 * round(1 / (1 - ema)))  # the first step the plateau rule may stop at
    cfg = TrainConfig(steps=steps, batch_size=batch_size, lr=lr, warmup=warmup, seed=seed,
                      save_every=max(1, min(100, steps)), ema=ema, eval_every=every,
                      min_steps=first if min_steps is None else min_steps,
                      plateau_rel=plateau_rel, plateau_scale=plateau_scale, precision=precision,
                      schedule="constant" if every else "cosine", eval_at_start=True)
    cfg.validate()
    return cfg


def positions_weight(mask: torch.Tensor) -> torch.Tensor:
    """Positions >= 1 that are not padding: what the bridge generates and is scored on."""
    weight = mask.clone().float()
    weight[:, 0] = 0
    return weight


def pad_id_of(backbone) -> int:
    return backbone.tokenizer.pad_token_id if backbone.tokenizer.pad_token_id is not None else 0


def corpus_support(blocks, tokenizer) -> torch.Tensor:
    """The sorted backbone ids that occur in `blocks`, with the tokenizer's special tokens: the
    tokens a converter restricted to the corpus can put mass on."""
    ids = np.unique(np.concatenate([np.asarray(b.tokens) for b in blocks] + [np.asarray(tokenizer.all_special_ids)]))
    return torch.from_numpy(ids.astype(np.int64))


def fit_statistics(bridge: HiddenBridge, states: TeacherStates, massive_factor: float | None = None,
                   rows: int = STATISTICS_ROWS) -> None:
    """The bridge's standardisation, carry and massive-row norm from (at most `rows`, evenly
    spaced) generated training positions, the massive ones left out as validation leaves them;
    a lookup carry's table from every training row the lookup control is fitted on."""
    layer = bridge.cfg.layer
    index = generated_rows(states.train)
    index = index[torch.linspace(0, len(index) - 1, min(rows, len(index))).long()]
    source, target = states.train.states[0][index], states.train.states[layer][index]
    limit = massive_threshold(target, massive_factor)
    keep = target.norm(dim=1) <= limit
    device = bridge.source_mean.device
    bridge.set_statistics(source[keep].to(device), target[keep].to(device), limit)
    if bridge.cfg.carry == "lookup":  # the lookup control's own table, on the rows it is fitted on
        named = bridge.support if bridge.cfg.support_size else torch.arange(bridge.cfg.vocab_size)
        if bridge.unseen_row:  # an id no token has: the lookup's overall mean, for tokens outside the support
            named = torch.cat([named, torch.tensor([bridge.cfg.vocab_size], device=named.device)])
        fitted = fitted_rows(states.train, layer, massive_factor)
        bridge.set_lookup(token_lookup(states.train, layer, named.cpu(), fitted).to(device))


def draw_conditions(cfg: BridgeConfig, batch: int, length: int, generator: torch.Generator) -> dict:
    """The random numbers of one evaluation of the bridge's objective, for a whole (global) batch,
    always in this order: condition SNRs from the DSL mixed distribution, which sequences sit at
    clean condition, the channel noise, tau (0 for a `tau_zero` share, else U[0, 1]), which
    sequences are the plain regression (clean and tau = 0: `regression_frac`), and the bridge
    noise (drawn last, and only when sigma_b > 0: skipping it changes nothing else)."""
    snr = draw_snr("mixed", (batch, length), generator=generator)
    clean = torch.rand(batch, generator=generator) < cfg.clean_frac
    noise = torch.randn((batch, length, cfg.d_tok), generator=generator)
    tau = torch.rand(batch, generator=generator)
    tau = torch.where(torch.rand(batch, generator=generator) < cfg.tau_zero, torch.zeros_like(tau), tau)
    regression = torch.rand(batch, generator=generator) < cfg.regression_frac
    clean, tau = clean | regression, torch.where(regression, torch.zeros_like(tau), tau)
    eps = torch.randn((batch, length, cfg.hidden_size), generator=generator) if cfg.sigma_b > 0 else None
    return {"snr": snr, "clean": clean, "noise": noise, "tau": tau, "eps": eps, "regression": regression}


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


TAU_GRID = 8  # the validation objective's path times: the midpoints of 8 equal bins of (0, 1)


def stochastic(cfg: BridgeConfig) -> bool:
    """Whether a bridge diffuses in the hidden-state space (sigma_b > 0): its plateau rule watches
    its validation objective and its posterior mean (tau = 0) is what must beat the lookup."""
    return cfg.sigma_b > 0


@torch.no_grad()
def grid_objective(bridge: HiddenBridge, teacher: Teacher, split: Split, batch_size: int, seed: int = 0,
                   grid: int = TAU_GRID) -> float:
    """The bridge's training objective on a held-out split, with tau integrated on a fixed grid.

    The expectation over tau of the training loss, by the midpoint rule on `grid` bins of (0, 1)
    plus the point mass at tau = 0 the objective puts on a sequence (`tau_zero`, or 1 for a
    regression row), under fixed draws of everything else: each batch's condition SNRs, clean
    flags, channel noise and bridge noise come from a generator seeded by (seed, batch index)
    alone. Two evaluations of the same weights therefore agree exactly, whatever ran before.
    Positions >= 1, massive target rows left out as in training."""
    return _grid_pass(bridge, teacher, split, batch_size, seed, grid, posterior=False)[0]


@torch.no_grad()
def grid_objectives(bridge: HiddenBridge, teacher: Teacher, split: Split, batch_size: int, seed: int = 0,
                    grid: int = TAU_GRID) -> dict:
    """`objective` (grid_objective's number, the same bits) and, from the same pass and draws,
    `objective_tau0`: the objective with every tau at 0, i.e. the posterior mean's error under the
    objective's own conditions, which is a regression's objective (for a regression, whose rows
    are all at tau = 0, the two are equal). objective - objective_tau0 is what the path's tau > 0
    terms change: what the diffusion objective adds beyond a regression's loss (method.md,
    amendment 14)."""
    total, posterior = _grid_pass(bridge, teacher, split, batch_size, seed, grid, posterior=True)
    return {"objective": total, "objective_tau0": posterior}


def _grid_pass(bridge: HiddenBridge, teacher: Teacher, split: Split, batch_size: int, seed: int, grid: int, *,
               posterior: bool) -> tuple[float, float | None]:
    """grid_objective's pass: (the objective, and with `posterior` the objective at tau = 0 alone).
    The tau = 0 forward draws nothing, so computing it changes none of the other terms' draws."""
    cfg, layer = bridge.cfg, bridge.cfg.layer
    taus = (torch.arange(grid, dtype=torch.float32) + 0.5) / grid
    total = count = at_tau0 = 0.0
    device = teacher.backbone.input_device
    for index, (ids, mask, got) in enumerate(split.fixed(batch_size, (layer,), pad_id_of(teacher.backbone), device)):
        g = torch.Generator().manual_seed(seed * 1_000_003 + index)
        draws = draw_conditions(cfg, *ids.shape, g)
        # the weight of tau = 0 in each row's expectation: 1 for a regression row, tau_zero for the others
        at_zero = torch.where(draws["regression"], 1.0, cfg.tau_zero)
        with full_precision(ids.device):
            z = channel(bridge.table(), ids, upload(draws["snr"], ids.device), noise=draws["noise"])
            a = bridge.source(z, teacher.embeddings, teacher.offsets(ids.shape[1]), ids, draws["clean"])
        target = got[layer]
        weight = bridge.scored(target, positions_weight(mask))
        seq = torch.zeros_like(weight)
        mass = bool(at_zero.any())  # the tau = 0 term, where a row has that mass (none has with tau_zero 0)
        if mass or posterior:
            still = torch.zeros_like(target) if cfg.sigma_b > 0 else None  # at tau = 0 the bridge noise is 0
            first = bridge.position_errors(a, target, torch.zeros(len(ids)), still)
            at_tau0 += float((first * weight).sum())
            if mass:
                seq = upload(at_zero, ids.device)[:, None] * first
        for tau in taus:
            eps = torch.randn(target.shape, generator=g) if cfg.sigma_b > 0 else None
            err = bridge.position_errors(a, target, tau.expand(len(ids)), eps)
            seq = seq + upload((1 - at_zero) / grid, ids.device)[:, None] * err
        total += float((seq * weight).sum())
        count += float(weight.sum())
    return total / max(count, 1.0), (at_tau0 / max(count, 1.0) if posterior else None)


def training_loss(bridge: HiddenBridge, teacher: Teacher, states: TeacherStates, batch_size: int):
    """The loss of one step, from the cached teacher states. Every random number is drawn for the
    global batch and a rank keeps its rows (`shard`), padded to the global batch's length: any
    world size computes the same loss."""
    train_split, layer = states.train, bridge.cfg.layer
    pad_id, device = pad_id_of(teacher.backbone), teacher.backbone.input_device

    def loss_fn(model, generator, shard):
        chosen = torch.randint(0, len(train_split), (batch_size,), generator=generator).tolist()
        length = max(len(train_split.blocks[i].tokens) for i in chosen)
        positions = sum(len(train_split.blocks[i].tokens) - 1 for i in chosen)  # positions_weight's, whole batch
        ids, mask, got = train_split.batch(shard.rows(chosen), (layer,), pad_id, device, length=length)
        draws = {k: None if v is None else shard.rows(v)
                 for k, v in draw_conditions(model.cfg, batch_size, length, generator).items()}
        return objective(model, teacher, ids, mask, got[layer], draws, denominator=max(positions, 1) / shard.count)

    return loss_fn


def reconstruct(bridge: HiddenBridge, teacher: Teacher, ids: torch.Tensor, target: torch.Tensor,
                generator: torch.Generator, steps: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(h^ at clean condition after `steps` sampler steps, position offsets); position 0 (BOS) is
    the backbone's, never generated."""
    offsets = teacher.offsets(ids.shape[1])
    clean = torch.ones(len(ids), dtype=torch.bool)  # on the host, as source() wants it
    z = torch.zeros(*ids.shape, bridge.cfg.d_tok, device=ids.device)
    h_hat = bridge.sample(bridge.source(z, teacher.embeddings, offsets, ids, clean), steps=steps, generator=generator)
    h_hat[:, 0] = target[:, 0]
    return h_hat, offsets


MASSIVE_FACTOR = GeometrySettings.massive_factor  # the scan's default rule for massive rows


@torch.no_grad()
def validate(bridge: HiddenBridge, teacher: Teacher, split: Split, batch_size: int, *, seed: int = 0,
             full: bool = True, massive_factor: float | None = MASSIVE_FACTOR, ref_ce: float | None = None,
             steps: int | None = None) -> dict:
    """Validation losses on a fixed held-out split of cached states, with a fixed seed.

    `full=False` gives the clean-condition nmse and nmse_dim of the K-step sample only (of the
    `steps`-step one when given: 1 is a stochastic bridge's posterior mean); `full`
    adds the rest (`ref_ce`, the frozen model's own loss, computed once per run). The state
    losses score the positions >= 1 whose true state is not massive (the scan's rule,
    `massive_factor`; None scores every position):
    * nmse = sum |h^ - h|^2 / sum |h - mean|^2 (a channel with most of the variance dominates it);
      nmse_dim = that ratio per channel, averaged over channels; both for the K-step sample and,
      as `_1step`, for the tau = 0 prediction (a stochastic bridge's posterior mean);
    * crps_dim (stochastic bridges): the K-step samples' CRPS per channel over its spread;
    * nmse_noisy: nmse at condition SNRs 0.5-16;
    * objective: the training objective with tau on a fixed grid (`grid_objective`), and
      objective_tau0: the same with every tau at 0, the posterior mean's part (`grid_objectives`);
    * ce: the upper stack's next-token loss on the reconstruction, over every position >= 1.
    """
    g = torch.Generator().manual_seed(seed)
    layer = bridge.cfg.layer
    one_step = full and bridge.cfg.bridge_steps > 1
    spread = full and stochastic(bridge.cfg)  # a second K-step sample per batch: the CRPS needs two
    targets, errors, errors_1, noisy, rounded, crps = [], [], [], {s: [] for s in NOISY_SNRS}, [], []
    sums = {"ce": 0.0, "ce_count": 0.0}
    device = teacher.backbone.input_device
    for ids, mask, got in split.fixed(batch_size, (layer,), pad_id_of(teacher.backbone), device):
        hl = got[layer]
        h_hat, offsets = reconstruct(bridge, teacher, ids, hl, g, steps=steps)
        weight = positions_weight(mask)
        keep = weight.bool()
        targets.append(hl[keep].cpu())
        errors.append(((h_hat - hl) ** 2)[keep].cpu())
        if not full:
            continue
        if one_step:
            errors_1.append(((reconstruct(bridge, teacher, ids, hl, g, steps=1)[0] - hl) ** 2)[keep].cpu())
        if spread:  # per channel: E|X - h| - |X - X'| / 2 from two samples, the CRPS's unbiased estimate
            other = reconstruct(bridge, teacher, ids, hl, g)[0]
            crps.append(crps_pair(h_hat, other, hl)[keep].cpu())
        if layer == 0:  # the rounding baseline's decoder: nearest token embedding
            e = teacher.embeddings
            plain = h_hat - offsets
            nearest = ((plain * plain).sum(-1, keepdim=True) - 2 * plain @ e.T + (e * e).sum(-1)).argmin(-1)
            rounded.append((nearest == ids)[keep].cpu())
        # next-token cross-entropy of the frozen upper stack: position i predicts i + 1
        pair = mask[:, 1:].float()
        final = teacher.backbone.final_from(layer, h_hat, attention_mask=mask)[:, :-1]
        sums["ce"] += float((teacher.backbone.token_losses(final, ids[:, 1:]) * pair).sum())  # the head in chunks
        sums["ce_count"] += float(pair.sum())
        for s in NOISY_SNRS:
            z = channel(bridge.table(), ids, torch.full(ids.shape, s, device=ids.device), generator=g)
            noisy_hat = bridge.sample(bridge.source(z, teacher.embeddings, offsets), generator=g)
            noisy[s].append(((noisy_hat - hl) ** 2).sum(-1)[keep].cpu())
    target = torch.cat(targets).double()
    scored = scored_rows(target, massive_factor)
    target = target[scored]
    losses = state_losses(target, torch.cat(errors).double()[scored])
    if not full:
        return {"layer": layer, **losses}
    if one_step:
        losses.update({f"{k}_1step": v for k, v in state_losses(target, torch.cat(errors_1).double()[scored]).items()})
    else:
        losses.update(nmse_1step=losses["nmse"], nmse_dim_1step=losses["nmse_dim"])
    total_var = float(((target - target.mean(0)) ** 2).sum())
    ce = sums["ce"] / sums["ce_count"]
    by_snr = {str(s): float(torch.cat(v).double()[scored].sum()) / total_var for s, v in noisy.items()}
    if spread:
        losses["crps_dim"] = crps_dim(target, torch.cat(crps).double()[scored])
    return {"layer": layer, **losses, "ce": ce, "ref_ce": ref_ce, "delta_ce": None if ref_ce is None else ce - ref_ce,
            "nmse_noisy": sum(by_snr.values()) / len(by_snr), "nmse_by_snr": by_snr,
            **grid_objectives(bridge, teacher, split, batch_size, seed),
            "val_positions": int(scored.sum()), "val_massive_rows": int((~scored).sum()), "val_seed": seed,
            **({"round_accuracy": float(torch.cat(rounded)[scored].float().mean())} if layer == 0 else {})}


@torch.no_grad()
def sample_scores(bridge: HiddenBridge, teacher: Teacher, split: Split, batch_size: int, steps: int, seed: int = 0,
                  massive_factor: float | None = MASSIVE_FACTOR, noisy: bool = False) -> dict:
    """nmse_dim and crps_dim of the bridge's `steps`-step samples at clean condition on a split
    (two samples per block, a fixed seed): how K changes the samples of one trained bridge.

    `noisy` adds crps_dim at each condition SNR of NOISY_SNRS (`crps_dim_by_snr`) and their mean
    (`crps_dim_noisy`): at clean condition the state is a function of the tokens, so the exact
    law is a point; under a noisy channel p(h | z) is a real mixture over tokens, whose spread a
    proper score can judge."""
    g, g_noisy = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed + 1)  # noisy draws apart
    layer = bridge.cfg.layer
    targets, errors, crps = [], [], []
    by_snr = {s: [] for s in NOISY_SNRS} if noisy else {}
    for ids, mask, got in split.fixed(batch_size, (layer,), pad_id_of(teacher.backbone), teacher.backbone.input_device):
        hl, keep = got[layer], positions_weight(mask).bool()
        first, second = (reconstruct(bridge, teacher, ids, hl, g, steps=steps)[0] for _ in range(2))
        targets.append(hl[keep].cpu())
        errors.append(((first - hl) ** 2)[keep].cpu())
        crps.append(crps_pair(first, second, hl)[keep].cpu())
        offsets = teacher.offsets(ids.shape[1])
        for s, rows in by_snr.items():  # one channel draw per SNR, two samples from it
            z = channel(bridge.table(), ids, torch.full(ids.shape, s, device=ids.device), generator=g_noisy)
            a = bridge.source(z, teacher.embeddings, offsets)
            one, two = (bridge.sample(a, steps=steps, generator=g_noisy) for _ in range(2))
            rows.append(crps_pair(one, two, hl)[keep].cpu())
    target = torch.cat(targets).double()
    scored = scored_rows(target, massive_factor)
    scores = {"steps": steps, "nmse_dim": state_losses(target[scored], torch.cat(errors).double()[scored])["nmse_dim"],
              "crps_dim": crps_dim(target[scored], torch.cat(crps).double()[scored])}
    if noisy:
        scores["crps_dim_by_snr"] = {str(s): crps_dim(target[scored], torch.cat(v).double()[scored])
                                     for s, v in by_snr.items()}
        scores["crps_dim_noisy"] = float(np.mean(list(scores["crps_dim_by_snr"].values())))
    return scores


def crps_pair(one: torch.Tensor, two: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """Per entry, the CRPS's unbiased estimate from two independent samples of the law:
    E|X - h| - E|X - X'| / 2."""
    return ((one - h).abs() + (two - h).abs() - (one - two).abs()) / 2


def crps_dim(target: torch.Tensor, crps: torch.Tensor) -> float:
    """The samples' continuous ranked probability score per channel, over that channel's standard
    deviation, averaged over the varying channels (float64 (n, d) targets and per-position CRPS
    estimates). A proper score: the exact conditional law minimises it, and a sampler that
    collapses to the mean scores its mean absolute error, which a calibrated spread lowers."""
    std = target.std(0, unbiased=False)
    varying = std > 1e-6 * float(std.max())
    return float((crps.mean(0)[varying] / std[varying]).mean())


# the training settings of records written before a field existed: what those runs did
OLDER_TRAINING = {"plateau_scale": "window"}


def check_bridge_dir(out: Path, cfg: BridgeConfig, train_cfg: TrainConfig, identity: dict) -> bool:
    """Whether `out` already holds this bridge (False: nothing there, or a bridge to train on); a
    bridge for another backbone, layer, shape or training is refused in one line naming the keys
    that differ, except a larger step cap under the plateau rule: a bridge its old cap stopped is
    trained on to the new one (False), one its plateau stopped is finished (True). The support
    size comes from the teacher states, so a check before they exist (`settings_known` of the
    sweep: cfg.support_size 0) leaves it out."""
    if not (out / CONFIG).is_file():
        return False
    old = read_config(out, "bridge")
    # a record from before a field existed holds that field's old value (as load_bridge reads it)
    network, old_network = asdict(cfg), {**OLDER_BRIDGES, **old["network"]}
    if cfg.vocab in ("corpus", "train") and not cfg.support_size:
        old_network["support_size"] = network["support_size"]
    if old.get("identity") != identity or old_network != network:
        keys = differing_keys(old.get("identity", {}), identity) or [
            f"bridge.{k}" for k in differing_keys(old_network, network)]
        raise BadInput(f"{out} holds a bridge for another backbone, layer or shape "
                       f"(differs in: {', '.join(keys)}); use another --out or --force")
    training = {**OLDER_TRAINING, **old["training"]} if old.get("training") else None
    if training != asdict(train_cfg):
        keys = differing_keys(training or {}, asdict(train_cfg))
        if keys != ["steps"] or train_cfg.schedule != "constant" or training["steps"] > train_cfg.steps:
            why = ("" if keys != ["steps"] else
                   " (a fixed budget, --until steps, decays its rate to zero at its --steps: it cannot grow)"
                   if train_cfg.schedule != "constant" else
                   f" (its cap is {training['steps']} steps: a smaller --steps cannot take back trained steps)")
            raise BadInput(f"{out} holds a bridge trained with other settings (differs in: {', '.join(keys)}){why}; "
                           "use another --out, or --force to train it anew")
        # a raised cap (--until plateau): a bridge its old cap stopped goes on (False: not finished);
        # one its plateau stopped is finished, since a larger cap would have stopped it at the same step
        stopped = json.loads((out / METRICS).read_text()).get("stop") if (out / METRICS).is_file() else None
        return stopped != "cap"
    return True


def untrained_objective(bridge: HiddenBridge, teacher: Teacher, split: Split, batch_size: int) -> float | None:
    """The token lookup's own objective: `grid_objective` (validation's seed, so the same draws as
    the trained bridge's) of a bridge not yet trained, whose update is zero, so that it predicts its
    carry, the lookup, at every tau (method.md, amendment 14). None for a bridge whose untrained
    update is not zero or whose carry is not the lookup (then it is not the lookup)."""
    if not (bridge.cfg.residual and bridge.cfg.carry == "lookup"):
        return None
    if bool(bridge.out.weight.any()) or bool(bridge.out.bias.any()):
        raise ValueError("untrained_objective needs a bridge whose update is still zero (its output layer at 0)")
    return grid_objective(bridge, teacher, split, batch_size)


def fit_bridge(backbone, layer: int, states: TeacherStates, *, cfg: BridgeConfig, train_cfg: TrainConfig,
               out: Path, identity: dict, progress=None, world: World = SINGLE,
               massive_factor: float | None = MASSIVE_FACTOR, controls: dict | None = None) -> dict:
    """Train (or resume) the bridge at `layer` into `out` from the run's cached teacher states,
    validate, write metrics and the curve (with several ranks: data parallel; rank 0 writes every
    file).

    The plateau rule watches, on the stopping split (held-out blocks never reported; the
    validation split when there is none), a regression's per-channel nmse (the scalar nmse is
    dominated by massive channels), or a diffusion bridge's grid objective, which it stops on only
    when its posterior mean's nmse_dim is flat too (`guard_curve` in metrics.json); the best EMA
    weights by the watched score are the ones kept and validated.
    `controls` (the layer's closed-form controls, `geoprobe.bridges.controls.layer_controls`) go into
    metrics.json beside the bridge's losses, with whether the bridge beats the token lookup, and
    `control_lookup_objective`, the untrained bridge's objective (`untrained_objective`).
    A directory holding a bridge trained with other settings is refused, naming the keys that
    differ: its weights are never handed back under new settings. Returns the metrics (None on
    data-parallel ranks other than 0, which neither validate nor write)."""
    out = Path(out)
    if check_bridge_dir(out, cfg, train_cfg, identity) and (out / METRICS).is_file():
        return json.loads((out / METRICS).read_text())  # finished (a resumed sweep keeps such layers)
    if layer not in states.layers:  # the states are read from here on (a finished bridge never needs them)
        raise BadInput(f"layer {layer} is not among the cached teacher states (layers {list(states.layers)})")
    teacher = Teacher(backbone, layer)
    device = backbone.input_device
    blocks = [*states.train.blocks, *([] if cfg.vocab == "train" else [*states.stop.blocks, *states.val.blocks])]
    support = corpus_support(blocks, backbone.tokenizer) if cfg.vocab in ("corpus", "train") else None
    if support is not None:
        cfg = replace(cfg, support_size=len(support))
        check_bridge_dir(out, cfg, train_cfg, identity)  # a resumed folder: the support size too
    record = {"network": asdict(cfg), "training": asdict(train_cfg), "identity": identity}
    world.barrier()  # every rank has checked the directory before rank 0 writes into it
    bridge = HiddenBridge(cfg, seed=train_cfg.seed).to(device)
    if support is not None:
        bridge.set_support(support.to(device))
    fit_statistics(bridge, states, massive_factor)
    if world.is_main:
        out.mkdir(parents=True, exist_ok=True)
        budget = {"steps": train_cfg.steps, "batch_size": train_cfg.batch_size, "seq_len": identity.get("seq_len")}
        save_config(out, "bridge", cfg, record["training"], budget, identity)
    watched = states.stop if len(states.stop) else states.val
    lookup_objective = untrained_objective(bridge, teacher, states.val, train_cfg.batch_size) if world.is_main else None

    def score(model, _trained) -> dict:
        metrics = validate(model, teacher, states.val, train_cfg.batch_size, massive_factor=massive_factor,
                           ref_ce=states.ref_ce)
        metrics.update(seed=train_cfg.seed, stop_positions=sum(len(b.tokens) - 1 for b in states.stop.blocks))
        metrics["bridge_kind"] = "diffusion" if stochastic(cfg) else "regression"
        if lookup_objective is not None:
            metrics["control_lookup_objective"] = lookup_objective
        if controls:
            metrics.update(controls)
            # a sample's error includes the posterior's spread: the posterior mean (tau = 0) must beat the lookup
            learned = metrics["nmse_dim_1step" if stochastic(cfg) else "nmse_dim"]
            metrics["beats_lookup"] = beats_lookup(learned, controls.get("control_lookup_nmse_dim"),
                                                   controls.get("control_lookup_ridge_nmse_dim"))
        return metrics

    def watch(model):  # the plateau rule's score: a diffusion bridge's objective, guarded by its posterior mean's nmse_dim
        if stochastic(cfg):  # the objective has a floor (noisy rows, tau > 0): it flattens while the mean still learns
            return (grid_objective(model, teacher, watched, train_cfg.batch_size),
                    validate(model, teacher, watched, train_cfg.batch_size, full=False, massive_factor=massive_factor,
                             steps=1)["nmse_dim"])
        return validate(model, teacher, watched, train_cfg.batch_size, full=False, massive_factor=massive_factor)["nmse_dim"]

    return fit_model(bridge, training_loss(bridge, teacher, states, train_cfg.batch_size), train_cfg, out=out,
                     device=device, score=score, title=f"bridge at layer {layer}", progress=progress, world=world,
                     watch=watch)
