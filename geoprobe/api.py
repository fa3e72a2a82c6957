"""The Python API, for notebooks: the run directory as pandas tables and arrays, and the commands
as functions with the commands' own defaults.

    import geoprobe
    run = geoprobe.scan("builtin:smollm2", "runs/demo", corpus="kjv", tokens=4000)
    run.ranking()                      # DataFrame: one row per layer, proxies, intervals, P(first)
    run.geometry()                     # DataFrame: every proxy, raw and trace-normalised
    x = run.states(3)                  # (rows, d) float32 numpy (torch_device="cuda" for a tensor)
    df = run.to_pandas(layers=[3])     # row metadata, plus one column of state vectors per layer
    geoprobe.bridge(run, layer=3, steps=500)          # metrics dict
    geoprobe.sample("runs/demo/bridges/layer-03/seed-0", sampler="roar", num=4, length=32)   # texts

The functions make the same library calls as `geoprobe scan|bridge|sample`, with the same
defaults (they live in the settings dataclasses both build), and raise `geoprobe.errors.BadInput`
where the command would print its one-line error.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from geoprobe.backbone import resolve_source
from geoprobe.errors import BadInput
from geoprobe.extract import ExtractConfig
from geoprobe.geometry import GeometrySettings
from geoprobe.settings import split_flags
from geoprobe.store import META_COLUMNS, RunReader, column_name
from geoprobe.workflows.generate import SampleSettings, generate
from geoprobe.workflows.sweep import bridge_run, bridge_settings


class Run:
    """A run directory written by `extract` or `scan` (and, later, `sweep`, `compare`)."""

    def __init__(self, path):
        self.path = Path(path)
        self.reader = RunReader(self.path)  # checks every shard's size and footer

    def __repr__(self) -> str:
        m = self.manifest
        return (f"Run({str(self.path)!r}: {m['model'].get('spec')}, {self.reader.num_rows:,} rows x "
                f"{len(self.layers)} layers x d={self.hidden_size}, {m['status']})")

    @property
    def manifest(self) -> dict:
        return self.reader.manifest

    @property
    def layers(self) -> list[int]:
        return self.reader.layers

    @property
    def hidden_size(self) -> int:
        return self.reader.hidden_size

    def states(self, layer: int, rows: tuple[int, int] | None = None, torch_device=None):
        """One layer's states, (rows, d) float32: numpy, or a torch tensor on `torch_device`."""
        batches = list(self.reader.iter_layer(layer, rows=rows, torch_device=torch_device))
        if torch_device is not None:
            import torch

            return torch.cat(batches) if batches else torch.zeros((0, self.hidden_size), device=torch_device)
        return np.concatenate(batches) if batches else np.zeros((0, self.hidden_size), np.float32)

    def to_pandas(self, layers: list[int] | None = None, text: bool = False) -> pd.DataFrame:
        """One row per stored token: doc_id, seq_id, position, token_id (and the token's text with
        `text`, which loads the tokenizer), plus an `hNN` column of float32 vectors per layer asked."""
        frame = pd.DataFrame(self.reader.read_meta(), columns=list(META_COLUMNS))
        for layer in layers or []:
            frame[column_name(layer)] = list(self.states(layer))
        if text:
            from transformers import AutoTokenizer


            tokenizer = AutoTokenizer.from_pretrained(resolve_source(self.manifest["config"]["model"]).location)
            frame["token"] = tokenizer.convert_ids_to_tokens(frame["token_id"].tolist())
        return frame

    def geometry(self) -> pd.DataFrame:
        """One row per layer: every proxy, trace-normalised (`curv`, `curv_lo`, `curv_hi`, ...) and
        raw (`raw_curv`, ...), with the counts that qualify them."""
        from geoprobe.pipeline import load_geometry

        rows = []
        for layer in load_geometry(self.path)["layers"]:
            row = {"layer": layer["layer"]}
            for norm, prefix in (("trace", ""), ("none", "raw_")):
                for proxy in ("curv", "mono", "erank"):
                    entry = layer[norm][proxy]
                    row[f"{prefix}{proxy}"] = entry["value"]
                    row[f"{prefix}{proxy}_lo"], row[f"{prefix}{proxy}_hi"] = entry["ci"]
            row.update({k: layer[k] for k in ("n_states", "n_used", "massive", "duplicate_fraction", "scale",
                                              "participation_ratio", "entropy_rank", "massive_channel_share")
                        if k in layer})
            row["massive_channels"] = len(layer.get("massive_channels", []))
            rows.append(row)
        return pd.DataFrame(rows).set_index("layer")

    def _table(self, name: str, producer: str) -> pd.DataFrame:
        path = self.path / name
        if not path.is_file():
            raise BadInput(f"{self.path} has no {name}: run `geoprobe {producer}` first")
        return pd.read_csv(path)

    def ranking(self) -> pd.DataFrame:
        """ranking.csv: layer, proxies with intervals, score, rank, P(first) (bootstrap and reseeds)."""
        return self._table("ranking.csv", "rank").set_index("layer")

    def sweep(self) -> pd.DataFrame:
        """sweep.csv: per layer and seed, the geometry score and rank beside every bridge validation loss."""
        return self._table("sweep.csv", "sweep").set_index(["layer", "seed"])

    def bridges(self) -> pd.DataFrame:
        """Every trained bridge of the run (bridges/layer-NN/seed-S/metrics.json), one row per layer and seed."""
        rows = [{"layer": int(p.parent.parent.name.split("-")[1]), "seed": int(p.parent.name.split("-")[1]),
                 **{k: v for k, v in json.loads(p.read_text()).items() if not isinstance(v, (dict, list)) and k != "seed"}}
                for p in sorted((self.path / "bridges").glob("layer-*/seed-*/metrics.json"))]
        return pd.DataFrame(rows).set_index(["layer", "seed"]) if rows else pd.DataFrame()


def open_run(path) -> Run:
    return Run(path)


def scan(model: str, out, **flags) -> Run:
    """What `geoprobe scan MODEL --out OUT` does; the finished run. `flags` are the fields of
    ExtractConfig (corpus, tokens, seq_len, positions, doc_blocks, device, ...) and of
    GeometrySettings (k, anchors, pairs, bootstrap, drop_massive, ...), plus weights, log, force,
    rank, world_size, and keep_massive as the command spells it."""
    from geoprobe.pipeline import scan as scan_run, scan_config

    if "keep_massive" in flags:  # the command's flag for GeometrySettings.drop_massive
        flags["drop_massive"] = not flags.pop("keep_massive")
    extract, geometry, rest = split_flags(flags, ExtractConfig, GeometrySettings,
                                          {"weights", "log", "force", "rank", "world_size"})
    extract.pop("model", None)
    scan_run(Path(out), scan_config(model, extract.pop("corpus", None), extract.pop("doc_blocks", None), **extract),
             GeometrySettings(**geometry), **rest)
    return Run(out)


def bridge(run, layer: int | None = None, **flags) -> dict:
    """What `geoprobe bridge --run RUN [--layer L]` does; the bridge's validation metrics. `flags`
    are the fields of BridgeConfig (d_model, n_layers, ...) and BridgeSettings (steps, batch_size,
    seq_len, lr, seed, until, ...), plus model, corpus, out, device, dtype, device_map, force."""

    options = {"model", "corpus", "out", "device", "dtype", "device_map", "force"}
    placement, network = split_flags(flags, options, set(flags) - options)
    root = Path(run.path if isinstance(run, Run) else run) if run is not None else None
    if placement.get("out") is not None:
        placement["out"] = Path(placement["out"])
    metrics, _ = bridge_run(bridge_settings(**network), layer, root, **placement)
    return metrics


def sample(model, sampler: str = "roar", out=None, device: str = "auto", force: bool = False, **flags) -> list[str]:
    """What `geoprobe sample --model MODEL --sampler S` does; the generated texts. `flags` are the
    fields of SampleSettings (num, length, steps, top_p, seed, ...)."""

    settings = SampleSettings(**split_flags(flags, SampleSettings)[0])
    result = generate(Path(model), sampler, settings, Path(out) if out is not None else None, device, force)
    return [row["text"] for row in result["samples"]]
