"""Bridges over a run: where the data come from, one bridge per layer, and the layer sweep that
asks whether the geometry score predicts the bridge's validation loss."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from geoprobe.bridges.controls import layer_controls as fit_controls
from geoprobe.bridges.hidden import CEILING, REGRESSION, BridgeConfig, Teacher, check_bridge_flags
from geoprobe.bridges.states import plan_room, pool_on_device, shared_teacher_states, teacher_states
from geoprobe.backbone import check_bridge_layer, check_device_map, load_backbone, parse_layers
from geoprobe.corpus import iter_blocks, read_documents
from geoprobe.device import choose_determinism
from geoprobe.distributed import SINGLE, World, world_from
from geoprobe.errors import BadInput
from geoprobe.files import clear, holding, read_json, write_json_atomic
from geoprobe.events import note
from geoprobe.ranking import bridge_choice, has_massive_channels, layer_scores, passed_over_line
from geoprobe.settings import split_flags
from geoprobe.store import check_shards, read_manifest
from geoprobe.tracking import check_log_to, tracking


def layer_dir(root: Path, layer: int) -> Path:
    """root/bridges/layer-NN: a layer's bridges (one folder per seed), its ceiling and its controls."""
    return Path(root) / "bridges" / f"layer-{layer:02d}"


def bridge_dir(root: Path, layer: int, seed: int = 0) -> Path:
    """One directory per layer and seed: seeds are replicates, never each other's resume."""
    return layer_dir(root, layer) / f"seed-{seed}"


def ranking_rows(run: Path) -> list[dict]:
    path = Path(run) / "ranking.csv"
    if not path.is_file():
        raise BadInput(f"{run} has no finished scan (no ranking.csv): run `geoprobe scan` or pass --layer")

    def value(key: str, text: str):
        if key == "bridgeable":
            return text == "True"
        return int(text) if key in ("layer", "rank", "massive") else float(text)

    with open(path) as handle:
        return [{k: value(k, v) for k, v in row.items()} for row in csv.DictReader(handle)]


def chosen_layer(run: Path) -> int:
    """The best-ranked layer that can host a bridge (the ranking's chosen layer). The scan ranks
    every stored layer, the last block's output included, but a bridge needs a block above it:
    that layer is passed over, and a note says so."""

    blocks = read_manifest(run)["model"]["num_layers"]
    rows = [{**r, "bridgeable": r["layer"] < blocks} for r in ranking_rows(run)]  # runs ranked before the column too
    try:
        best, passed_over = bridge_choice(rows)
    except BadInput:
        raise BadInput(f"{run}: no scanned layer has blocks above it (layers 0..{blocks - 1} can host a bridge)") from None
    if passed_over:
        note(passed_over_line({"passed_over": passed_over, "chosen_layer": best["layer"]}))
    return best["layer"]


@dataclass
class Source:
    """The backbone and the corpus blocks a bridge trains on (`train_blocks`), stops on
    (`stop_blocks`, never reported) and is validated on (`val_blocks`)."""

    backbone: object
    model: str
    corpus: str
    seq_len: int
    train_blocks: list
    val_blocks: list
    scanned_layers: list | None
    stop_blocks: list
    held_out: dict  # how the held-out blocks were drawn (part of each bridge's identity)
    massive_factor: float | None  # the scan's rule for rows not scored (None: all scored)


def open_source(run: Path | None, model: str | None = None, corpus: str | None = None, *, seq_len: int | None = None,
                device: str = "auto", dtype: str = "auto", train_tokens: int = 262_144, val_blocks: int = 16, stop_blocks: int = 8,
                device_map: str | None = None, doc_blocks: int | None = None, layers=None, held=None) -> Source:
    """The data of a bridge. Over a scanned run the held-out blocks are drawn as the scan drew its
    states: blocks of the scan's length (unless `seq_len` says otherwise), at most as many per
    document as the scan took (`--doc-blocks`), split by the scan's seed. The split never depends
    on the bridge's training seed, so seed replicates share their validation data. `doc_blocks`
    overrides the blocks per document of the held-out data (default: the scan's; 0 = all). The
    training pool holds the first blocks of the training split up to `train_tokens` positions: the
    teacher states of all of them are cached (bridges/states.py): with `layers` (a --layers spec
    or a list), their room is planned, and refused in one line, before the backbone loads; `held`:
    the layers one rank keeps when the ranks split the layers among them (None: all)."""

    scanned, data_seed, per_doc = None, 0, 0
    if run is not None:

        manifest = read_manifest(run)
        check_shards(run, manifest)  # the ranking that picks the layer came from these shards
        config = manifest["config"]
        model, corpus = model or config["model"], corpus or config["corpus"]
        seq_len, data_seed, per_doc = seq_len or config["seq_len"], config.get("seed", 0), config.get("doc_blocks", 0)
        scanned = manifest["layers"]
    if model is None or corpus is None:
        raise BadInput("pass --run RUN, or both --model and --corpus")
    seq_len, per_doc = seq_len or 128, per_doc if doc_blocks is None else doc_blocks
    if layers is not None:  # the pool is at most train_tokens positions, the held-out blocks one length each
        plan_room(model, layers, max(train_tokens, seq_len) + (stop_blocks + val_blocks) * seq_len, held)
    documents = read_documents(corpus)
    backbone = load_backbone(model, device=device, dtype=dtype, device_map=device_map)
    train, held_out, pooled = [], [], 0
    for block in iter_blocks(documents, backbone.tokenizer, seq_len, data_seed, split="train", val_fraction=0.1):
        if pooled + len(block.tokens) > train_tokens and train:
            break
        train.append(block)
        pooled += len(block.tokens)
    for block in iter_blocks(documents, backbone.tokenizer, seq_len, data_seed, split="validation", val_fraction=0.1):
        if not per_doc or block.seq_id < per_doc:
            held_out.append(block)
        if len(held_out) >= stop_blocks + val_blocks:
            break
    if len(held_out) < stop_blocks + val_blocks:  # a corpus of few documents: hold out whole training documents
        kept = {b.doc_id for b in train[:-(stop_blocks + val_blocks - len(held_out))]}
        borrowed = [b for b in train if b.doc_id not in kept and (not per_doc or b.seq_id < per_doc)]
        train = [b for b in train if b.doc_id in kept]
        held_out += borrowed[:stop_blocks + val_blocks - len(held_out)]
        if not train or len(held_out) < 2:
            raise BadInput(f"corpus {corpus} is too small to hold out {stop_blocks} stopping and {val_blocks} "
                           f"validation blocks of {seq_len} tokens and still train")
    stop, val = _split_by_document(held_out, stop_blocks)
    how = {"data_seed": data_seed, "doc_blocks": per_doc, "stop_blocks": len(stop), "val_blocks": len(val),
           "train_tokens": train_tokens}
    return Source(backbone, model, corpus, seq_len, train, val, scanned, stop, how, _massive_rule(run))


def _split_by_document(blocks: list, stop_blocks: int) -> tuple[list, list]:
    """(stopping, validation): whole documents to the stopping split until it holds `stop_blocks`
    blocks (at least one document is left to validation), the rest to validation."""
    docs = list(dict.fromkeys(b.doc_id for b in blocks))
    stop_docs, count = set(), 0
    for doc in docs[:-1]:
        if count >= stop_blocks:
            break
        stop_docs.add(doc)
        count += sum(b.doc_id == doc for b in blocks)
    return [b for b in blocks if b.doc_id in stop_docs], [b for b in blocks if b.doc_id not in stop_docs]


def _massive_rule(run: Path | None) -> float | None:
    """The scan's rule for massive rows (its geometry settings; the default without a scan), or
    None when it kept them."""
    from geoprobe.bridges.fit import MASSIVE_FACTOR

    path = Path(run or "") / "geometry.json"
    if run is None or not path.is_file():
        return MASSIVE_FACTOR
    settings = json.loads(path.read_text()).get("settings", {})
    return float(settings.get("massive_factor", MASSIVE_FACTOR)) if settings.get("drop_massive", True) else None


def check_layer(source: Source, layer: int) -> None:
    check_bridge_layer(layer, source.backbone.num_layers)
    if source.scanned_layers is not None and layer not in source.scanned_layers:
        raise BadInput(f"layer {layer} was not scanned in this run (scanned: {source.scanned_layers})")


def identity(source: Source, layer: int) -> dict:
    return {"model": source.model, "model_config_sha256": source.backbone.identity["config_sha256"],
            "layer": layer, "corpus": source.corpus, "seq_len": source.seq_len, **source.held_out,
            "massive_factor": source.massive_factor}


@dataclass(frozen=True)
class BridgeSettings:
    """The flags of `geoprobe bridge` and `sweep`: the bridge's network (a BridgeConfig template
    whose layer, vocabulary and width come from the backbone) and its training."""

    network: BridgeConfig
    steps: int = 4000  # the cap of make results' bridges (docs/method.md, amendment 11; the CLI's since 2026-12-05)
    batch_size: int = 8
    seq_len: int | None = None  # None: the scan's block length over a run, else 128
    lr: float = 1e-3
    seed: int = 0
    until: str = "plateau"
    eval_every: int = 0
    train_tokens: int = 262_144  # the training pool whose teacher states are cached (bridges/states.py)
    plateau_rel: float = 0.02  # the plateau rule's threshold (bridges/train.py)
    plateau_scale: str = "window"  # what the threshold is a share of (bridges/train.py)
    min_steps: int | None = None  # never stop before this step (None: bridges/fit.bridge_training's rule)
    log_to: str = "none"  # where each bridge's training logs (geoprobe.tracking); not part of a bridge's identity
    deterministic: bool = False  # deterministic CUDA kernels (geoprobe.device); not part of a bridge's identity

    def training(self):
        """The training settings (geoprobe.bridges.fit.bridge_training); every flag is checked here,
        before anything loads."""
        from geoprobe.bridges.fit import bridge_training

        check_bridge_flags(self.network)
        check_log_to(self.log_to)
        if self.train_tokens < 1:
            raise BadInput(f"--train-tokens must be at least 1, got {self.train_tokens}")
        return bridge_training(steps=self.steps, batch_size=self.batch_size, lr=self.lr, seed=self.seed,
                               until=self.until, eval_every=self.eval_every, precision=self.network.precision,
                               plateau_rel=self.plateau_rel, min_steps=self.min_steps, plateau_scale=self.plateau_scale)

    def network_at(self, layer: int, backbone) -> BridgeConfig:
        return replace(self.network, layer=layer, vocab_size=backbone.config.vocab_size,
                       hidden_size=backbone.hidden_size)


NETWORK = BridgeConfig(layer=0, vocab_size=0, hidden_size=0)  # the network's defaults live in BridgeConfig


def bridge_settings(**flags) -> BridgeSettings:
    """BridgeSettings from the flags of `bridge`/`sweep` by name (BridgeConfig's network fields
    and BridgeSettings' training fields); everything not given keeps its class default."""

    regression = flags.pop("regression", False)
    network, training = split_flags(flags, BridgeConfig, BridgeSettings)
    network = {**network, **(REGRESSION if regression else {})}
    return BridgeSettings(replace(NETWORK, **network), **training)


Bars = Callable[[str], object] | None  # label -> a progress bar (start/advance/stop), or None


class OnFirstUse:
    """A value made the first time one of its attributes is read: the teacher states of a run
    whose bridges and controls are all done (a rerun of a finished sweep) are never computed."""

    def __init__(self, make):
        self._make, self._value = make, None

    def __getattr__(self, name):
        if self._value is None:
            self._value = self._make()
        return getattr(self._value, name)


def cached_states(source: Source, layers: list[int], bars: Bars = None) -> OnFirstUse:
    """The teacher states of the source's three splits at layer 0 and `layers`: the frozen prefix
    run once (its room checked first, when first needed), for every bridge of the run; on a GPU
    they move onto it where they fit (bridges/states.py `pool_on_device`)."""

    def make():
        bar = bars("teacher states") if bars else None
        try:
            states = teacher_states(source.backbone, source.train_blocks, source.stop_blocks, source.val_blocks,
                                    layers, progress=bar)
            pool_on_device(states, source.backbone.input_device)
            return states
        finally:
            if bar is not None:
                bar.stop()

    return OnFirstUse(make)


CONTROLS_VERSION = "2: mean, lookup, ridge, lookup + ridge (window 4, fewer at large d); fitted on positions >= 1, not massive"


def layer_controls(source: Source, states, layer: int, root: Path, write: bool = True) -> dict:
    """The closed-form controls of `layer` (geoprobe.bridges.controls), kept in root/bridges/layer-NN/
    controls.json for the data they were fitted on: a resumed sweep does not refit them."""

    path = layer_dir(root, layer) / "controls.json"
    wanted = {**identity(source, layer), "controls": CONTROLS_VERSION}
    if path.is_file():
        saved = json.loads(path.read_text())
        if saved.get("identity") == wanted:
            return saved["controls"]
    controls = fit_controls(states, layer, Teacher(source.backbone, layer).embeddings, source.massive_factor)
    if write:  # rank 0 of a data-parallel run; the others computed the same numbers
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, {"identity": wanted, "controls": controls})
    return controls


def controls_saved(source: Source, layer: int, root: Path) -> bool:
    """Whether root's controls.json of `layer` holds the controls of these data (as `layer_controls`
    reads it)."""
    path = layer_dir(root, layer) / "controls.json"
    return path.is_file() and json.loads(path.read_text()).get("identity") == {**identity(source, layer),
                                                                                "controls": CONTROLS_VERSION}


def finished(source: Source, job: tuple, force: bool) -> bool:
    """Whether the bridge of `job` (layer, settings, folder) is trained and recorded (fit_bridge then
    returns its metrics)."""
    from geoprobe.bridges.checkpoint import METRICS
    from geoprobe.bridges.fit import check_bridge_dir

    layer, chosen, out = job
    return not force and bool(check_bridge_dir(out, chosen.network_at(layer, source.backbone),
                                               training_for(out, chosen), identity(source, layer))) \
        and (out / METRICS).is_file()


def rank_work(source: Source, root: Path, world: World, *, layers: list[int], jobs: list, owned: list[int],
              keep: list[int] | None = None, folder: Path, force: bool = False, bars: Bars = None):
    """(teacher states, {layer: controls}) for one rank of several: the pass over `layers` shared
    by the ranks (bridges/states.py `shared_teacher_states`, keeping layer 0 and `keep`, default
    all) when any rank has a bridge of its `jobs` to train or a control of its `owned` layers to
    fit, else None; each layer's controls fitted once, by the rank that owns it, and read back
    from its controls.json by every rank (for the layers of `keep`, default `layers`)."""
    needed = any(not finished(source, job, force) for job in jobs) or not all(controls_saved(source, l, root)
                                                                              for l in owned)
    states = None
    if world.any(needed):
        bar = bars("teacher states") if bars else None
        try:
            states = shared_teacher_states(source.backbone, source.train_blocks, source.stop_blocks, source.val_blocks,
                                           layers, folder=folder, world=world, keep=keep, progress=bar)
        finally:
            if bar is not None:
                bar.stop()
        pool_on_device(states, source.backbone.input_device)
    world.together(lambda: [layer_controls(source, states, layer, root) for layer in owned])
    return states, {layer: layer_controls(source, states, layer, root, write=False) for layer in keep or layers}


# the training keys a bridge derives from its step cap (bridges/fit.py bridge_training) unless given
DERIVED_FROM_STEPS = ("warmup", "save_every", "eval_every", "min_steps")


def training_for(out: Path, settings: BridgeSettings):
    """The training settings of the bridge in `out`: `settings.training()`, except that a bridge
    already there under the plateau rule keeps the keys it derived from its own cap (warmup,
    checkpoint and evaluation intervals, the first step the rule may stop at; those the flags set
    explicitly stay as given). Another --steps then only moves the cap: a larger one resumes the
    run as if it had had that cap from its start, a smaller one is refused naming the steps
    alone (bridges/fit.py check_bridge_dir)."""
    from geoprobe.bridges.checkpoint import CONFIG, read_config

    cfg = settings.training()
    if not (Path(out) / CONFIG).is_file() or cfg.schedule != "constant":
        return cfg
    old = read_config(out, "bridge").get("training") or {}
    if old.get("schedule") != "constant":
        return cfg
    given = {"eval_every": bool(settings.eval_every), "min_steps": settings.min_steps is not None}
    return replace(cfg, **{k: old[k] for k in DERIVED_FROM_STEPS if k in old and not given.get(k)})


def train_bridge(source: Source, layer: int, root: Path, settings: BridgeSettings, states, *,
                 controls: dict | None = None, force: bool = False, bars: Bars = None, out: Path | None = None,
                 world: World | None = None) -> tuple[dict | None, Path]:
    """One bridge at `layer` in root/bridges/layer-NN/seed-S (or `out`) from the run's cached
    teacher `states` (resumed, or refused when it holds another run; cleared first with `force`):
    its validation metrics, with the layer's `controls` (None on data-parallel ranks other than 0),
    and its folder. The caller holds that folder (`bridge_run`, `sweep_run`). `world`: the ranks
    that train it data parallel (default: every rank; SINGLE: this rank alone)."""
    from geoprobe.bridges.fit import fit_bridge

    check_layer(source, layer)
    out = out or bridge_dir(root, layer, settings.seed)
    world = world or world_from()
    if force and world.is_main:
        clear(out)
    world.barrier()
    cfg, train_cfg = settings.network_at(layer, source.backbone), training_for(out, settings)  # after --force clears
    bar = bars(f"bridge layer {layer}") if bars else None
    try:
        with tracking(settings.log_to, train_cfg.batch_size * source.seq_len):
            return fit_bridge(source.backbone, layer, states, cfg=cfg, train_cfg=train_cfg, out=out,
                              identity=identity(source, layer), progress=bar, world=world,
                              massive_factor=source.massive_factor, controls=controls), out
    finally:
        if bar is not None:
            bar.stop()


def refuse_other_bridges(source: Source, plans: list[tuple[int, BridgeSettings, Path]], force: bool) -> None:
    """Before the teacher pass: every (layer, settings, folder) to train whose folder holds a
    bridge of another run is refused in one line (fit_bridge would refuse it only after the
    minutes the states take). With `force` the folders are cleared instead, when each trains."""
    from geoprobe.bridges.fit import check_bridge_dir

    for layer, chosen, out in [] if force else plans:
        check_bridge_dir(out, chosen.network_at(layer, source.backbone), training_for(out, chosen), identity(source, layer))


def ceiling_dir(run: Path, layer: int) -> Path:
    return layer_dir(run, layer) / "ceiling"


def ceiling_settings(settings: BridgeSettings) -> BridgeSettings:
    """The ceiling control: the same network and budget trained as the plain clean regression
    (every sequence at clean condition and tau = 0, one sampler step), seed 0. A training support
    becomes the corpus's: at clean condition both give every token the same carry (a token the
    training blocks lack gets the training mean either way), and so a sweep on a training support
    reuses the corpus-support ceilings a regression sweep trained."""
    vocab = "corpus" if settings.network.vocab == "train" else settings.network.vocab
    return replace(settings, seed=0, network=replace(settings.network, **CEILING, vocab=vocab))


def bridge_run(settings: BridgeSettings, layer: int | None = None, run: Path | None = None, *,
               model: str | None = None, corpus: str | None = None, out: Path | None = None, device: str = "auto", dtype: str = "auto",
               device_map: str | None = None, force: bool = False, bars: Bars = None) -> tuple[dict | None, Path]:
    """What `geoprobe bridge` does: the bridge at `layer` (default: the scan's choice) over a
    scanned run, or over --model/--corpus into `out`, with the layer's controls. Flags are
    checked before the backbone loads."""

    if run is None and out is None:
        raise BadInput("pass --run RUN, or --out DIR with --model and --corpus")
    if layer is None:
        if run is None:
            raise BadInput("without --run, pass --layer")
        layer = chosen_layer(run)
    if layer < 0:
        raise BadInput(f"--layer must be >= 0, got {layer}")
    if run is not None:  # a layer with no block above it: refused before the backbone loads
        check_bridge_layer(layer, read_manifest(run)["model"]["num_layers"])
    settings.training()
    check_device_map(device_map)
    choose_determinism(settings.deterministic)
    world = world_from()
    root = out or run
    with holding(bridge_dir(root, layer, settings.seed), "geoprobe bridge", world.rank):  # before the load
        source = open_source(run, model, corpus, seq_len=settings.seq_len, device=world.device(device, device_map),
                             dtype=dtype, train_tokens=settings.train_tokens, device_map=device_map, layers=[layer])
        check_layer(source, layer)
        refuse_other_bridges(source, [(layer, settings, bridge_dir(root, layer, settings.seed))], force)
        if not world.connected:
            states = cached_states(source, [layer], bars)
            controls = layer_controls(source, states, layer, root)
            return train_bridge(source, layer, root, settings, states, controls=controls, force=force, bars=bars)
        job = (layer, settings, bridge_dir(root, layer, settings.seed))
        states, controls = rank_work(source, root, world, layers=[layer], jobs=[job], force=force, bars=bars,
                                     owned=[layer] if world.is_main else [],
                                     folder=layer_dir(root, layer) / f"teacher-states-seed-{settings.seed}")
        return train_bridge(source, layer, root, settings, states, controls=controls[layer], force=force, bars=bars)


def parse_seeds(spec: str) -> list[int]:
    """--seeds: a list 0,1,2 or a range 0-2 of training seeds (each a replicate of every layer)."""

    try:
        seeds = parse_layers(spec, 10 ** 6)
    except BadInput:
        raise BadInput(f"malformed --seeds {spec!r}: a list 0,1,2 or a range 0-2 of seeds >= 0") from None
    return sorted(set(seeds))


def sweep_run(run: Path, settings: BridgeSettings, layers: str = "all", *, device: str = "auto", dtype: str = "auto",
              force: bool = False, bars: Bars = None, seeds: list[int] | None = None,
              include_source: bool = False, ceiling: bool = False, spread: bool = True) -> dict | None:
    """What `geoprobe sweep` does: the teacher states of every swept layer once, each layer's
    closed-form controls, one bridge per layer and seed (each to its plateau under one step cap;
    with `ceiling` also the ceiling control, one plain-regression network per layer), then the
    verdict (geoprobe.verdict): the pre-registered test of the geometry score against the
    seed-mean losses, its convergence criterion, controls and the seed noise, written to
    sweep.json/sweep.csv with plots. Layer 0 is the source, outside the test unless
    `include_source`. Under torchrun with more than one bridge and `spread`, the ranks split the
    bridges (`spread_bridges`); else each bridge trains data parallel over every rank. Returns
    rows, verdict and the plot (None on ranks other than 0)."""

    settings.training()
    choose_determinism(settings.deterministic)
    seeds = seeds or [settings.seed]
    scores = {r["layer"]: r for r in ranking_rows(run)}
    world = world_from(connect=False)  # the plan below is refused before the ranks connect
    scanned_only = layers.strip() == "all"  # "all": every layer that was scanned and has blocks above it
    chosen = parse_layers(layers, read_manifest(run)["model"]["num_layers"] - 1)
    chosen = [l for l in chosen if l in scores] if scanned_only else chosen
    plans = [(layer, replace(settings, seed=seed), bridge_dir(run, layer, seed)) for seed in seeds for layer in chosen]
    plans += [(layer, ceiling_settings(settings), ceiling_dir(run, layer)) for layer in (chosen if ceiling else [])]
    jobs = sorted(plans, key=lambda p: (p[0], p[2].name == "ceiling", p[1].seed))  # layer by layer
    spreading = spread and world.size > 1 and len(jobs) > 1
    held = max((rank_layers(jobs, world, r) for r in range(world.size)), key=len) if spreading else None
    with holding(run / "bridges", "geoprobe sweep", world.rank):  # one sweep at a time on a run
        source = open_source(run, seq_len=settings.seq_len, device=world.device(device), dtype=dtype,
                             train_tokens=settings.train_tokens, layers=sorted(scores) if scanned_only else layers,
                             held=held)
        world = world_from()
        for layer in chosen:
            check_layer(source, layer)  # every layer before the first bridge trains
        refuse_other_bridges(source, plans, force)
        if spreading:
            rows = spread_bridges(source, run, jobs, world, chosen=chosen, seeds=seeds, scores=scores, force=force,
                                  bars=bars)
        else:
            rows = bridges_in_turn(source, run, plans, world, chosen=chosen, scores=scores, force=force, bars=bars)
        rows.sort(key=lambda r: (r["layer"], r["seed"]))
        if not world.is_main:  # rank 0 writes the sweep
            return None
        verdict = summarise(run, rows, include_source)
        for row in rows:  # the score the test used (z-scored over the tested layers), beside the ranking's
            row["score_tested"] = verdict.get("scores", {}).get("score", {}).get(str(row["layer"]))
        plot = write_sweep(run, rows, verdict, source.model)
    return {"rows": rows, "verdict": verdict, "plot": str(plot)}


def with_ceiling(rows: list[dict], layer: int, metrics: dict) -> None:
    """The ceiling control's numbers of `layer` beside each of its rows."""
    for row in rows:
        if row["layer"] == layer:
            row.update(ceiling_nmse_dim=metrics["nmse_dim"], ceiling_stop=metrics["stop"],
                       ceiling_train_seconds=metrics.get("train_seconds"), ceiling_machine=metrics.get("machine"))


def bridges_in_turn(source: Source, run: Path, plans: list, world: World, *, chosen: list[int], scores: dict,
                    force: bool = False, bars: Bars = None) -> list[dict]:
    """Every bridge of `plans` in turn, each data parallel over every rank (one process: alone),
    seed-major: an interrupted sweep has whole replicates of every layer. The rows on rank 0
    (empty on the others, which only train)."""
    if world.connected:
        states, controls = rank_work(source, run, world, layers=chosen, jobs=plans, force=force, bars=bars,
                                     owned=chosen if world.is_main else [], folder=run / "bridges" / "teacher-states")
    else:
        states = cached_states(source, chosen, bars)
        controls = {layer: layer_controls(source, states, layer, run) for layer in chosen}
    rows = []
    for layer, chosen_settings, out in plans:
        with holding(out, "geoprobe sweep", world.rank):  # each bridge's folder
            metrics, _ = train_bridge(source, layer, run, chosen_settings, states, force=force, bars=bars, out=out,
                                      controls=None if out.name == "ceiling" else controls[layer])
        if metrics is None:  # rank 0 validates; the other data-parallel ranks only train
            continue
        if out.name == "ceiling":
            with_ceiling(rows, layer, metrics)
        else:
            rows.append({**metrics, "seed": chosen_settings.seed, "score": scores[layer]["score"],
                         "rank": scores[layer]["rank"]})
    return rows


def rank_layers(jobs: list, world: World, rank: int) -> set[int]:
    """The layers whose states rank `rank` keeps when the ranks split `jobs` (`spread_bridges`)."""
    lo, hi = World(rank, world.size).share(len(jobs))
    return {layer for layer, _, _ in jobs[lo:hi]}


def spread_bridges(source: Source, run: Path, jobs: list, world: World, *, chosen: list[int], seeds: list[int],
                   scores: dict, force: bool = False, bars: Bars = None) -> list[dict]:
    """The bridges of `jobs` (layer by layer) split over the ranks: rank r trains a contiguous
    share of them (`World.share`), each on its own device without data parallelism, so a rank
    keeps the states of few layers. The teacher pass is shared; each layer's controls are fitted
    by the rank that owns its first bridge. bridges/spread.json records which rank trains which
    bridge. Rank 0 then reads every bridge's record into the rows (empty on the other ranks)."""
    from geoprobe.bridges.checkpoint import METRICS

    lo, hi = world.share(len(jobs))
    if world.is_main:  # which rank trains which bridge, for the record
        shares = [World(rank, world.size).share(len(jobs)) for rank in range(world.size)]
        write_json_atomic(run / "bridges" / "spread.json", {"world_size": world.size, "ranks": [
            [out.relative_to(run / "bridges").as_posix() for _, _, out in jobs[a:b]] for a, b in shares]})
    firsts = {}
    for index, (layer, _, _) in enumerate(jobs):
        firsts.setdefault(layer, index)
    keep = sorted(rank_layers(jobs, world, world.rank))
    states, controls = rank_work(source, run, world, layers=chosen, jobs=jobs[lo:hi], keep=keep, force=force,
                                 owned=[l for l, first in firsts.items() if lo <= first < hi], bars=bars,
                                 folder=run / "bridges" / "teacher-states")

    def train_mine():
        for layer, chosen_settings, out in jobs[lo:hi]:
            with holding(out, "geoprobe sweep", world.rank):
                train_bridge(source, layer, run, chosen_settings, states, force=force, bars=bars, out=out, world=SINGLE,
                             controls=None if out.name == "ceiling" else controls[layer])

    world.together(train_mine, meet=run / "bridges" / ".ranks")  # every rank's bridges are recorded from here on
    if not world.is_main:
        return []
    rows = [{**read_json(bridge_dir(run, layer, seed) / METRICS, ""), "seed": seed, "score": scores[layer]["score"],
             "rank": scores[layer]["rank"]} for seed in seeds for layer in chosen]
    for layer, _, out in jobs:
        if out.name == "ceiling":
            with_ceiling(rows, layer, read_json(out / METRICS, ""))
    return rows


def write_sweep(run: Path, rows: list[dict], verdict: dict, model: str) -> Path:
    """sweep.csv (one row per layer and seed), sweep.json (rows and verdict), plots/sweep.png
    (score against the seed-mean primary loss) and plots/sweep-curves.png (every bridge's
    stopping-split curve up to where its plateau rule stopped it)."""
    from geoprobe.report.plots import curves_plot, sweep_plot
    from geoprobe.workflows.compare import write_rows
    from geoprobe.verdict import ALL_LOSSES, LAYER_CONTROLS  # scipy: imported when a sweep is written, not at start-up

    columns = ["layer", "seed", "score_tested", "score", "rank", *ALL_LOSSES, *LAYER_CONTROLS,
               "ceiling_stop", "beats_lookup", "bridge_kind", "ce", "ref_ce", "final_train_loss", "steps_run", "best_step",
               "stop"]
    write_rows(Path(run) / "sweep.csv", rows, columns)
    watched = ("stopping-split objective (τ grid)" if verdict.get("protocol") == "diffusion"
               else "stopping-split nmse_dim (clean condition)")
    curves_plot({f"layer {r['layer']} seed {r['seed']}": r.get("val_curve") or [] for r in rows},
                Path(run) / "plots" / "sweep-curves.png", f"Bridge stopping-split curves of {model}", watched)
    plot = sweep_plot(verdict, Path(run) / "plots" / "sweep.png", model)
    # last and whole: sweep.json marks the sweep done (a resume skips it), so it must not exist
    # beside a previous run's plots, nor be half written
    write_json_atomic(Path(run) / "sweep.json", {"rows": rows, "verdict": verdict})
    return plot


def summarise(run: Path, rows: list[dict], include_source: bool = False) -> dict:
    """The verdict over a sweep's rows, with the registered score recomputed over the compared
    layers and the control scores (every scanned layer, --normalize none, massive channels
    excluded). Every score uses the registered weights and no logs, whatever `geoprobe rank` was
    given: the test was registered for that score, and other weights chosen after seeing a ranking
    would make it a different test; the ranking's weights are only reported."""
    from geoprobe.pipeline import load_geometry
    from geoprobe.verdict import REGISTERED_LOG, REGISTERED_WEIGHTS, SOURCE_LAYERS, sweep_verdict

    geometry = load_geometry(run)
    path = Path(run) / "ranking.json"
    recorded = read_json(path, "") if path.is_file() else {}  # older runs: the default weights
    used = {"weights": list(recorded.get("weights", REGISTERED_WEIGHTS)), "log": bool(recorded.get("log", False))}
    registered = (REGISTERED_WEIGHTS, REGISTERED_LOG)
    layers = sorted({r["layer"] for r in rows if include_source or r["layer"] not in SOURCE_LAYERS})
    ranked = {r["layer"]: r for r in ranking_rows(run)}
    # z-scored over every scanned layer as the ranking does, but with the registered weights
    everywhere = layer_scores(geometry, [l["layer"] for l in geometry["layers"]], *registered)
    scores = {"score": layer_scores(geometry, layers, *registered),
              "score_all_layers": {l: everywhere[l] for l in layers},
              "score_normalize_none": layer_scores(geometry, layers, *registered, normalize="none")}
    if has_massive_channels(geometry):
        drop = bool(geometry["settings"].get("drop_massive_channels", False))
        scores["score_channels_excluded"] = layer_scores(geometry, layers, *registered, other_channels=not drop)
    share = {l: float(ranked[l].get("channel_share", 0.0)) for l in ranked}
    verdict = sweep_verdict(rows, scores, share, include_source, ranking_weights=used)
    verdict["scores"] = {name: {str(l): v for l, v in values.items()} for name, values in scores.items()}
    return verdict
