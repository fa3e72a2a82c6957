"""Text sources -> documents -> tokenized, packed blocks, split by document.

One spec string names a source:

* `kjv` — the public-domain King James Bible (Debian `bible-kjv`), one document per chapter;
* `path/file.txt` — documents separated by blank lines;
* `path/file.jsonl` — one document per record, text in `--text-field` (default `text`);
* `path/file.parquet` — one document per row, text in the `--text-field` column;
* a folder or a glob (`data/*.jsonl`) — the union of its files, in sorted order;
* `hf:NAME?split=train&config=...` — a Hugging Face dataset, streamed (needs `datasets`);
* `synthetic:hmm?states=8&vocab=200&docs=400&length=80&seed=0` — pseudo-text from a seeded
  hidden Markov model whose exact log-probabilities are known (`geoprobe.synthetic`).

Blocks never cross documents, so every stored token has one `doc_id`, and the train /
validation split is by document (a seeded hash of the document id), never by block.
"""

from __future__ import annotations

import glob
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl

import numpy as np

from geoprobe.errors import BadInput

TEXT_SUFFIXES = (".txt", ".jsonl", ".json", ".parquet")


def check_text(path: Path, sample: int = 1 << 16) -> None:
    """Refuse a file that is not text (judged on its first 64 KiB): a NUL byte, or more than 1% of
    the characters undecodable as UTF-8. Tokenising a binary file would only make noise."""
    with open(path, "rb") as handle:
        head = handle.read(sample)
    decoded = head.decode("utf-8", errors="replace")
    if b"\0" in head or decoded.count("\ufffd") > 0.01 * max(len(decoded), 1):
        raise BadInput(f"corpus file {path} is not text (binary or not UTF-8); pass a .txt, .jsonl or .parquet "
                       "corpus")


def _txt_documents(path: Path) -> Iterator[str]:
    check_text(path)
    text = path.read_text(encoding="utf-8", errors="replace")
    for chunk in text.replace("\r\n", "\n").split("\n\n"):
        if chunk.strip():
            yield chunk.strip()


def iter_jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    """(line number, record) of a JSON-lines file; a bad line is a one-line error naming it."""
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise BadInput(f"{path}:{number}: not valid JSON ({exc.msg})") from exc
            if not isinstance(record, dict):
                raise BadInput(f"{path}:{number}: a line must hold a JSON object")
            yield number, record


def _jsonl_documents(path: Path, field: str) -> Iterator[str]:
    for number, record in iter_jsonl(path):
        if field not in record:
            raise BadInput(f"{path}:{number}: record has no field {field!r} (use --text-field)")
        if str(record[field]).strip():
            yield str(record[field])


def _parquet_documents(path: Path, field: str) -> Iterator[str]:
    import pyarrow.parquet as pq

    source = pq.ParquetFile(path)
    if field not in source.schema_arrow.names:
        raise BadInput(f"{path}: no column {field!r} (columns: {', '.join(source.schema_arrow.names)})")
    for batch in source.iter_batches(columns=[field]):
        for text in batch.column(0).to_pylist():
            if text and text.strip():
                yield text


def _file_documents(path: Path, field: str) -> Iterator[str]:
    if path.suffix in (".jsonl", ".json"):
        return _jsonl_documents(path, field)
    if path.suffix == ".parquet":
        return _parquet_documents(path, field)
    return _txt_documents(path)


def _hf_documents(spec: str, field: str) -> Iterator[str]:
    try:
        import datasets
    except ImportError as exc:
        raise BadInput(f"corpus {spec!r} needs the `datasets` package (pip install datasets)") from exc
    name, _, query = spec[len("hf:"):].partition("?")
    options = dict(parse_qsl(query))
    try:
        stream = datasets.load_dataset(name, options.pop("config", None), split=options.pop("split", "train"),
                                       streaming=True, **options)
    except Exception as exc:  # datasets raises many types for "not found / offline"
        raise BadInput(f"cannot open dataset {name!r}: {str(exc).splitlines()[0]}") from exc
    for record in stream:
        if record.get(field):
            yield record[field]


def source_files(spec: str) -> list[Path]:
    path = Path(spec).expanduser()
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES)
    elif any(ch in spec for ch in "*?["):
        files = sorted(Path(p) for p in glob.glob(str(path)) if Path(p).is_file())
    elif path.is_file():
        files = [path]
    else:
        raise BadInput(f"corpus not found: {spec}")
    if not files:
        raise BadInput(f"corpus {spec} holds no .txt, .jsonl or .parquet files")
    return files


def check_source(spec: str) -> None:
    """Refuse a corpus spec that names nothing, without reading it (files exist, a synthetic spec parses)."""
    if spec == "kjv" or spec.startswith("hf:"):
        return
    if spec.startswith("synthetic:"):
        from geoprobe.synthetic import hmm_from_spec

        hmm_from_spec(spec)
        return
    source_files(spec)


def iter_documents(spec: str, text_field: str = "text") -> Iterator[str]:
    """Every document of the source, in a fixed order."""
    if spec == "kjv":
        from geoprobe.assets import kjv_text

        yield from _txt_documents(kjv_text())
    elif spec.startswith("hf:"):
        yield from _hf_documents(spec, text_field)
    elif spec.startswith("synthetic:"):
        from geoprobe.synthetic import documents

        yield from documents(spec)
    else:
        for path in source_files(spec):
            yield from _file_documents(path, text_field)


def read_documents(spec: str, text_field: str = "text") -> list[str]:
    documents = list(iter_documents(spec, text_field))
    if not documents:
        raise BadInput(f"corpus {spec} is empty")
    return documents


def is_validation(doc_id: int, seed: int, fraction: float) -> bool:
    """Seeded, order-free assignment of a document to the validation split."""
    digest = hashlib.sha256(f"{seed}:{doc_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


VAL_FRACTION = 0.05  # the share of documents a trained generator holds out (dsl train, baseline train)


def split_documents(spec: str, seed: int, fraction: float = VAL_FRACTION) -> tuple[list[str], list[str]]:
    """(training, held-out) documents of a source: a seeded `fraction` of the documents is held
    out (`is_validation`); a source too small to hold one out holds out its last document."""

    documents = read_documents(spec)
    train_docs = [d for i, d in enumerate(documents) if not is_validation(i, seed, fraction)]
    val_docs = [d for i, d in enumerate(documents) if is_validation(i, seed, fraction)] or documents[-1:]
    return train_docs, val_docs


@dataclass(frozen=True)
class Block:
    """One packed sequence: `tokens` (length <= seq_len), block `seq_id` of document `doc_id`.

    (doc_id, seq_id, position) names a token uniquely whatever the rank that read it."""

    doc_id: int
    seq_id: int
    tokens: np.ndarray


def tokenize(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def document_blocks(doc_id: int, token_ids: list[int], seq_len: int, bos_id: int | None) -> Iterator[np.ndarray]:
    """Cut one document into blocks of seq_len tokens, each starting with BOS when there is one."""
    step = seq_len - (bos_id is not None)
    for start in range(0, len(token_ids), step):
        chunk = token_ids[start:start + step]
        if bos_id is not None:
            chunk = [bos_id, *chunk]
        yield np.asarray(chunk, dtype=np.int64)


def iter_blocks(documents: list[str], tokenizer, seq_len: int, seed: int, split: str = "all",
                val_fraction: float = 0.0, rank: int = 0, world_size: int = 1) -> Iterator[Block]:
    """Blocks in a seeded document order; `rank`/`world_size` take a disjoint share of documents."""
    if seq_len < 2:
        raise BadInput(f"--seq-len must be at least 2, got {seq_len}")
    order = np.random.default_rng(seed).permutation(len(documents))
    bos_id = tokenizer.bos_token_id
    for position, doc_id in enumerate(order.tolist()):
        if position % world_size != rank:
            continue
        if split != "all" and is_validation(doc_id, seed, val_fraction) != (split == "validation"):
            continue
        for seq_id, tokens in enumerate(document_blocks(doc_id, tokenize(tokenizer, documents[doc_id]),
                                                        seq_len, bos_id)):
            yield Block(doc_id, seq_id, tokens)
