"""`geoprobe extract`: stream hidden states of chosen layers into a resumable run directory.

The plan (which tokens of which blocks become rows) is fixed before the model runs, from
the corpus, the seed and the position rule alone; so the rows do not depend on the batch
size, a short corpus is refused before anything is written, and a resumed run produces the
same rows as an uninterrupted one. Shards cover fixed ranges of planned blocks.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, version as package_version
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from geoprobe.assets import check_builtin_corpus
from geoprobe.backbone import Backbone, load_backbone, parse_layers
from geoprobe.capture import capture, select_positions
from geoprobe.corpus import Block, iter_blocks, read_documents
from geoprobe.device import choose_determinism, upload
from geoprobe.distributed import SINGLE, World
from geoprobe.errors import BadInput
from geoprobe.files import disk_full_message, holding, is_disk_full, write_json_atomic
from geoprobe.store import (HIDDEN, JOURNAL, MANIFEST, PARTS, ShardWriter, append_journal, check_shards,
    check_writable, column_name, config_sha256, merge_entries, prepare_run, rank_journal, rank_parts, read_journal,
    read_manifest, shard_file, state_array)


def parse_positions(spec: str) -> str:
    if spec == "all":
        return spec
    kind, _, k = spec.partition(":")
    if kind == "random" and k.isdigit() and int(k) > 0:
        return spec
    raise BadInput(f"malformed position spec {spec!r}: use all or random:K (K > 0)")


@dataclass
class ExtractConfig:
    model: str
    corpus: str
    tokens: int = 10000
    seq_len: int = 256
    layers: str = "all"
    positions: str = "all"
    doc_blocks: int = 0  # at most this many blocks per document (0 = all): rows from many documents
    skip_first: int = 1
    seed: int = 0
    storage: str = "float16"
    text_field: str = "text"
    shard_rows: int = 0  # 0 = auto: about 64 MiB of float32 states per shard
    dtype: str = "auto"
    batch_size: int = 8  # placement and speed only: not part of the run's identity
    device: str = "auto"
    device_map: str | None = None
    trust_remote_code: bool = False
    deterministic: bool = True  # deterministic CUDA kernels (geoprobe.device): the shards' bytes are compared

    # where and how fast the rows are computed, not what they are; `layers` enters resolved
    NOT_DEFINING = frozenset({"batch_size", "device", "device_map", "trust_remote_code", "layers", "deterministic"})

    def defining_flags(self) -> dict:
        """The flags that define the rows: every field but NOT_DEFINING, so a field added to this
        class enters the identity (and the reuse check, `same_extraction`) by default."""
        data = {k: v for k, v in asdict(self).items() if k not in self.NOT_DEFINING}
        if not self.doc_blocks:  # runs from before the option resume as they were
            data.pop("doc_blocks")
        return data

    def identity(self, backbone: Backbone, layers: list[int]) -> dict:
        """What defines the rows: a directory holding a run with another identity is refused."""
        data = self.defining_flags()
        data.update(layers=layers, model_config_sha256=backbone.identity["config_sha256"],
                    model_dtype=backbone.identity["dtype"])
        if "file_sha256" in backbone.identity:
            data["model_file_sha256"] = backbone.identity["file_sha256"]
        return data


@dataclass(frozen=True)
class PlannedBlock:
    block: Block
    positions: np.ndarray  # the positions of this block that become rows


def plan_blocks(documents, tokenizer, cfg: ExtractConfig) -> list[PlannedBlock]:
    """Blocks and their selected positions until exactly `cfg.tokens` rows are planned."""
    special = np.array(sorted(set(tokenizer.all_special_ids)), dtype=np.int64)
    plan, rows, per_doc = [], 0, {}
    for block in iter_blocks(documents, tokenizer, cfg.seq_len, cfg.seed):
        if cfg.doc_blocks and per_doc.get(block.doc_id, 0) >= cfg.doc_blocks:
            continue
        per_doc[block.doc_id] = per_doc.get(block.doc_id, 0) + 1
        # seeded per block, so the choice depends neither on batching nor on resume
        rng = np.random.default_rng([cfg.seed, block.doc_id, block.seq_id])
        eligible = select_positions(block.tokens, special, cfg.skip_first, cfg.positions, rng)
        eligible = eligible[: cfg.tokens - rows]
        if len(eligible):
            plan.append(PlannedBlock(block, eligible))
            rows += len(eligible)
        if rows == cfg.tokens:
            return plan
    raise BadInput(f"corpus {cfg.corpus} has only {rows} eligible tokens at --seq-len {cfg.seq_len}, "
                   f"fewer than --tokens {cfg.tokens}")


def pad_batch(blocks: list[Block], pad_id: int, device, length: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    length = length or max(len(b.tokens) for b in blocks)
    ids = np.full((len(blocks), length), pad_id, dtype=np.int64)
    mask = np.zeros((len(blocks), length), dtype=np.int64)
    for row, block in enumerate(blocks):
        ids[row, : len(block.tokens)] = block.tokens
        mask[row, : len(block.tokens)] = 1
    return upload(torch.from_numpy(ids), device), upload(torch.from_numpy(mask), device)


def extract_batch(backbone: Backbone, planned: list[PlannedBlock], layers: list[int], pad_id: int,
                  storage: str) -> dict:
    """Rows of one batch of blocks: meta columns and one (rows, d) array per layer, float16 when
    `storage` asks for it and nothing overflows (cast on the device: half the host traffic)."""
    ids, mask = pad_batch([p.block for p in planned], pad_id, backbone.input_device)
    states = capture(backbone, ids, mask, layers)
    rows_b = np.concatenate([np.full(len(p.positions), i) for i, p in enumerate(planned)])
    rows_p = np.concatenate([p.positions for p in planned])
    columns = {
        "doc_id": np.concatenate([np.full(len(p.positions), p.block.doc_id) for p in planned]),
        "seq_id": np.concatenate([np.full(len(p.positions), p.block.seq_id) for p in planned]),
        "position": rows_p,
        "token_id": ids.cpu().numpy()[rows_b, rows_p],
    }
    # Per device, one (layers, rows, d) buffer in the stored dtype: each layer is gathered and cast
    # into it in one pass (no separate float32 gather, cast and stack), checked with one sum per
    # layer (finite iff every value is: far cheaper than isfinite's boolean tensor) and copied to
    # the host once.
    wanted = torch.float16 if storage == "float16" else torch.float32
    groups: dict = {}
    for layer in layers:
        groups.setdefault(states[layer].device, []).append(layer)
    for device, members in groups.items():
        flat = torch.from_numpy(rows_b * ids.shape[1] + rows_p).to(device)
        width = states[members[0]].shape[-1]
        buffer = torch.empty((len(members), len(flat), width), dtype=wanted, device=device)
        for j, layer in enumerate(members):
            buffer[j].copy_(states[layer].reshape(-1, width).index_select(0, flat))
        finite = torch.isfinite(buffer.view(len(members), -1).sum(dim=1, dtype=torch.float32)).tolist()
        host = buffer.cpu().numpy()
        for j, (layer, ok) in enumerate(zip(members, finite)):
            columns[column_name(layer)] = host[j]
            if not ok:
                exact = states[layer].reshape(-1, width).index_select(0, flat).float()
                if not bool(torch.isfinite(exact).all()):
                    raise BadInput(f"layer {layer} has NaN or Inf activations (document {planned[0].block.doc_id}); "
                                   "try --dtype float32")
                # overflowed float16: this batch (and its shard) stays float32 for this layer
                columns[column_name(layer)] = exact.cpu().numpy()
    return columns


def to_table(parts: list[dict], layers: list[int]) -> tuple[pa.Table, dict]:
    """One shard's table; a layer whose batches were not all float16 is stored as float32 (exact)."""
    arrays, dtypes = {}, {}
    for name in ("doc_id", "seq_id", "position", "token_id"):
        arrays[name] = pa.array(np.concatenate([p[name] for p in parts]).astype(np.int64))
    for layer in layers:
        name = column_name(layer)
        dtype = np.result_type(*[p[name].dtype for p in parts])
        # chunks, not one concatenated copy: this runs on the model's thread
        arrays[name] = pa.chunked_array([state_array(p[name].astype(dtype, copy=False)) for p in parts])
        dtypes[name] = dtype.name
    return pa.table(arrays), dtypes


SHARD_BYTES = 64 * 2**20


def shard_rows(cfg: ExtractConfig, n_layers: int, hidden_size: int) -> int:
    """Rows per shard: the user's choice, or what keeps a shard's float32 states near 64 MiB
    (it bounds the memory of extraction: a shard is built in memory, then written), but never
    fewer than one block's rows: a d = 4,096, 33-layer model at 2,048 positions per block stores
    2,048 x 33 x 4,096 float16 = 553 MB per shard."""
    if cfg.shard_rows:
        return cfg.shard_rows
    return int(np.clip(SHARD_BYTES // (4 * n_layers * hidden_size), cfg.seq_len, 65536))


def blocks_per_shard(cfg: ExtractConfig, n_layers: int, hidden_size: int) -> int:
    """Blocks per shard so that a shard holds about `shard_rows` rows: a block gives seq_len rows,
    or K with --positions random:K (a d = 4096 model with random:32 used to get one block, 32
    rows, per shard)."""
    per_block = int(cfg.positions.split(":", 1)[1]) if cfg.positions.startswith("random:") else cfg.seq_len
    return max(1, shard_rows(cfg, n_layers, hidden_size) // per_block)


def extract_shards(backbone: Backbone, todo: list, layers: list[int], pad_id: int, cfg: ExtractConfig, progress,
                   warm: dict | None = None):
    """(shard index, per-block row parts) for every shard of `todo`, in order. The forward batches
    run over the blocks of consecutive shards alike (a batch is --batch-size blocks even when a
    shard holds fewer), and a shard is yielded as soon as its last block is done. `warm` gets
    the clock after the first batch ("began") and the tokens forwarded after it ("tokens"): the
    rate without the first batch's one-off costs (CUDA context, kernel selection, allocator)."""
    flat = [(index, block) for index, blocks in todo for block in blocks]
    pending: dict[int, list] = {}
    remaining = {index: len(blocks) for index, blocks in todo}
    for start in range(0, len(flat), cfg.batch_size):
        chunk = flat[start:start + cfg.batch_size]
        if warm is not None and start:
            warm.setdefault("began", time.perf_counter())
            warm["tokens"] = warm.get("tokens", 0) + sum(len(block.block.tokens) for _, block in chunk)
        columns = extract_batch(backbone, [block for _, block in chunk], layers, pad_id, cfg.storage)
        bounds = np.cumsum([0] + [len(block.positions) for _, block in chunk])
        for k, (index, _) in enumerate(chunk):
            pending.setdefault(index, []).append({name: value[bounds[k]:bounds[k + 1]] for name, value in columns.items()})
            remaining[index] -= 1
            if remaining[index] == 0:
                yield index, pending.pop(index)
        if progress is not None:
            progress.advance(int(bounds[-1]))


def row_bytes(written: list[dict], n_layers: int, hidden_size: int) -> float:
    """Disk bytes per stored row: measured on the shards written so far, else float16 states."""
    rows = sum(e["rows"] for e in written if "bytes" in e)
    if rows:
        return sum(e["bytes"] for e in written if "bytes" in e) / rows
    return 2 * n_layers * hidden_size + 32


def tokenizer_identity(tokenizer) -> dict:
    return {"class": type(tokenizer).__name__, "name_or_path": tokenizer.name_or_path,
            "vocab_size": len(tokenizer), "bos_token_id": tokenizer.bos_token_id,
            "special_ids": sorted(set(tokenizer.all_special_ids))}


def extract(cfg: ExtractConfig, out: Path, force: bool = False, backbone: Backbone | None = None,
            progress=None, world: World = SINGLE) -> dict:
    """Run (or resume) an extraction into `out`; returns the manifest.

    Several ranks (torchrun, or --rank/--world-size by hand) plan the same blocks and shards,
    and rank r writes the shards whose index is r modulo the world size: each shard holds the
    same rows, in the same order and bytes, as in a one-process run. A rank records its shards in
    its own `parts/rank-R.json`; when every shard exists, rank 0 (under torchrun), or whichever
    rank finishes last (by hand), merges them into the manifest. Resume works with any world size.
    """
    out = Path(out)
    check_extract(cfg, out, force, world)
    choose_determinism(cfg.deterministic)
    with holding(out, "geoprobe extract", world.rank):
        return extract_held(cfg, out, force, backbone, progress, world)


def check_extract(cfg: ExtractConfig, out: Path, force: bool = False, world: World = SINGLE) -> None:
    """Every flag of an extraction, checked before anything loads."""
    parse_positions(cfg.positions)
    if cfg.tokens <= 0:
        raise BadInput(f"--tokens must be positive, got {cfg.tokens}")
    if cfg.storage not in ("float16", "float32"):
        raise BadInput(f"--storage must be float16 or float32, got {cfg.storage!r}")
    if force and world.size > 1 and not world.connected:
        raise BadInput("--force with --world-size > 1 would let one rank delete another's shards; "
                       "start over with a single process or under torchrun")
    check_writable(out)
    check_builtin_corpus(cfg.model, cfg.corpus, lambda: read_documents(cfg.corpus, cfg.text_field))


def _version() -> str:
    """The installed version (pyproject.toml owns it); a source tree that was never installed says so."""
    try:
        return package_version("geoprobe")
    except PackageNotFoundError:
        return "0+unknown"


def _open_manifest(cfg: ExtractConfig, out: Path, force: bool, backbone: Backbone, layers: list[int],
                   world: World) -> tuple[dict, int]:
    """(the run's manifest, blocks per shard): the one on disk when it holds this run (resumed),
    else a new one; written back with the last session's journal folded in."""
    identity = cfg.identity(backbone, layers)
    existing = prepare_run(out, identity, force) if world.is_main else None
    world.barrier()  # rank 0 has cleared (--force) or created the directory
    if not world.is_main:
        existing = prepare_run(out, identity)
    manifest = existing or {
        "tool": "geoprobe", "version": _version(), "command": "extract",
        "config": identity, "config_sha256": config_sha256(identity),
        "model": backbone.identity, "tokenizer": tokenizer_identity(backbone.tokenizer),
        "layers": layers, "hidden_size": backbone.hidden_size, "storage": cfg.storage,
        "rows_target": cfg.tokens, "shards": [], "status": "running",
        "shard_blocks": blocks_per_shard(cfg, len(layers), backbone.hidden_size),
    }
    # runs from before the field was recorded were cut at shard_rows // seq_len blocks per shard
    shard_blocks = manifest.get("shard_blocks") or max(1, shard_rows(cfg, len(layers), backbone.hidden_size) // cfg.seq_len)
    if world.is_main:  # the shards of the last session's journal folded in, the journal restarted
        write_json_atomic(out / MANIFEST, manifest)
        (out / JOURNAL).unlink(missing_ok=True)
    return manifest, shard_blocks


def extract_held(cfg: ExtractConfig, out: Path, force: bool, backbone: Backbone | None, progress, world: World) -> dict:
    """`extract` once the caller holds `out` (and has checked the flags)."""
    documents = read_documents(cfg.corpus, cfg.text_field)
    backbone = backbone or load_backbone(cfg.model, dtype=cfg.dtype, device=world.device(cfg.device, cfg.device_map),
                                         device_map=cfg.device_map, trust_remote_code=cfg.trust_remote_code,
                                         batch=(cfg.batch_size, cfg.seq_len))
    layers = parse_layers(cfg.layers, backbone.num_layers)
    tokenizer = backbone.tokenizer
    plan = plan_blocks(documents, tokenizer, cfg)
    manifest, shard_blocks = _open_manifest(cfg, out, force, backbone, layers, world)
    shard_ranges = [(i, plan[s:s + shard_blocks]) for i, s in enumerate(range(0, len(plan), shard_blocks))]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    parts = rank_parts(out)
    check_shards(out, {"shards": [e for entries in parts.values() for e in entries]}, full=True)
    mine = list(parts.get(world.rank, [])) if world.size > 1 else manifest["shards"]
    done = {e["file"] for e in manifest["shards"]} | {e["file"] for entries in parts.values() for e in entries}
    ours = [(i, blocks) for i, blocks in shard_ranges if i % world.size == world.rank]
    todo = [(i, blocks) for i, blocks in ours if shard_file(i) not in done]
    journal = out / JOURNAL if world.size == 1 else rank_journal(out, world.rank)

    def on_written(entry):  # one appended line per shard; the manifest is rewritten only at the end
        mine.append(entry)
        append_journal(journal, entry)

    # a model on the CPU shares the cores with the writers: one writer thread costs it least
    # (measured: 1.09-1.12x a bare forward with one; two took CPU from torch's threads, 1.16-1.23x;
    # writing in line on the model's thread measured the same as one thread)
    writer = ShardWriter(out, on_written, threads=1 if backbone.input_device.type == "cpu" else None)
    planned = sum(len(p.positions) for _, blocks in ours for p in blocks)  # this rank's rows
    if progress is not None:
        progress.start(total=planned, completed=planned - sum(len(p.positions) for _, blocks in todo for p in blocks))
    started, warm = time.perf_counter(), {}
    try:
        for index, parts_of_shard in extract_shards(backbone, todo, layers, pad_id, cfg, progress, warm):
            table, dtypes = to_table(parts_of_shard, layers)
            writer.submit(index, table, {"blocks": [index * shard_blocks, index * shard_blocks + len(parts_of_shard)],
                                         "dtypes": dtypes})
        writer.close()
    except BaseException as exc:
        cause = writer.abandon() or exc  # every shard that was complete is kept; a partial one is dropped
        if world.size == 1:
            manifest.update(status="interrupted", error=str(cause) or type(cause).__name__)
            manifest["shards"] = merge_entries(mine)
            try:
                write_json_atomic(out / MANIFEST, manifest)
                (out / JOURNAL).unlink(missing_ok=True)
            except OSError:
                pass  # a full disk: the manifest and its journal on disk still list exactly the whole shards
        if is_disk_full(cause):
            left = planned - sum(e["rows"] for e in mine)
            raise BadInput(disk_full_message(out / HIDDEN, left * row_bytes(mine, len(layers), backbone.hidden_size))) \
                from cause
        raise
    finished = time.perf_counter()
    seconds = round(finished - started, 3)
    warm = {"warm_seconds": round(finished - warm["began"], 3), "warm_tokens": warm["tokens"]} if warm else {}
    world.barrier()  # under torchrun every rank's shards exist from here on
    if world.connected and not world.is_main:
        world.barrier()  # rank 0 merges
        return read_manifest(out)
    merged = merge_manifest(out, manifest, len(shard_ranges), plan, seconds, warm)
    world.barrier()
    return merged


def merge_manifest(out: Path, manifest: dict, n_shards: int, plan: list[PlannedBlock], seconds: float,
                   warm: dict | None = None) -> dict:
    """Fold every rank's journal (and this process's) into the manifest; complete when all
    `n_shards` shards exist. `warm`: this session's forward time and tokens after its first batch."""
    manifest["shards"] = merge_entries(manifest["shards"], read_journal(out / JOURNAL), *rank_parts(out).values())
    entries = manifest["shards"]
    if len(entries) < n_shards:  # another rank is still at work (or was stopped): resume finishes it
        manifest.update(status="running", error=f"{n_shards - len(entries)} of {n_shards} shards missing")
    else:
        manifest.pop("error", None)
        manifest.update(status="complete", rows=sum(s["rows"] for s in manifest["shards"]),
                        tokens_forwarded=int(sum(len(p.block.tokens) for p in plan)), seconds_last_session=seconds,
                        **(warm or {"warm_seconds": None, "warm_tokens": None}))
    write_json_atomic(out / MANIFEST, manifest)
    (out / JOURNAL).unlink(missing_ok=True)  # folded into the manifest
    if manifest["status"] == "complete" and (out / PARTS).is_dir():
        shutil.rmtree(out / PARTS)
    return manifest

