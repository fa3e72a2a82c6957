"""Store throughput without a model: how many GB/s of float16 states the shard writer sustains.

The shape is the 8B scan's: d = 4096, 33 captured layers, the store's default shard size (about
124 rows, 33 MB of float16 states per shard). Ours (each row's bytes as one Parquet value,
`writer_threads()` threads, page CRCs, SHA-256 per shard) against the writer as it was (a
fixed-size list of float16, one thread), on the same states, in one process.

Target (issue 15): >= 1 GB/s of float16 states on the 2-core development machine. One H200
running the 8B forward at 20,000 tokens/s x 33 layers x 4,096 values x 2 bytes = 5.4 GB/s of
states for all positions; `--positions random:K` stores K per sequence (random:64 of 2048: 0.17 GB/s).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from geoprobe.extract import to_table
from geoprobe.store import HIDDEN, ShardWriter, column_name, writer_threads

D, LAYERS, ROWS, SHARDS = 4096, 33, 124, 24


def as_lists(parts, layers):
    """The previous layout: a fixed-size list of float16 per row."""
    table, dtypes = to_table(parts, [])
    for layer in layers:
        name = column_name(layer)
        table = table.append_column(name, pa.chunked_array([pa.FixedSizeListArray.from_arrays(
            pa.array(p[name].reshape(-1)), D) for p in parts]))
    return table


def run(make_table, threads: int, parts) -> float:
    work = Path(tempfile.mkdtemp(prefix="geoprobe-store-"))
    (work / HIDDEN).mkdir()
    written = []
    writer = ShardWriter(work, written.append, threads=threads)
    start = time.perf_counter()
    for index in range(SHARDS):
        writer.submit(index, make_table(parts, range(LAYERS)), {})
    writer.close()
    seconds = time.perf_counter() - start
    assert len(written) == SHARDS
    for path in (work / HIDDEN).iterdir():
        os.remove(path)
    return seconds


def main():
    rng = np.random.default_rng(0)
    parts = [{"doc_id": np.zeros(ROWS, np.int64), "seq_id": np.zeros(ROWS, np.int64),
              "position": np.arange(ROWS), "token_id": np.zeros(ROWS, np.int64),
              **{column_name(l): rng.standard_normal((ROWS, D)).astype(np.float16) for l in range(LAYERS)}}]
    gb = SHARDS * ROWS * LAYERS * D * 2 / 1e9
    print(f"{SHARDS} shards x {ROWS} rows x {LAYERS} layers x d={D} float16 = {gb:.2f} GB of states, "
          f"{os.cpu_count()} CPUs")
    before = min(run(as_lists, 1, parts) for _ in range(2))
    print(f"before: float16 lists, 1 thread      : {before:.2f} s  {gb / before:.2f} GB/s")
    for threads in sorted({1, writer_threads()}):
        ours = min(run(lambda p, l: to_table(p, list(l))[0], threads, parts) for _ in range(2))
        print(f"ours: row bytes, {threads} writer thread(s) : {ours:.2f} s  {gb / ours:.2f} GB/s  "
              f"({before / ours:.1f}x; target >= 1 GB/s)")


if __name__ == "__main__":
    main()
