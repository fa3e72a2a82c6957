"""Corpus sources, packing and the document-level split."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from geoprobe.assets import parse_bible_output
from geoprobe.corpus import is_validation, iter_blocks, read_documents
from geoprobe.errors import BadInput
from tests.helpers import build_tokenizer


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("tok"))


def test_sources_agree(tmp_path):
    docs = ["first document\nwith two lines", "second one", "third"]
    (tmp_path / "a.txt").write_text("\n\n".join(docs) + "\n\n\n")
    (tmp_path / "b.jsonl").write_text("\n".join(json.dumps({"body": d}) for d in docs))
    pq.write_table(pa.table({"body": docs}), tmp_path / "c.parquet")
    assert read_documents(str(tmp_path / "a.txt")) == docs
    assert read_documents(str(tmp_path / "b.jsonl"), "body") == docs
    assert read_documents(str(tmp_path / "c.parquet"), "body") == docs
    assert read_documents(str(tmp_path / "*.jsonl"), "body") == docs
    # a folder is the union of its files, in sorted order
    assert read_documents(str(tmp_path), "body") == docs * 3
    with pytest.raises(BadInput, match="no field 'text'"):
        read_documents(str(tmp_path / "b.jsonl"))


def test_missing_and_empty_corpora(tmp_path):
    with pytest.raises(BadInput, match="corpus not found"):
        read_documents(str(tmp_path / "nothing.txt"))
    (tmp_path / "empty.txt").write_text("\n\n  \n")
    with pytest.raises(BadInput, match="is empty"):
        read_documents(str(tmp_path / "empty.txt"))


def test_blocks_start_with_bos_never_cross_documents_and_are_seeded(tokenizer):
    docs = [" ".join(["light water"] * n) for n in (3, 50, 120, 7)]
    blocks = list(iter_blocks(docs, tokenizer, seq_len=32, seed=5))
    assert all(b.tokens[0] == tokenizer.bos_token_id and len(b.tokens) <= 32 for b in blocks)
    for doc_id, text in enumerate(docs):
        mine = [b for b in blocks if b.doc_id == doc_id]
        assert [b.seq_id for b in mine] == list(range(len(mine)))
        rebuilt = np.concatenate([b.tokens[1:] for b in mine]).tolist()
        assert rebuilt == tokenizer(text, add_special_tokens=False)["input_ids"]
    again = list(iter_blocks(docs, tokenizer, seq_len=32, seed=5))
    assert [(b.doc_id, b.seq_id) for b in again] == [(b.doc_id, b.seq_id) for b in blocks]
    other = list(iter_blocks(docs, tokenizer, seq_len=32, seed=6))
    assert [b.doc_id for b in other] != [b.doc_id for b in blocks] or len(docs) < 3


def test_split_is_by_document_and_ranks_are_disjoint(tokenizer):
    docs = [f"light {i} water " * 30 for i in range(60)]
    train = list(iter_blocks(docs, tokenizer, 16, seed=0, split="train", val_fraction=0.25))
    val = list(iter_blocks(docs, tokenizer, 16, seed=0, split="validation", val_fraction=0.25))
    train_docs, val_docs = {b.doc_id for b in train}, {b.doc_id for b in val}
    assert train_docs.isdisjoint(val_docs) and train_docs | val_docs == set(range(60))
    assert 5 <= len(val_docs) <= 25
    assert all(is_validation(d, 0, 0.25) for d in val_docs)
    ranks = [{(b.doc_id, b.seq_id) for b in iter_blocks(docs, tokenizer, 16, 0, rank=r, world_size=2)} for r in (0, 1)]
    single = {(b.doc_id, b.seq_id) for b in iter_blocks(docs, tokenizer, 16, 0)}
    assert ranks[0].isdisjoint(ranks[1]) and ranks[0] | ranks[1] == single


def test_parse_bible_output_joins_wrapped_verses():
    text = ("\nGenesis 1\n\n  1 In the beginning God created the heaven and the earth.\n"
            "  2 And the earth was without form, and void; and darkness was upon the face of\n"
            "the deep.\n\nGenesis 2\n\n  1 Thus the heavens were finished.\n")
    chapters = parse_bible_output(text)
    assert chapters == ["In the beginning God created the heaven and the earth. And the earth was without form, "
                        "and void; and darkness was upon the face of the deep.",
                        "Thus the heavens were finished."]


def test_a_first_use_build_is_made_once_when_two_processes_need_it_at_once(tmp_path):
    """`building` is one cache-wide lock per build: while one holder has it another cannot take it,
    and two processes that start the KJV's first-use build at the same moment both return the
    same whole file (the second waits, then finds it built)."""
    import fcntl
    import os
    import subprocess
    import sys

    os.environ["GEOPROBE_CACHE"] = str(tmp_path / "lockcheck")
    try:
        from geoprobe.assets import building, cache_dir

        with building("x"), open(cache_dir() / ".x.lock", "w") as other:
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with open(cache_dir() / ".x.lock", "w") as other:
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free again
    finally:
        del os.environ["GEOPROBE_CACHE"]
    env = {**os.environ, "GEOPROBE_CACHE": str(tmp_path / "cache")}
    code = "from geoprobe.assets import kjv_text; p = kjv_text(); print(p.stat().st_size)"
    both = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
            for _ in range(2)]
    sizes = [int(p.communicate(timeout=300)[0]) for p in both]
    assert all(p.returncode == 0 for p in both) and sizes[0] == sizes[1] > 4_000_000
    assert sorted(x.name for x in (tmp_path / "cache").iterdir()) == [".kjv.lock", "kjv.txt"]  # no stray .tmp
