"""What an evaluator LM says about texts: Gen.PPL and MAUVE features.

Gen.PPL: each text is re-tokenised with the evaluator's tokenizer (BOS first where it has
one), cut into chunks of the evaluator's context, and every token after the first is scored;
the corpus value is exp(total NLL / total tokens), the per-sample values exp(mean NLL).
MAUVE features: the evaluator's last-layer hidden state (after the final norm, as
`hidden_states[-1]`) at the last token of each text (truncated to the context), the pooling
MAUVE's authors use with GPT-2.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

from geoprobe.errors import BadInput


def _ids(backbone, text: str) -> list[int]:
    tok = backbone.tokenizer
    if tok is None:
        raise BadInput("the evaluator has no tokenizer")
    ids = tok(text, add_special_tokens=False)["input_ids"]
    return ([tok.bos_token_id] if tok.bos_token_id is not None else []) + ids


def context_length(backbone) -> int:
    return int(getattr(backbone.config, "max_position_embeddings", 1024) or 1024)


TOKENS_PER_BATCH = 8192  # padded tokens per forward pass: bounds the (B, L, vocab) logits


def _batches(sequences: list[list[int]]):
    """(indices, padded ids, mask) batches of similar length (right padding, so positions are
    those of the unpadded sequence), at most TOKENS_PER_BATCH padded tokens each."""
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    batch: list[int] = []
    for i in order + [None]:
        if i is not None and (not batch or len(sequences[i]) * (len(batch) + 1) <= TOKENS_PER_BATCH):
            batch.append(i)
            continue
        if batch:
            width = len(sequences[batch[-1]])
            ids = torch.zeros((len(batch), width), dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for row, j in enumerate(batch):
                ids[row, : len(sequences[j])] = torch.tensor(sequences[j])
                mask[row, : len(sequences[j])] = 1
            yield batch, ids, mask
        batch = [i] if i is not None else []


@torch.no_grad()
def score(backbone, texts: list[str], context: int | None = None) -> tuple[dict, np.ndarray]:
    """Gen.PPL figures and MAUVE features of `texts` from the same batched forward passes.
    Features: the final-normed last-layer state (`hidden_states[-1]`) at the last token of each
    text's first context-length chunk."""
    context = min(context or context_length(backbone), context_length(backbone))
    chunks, owner = [], []  # each text cut into chunks of the evaluator's context
    for index, text in enumerate(texts):
        ids = _ids(backbone, text)
        for start in range(0, max(1, len(ids) - 1), context - 1):
            if start == 0 or len(ids[start:start + context]) >= 2:
                chunks.append(ids[start:start + context])
                owner.append((index, start == 0))
    nll, count = np.zeros(len(texts)), np.zeros(len(texts), dtype=np.int64)
    feats = np.zeros((len(texts), backbone.hidden_size), dtype=np.float32)
    device = backbone.input_device
    for rows, ids, mask in _batches(chunks):
        ids, mask = ids.to(device), mask.to(device)
        out = backbone.model(input_ids=ids, attention_mask=mask, use_cache=False, output_hidden_states=True)
        losses = F.cross_entropy(out.logits[:, :-1].float().transpose(1, 2), ids[:, 1:], reduction="none")
        losses = losses * mask[:, 1:]
        last = out.hidden_states[-1][torch.arange(len(rows), device=device), mask.sum(1) - 1].float().cpu().numpy()
        for row, chunk in enumerate(rows):
            text, first = owner[chunk]
            nll[text] += float(losses[row].sum())
            count[text] += int(mask[row, 1:].sum())
            if first:
                feats[text] = last[row]
    if not count.sum():
        raise BadInput("no text long enough to score (each sample needs at least one token after BOS)")
    ppl = {"gen_ppl": math.exp(nll.sum() / count.sum()),
           "gen_ppl_per_sample": [math.exp(n / c) for n, c in zip(nll, count) if c],
           "scored_tokens": int(count.sum())}
    return ppl, feats


def gen_ppl(backbone, texts: list[str], context: int | None = None) -> dict:
    return score(backbone, texts, context)[0]


def features(backbone, texts: list[str], context: int | None = None) -> np.ndarray:
    return score(backbone, texts, context)[1]


@contextlib.contextmanager
def _without_faiss_size_warning():
    """faiss's k-means prints one 'please provide at least N training points' line per seed from
    C++; the caller already warns about small sample sets once, so those lines are dropped and
    anything else faiss writes to stderr is passed on."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            for line in sink.read().decode(errors="replace").splitlines():
                if "training points" not in line:
                    print(line, file=sys.stderr)


def mauve_score(p_features: np.ndarray, q_features: np.ndarray, seeds=(0, 1, 2)) -> dict:
    """MAUVE (mauve-text) between generated (p) and reference (q) features, mean and std over
    k-means seeds. Biased upwards with few samples: the caller warns below 1,000."""
    import mauve

    with _without_faiss_size_warning():
        values = [float(mauve.compute_mauve(p_features=p_features, q_features=q_features, seed=s, verbose=False,
                                            num_buckets=max(2, min(len(p_features) // 10, 500))).mauve)
                  for s in seeds]
    return {"mauve": float(np.mean(values)), "mauve_std": float(np.std(values)), "mauve_seeds": list(seeds),
            "mauve_samples": len(p_features)}
