"""`geoprobe extract` end to end: run directory, values, resume, and every bad input."""

import json
import signal
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from geoprobe.backbone import load_backbone
from geoprobe.capture import capture
from geoprobe.backbone import parse_layers
from geoprobe.extract import ExtractConfig, extract
from geoprobe.store import RunReader, read_manifest, state_array
from tests.helpers import (ONE_THREAD, all_rows, assert_one_line_error, build_model, interrupted_copy, invoke,
                           read_json, run_cli, write_corpus)


def cfg_for(folder, corpus, **kw):
    base = dict(model=str(folder), corpus=str(corpus), tokens=1500, seq_len=64, shard_rows=256, batch_size=4,
                device="cpu")
    return ExtractConfig(**{**base, **kw})


def test_extract_writes_the_run_directory(tmp_path, tiny_models, corpus_txt, llama):
    run = tmp_path / "run"
    manifest = extract(cfg_for(tiny_models("llama"), corpus_txt), run, backbone=llama)
    assert manifest["status"] == "complete" and manifest["rows"] == 1500
    assert manifest["layers"] == [0, 1, 2, 3] and manifest["hidden_size"] == 64
    assert len(manifest["shards"]) >= 3  # shard_rows=256 at seq 64: several shards
    files = sorted((run / "hidden").iterdir())
    assert [f.name for f in files] == [s["file"].split("/")[1] for s in manifest["shards"]]
    assert not list(run.rglob(".*.tmp"))
    table = all_rows(run)
    assert table.column_names == ["doc_id", "seq_id", "position", "token_id", "h00", "h01", "h02", "h03"]
    assert table.num_rows == 1500
    assert str(table.schema.field("h00").type) == "fixed_size_binary[128]"  # 64 float16 per row
    keys = list(zip(*(table.column(c).to_pylist() for c in ("doc_id", "seq_id", "position"))))
    assert len(set(keys)) == 1500
    positions = np.array(table.column("position"))
    tokens = np.array(table.column("token_id"))
    assert positions.min() >= 1  # the BOS / attention-sink position is skipped
    assert not np.isin(tokens, llama.tokenizer.all_special_ids).any()
    # layer 0 is the embedding lookup of the stored token (stored as float16)
    h0 = RunReader(run).read_layer(0)
    table0 = llama.model.get_input_embeddings().weight.detach().numpy()[tokens]
    np.testing.assert_allclose(h0, table0.astype(np.float16).astype(np.float32), rtol=0, atol=0)
    # the one-line read the store documents, with nothing but pyarrow and numpy
    shard = run / read_manifest(run)["shards"][0]["file"]
    plain = np.frombuffer(pq.read_table(shard, columns=["h00"])["h00"].combine_chunks().buffers()[1],
                          np.float16).reshape(-1, 64)
    np.testing.assert_array_equal(plain.astype(np.float32), h0[: len(plain)])


def test_runs_written_as_float_lists_are_still_read(tmp_path):
    from geoprobe.store import states_of

    states = np.random.default_rng(0).standard_normal((7, 5)).astype(np.float16)
    as_list = pa.FixedSizeListArray.from_arrays(pa.array(states.reshape(-1)), 5)
    as_bytes = state_array(states)
    for column in (as_list, as_bytes, as_list.slice(2, 3), as_bytes.slice(2, 3)):
        expected = states[2:5] if len(column) == 3 else states
        np.testing.assert_array_equal(states_of(column, 5), expected)
    wide = state_array(states.astype(np.float32))
    assert states_of(wide, 5).dtype == np.float32 and np.array_equal(states_of(wide, 5), states)


def test_stored_states_equal_a_direct_forward_pass(tmp_path, tiny_models, corpus_txt, llama):
    run = tmp_path / "run"
    extract(cfg_for(tiny_models("llama"), corpus_txt, tokens=300, storage="float32"), run, backbone=llama)
    reader = RunReader(run)
    meta = reader.read_meta()
    from geoprobe.corpus import iter_blocks, read_documents

    blocks = {(b.doc_id, b.seq_id): b.tokens for b in
              iter_blocks(read_documents(str(corpus_txt)), llama.tokenizer, 64, seed=0)}
    first = (int(meta["doc_id"][0]), int(meta["seq_id"][0]))
    ids = torch.from_numpy(blocks[first])[None]
    states = capture(llama, ids, layers=range(4))
    rows = (meta["doc_id"] == first[0]) & (meta["seq_id"] == first[1])
    for layer in range(4):
        stored = reader.read_layer(layer)[rows]
        np.testing.assert_allclose(stored, states[layer][0, meta["position"][rows]].numpy(), rtol=1e-5, atol=1e-5)


def test_rows_do_not_depend_on_batch_size_and_positions_random(tmp_path, tiny_models, corpus_txt, llama):
    a = extract(cfg_for(tiny_models("llama"), corpus_txt, batch_size=1, positions="random:5", tokens=200),
                tmp_path / "a", backbone=llama)
    b = extract(cfg_for(tiny_models("llama"), corpus_txt, batch_size=7, positions="random:5", tokens=200),
                tmp_path / "b", backbone=llama)
    ta, tb = all_rows(tmp_path / "a"), all_rows(tmp_path / "b")
    for col in ("doc_id", "seq_id", "position", "token_id"):
        assert ta.column(col).to_pylist() == tb.column(col).to_pylist()
    seqs = list(zip(ta.column("doc_id").to_pylist(), ta.column("seq_id").to_pylist()))
    assert max(seqs.count(s) for s in set(seqs)) == 5
    np.testing.assert_allclose(RunReader(tmp_path / "a").read_layer(3), RunReader(tmp_path / "b").read_layer(3),
                               rtol=2e-3, atol=2e-3)
    assert a["config"] == b["config"]  # batch size is not part of a run's identity


def test_resume_after_interruption_gives_the_rows_of_an_uninterrupted_run(tmp_path, tiny_models, corpus_txt, llama):
    cfg = cfg_for(tiny_models("llama"), corpus_txt)
    full = extract(cfg, tmp_path / "full", backbone=llama)
    run = interrupted_copy(tmp_path / "full", tmp_path / "cut", keep_shards=2)
    resumed = extract(cfg, run, backbone=llama)
    assert resumed["status"] == "complete"
    assert [s["sha256"] for s in resumed["shards"]] == [s["sha256"] for s in full["shards"]]
    assert all_rows(run).equals(all_rows(tmp_path / "full"))


@pytest.mark.slow
def test_kill_9_then_resume(tmp_path, tiny_models):
    corpus = write_corpus(tmp_path / "big.txt", n_docs=300, seed=3)
    args = ["--quiet", "extract", tiny_models("llama"), "--corpus", corpus, "--tokens", 30000, "--seq-len", 64,
            "--shard-rows", 256, "--batch-size", 1, "--device", "cpu"]
    # the uninterrupted reference runs beside the victim on the other core
    clean = run_cli(*args, "--out", tmp_path / "clean", background=True, env=ONE_THREAD)
    victim = run_cli(*args, "--out", tmp_path / "killed", background=True, env=ONE_THREAD)
    manifest_path = tmp_path / "killed" / "manifest.json"
    deadline = time.time() + 120
    while time.time() < deadline:
        if manifest_path.exists() and len(read_manifest(manifest_path.parent)["shards"]) >= 2:
            break
        time.sleep(0.05)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert len(read_json(manifest_path)["shards"]) == 0  # the journal, not the manifest, grows per shard
    interrupted = read_manifest(manifest_path.parent)
    assert interrupted["status"] == "running" and 2 <= len(interrupted["shards"])
    done = run_cli(*args, "--out", tmp_path / "killed", env=ONE_THREAD)
    assert done.returncode == 0, done.stderr
    assert clean.wait(timeout=600) == 0, clean.stderr.read()
    assert all_rows(tmp_path / "killed").equals(all_rows(tmp_path / "clean"))


def test_float16_overflow_falls_back_to_float32(tmp_path, corpus_txt):
    folder = build_model("llama", tmp_path / "loud", scale_embeddings=1e7)
    backbone = load_backbone(str(folder), device="cpu")
    manifest = extract(cfg_for(folder, corpus_txt, tokens=100), tmp_path / "run", backbone=backbone)
    dtypes = manifest["shards"][0]["dtypes"]
    assert dtypes["h00"] == "float32"  # |values| up to ~1e4..1e5 would overflow or lose range in float16
    h0 = RunReader(tmp_path / "run").read_layer(0)
    assert np.isfinite(h0).all() and np.abs(h0).max() > 65504
    assert np.abs(h0).max() == pytest.approx(np.abs(backbone.model.get_input_embeddings().weight).max().item(),
                                             rel=0.5)


def test_reader_streams_batches(tmp_path, tiny_models, corpus_txt, llama):
    extract(cfg_for(tiny_models("llama"), corpus_txt, tokens=700), tmp_path / "run", backbone=llama)
    reader = RunReader(tmp_path / "run", verify=True)
    batches = list(reader.iter_layer(2, batch_rows=100))
    assert max(len(b) for b in batches) <= 100 and sum(len(b) for b in batches) == 700
    assert all(b.dtype == np.float32 and b.shape[1] == 64 for b in batches)
    tensors = list(reader.iter_layer(2, batch_rows=100, torch_device="cpu"))
    assert isinstance(tensors[0], torch.Tensor) and torch.equal(tensors[0], torch.from_numpy(batches[0]))


def test_cli_table_and_json(tmp_path, tiny_models, corpus_txt):
    code, out, err = invoke("--format", "json", "extract", tiny_models("llama"), "--corpus", corpus_txt,
                            "--tokens", 300, "--seq-len", 64, "--out", tmp_path / "run", "--device", "cpu")
    assert code == 0, err
    data = json.loads(out)
    assert data["rows"] == 300 and data["status"] == "complete"
    code, out, err = invoke("extract", tiny_models("llama"), "--corpus", corpus_txt,
                            "--tokens", 300, "--seq-len", 64, "--out", tmp_path / "run", "--device", "cpu")
    assert code == 0 and "rows per layer" in out and "300" in out


def test_python_m_geoprobe_help():
    result = run_cli("--help")
    assert result.returncode == 0 and "extract" in result.stdout and "Examples" in result.stdout


# --- bad input: one line, exit code 2, nothing half-written -----------------------------------


def test_corpus_missing_empty_or_too_short(tmp_path, tiny_models):
    model = tiny_models("llama")
    code, _, err = invoke("extract", model, "--corpus", tmp_path / "none.txt", "--out", tmp_path / "r")
    assert_one_line_error(code, err, 2, "corpus not found")
    (tmp_path / "empty.txt").write_text("\n\n")
    code, _, err = invoke("extract", model, "--corpus", tmp_path / "empty.txt", "--out", tmp_path / "r")
    assert_one_line_error(code, err, 2, "is empty")
    (tmp_path / "weights.bin").write_bytes(bytes(range(256)) * 64)  # a binary file is refused, not tokenised
    code, _, err = invoke("extract", model, "--corpus", tmp_path / "weights.bin", "--out", tmp_path / "r")
    assert_one_line_error(code, err, 2, "is not text (binary or not UTF-8)")
    assert not (tmp_path / "r").exists()
    (tmp_path / "short.txt").write_text("light water earth\n\nking stone\n")
    code, _, err = invoke("extract", model, "--corpus", tmp_path / "short.txt", "--tokens", 1000,
                          "--out", tmp_path / "r", "--device", "cpu")
    assert_one_line_error(code, err, 2, "fewer than --tokens 1000")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("spec,fragment", [("0-9", "layer 4 out of range"), ("2-1", "malformed layer spec"),
                                           ("a,b", "malformed layer spec"), ("0,17", "layer 17 out of range")])
def test_bad_layer_specs(spec, fragment, tmp_path, tiny_models, corpus_txt):
    code, _, err = invoke("extract", tiny_models("llama"), "--corpus", corpus_txt, "--layers", spec,
                          "--out", tmp_path / "r", "--device", "cpu")
    assert_one_line_error(code, err, 2, fragment)
    assert not (tmp_path / "r").exists()
    assert parse_layers("0-1,3", 3) == [0, 1, 3]


def test_different_config_is_refused_then_force_starts_over(tmp_path, tiny_models, corpus_txt):
    common = ["-q", "extract", tiny_models("llama"), "--corpus", corpus_txt, "--seq-len", 64, "--out", tmp_path / "r",
              "--device", "cpu"]
    assert invoke(*common, "--tokens", 200)[0] == 0
    before = (tmp_path / "r" / "manifest.json").read_text()
    code, _, err = invoke(*common, "--tokens", 300, "--layers", "0-2")
    assert_one_line_error(code, err, 2, "holds a different run (differs in: layers, tokens)")
    assert (tmp_path / "r" / "manifest.json").read_text() == before
    code, _, err = invoke(*common, "--tokens", 300, "--layers", "0-2", "--force")
    assert code == 0, err
    assert read_manifest(tmp_path / "r")["rows"] == 300 and read_manifest(tmp_path / "r")["layers"] == [0, 1, 2]


def test_foreign_folder_is_refused(tmp_path, tiny_models, corpus_txt):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "thesis.tex").write_text("precious")
    code, _, err = invoke("extract", tiny_models("llama"), "--corpus", corpus_txt, "--tokens", 100,
                          "--out", tmp_path / "r", "--device", "cpu")
    assert_one_line_error(code, err, 2, "holds no geoprobe run")
    assert (tmp_path / "r" / "thesis.tex").read_text() == "precious"


def test_nan_activations_are_refused(tmp_path, corpus_txt):
    folder = build_model("llama", tmp_path / "nan")
    from safetensors.torch import load_file, save_file

    weights = load_file(folder / "model.safetensors")
    key = next(k for k in weights if "layers.1.mlp.down_proj" in k)
    weights[key][0, 0] = float("nan")
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    code, _, err = invoke("extract", folder, "--corpus", corpus_txt, "--tokens", 100, "--seq-len", 64,
                          "--out", tmp_path / "r", "--device", "cpu")
    assert_one_line_error(code, err, 2, "layer 2 has NaN or Inf activations")
    assert read_manifest(tmp_path / "r")["status"] == "interrupted"
    assert not list((tmp_path / "r" / "hidden").glob("part-*"))
    # a run limited to the healthy layers works
    code, _, err = invoke("-q", "extract", folder, "--corpus", corpus_txt, "--tokens", 100, "--seq-len", 64,
                          "--layers", "0-1", "--out", tmp_path / "ok", "--device", "cpu")
    assert code == 0, err


def test_unwritable_output_directory(tmp_path, tiny_models, corpus_txt):
    (tmp_path / "a-file").write_text("x")
    for out in (tmp_path / "a-file" / "run", Path("/proc/geoprobe-run")):
        code, _, err = invoke("extract", tiny_models("llama"), "--corpus", corpus_txt, "--tokens", 100,
                              "--seq-len", 64, "--out", out, "--device", "cpu")
        assert_one_line_error(code, err, 2, "is not writable")


def test_one_identity_a_new_extract_field_enters_the_writer_and_the_reuse_check():
    """What defines an extraction has one owner (ExtractConfig.defining_flags): a field added to the
    config is recorded by the writer and compared by scan's reuse check without touching either."""
    from dataclasses import field, make_dataclass

    from geoprobe.pipeline import same_extraction

    base = ExtractConfig(model="m", corpus="c", layers="0-2")
    manifest = {"config": {**base.defining_flags(), "layers": [0, 1, 2]}, "model": {"num_layers": 4}}
    assert same_extraction(manifest, base)
    assert not same_extraction(manifest, ExtractConfig(model="m", corpus="c", layers="0-3"))
    assert not same_extraction(manifest, ExtractConfig(model="m", corpus="c", layers="0-2", shard_rows=10))
    assert same_extraction(manifest, ExtractConfig(model="m", corpus="c", layers="0-2", batch_size=3))  # placement
    extended = make_dataclass("Extended", [("new_flag", int, field(default=3))], bases=(ExtractConfig,))
    cfg = extended(model="m", corpus="c", layers="0-2")
    assert cfg.defining_flags()["new_flag"] == 3
    assert not same_extraction(manifest, cfg)  # a run extracted before the field existed is not reused
    assert same_extraction({**manifest, "config": {**manifest["config"], "new_flag": 3}}, cfg)
