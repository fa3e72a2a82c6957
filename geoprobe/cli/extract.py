"""`geoprobe extract MODEL --corpus SRC --tokens N --out RUN`."""

from __future__ import annotations

from typing import Annotated

import typer

from geoprobe.cli.options import (EXTRACT, BatchSize, Corpus, Deterministic, Device, DeviceMap, DocBlocks, Dtype, Force,
    Layers, Out,
    Positions, Rank, Seed, SeqLen, ShardRows, SkipFirst, Storage, TextField, Tokens, TrustRemoteCode, WorldSize, plain)
from geoprobe.cli.output import progress, show
from geoprobe.cli.root import app
from geoprobe.distributed import world_from
from geoprobe.extract import ExtractConfig, extract as run_extract
from geoprobe.report.terminal import print_table


@app.command(epilog="Examples:\n\n"
             "  geoprobe extract builtin:smollm2 --corpus kjv --tokens 2000 --out runs/kjv\n\n"
             "  geoprobe extract Qwen/Qwen3-8B --corpus data/ --tokens 200000 --layers 0-12 "
             "--positions random:32 --out runs/qwen\n\n"
             "  torchrun --nproc-per-node 8 -m geoprobe extract meta-llama/Llama-3.1-8B-Instruct --corpus data/ "
             "--tokens 1000000 --dtype bfloat16 --out runs/llama8b")
def extract(
    *,
    model: Annotated[str, typer.Argument(help="Hub id, local folder, .gguf file, builtin:smollm2, builtin:gemma3 (after make gemma) or builtin:hmm-tiny (the trained testbed).")],
    out: Out,
    corpus: Corpus = "kjv",
    tokens: Tokens = EXTRACT.tokens,
    seq_len: SeqLen = EXTRACT.seq_len,
    layers: Layers = EXTRACT.layers,
    positions: Positions = EXTRACT.positions,
    doc_blocks: DocBlocks = None,
    skip_first: SkipFirst = EXTRACT.skip_first,
    storage: Storage = EXTRACT.storage,
    text_field: TextField = EXTRACT.text_field,
    shard_rows: ShardRows = EXTRACT.shard_rows,
    seed: Seed = EXTRACT.seed,
    device: Device = EXTRACT.device,
    dtype: Dtype = EXTRACT.dtype,
    batch_size: BatchSize = EXTRACT.batch_size,
    device_map: DeviceMap = EXTRACT.device_map,
    trust_remote_code: TrustRemoteCode = EXTRACT.trust_remote_code,
    deterministic: Deterministic = EXTRACT.deterministic,
    force: Force = False,
    rank: Rank = None,
    world_size: WorldSize = None,
):
    """Stream hidden states of chosen layers into Parquet shards (resumable; several ranks
    under torchrun or with --rank/--world-size, each writing its share of the shards)."""

    cfg = ExtractConfig(model=model, corpus=corpus, tokens=tokens, seq_len=seq_len, layers=layers,
                        positions=positions, doc_blocks=doc_blocks or 0, skip_first=skip_first, seed=seed, storage=plain(storage),
                        text_field=text_field, shard_rows=shard_rows, dtype=plain(dtype), batch_size=batch_size,
                        device=device, device_map=plain(device_map), trust_remote_code=trust_remote_code,
                        deterministic=deterministic)
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
