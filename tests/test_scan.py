"""geometry / rank / scan commands: outputs, determinism, resumption, and bad input."""

import json
import math

import pytest

from geoprobe.extract import ExtractConfig, extract
from tests.helpers import assert_one_line_error, invoke

SMALL = ["--k", 8, "--anchors", 200, "--pairs", 400, "--bootstrap", 50, "--device", "cpu"]


@pytest.fixture(scope="module")
def extracted(tmp_path_factory, tiny_models, corpus_txt, llama):
    run = tmp_path_factory.mktemp("scan") / "run"
    extract(ExtractConfig(model=str(tiny_models("llama")), corpus=str(corpus_txt), tokens=1200, seq_len=64,
                          device="cpu"), run, backbone=llama)
    return run


def test_geometry_then_rank_write_every_output(extracted):
    code, out, err = invoke("--format", "json", "geometry", extracted, *SMALL)
    assert code == 0, err
    printed = json.loads(out)
    stored = json.loads((extracted / "geometry.json").read_text())
    assert printed == stored
    assert [l["layer"] for l in stored["layers"]] == [0, 1, 2, 3]
    for layer in stored["layers"]:
        for norm in ("none", "trace"):
            for proxy in ("curv", "mono", "erank"):
                value, (lo, hi) = layer[norm][proxy]["value"], layer[norm][proxy]["ci"]
                assert 0 < lo <= hi and value > 0
        assert len(layer["replicates"]["curv"]) == 50
    code, out, err = invoke("rank", extracted, "--weights", "1,1,1")
    assert code == 0, err
    assert "chosen layer" in out
    csv_lines = (extracted / "ranking.csv").read_text().splitlines()
    assert len(csv_lines) == 1 + 4 and csv_lines[0].startswith("layer,curv,curv_lo,curv_hi")
    table = [line for line in (extracted / "ranking.md").read_text().splitlines() if line.startswith("|")]
    assert table[0].split("|")[1].strip() == "layer" and len(table) == 2 + 4  # header, rule, one row per layer
    png = (extracted / "plots" / "geometry.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20000


def test_same_seed_same_geometry_and_another_seed_differs(extracted, tmp_path):
    import shutil

    copy = shutil.copytree(extracted, tmp_path / "copy")
    for run in (extracted, copy):
        (run / "geometry.json").unlink(missing_ok=True)
        assert invoke("-q", "geometry", run, *SMALL)[0] == 0
    assert (extracted / "geometry.json").read_bytes() == (copy / "geometry.json").read_bytes()
    assert invoke("-q", "geometry", copy, *SMALL, "--seed", 1)[0] == 0
    assert (extracted / "geometry.json").read_bytes() != (copy / "geometry.json").read_bytes()


def test_scan_runs_everything_and_a_rerun_recomputes_nothing(tmp_path, tiny_models, corpus_txt):
    args = ["scan", tiny_models("qwen3"), "--corpus", corpus_txt, "--tokens", 800, "--seq-len", 64,
            "--out", tmp_path / "s", *SMALL]
    code, out, err = invoke("--format", "json", *args)
    assert code == 0, err
    data = json.loads(out)
    assert data["run"] == str(tmp_path / "s") and len(data["ranking"]["rows"]) == 4
    stamps = {p: p.stat().st_mtime_ns for p in [tmp_path / "s" / "geometry.json", tmp_path / "s" / "manifest.json",
                                                *(tmp_path / "s" / "hidden").iterdir()]}
    code, out, err = invoke(*args)
    assert code == 0, err
    assert "chosen layer" in out
    assert stamps == {p: p.stat().st_mtime_ns for p in stamps}  # nothing extracted or measured again
    # other extraction flags on a finished run are not silently ignored
    code, _, err = invoke(*args, "--tokens", 900)
    assert_one_line_error(code, err, 2, "holds a different run (differs in: tokens)")
    # new geometry settings recompute the geometry only
    code, _, err = invoke("-q", *args, "--normalize", "none")
    assert code == 0 and json.loads((tmp_path / "s" / "geometry.json").read_text())["settings"]["normalize"] == "none"


def test_rank_weights_and_log_change_the_score(extracted):
    assert invoke("-q", "geometry", extracted, *SMALL)[0] == 0
    _, out_a, _ = invoke("--format", "json", "rank", extracted)
    _, out_b, _ = invoke("--format", "json", "rank", extracted, "--weights", "0,0,1", "--log")
    a, b = json.loads(out_a)["ranking"], json.loads(out_b)["ranking"]
    assert b["weights"] == [0, 0, 1] and b["log"] is True
    erank = [r["erank"] for r in b["rows"]]
    assert b["chosen_layer"] == b["rows"][erank.index(min(erank))]["layer"]
    assert [r["score"] for r in a["rows"]] != [r["score"] for r in b["rows"]]


# --- bad input ------------------------------------------------------------------------------


def test_run_missing_or_unfinished(tmp_path, extracted):
    code, _, err = invoke("geometry", tmp_path / "nowhere")
    assert_one_line_error(code, err, 2, "is not a geoprobe run directory")
    import shutil

    unfinished = shutil.copytree(extracted, tmp_path / "unfinished")
    manifest = json.loads((unfinished / "manifest.json").read_text())
    manifest["status"], manifest["shards"] = "running", manifest["shards"][:0]
    (unfinished / "manifest.json").write_text(json.dumps(manifest))
    code, _, err = invoke("geometry", unfinished)
    assert_one_line_error(code, err, 2, "has not finished extracting (0 of 1200 rows)")
    code, _, err = invoke("rank", tmp_path)
    assert_one_line_error(code, err, 2, "has no geometry.json")


@pytest.mark.parametrize("flags,fragment", [
    (["--k", 1], "--k must be at least 2"),
    (["--anchors", 0], "--anchors must be at least 1"),
    (["--alpha", 0], "--alpha must be in (0, 1000]"),
    (["--alpha", -3], "--alpha must be in (0, 1000]"),
    (["--anchors", 5000], "fewer than --anchors 5000"),
    (["--k", 2000, "--anchors", 10], "fewer than k+1 = 2001"),
])
def test_bad_geometry_settings(flags, fragment, extracted):
    code, _, err = invoke("geometry", extracted, "--bootstrap", 0, "--device", "cpu", *flags)
    assert_one_line_error(code, err, 2, fragment)


def test_all_identical_states_are_refused(tmp_path):
    """600 one-word documents: every stored token is the same, so layer 0 holds one state."""
    from tests.helpers import build_model

    folder = build_model("llama", tmp_path / "m")
    (tmp_path / "same.txt").write_text("\n\n".join(["light"] * 600) + "\n")
    code, _, err = invoke("-q", "extract", folder, "--corpus", tmp_path / "same.txt", "--tokens", 500,
                          "--seq-len", 64, "--layers", "0", "--skip-first", 2, "--out", tmp_path / "r", "--device", "cpu")
    assert code == 0, err
    code, _, err = invoke("geometry", tmp_path / "r", "--bootstrap", 0, "--anchors", 10, "--device", "cpu")
    assert_one_line_error(code, err, 2, "all states are identical")


def test_bad_weights(extracted):
    assert invoke("-q", "geometry", extracted, *SMALL)[0] == 0
    code, _, err = invoke("rank", extracted, "--weights", "1,2")
    assert_one_line_error(code, err, 2, "malformed --weights")


def test_massive_channels_warned_listed_and_ranked_both_ways(tmp_path, corpus_txt):
    import torch
    from transformers import AutoModelForCausalLM

    from tests.helpers import build_model

    folder = build_model("llama", tmp_path / "model")
    model = AutoModelForCausalLM.from_pretrained(folder)
    with torch.no_grad():  # channel 5 of every token's embedding carries most of the residual stream
        model.get_input_embeddings().weight[:, 5] = 40.0 * model.get_input_embeddings().weight[:, 5].abs() + 5.0
    model.save_pretrained(folder)
    args = ["scan", folder, "--corpus", corpus_txt, "--tokens", 800, "--seq-len", 64, "--out", tmp_path / "s", *SMALL]
    code, out, err = invoke(*args)
    assert code == 0, err
    warning = [line for line in err.splitlines() if line.startswith("warning: ")]
    assert len(warning) == 1 and "massive channels at layers 0" in warning[0] and "(5;" in warning[0]
    geometry = json.loads((tmp_path / "s" / "geometry.json").read_text())
    assert 5 in geometry["layers"][0]["massive_channels"] and geometry["layers"][0]["massive_channel_share"] > 0.5
    assert "other_channels" in geometry["layers"][0]
    ranking = (tmp_path / "s" / "ranking.md").read_text()
    assert "## Massive channels kept (the primary ranking)" in ranking and "## Massive channels excluded" in ranking
    assert "with massive channels excluded:" in out
    code, out, err = invoke("--format", "json", *args[:-len(SMALL)], *SMALL, "--drop-massive-channels")
    assert code == 0, err
    data = json.loads(out)
    assert data["ranking"]["drop_massive_channels"] and not data["ranking"]["other"]["drop_massive_channels"]
    assert data["warning"].startswith("warning: ")


@pytest.mark.parametrize("flags,fragment", [
    (["--tokens", 100, "--anchors", 200], "--tokens 100 stores fewer states per layer than --anchors 200"),
    (["--tokens", 100, "--anchors", 50, "--k", 100], "fewer states per layer than k + 1 = 101"),
])
def test_scan_refuses_too_few_tokens_before_extracting(flags, fragment, tmp_path):
    code, _, err = invoke("scan", tmp_path / "no-model-needed", "--corpus", tmp_path / "none.txt",
                          "--out", tmp_path / "s", "--device", "cpu", *flags)
    assert_one_line_error(code, err, 2, fragment)
    assert not (tmp_path / "s").exists()  # refused before the model, the corpus or the run directory


def test_few_documents_resample_blocks_and_too_few_blocks_give_no_interval(tmp_path, tiny_models):
    from tests.helpers import synthetic_text
    import random

    (tmp_path / "one.txt").write_text(synthetic_text(3000, random.Random(0)) + "\n")  # a single document
    for seq_len, unit in ((32, "block"), (512, "none")):
        run = tmp_path / f"r{seq_len}"
        code, _, err = invoke("-q", "scan", tiny_models("llama"), "--corpus", tmp_path / "one.txt", "--tokens",
                              800, "--seq-len", seq_len, "--out", run, *SMALL)
        assert code == 0, err
        geometry = json.loads((run / "geometry.json").read_text())
        assert geometry["n_docs"] == 1 and geometry["bootstrap_unit"] == unit
        caption = (run / "ranking.md").read_text()
        if unit == "block":
            assert geometry["bootstrap_units"] >= 20 and "intervals resample the" in caption and "blocks" in caption
            assert "rough" not in caption
            lo, hi = geometry["layers"][1]["trace"]["erank"]["ci"]
            assert lo < hi  # a real spread, not a one-document zero-width interval
        else:
            assert "no interval can be given" in caption
            assert all(math.isnan(v) for v in geometry["layers"][1]["trace"]["erank"]["ci"])


def test_massive_warning_names_counts_layers_and_tokens():
    from geoprobe.pipeline import massive_warning

    geometry = {"settings": {"massive_factor": 20.0}, "layers": [
        {"layer": 0, "massive": 0, "massive_rows": [], "massive_channels": []},
        {"layer": 3, "massive": 2, "massive_rows": [5, 9], "massive_channels": [7], "massive_channel_share": 0.91},
        {"layer": 4, "massive": 1, "massive_rows": [5], "massive_channels": []}]}
    line = massive_warning(geometry, lambda rows: f"tokens {rows}")
    assert line == ("warning: 3 massive-token states (norm > 20x the median) at layers 3, 4 (tokens [5, 9]); "
                    "massive channels at layers 3 (7; 91% of the variance)")
    quiet = {"settings": {"massive_factor": 20.0}, "layers": [{"layer": 0, "massive": 0, "massive_channels": []}]}
    assert massive_warning(quiet) is None


def test_doc_blocks_spreads_the_rows_over_many_documents(tmp_path, tiny_models):
    from geoprobe.store import RunReader
    from tests.helpers import write_corpus

    corpus = write_corpus(tmp_path / "long.txt", n_docs=40, words=(300, 400), seed=5)  # many blocks each
    common = ["extract", tiny_models("llama"), "--corpus", corpus, "--tokens", 240, "--seq-len", 32,
              "--positions", "random:8", "--device", "cpu", "--layers", "0"]
    assert invoke(*common, "--out", tmp_path / "all")[0] == 0
    assert invoke(*common, "--doc-blocks", 1, "--out", tmp_path / "one")[0] == 0
    meta = {name: RunReader(tmp_path / name).read_meta() for name in ("all", "one")}
    blocks = {name: set(zip(m["doc_id"].tolist(), m["seq_id"].tolist())) for name, m in meta.items()}
    assert len(blocks["all"]) == len(blocks["one"]) == 30  # 240 rows, 8 per block
    assert len({d for d, _ in blocks["all"]}) <= 4  # consecutive blocks of the first few documents
    assert len({d for d, _ in blocks["one"]}) == 30  # the first block of each of 30 documents
    assert all(seq == 0 for _, seq in blocks["one"])
    code, _, err = invoke(*common, "--doc-blocks", 1, "--tokens", 400, "--out", tmp_path / "x")
    assert_one_line_error(code, err, 2, "has only 320 eligible tokens")


def test_scan_takes_one_block_per_chapter_of_the_default_corpus(tmp_path, tiny_models):
    from geoprobe.store import RunReader, read_manifest

    code, _, err = invoke("scan", tiny_models("llama"), "--tokens", 600, "--seq-len", 32, "--anchors", 64,
                          "--k", 8, "--pairs", 128, "--bootstrap", 20, "--out", tmp_path / "r", "--device", "cpu")
    assert code == 0, err
    assert read_manifest(tmp_path / "r")["config"]["doc_blocks"] == 1
    meta = RunReader(tmp_path / "r").read_meta()
    assert len(set(meta["doc_id"].tolist())) == 20 and set(meta["seq_id"].tolist()) == {0}  # 600 rows / 30
    geometry = json.loads((tmp_path / "r" / "geometry.json").read_text())
    assert geometry["bootstrap_unit"] == "document" and geometry["bootstrap_units"] == 20


def test_the_testbed_scans_its_own_corpus_by_default_and_refuses_text_it_cannot_read(testbed, tmp_path, monkeypatch):
    """builtin:hmm-tiny knows only its HMM's 128 words: without --corpus the scan reads that HMM's
    corpus (the KJV, the default for other models, would be three distinct tokens and a refusal
    after the extraction); given the KJV it refuses at once, naming the corpus to pass."""
    import geoprobe.extract
    from geoprobe.store import read_manifest
    from geoprobe.testbed import CORPUS

    code, out, err = invoke("--format", "json", "scan", "builtin:hmm-tiny", "--tokens", 600, "--positions", "random:16",
                            "--layers", "0,3", "--k", 8, "--anchors", 64, "--pairs", 128, "--bootstrap", 0,
                            "--out", tmp_path / "r", "--device", "cpu")
    assert code == 0, err
    assert read_manifest(tmp_path / "r")["config"]["corpus"] == CORPUS
    layer0 = json.loads(out)["ranking"]["rows"][0]
    assert layer0["layer"] == 0 and layer0["duplicate_fraction"] < 0.9  # ~128 distinct words among 600 states
    monkeypatch.setattr(geoprobe.extract, "load_backbone", lambda *a, **k: pytest.fail("the model loaded"))
    for command in (["scan", "builtin:hmm-tiny", "--corpus", "kjv"], ["extract", "builtin:hmm-tiny"]):  # extract: kjv
        code, _, err = invoke(*command, "--out", tmp_path / "kjv", "--device", "cpu")
        assert_one_line_error(code, err, 2, "builtin:hmm-tiny knows only the 128 words of its HMM")
        assert f"--corpus '{CORPUS}'" in err and "of the words of --corpus kjv are none of them" in err


def test_the_ranking_fits_an_80_column_terminal_and_a_slow_bar_reads_seconds_per_item(extracted, tmp_path):
    """In 80 columns the terminal ranking keeps the proxies, score, rank and P(first) whole (every
    cell was "0.0…"); a loop slower than one item a second reads "4.0 s/layer", not "0 layer/s"."""
    import io

    from rich.console import Console

    from geoprobe.ranking import rank_layers
    from geoprobe.report.tables import _fmt, print_ranking
    from geoprobe.report.terminal import rate_text

    from tests.helpers import copy_run

    run = copy_run(extracted, tmp_path / "run")
    code, _, err = invoke("-q", "geometry", run, "--k", 4, "--anchors", 32, "--pairs", 64, "--bootstrap", 5,
                          "--device", "cpu")
    assert code == 0, err
    geometry = json.loads((run / "geometry.json").read_text())
    ranking = rank_layers(geometry)
    screen = io.StringIO()
    print_ranking(ranking, geometry, Console(file=screen, width=80))
    text = screen.getvalue()
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80
    for row in ranking["rows"]:
        assert _fmt(row["score"]) in text and _fmt(row["curv"]) in text
    assert (rate_text(0.25, "layer"), rate_text(2.5, "step"), rate_text(1234.4, "tok"), rate_text(None, "tok")) == \
        ("4.0 s/layer", "2.5 step/s", "1,234 tok/s", "? tok/s")
