"""`geoprobe dsl train`, `geoprobe sample` and `geoprobe nll`."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated

import typer

from geoprobe.cli.app import app
from geoprobe.cli.output import progress, show
from geoprobe.cli.options import BatchSize, Corpus, Device, Force, Precision, Seed, SeqLen, Steps

dsl_app = typer.Typer(help="Discrete stochastic localization: train the SNR-agnostic denoiser.", no_args_is_help=True)
app.add_typer(dsl_app, name="dsl")

@dsl_app.command("train", epilog="Examples:\n\n"
                 "  geoprobe dsl train --corpus kjv --tokenizer train:4096 --steps 2000 --out runs/dsl\n\n"
                 "  geoprobe dsl train --corpus kjv --tokenizer train:4096 --snr endpoint --out runs/mdlm\n\n"
                 "  geoprobe dsl train --corpus kjv --tokenizer train:4096 --snr mixed --init runs/mdlm --out runs/dsl-ft\n\n"
                 "  geoprobe dsl train --corpus kjv --init-from builtin:smollm2 --steps 300 --batch-size 8 --out runs/dsl-smollm2")
def train_cmd(
    out: Annotated[Path, typer.Option("--out", "-o", help="Checkpoint directory (resumed when it exists).")],
    corpus: Corpus = "kjv",
    tokenizer: Annotated[str | None, typer.Option(help="A model or tokenizer (folder, hub id, builtin:smollm2), "
                                                       "train:V (byte-level BPE on the corpus), words (one token "
                                                       "per word of the corpus) or char (Text8). Default: train:4096, "
                                                       "or --init-from's.")] = None,
    snr: Annotated[str, typer.Option(help="mixed (log-normal + random-order endpoint), lognormal, or endpoint "
                                          "(MDLM baseline).")] = "mixed",
    roar_frac: Annotated[float, typer.Option(help="Share of random-order sequences in --snr mixed.")] = 0.1,
    steps: Steps = 1000, batch_size: BatchSize = 16, seq_len: SeqLen = 128,
    lr: Annotated[float, typer.Option(help="Peak learning rate (AdamW, warmup then cosine).")] = 3e-4,
    warmup: Annotated[int, typer.Option(min=0, help="Warmup steps.")] = 100,
    d_tok: Annotated[int, typer.Option(min=2, help="Token embedding dimension on the unit sphere.")] = 64,
    d_model: Annotated[int, typer.Option(min=8, help="Transformer width.")] = 256,
    n_layers: Annotated[int, typer.Option(min=1, help="Transformer blocks.")] = 4,
    n_heads: Annotated[int, typer.Option(min=1, help="Attention heads.")] = 4,
    norm_input: Annotated[bool, typer.Option(help="Give the network log(1+|z|) per token.")] = False,
    table_init: Annotated[str, typer.Option(help="Token table: random, or pca (the top principal components "
                                                 "of --tokenizer's model input embeddings).")] = "random",
    freeze_table: Annotated[bool, typer.Option(help="Keep the unit-norm token table fixed.")] = False,
    init: Annotated[Path | None, typer.Option(help="Start from this DSL checkpoint (e.g. an MDLM one).")] = None,
    init_from: Annotated[str | None, typer.Option("--init-from", help="Start from a pretrained causal LM (folder, hub "
                                                 "id, builtin:smollm2): its blocks run bidirectionally, its head, its "
                                                 "input embedding as the converter's matrix.")] = None,
    seed: Seed = 0, device: Device = "auto", force: Force = False, precision: Precision = "auto",
):
    """Train a DSL denoiser (fixed budget, resumable)."""
    from bridges.dsl import DSLShape, DSLTrainSettings, fit_dsl
    from bridges.train import TrainConfig
    from geoprobe.backbone import resolve_device
    from geoprobe.distributed import world_from

    train_cfg = TrainConfig(steps=steps, batch_size=batch_size, lr=lr, warmup=warmup, seed=seed,
                            save_every=max(1, min(200, steps)), precision=precision)
    settings = DSLTrainSettings(snr=snr, roar_frac=roar_frac, seq_len=seq_len, train=train_cfg)
    shape = DSLShape(d_tok=d_tok, d_model=d_model, n_layers=n_layers, n_heads=n_heads, norm_input=norm_input,
                     learn_table=not freeze_table, table_init=table_init)
    resolve_device(device)
    metrics = fit_dsl(out, corpus, tokenizer, settings, shape, init=init, init_from=init_from, force=force,
                      device=device, progress=progress("dsl train", "step"), world=world_from())
    if metrics is not None:  # data-parallel ranks: rank 0 evaluates and reports
        _report(metrics, f"dsl train → {out}")


def _report(data: dict, title: str) -> None:
    from geoprobe.report.terminal import print_table

    show(data, lambda: print_table(title, ["key", "value"], [[k, v] for k, v in data.items()]))


def _load_denoiser(model: Path, device: str, decode: str = "stack"):
    """(TokenDenoiser, tokenizer) from a DSL checkpoint or a bridge directory."""
    from bridges.dsl import load_dsl, read_config
    from bridges.tokens import load_saved_tokenizer
    from geoprobe.backbone import resolve_device
    from geoprobe.errors import BadInput

    kind = read_config(model).get("kind")
    if kind == "dsl":
        return load_dsl(model, resolve_device(device)), load_saved_tokenizer(model)
    if kind == "bridge":
        from bridges.hidden import HybridDenoiser, RoundingDenoiser, Teacher, load_bridge
        from geoprobe.backbone import load_backbone

        bridge, record = load_bridge(model)
        backbone = load_backbone(record["identity"]["model"], device=device)
        if backbone.identity["config_sha256"] != record["identity"]["model_config_sha256"]:
            raise BadInput(f"{model} was trained on another backbone than {record['identity']['model']} is now")
        bridge.to(backbone.input_device)
        teacher = Teacher(backbone, bridge.cfg.layer)
        bos = backbone.tokenizer.bos_token_id
        denoiser_class = RoundingDenoiser if decode == "round" else HybridDenoiser
        return denoiser_class(bridge, teacher, bos if bos is not None else 0), backbone.tokenizer
    raise BadInput(f"{model} holds a {kind!r} checkpoint, not a DSL model or a bridge")


@app.command(epilog="Examples:\n\n  geoprobe sample --model runs/dsl --sampler roar --num 8 --length 128\n\n"
                    "  geoprobe sample --model runs/dsl --sampler hybrid --steps 48 --top-p 0.9 --out runs/dsl/samples\n\n"
                    "  geoprobe sample --model runs/dsl --sampler remdm-loop --steps 128 --eta 0.02")
def sample(
    model: Annotated[Path, typer.Option("--model", help="A DSL checkpoint directory or a bridge directory "
                                                        "(RUN/bridges/layer-NN).")],
    sampler: Annotated[str, typer.Option(help="mdlm, remdm-cap, remdm-rescale, remdm-loop, roar, continuous, "
                                              "hybrid.")] = "roar",
    num: Annotated[int, typer.Option(help="Number of samples.")] = 8,
    length: Annotated[int, typer.Option(help="Tokens per sample.")] = 128,
    steps: Annotated[int | None, typer.Option("--steps", help="Denoiser budget (roar: default one token "
                                                              "per step).")] = None,
    top_p: Annotated[float, typer.Option(help="Nucleus threshold in (0, 1].")] = 1.0,
    per_step: Annotated[int | None, typer.Option(help="roar: tokens revealed per step.")] = None,
    eta: Annotated[float, typer.Option(help="ReMDM rescale/loop remasking rate.")] = 0.02,
    eta_cap: Annotated[float, typer.Option(help="ReMDM cap.")] = 0.02,
    switch_snr: Annotated[float, typer.Option(help="hybrid: SNR where the continuous stage stops.")] = 5.0,
    finisher: Annotated[str, typer.Option(help="hybrid: the masked sampler that finishes (mdlm or a remdm-*).")] = "mdlm",
    decode: Annotated[str, typer.Option(help="Bridges: stack (the frozen upper blocks and head) or round (nearest "
                                             "token embedding: the layer-0 Diffusion-LM baseline).")] = "stack",
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Where samples.jsonl goes (default: MODEL).")] = None,
    seed: Seed = 0, device: Device = "auto",
):
    """Generate text with any sampler from a DSL checkpoint or a bridge → samples.jsonl."""
    import inspect

    from geoprobe.errors import BadInput
    from geoprobe.store import check_writable
    from samplers import SAMPLERS, check_options, make_sampler

    check_options(steps=steps, top_p=top_p, per_step=per_step, eta=eta, eta_cap=eta_cap, switch_snr=switch_snr,
                  finisher=finisher, num=num, length=length)
    if out is not None:
        check_writable(out)
    if sampler == "ar":  # the ceiling: the backbone itself, sampled left to right with its KV cache
        return _sample_autoregressive(str(model), num, length, top_p, out, seed, device)
    if sampler not in SAMPLERS:
        raise BadInput(f"unknown sampler {sampler!r} (valid: {', '.join(SAMPLERS)}, or ar for a causal LM)")
    if decode not in ("stack", "round"):
        raise BadInput(f"unknown --decode {decode!r} (use stack or round)")
    options = {"steps": steps if steps is not None else (None if sampler == "roar" else 64), "top_p": top_p,
               "per_step": per_step, "eta": eta, "eta_cap": eta_cap, "switch_snr": switch_snr}
    if sampler == "hybrid":
        finishing = {k: v for k, v in options.items() if k in inspect.signature(SAMPLERS[finisher]).parameters}
        options["finisher"] = make_sampler(finisher, **finishing)
    accepted = inspect.signature(SAMPLERS[sampler]).parameters
    chosen = make_sampler(sampler, **{k: v for k, v in options.items() if k in accepted and v is not None})
    denoiser, tokenizer = _load_denoiser(model, device, decode)
    result = chosen.sample(denoiser, num, length, seed)
    meta = {**result.settings, "nfe": result.nfe, "skipped_calls": result.skipped, "decode": decode}
    _write_samples(out or model, tokenizer, result.tokens.tolist(), meta, result.seconds, str(model.resolve()))  # compare may run from elsewhere


def _write_samples(out: Path, tokenizer, token_ids: list, meta: dict, seconds: float, model: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rows = [{"text": tokenizer.decode(ids, skip_special_tokens=True), "token_ids": ids} for ids in token_ids]
    tmp = out / ".samples.jsonl.tmp"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.replace(out / "samples.jsonl")
    total = sum(len(ids) for ids in token_ids)
    meta = {**meta, "seconds": round(seconds, 4), "tokens_per_second": round(total / max(seconds, 1e-9), 2),
            "model": model, "file": str(out / "samples.jsonl")}
    with open(out / "samples.meta.jsonl", "a") as handle:
        handle.write(json.dumps(meta) + "\n")
    def for_people():
        from geoprobe.report.terminal import print_table

        for row in rows[:4]:
            print(row["text"][:200].replace("\n", " "))
        print_table(f"{len(rows)} samples → {out / 'samples.jsonl'}", ["key", "value"],
                    [[k, meta.get(k)] for k in ("sampler", "steps", "nfe", "skipped_calls", "seconds", "tokens_per_second")])

    show({"meta": meta, "samples": rows}, for_people)


def _sample_autoregressive(model: str, num: int, length: int, top_p: float, out: Path | None, seed: int,
                           device: str) -> None:
    import time

    import torch

    from geoprobe.backbone import load_backbone
    from geoprobe.errors import BadInput

    if out is None:
        raise BadInput("--sampler ar needs --out (the model is not a checkpoint directory)")
    if not 0 < top_p <= 1:
        raise BadInput(f"--top-p must be in (0, 1], got {top_p}")
    backbone = load_backbone(model, device=device)
    tok = backbone.tokenizer
    start_id = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
    prompt = torch.full((num, 1), start_id, device=backbone.input_device)
    # a fixed-length sample has no end and no unknown word: neither token may be drawn
    suppressed = sorted({t for t in (tok.eos_token_id, tok.unk_token_id) if t is not None})
    torch.manual_seed(seed)
    began = time.perf_counter()
    with torch.no_grad():
        generated = backbone.model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=True,
                                            top_p=top_p, top_k=0, max_new_tokens=length, min_new_tokens=length,
                                            pad_token_id=start_id, eos_token_id=None, use_cache=True,
                                            suppress_tokens=suppressed or None)
    seconds = time.perf_counter() - began
    meta = {"sampler": "ar", "steps": length, "top_p": top_p, "seed": seed, "num": num, "length": length,
            "nfe": length, "skipped_calls": 0, "decode": "causal"}
    _write_samples(out, tok, generated[:, 1:].tolist(), meta, seconds, model)


@app.command(epilog="Examples:\n\n  geoprobe nll --model runs/dsl --corpus held-out.txt\n\n"
                    "  geoprobe nll --model runs/dsl --corpus kjv --estimators mdlm,roar --max-seqs 16")
def nll(
    model: Annotated[Path, typer.Option("--model", help="A DSL checkpoint directory.")],
    corpus: Corpus = "kjv",
    seq_len: SeqLen = 128,
    max_seqs: Annotated[int, typer.Option(min=1, help="Held-out sequences to score.")] = 32,
    estimators: Annotated[str, typer.Option(help="Comma list of mdlm, roar, continuous.")] = "mdlm,roar,continuous",
    batch_size: BatchSize = 8, seed: Seed = 0, device: Device = "auto",
    split: Annotated[str, typer.Option(help="Text8 files: the split to score (train, validation or test: the "
                                            "90/5/5% character ranges).")] = "test",
):
    """Bits per token (and per character) of held-out text under a DSL checkpoint. Given a
    Text8 file (one line of a-z and spaces) it follows the Text8 protocol: a `--tokenizer char`
    model, the 90/5/5% split, sequences of 256 characters, bits per character."""
    import torch

    from bridges.dsl import read_config, sequences, split_documents
    from bridges.likelihood import continuous_bound, mdlm_elbo, roar_nll
    from bridges.tokens import TEXT8_LENGTH, TEXT8_SPLITS, char_tokenizer, is_text8, text8_split, token_stream
    from geoprobe.corpus import read_documents
    from geoprobe.errors import BadInput

    table = {"mdlm": mdlm_elbo, "roar": roar_nll, "continuous": continuous_bound}
    chosen = [e.strip() for e in estimators.split(",")]
    unknown = [e for e in chosen if e not in table]
    if unknown:
        raise BadInput(f"unknown estimator {unknown[0]!r} (valid: {', '.join(table)})")
    if split not in TEXT8_SPLITS:  # checked whatever the corpus: a wrong flag is a mistake either way
        raise BadInput(f"unknown --split {split!r} (use {', '.join(TEXT8_SPLITS)})")
    trained = read_config(model)
    if trained.get("kind") != "dsl":  # a bridge's likelihood passes through the frozen backbone: not defined here
        raise BadInput(f"nll scores DSL checkpoints; {model} holds a {trained.get('kind')!r} checkpoint "
                       "(score its samples with `geoprobe eval` instead)")
    denoiser, tokenizer = _load_denoiser(model, device)
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
    _report(result, f"nll of {corpus} under {model}")
