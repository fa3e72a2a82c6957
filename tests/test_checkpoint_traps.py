"""Real checkpoints' traps, on tiny Qwen3-shaped models: no BOS in the tokenizer (the config
names one), more embedding rows than tokenizer ids (Qwen3-8B: 151,936 and 151,669), and a
backbone folder moved after training."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from geoprobe.backbone import config_hash, load_config, locate_backbone, resolve_source
from geoprobe.bridges.dsl import pretrained_dsl
from geoprobe.errors import BadInput
from geoprobe.fixtures import VOCAB, build_tokenizer
from geoprobe.samplers import sampler_from_flags
from geoprobe.tokens import start_token, untrained_ids
from tests.helpers import ARCH_CONFIGS, invoke

PADDED = VOCAB + 37  # embedding rows past the tokenizer's ids, as Qwen3-8B has 267


def qwen3(folder, bos_in_config: int | None):
    """A tiny random Qwen3 whose tokenizer has no BOS and whose config may name one."""
    import transformers

    config = transformers.Qwen3Config(**{**ARCH_CONFIGS["qwen3"][1], "vocab_size": PADDED,
                                         "bos_token_id": bos_in_config})
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tokenizer = build_tokenizer(folder)
    tokenizer.bos_token = None
    tokenizer.save_pretrained(folder)
    return str(folder), tokenizer


def test_a_dsl_on_qwen3_starts_with_the_configs_bos_and_never_samples_a_padding_row(tmp_path):
    folder, tokenizer = qwen3(tmp_path / "qwen3", bos_in_config=2)
    assert tokenizer.bos_token_id is None and len(tokenizer) < PADDED
    assert start_token(tokenizer, load_config(resolve_source(folder))) == 2
    model = pretrained_dsl(folder, tokenizer, d_tok=8).eval()
    assert model.cfg.bos_id == 2 and model.cfg.tokenizer_size == len(tokenizer)
    z = torch.randn(2, 5, 8)
    with torch.no_grad():
        logits = model(z)
    assert logits.shape[-1] == PADDED
    assert (logits[..., len(tokenizer):] == torch.finfo(logits.dtype).min).all()
    assert torch.isfinite(logits).all()  # the dtype's minimum, not -inf: entropies stay finite
    roar = sampler_from_flags("roar", None, None)
    drawn = roar.sample(model, 4, 24, 0).tokens
    assert int(drawn.max()) < len(tokenizer)
    model.cfg.tokenizer_size = None  # the trap: untrained rows are as likely as any at random weights
    assert int(roar.sample(model, 4, 24, 0).tokens.max()) >= len(tokenizer)


def test_a_model_without_any_start_token_is_refused_in_one_line(tmp_path):
    folder, tokenizer = qwen3(tmp_path / "nobos", bos_in_config=None)
    with pytest.raises(BadInput, match=r"has no start token \(its tokenizer's bos_token_id and its config's are None\)"):
        pretrained_dsl(folder, tokenizer, d_tok=8)
    assert list(untrained_ids(tokenizer, PADDED)) == list(range(len(tokenizer), PADDED))


def test_the_causal_lms_own_samples_skip_the_padding_rows(tmp_path):
    folder, tokenizer = qwen3(tmp_path / "qwen3", bos_in_config=2)
    code, _, err = invoke("-q", "sample", "--model", folder, "--sampler", "ar", "--num", 4, "--length", 32,
                          "--device", "cpu", "--out", tmp_path / "ar")
    assert code == 0, err
    rows = [json.loads(line) for line in (tmp_path / "ar" / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and max(max(r["token_ids"]) for r in rows) < len(tokenizer)


def test_a_moved_backbone_is_found_by_its_config_hash_or_the_line_says_where_it_looked(tmp_path, tiny_models,
                                                                                        monkeypatch):
    original = tiny_models("llama")
    sha = config_hash(load_config(resolve_source(str(original))))
    moved = tmp_path / "models" / "llama"
    shutil.copytree(original, moved)
    assert locate_backbone(str(moved), sha, "runs/b") == str(moved)  # where the record says: as given
    hub = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    gone = str(tmp_path / "models" / "was-here")
    with pytest.raises(BadInput) as refusal:
        locate_backbone(gone, sha, "runs/b")
    said = str(refusal.value)
    assert "\n" not in said and said.startswith(f"runs/b was trained on {gone} (config sha256 {sha[:12]}")
    assert f"nor among the 0 models of the Hugging Face cache {hub}" in said
    snapshot = hub / "models--org--llama" / "snapshots" / "abc123"
    shutil.copytree(original, snapshot)
    assert locate_backbone(gone, sha, "runs/b") == str(snapshot)
    other = hub / "models--org--other" / "snapshots" / "def456"  # another architecture is not taken
    qwen3(other, bos_in_config=2)
    assert locate_backbone(gone, sha, "runs/b") == str(snapshot)
