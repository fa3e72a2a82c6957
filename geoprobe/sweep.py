"""Bridges over a run: where the data come from, one bridge per layer, and the layer sweep that
asks whether the geometry score predicts the bridge's validation loss."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

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
