"""bench/gpu_check.sh --tiny: the GPU check's every step, on a CPU with a downsized fixture, so the
script that runs once on an H200 cannot rot; and the random-weight 8B fixture (opt-in)."""

from __future__ import annotations

import json
import math
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_tiny_runs_every_step_and_reports_every_figure(tmp_path):
    done = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh"), "--tiny"], capture_output=True, text=True,
                          env={**os.environ, "OUT": str(tmp_path), "PY": sys.executable}, timeout=600,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads((tmp_path / "gpu_check.json").read_text())
    assert figures["tiny"] and figures["tokens_forwarded"] == 100 * 64  # the first block of 100 documents
    for key in ("forwarded_tokens_per_second", "stored_rows_per_second", "geometry_seconds_per_layer",
                "dxd_geometry_seconds_per_layer", "bridge_tokens_per_second", "dsl_steps_per_second",
                "sample_tokens_per_second", "dsl_init_steps_per_second", "dsl_init_planned_gib"):
        assert math.isfinite(figures[key]) and figures[key] > 0, key
    assert figures["dxd_rows"] >= 2 * 64  # the d x d path (the tiny fixture's d is 64)
    # the rate after the first batch counts the tokens after it only
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert 0 < manifest["warm_tokens"] < manifest["tokens_forwarded"] and manifest["warm_seconds"] > 0
    assert "forwarded_tokens_per_second" in done.stdout
    # each step's figures were printed as it ended, before the next step began
    assert done.stdout.index("dsl_steps_per_second") < done.stdout.index("sample_tokens_per_second")
    assert figures["dsl_init_peak_gib"] is None  # CUDA measures it; the CPU run has only the plan
    samples = (tmp_path / "samples" / "samples.jsonl").read_text().splitlines()
    assert len(samples) == 4


def test_a_failing_step_stops_the_check_with_its_own_exit_status(tmp_path):
    failing = tmp_path / "python"
    failing.write_text("#!/bin/sh\necho broken >&2\nexit 3\n")
    failing.chmod(0o755)
    done = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh"), "--tiny"], capture_output=True, text=True,
                          env={**os.environ, "OUT": str(tmp_path / "out"), "PY": str(failing)}, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 3
    assert "FAILED: fixture (exit 3)" in done.stderr and "broken" in done.stderr


def test_the_fixture_resolves_offline_as_the_hub_id_with_the_real_architecture(tmp_path):
    from geoprobe.backbone import load_backbone
    from geoprobe.fixtures import CONFIGS, MASSIVE_CHANNEL, write_fixture

    for repo_id in CONFIGS:
        folder = write_fixture(repo_id, tmp_path, tiny=True)
        assert write_fixture(repo_id, tmp_path, tiny=True) == folder  # idempotent
        old = os.environ.get("HF_HOME")
        os.environ["HF_HOME"] = str(tmp_path)
        try:
            import huggingface_hub.constants as constants

            saved = constants.HF_HUB_CACHE
            constants.HF_HUB_CACHE = str(tmp_path / "hub")
            backbone = load_backbone(repo_id, device="cpu")
        finally:
            constants.HF_HUB_CACHE = saved
            if old is None:
                os.environ.pop("HF_HOME")
            else:
                os.environ["HF_HOME"] = old
        assert backbone.config.model_type == {"Qwen/Qwen3-8B": "qwen3"}.get(repo_id, "llama")
        assert backbone.num_layers == 4 and backbone.hidden_size == 64
        assert len(backbone.tokenizer) == backbone.config.vocab_size  # a DSL over it is as wide as the model
        table = backbone.model.get_input_embeddings().weight.float()
        spread = table.std(0)
        assert spread[MASSIVE_CHANNEL] > 20 * spread.median()  # the massive channel the geometry must see


@pytest.mark.eightb
def test_the_8b_path_on_a_cpu_within_24_gb(tmp_path_factory):
    """The used-by command on the real 8B shape: scan (a few hundred tokens, layers 0-4, bfloat16),
    bridge --layer 3 for a few steps, sample --sampler roar through it. Prints times and peak RSS."""
    home = Path(os.environ.get("GEOPROBE_8B_HF_HOME", tmp_path_factory.mktemp("hf8b")))
    out = tmp_path_factory.mktemp("run8b")
    env = {**os.environ, "HF_HOME": str(home), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    corpus = "synthetic:hmm?docs=40&length=200&seed=1"
    model = "meta-llama/Llama-3.1-8B-Instruct"
    steps = [
        ("fixture", [sys.executable, "-m", "geoprobe.fixtures", model, "--hf-home", str(home)]),
        ("scan", [sys.executable, "-m", "geoprobe", "-q", "scan", model, "--corpus", corpus, "--tokens", 320,
                  "--seq-len", 64, "--layers", "0-4", "--dtype", "bfloat16", "--batch-size", 2, "--anchors", 128,
                  "--k", 8, "--pairs", 256, "--bootstrap", 20, "--device", "cpu", "--out", str(out / "run")]),
        ("bridge", [sys.executable, "-m", "geoprobe", "-q", "bridge", "--run", str(out / "run"), "--layer", 3,
                    "--steps", 4, "--until", "steps", "--batch-size", 2, "--seq-len", 32, "--dtype", "bfloat16",
                    "--device", "cpu"]),
        ("sample", [sys.executable, "-m", "geoprobe", "-q", "sample", "--model",
                    str(out / "run" / "bridges" / "layer-03" / "seed-0"), "--sampler", "roar", "--num", 2, "--length", 16,
                    "--out", str(out / "samples"), "--device", "cpu"]),
    ]
    report = {}
    for name, argv in steps:
        began = time.perf_counter()
        done = subprocess.run(list(map(str, argv)), env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, f"{name}: {done.stderr[-3000:]}"
        report[name] = round(time.perf_counter() - began, 1)
    peak_gib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20
    print(f"\n8B on the CPU: seconds {report}, peak RSS of any step {peak_gib:.1f} GiB")
    assert peak_gib < 24
    assert len((out / "samples" / "samples.jsonl").read_text().splitlines()) == 2
