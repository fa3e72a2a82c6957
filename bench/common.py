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


def training_step(model, loss_fn, lr: float):
    """(step(i): one AdamW step of `loss_fn` under the training loop's autocast with step i's
    random numbers, the trained parameters): the benches' step, outside the loop's bookkeeping."""
    from geoprobe.bridges.train import Shard, mixed_precision, step_generator

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, fused=True)
    autocast = mixed_precision(torch.device("cpu"))

    def step(i: int) -> None:
        with autocast:
            loss = loss_fn(model, step_generator(0, i), Shard())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step, params
