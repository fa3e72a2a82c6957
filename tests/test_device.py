"""Every inner loop on a pretend accelerator (tests/fake_device.py): no CPU tensor meets a
device tensor where CUDA would refuse it, no training step waits for the host, and the results
equal a plain CPU run's.

No GPU here: these are the checks a first GPU run would otherwise make, at minutes per try."""

import json
import os
from collections import Counter

import pytest
import torch

from geoprobe.bridges import likelihood
from geoprobe.bridges.dsl import DSLConfig, DSLModel, DSLTrainSettings, train_dsl
from geoprobe.bridges.fit import fit_bridge
from geoprobe.bridges.hidden import BridgeConfig, HiddenBridge, HybridDenoiser, Teacher, load_bridge
from geoprobe.bridges.train import TrainConfig
from geoprobe.corpus import iter_blocks, read_documents
from geoprobe.device import machine_name
from geoprobe.geometry import GeometrySettings, bootstrap_counts, layer_geometry, peak_bytes
from geoprobe.bridges.embedding_diffusion import PRESETS, EmbeddingDiffusion, preset
from geoprobe.samplers import TOKEN_SAMPLERS, make_sampler
from tests.fake_device import DEVICE, DeviceMixing, OnDevice, accelerator

V = 40


def dsl_model():
    return DSLModel(DSLConfig(vocab_size=V, d_tok=8, d_model=32, n_layers=1, n_heads=2), seed=0).eval()


def test_the_pretend_device_refuses_what_cuda_refuses():
    with accelerator() as acc:
        x = torch.ones(3, 2, device=DEVICE)
        assert isinstance(x, OnDevice) and x.device.type == DEVICE.type
        with pytest.raises(DeviceMixing):
            x + torch.ones(3, 2)
        with pytest.raises(DeviceMixing):  # a CPU generator drawing for the device
            torch.randn(3, generator=torch.Generator().manual_seed(0), device=DEVICE)
        g = torch.Generator(device=DEVICE).manual_seed(0)
        assert torch.randn(3, generator=g, device=DEVICE).device.type == DEVICE.type
        x * torch.tensor(2.0)  # a CPU scalar is allowed, as on CUDA
        assert acc.syncs == {}
        assert x.sum().item() == 6 and acc.syncs["item"] == 1
        assert x.cpu().device.type == "cpu" and acc.syncs["to_host"] == 1
        x[x > 0]
        assert acc.syncs["boolean_index"] == 1


def model_for(case: str):
    """The DSL model for a token sampler; for `ancestral:KIND`, an embedding baseline of that kind."""
    if ":" not in case:
        return dsl_model()
    return EmbeddingDiffusion(preset(case.split(":")[1], vocab_size=V, d_model=32, n_layers=1, n_heads=2), seed=0)


@pytest.mark.parametrize("case", [*TOKEN_SAMPLERS, *(f"ancestral:{kind}" for kind in PRESETS)])
def test_every_sampler_runs_on_the_device_and_draws_what_it_draws_on_the_cpu(case):
    steps, length, name = 4, 6, case.split(":")[0]
    model = model_for(case)
    with accelerator() as acc:
        model.to(DEVICE)
        acc.reset()  # moving the weights is not the sampler's
        result = make_sampler(name, steps=steps).sample(model, 3, length, seed=0)
    assert result.tokens.shape == (3, length) and result.tokens.device.type == "cpu"
    assert 0 <= result.tokens.min() and result.tokens.max() < V
    # one decision per step which positions change (only those draw V-wide noise): a few waits
    # per step, none per position
    assert sum(acc.syncs.values()) <= 3 * steps + 2, acc.where
    plain = make_sampler(name, steps=steps).sample(model_for(case), 3, length, seed=0)
    assert torch.equal(plain.tokens, result.tokens)  # a generator per device: same seed, same stream here


@pytest.mark.parametrize("estimate", [likelihood.mdlm_elbo, likelihood.roar_nll, likelihood.continuous_bound])
def test_every_likelihood_runs_on_the_device_and_equals_the_cpu_estimate(estimate):
    tokens = torch.randint(0, V, (3, 5), generator=torch.Generator().manual_seed(1))
    on_cpu = estimate(dsl_model(), tokens)
    with accelerator() as acc:
        model, tokens = dsl_model().to(DEVICE), tokens.to(DEVICE)
        acc.reset()
        on_device = estimate(model, tokens)
    assert on_device.device.type == "cpu"
    torch.testing.assert_close(on_device, on_cpu)
    assert sum(acc.syncs.values()) <= 2, acc.where  # one read-back at the end


OURS = ("bridges", "samplers", "geoprobe")


def syncs_of_training(train_steps, run):
    """Host waits of a run of `train_steps` with one save at the end: (ours, by place, by place in
    the libraries). transformers' mask builder waits once or twice per backbone forward (it asks
    whether the padding mask can be dropped): not ours to change, and reported apart."""
    with accelerator() as acc:
        run(train_steps)
    ours = Counter({k: v for k, v in acc.where.items() if k[1].startswith(tuple(f"['{o}'" for o in OURS))})
    return sum(ours.values()), ours, acc.where - ours


@pytest.fixture
def float32_everywhere(monkeypatch):
    """The CPU reference runs as the pretend device does, in float32: a CPU with AVX512-BF16 or
    AMX would otherwise train it under bf16 autocast (`native_bf16`), which `lazy` has not."""
    import geoprobe.bridges.hidden
    import geoprobe.bridges.train

    for module in (geoprobe.bridges.hidden, geoprobe.bridges.train):
        monkeypatch.setattr(module, "native_bf16", lambda device: False)


def test_dsl_training_never_waits_for_the_device_between_saves(tmp_path, float32_everywhere):
    data = torch.randint(0, V, (24, 8), generator=torch.Generator().manual_seed(0))

    def run(steps):
        settings = DSLTrainSettings(train=TrainConfig(steps=steps, batch_size=4, save_every=steps))
        return train_dsl(dsl_model().train(), data, settings, out=tmp_path / f"s{steps}", device=DEVICE)

    short, before, _ = syncs_of_training(2, run)
    long, where, library = syncs_of_training(6, run)
    assert long == short and not library, where - before  # the four extra steps added no wait: losses are read at saves only
    plain = train_dsl(dsl_model().train(), data, DSLTrainSettings(train=TrainConfig(steps=6, batch_size=4,
                                                                                    save_every=6)),
                      out=tmp_path / "cpu", device=torch.device("cpu"))
    with accelerator():
        again = train_dsl(dsl_model().train(), data,
                          DSLTrainSettings(train=TrainConfig(steps=6, batch_size=4, save_every=6)),
                          out=tmp_path / "device", device=DEVICE)
    torch.testing.assert_close(torch.tensor(again.curve), torch.tensor(plain.curve))


@pytest.fixture(scope="module")
def blocks(llama, corpus_txt):
    assert llama.model.dtype == torch.float32  # the shared tiny Llama (conftest): float32 on the CPU
    from geoprobe.bridges.states import teacher_states

    found = list(iter_blocks(read_documents(str(corpus_txt)), llama.tokenizer, 16, seed=0))
    return teacher_states(llama, found[:24], [], found[-4:], [1])  # on the host, as a run holds them


def test_bridge_training_and_the_hybrid_sampler_run_on_the_device(llama, blocks, tmp_path, float32_everywhere):
    cfg = BridgeConfig(layer=1, vocab_size=llama.config.vocab_size, hidden_size=llama.hidden_size,
                       d_model=32, n_layers=1, n_heads=2)

    def run(steps):
        llama.model.to(DEVICE)
        try:
            return fit_bridge(llama, 1, blocks, cfg=cfg,
                              train_cfg=TrainConfig(steps=steps, batch_size=2, save_every=steps),
                              out=tmp_path / f"s{steps}", identity={"test": steps})
        finally:
            llama.model.to("cpu")

    short, before, library_short = syncs_of_training(2, run)
    long, where, library = syncs_of_training(5, run)
    assert long == short, where - before
    # transformers' waits grow with the backbone forwards alone (one per step, and those of the
    # statistics and validation passes): at most 4 per added step
    assert sum((library - library_short).values()) <= 4 * 3, library - library_short
    on_cpu = fit_bridge(llama, 1, blocks, cfg=cfg, train_cfg=TrainConfig(steps=5, batch_size=2, save_every=5),
                        out=tmp_path / "cpu", identity={"test": 5})
    on_device = json.loads((tmp_path / "s5" / "metrics.json").read_text())
    for key in ("nmse", "nmse_dim", "delta_ce", "objective"):
        assert on_device[key] == pytest.approx(on_cpu[key], rel=1e-4), key
    assert on_device["machine"] == on_cpu["machine"] == machine_name()  # a pretend device: the host named
    bridge, _ = load_bridge(tmp_path / "s5")
    with accelerator():
        llama.model.to(DEVICE)
        try:
            denoiser = HybridDenoiser(bridge.to(DEVICE), Teacher(llama, 1), bos_id=llama.tokenizer.bos_token_id or 0)
            tokens = make_sampler("hybrid", steps=4).sample(denoiser, 2, 5, seed=0).tokens
        finally:
            llama.model.to("cpu")
    assert tokens.shape == (2, 5)


def pooled_copy(states, device):
    """A copy of the run's teacher states pooled on `device` (bridges/states.py: the bridge step's pool)."""
    import copy

    from geoprobe.bridges.states import pool_on_device

    pooled = copy.deepcopy(states)
    if torch.device(device).type == "cpu":  # pool_on_device leaves a CPU's states where they are
        for split in (pooled.train, pooled.stop, pooled.val):
            split.to_device(device)
    else:
        assert pool_on_device(pooled, device)
    return pooled


def test_a_batch_gathered_from_the_device_pool_equals_the_host_pools_exactly(blocks):
    pooled = pooled_copy(blocks, "cpu")
    assert pooled.train.pooled and not blocks.train.pooled
    lengths = [len(b.tokens) for b in blocks.train.blocks]
    for indices, length in (([3, 0, 5, 3], None), ([1, 7], max(lengths) + 5), (list(range(len(lengths))), None)):
        host = blocks.train.batch(indices, (0, 1), 0, "cpu", length)
        device = pooled.train.batch(indices, (0, 1), 0, "cpu", length)
        assert torch.equal(host[0], device[0]) and torch.equal(host[1], device[1])
        for layer in (0, 1):
            assert torch.equal(host[2][layer], device[2][layer]), (indices, layer)
            assert device[2][layer].abs().sum() > 0


def test_the_device_pool_uploads_no_states_and_trains_the_same_bridge(llama, blocks, tmp_path, float32_everywhere):
    with accelerator() as acc:
        pooled = pooled_copy(blocks, DEVICE)
        for layers in ((1,), (0, 1)):
            acc.reset()
            got = pooled.train.batch([2, 4], layers, 0, DEVICE)
            pooled_uploads = acc.uploads
            assert not acc.syncs, acc.where  # nothing waits for the device
            acc.reset()
            want = blocks.train.batch([2, 4], layers, 0, DEVICE)
            assert acc.uploads == 2 + len(layers)  # ids, mask, then each layer's (B, L, d) states
            assert pooled_uploads == 3  # ids, mask and one (B, L) row index, whatever the layers
            for layer in layers:
                assert torch.equal(got[2][layer].inner, want[2][layer].inner)
    cfg = BridgeConfig(layer=1, vocab_size=llama.config.vocab_size, hidden_size=llama.hidden_size,
                       d_model=32, n_layers=1, n_heads=2)
    metrics = {}
    for name, use_pool in (("host", False), ("pool", True)):
        with accelerator():
            llama.model.to(DEVICE)
            try:
                states = pooled_copy(blocks, DEVICE) if use_pool else blocks
                metrics[name] = fit_bridge(llama, 1, states, cfg=cfg,
                                           train_cfg=TrainConfig(steps=4, batch_size=2, save_every=4),
                                           out=tmp_path / name, identity={"test": name})
            finally:
                llama.model.to("cpu")
    for key in ("nmse", "nmse_dim", "delta_ce", "objective"):
        assert metrics["pool"][key] == pytest.approx(metrics["host"][key], rel=1e-6), key


@pytest.mark.parametrize("attention", ["bidirectional", "causal"])
def test_left_to_right_decoding_runs_on_the_device_and_draws_what_it_draws_on_the_cpu(llama, attention,
                                                                                      float32_everywhere):
    """`ltr` through a bidirectional bridge (its prefix recomputed) and a causal one (its prefix
    and the upper stack's keys and values kept)."""
    cfg = BridgeConfig(layer=1, vocab_size=llama.config.vocab_size, hidden_size=llama.hidden_size,
                       d_model=32, n_layers=1, n_heads=2, attention=attention)
    drawn = {}
    for device in ("cpu", DEVICE):
        with accelerator():
            llama.model.to(device)
            try:
                bridge = HiddenBridge(cfg).eval().to(device)
                denoiser = HybridDenoiser(bridge, Teacher(llama, 1), bos_id=llama.tokenizer.bos_token_id or 0)
                drawn[device] = make_sampler("ltr").sample(denoiser, 2, 6, seed=0).tokens
            finally:
                llama.model.to("cpu")
    assert torch.equal(drawn["cpu"], drawn[DEVICE])


def test_geometry_runs_on_the_device_and_equals_the_cpu_result():
    g = torch.Generator().manual_seed(0)
    states = torch.randn(300, 16, generator=g, dtype=torch.float64)
    states[:, 3] *= 30  # a massive channel: the second pass runs too
    docs = torch.arange(300) // 10
    settings = GeometrySettings(k=8, anchors=64, pairs=128, bootstrap=8)
    on_cpu = layer_geometry(states, docs, settings, rng_key=1)
    with accelerator():
        on_device = layer_geometry(states.to(DEVICE), docs.to(DEVICE), settings, rng_key=1)
    for key, value in on_cpu.items():
        if isinstance(value, float):
            assert on_device[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key


def test_deterministic_kernels_are_a_choice_applied_when_a_cuda_device_is_resolved(monkeypatch):
    """--deterministic (issue 63; before it every CUDA command turned them on): chosen by the
    command, applied when it resolves a CUDA device, without PyTorch's NaN fill of new memory."""
    from geoprobe.backbone import resolve_device
    from geoprobe.device import choose_determinism

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
              torch.utils.deterministic.fill_uninitialized_memory)
    try:
        choose_determinism(True)
        resolve_device("cpu")
        assert not torch.are_deterministic_algorithms_enabled()  # a CPU run is left as it is
        assert resolve_device("auto").type == "cuda"
        assert torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.deterministic
        assert torch.utils.deterministic.fill_uninitialized_memory is False
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        choose_determinism(False)
        resolve_device("cuda")
        assert not torch.are_deterministic_algorithms_enabled() and not torch.backends.cudnn.deterministic
    finally:
        choose_determinism(False)
        torch.use_deterministic_algorithms(before[0])
        torch.backends.cudnn.deterministic = before[1]
        torch.utils.deterministic.fill_uninitialized_memory = before[2]


def test_scan_family_commands_choose_deterministic_kernels_and_training_does_not(scanned_run, corpus_txt, tmp_path):
    """The default of each command, and --no-deterministic / --deterministic, as the process records it."""
    import geoprobe.device
    from tests.helpers import copy_run, invoke

    run = copy_run(scanned_run, tmp_path / "run")
    chosen = lambda: geoprobe.device._deterministic[0]  # noqa: E731
    try:
        geometry = ["-q", "geometry", run, "--device", "cpu", "--anchors", 64, "--k", 8, "--pairs", 256, "--bootstrap", 20]
        assert invoke(*geometry)[0] == 0 and chosen() is True
        assert invoke(*geometry, "--no-deterministic")[0] == 0 and chosen() is False
        dsl = ["-q", "dsl", "train", "--corpus", corpus_txt, "--tokenizer", "words", "--steps", 1, "--batch-size", 2,
               "--seq-len", 8, "--d-model", 16, "--n-layers", 1, "--device", "cpu"]
        assert invoke(*dsl, "--out", tmp_path / "a", "--deterministic")[0] == 0 and chosen() is True
        assert invoke(*dsl, "--out", tmp_path / "b")[0] == 0 and chosen() is False
    finally:
        geoprobe.device.choose_determinism(False)


@pytest.mark.parametrize("n, d, chunk, massive_rows, repeated", [
    (3000, 64, 512, False, False),  # the d x d path, the kNN's distance block the largest phase
    (400, 512, 512, False, False),  # the Gram path
    (6000, 256, 64, True, False),  # massive rows dropped (a copy), the bootstrap's scatter
    (20000, 256, 512, False, True),  # 10 % repeated rows: the kNN reference is a copy of the distinct
    # ones (left out of the plan until an H200 run at 200k x 4,096 peaked at 1.37 x it)
])
def test_geometry_memory_on_the_device_is_what_the_plan_says(n, d, chunk, massive_rows, repeated):
    g = torch.Generator().manual_seed(0)
    states = torch.randn(n, d, generator=g)
    states[:, 3] *= 50  # a massive channel
    if massive_rows:
        states[::100] *= 100
    if repeated:
        states[torch.randperm(n, generator=g)[: n // 10]] = states[torch.randint(0, n, (n // 10,), generator=g)]
    docs = torch.arange(n) // 10
    settings = GeometrySettings(k=8, anchors=256, pairs=512, bootstrap=20, chunk=chunk)
    counts = torch.from_numpy(bootstrap_counts(int(docs.max()) + 1, 20, 0))
    with accelerator() as acc:
        before = acc.live_bytes
        # as compute_geometry holds a layer: float32 on the device
        layer_geometry(states.to(DEVICE), docs.to(DEVICE), settings, counts.to(DEVICE), rng_key=1)
        measured = acc.peak_bytes - before - 8 * counts.numel() - 8 * n  # minus the counts and docs
    # the plan refuses a layer that will not fit, so it may overstate (the distinct rows' copy is
    # counted whether or not rows repeat: up to 8nd) but not understate beyond kernel slack
    assert 0.75 < measured / peak_bytes(n, d, settings) < 1.1, (measured, peak_bytes(n, d, settings))


@pytest.mark.parametrize("batch, length, precision", [(4, 16, "float32"), (16, 64, "float32"),
                                                       (4, 16, "bfloat16"), (16, 64, "bfloat16")])
def test_dsl_init_from_training_memory_is_what_the_plan_says(llama, batch, length, precision, tmp_path):
    """The whole training footprint (the weights are moved to the device inside); at the larger
    shape with the plateau rule, whose copies of the weights wait on the host."""
    from geoprobe.bridges.dsl import pretrained_dsl
    from geoprobe.device import Precision
    from geoprobe.memory import dsl_training_bytes

    plateau = batch == 16
    model = pretrained_dsl(llama.model.name_or_path, llama.tokenizer, d_tok=8, dtype=Precision(precision).weights_dtype)
    data = torch.randint(0, llama.config.vocab_size, (64, length), generator=torch.Generator().manual_seed(0))
    settings = DSLTrainSettings(seq_len=length, train=TrainConfig(steps=2, batch_size=batch, save_every=2,
                                                                  precision=precision, eval_every=plateau))
    with accelerator() as acc:
        before = acc.live_bytes
        train_dsl(model, data, settings, out=tmp_path, device=DEVICE, stop_rows=data[:2] if plateau else None)
        measured = acc.peak_bytes - before
    planned = dsl_training_bytes(llama.config, d_tok=8, batch_size=batch, seq_len=length, precision=precision)
    assert 0.8 < measured / planned < 1.2, (measured, planned)


def test_dsl_init_from_that_will_not_fit_is_refused_before_loading(llama, corpus_txt, tmp_path, monkeypatch):
    import geoprobe.bridges.dsl
    from geoprobe.bridges.dsl import fit_dsl
    from geoprobe.errors import BadInput
    from geoprobe.memory import dsl_training_bytes

    need = dsl_training_bytes(llama.config, d_tok=8, batch_size=4, seq_len=16)
    monkeypatch.setattr(geoprobe.bridges.dsl, "memory_available", lambda device: need - 1)
    monkeypatch.setattr(geoprobe.bridges.dsl, "load_backbone", lambda *a, **k: pytest.fail("loaded"))
    with pytest.raises(BadInput, match="needs about .* on cpu .* is free"):
        fit_dsl(tmp_path / "dsl", str(corpus_txt), None, settings=DSLTrainSettings(
            seq_len=16, train=TrainConfig(steps=2, batch_size=4)), shape=DSLConfig(vocab_size=0, d_tok=8),
            init_from=llama.model.name_or_path, device="cpu")
    assert not (tmp_path / "dsl").exists()


def test_a_resumed_fused_adamw_finds_its_step_count_beside_the_parameter():
    """The fused kernel (CUDA) refuses a step count on another device; the foreach kernels keep it on
    the CPU (beside the parameter every step would wait for it)."""
    from geoprobe.bridges.train import _state_tensor

    with accelerator():
        param = torch.zeros(3, device=DEVICE)
        step, moment = torch.tensor(5.0, dtype=torch.float64), torch.ones(3)
        assert _state_tensor("opt.w.step", step, param, fused=True).device.type == DEVICE.type
        assert _state_tensor("opt.w.step", step, param, fused=True).dtype == torch.float32
        assert _state_tensor("opt.w.step", step, param, fused=False).device.type == "cpu"
        assert _state_tensor("opt.w.exp_avg", moment, param, fused=False).device.type == DEVICE.type


def test_precision_has_one_owner_and_refuses_another_value_in_one_line():
    from geoprobe.device import Precision
    from geoprobe.errors import BadInput

    assert [p.value for p in Precision] == ["auto", "float32", "bfloat16"]
    assert Precision.parse("auto") == "auto" and json.dumps(Precision.AUTO) == '"auto"'  # records keep the value
    assert Precision.AUTO.weights_dtype == Precision.FLOAT32.weights_dtype == torch.float32
    assert Precision.BFLOAT16.weights_dtype == torch.bfloat16
    with pytest.raises(BadInput, match=r"^--precision must be one of auto, float32, bfloat16, got 'fp8'$"):
        TrainConfig(precision="fp8").validate()


def test_the_layer_controls_from_a_device_pool_equal_the_host_pools(llama, blocks):
    """A sweep fits each layer's closed-form controls from the same states its bridges train on:
    pooled on the device, the same numbers as on the host."""
    from geoprobe.bridges.controls import layer_controls
    from geoprobe.bridges.hidden import Teacher

    on_host = layer_controls(blocks, 1, Teacher(llama, 1).embeddings, None)
    with accelerator():
        llama.model.to(DEVICE)
        try:
            pooled = layer_controls(pooled_copy(blocks, DEVICE), 1, Teacher(llama, 1).embeddings, None)
        finally:
            llama.model.to("cpu")
    assert pooled.keys() == on_host.keys()
    for key, value in on_host.items():
        if isinstance(value, float):
            assert pooled[key] == pytest.approx(value, rel=1e-9), key
