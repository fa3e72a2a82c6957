"""Random-weight stand-ins for the paper's 8B backbones, written into a local Hugging Face cache.

`write_fixture("meta-llama/Llama-3.1-8B-Instruct", hf_home)` writes the model's real config
(the published architecture numbers), random bfloat16 weights in safetensors shards with their
index, and a byte-level BPE tokenizer trained here and padded to the model's vocabulary size
(128,256 for Llama-3.1: a DSL over it is as wide as the real one), under
`HF_HOME/hub/models--meta-llama--Llama-3.1-8B-Instruct/snapshots/<revision>/` with `refs/main`,
exactly where the hub client looks. With `HF_HOME` pointing there and `HF_HUB_OFFLINE=1`, every
command that takes a model resolves the hub id offline, as it would after a download: memory
planning, loading, sharding, dtype handling and the GPU path all see an 8B model. Nothing comes
from the hub: the weights are noise (std 0.02, norms at 1), except one massive channel
(MASSIVE_CHANNEL of the embedding, MASSIVE_SCALE times the others, large enough to persist through
every block, so the geometry's massive-channel pass runs at most layers as on a real model), and the tokenizer is a stand-in (its ~1,000
trained tokens are the ones text maps to; the padding tokens are never produced), so no number
measured on it is a result about the real model; speed and memory are. `tiny=True` keeps the architecture and shrinks
every size, for tests and `bench/gpu_check.sh --tiny`.

    python -m geoprobe.fixtures meta-llama/Llama-3.1-8B-Instruct --hf-home /data/hf   # ~16 GB
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from pathlib import Path

import torch

from geoprobe.errors import BadInput
from geoprobe.report.terminal import Bar
from geoprobe.tokens import byte_level_bpe

# The published configs (architecture numbers only; no weights or text).
CONFIGS = {
    "meta-llama/Llama-3.1-8B-Instruct": ("LlamaConfig", dict(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, vocab_size=128256, max_position_embeddings=131072,
        rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False, hidden_act="silu",
        attention_bias=False, mlp_bias=False, bos_token_id=128000, eos_token_id=[128001, 128008, 128009],
        rope_scaling={"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        dtype="bfloat16")),
    "Qwen/Qwen3-8B": ("Qwen3Config", dict(
        hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960,
        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=False, hidden_act="silu",
        attention_bias=False, bos_token_id=151643, eos_token_id=151645, dtype="bfloat16")),
}
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, vocab_size=1024, max_position_embeddings=4096, bos_token_id=0, eos_token_id=1)
SHARD_BYTES = 2 * 2**30  # safetensors shards of about 2 GiB, as the hub's checkpoints are cut
TOKENIZER_WORDS = 1000  # the stand-in tokenizer's trained vocabulary (then padded to the model's)
FORMAT = 3  # what a snapshot holds (3: padded tokenizer, a massive channel through every block): an older one is not reused
# Real 8B models carry a few channels of 20-100x the others' spread at most layers. Each random block
# adds about 1.6 sqrt(layer) of spread to every channel of the 4,096, so an embedding channel 100x the
# others (std 2) is lost after block 1; at 50,000x (std 1,000) it stays massive at every layer
# (measured on the H200: 98 % of the variance at layer 1, 76 % at 16, 61 % at 32). The tiny model
# keeps 100x (99 % at its 4 layers).
MASSIVE_CHANNEL = 7
MASSIVE_SCALE = {False: 50_000.0, True: 100.0}  # by `tiny`


def config_for(repo_id: str, tiny: bool = False):
    import transformers

    if repo_id not in CONFIGS:
        raise BadInput(f"no fixture for {repo_id!r} (have: {', '.join(CONFIGS)})")
    class_name, fields = CONFIGS[repo_id]
    fields = {**fields, **TINY, "rope_scaling": None} if tiny else fields
    return getattr(transformers, class_name)(**fields)


def snapshot_dir(repo_id: str, hf_home: Path, revision: str) -> Path:
    return Path(hf_home) / "hub" / f"models--{repo_id.replace('/', '--')}" / "snapshots" / revision


def _tokenizer(folder: Path, vocab: int) -> None:
    """A byte-level BPE trained on the synthetic corpus's words (any text tokenizes), its
    vocabulary padded with never-produced tokens to exactly `vocab` entries."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    from geoprobe.synthetic import documents

    tok = byte_level_bpe(documents("synthetic:hmm?docs=400&length=64&seed=7"), min(TOKENIZER_WORDS, vocab),
                         ("<|begin_of_text|>", "<|end_of_text|>", "<unk>"), unk="<unk>")
    spec = json.loads(tok.to_str())
    trained = spec["model"]["vocab"]
    # padding entries in the BPE model itself (no merge produces them): len(tokenizer) == vocab
    trained.update({f"<|pad_{i}|>": i for i in range(len(trained), vocab)})
    tok = Tokenizer.from_str(json.dumps(spec))
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>",
                            unk_token="<unk>").save_pretrained(folder)


# --- small offline fixtures for the tests and benchmarks ------------------------------------------

VOCAB = 320
WORDS = ("light dark water earth heaven king house city river stone bread wine tree field road "
         "morning evening word voice hand heart spirit land people fire cloud mountain sea").split()


def synthetic_text(n_words: int, rng: random.Random) -> str:
    """A sentence of the small fixed vocabulary below (the tests' and benchmarks' plain-text corpora)."""
    return " ".join(rng.choice(WORDS) for _ in range(n_words)).capitalize() + "."


def write_corpus(path: Path, n_docs: int, words: tuple[int, int] = (40, 400), seed: int = 0) -> Path:
    rng = random.Random(seed)
    path.write_text("\n\n".join(synthetic_text(rng.randint(*words), rng) for _ in range(n_docs)) + "\n")
    return path


def build_tokenizer(folder: Path):
    """The tests' and benchmarks' small byte-level BPE (VOCAB - 8 entries), saved into `folder`."""
    from transformers import PreTrainedTokenizerFast


    rng = random.Random(1)
    tok = byte_level_bpe([synthetic_text(30, rng) for _ in range(2000)], VOCAB - 8,
                         ("<pad>", "<bos>", "<eos>", "<unk>"), unk="<unk>")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>",
                                   pad_token="<pad>", unk_token="<unk>")
    fast.save_pretrained(folder)
    return fast


def _random_tensor(name: str, shape, generator: torch.Generator) -> torch.Tensor:
    if name.endswith("norm.weight"):
        return torch.ones(shape, dtype=torch.bfloat16)
    return (torch.randn(shape, generator=generator, dtype=torch.float32) * 0.02).to(torch.bfloat16)


def write_fixture(repo_id: str, hf_home: Path, tiny: bool = False, seed: int = 0, progress=None) -> Path:
    """Write the fixture (idempotent: an existing complete snapshot is kept); returns its folder."""
    from accelerate import init_empty_weights
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    config = config_for(repo_id, tiny)
    revision = hashlib.sha1(json.dumps([repo_id, tiny, seed, config.to_dict(), FORMAT], sort_keys=True,
                                       default=str).encode()).hexdigest()
    folder = snapshot_dir(repo_id, hf_home, revision)
    if (folder / "model.safetensors.index.json").is_file():
        return folder
    partial = folder.with_name(f".{revision}.partial")
    partial.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(partial)
    _tokenizer(partial, config.vocab_size)
    with init_empty_weights():
        shapes = {k: tuple(v.shape) for k, v in AutoModelForCausalLM.from_config(config).state_dict().items()}
    generator = torch.Generator().manual_seed(seed)
    groups, current, size = [], [], 0
    for name, shape in shapes.items():
        nbytes = 2 * int(torch.Size(shape).numel())
        if current and size + nbytes > SHARD_BYTES:
            groups.append(current)
            current, size = [], 0
        current.append(name)
        size += nbytes
    groups.append(current)
    weight_map, total = {}, 0
    if progress is not None:
        progress.start(total=len(groups))
    for number, names in enumerate(groups, 1):
        file = f"model-{number:05d}-of-{len(groups):05d}.safetensors"
        tensors = {name: _random_tensor(name, shapes[name], generator) for name in names}
        if "model.embed_tokens.weight" in tensors:  # the residual stream carries it through every layer
            tensors["model.embed_tokens.weight"][:, MASSIVE_CHANNEL] *= MASSIVE_SCALE[tiny]
        save_file(tensors, partial / file, metadata={"format": "pt"})
        total += sum(t.numel() * 2 for t in tensors.values())
        weight_map.update({name: file for name in names})
        del tensors
        if progress is not None:
            progress.advance(1)
    (partial / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    os.replace(partial, folder)  # whole or absent: an interrupted build starts over
    refs = folder.parent.parent / "refs"
    refs.mkdir(exist_ok=True)
    (refs / "main").write_text(revision)
    return folder


def main(repo_id: str, hf_home: Path, tiny: bool = False) -> None:

    bar = Bar(f"fixture {repo_id}{' (tiny)' if tiny else ''}", "shard")
    try:
        folder = write_fixture(repo_id, Path(hf_home), tiny, progress=bar)
    finally:
        bar.stop()
    print(folder)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Write a random-weight 8B fixture into a Hugging Face cache.")
    parser.add_argument("repo_id", choices=sorted(CONFIGS))
    parser.add_argument("--hf-home", required=True, type=Path)
    parser.add_argument("--tiny", action="store_true", help="same architecture, every size shrunk")
    args = parser.parse_args()
    main(args.repo_id, args.hf_home, args.tiny)
