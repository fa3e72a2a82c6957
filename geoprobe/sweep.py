"""Bridges over a run: where the data come from, one bridge per layer, and the layer sweep that
asks whether the geometry score predicts the bridge's validation loss."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from bridges.hidden import BridgeConfig, check_bridge_flags
from geoprobe.errors import BadInput

LOSSES = ("nmse", "nmse_dim", "delta_ce", "nmse_noisy")
PRIMARY = "delta_ce"  # the loss that picks the oracle and worst layers


def bridge_dir(root: Path, layer: int) -> Path:
    return Path(root) / "bridges" / f"layer-{layer:02d}"


def ranking_rows(run: Path) -> list[dict]:
    path = Path(run) / "ranking.csv"
    if not path.is_file():
        raise BadInput(f"{run} has no finished scan (no ranking.csv): run `geoprobe scan` or pass --layer")
    with open(path) as handle:
        return [{k: (float(v) if k not in ("layer", "rank", "massive") else int(v)) for k, v in row.items()}
                for row in csv.DictReader(handle)]


def chosen_layer(run: Path) -> int:
    """The best-ranked layer that can host a bridge. The scan ranks every stored layer, the last
    block's output included, but a bridge needs blocks above it: that layer is passed over."""
    from geoprobe.store import read_manifest

    blocks = read_manifest(run)["model"]["num_layers"]
    rows = [r for r in ranking_rows(run) if r["layer"] < blocks]
    if not rows:
        raise BadInput(f"{run}: no scanned layer has blocks above it (layers 0..{blocks - 1} can host a bridge)")
    return min(rows, key=lambda r: r["rank"])["layer"]


@dataclass
class Source:
    """The backbone and the corpus blocks a bridge trains and validates on."""

    backbone: object
    model: str
    corpus: str
    seq_len: int
    train_blocks: list
    val_blocks: list
    scanned_layers: list | None


def open_source(run: Path | None, model: str | None, corpus: str | None, seq_len: int, seed: int, device: str,
                dtype: str, max_blocks: int = 4000, val_blocks: int = 16, device_map: str | None = None) -> Source:
    from geoprobe.backbone import load_backbone
    from geoprobe.corpus import iter_blocks, read_documents

    scanned = None
    if run is not None:
        from geoprobe.store import check_shards, read_manifest

        manifest = read_manifest(run)
        check_shards(run, manifest)  # the ranking that picks the layer came from these shards
        model, corpus = model or manifest["config"]["model"], corpus or manifest["config"]["corpus"]
        scanned = manifest["layers"]
    if model is None or corpus is None:
        raise BadInput("pass --run RUN, or both --model and --corpus")
    documents = read_documents(corpus)
    backbone = load_backbone(model, device=device, dtype=dtype, device_map=device_map)
    train, val = [], []
    for block in iter_blocks(documents, backbone.tokenizer, seq_len, seed, split="train", val_fraction=0.1):
        train.append(block)
        if len(train) >= max_blocks:
            break
    for block in iter_blocks(documents, backbone.tokenizer, seq_len, seed, split="validation", val_fraction=0.1):
        val.append(block)
        if len(val) >= val_blocks:
            break
    if not val:  # a corpus of very few documents: hold out its last training blocks instead
        train, val = train[:-val_blocks] or train, train[-val_blocks:]
    return Source(backbone, model, corpus, seq_len, train, val, scanned)


def check_layer(source: Source, layer: int) -> None:
    n = source.backbone.num_layers
    if not 0 <= layer < n:
        raise BadInput(f"--layer {layer} out of range: use 0..{n - 1} (blocks {layer + 1}..{n} must remain above)")
    if source.scanned_layers is not None and layer not in source.scanned_layers:
        raise BadInput(f"layer {layer} was not scanned in this run (scanned: {source.scanned_layers})")


def identity(source: Source, layer: int) -> dict:
    return {"model": source.model, "model_config_sha256": source.backbone.identity["config_sha256"],
            "layer": layer, "corpus": source.corpus, "seq_len": source.seq_len}


@dataclass(frozen=True)
class BridgeSettings:
    """The flags of `geoprobe bridge` and `sweep`: the bridge's network (a BridgeConfig template
    whose layer, vocabulary and width come from the backbone) and its training."""

    network: BridgeConfig
    steps: int = 2000
    batch_size: int = 8
    seq_len: int = 128
    lr: float = 1e-3
    seed: int = 0
    until: str = "plateau"
    eval_every: int = 0

    def training(self):
        """The training settings (bridges.fit.bridge_training); every flag is checked here,
        before anything loads."""
        from bridges.fit import bridge_training

        check_bridge_flags(self.network.vocab, self.network.sigma_b)
        return bridge_training(self.steps, self.batch_size, self.lr, self.seed, self.until, self.eval_every,
                               self.network.precision)

    def network_at(self, layer: int, backbone) -> BridgeConfig:
        return replace(self.network, layer=layer, vocab_size=backbone.config.vocab_size,
                       hidden_size=backbone.hidden_size)


Bars = Callable[[str], object] | None  # label -> a progress bar (start/advance/stop), or None


def train_bridge(source: Source, layer: int, root: Path, settings: BridgeSettings, force: bool = False,
                 bars: Bars = None) -> tuple[dict, Path]:
    """One bridge at `layer` in root/bridges/layer-NN (resumed, or refused when it holds another
    run; cleared first with `force`): its validation metrics and its folder."""
    from bridges.fit import fit_bridge
    from geoprobe.distributed import world_from
    from geoprobe.rundir import clear, holding

    check_layer(source, layer)
    cfg, train_cfg = settings.network_at(layer, source.backbone), settings.training()
    out = bridge_dir(root, layer)
    world = world_from()
    with holding(out, "geoprobe bridge", world.rank):
        if force and world.is_main:
            clear(out)
        world.barrier()
        bar = bars(f"bridge layer {layer}") if bars else None
        try:
            return fit_bridge(source.backbone, layer, source.train_blocks, source.val_blocks, cfg, train_cfg, out,
                              identity(source, layer), progress=bar, world=world), out
        finally:
            if bar is not None:
                bar.stop()


def bridge_run(settings: BridgeSettings, layer: int | None = None, run: Path | None = None, model: str | None = None,
               corpus: str | None = None, out: Path | None = None, device: str = "auto", dtype: str = "auto",
               device_map: str | None = None, force: bool = False, bars: Bars = None) -> tuple[dict, Path]:
    """What `geoprobe bridge` does: the bridge at `layer` (default: the scan's choice) over a
    scanned run, or over --model/--corpus into `out`. Flags are checked before the backbone loads."""
    from geoprobe.backbone import check_device_map
    from geoprobe.distributed import world_from
    from geoprobe.rundir import holding

    if run is None and out is None:
        raise BadInput("pass --run RUN, or --out DIR with --model and --corpus")
    if layer is None:
        if run is None:
            raise BadInput("without --run, pass --layer")
        layer = chosen_layer(run)
    if layer < 0:
        raise BadInput(f"--layer must be >= 0, got {layer}")
    settings.training()
    check_device_map(device_map)
    world = world_from()
    with holding(bridge_dir(out or run, layer), "geoprobe bridge", world.rank):  # before the slow load
        source = open_source(run, model, corpus, settings.seq_len, settings.seed, world.device(device, device_map),
                             dtype, device_map=device_map)
        return train_bridge(source, layer, out or run, settings, force, bars)


def sweep_run(run: Path, settings: BridgeSettings, layers: str = "all", device: str = "auto", dtype: str = "auto",
              force: bool = False, bars: Bars = None) -> dict | None:
    """What `geoprobe sweep` does: one bridge per layer (each to its plateau under one step cap),
    then the Spearman correlations between the geometry score and each validation loss, written to
    sweep.json/sweep.csv with a plot. Returns rows, correlations and the plot (None on
    data-parallel ranks other than 0)."""
    from geoprobe.backbone import parse_layers
    from geoprobe.distributed import world_from
    from geoprobe.rundir import holding

    settings.training()
    scores = {r["layer"]: r for r in ranking_rows(run)}
    world = world_from()
    with holding(run / "bridges", "geoprobe sweep", world.rank):  # one sweep at a time on a run
        source = open_source(run, None, None, settings.seq_len, settings.seed, world.device(device), dtype)
        chosen = parse_layers(layers, source.backbone.num_layers - 1)
        if layers.strip() == "all":  # every layer that was scanned and has blocks above it
            chosen = [l for l in chosen if l in scores]
        rows = []
        for layer in chosen:
            metrics, _ = train_bridge(source, layer, run, settings, force, bars)
            rows.append({**metrics, "score": scores[layer]["score"], "rank": scores[layer]["rank"]})
        if not world.is_main:  # data-parallel ranks: rank 0 writes the sweep
            return None
        summary = summarise(rows, settings.seed)
        plot = write_sweep(run, rows, summary, source.model)
    return {"rows": rows, "correlations": summary, "plot": str(plot)}


SWEEP_COLUMNS = ["layer", "score", "rank", *LOSSES, "ce", "ref_ce", "final_train_loss", "steps_run", "stop"]


def write_sweep(run: Path, rows: list[dict], correlations: dict, model: str) -> Path:
    """sweep.csv, sweep.json, plots/sweep.png (score against the loss) and plots/sweep-curves.png
    (every layer's validation curve up to where its plateau rule stopped it)."""
    from geoprobe.report.plots import curves_plot, sweep_plot
    from geoprobe.report.compare import write_rows

    write_rows(Path(run) / "sweep.csv", rows, SWEEP_COLUMNS)
    (Path(run) / "sweep.json").write_text(json.dumps({"rows": rows, "correlations": correlations}, indent=2))
    curves_plot({f"layer {r['layer']}": r.get("val_curve") or [] for r in rows}, Path(run) / "plots" /
                "sweep-curves.png", f"Bridge validation curves of {model}")
    return sweep_plot(rows, PRIMARY, correlations[PRIMARY], Path(run) / "plots" / "sweep.png", model)


def summarise(rows: list[dict], seed: int = 0) -> dict:
    """Spearman rho (score vs. each loss) with p-value and interval, and the three layers."""
    from geoprobe.metrics.correlation import spearman_with_uncertainty

    scores = [r["score"] for r in rows]
    result = {loss: spearman_with_uncertainty(scores, [r[loss] for r in rows], seed=seed) for loss in LOSSES}
    result["chosen_layer"] = max(rows, key=lambda r: r["score"])["layer"]
    result["oracle_layer"] = min(rows, key=lambda r: r[PRIMARY])["layer"]
    result["worst_layer"] = max(rows, key=lambda r: r[PRIMARY])["layer"]
    result["depth"] = depth_check(rows)
    return result


def depth_check(rows: list[dict]) -> dict:
    """Is the bridge at the deepest swept layer measurably harder than at the shallowest?
    Harder means a validation nmse more than 10% (relative) above it: validation noise at these
    sizes is a few percent. delta_ce is stated beside it but does not decide: the bridge is
    bidirectional and sees the next token at clean condition, so its reconstruction can carry
    information the true state does not have, and delta_ce can even be negative."""
    first, last = min(rows, key=lambda r: r["layer"]), max(rows, key=lambda r: r["layer"])
    harder = last["nmse"] > 1.1 * first["nmse"]
    return {"first_layer": first["layer"], "last_layer": last["layer"], "harder": bool(harder),
            "statement": (f"the bridge at layer {last['layer']} is {'' if harder else 'not '}measurably harder than "
                          f"at layer {first['layer']} (nmse {last['nmse']:.3g} vs {first['nmse']:.3g}; delta_ce "
                          f"{last['delta_ce']:.3g} vs {first['delta_ce']:.3g} nats)")}
