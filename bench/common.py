"""What the benchmarks share: a tiny random Llama with the test tokenizer, and a corpus."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import transformers

from geoprobe.fixtures import build_tokenizer, write_corpus


def tiny_llama(work: Path, n_docs: int) -> tuple[Path, Path]:
    """(model folder, corpus file): Llama d=256, 8 layers, and `n_docs` synthetic documents."""
    config = transformers.LlamaConfig(hidden_size=256, num_hidden_layers=8, num_attention_heads=8,
                                      num_key_value_heads=4, intermediate_size=1024, vocab_size=320,
                                      max_position_embeddings=1024)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(work / "model")
    build_tokenizer(work / "model")
    return work / "model", write_corpus(work / "corpus.txt", n_docs=n_docs, words=(300, 900))
