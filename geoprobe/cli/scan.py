"""`geoprobe geometry RUN`, `geoprobe rank RUN` and `geoprobe scan MODEL` (extract + geometry + rank)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from geoprobe.cli.options import (EXTRACT, BatchSize, Deterministic, Device, DeviceMap, DocBlocks, Dtype, Force, Layers,
    Positions, Rank, Seed, SeqLen, ShardRows, SkipFirst, Tokens, TrustRemoteCode, WorldSize, choices, plain, state,
    with_settings)
from geoprobe.cli.output import progress, show
from geoprobe.cli.root import app
from geoprobe.files import human
from geoprobe.geometry import GeometrySettings
from geoprobe.plan import check_fits, plan_scan
from geoprobe.ranking import WEIGHTS, parse_weights, passed_over_line
from geoprobe.report.terminal import print_table

RunDir = Annotated[Path, typer.Argument(help="A run directory written by `geoprobe extract` or `scan`.")]
K = Annotated[int, typer.Option("--k", help="Neighbours per anchor for the local curvature.")]
Anchors = Annotated[int, typer.Option("--anchors", help="Anchors for the local curvature.")]
Pairs = Annotated[int, typer.Option("--pairs", help="Random pairs for the global monotonicity.")]
Alpha = Annotated[float, typer.Option("--alpha", help="Ridge of P = (Σ + α tr(Σ)/d I)^-1.")]
Normalize = Annotated[choices("Normalize", ("trace", "none")), typer.Option("--normalize", help="trace: divide each "
                                                                           "layer by sqrt(tr(Σ)/d); none: raw values.")]
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
GEOMETRY = GeometrySettings()  # the defaults live in the settings classes


def geometry_settings(keep_massive: bool = False, **flags) -> GeometrySettings:
    """GeometrySettings from the flags of `geometry` and `scan` (--keep-massive is drop_massive's negation)."""
    return GeometrySettings(drop_massive=not keep_massive, **flags)


# The flags that make a GeometrySettings, shared by `geometry` and `scan`: each declared here once
GEOMETRY_FLAGS = {"k": K, "anchors": Anchors, "pairs": Pairs, "alpha": Alpha, "normalize": Normalize,
                  "keep_massive": KeepMassive, "drop_massive_channels": DropChannels, "bootstrap": Bootstrap,
                  "reseeds": Reseeds, "seed": Seed}
geometry_flags = with_settings(GEOMETRY_FLAGS, {**vars(GEOMETRY), "keep_massive": not GEOMETRY.drop_massive},
                               geometry_settings)


def _show_plan(model, out, cfg, settings) -> None:
    """--plan: the figures, then a one-line refusal when the disk or memory will not hold them."""

    plan = plan_scan(model, out, tokens=cfg.tokens, seq_len=cfg.seq_len, layers=cfg.layers, storage=cfg.storage,
                     batch_size=cfg.batch_size, device=cfg.device, dtype=cfg.dtype,
                     trust_remote_code=cfg.trust_remote_code, settings=settings)

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


def _warn(warning: str | None) -> None:
    """The one warning line about massive tokens and channels, on stderr (JSON carries it too)."""
    if warning and not state.quiet:
        from geoprobe.report.terminal import console

        console.print(warning, markup=False, highlight=False, soft_wrap=True)


def _show_ranking(result: dict) -> None:
    from geoprobe.report.tables import print_ranking

    _warn(result["warning"])

    def for_people():
        ranking = result["ranking"]
        print_ranking(ranking, result["geometry"])
        other = ranking.get("other")
        alternative = (f"; with massive channels {'excluded' if other['drop_massive_channels'] else 'kept'}: "
                       f"{other['chosen_layer']}" if other else "")
        print(f"chosen layer: {ranking['chosen_layer']}{alternative}   plot: {result['plot']}")
        if passed_over_line(ranking):
            print(passed_over_line(ranking))

    show({k: v for k, v in result.items() if k != "geometry"}, for_people)


@app.command(epilog="Examples:\n\n  geoprobe geometry runs/kjv\n\n"
                    "  geoprobe geometry runs/kjv --k 16 --anchors 1024 --normalize none --device cuda")
@geometry_flags
def geometry(*, run: RunDir, device: Device = "auto", deterministic: Deterministic = EXTRACT.deterministic,
             settings: GeometrySettings):
    """Per-layer geometry proxies with bootstrap intervals → geometry.json."""
    from geoprobe.pipeline import measure, warning_for

    result = measure(run, settings, device, progress("geometry", "layer"), deterministic=deterministic)
    _warn(warning_for(run, result))
    norm = result["settings"]["normalize"]
    show(result, lambda: print_table(
        f"geometry of {run} (normalize={norm})", ["layer", "curv", "mono", "erank", "dup", "massive", "massive channels"],
        [[l["layer"], l[norm]["curv"]["value"], l[norm]["mono"]["value"], l[norm]["erank"]["value"],
          round(l["duplicate_fraction"], 3), l["massive"], len(l["massive_channels"])] for l in result["layers"]]))


@app.command(epilog="Examples:\n\n  geoprobe rank runs/kjv\n\n  geoprobe rank runs/kjv --weights 1,1,0 --log")
def rank(run: RunDir, weights: Weights = WEIGHTS, log: Log = False):
    """Rank layers from geometry.json → ranking.csv, ranking.md, plots/geometry.png."""
    from geoprobe.pipeline import rank as rank_run

    result = rank_run(run, weights, log)
    if result is not None:
        _show_ranking(result)


@app.command(epilog="Examples:\n\n  geoprobe scan builtin:smollm2 --corpus kjv --tokens 4000 --out runs/demo\n\n"
                    "  geoprobe scan meta-llama/Llama-3.1-8B-Instruct --device cuda --dtype bfloat16 "
                    "--tokens 50000 --positions random:64 --out runs/llama8b")
@geometry_flags
def scan(
    *,
    model: Annotated[str, typer.Argument(help="Hub id, local folder, .gguf file, builtin:smollm2 or builtin:hmm-tiny (the trained testbed).")],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Run directory (default runs/<model name>).")] = None,
    corpus: Annotated[str | None, typer.Option("--corpus", help="Text source (default: a builtin model's own corpus "
                                                                "(builtin:hmm-tiny: its HMM's), else wikitext-103 when "
                                                                "online with `datasets`, else the installed KJV).")] = None,
    tokens: Tokens = EXTRACT.tokens, seq_len: SeqLen = EXTRACT.seq_len, layers: Layers = EXTRACT.layers,
    positions: Positions = EXTRACT.positions,
    doc_blocks: DocBlocks = None,
    skip_first: SkipFirst = EXTRACT.skip_first,
    shard_rows: ShardRows = EXTRACT.shard_rows,
    weights: Weights = WEIGHTS, log: Log = False, device: Device = EXTRACT.device, dtype: Dtype = EXTRACT.dtype,
    batch_size: BatchSize = EXTRACT.batch_size,
    device_map: DeviceMap = EXTRACT.device_map, trust_remote_code: TrustRemoteCode = EXTRACT.trust_remote_code,
    deterministic: Deterministic = EXTRACT.deterministic, force: Force = False,
    plan: Annotated[bool, typer.Option("--plan", help="Print the memory and disk this scan needs (from the config "
                                                      "alone, no weights loaded) and stop; refuse if they do not "
                                                      "fit.")] = False,
    rank: Rank = None, world_size: WorldSize = None,
    settings: GeometrySettings,
):
    """Extract, measure and rank every layer in one resumable command (several ranks under
    torchrun: each extracts its share of the shards and of every layer's geometry)."""
    from geoprobe.pipeline import scan as scan_run, scan_config

    out = out or Path("runs") / model.rstrip("/").split("/")[-1].split(":")[-1].removesuffix(".gguf")
    cfg = scan_config(model, corpus, doc_blocks, tokens=tokens, seq_len=seq_len, layers=layers, positions=positions,
                      skip_first=skip_first, seed=settings.seed, dtype=plain(dtype), shard_rows=shard_rows,
                      batch_size=batch_size, device=device, device_map=plain(device_map), trust_remote_code=trust_remote_code,
                      deterministic=deterministic)
    if plan:
        settings.validate()
        parse_weights(weights)
        _show_plan(model, out, cfg, settings)
        return
    result = scan_run(out, cfg, settings, weights=weights, log=log, force=force, rank=rank, world_size=world_size,
                      extract_progress=progress("extract", "tok"), geometry_progress=progress("geometry", "layer"))
    if result is not None:
        _show_ranking(result)
