"""Generating and scoring text with any trained generator: a DSL checkpoint, a bridge directory
(the hybrid through the frozen upper stack, or the layer-0 rounding baseline), or a causal LM
itself (the AR ceiling); samples.jsonl and its meta rows; the held-out NLL of a DSL model.
What `geoprobe sample` and `geoprobe nll` call."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, fields
from pathlib import Path

import torch

from geoprobe.bridges.checkpoint import CONFIG
from geoprobe.bridges.dsl import sequences, split_documents
from geoprobe.bridges.hidden import DECODES
from geoprobe.bridges.kinds import KINDS, load_denoiser, open_checkpoint
from geoprobe.bridges.likelihood import ESTIMATORS as table
from geoprobe.backbone import load_backbone
from geoprobe.corpus import read_documents
from geoprobe.errors import BadInput
from geoprobe.files import holding
from geoprobe.store import check_writable
from geoprobe.tokens import (TEXT8_LENGTH, char_tokenizer, is_text8, start_token, text8_split,
    token_stream, unsampled_ids)
from geoprobe.samplers import AUTOREGRESSIVE, check_options, knob_default, preset_flags, sampler_from_flags
from geoprobe.samplers.base import nucleus
from geoprobe.samplers.ltr import LeftToRight


@dataclass(frozen=True)
class SampleSettings:
    """The flags of `geoprobe sample`. A sampler knob left None takes the preset's value, else the
    sampler's own default (geoprobe.samplers.knob_default): the defaults live in the sampler classes."""

    num: int = 8
    length: int = 128
    steps: int | None = None
    top_p: float | None = None
    top_p_rule: str | None = None
    per_step: int | None = None
    eta: float | None = None
    eta_cap: float | None = None
    t_on: float | None = None
    t_off: float | None = None
    alpha_on: float | None = None
    switch_snr: float | None = None
    continuous_steps: int | None = None
    confidence: float | None = None
    final_argmax: bool | None = None
    finisher: str = "mdlm"
    preset: str | None = None
    decode: str = "stack"
    seed: int = 0
    batch: int | None = None  # samples drawn together (None: all of num); the same batch, the same samples

    def knobs(self) -> dict:
        """The sampler knobs, None where not given."""
        others = ("num", "length", "finisher", "preset", "decode", "seed", "batch")
        return {k: v for k, v in vars(self).items() if k not in others}


SAMPLES = "samples.jsonl"
META = "samples.meta.jsonl"
PARTIAL = "samples.partial.pt"  # a batched draw's progress (`generate`), gone once the set is written


def set_name(sampler: str, settings: SampleSettings) -> str:
    """A sample set's default folder name: the sampler, then each setting that differs from its
    default as its flag reads (`mdlm-steps-32`, `roar-length-64-seed-1`): two sets of one model
    never share a file."""
    parts, defaults = [sampler], SampleSettings()
    last = ("num", "length", "seed")  # the sampler's knobs first, then how many, how long, which seed
    for field in sorted(fields(SampleSettings), key=lambda f: f.name in last and last.index(f.name) + 1):
        value = getattr(settings, field.name)
        if value is None or value == getattr(defaults, field.name):
            continue
        flag = field.name.replace("_", "-")
        parts.append((flag if value else f"no-{flag}") if isinstance(value, bool) else f"{flag}-{value}")
    return "-".join(parts)


def checkpoint_folder(model: Path) -> Path:
    """The checkpoint directory `model` names: itself, or where it is a bridge's layer folder
    (RUN/bridges/layer-NN) its one seed's folder; several seeds are one line naming them."""
    model = Path(model)
    if (model / CONFIG).is_file() or not model.is_dir():
        return model
    seeds = sorted(p for p in model.glob("seed-*") if (p / CONFIG).is_file())
    if len(seeds) > 1:
        raise BadInput(f"{model} holds {len(seeds)} seeds ({', '.join(p.name for p in seeds)}): pass one of them, "
                       f"e.g. --model {seeds[0]}")
    return seeds[0] if seeds else model


def refuse_checkpoint_for_ar(model: Path) -> None:
    """`--sampler ar` samples a causal LM; a geoprobe checkpoint is one line naming what applies."""
    if not (Path(model) / CONFIG).is_file() or "kind" not in json.loads((Path(model) / CONFIG).read_text()):
        return
    kind, record = open_checkpoint(model)
    backbone = kind.generator_backbone(record)
    raise BadInput(f"--sampler ar samples a causal LM left to right, and {model} holds {kind.title}: use "
                   f"--sampler {' or '.join(kind.samplers[:3])}{', ...' if len(kind.samplers) > 3 else ''}"
                   + (f", or --model {backbone} for its backbone" if backbone else ""))


def _checked(model: Path, sampler: str, p: SampleSettings):
    """The sampler `generate` runs (None for `ar`), every flag checked before anything loads."""
    check_options(finisher=p.finisher, preset=p.preset, num=p.num, length=p.length, batch=p.batch, **p.knobs())
    if sampler == AUTOREGRESSIVE:
        refuse_checkpoint_for_ar(model)
        if p.batch is not None:
            raise BadInput("--batch applies to the denoising samplers: --sampler ar draws all --num at once, its "
                           "logits one position a step")
        return None
    if p.decode not in DECODES:
        raise BadInput(f"unknown --decode {p.decode!r} (use {', '.join(DECODES)})")
    if sampler == LeftToRight.name and p.decode == "round":
        raise BadInput("--sampler ltr decodes through the upper stack, which --decode round does without")
    chosen = sampler_from_flags(  # an unknown sampler is refused here, by the registry that owns the names
        sampler, p.finisher, p.preset, **p.knobs())
    kind, _ = open_checkpoint(model)
    if sampler not in kind.samplers:
        raise BadInput(f"--sampler {sampler} does not apply to {kind.title} ({model}); use {', '.join(kind.samplers)}")
    return chosen


def generate(model: Path, sampler: str, settings: SampleSettings = SampleSettings(), out: Path | None = None,
             device: str = "auto", force: bool = False) -> dict:
    """`settings.num` samples of `settings.length` tokens from `model` with `sampler` (or `ar`:
    the causal LM itself, left to right), written to OUT/samples.jsonl (default OUT:
    MODEL/samples/`set_name`) with its row in samples.meta.jsonl; every flag is checked before
    anything loads. A file holding another set (another model, sampler or setting) is refused
    unless `force`; the same set is written again in place. Returns {"meta": ..., "samples": rows}."""

    p = settings
    model = checkpoint_folder(model) if sampler != AUTOREGRESSIVE else model
    chosen = _checked(model, sampler, p)
    if sampler == AUTOREGRESSIVE and out is None:
        raise BadInput("--sampler ar needs --out (the model is not a checkpoint directory)")
    out = Path(out) if out is not None else Path(model) / "samples" / set_name(sampler, p)
    check_writable(out)
    # what makes the set (the model's absolute path where it is a folder: compare may run from elsewhere)
    identity = {"model": str(Path(model).resolve()) if Path(model).is_dir() else str(model), "sampler": sampler,
                **vars(p)}
    named = {"set": identity, "set_name": set_name(sampler, p)}
    with holding(out, "geoprobe sample"):  # every flag checked: the folder written into
        check_replace(out / SAMPLES, identity, force)
        resume = partial_draw(out / PARTIAL, identity, force)
        if sampler == AUTOREGRESSIVE:  # the ceiling: the backbone itself, sampled left to right with its KV cache
            knobs = preset_flags(p.preset, sampler, {"top_p": p.top_p, "top_p_rule": p.top_p_rule})
            return _sample_autoregressive(str(model), p.num, p.length, top_p=knobs.get("top_p") or knob_default("top_p"),
                                          top_p_rule=knobs.get("top_p_rule") or knob_default("top_p_rule"), out=out,
                                          seed=p.seed, device=device, preset=p.preset, named=named)
        denoiser, tokenizer = load_denoiser(model, device, p.decode)
        keep = None if p.batch is None else (lambda progress: save_partial(out / PARTIAL, identity, progress))
        result = chosen.sample(denoiser, p.num, p.length, p.seed, batch=p.batch, resume=resume, on_batch=keep)
        meta = {**result.settings, "preset": p.preset, "nfe": result.nfe, "nfe_per_sample": result.nfe_per_sample,
                "skipped_calls": result.skipped, "decode": p.decode,
                "resumed_at": None if resume is None else resume["done"], **named}
        written = write_samples(out, tokenizer, result.tokens.tolist(), meta, result.seconds, identity["model"])
        (out / PARTIAL).unlink(missing_ok=True)
        return written


def differing(held: dict, identity: dict) -> list[str]:
    """The settings in which a recorded sample set `held` differs from `identity`, sorted. A setting
    absent from an older set's record counts as its default, None (e.g. --batch)."""
    return sorted(k for k in held.keys() | identity.keys() if held.get(k) != identity.get(k))


def partial_draw(path: Path, identity: dict, force: bool) -> dict | None:
    """The progress an interrupted batched draw of this set left in `path` (`save_partial`), or
    None where there is none (or `force`: it is dropped). One line where it is another set's: a
    second `sample` with other flags never silently drops the first's batches."""
    if not path.is_file():
        return None
    if force:
        path.unlink()
        return None
    saved = torch.load(path, weights_only=True)
    keys = differing(saved["set"], identity)
    if keys:
        raise BadInput(f"{path} holds the batches of another sample set (differs in: {', '.join(keys)}); pass "
                       "--force to drop them, or another --out")
    return saved["progress"]


def save_partial(path: Path, identity: dict, progress: dict) -> None:
    """Keep a batched draw's progress (`Sampler.sample`'s `on_batch`) beside its set, atomically, so
    that a killed `sample` goes on from its last batch with the samples an unbroken draw gives."""
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save({"set": identity, "progress": progress}, tmp)
    tmp.replace(path)


def check_replace(samples: Path, identity: dict, force: bool) -> None:
    """One line where `samples` holds another set than `identity` (its meta row's "set"), unless
    `force`: a second `sample` never silently replaces the first's samples. Files written before
    sets were recorded are replaced, as they were then."""
    held = (sample_meta(samples) or {}).get("set") if samples.is_file() else None
    if force or held is None:
        return
    keys = differing(held, identity)
    if not keys:
        return
    raise BadInput(f"{samples} holds another sample set ({held.get('sampler')} from {held.get('model')}; differs in: "
                   f"{', '.join(keys)}); pass --force to replace it, or another --out")


def end_of_text(tokenizer) -> str | None:
    """The string a decoded sample holds where the generator ended a document: its EOS token, or
    None where it has none or where it is whitespace (the Text8 tokenizer's EOS is the space, a
    character of the text, not an end)."""
    eos = getattr(tokenizer, "eos_token", None)
    return eos if eos and eos.strip() else None


def write_samples(out: Path, tokenizer, token_ids: list, meta: dict, seconds: float, model: str) -> dict:
    """samples.jsonl (text and token ids; replaced whole) and its samples.meta.jsonl row, which
    replaces the rows of an earlier file of that name (one row per file). The text deletes
    nothing, as the references' `batch_decode` (special tokens stay as their strings, Text8's
    spaces stay spaces); the meta row names the EOS string (`end_of_text`), where `geoprobe eval`
    splits a sample into documents, and the set's folder name (`set_name`)."""
    out.mkdir(parents=True, exist_ok=True)
    rows = [{"text": tokenizer.decode(ids, skip_special_tokens=False), "token_ids": ids} for ids in token_ids]
    tmp = out / f".{SAMPLES}.tmp"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.replace(out / SAMPLES)
    total = sum(len(ids) for ids in token_ids)
    meta = {**meta, "seconds": round(seconds, 4), "tokens_per_second": round(total / max(seconds, 1e-9), 2),
            "model": model, "file": str(out / SAMPLES), "eos": end_of_text(tokenizer)}
    path = out / META
    kept = [l for l in path.read_text().splitlines() if l.strip() and Path(json.loads(l).get("file", "")).name
            != SAMPLES] if path.is_file() else []
    tmp = out / f".{META}.tmp"
    tmp.write_text("".join(l + "\n" for l in [*kept, json.dumps(meta)]))
    tmp.replace(path)
    return {"meta": meta, "samples": rows}


def sample_meta(samples: Path) -> dict | None:
    """The last samples.meta.jsonl row `write_samples` wrote for this samples file, or None."""
    path = Path(samples).with_name(META)
    rows = [json.loads(l) for l in path.read_text().splitlines() if l.strip()] if path.is_file() else []
    rows = [m for m in rows if Path(m.get("file", "")).name == Path(samples).name]
    return rows[-1] if rows else None


def generator_name(model: str) -> str:
    """How tables name a generator: its folder's last two parts (a bridge's three: which layer and
    which replicate, bridges/layer-NN/seed-S), or the model spec (a causal LM, the AR ceiling)."""
    path = Path(model)
    return "/".join(path.parts[-(3 if path.name.startswith("seed-") else 2):]) if path.is_dir() else model


def sample_label(samples: Path) -> str:
    """How a table names a samples file: its generator and sample set (`runs/dsl · mdlm-steps-32`),
    or the file itself where no `geoprobe sample` meta row describes it."""
    meta = sample_meta(samples)
    if not meta:
        return str(samples)
    return f"{generator_name(meta['model'])} · {meta.get('set_name') or meta.get('sampler')}"


def _sample_autoregressive(model: str, num: int, length: int, *, top_p: float, top_p_rule: str, out: Path | None,
                           seed: int, device: str, preset: str | None, named: dict | None = None) -> dict:
    from transformers import LogitsProcessor, LogitsProcessorList


    class Nucleus(LogitsProcessor):  # the samplers' own filter, so that --top-p-rule means the same here
        def __call__(self, input_ids, scores):
            return nucleus(scores, top_p, top_p_rule)

    backbone = load_backbone(model, device=device)
    tok = backbone.tokenizer
    start_id = start_token(tok, backbone.config)
    start_id = tok.eos_token_id if start_id is None else start_id
    prompt = torch.full((num, 1), start_id, device=backbone.input_device)
    suppressed = unsampled_ids(tok, backbone.model.get_output_embeddings().weight.shape[0])
    torch.manual_seed(seed)
    began = time.perf_counter()
    with torch.no_grad():
        generated = backbone.model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=True,
                                            top_p=1.0, top_k=0, logits_processor=LogitsProcessorList([Nucleus()]),
                                            max_new_tokens=length, min_new_tokens=length,
                                            pad_token_id=start_id, eos_token_id=None, use_cache=True,
                                            suppress_tokens=suppressed or None)
    seconds = time.perf_counter() - began
    meta = {"sampler": "ar", "steps": length, "top_p": top_p, "top_p_rule": top_p_rule, "preset": preset,
            "seed": seed, "num": num, "length": length, "nfe": length, "nfe_per_sample": length, "skipped_calls": 0,
            "decode": "causal", **(named or {})}
    return write_samples(out, tok, generated[:, 1:].tolist(), meta, seconds, model)


def corpus_nll(model: Path, corpus: str, *, seq_len: int = 128, max_seqs: int = 32, estimators: str | None = None,
               batch_size: int = 8, seed: int = 0, device: str = "auto", split: str = "test") -> dict:
    """Bits per token and per character of held-out text under a DSL checkpoint (the training
    corpus: its held-out documents; a Text8 file: the Text8 protocol, bits per character)."""

    chosen = [e.strip() for e in estimators.split(",")] if estimators else list(table)
    unknown = [e for e in chosen if e not in table]
    if unknown:
        raise BadInput(f"unknown estimator {unknown[0]!r} (valid: {', '.join(table)})")
    kind, trained = open_checkpoint(model)
    if not kind.text_likelihood:  # a bridge's likelihood passes through the frozen backbone: not defined here
        scored = " or ".join(k.title for k in KINDS.values() if k.text_likelihood)
        raise BadInput(f"nll scores {scored}; {model} holds {kind.title} "
                       "(score its samples with `geoprobe eval` instead)")
    denoiser, tokenizer = kind.load_denoiser(model, device, "stack")
    protocol = {}
    if is_text8(corpus):
        if tokenizer.get_vocab() != char_tokenizer().get_vocab():
            raise BadInput(f"{corpus} is a Text8 file: its protocol needs a model trained with --tokenizer char")
        text, start, end = text8_split(corpus, split)
        seq_len, documents = TEXT8_LENGTH, [text]
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]  # one id per character, no separators
        protocol = {"protocol": "text8", "split": split, "chars": [start, end]}
    else:
        if trained.get("identity", {}).get("corpus") == corpus:  # the training corpus: its held-out documents
            documents = split_documents(corpus, trained["training"]["train"]["seed"])[1]
        else:
            documents = read_documents(corpus)
        ids = token_stream(documents, tokenizer)
    data = sequences(ids, seq_len)[:max_seqs]
    device_ = denoiser.table.raw.device
    chars_per_token = 1.0 if protocol else sum(len(d) + 1 for d in documents) / max(1, len(ids))
    result = {"model": str(model), "corpus": corpus, "documents": len(documents), "sequences": len(data),
              "seq_len": seq_len, "seed": seed, **protocol}
    for name in chosen:
        values = torch.cat([table[name](denoiser, data[i:i + batch_size].to(device_), seed=seed)
                            for i in range(0, len(data), batch_size)])
        bits = values.mean().item() / math.log(2)
        result[f"{name}_bits_per_token"] = bits
        result[f"{name}_bits_per_char"] = bits / chars_per_token
    return result
