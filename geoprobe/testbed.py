"""`builtin:hmm-tiny`: a small Llama trained here on a hidden Markov model whose exact
likelihood is known, so that every claim of the method can be checked against the truth.

The data distribution is `CORPUS` (a sticky 16-state HMM over 128 pseudo-words, see
`geoprobe.synthetic`): its entropy rate is ~3.36 nats/word, the best unigram model reaches
~4.34 (+29%) and the best bigram model ~3.80 (+13%), so a model within 10% of the entropy rate
has learned to track the hidden state over several words. The model is trained on fresh
sequences from the HMM (a stream seeded apart from the corpus documents that scans and sweeps
read, which therefore are held-out text), with the word-level tokenizer of the HMM's words;
`<eos>` doubles as BOS. Deterministic from `SEED` on a given machine; about 3 minutes on two
CPU cores. The result is a plain Llama folder (safetensors + tokenizer), cached like
`builtin:smollm2`, with `geoprobe-source.json` recording how it was made and how well it fits.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from pathlib import Path

import numpy as np
from geoprobe.tokens import word_tokenizer

NAME = "hmm-tiny"
VERSION = 2  # bump when anything below changes: the cache folder is keyed by it
CORPUS = "synthetic:hmm?states=16&vocab=128&emission=0.1&transition=0.1&stick=0.9&docs=1200&length=64&seed=0"
SEED = 0
ARCHITECTURE = dict(hidden_size=128, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=4,
                    intermediate_size=512, max_position_embeddings=256, tie_word_embeddings=False)
STEPS, BATCH, LENGTH, LR, WARMUP = 800, 32, 64, 3e-3, 30
HELD_OUT = 256  # sequences of LENGTH words for the held-out NLL


def words() -> list[str]:
    """The words of CORPUS's HMM: all the testbed's tokenizer knows besides its special tokens."""
    from geoprobe.synthetic import hmm_from_spec

    return list(hmm_from_spec(CORPUS).words)


def tokenizer_for(hmm):
    """The word-level tokenizer of every word the HMM can emit (ids 2.. in sorted order)."""

    return word_tokenizer([" ".join(hmm.words)])


def _with_bos(word_ids: np.ndarray, lookup: np.ndarray, bos: int):
    import torch

    ids = torch.from_numpy(lookup[word_ids])
    return torch.cat([torch.full((len(ids), 1), bos, dtype=torch.long), ids], 1)


def held_out_nll(model, hmm, tokenizer, sequences: int = HELD_OUT, length: int = LENGTH, seed: int = 99) -> dict:
    """Nats per word of the model and of the true HMM on the same fresh held-out sequences."""
    import torch
    import torch.nn.functional as F

    lookup = np.array(tokenizer.convert_tokens_to_ids(hmm.words))
    words = hmm.sample_many(sequences, length, np.random.default_rng([SEED, seed]))
    ids = _with_bos(words, lookup, tokenizer.bos_token_id)
    total = 0.0
    with torch.no_grad():
        for start in range(0, len(ids), 64):
            batch = ids[start:start + 64]
            logits = model(batch).logits[:, :-1].float()
            total += float(F.cross_entropy(logits.transpose(1, 2), batch[:, 1:], reduction="sum"))
    exact = -sum(hmm.log_prob(row.tolist()) for row in words)
    return {"model_nll": total / words.size, "hmm_nll": exact / words.size}


def train_testbed(folder: Path, progress=None) -> dict:
    """Train the testbed into `folder` (written atomically); returns its record."""
    import torch
    import transformers

    from transformers.utils import logging as hf_logging

    from geoprobe.synthetic import hmm_from_spec

    hf_logging.disable_progress_bar()  # our own bar is the one a user sees
    hmm = hmm_from_spec(CORPUS)
    tokenizer = tokenizer_for(hmm)
    config = transformers.LlamaConfig(**ARCHITECTURE, vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                                      eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = transformers.AutoModelForCausalLM.from_config(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / WARMUP) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / STEPS))))
    lookup = np.array(tokenizer.convert_tokens_to_ids(hmm.words))
    stream = np.random.default_rng([SEED, 7])  # apart from the corpus documents' stream ([seed, 1])
    model.train()
    if progress is not None:
        progress.start(total=STEPS)
    for _ in range(STEPS):
        batch = _with_bos(hmm.sample_many(BATCH, LENGTH, stream), lookup, tokenizer.bos_token_id)
        loss = model(batch, labels=batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if progress is not None:
            progress.advance(1)
    model.eval()
    fit = held_out_nll(model, hmm, tokenizer)
    record = {"source": f"trained by geoprobe (testbed v{VERSION})", "corpus": CORPUS, "seed": SEED,
              "steps": STEPS, "batch": BATCH, "length": LENGTH, "lr": LR, "train_words": STEPS * BATCH * LENGTH,
              **fit, "entropy_rate": hmm.entropy_rate(), **{f"{k}_nll": v for k, v in hmm.baselines().items()}}
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=folder.name + ".tmp"))
    tmp.chmod(0o755)  # mkdtemp makes it private; a shared cache must stay readable
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "geoprobe-source.json").write_text(json.dumps(record, indent=2))
    if folder.exists():
        shutil.rmtree(folder)
    tmp.rename(folder)
    return record
