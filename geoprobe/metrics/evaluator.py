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


@torch.no_grad()
def gen_ppl(backbone, texts: list[str], context: int | None = None) -> dict:
    context = min(context or context_length(backbone), context_length(backbone))
    total_nll, total_tokens, per_sample = 0.0, 0, []
    for text in texts:
        ids = _ids(backbone, text)
        nll, count = 0.0, 0
        for start in range(0, max(1, len(ids) - 1), context - 1):
            chunk = torch.tensor([ids[start:start + context]], device=backbone.input_device)
            if chunk.shape[1] < 2:
                break
            logits = backbone.model(input_ids=chunk, use_cache=False).logits[0, :-1].float()
            nll += float(F.cross_entropy(logits, chunk[0, 1:], reduction="sum"))
            count += chunk.shape[1] - 1
        if count:
            per_sample.append(math.exp(nll / count))
            total_nll += nll
            total_tokens += count
    if not total_tokens:
        raise BadInput("no text long enough to score (each sample needs at least one token after BOS)")
    return {"gen_ppl": math.exp(total_nll / total_tokens), "gen_ppl_per_sample": per_sample,
            "scored_tokens": total_tokens}


@torch.no_grad()
def features(backbone, texts: list[str], context: int | None = None) -> np.ndarray:
    context = min(context or context_length(backbone), context_length(backbone))
    out = []
    for text in texts:
        ids = torch.tensor([_ids(backbone, text)[:context]], device=backbone.input_device)
        hidden = backbone.model(input_ids=ids, output_hidden_states=True, use_cache=False).hidden_states[-1]
        out.append(hidden[0, -1].float().cpu().numpy())
    return np.stack(out)


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
