"""Shared fixtures: tiny random models of every supported architecture, a tokenizer trained
here, small corpora, and (once per session) the real SmolLM2 backbone."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

VOCAB = 320
WORDS = ("light dark water earth heaven king house city river stone bread wine tree field road "
         "morning evening word voice hand heart spirit land people fire cloud mountain sea").split()

TINY = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=512)
ARCH_CONFIGS = {
    "llama": ("LlamaConfig", TINY),
    "qwen2": ("Qwen2Config", TINY),
    "qwen3": ("Qwen3Config", {**TINY, "head_dim": 16}),
    "mistral": ("MistralConfig", TINY),
    "gemma2": ("Gemma2Config", {**TINY, "head_dim": 16, "sliding_window": 8}),
    "gemma3_text": ("Gemma3TextConfig", {**TINY, "head_dim": 16, "sliding_window": 8}),
    "gpt2": ("GPT2Config", dict(n_embd=64, n_layer=3, n_head=4, vocab_size=VOCAB, n_positions=512)),
    "phi3": ("Phi3Config", {**TINY, "pad_token_id": 0}),
}


def synthetic_text(n_words: int, rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n_words)).capitalize() + "."


def write_corpus(path: Path, n_docs: int, words: tuple[int, int] = (40, 400), seed: int = 0) -> Path:
    rng = random.Random(seed)
    path.write_text("\n\n".join(synthetic_text(rng.randint(*words), rng) for _ in range(n_docs)) + "\n")
    return path


def build_tokenizer(folder: Path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers, decoders
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(1)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - 8, special_tokens=["<pad>", "<bos>", "<eos>", "<unk>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([synthetic_text(30, rng) for _ in range(2000)], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>",
                                   pad_token="<pad>", unk_token="<unk>")
    fast.save_pretrained(folder)
    return fast


def build_model(arch: str, folder: Path, seed: int = 0, scale_embeddings: float = 1.0):
    import transformers

    class_name, kwargs = ARCH_CONFIGS[arch]
    config = getattr(transformers, class_name)(**kwargs)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    if scale_embeddings != 1.0:
        with torch.no_grad():
            model.get_input_embeddings().weight.mul_(scale_embeddings)
    model.save_pretrained(folder)
    build_tokenizer(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """arch -> folder holding a tiny random model and the test tokenizer (built lazily)."""
    root = tmp_path_factory.mktemp("models")
    built: dict[str, Path] = {}

    def get(arch: str) -> Path:
        if arch not in built:
            built[arch] = build_model(arch, root / arch)
        return built[arch]

    return get


@pytest.fixture(scope="session")
def corpus_txt(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus") / "docs.txt", n_docs=40)


def run_cli(*args, env=None, timeout=600) -> subprocess.CompletedProcess:
    """Run `python -m geoprobe ARGS` in a fresh process, as a user would."""
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "geoprobe", *map(str, args)], capture_output=True, text=True,
                          env=full_env, timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="session")
def smollm2():
    """The real SmolLM2-135M-Instruct backbone, loaded once per test session."""
    from geoprobe.backbone import load_backbone

    return load_backbone("builtin:smollm2", device="cpu")


def read_json(path: Path):
    return json.loads(Path(path).read_text())


def interrupted_copy(run: Path, dest: Path, keep_shards: int) -> Path:
    """A copy of a finished run as an interruption leaves it: the first `keep_shards` shards
    listed, the later ones gone, a half-written temporary, status running."""
    import shutil

    copy = Path(shutil.copytree(run, dest))
    manifest = read_json(copy / "manifest.json")
    for shard in manifest["shards"][keep_shards:]:
        (copy / shard["file"]).unlink()
    manifest["shards"] = manifest["shards"][:keep_shards]
    manifest["status"] = "running"
    (copy / "manifest.json").write_text(json.dumps(manifest))
    (copy / "hidden" / f".part-{keep_shards:05d}.parquet.tmp").write_bytes(b"half a shard")
    return copy


@pytest.fixture(scope="session")
def testbed():
    """builtin:hmm-tiny: (folder, its build record), trained once per cache (a few minutes the first time)."""
    from geoprobe.assets import builtin_model

    return builtin_model("hmm-tiny")
