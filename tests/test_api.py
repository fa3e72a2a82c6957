"""The Python API: the same run the CLI writes, as pandas tables and arrays; the commands as
functions with the commands' defaults."""

from __future__ import annotations

import csv
import json

import numpy as np
import pandas as pd
import pytest

import geoprobe
from geoprobe.errors import BadInput
from geoprobe.store import RunReader
from tests.helpers import SCAN, copy_run


@pytest.fixture(scope="module")
def run(tmp_path_factory, scanned_run):
    """The shared scanned run (`geoprobe scan` with the SCAN settings), copied: the tests below write into it."""
    return geoprobe.open_run(copy_run(scanned_run, tmp_path_factory.mktemp("api") / "run"))


def test_a_scan_from_python_equals_the_command(scanned_run, tmp_path, tiny_models, corpus_txt):
    run = geoprobe.scan(str(tiny_models("llama")), tmp_path / "python", corpus=str(corpus_txt), **SCAN)
    assert (run.path / "ranking.csv").read_text() == (scanned_run / "ranking.csv").read_text()
    assert "rows x 4 layers x d=64" in repr(run)


def test_tables_and_arrays_match_the_files(run):
    ranking = run.ranking()
    with open(run.path / "ranking.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert list(ranking.index) == [int(r["layer"]) for r in rows]
    assert np.allclose(ranking["score"], [float(r["score"]) for r in rows])
    assert {"p_first", "p_first_reseed", "curv_lo"} <= set(ranking.columns)
    geometry = run.geometry()
    stored = json.loads((run.path / "geometry.json").read_text())["layers"]
    assert np.allclose(geometry["curv"], [l["trace"]["curv"]["value"] for l in stored])
    assert np.allclose(geometry["raw_mono_hi"], [l["none"]["mono"]["ci"][1] for l in stored])
    states = run.states(2)
    np.testing.assert_array_equal(states, RunReader(run.path).read_layer(2))
    assert states.shape == (400, 64) and states.dtype == np.float32
    frame = run.to_pandas(layers=[0, 2])
    assert isinstance(frame, pd.DataFrame) and len(frame) == 400
    assert list(frame.columns[:4]) == ["doc_id", "seq_id", "position", "token_id"]
    np.testing.assert_array_equal(np.stack(frame["h02"]), states)
    assert run.states(2, rows=(10, 20)).shape == (10, 64)
    import torch

    assert torch.equal(run.states(2, torch_device="cpu"), torch.from_numpy(states))


def test_bridge_and_sample_from_python(run, tmp_path):
    metrics = geoprobe.bridge(run, layer=1, steps=6, until="steps", batch_size=4, seq_len=16, d_model=16,
                              n_layers=1, device="cpu")
    assert metrics == json.loads((run.path / "bridges" / "layer-01" / "seed-0" / "metrics.json").read_text())
    assert metrics["steps_run"] == 6
    assert set(run.bridges().index) == {(1, 0)}  # (layer, seed)
    texts = geoprobe.sample(run.path / "bridges" / "layer-01" / "seed-0", sampler="mdlm", out=tmp_path / "s", num=3, length=8,
                            steps=4, device="cpu")
    assert len(texts) == 3 and all(isinstance(t, str) for t in texts)


def test_the_api_raises_what_the_command_refuses(run, tmp_path):
    with pytest.raises(BadInput, match="is not a geoprobe run directory"):
        geoprobe.open_run(tmp_path)
    with pytest.raises(BadInput, match="has no sweep.csv"):
        run.sweep()
    with pytest.raises(BadInput, match="--anchors"):
        geoprobe.scan("builtin:hmm-tiny", tmp_path / "x", tokens=10, anchors=100)


def test_the_api_refuses_an_option_no_command_takes(run):
    """Keyword arguments are the settings classes' fields: a misspelt one is refused by name, before
    any work, instead of being dropped silently."""
    with pytest.raises(BadInput, match="unknown option widht .*d_model"):
        geoprobe.bridge(run, layer=1, widht=16)
    with pytest.raises(BadInput, match="unknown option tokenz"):
        geoprobe.scan("builtin:hmm-tiny", run.path.parent / "y", tokenz=10)
    with pytest.raises(BadInput, match="unknown option lenght"):
        geoprobe.sample(run.path, lenght=4)
