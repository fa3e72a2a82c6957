"""The run directory: manifest, Parquet shards written in the background, resume, reading.

Layout (docs/architecture.md): `manifest.json` and `hidden/part-NNNNN.parquet`, one row per sampled
token with columns `doc_id, seq_id, position, token_id, h00, h01, ...`; each hidden column
holds one row's state per value, as the raw bytes of d float16 (when no value overflows) or
float32 numbers (`state_array`; runs written before hold fixed-size float lists, still read).
A shard is written to a temporary name, checksummed, and renamed into place; only then does
the shard journal (`shards.jsonl`, folded into the atomically replaced manifest at the end)
list it. So a crash at any point leaves a directory that resumes.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from geoprobe.errors import BadInput, GeoprobeError
from geoprobe.events import note
from geoprobe.files import is_empty, nearest_existing, read_json, sha256_file

MANIFEST = "manifest.json"
HIDDEN = "hidden"
PARTS = "parts"  # multi-rank extraction: each rank's finished shards until they are merged
META_COLUMNS = ("doc_id", "seq_id", "position", "token_id")


def state_array(states: np.ndarray) -> pa.Array:
    """(rows, d) float16/float32 states as one Parquet FIXED_LEN_BYTE_ARRAY value per row: the
    row's little-endian bytes, written as they are (no per-value encoding: ~20x faster to write
    than a list of float16). Any Parquet reader gets them back with one line:
    `np.frombuffer(pq.read_table(shard, columns=["h03"])["h03"].combine_chunks().buffers()[1],
    np.float16).reshape(-1, d)` (float32 where the manifest's shard "dtypes" say so)."""
    states = np.ascontiguousarray(states)
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(states.shape[1] * states.itemsize), len(states),
                                                [None, pa.py_buffer(states)])


def states_of(column: pa.Array, d: int) -> np.ndarray:
    """(rows, d) numpy states of one column of a batch: the row-bytes layout, or the float lists
    of runs written before it; float16 or float32, told apart by the bytes per row."""
    if pa.types.is_fixed_size_binary(column.type):
        width = column.type.byte_width
        raw = np.frombuffer(column.buffers()[1], dtype=np.uint8)[column.offset * width:(column.offset + len(column)) * width]
        return raw.view(np.float16 if width == 2 * d else np.float32).reshape(-1, d)
    return column.flatten().to_numpy(zero_copy_only=False).reshape(-1, d)  # flatten: respects a slice


def shard_file(index: int) -> str:
    """The one name of shard `index`, relative to the run directory."""
    return f"{HIDDEN}/part-{index:05d}.parquet"


def column_name(layer: int) -> str:
    return f"h{layer:02d}"


def config_sha256(config: dict) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()


def differing_keys(old: dict, new: dict) -> list[str]:
    return sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))


def check_writable(out: Path) -> None:
    """Refuse early, before any work, and without creating anything."""
    nearest = nearest_existing(out)
    try:
        if not nearest.is_dir():
            raise NotADirectoryError(f"{nearest} is a file")
        with tempfile.TemporaryFile(dir=nearest):
            pass
    except OSError as exc:
        raise BadInput(f"output directory {out} is not writable ({exc.strerror or exc})") from exc


def prepare_run(out: Path, config: dict, force: bool = False) -> dict | None:
    """Prepare `out` for a run with `config`: returns the manifest to resume, or None for a new run.

    A directory that holds a run with another config is refused (naming the keys), unless
    `force`, which starts over.
    """
    check_writable(out)
    manifest_path = out / MANIFEST
    if force and out.exists():
        if manifest_path.exists() or (out / HIDDEN).exists():
            (out / HIDDEN).exists() and shutil.rmtree(out / HIDDEN)
            (out / PARTS).exists() and shutil.rmtree(out / PARTS)
            manifest_path.unlink(missing_ok=True)
    if manifest_path.exists():
        manifest = read_manifest(out)
        keys = differing_keys(manifest["config"], config)
        if keys:
            raise BadInput(f"{out} holds a different run (differs in: {', '.join(keys)}); "
                           "use another --out or --force to start over")
        dropped = drop_damaged(out, manifest)
        if dropped:
            note(f"note: re-extracting {len(dropped)} missing or damaged shard(s): {', '.join(dropped)}")
        return manifest
    if not is_empty(out) and not (out / HIDDEN).exists():
        raise BadInput(f"output directory {out} is not empty and holds no geoprobe run; use another --out")
    try:
        (out / HIDDEN).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInput(f"output directory {out} is not writable ({exc.strerror})") from exc
    return None


JOURNAL = "shards.jsonl"  # shards finished since the manifest was last written, one JSON line each


def read_manifest(run: Path) -> dict:
    """The manifest, with the shards its journal lists since it was last written folded in."""
    manifest = read_json(Path(run) / MANIFEST, f"{run} is not a geoprobe run directory (no {MANIFEST})")
    journal = read_journal(Path(run) / JOURNAL)
    if journal:
        manifest["shards"] = merge_entries(manifest["shards"], journal)
    return manifest


def merge_entries(*lists: list[dict]) -> list[dict]:
    """Shard entries of several lists, one per file (the later list wins), in shard order."""
    entries = {e["file"]: e for entries in lists for e in entries}
    return [entries[f] for f in sorted(entries)]


def append_journal(path: Path, entry: dict) -> None:
    """Record one finished shard: one appended line (constant work per shard, where rewriting the
    whole manifest was quadratic in the number of shards), flushed to the disk."""
    with open(path, "a") as handle:
        handle.write(json.dumps(entry) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def read_journal(path: Path) -> list[dict]:
    """The entries of a journal; a last line cut short by a crash is ignored (its shard is redone)."""
    if not path.is_file():
        return []
    entries = []
    for line in path.read_text().splitlines():
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return entries


def rank_journal(run: Path, rank: int) -> Path:
    (Path(run) / PARTS).mkdir(exist_ok=True)
    return Path(run) / PARTS / f"rank-{rank:03d}.jsonl"


def rank_parts(run: Path) -> dict[int, list[dict]]:
    """The shards each rank of a multi-process extraction has finished and not yet merged."""
    return {int(path.stem.split("-")[1]): read_journal(path) for path in sorted((Path(run) / PARTS).glob("rank-*.jsonl"))}


def damaged_shard(run: Path, shard: dict, full: bool = False) -> str | None:
    """Why shard `shard` of `run` cannot be trusted, or None. Always: it exists, has the recorded
    size and a readable Parquet footer with the recorded rows (one small read per shard); with
    `full`, also its SHA-256 (reads the whole file). Every data page also carries a CRC that
    each read checks, so a flipped byte the cheap check misses is still caught when read."""
    path = Path(run) / shard["file"]
    if not path.is_file():
        return "is missing"
    size = path.stat().st_size
    if "bytes" in shard and size != shard["bytes"]:
        return f"has {size} bytes where {shard['bytes']} were written (truncated or changed)"
    try:
        rows = pq.ParquetFile(path).metadata.num_rows
    except Exception:
        return "is not a readable Parquet file (truncated or corrupt)"
    if rows != shard["rows"]:
        return f"holds {rows} rows where {shard['rows']} were written"
    if full and sha256_file(path) != shard["sha256"]:
        return "does not match its checksum (changed after it was written)"
    return None


def shard_refusal(run: Path, file: str, why: str) -> BadInput:
    return BadInput(f"shard {Path(run) / file} {why}; delete it and rerun the same `geoprobe scan` or "
                    "`extract` command to re-extract it")


def check_shards(run: Path, manifest: dict, full: bool = False) -> None:
    """Refuse, naming the first damaged shard, before anything computes on the run."""
    for shard in manifest["shards"]:
        why = damaged_shard(run, shard, full)
        if why:
            raise shard_refusal(run, shard["file"], why)


def drop_damaged(run: Path, manifest: dict) -> list[str]:
    """Resume: forget (and delete) every shard that fails the full check, so it is extracted again;
    returns their names."""
    dropped = [s["file"] for s in manifest["shards"] if damaged_shard(run, s, full=True)]
    for name in dropped:
        (Path(run) / name).unlink(missing_ok=True)
    manifest["shards"] = [s for s in manifest["shards"] if s["file"] not in dropped]
    if dropped:
        manifest["status"] = "running"
    return dropped


def writer_threads() -> int:
    """Two writers on a small machine (encoding and hashing release the GIL), up to four on a
    GPU host, where one GPU's states arrive faster than one thread writes them."""
    return max(2, min(4, (os.cpu_count() or 2) // 4))


class ShardWriter:
    """Writes shards on background threads so the model never waits on the disk.

    The queue is bounded (two shards per thread), which bounds memory: a producer faster than the
    disk blocks instead of accumulating. `on_written(entry)` runs on a writer thread after the
    atomic rename, one call at a time, in the order the shards finish (not always their index
    order: a caller that lists them sorts).
    """

    def __init__(self, run: Path, on_written, threads: int | None = None):
        self.run = Path(run)
        self.on_written = on_written
        count = threads or writer_threads()
        self.queue: queue.Queue = queue.Queue(maxsize=2 * count)
        self.done = threading.Lock()  # serialises on_written (the caller's journal is appended there)
        self.error: BaseException | None = None
        self.threads = [threading.Thread(target=self._loop, name=f"geoprobe-shard-writer-{i}", daemon=True)
                        for i in range(count)]
        for thread in self.threads:
            thread.start()

    def submit(self, index: int, table: pa.Table, extra: dict) -> None:
        self._raise_if_failed()
        self.queue.put((index, table, extra))

    def close(self) -> None:
        self.abandon()
        self._raise_if_failed()

    def abandon(self) -> BaseException | None:
        """Stop after the shards already queued (each whole or not at all); the writers' error, if any."""
        for _ in self.threads:
            self.queue.put(None)
        for thread in self.threads:
            thread.join()
        return self.error

    def _raise_if_failed(self):
        if self.error is not None:
            raise GeoprobeError(f"writing a shard failed: {self.error}") from self.error

    def _loop(self):
        try:  # Linux: a thread is a task; a lower priority lets the model's threads run first
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        except (AttributeError, OSError):
            pass
        while (item := self.queue.get()) is not None:
            if self.error is not None:
                continue
            index, table, extra = item
            name = shard_file(index)
            final = self.run / name
            tmp = final.with_name(f".{final.name}.tmp")
            try:
                # Hidden states barely compress and never repeat: no codec, no dictionary, no
                # statistics, and v1 data pages measured ~2x faster to write than the defaults.
                # Page CRCs: every later read verifies them (bench/store_integrity.py has the cost).
                pq.write_table(table, tmp, compression="none", use_dictionary=False, write_statistics=False,
                               data_page_version="1.0", write_page_checksum=True)
                entry = {"file": name, "rows": table.num_rows, "bytes": tmp.stat().st_size,
                         "sha256": sha256_file(tmp), **extra}
                os.replace(tmp, final)
                with self.done:
                    self.on_written(entry)
            except BaseException as exc:  # surfaced to the producer on its next call
                self.error = exc
                tmp.unlink(missing_ok=True)  # a partial shard is never left behind (disk full: frees it)


class RunReader:
    """Streams one layer of a run as float32 batches without loading the whole run."""

    def __init__(self, run, verify: bool = False, manifest: dict | None = None):
        """Checks every shard's size and footer (cheap); `verify` adds the full SHA-256.
        `manifest`: the run's manifest as `read_manifest` just returned it (not read again)."""
        self.run = Path(run)
        self.manifest = read_manifest(self.run) if manifest is None else manifest
        check_shards(self.run, self.manifest, full=verify)

    @property
    def layers(self) -> list[int]:
        return self.manifest["layers"]

    @property
    def hidden_size(self) -> int:
        return self.manifest["hidden_size"]

    @property
    def num_rows(self) -> int:
        return sum(s["rows"] for s in self.manifest["shards"])

    def _files(self):
        return [self.run / s["file"] for s in self.manifest["shards"]]

    def _read(self, path: Path, read):
        """`read(ParquetFile)` with every page's CRC checked; a damaged page is one line naming the shard."""
        try:
            return read(pq.ParquetFile(path, page_checksum_verification=True))
        except OSError as exc:
            raise shard_refusal(self.run, path.relative_to(self.run), f"is corrupt ({exc})") from exc

    def iter_columns(self, columns, batch_rows: int = 65536) -> Iterator[pa.RecordBatch]:
        for path in self._files():
            yield from self._read(path, lambda f: list(f.iter_batches(batch_size=batch_rows, columns=list(columns))))

    def _batches(self, columns, batch_rows: int, rows: tuple[int, int] | None) -> Iterator[pa.RecordBatch]:
        if rows is None:
            yield from self.iter_columns(columns, batch_rows)
            return
        lo, hi = rows
        start = 0
        for shard, path in zip(self.manifest["shards"], self._files()):
            stop = start + shard["rows"]
            if stop > lo and start < hi:
                table = self._read(path, lambda f: f.read(columns=list(columns)))
                table = table.slice(max(lo - start, 0), min(hi, stop) - max(lo, start))
                yield from table.to_batches(max_chunksize=batch_rows)
            start = stop

    def iter_layer(self, layer: int, batch_rows: int = 65536, torch_device=None,
                   rows: tuple[int, int] | None = None) -> Iterator:
        """(rows, d) float32 numpy arrays, or torch tensors on `torch_device` when given; only the
        global row range [lo, hi) when `rows` is given (shards outside it are not opened)."""
        if layer not in self.layers:
            raise BadInput(f"layer {layer} was not captured in {self.run} (captured: {self.layers})")
        d = self.hidden_size
        for batch in self._batches([column_name(layer)], batch_rows, rows):
            array = states_of(batch.column(0), d).astype(np.float32)
            if torch_device is None:
                yield array
            else:
                import torch

                yield torch.from_numpy(array).to(torch_device)

    def read_layer(self, layer: int) -> np.ndarray:
        return np.concatenate(list(self.iter_layer(layer)) or [np.zeros((0, self.hidden_size), np.float32)])

    def read_meta(self) -> dict[str, np.ndarray]:
        parts = list(self.iter_columns(META_COLUMNS))
        return {name: np.concatenate([p.column(i).to_numpy() for p in parts]) if parts else np.zeros(0, np.int64)
                for i, name in enumerate(META_COLUMNS)}
