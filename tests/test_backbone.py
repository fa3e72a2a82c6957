"""Backbone access on every supported architecture: embed, splice (run_from), errors."""

import pytest
import torch

from geoprobe.backbone import SUPPORTED_ARCHITECTURES, load_backbone
from geoprobe.errors import BadInput
from tests.helpers import ARCH_CONFIGS, run_cli

ARCHS = list(ARCH_CONFIGS)


def test_every_supported_architecture_has_a_tiny_test_model():
    assert sorted(ARCHS) == sorted(SUPPORTED_ARCHITECTURES)


def _batch(backbone, seed=0, batch=2, length=12):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, backbone.config.vocab_size, (batch, length), generator=g)
    return ids


@pytest.mark.parametrize("arch", ARCHS)
def test_embed_equals_what_the_first_block_receives(arch, tiny_models):
    backbone = load_backbone(str(tiny_models(arch)), device="cpu")
    ids = _batch(backbone)
    reference = backbone.model(input_ids=ids, output_hidden_states=True).hidden_states[0]
    torch.testing.assert_close(backbone.embed(ids), reference, rtol=0, atol=0)


def test_embed_includes_gemma_scaling(tiny_models):
    backbone = load_backbone(str(tiny_models("gemma2")), device="cpu")
    ids = _batch(backbone)
    raw = backbone.model.get_input_embeddings().weight[ids]
    # Gemma multiplies the lookup by sqrt(d) before block 1: a plain table lookup is not layer 0.
    assert not torch.allclose(backbone.embed(ids), raw)
    torch.testing.assert_close(backbone.embed(ids), raw * backbone.hidden_size ** 0.5, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_run_from_any_layer_reproduces_the_model_logits(arch, tiny_models):
    backbone = load_backbone(str(tiny_models(arch)), device="cpu")
    ids = _batch(backbone, seed=1)
    with torch.no_grad():
        out = backbone.model(input_ids=ids, output_hidden_states=True)
    from geoprobe.capture import capture

    states = capture(backbone, ids, layers=range(backbone.num_layers + 1))
    for layer, hidden in states.items():
        logits = backbone.run_from(layer, hidden)
        torch.testing.assert_close(logits, out.logits, rtol=1e-4, atol=1e-4, msg=f"{arch} layer {layer}")
    # a wrong state must give other logits: the splice really uses `hidden`
    assert not torch.allclose(backbone.run_from(1, torch.zeros_like(states[1])), out.logits, atol=1e-3)
    # and the model is left as it was
    torch.testing.assert_close(backbone.model(input_ids=ids).logits, out.logits)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gemma2"])
def test_run_from_with_a_cache_reads_the_positions_after_the_cached_ones(arch, tiny_models):
    """Left-to-right through the upper stack: a first part, then one position at a time, each
    read once with the blocks' keys and values kept, gives the whole sequence's logits (gemma2:
    12 positions past its sliding window of 8; GPT-2: absolute positions)."""
    from geoprobe.capture import capture

    backbone = load_backbone(str(tiny_models(arch)), device="cpu")
    ids = torch.randint(5, 300, (2, 12), generator=torch.Generator().manual_seed(2))
    expected = backbone.model(input_ids=ids).logits
    for layer in (0, 2):
        hidden = capture(backbone, ids, layers=(layer,))[layer]
        cache = backbone.upper_cache()
        parts = [backbone.run_from(layer, hidden[:, :5], cache=cache)]
        parts += [backbone.run_from(layer, hidden[:, i:i + 1], cache=cache) for i in range(5, 12)]
        torch.testing.assert_close(torch.cat(parts, dim=1), expected, rtol=0, atol=1e-5, msg=f"{arch} layer {layer}")


@pytest.mark.parametrize("arch", ARCHS)
def test_token_losses_in_chunks_equal_the_cross_entropy_of_the_model_logits(arch, tiny_models):
    """The evaluator and the bridge's validation never build the B x L x V logits: final_from and the
    head in chunks (3 positions here, so chunks split rows) give the model's own losses, Gemma's
    soft-capped logits included."""
    import torch.nn.functional as F

    from geoprobe.capture import capture

    backbone = load_backbone(str(tiny_models(arch)), device="cpu")
    ids = _batch(backbone, seed=2)
    with torch.no_grad():
        logits = backbone.model(input_ids=ids).logits
        expected = F.cross_entropy(logits[:, :-1].float().transpose(1, 2), ids[:, 1:], reduction="none")
        states = capture(backbone, ids, layers=[1])
        got = backbone.token_losses(backbone.final_from(1, states[1])[:, :-1], ids[:, 1:], chunk=3)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4, msg=arch)


def test_run_from_with_padding_mask(tiny_models):
    backbone = load_backbone(str(tiny_models("llama")), device="cpu")
    ids = _batch(backbone, seed=2, length=10)
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    from geoprobe.capture import capture

    states = capture(backbone, ids, mask, layers=[2])
    expected = backbone.model(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(backbone.run_from(2, states[2], attention_mask=mask), expected, rtol=1e-4, atol=1e-4)


def test_unsupported_architecture_is_named(tmp_path):
    import transformers

    transformers.OPTConfig(hidden_size=32, num_hidden_layers=2, ffn_dim=64, num_attention_heads=2,
                           vocab_size=100, word_embed_proj_dim=32).save_pretrained(tmp_path)
    with pytest.raises(BadInput, match="unsupported architecture 'opt'"):
        load_backbone(str(tmp_path), device="cpu")
    result = run_cli("extract", tmp_path, "--corpus", "kjv", "--out", tmp_path / "run")
    assert result.returncode == 2
    assert result.stderr.strip().startswith("error: unsupported architecture 'opt'")
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_missing_model_path_and_uncached_hub_id(tmp_path, corpus_txt):
    missing = run_cli("extract", tmp_path / "nope", "--corpus", corpus_txt, "--out", tmp_path / "r1")
    assert missing.returncode == 2 and missing.stderr.startswith("error: model path not found")
    hub = run_cli("extract", "no-such-org/no-such-model-xyz", "--corpus", corpus_txt, "--out", tmp_path / "r2")
    assert hub.returncode == 2
    assert "not in the local Hugging Face cache and HF_HUB_OFFLINE=1" in hub.stderr
    assert not (tmp_path / "r1").exists() and not (tmp_path / "r2").exists()


def test_bad_device_and_dtype(tiny_models):
    with pytest.raises(BadInput, match="unknown dtype"):
        load_backbone(str(tiny_models("llama")), dtype="float8", device="cpu")
    if not torch.cuda.is_available():
        with pytest.raises(BadInput, match="CUDA is not available"):
            load_backbone(str(tiny_models("llama")), device="cuda")


def test_identity_records_config_hash_and_gguf_sha(tiny_models):
    backbone = load_backbone(str(tiny_models("qwen3")), device="cpu")
    assert backbone.identity["architecture"] == "qwen3"
    assert len(backbone.identity["config_sha256"]) == 64
    other = load_backbone(str(tiny_models("llama")), device="cpu")
    assert other.identity["config_sha256"] != backbone.identity["config_sha256"]


@pytest.mark.real
def test_a_truncated_or_foreign_gguf_file_is_one_line(tmp_path):
    from geoprobe.assets import smollm2_gguf
    from tests.helpers import assert_one_line_error, invoke

    data = smollm2_gguf().read_bytes()
    for name, content, fragment in (("cut-tensors.gguf", data[: len(data) - 4096], "is truncated or corrupt"),
                                    ("cut-header.gguf", data[:2000], "is truncated or corrupt"),
                                    ("not.gguf", b"PK\x03\x04" + data[4:5000], "is not a GGUF file")):
        (tmp_path / name).write_bytes(content)
        code, _, err = invoke("extract", tmp_path / name, "--corpus", "kjv", "--out", tmp_path / "r")
        assert_one_line_error(code, err, 2, fragment)
        assert not (tmp_path / "r").exists()


def test_a_model_file_is_hashed_once_until_it_changes(tmp_path, monkeypatch):
    """The room plan and the load both resolve the model; an 8B .gguf must not be read twice, but a
    rewritten file must be hashed again (hashlib on the bytes is the oracle)."""
    import hashlib
    import os

    from geoprobe import backbone

    reads = []
    real = backbone.sha256_file
    monkeypatch.setattr(backbone, "sha256_file", lambda path: reads.append(path) or real(path))
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + os.urandom(5000))
    first = backbone.model_file_sha256(model)
    assert first == hashlib.sha256(model.read_bytes()).hexdigest()
    assert backbone.model_file_sha256(model) == first and len(reads) == 1
    model.write_bytes(b"GGUF" + os.urandom(6000))  # another size: another key
    assert backbone.model_file_sha256(model) == hashlib.sha256(model.read_bytes()).hexdigest() != first
    assert len(reads) == 2


def test_loading_a_model_prints_no_library_bar_and_leaves_its_setting(tiny_models, capfd):
    """The API's output is geoprobe's own: transformers' "Loading weights" bar stays off while a
    backbone loads, and its setting is as it was afterwards."""
    from transformers.utils import logging as hf_logging

    hf_logging.enable_progress_bar()
    load_backbone(str(tiny_models("llama")), device="cpu")
    captured = capfd.readouterr()
    assert "Loading weights" not in captured.err + captured.out
    assert hf_logging.is_progress_bar_enabled()
