"""What the shard integrity checks cost, measured side by side on the same shards.

* writing: Parquet with a CRC per data page (what the store writes) vs. without;
* reading one layer of every shard: page CRCs verified (what every read does) vs. not;
* the cheap check every reader runs (size + footer per shard) vs. a full SHA-256 of every shard
  (what a resume and `RunReader(run, verify=True)` run).
"""

from __future__ import annotations

import hashlib
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from geoprobe.store import damaged_shard

SHARDS, ROWS, LAYERS, D = 8, 2048, 4, 1024  # 8 shards of 16 MiB of float16 states


def table(seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    columns = {"doc_id": pa.array(np.arange(ROWS, dtype=np.int64))}
    for layer in range(LAYERS):
        values = rng.standard_normal(ROWS * D).astype(np.float16)
        columns[f"h{layer:02d}"] = pa.FixedSizeBinaryArray.from_buffers(pa.binary(2 * D), ROWS, [None, pa.py_buffer(values)])
    return pa.table(columns)


def best(fn, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main():
    work = Path(tempfile.mkdtemp(prefix="geoprobe-integrity-"))
    tables = [table(i) for i in range(SHARDS)]
    options = dict(compression="none", use_dictionary=False, write_statistics=False, data_page_version="1.0")

    def write(checksum: bool):
        for i, t in enumerate(tables):
            pq.write_table(t, work / f"{checksum}-{i}.parquet", write_page_checksum=checksum, **options)

    def read(verify: bool):
        for i in range(SHARDS):
            pq.ParquetFile(work / f"True-{i}.parquet", page_checksum_verification=verify).read(columns=["h02"])

    write(True)
    entries = [{"file": f"True-{i}.parquet", "rows": ROWS, "bytes": (work / f"True-{i}.parquet").stat().st_size}
               for i in range(SHARDS)]
    gb = SHARDS * ROWS * LAYERS * D * 2 / 1e9
    w0, w1 = best(lambda: write(False)), best(lambda: write(True))
    r0, r1 = best(lambda: read(False)), best(lambda: read(True))
    cheap = best(lambda: [damaged_shard(work, e) for e in entries])
    full = best(lambda: [hashlib.sha256((work / e["file"]).read_bytes()).hexdigest() for e in entries])
    print(f"{SHARDS} shards x {ROWS} rows x {LAYERS} layers x d={D} float16 ({gb:.2f} GB of states)")
    print(f"write, no page CRC   : {w0:.3f} s ({gb / w0:.2f} GB/s)")
    print(f"write, page CRCs     : {w1:.3f} s ({gb / w1:.2f} GB/s)   ratio {w1 / w0:.2f}")
    print(f"read 1 layer, no CRC : {r0:.3f} s")
    print(f"read 1 layer, CRCs   : {r1:.3f} s   ratio {r1 / r0:.2f}")
    print(f"size+footer check    : {cheap * 1e3 / SHARDS:.2f} ms per shard")
    print(f"full SHA-256         : {full * 1e3 / SHARDS:.1f} ms per shard ({gb / full:.2f} GB/s)   "
          f"{full / cheap:.0f}x the cheap check")


if __name__ == "__main__":
    main()
