"""How a training run is laid out (bridges/parallel.py, geoprobe/memory.py) in one process:
gradient accumulation and activation checkpointing change nothing but memory, the per-rank
memory plan of FSDP and DDP, and a refusal whose advice the plan then accepts."""

from __future__ import annotations

import re

import pytest
import torch
from safetensors.torch import load_file

from geoprobe.bridges.dsl import DSLConfig, DSLModel, DSLTrainSettings, check_init_fits, pretrained_dsl, train_dsl
from geoprobe.bridges.parallel import Execution, checkpoint_activations, release_activations
from geoprobe.bridges.train import TrainConfig
from geoprobe.errors import BadInput
from geoprobe.memory import dsl_training_bytes, fewest_ranks, parameter_count
from tests.helpers import assert_one_line_error, invoke

CPU = torch.device("cpu")


def tiny_dsl() -> DSLModel:
    return DSLModel(DSLConfig(vocab_size=40, d_tok=8, d_model=32, n_layers=2, n_heads=2), seed=0)


def trained(tmp_path, name: str, execution: Execution):
    data = torch.randint(0, 40, (48, 12), generator=torch.Generator().manual_seed(0))
    settings = DSLTrainSettings(seq_len=12, train=TrainConfig(steps=5, batch_size=8, lr=3e-3, warmup=2, save_every=5,
                                                              precision="float32"))
    run = train_dsl(tiny_dsl(), data, settings, out=tmp_path / name, device=CPU, execution=execution)
    return run, load_file(tmp_path / name / "checkpoint.safetensors")


def test_two_half_batches_accumulated_equal_one_whole_batch(tmp_path):
    whole, state = trained(tmp_path, "whole", Execution())
    halves, accumulated = trained(tmp_path, "halves", Execution(grad_accum=2))
    start = tiny_dsl().state_dict()
    assert max(float((state[f"model.{k}"] - v).abs().max()) for k, v in start.items()) > 1e-3  # it trained
    assert state.keys() == accumulated.keys()
    for key in state:  # weights, EMA and AdamW's moments after 5 steps
        assert torch.allclose(state[key], accumulated[key], rtol=1e-5, atol=1e-6), key
    for (s, a), (t, b) in zip(whole.curve, halves.curve):  # the step's loss: the mean over both halves
        assert s == t and a == pytest.approx(b, rel=1e-6)


def block_calls(model) -> list[int]:
    """A counter of the calls of each block's first Linear layer (a recompute calls it again; the
    recompute stops once it has what backward needs, so later layers may not run twice)."""
    calls = [0]

    def count(*_):
        calls[0] += 1

    for block in model.decoder_blocks():
        next(m for m in block.modules() if isinstance(m, torch.nn.Linear)).register_forward_hook(count)
    return calls


def gradients(model, tokens, snr, noise) -> dict:
    model.zero_grad(set_to_none=True)
    model.loss(tokens, snr, noise=noise).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("backbone", [None, "llama"])
def test_activation_checkpointing_recomputes_the_blocks_and_gives_the_same_gradients(backbone, tiny_models):
    if backbone:
        folder = str(tiny_models(backbone))
        from geoprobe.backbone import load_tokenizer

        model = pretrained_dsl(folder, load_tokenizer(folder), d_tok=8)
    else:
        model = tiny_dsl()
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, model.cfg.vocab_size, (3, 10), generator=g)
    snr, noise = torch.rand(3, 10, generator=g) * 5, torch.randn(3, 10, model.cfg.d_tok, generator=g)
    calls = block_calls(model)
    plain = gradients(model, tokens, snr, noise)
    once = calls[0]
    checkpoint_activations(model.decoder_blocks())
    names = list(model.state_dict())
    calls[0] = 0
    recomputed = gradients(model, tokens, snr, noise)
    assert calls[0] == 2 * once == 2 * len(model.decoder_blocks())  # every block ran again in backward
    assert list(model.state_dict()) == names  # the parameter names, so checkpoints, are unchanged
    assert plain.keys() == recomputed.keys() and len(plain) > 5
    for name in plain:
        assert torch.allclose(plain[name], recomputed[name], rtol=1e-5, atol=1e-7), name
    release_activations(model.decoder_blocks())
    calls[0] = 0
    gradients(model, tokens, snr, noise)
    assert calls[0] == once


def test_fsdp_memory_per_rank_shards_the_training_state_and_ddp_adds_its_buckets(llama):
    config = llama.config
    lm = parameter_count(config)

    def plan(**layout):
        return dsl_training_bytes(config, d_tok=8, batch_size=4, seq_len=16, parameters=lm, **layout)

    # FSDP: only the 20 bytes per parameter are divided by the ranks; the units held whole are not
    assert plan(fsdp=True, ranks=2) - plan(fsdp=True, ranks=4) == pytest.approx(20 * lm / 2 - 20 * lm / 4, abs=2)
    root = 2 * config.vocab_size * config.hidden_size
    block = (lm - root) / config.num_hidden_layers
    assert plan(fsdp=True, ranks=1) - plan() == pytest.approx(8 * (root + 2 * block), abs=2)
    assert plan(ranks=2) - plan() == 4 * lm  # DDP: every rank holds everything and its gradient buckets
    # activation checkpointing keeps one input per block instead of each block's working set twice
    assert plan(checkpointing=True) < plan()
    assert plan(fsdp=True, ranks=2, mixed=True) < plan(fsdp=True, ranks=2)  # bf16 activations


@pytest.mark.parametrize("share, layout", [(0.7, (2, False)), (0.6, (2, True)), (0.4, (4, True)), (0.295, (8, True)),
                                           (0.2, None)])
def test_a_refusal_on_a_gpu_names_a_fsdp_layout_that_the_plan_then_accepts(llama, monkeypatch, share, layout):
    """On a pretend GPU with a share of what one process needs (the tiny Llama, FSDP per rank: 0.68
    of it on 2 ranks, 0.60 with activation checkpointing; 0.43 and 0.39 on 4; 0.31 and 0.29 on 8,
    its vocabulary-wide units held whole bounding it): the refusal's --fsdp advice, run as
    advised (that many ranks, that flag), passes the same check, and fewer ranks do not, nor that
    count without checkpointing where it is advised; where no layout fits, none is advised."""
    import geoprobe.bridges.dsl

    folder, cuda = llama.model.name_or_path, torch.device("cuda", 0)
    free = int(share * dsl_training_bytes(llama.config, d_tok=8, batch_size=8, seq_len=16, precision="float32"))
    monkeypatch.setattr(geoprobe.bridges.dsl, "memory_available", lambda device: free)
    with pytest.raises(BadInput) as refusal:
        check_init_fits(folder, 8, 8, 16, cuda, "float32")
    said = str(refusal.value)
    assert "\n" not in said and said.endswith("a smaller model or --batch-size (or --grad-accum)")
    advice = re.search(r"--fsdp on (\d+) GPUs? of this size \(about [^,)]+ each(, with --activation-checkpointing)?",
                       said)
    if layout is None:
        assert advice is None and "--fsdp" not in said
        return
    assert advice, said
    ranks, ckpt = int(advice.group(1)), advice.group(2) is not None
    assert (ranks, ckpt) == layout
    execution = Execution(fsdp=True, activation_checkpointing=ckpt)
    assert check_init_fits(folder, 8, 8, 16, cuda, "float32", ranks, execution) <= free
    for n in [n for n in range(1, ranks) if 8 % n == 0]:  # the advice is the fewest ranks that fit
        with pytest.raises(BadInput, match="per rank on cuda:0"):
            check_init_fits(folder, 8, 8, 16, cuda, "float32", n, execution)
    if ckpt:  # and checkpointing only where that count needs it
        with pytest.raises(BadInput, match="per rank on cuda:0"):
            check_init_fits(folder, 8, 8, 16, cuda, "float32", ranks, Execution(fsdp=True))


def test_fewest_ranks_divides_the_global_batch_and_checkpoints_only_where_that_count_needs_it():
    need = lambda n, micro, ckpt: 100 // n + micro * (1 if ckpt else 10)  # noqa: E731
    assert fewest_ranks(need, 60, batch_size=8) == (2, True)  # 2 ranks: 50 + 40, or 50 + 4 checkpointed
    assert fewest_ranks(need, 60, batch_size=8, checkpointing=True) == (2, True)
    assert fewest_ranks(need, 90, batch_size=8) == (2, False)  # 50 + 40 fits without checkpointing
    assert fewest_ranks(need, 46, batch_size=8) == (4, False)  # 2: 50 + 4 > 46; 3 do not divide 8; 4: 25 + 20
    assert fewest_ranks(need, 53, batch_size=6) == (2, True)  # 50 + 3
    assert fewest_ranks(need, 52, batch_size=6) == (3, True)  # 3 divide 6: 33 + 20 > 52, 33 + 2
    assert fewest_ranks(need, 60, batch_size=8, grad_accum=4) == (2, False)  # micro-batch 1: 50 + 10
    # without checkpointing nothing fits (at 4 ranks 50 + 100), with it one rank does (50 + 4)
    assert fewest_ranks(lambda n, micro, ckpt: 50 + micro * (1 if ckpt else 100), 60, batch_size=4) == (1, True)
    assert fewest_ranks(lambda n, micro, ckpt: 100, 60, batch_size=4) is None


@pytest.mark.parametrize("extra, fragment", [
    (["--batch-size", "6", "--grad-accum", "4"], "--batch-size 6 (the global batch) must be a multiple of the 1 "
                                                  "ranks x --grad-accum 4"),
    (["--fsdp", "--precision", "bfloat16"], "--fsdp keeps float32 master weights on the shards"),
    (["--log-to", "wandb"], "--log-to must be one of none, tensorboard, got 'wandb'"),
])
def test_layout_flags_are_refused_in_one_line_before_anything_is_written(tmp_path, corpus_txt, extra, fragment):
    code, _, err = invoke("dsl", "train", "--corpus", corpus_txt, "--tokenizer", "words", "--out", tmp_path / "d",
                          *extra)
    assert_one_line_error(code, err, 2, fragment)
    assert not (tmp_path / "d").exists()
