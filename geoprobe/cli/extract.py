"""`geoprobe extract MODEL --corpus SRC --tokens N --out RUN`."""

from __future__ import annotations

from typing import Annotated

import typer

from geoprobe.cli.root import app
from geoprobe.cli.output import progress, show
from geoprobe.cli.options import (BatchSize, Corpus, Device, DeviceMap, DocBlocks, Dtype, Force, Layers, Out, Seed,
                                  SeqLen, Rank, Tokens, TrustRemoteCode, WorldSize)


@app.command(epilog="Examples:\n\n"
             "  geoprobe extract builtin:smollm2 --corpus kjv --tokens 2000 --out runs/kjv\n\n"
             "  geoprobe extract Qwen/Qwen3-8B --corpus data/ --tokens 200000 --layers 0-12 "
             "--positions random:32 --out runs/qwen\n\n"
             "  torchrun --nproc-per-node 8 -m geoprobe extract meta-llama/Llama-3.1-8B-Instruct --corpus data/ "
             "--tokens 1000000 --dtype bfloat16 --out runs/llama8b")
def extract(
    model: Annotated[str, typer.Argument(help="Hub id, local folder, .gguf file, builtin:smollm2 or builtin:hmm-tiny (the trained testbed).")],
    out: Out,
    corpus: Corpus = "kjv",
    tokens: Tokens = 10000,
    seq_len: SeqLen = 256,
    layers: Layers = "all",
    positions: Annotated[str, typer.Option(help="all, or random:K positions per sequence.")] = "all",
    doc_blocks: DocBlocks = None,
    skip_first: Annotated[int, typer.Option(min=0, help="Skip the first N positions (the attention sink).")] = 1,
    storage: Annotated[str, typer.Option(help="float16 (float32 where a value would overflow) or float32.")] = "float16",
    text_field: Annotated[str, typer.Option(help="Text field of JSONL/Parquet corpora.")] = "text",
    shard_rows: Annotated[int, typer.Option(min=0, help="Approximate rows per Parquet shard "
                                                         "(0 = about 64 MiB of float32 states, at least one block: "
                                                         "a d = 4,096 model at --seq-len 2048, --positions all "
                                                         "stores ~550 MB per shard).")] = 0,
    seed: Seed = 0,
    device: Device = "auto",
    dtype: Dtype = "auto",
    batch_size: BatchSize = 8,
    device_map: DeviceMap = None,
    trust_remote_code: TrustRemoteCode = False,
    force: Force = False,
    rank: Rank = None,
    world_size: WorldSize = None,
):
    """Stream hidden states of chosen layers into Parquet shards (resumable; several ranks
    under torchrun or with --rank/--world-size, each writing its share of the shards)."""
    from geoprobe.distributed import world_from
    from geoprobe.extract import ExtractConfig
    from geoprobe.extract import extract as run_extract
    from geoprobe.report.terminal import print_table

    cfg = ExtractConfig(model=model, corpus=corpus, tokens=tokens, seq_len=seq_len, layers=layers,
                        positions=positions, doc_blocks=doc_blocks or 0, skip_first=skip_first, seed=seed, storage=storage,
                        text_field=text_field, shard_rows=shard_rows, dtype=dtype, batch_size=batch_size,
                        device=device, device_map=device_map, trust_remote_code=trust_remote_code)
    bar = progress("extract", "tok")
    try:
        manifest = run_extract(cfg, out, force=force, progress=bar, world=world_from(rank, world_size))
    finally:
        bar.stop()
    dtypes = sorted({d for s in manifest["shards"] for d in s["dtypes"].values()})
    show(manifest, lambda: print_table(f"extract → {out}", ["key", "value"], [
            ["model", manifest["model"]["spec"]],
            ["layers", f"{manifest['layers'][0]}..{manifest['layers'][-1]} ({len(manifest['layers'])})"],
            ["rows per layer", manifest.get("rows", sum(s["rows"] for s in manifest["shards"]))],
            ["hidden size", manifest["hidden_size"]],
            ["shards", len(manifest["shards"])],
            ["storage", ", ".join(dtypes)],
            ["status", manifest["status"]],
        ]))
