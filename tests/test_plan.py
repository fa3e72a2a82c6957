"""`geoprobe scan --plan`: the planner's figures against what a tiny model really takes."""

import json

import pytest
import torch

from geoprobe.backbone import load_backbone
from geoprobe.capture import capture
from geoprobe.plan import plan_scan
from tests.helpers import assert_one_line_error, invoke


def test_plan_matches_the_real_figures_of_a_tiny_model(tmp_path, tiny_models, corpus_txt):
    model = tiny_models("llama")
    plan = plan_scan(str(model), tmp_path / "run", tokens=2000, seq_len=64, layers="all", storage="float16",
                     batch_size=4, device="cpu", dtype="auto")
    backbone = load_backbone(str(model), device="cpu")
    params = list(backbone.model.parameters())
    assert plan.parameters == sum(p.numel() for p in params)
    assert plan.parameter_bytes == sum(p.numel() * p.element_size() for p in params)
    ids = torch.randint(3, 100, (4, 64))
    states = capture(backbone, ids, torch.ones_like(ids), list(range(backbone.num_layers + 1)))
    assert plan.captured_bytes == sum(t.numel() * t.element_size() for t in states.values())
    assert plan.working_bytes > 0

    code, out, err = invoke("-q", "extract", model, "--corpus", corpus_txt, "--tokens", 2000, "--seq-len", 64,
                            "--out", tmp_path / "run", "--device", "cpu")
    assert code == 0, err
    written = sum(p.stat().st_size for p in (tmp_path / "run" / "hidden").glob("*.parquet"))
    assert plan.disk_bytes == pytest.approx(written, rel=0.10)  # Parquet pages and footers on top


def test_plan_prints_json_and_writes_nothing(tmp_path, tiny_models, corpus_txt):
    code, out, err = invoke("--format", "json", "scan", tiny_models("llama"), "--corpus", corpus_txt,
                            "--tokens", 1000, "--out", tmp_path / "run", "--plan", "--device", "cpu")
    assert code == 0, err
    plan = json.loads(out)
    assert plan["memory_bytes"] == plan["parameter_bytes"] + plan["activation_bytes"]
    assert plan["disk_bytes"] > 1000 * plan["hidden_size"] * 2
    assert not (tmp_path / "run").exists()


def test_plan_refuses_a_scan_the_disk_cannot_hold(tmp_path, tiny_models, corpus_txt):
    code, out, err = invoke("-q", "scan", tiny_models("llama"), "--corpus", corpus_txt, "--tokens", 10**15,
                            "--out", tmp_path / "run", "--plan", "--device", "cpu")
    assert_one_line_error(code, err, 2, "the shards need")
    assert not (tmp_path / "run").exists()


def test_plan_refuses_a_batch_the_memory_cannot_hold(tmp_path, tiny_models, corpus_txt):
    code, out, err = invoke("-q", "scan", tiny_models("llama"), "--corpus", corpus_txt, "--tokens", 100,
                            "--batch-size", 10**6, "--seq-len", 4096, "--out", tmp_path / "run", "--plan",
                            "--device", "cpu")
    assert_one_line_error(code, err, 2, "the model and one batch need")


def _llama_8b_config(folder):
    """The real Llama-3.1-8B shape as a config alone: nothing to load, everything to count."""
    import transformers

    transformers.LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                             num_key_value_heads=8, vocab_size=128256, max_position_embeddings=131072,
                             rope_theta=500000.0, tie_word_embeddings=False).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("available_gib,dtype,fragment", [
    (20, "float32", "use --dtype bfloat16, --device-map auto"),  # 32 GB of float32 weights, 16 GB would fit
    (8, "auto", "only 8.0 GiB is available; use --device-map auto"),  # not even bfloat16 fits
])
def test_a_model_that_cannot_fit_is_refused_before_loading(available_gib, dtype, fragment, tmp_path, corpus_txt, monkeypatch):
    import geoprobe.memory

    monkeypatch.setattr(geoprobe.memory, "memory_available", lambda device: available_gib * 2**30)
    model = _llama_8b_config(tmp_path / "llama-8b")
    code, _, err = invoke("extract", model, "--corpus", corpus_txt, "--dtype", dtype, "--out", tmp_path / "r",
                          "--device", "cpu")
    assert_one_line_error(code, err, 2, fragment)
    assert not (tmp_path / "r").exists()


def test_the_load_check_counts_the_batch_the_command_will_run(tmp_path, corpus_txt, monkeypatch):
    """16 GB of bfloat16 weights fit 20 GiB beside a batch of 8 x 512 (the old assumption) but not
    beside the 64 x 2,048 asked for (27 GB of attention scores and MLP)."""
    import geoprobe.memory

    monkeypatch.setattr(geoprobe.memory, "memory_available", lambda device: 20 * 2**30)
    model = _llama_8b_config(tmp_path / "llama-8b")
    code, _, err = invoke("extract", model, "--corpus", corpus_txt, "--dtype", "bfloat16", "--batch-size", 64,
                          "--seq-len", 2048, "--out", tmp_path / "r", "--device", "cpu")
    assert_one_line_error(code, err, 2, "and one batch need")


def test_dtype_auto_picks_bfloat16_on_a_cpu_when_only_that_fits(tmp_path, corpus_txt, monkeypatch):
    import geoprobe.memory

    monkeypatch.setattr(geoprobe.memory, "memory_available", lambda device: 20 * 2**30)
    model = _llama_8b_config(tmp_path / "llama-8b")
    code, _, err = invoke("extract", model, "--corpus", corpus_txt, "--out", tmp_path / "r", "--device", "cpu")
    # the config has no weights, so the load itself fails after the choice was made and said
    assert "loading in bfloat16" in err and code == 2


def test_a_model_that_cannot_fit_one_gpu_is_refused_naming_what_would(tmp_path, monkeypatch):
    """The GPU path of the same check (no GPU here: the free memory of cuda:1 is stood in for)."""
    import torch
    import transformers

    import geoprobe.memory
    from geoprobe.errors import BadInput

    config = transformers.AutoConfig.from_pretrained(_llama_8b_config(tmp_path / "llama-8b"))
    asked = []
    monkeypatch.setattr(geoprobe.memory, "memory_available", lambda device: asked.append(device) or 12 * 2**30)
    with pytest.raises(BadInput, match=r"of free memory on cuda:1 in bfloat16 but only 12.0 GiB is available; "
                                       r"use --device-map auto \(spreads the layers over the GPUs\)"):
        geoprobe.memory.load_dtype(config, torch.bfloat16, "auto", torch.device("cuda", 1))
    assert asked == [torch.device("cuda", 1)]
    monkeypatch.setattr(geoprobe.memory, "memory_available", lambda device: 40 * 2**30)  # an H200 holds it
    assert geoprobe.memory.load_dtype(config, torch.bfloat16, "auto", torch.device("cuda", 1)) == torch.bfloat16


def test_a_scan_whose_geometry_will_not_fit_is_refused_before_extracting(tmp_path, tiny_models, corpus_txt,
                                                                          monkeypatch):
    import geoprobe.memory
    from geoprobe.geometry import GeometrySettings, peak_bytes

    need = peak_bytes(400, 64, GeometrySettings(anchors=256))
    monkeypatch.setattr(geoprobe.memory, "memory_available", lambda device: need - 1)
    code, _, err = invoke("-q", "scan", tiny_models("llama"), "--corpus", corpus_txt, "--tokens", 400,
                          "--anchors", 256, "--out", tmp_path / "run", "--device", "cpu")
    assert_one_line_error(code, err, 2, "the geometry of one layer needs")
    assert not (tmp_path / "run").exists()
