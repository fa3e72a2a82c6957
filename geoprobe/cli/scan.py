"""`geoprobe geometry RUN`, `geoprobe rank RUN` and `geoprobe scan MODEL` (extract + geometry + rank)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from geoprobe.cli.root import app
from geoprobe.cli.output import progress, show
from geoprobe.cli.options import (BatchSize, DocBlocks, Device, DeviceMap, Dtype, Force, Layers, Rank, Seed, SeqLen, Tokens,
                                  TrustRemoteCode, WorldSize, state)

RunDir = Annotated[Path, typer.Argument(help="A run directory written by `geoprobe extract` or `scan`.")]
K = Annotated[int, typer.Option("--k", help="Neighbours per anchor for the local curvature.")]
Anchors = Annotated[int, typer.Option("--anchors", help="Anchors for the local curvature.")]
Pairs = Annotated[int, typer.Option("--pairs", help="Random pairs for the global monotonicity.")]
Alpha = Annotated[float, typer.Option("--alpha", help="Ridge of P = (Σ + α tr(Σ)/d I)^-1.")]
Normalize = Annotated[str, typer.Option("--normalize", help="trace: divide each layer by sqrt(tr(Σ)/d) "
                                                            "(scale-free proxies); none: raw values.")]
KeepMassive = Annotated[bool, typer.Option("--keep-massive", help="Keep states with norm > 20x the median "
                                                                  "(dropped by default, counted either way).")]
DropChannels = Annotated[bool, typer.Option("--drop-massive-channels", help="Exclude channels whose variance exceeds "
                                             "20x the median channel variance before the proxies are computed "
                                             "(listed in geometry.json either way; the ranking is shown both ways "
                                             "whenever a layer has them).")]
Bootstrap = Annotated[int, typer.Option("--bootstrap", help="Bootstrap replicates over documents (0 = none).")]
Reseeds = Annotated[int, typer.Option("--reseeds", help="Extra draws of anchors and pairs: the ranking reports how "
                                                       "often each layer ranks first across them (0 = none).")]
Weights = Annotated[str, typer.Option("--weights", help="a,b,c in s = a z(curv) + b z(mono) - c z(erank).")]
Log = Annotated[bool, typer.Option("--log", help="z-score the logarithms of the proxies.")]


def _show_plan(model, out, cfg, settings) -> None:
    """--plan: the figures, then a one-line refusal when the disk or memory will not hold them."""
    from geoprobe.plan import check_fits, plan_scan
    from geoprobe.rundir import human

    plan = plan_scan(model, out, cfg.tokens, cfg.seq_len, cfg.layers, cfg.storage, cfg.batch_size, cfg.device,
                     cfg.dtype, cfg.trust_remote_code, settings)
    from geoprobe.report.terminal import print_table

    show(plan.record(), lambda: print_table(f"plan for {model} on {plan.device} ({plan.dtype})", ["need", "size", "detail"], [
            ["parameters", human(plan.parameter_bytes), f"{plan.parameters:,} x {plan.dtype}"],
            ["activations / batch", human(plan.activation_bytes),
             f"{plan.batch_size} x {plan.seq_len} tokens, {plan.layers} captured layers "
             f"({human(plan.captured_bytes)}) + working set ({human(plan.working_bytes)})"],
            ["device memory", human(plan.memory_bytes), f"{human(plan.memory_available)} free"],
            ["geometry / layer", human(plan.geometry_bytes), f"{plan.rows:,} states x d={plan.hidden_size}: float32 and "
                                                              "float64 copies, the largest phase's temporaries "
                                                              "(geometry.peak_bytes)"],
            ["disk (shards)", human(plan.disk_bytes), f"{plan.rows:,} rows x {plan.layers} layers x d={plan.hidden_size}; "
                                                      f"{human(plan.disk_available)} free"],
        ]))
    check_fits(plan)


def _settings(k, anchors, pairs, alpha, normalize, keep_massive, bootstrap, seed, drop_channels=False, reseeds=8):
    from geoprobe.geometry import GeometrySettings

    return GeometrySettings(k=k, anchors=anchors, pairs=pairs, alpha=alpha, normalize=normalize,
                            drop_massive=not keep_massive, bootstrap=bootstrap, seed=seed,
                            drop_massive_channels=drop_channels, reseeds=reseeds)


def _geometry(run, settings, device):
    """Under torchrun every rank takes a share of each layer's rows; rank 0 writes geometry.json."""
    from geoprobe.backbone import resolve_device
    from geoprobe.distributed import world_from
    from geoprobe.rundir import holding
    from geoprobe.pipeline import geometry_step

    world = world_from()
    bar = progress("geometry", "layer")
    try:
        with holding(run, "geoprobe geometry", world.rank):
            return geometry_step(run, settings, resolve_device(world.device(device)), progress=bar, world=world)[0]
    finally:
        bar.stop()


def _warn_massive(run, geometry) -> str | None:
    """The one warning line about massive tokens and channels (stderr), also returned for JSON."""
    from geoprobe.pipeline import massive_warning, token_namer

    massive_tokens = any(l.get("massive") for l in geometry["layers"])  # naming them loads the tokenizer
    warning = massive_warning(geometry, token_namer(run) if massive_tokens else None)
    if warning and not state.quiet:
        from geoprobe.report.terminal import console

        console.print(warning, markup=False, highlight=False, soft_wrap=True)
    return warning


def _rank_and_show(run, geometry, weights, log, extra=None):
    from geoprobe.distributed import world_from
    from geoprobe.ranking import parse_weights
    from geoprobe.report.tables import print_ranking
    from geoprobe.pipeline import ranking_step

    if not world_from().is_main:  # rank 0 writes the ranking and its plot
        return None
    ranking, plot = ranking_step(run, geometry, parse_weights(weights), log)
    warning = _warn_massive(run, geometry)
    def for_people():
        print_ranking(ranking, geometry)
        other = ranking.get("other")
        alternative = (f"; with massive channels {'excluded' if other['drop_massive_channels'] else 'kept'}: "
                       f"{other['chosen_layer']}" if other else "")
        print(f"chosen layer: {ranking['chosen_layer']}{alternative}   plot: {plot}")

    show({**(extra or {}), "ranking": ranking, "plot": str(plot), "warning": warning}, for_people)
    return ranking


@app.command(epilog="Examples:\n\n  geoprobe geometry runs/kjv\n\n"
                    "  geoprobe geometry runs/kjv --k 16 --anchors 1024 --normalize none --device cuda")
def geometry(run: RunDir, k: K = 32, anchors: Anchors = 2048, pairs: Pairs = 4096, alpha: Alpha = 1e-3,
             normalize: Normalize = "trace", keep_massive: KeepMassive = False, bootstrap: Bootstrap = 200,
             reseeds: Reseeds = 8, seed: Seed = 0, device: Device = "auto",
             drop_massive_channels: DropChannels = False):
    """Per-layer geometry proxies with bootstrap intervals → geometry.json."""
    result = _geometry(run, _settings(k, anchors, pairs, alpha, normalize, keep_massive, bootstrap, seed,
                                      drop_massive_channels, reseeds), device)
    _warn_massive(run, result)
    from geoprobe.report.terminal import print_table

    norm = result["settings"]["normalize"]
    show(result, lambda: print_table(
        f"geometry of {run} (normalize={norm})", ["layer", "curv", "mono", "erank", "dup", "massive", "massive channels"],
        [[l["layer"], l[norm]["curv"]["value"], l[norm]["mono"]["value"], l[norm]["erank"]["value"],
          round(l["duplicate_fraction"], 3), l["massive"], len(l["massive_channels"])] for l in result["layers"]]))


@app.command(epilog="Examples:\n\n  geoprobe rank runs/kjv\n\n  geoprobe rank runs/kjv --weights 1,1,0 --log")
def rank(run: RunDir, weights: Weights = "1,1,1", log: Log = False):
    """Rank layers from geometry.json → ranking.csv, ranking.md, plots/geometry.png."""
    from geoprobe.pipeline import load_geometry

    _rank_and_show(run, load_geometry(run), weights, log)


@app.command(epilog="Examples:\n\n  geoprobe scan builtin:smollm2 --corpus kjv --tokens 4000 --out runs/demo\n\n"
                    "  geoprobe scan meta-llama/Llama-3.1-8B-Instruct --device cuda --dtype bfloat16 "
                    "--tokens 50000 --positions random:64 --out runs/llama8b")
def scan(
    model: Annotated[str, typer.Argument(help="Hub id, local folder, .gguf file, builtin:smollm2 or builtin:hmm-tiny (the trained testbed).")],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Run directory (default runs/<model name>).")] = None,
    corpus: Annotated[str | None, typer.Option("--corpus", help="Text source (default: wikitext-103 when online "
                                                                "with `datasets`, else the installed KJV).")] = None,
    tokens: Tokens = 10000, seq_len: SeqLen = 256, layers: Layers = "all",
    positions: Annotated[str, typer.Option(help="all, or random:K positions per sequence.")] = "all",
    doc_blocks: DocBlocks = None,
    skip_first: Annotated[int, typer.Option(min=0, help="Skip the first N positions.")] = 1,
    shard_rows: Annotated[int, typer.Option(min=0, help="Approximate rows per Parquet shard (0 = about 64 MiB "
                                                         "of float32 states, at least one block: a d = 4,096 model at "
                                                         "--seq-len 2048, --positions all stores ~550 MB per shard).")] = 0,
    k: K = 32, anchors: Anchors = 2048, pairs: Pairs = 4096, alpha: Alpha = 1e-3, normalize: Normalize = "trace",
    keep_massive: KeepMassive = False, drop_massive_channels: DropChannels = False, bootstrap: Bootstrap = 200,
    reseeds: Reseeds = 8, weights: Weights = "1,1,1", log: Log = False,
    seed: Seed = 0, device: Device = "auto", dtype: Dtype = "auto", batch_size: BatchSize = 8,
    device_map: DeviceMap = None, trust_remote_code: TrustRemoteCode = False, force: Force = False,
    plan: Annotated[bool, typer.Option("--plan", help="Print the memory and disk this scan needs (from the config "
                                                      "alone, no weights loaded) and stop; refuse if they do not "
                                                      "fit.")] = False,
    rank: Rank = None, world_size: WorldSize = None,
):
    """Extract, measure and rank every layer in one resumable command (several ranks under
    torchrun: each extracts its share of the shards and of every layer's geometry)."""
    from geoprobe.distributed import world_from
    from geoprobe.extract import ExtractConfig
    from geoprobe.ranking import parse_weights
    from geoprobe.rundir import holding
    from geoprobe.pipeline import default_corpus

    out = out or Path("runs") / model.rstrip("/").split("/")[-1].split(":")[-1].removesuffix(".gguf")
    settings = _settings(k, anchors, pairs, alpha, normalize, keep_massive, bootstrap, seed, drop_massive_channels,
                         reseeds)
    settings.validate()  # before any extraction work
    parse_weights(weights)
    cfg = ExtractConfig(model=model, corpus=corpus or default_corpus(), tokens=tokens, seq_len=seq_len,
                        layers=layers, positions=positions, skip_first=skip_first, seed=seed, dtype=dtype,
                        # the default corpus is a few long books of chapters: one block from each of
                        # many chapters, so that the bootstrap has many documents to resample
                        doc_blocks=(1 if corpus is None else 0) if doc_blocks is None else doc_blocks,
                        shard_rows=shard_rows,
                        batch_size=batch_size, device=device, device_map=device_map,
                        trust_remote_code=trust_remote_code)
    if plan:
        _show_plan(model, out, cfg, settings)
        return
    settings.check_rows(tokens)  # a scan whose geometry must fail is refused before extracting
    world = world_from(rank, world_size)
    from geoprobe.backbone import resolve_device
    from geoprobe.pipeline import scan_run
    from geoprobe.plan import check_geometry_fits

    target = resolve_device(world.device(device))
    # ranks with a process group share each layer's rows; ranks started by hand leave the last one all of them
    check_geometry_fits(model, -(-tokens // world.size) if world.connected else tokens, settings, target,
                        trust_remote_code)

    with holding(out, "geoprobe scan", world.rank):
        geometry_result, timing = scan_run(out, cfg, settings, target, force=force,
                                           extract_progress=progress("extract", "tok"),
                                           geometry_progress=progress("geometry", "layer"), world=world)
        _rank_and_show(out, geometry_result, weights, log, extra={"run": str(out), "timing": timing})
