"""What an evaluator LM says about texts: Gen.PPL and MAUVE features.

Gen.PPL, as the MDLM/ReMDM code (`compute_generative_perplexity`) computes it: each text is
re-tokenised with the evaluator's tokenizer, with no BOS (GPT-2's tokenizer adds none), cut into
chunks of the evaluator's context, and every token after the text's first is scored: the first
token is never a target. At an end of document it does as that code does too: a sample's text
keeps its generator's special tokens, it is split at the samples file's EOS string into
documents, the documents are joined by the evaluator's own EOS id, and of those EOS tokens only
the first is scored (their mask: token != eos OR cumsum(token == eos) == 1); the corpus value
is exp(total NLL / total scored tokens), the per-sample values exp(mean NLL). `bos=True` is
geoprobe's earlier reading (`geoprobe eval --gen-ppl-bos`): the evaluator's BOS first where it
has one, so the text's first token is scored after it; a text that starts mid-sentence (a
diffusion sample) pays for its first token there, a document start (the AR row's) hardly.
MAUVE features: the evaluator's last-layer hidden state (after the final norm, as
`hidden_states[-1]`) at the last token of each text (truncated to the context), the pooling
MAUVE's authors use with GPT-2, from the same ids (no BOS by default, as mauve-text's GPT-2
tokenisation).
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from geoprobe.bridges.kinds import open_checkpoint
from geoprobe.backbone import load_backbone
from geoprobe.corpus import check_source, iter_jsonl, read_documents, split_documents
from geoprobe.errors import BadInput
from geoprobe.events import note
from geoprobe.files import write_json_atomic
from geoprobe.metrics.text import special_token_metrics, text_metrics, token_metrics
from geoprobe.store import check_writable
from geoprobe.workflows.generate import end_of_text, sample_meta


def evaluator_eos(tok) -> int | None:
    """The evaluator's EOS id, or None where it has no end of document (`end_of_text`: none, or
    a whitespace one such as a character tokenizer's space)."""

    if tok.eos_token_id is None or end_of_text(tok) is None:
        return None
    return int(tok.eos_token_id)


def _ids(backbone, text: str, eos: str | None = None, bos: bool = False) -> tuple[list[int], list[int]]:
    """(the evaluator's ids of a text, a 0/1 weight per position: whether that token is scored
    as a target). Ids: ids(doc0) + [EOS] + ids(doc1) + ..., the documents being the text split
    at `eos` (the samples file's EOS string; None: one document), after the evaluator's BOS
    where `bos` and it has one. Weights, as the MDLM/ReMDM Gen.PPL mask (token != eos) |
    (cumsum(token == eos) == 1) over the text's tokens: every token but the evaluator's EOS, and
    the first EOS; position 0 has nothing before it and is never a target (without BOS: the
    text's first token)."""
    tok = backbone.tokenizer
    if tok is None:
        raise BadInput("the evaluator has no tokenizer")

    def encode(piece: str) -> list[int]:
        return tok(piece, add_special_tokens=False)["input_ids"]

    start = [tok.bos_token_id] if bos and tok.bos_token_id is not None else []
    end = evaluator_eos(tok)
    documents = text.split(eos) if eos else [text]
    if end is None:  # an evaluator without an EOS token: documents are joined by a paragraph break
        body = encode("\n\n".join(documents))
    else:
        body = encode(documents[0])
        for doc in documents[1:]:
            body += [end] + encode(doc)
    ends = np.cumsum([t == end for t in body]) if body else np.zeros(0, dtype=np.int64)
    weights = [0] * len(start) + [int(t != end or e == 1) for t, e in zip(body, ends)]
    weights[:1] = [0] * len(weights[:1])  # position 0 has nothing before it: never a target, BOS or not
    return start + body, weights


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
def score(backbone, texts: list[str], context: int | None = None, eos: str | None = None,
          bos: bool = False) -> tuple[dict, np.ndarray]:
    """Gen.PPL figures and MAUVE features of `texts` from the same batched forward passes, each
    text split into documents at `eos` (the samples file's EOS string; None: plain texts), after
    the evaluator's BOS where `bos`, see `_ids`. Features: the final-normed last-layer state
    (`hidden_states[-1]`) at the last token of each text's first context-length chunk."""
    context = min(context or context_length(backbone), context_length(backbone))
    chunks, targets, owner = [], [], []  # each text cut into chunks of the evaluator's context
    for index, text in enumerate(texts):
        ids, weights = _ids(backbone, text, eos, bos)
        for start in range(0, max(1, len(ids) - 1), context - 1):
            scored = weights[start + 1:start + context]
            # a later chunk with nothing to score (a tail of unscored EOS tokens) is not run
            if start == 0 or (len(ids[start:start + context]) >= 2 and any(scored)):
                chunks.append(ids[start:start + context])
                targets.append(scored)
                owner.append((index, start == 0))
    nll, count = np.zeros(len(texts)), np.zeros(len(texts), dtype=np.int64)
    feats = np.zeros((len(texts), backbone.hidden_size), dtype=np.float32)
    device = backbone.input_device
    for rows, ids, mask in _batches(chunks):
        ids, mask = ids.to(device), mask.to(device)
        # the base model's final-normed states, then the head in chunks of positions: a B x L x V
        # float32 logits tensor would be 10 GB at 8,192 positions of a 128k vocabulary
        final = backbone.base(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
        weights = torch.zeros((len(rows), ids.shape[1] - 1), dtype=torch.float32)
        for row, chunk in enumerate(rows):  # 0 on padding, as on an unscored EOS
            weights[row, :len(targets[chunk])] = torch.tensor(targets[chunk], dtype=torch.float32)
        weights = weights.to(device)
        losses = backbone.token_losses(final[:, :-1], ids[:, 1:]) * weights
        last = final[torch.arange(len(rows), device=device), mask.sum(1) - 1].float().cpu().numpy()
        for row, chunk in enumerate(rows):
            text, first = owner[chunk]
            nll[text] += float(losses[row].sum())
            count[text] += int(weights[row].sum())
            if first:
                feats[text] = last[row]
    return perplexities(nll, count), feats


def perplexities(nll: np.ndarray, count: np.ndarray) -> dict:
    """Gen.PPL of the whole set and of each sample from their summed NLLs and scored tokens."""
    if not count.sum():
        raise BadInput("no text long enough to score (each sample needs a token after its first)")
    return {"gen_ppl": math.exp(nll.sum() / count.sum()),
            "gen_ppl_per_sample": [math.exp(n / c) for n, c in zip(nll, count) if c],
            "nll_per_sample": nll.tolist(), "tokens_per_sample": count.tolist(),  # what an interval resamples
            "scored_tokens": int(count.sum())}


NGRAM = "ngram:"  # --evaluator ngram:CORPUS
NGRAM_ORDER = 3  # trigrams: on the KJV's million tokens most 4-grams occur once
SEPARATOR = "\x1e"  # ASCII's record separator: splits the corpus into its documents for `_ids`


class NgramEvaluator:
    """`ngram:CORPUS`: Gen.PPL under an interpolated Kneser-Ney trigram of CORPUS
    (geoprobe.metrics.ngram), in the token ids of the first evaluator (an LM), the corpus read as
    `_ids` reads a sample with `bos`: its documents joined by that evaluator's EOS, the first
    after one too. Samples are read as the LM evaluator reads them (`bos`: no BOS, the first token
    unscored, by default). An evaluator that is no generator's backbone. It has no features, so
    it cannot come first (MAUVE's)."""

    def __init__(self, spec: str, tokenizer):
        from geoprobe.metrics.ngram import KneserNey

        self.tokenizer = tokenizer
        # an id can lie past len(tokenizer) where the vocabulary has holes
        vocab = max(len(tokenizer), max(tokenizer.get_vocab().values(), default=-1) + 1)
        documents = [d.replace(SEPARATOR, " ") for d in read_documents(spec[len(NGRAM):])]
        self.model = KneserNey(self.ids(SEPARATOR.join(documents), SEPARATOR, bos=True)[0], vocab, NGRAM_ORDER)

    def ids(self, text: str, eos: str | None, bos: bool = False) -> tuple[list[int], list[int]]:
        """`_ids`; with `bos` its leading BOS read as the evaluator's EOS: both mark a document's
        start, and the corpus, one stream, holds BOS once but EOS before each of its documents, so
        a sample opens as the corpus's documents do."""
        ids, weights = _ids(self, text, eos, bos)
        end = evaluator_eos(self.tokenizer)
        if bos and ids and end is not None and ids[0] == self.tokenizer.bos_token_id:
            ids[0] = end
        return ids, weights

    def score(self, texts: list[str], eos: str | None = None, bos: bool = False) -> tuple[dict, None]:
        """(the Gen.PPL figures `score` gives, no features)."""
        nll, count = np.array([self.model.sequence_nll(*self.ids(text, eos, bos)) for text in texts]).T.reshape(2, -1)
        return perplexities(nll, count.astype(np.int64)), None


def gen_ppl(backbone, texts: list[str], context: int | None = None, eos: str | None = None,
            bos: bool = False) -> dict:
    return score(backbone, texts, context, eos, bos)[0]


def features(backbone, texts: list[str], context: int | None = None, eos: str | None = None,
             bos: bool = False) -> np.ndarray:
    return score(backbone, texts, context, eos, bos)[1]


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
                    note(line)  # what else faiss said, through the library's one message path


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


# --- `geoprobe eval`: every metric of some samples files, in one evaluator load ----------------

MAUVE_MIN_SAMPLES = 1000


def read_samples(path: Path) -> list[str]:
    """The texts of a samples.jsonl file (one line naming the row that has none)."""
    return read_sample_rows(path)[0]


def read_sample_rows(path: Path) -> tuple[list[str], list[list[int] | None]]:
    """(the texts, the generator's token ids of each row or None where a row has none, as an
    external file's) of a samples.jsonl file; one line naming a malformed row."""
    if not path.is_file():
        raise BadInput(f"samples file not found: {path}")

    texts, token_ids = [], []
    for number, row in iter_jsonl(path):
        if not isinstance(row.get("text"), str):
            raise BadInput(f"{path}:{number}: a sample row needs a string field 'text'")
        ids = row.get("token_ids")
        if ids is not None and not (isinstance(ids, list) and all(isinstance(i, int) and not isinstance(i, bool)
                                                                  for i in ids)):
            raise BadInput(f"{path}:{number}: 'token_ids' must be a list of integers")
        texts.append(row["text"])
        token_ids.append(ids)
    if not texts:
        raise BadInput(f"samples file {path} is empty")
    return texts, token_ids


def sample_eos(path: Path) -> str | None:
    """The EOS string a samples file's text holds (its meta row's `eos`), or None: no meta row,
    an older row without the key, a generator without EOS or with a whitespace one."""

    eos = (sample_meta(path) or {}).get("eos")
    return eos if isinstance(eos, str) and eos.strip() else None


def references_like(spec: str, tokenizer, length: int, seed: int) -> list[str]:
    """MAUVE's reference texts, cut as the samples are: the held-out documents of `spec` (those a
    generator trained at split seed `seed` never saw: `geoprobe.corpus.split_documents`) as one
    stream of `tokenizer`'s ids with its EOS after each document (`geoprobe.tokens.token_stream`),
    cut into pieces of `length` ids that cross document breaks as samples do, each decoded with
    its special tokens, in a seeded order."""
    from geoprobe.tokens import token_stream

    stream = token_stream(split_documents(spec, seed)[1], tokenizer)
    pieces = [stream[i:i + length] for i in range(0, len(stream) - length + 1, length)] if length > 0 else []
    order = np.random.default_rng(seed).permutation(len(pieces))
    return [tokenizer.decode(pieces[i], skip_special_tokens=False) for i in order]


def generator_of(samples: Path):
    """(the samples file's meta row, its model's kind or None, its config.json record or {})."""

    meta = sample_meta(samples) or {}
    model = Path(meta.get("model", ""))
    if not meta or meta.get("decode") == "causal" or not (model / "config.json").is_file():
        return meta, None, {}  # the AR ceiling's folder is a plain model, not a geoprobe checkpoint
    try:
        return (meta, *open_checkpoint(model))
    except BadInput:  # moved or rewritten since it was sampled: nothing to say about its origin
        return meta, None, {}


def generator_backbone(samples: Path) -> str | None:
    """The causal LM a samples file's generator runs through, if any: the AR ceiling's model, or
    what the model's kind says (a bridge's backbone, whose upper stack writes the text; a DSL
    model's `--init-from`); not the rounding baseline's, which rounds to the nearest embedding.
    Gen.PPL under that same model measures agreement with itself, not quality."""
    meta, kind, config = generator_of(samples)
    if meta.get("decode") == "causal":
        return meta.get("model")
    if meta.get("decode") == "round" or kind is None:
        return None
    return kind.generator_backbone(config)


def oracle_start_for(samples: Path, document_length: int) -> str:
    """Where the HMM starts a generator's samples (geoprobe.synthetic.HMM.start), from how its
    training rows began: an AR model after BOS at a document start; a trained model where its
    kind says (a bridge at its per-document blocks, a DSL model whose rows are whole documents at
    a document start); anywhere otherwise."""
    meta, kind, config = generator_of(samples)
    if meta.get("decode") == "causal":
        return "document"
    return "anywhere" if kind is None else kind.oracle_start(config, document_length)


def same_model(a: str | None, b: str) -> bool:
    if a is None:
        return False
    if a == b:
        return True
    return Path(a).exists() and Path(b).exists() and Path(a).resolve() == Path(b).resolve()


def evaluator_list(evaluator: str | list[str]) -> list[str]:
    """--evaluator: one model, or several separated by commas (each scores every file)."""
    names = [e.strip() for e in evaluator.split(",")] if isinstance(evaluator, str) else list(evaluator)
    if not names or not all(names):
        raise BadInput(f"--evaluator needs one or more models separated by commas, got {evaluator!r}")
    if names[0].startswith(NGRAM):
        raise BadInput(f"--evaluator {names[0]} scores with the tokenizer of an LM evaluator listed before it "
                       f"(and has no features for MAUVE): list one first, e.g. builtin:smollm2,{names[0]}")
    for name in names:
        if name.startswith(NGRAM):
            check_source(name[len(NGRAM):])
    return names


def evaluate_samples(samples: list[Path], evaluator: str | list[str], references: str | None, out: Path | None,
                     seed: int = 0, device: str = "auto", oracle_start: str = "auto",
                     gen_ppl_bos: bool = False, *, reference_features: Path | None = None) -> tuple[dict, Path]:
    """Gen.PPL, diversity, word and token entropy, repetition and (with `references`) MAUVE of
    each samples file, plus the exact NLL under the HMM for a synthetic corpus (from
    `oracle_start`, see geoprobe.synthetic.HMM.start; `auto`: each file's own,
    `oracle_start_for`). Each file's text is split into documents at its meta row's EOS string
    (`sample_eos`, recorded as `eos`): Gen.PPL scores the first EOS only (`_ids`), the word
    metrics read EOS as a line break, the HMM scores each later document from a document
    start. Gen.PPL gives the evaluator no BOS and never scores a text's first token, as the
    MDLM/ReMDM code; `gen_ppl_bos` prepends the BOS and scores it (geoprobe's earlier reading).
    MAUVE's references are `references`' held-out documents at split seed `seed`
    (`references_like`). Every file is checked before the evaluator loads. With several
    evaluators each scores Gen.PPL (`gen_ppl_by_evaluator`); the first also gives `gen_ppl` and
    MAUVE's features. An evaluator that is the generator's own backbone is named in
    `evaluator_is_generator` (and warned about). `reference_features`: where MAUVE's reference
    features are kept for later calls (`_stored_features`). Writes `out`, or SAMPLES.metrics.json
    beside each file; returns (results, the file written first)."""

    from geoprobe.synthetic import check_oracle_start

    evaluators = evaluator_list(evaluator)
    check_oracle_start(oracle_start)  # whatever the references: a wrong flag is a mistake either way
    rows = {str(p): read_sample_rows(p) for p in samples}  # every file is checked before any model loads
    sets = {name: texts for name, (texts, _) in rows.items()}
    eos = {name: sample_eos(Path(name)) for name in sets}  # each file's own EOS string (its documents)
    if references is not None:
        check_source(references)
    oracle, starts, length = _oracle(references, list(sets), oracle_start)
    for folder in (out and out.parent, reference_features):  # what it writes: refused before any model loads
        if folder is not None:
            check_writable(folder)
    first_token = "scored after BOS" if gen_ppl_bos else "unscored"
    # each file's generator tokenizer (None: not on record) and token ids: its special tokens, its references
    loaded = {}  # one load per tokenizer in this call (a folder rewritten later is read again next call)
    generators = {name: (generator_tokenizer(Path(name), loaded), rows[name][1]) for name in sets}
    results = {name: {"samples": len(texts), "evaluator": evaluators[0], "eos": eos[name],
                      "gen_ppl_first_token": first_token, **text_metrics(texts, eos[name]),
                      **token_metrics(rows[name][1]), **special_token_metrics(*generators[name][::-1]),
                      "gen_ppl_by_evaluator": {}, "nll_by_evaluator": {}, "evaluator_is_generator": []}
               for name, texts in sets.items()}
    owners = {name: generator_backbone(Path(name)) for name in sets}
    tokenizer = None  # the first evaluator's, which an n-gram evaluator counts in
    for index, name in enumerate(evaluators):
        backbone = NgramEvaluator(name, tokenizer) if name.startswith(NGRAM) else load_backbone(name, device=device)
        tokenizer = tokenizer or backbone.tokenizer
        reference_cache = {}  # held-out texts and features, shared by the files (_mauve_row)
        for path, texts in sets.items():
            row = results[path]
            ppl, feats = (backbone.score(texts, eos[path], gen_ppl_bos) if name.startswith(NGRAM)
                          else score(backbone, texts, eos=eos[path], bos=gen_ppl_bos))
            _record_evaluator(row, name, ppl, owners[path], path)
            if index:
                continue
            row.update(ppl)
            if references is not None:
                row.update(_mauve_row(backbone, texts, eos[path], feats, references, seed, bos=gen_ppl_bos,
                                      cache=reference_cache, generator=generators[path],
                                      store=None if reference_features is None else (reference_features, name)))
        del backbone
        gc.collect()  # the next evaluator loads only once this one is gone
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    if oracle is not None:
        from geoprobe.synthetic import oracle_scores

        entropy_rate = oracle.entropy_rate()
        for path, texts in sets.items():
            results[path].update(oracle_scores(oracle, texts, starts[path], length, eos[path]),
                                 oracle_entropy_rate=entropy_rate)
    header = {"evaluator": evaluators[0], "evaluators": evaluators, "references": references, "seed": seed,
              "gen_ppl_first_token": first_token}
    # whole files (no lock: eval writes one file of its own beside what it reads, replaced whole)
    if out is not None:
        write_json_atomic(out, {**header, "results": results})
    else:  # each beside its samples file (never the checkpoint's own metrics.json)
        for name, row in results.items():
            write_json_atomic(Path(name).with_suffix(".metrics.json"), {**header, "results": {name: row}})
    target = out or Path(samples[0]).with_suffix(".metrics.json")
    return results, target


def _record_evaluator(row: dict, name: str, ppl: dict, owner: str | None, path: str) -> None:
    """One evaluator's Gen.PPL and per-sample NLLs (for its interval, `geoprobe compare`) in a
    file's row, and whether that evaluator is the generator's own backbone (warned about)."""
    row["gen_ppl_by_evaluator"][name] = ppl["gen_ppl"]
    row["nll_by_evaluator"][name] = {k: ppl[k] for k in ("nll_per_sample", "tokens_per_sample")}
    if same_model(owner, name):
        row["evaluator_is_generator"].append(name)
        note(f"warning: {Path(path).parent.name}: the evaluator {name} is the generator's own backbone; "
             "its Gen.PPL measures agreement with itself, not quality")


def _oracle(references: str | None, names: list[str], oracle_start: str):
    """(the HMM, where each file's samples start in it, its document length) for synthetic:hmm
    references, each start checked before any model loads; (None, {}, None) otherwise."""
    if references is None or not references.startswith("synthetic:"):
        return None, {}, None
    from geoprobe.synthetic import hmm_from_spec, parse_spec

    oracle = hmm_from_spec(references)  # one HMM and one entropy rate per call
    length = parse_spec(references)["length"]
    starts = {name: oracle_start_for(Path(name), length) if oracle_start == "auto" else oracle_start for name in names}
    for start in set(starts.values()):
        oracle.start(start, length)  # a bad --oracle-start, before any model loads
    return oracle, starts, length


def mauve_count(samples: int, references: int, found: str = "") -> int:
    """How many samples MAUVE scores: as many as there are references, all of them where the
    references suffice; fewer where the held-out text holds fewer pieces of the samples' length,
    but at least half of MAUVE_MIN_SAMPLES (else one line, with `found`, what was found)."""
    scored = min(samples, references)
    if scored < min(samples, MAUVE_MIN_SAMPLES // 2):
        raise BadInput(f"MAUVE needs at least as many references as samples (or {MAUVE_MIN_SAMPLES // 2})"
                       + (f": {found}" if found else ""))
    return scored


def generator_tokenizer(samples: Path, loaded: dict | None = None):
    """The tokenizer a samples file's generator drew its ids in, or None where its record does not
    say or it cannot be loaded any more (a note says so): the AR row's model's; a checkpoint's own
    (DSL, MDLM and the embedding-diffusion baselines save theirs); else its backbone's (a bridge's
    rows, rounding). `loaded`: tokenizers already loaded in this call, by where they come from."""
    meta, _, config = generator_of(samples)
    if meta.get("decode") == "causal" and meta.get("model"):
        how, where = "spec", meta["model"]
    elif meta.get("model") and (Path(meta["model"]) / "tokenizer.json").is_file():
        how, where = "saved", str(Path(meta["model"]).resolve())
    elif backbone := (config.get("identity") or {}).get("model"):
        how, where = "spec", backbone
    else:
        return None
    loaded = {} if loaded is None else loaded
    if (how, where) not in loaded:
        from geoprobe.backbone import load_tokenizer
        from geoprobe.tokens import load_saved_tokenizer

        try:
            loaded[how, where] = load_tokenizer(where) if how == "spec" else load_saved_tokenizer(Path(where))
        except Exception as exc:  # moved, gone or rewritten since it sampled: its record says no more
            note(f"warning: {Path(samples).parent.name}: its generator's tokenizer ({where}) does not load "
                 f"({str(exc).splitlines()[0][:80] if str(exc) else type(exc).__name__}); MAUVE's references are cut "
                 "in the evaluator's ids and its special tokens are not counted")
            return None
    return loaded[how, where]


def _stored_features(store: tuple[Path, str], backbone, texts: list[str], eos: str | None, bos: bool) -> np.ndarray:
    """The evaluator's features of reference `texts`, read from the store's folder where an
    earlier call kept them, else computed and kept there (whole or not at all). The file is named
    by a hash of what the features depend on: the evaluator's spec, its dtype, the texts, the EOS
    string and the BOS choice. `store`: (folder, evaluator spec)."""
    import hashlib

    folder, spec = store
    dtype = str(backbone.dtype)
    key = hashlib.sha256(json.dumps([spec, dtype, texts, eos, bos]).encode()).hexdigest()[:32]
    path = folder / f"{key}.npy"
    if path.is_file():
        return np.load(path)
    found = features(backbone, texts, eos=eos, bos=bos)
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / f".{key}.{os.getpid()}.npy"
    np.save(partial, found)
    os.replace(partial, path)
    return found


def _mauve_row(backbone, texts: list[str], eos: str | None, feats: np.ndarray, references: str, seed: int, *,
               bos: bool, cache: dict, generator: tuple | None = None, store: tuple[Path, str] | None = None) -> dict:
    """MAUVE of one file's features against held-out references cut as its samples are: where
    `generator` (its tokenizer, the samples' token ids) is known, the held-out token stream in the
    generator's ids with its EOS, cut at the samples' length, decoded, and read as the samples are
    (split at the same EOS string `eos`); so files of one tokenizer and length share one reference
    set. Otherwise (a file without a generator record) cut to the samples' median length in the
    evaluator's ids. `cache`: one cut of the held-out text per tokenizer and length, one features
    pass per reference set (the tokenizers live for the whole call). `store`: also keep and read
    the reference features on disk (`_stored_features`), across calls."""
    if generator is not None and generator[0] is not None and all(i is not None for i in generator[1]):
        tok, ids = generator
        length, reference_eos, cut = int(np.median([len(i) for i in ids])), eos, "generator"
    else:
        tok, length, cut = backbone.tokenizer, int(np.median([len(_ids(backbone, t, eos)[0]) for t in texts])), "evaluator"
        reference_eos = backbone.tokenizer.eos_token if evaluator_eos(backbone.tokenizer) is not None else None
    texts_key = ("texts", id(tok), length)  # one held-out read and cut per tokenizer and length in this call
    if texts_key not in cache:
        cache[texts_key] = references_like(references, tok, length, seed)
    refs = cache[texts_key]
    scored = mauve_count(len(texts), len(refs), f"{len(refs)} references of the samples' {length} tokens in "
                         f"{references}'s held-out documents (split seed {seed}), {len(texts)} samples")
    if scored < len(texts):
        note(f"MAUVE on the first {scored} of {len(texts)} samples: {references}'s held-out documents hold "
             f"{len(refs)} pieces of the samples' {length} tokens")
    if scored < MAUVE_MIN_SAMPLES:  # a note: the CLI shows it, a notebook gets a log record
        note(f"warning: MAUVE on {scored} samples (< {MAUVE_MIN_SAMPLES}) is biased upwards")
    feats = feats[:scored]
    key = (tuple(refs[:scored]), bos, reference_eos)
    if key not in cache:
        cache[key] = (features(backbone, list(key[0]), eos=reference_eos, bos=bos) if store is None
                      else _stored_features(store, backbone, list(key[0]), reference_eos, bos))
    return {**mauve_score(feats, cache[key]), "mauve_reference_tokens": length, "mauve_references_cut_in": cut}
