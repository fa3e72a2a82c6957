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

pytestmark = pytest.mark.slow  # minutes: not in `make check`

ROOT = Path(__file__).resolve().parents[1]


SMALL_FILES = {"gpu_check.json", "preflight.json", "phases.json", "gpu_memory.log", "errors.txt"}  # all $OUT may hold
ORDER = ["preflight", "fixture", "phases", "scan", "agree", "scan_dxd", "dsl", "bridge", "sample"]  # by value


def gpu_check(out: Path, timeout: int, **env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh"), "--tiny"], capture_output=True, text=True,
                          env={**os.environ, "OUT": str(out), "PY": sys.executable, **env}, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def assert_only_small_files(out: Path) -> None:
    files = [p for p in out.rglob("*")]
    assert {p.name for p in files} <= SMALL_FILES and all(p.is_file() for p in files), files
    assert all(p.stat().st_size < 2**20 for p in files)  # the device returns 8 files of 16 MiB at most


def test_gpu_check_tiny_runs_every_step_and_reports_every_figure(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    done = gpu_check(out, 900, GPU_CHECK_WORK=str(work))
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads((out / "gpu_check.json").read_text())
    assert list(figures["steps"]) == ORDER and all(s["status"] == "ok" for s in figures["steps"].values())
    assert_only_small_files(out)
    assert not (out / "errors.txt").exists()
    # the import check first: every module of geoprobe, bridges and samplers imports
    preflight = json.loads((out / "preflight.json").read_text())
    assert preflight["modules_failed"] == {} and preflight["modules_imported"] > 30
    assert preflight["gpu"] == "none" and preflight["host_memory_available_gib"] > 0
    assert preflight["gemm_tflops"] > 0 and preflight["eigh_fp64_seconds"] > 0  # the ceilings' code path
    assert figures["tiny"] and figures["tokens_forwarded"] == 100 * 64  # the first block of 100 documents
    for key in ("forwarded_tokens_per_second", "stored_rows_per_second", "geometry_seconds_per_layer",
                "dxd_geometry_seconds_per_layer", "bridge_tokens_per_second", "dsl_steps_per_second",
                "sample_tokens_per_second", "roar_num4_tokens_per_second", "dsl_step_steps_per_second",
                "fsdp_steps_per_second", "forward_determinism_cost", "geometry_keep_channels_seconds",
                "host_memory_available_gib", "gemm_tflops"):
        assert math.isfinite(figures[key]) and figures[key] > 0, key
    # the agreement step's code path: the second device is the CPU again, so everything is equal
    assert figures["agree_device"] == "cpu" and figures["agree_within_tolerance"]
    assert figures["agree_states_over_spread"] == figures["agree_proxy_relative"] == figures["agree_dsl_loss_relative"] == 0
    assert figures["agree_same_ranking"] and figures["agree_rerun_geometry_identical"]
    assert set(figures["phases_status"].values()) == {"ok"} and figures["phases_ok"] == 7  # every phase ran
    assert figures["dxd_rows"] >= 2 * 64  # the d x d path (the tiny fixture's d is 64)
    # the rate after the first batch counts the tokens after it only
    manifest = json.loads((work / "run" / "manifest.json").read_text())
    assert 0 < manifest["warm_tokens"] < manifest["tokens_forwarded"] and manifest["warm_seconds"] > 0
    # each step's figures were printed as it ended, before the next step began; the summary last
    assert done.stdout.index("preflight_status") < done.stdout.index("fixture_status")
    assert done.stdout.index("dsl_steps_per_second") < done.stdout.index("sample_tokens_per_second")
    assert done.stdout.index("sample_status") < done.stdout.index("== summary")
    assert figures["dsl_step_peak_over_plan"] is None  # CUDA measures it; the CPU run has only the plan
    assert len((work / "samples" / "samples.jsonl").read_text().splitlines()) == 4


FAKE_PYTHON = """#!/bin/sh
# a stand-in for python in the steps: canned output, or a sleep, or a failure, by step
[ -z "$GPU_CHECK_STEP" ] && exec {python} "$@"   # the figures themselves
echo "$GPU_CHECK_STEP" >> {fake}/order
[ "$GPU_CHECK_STEP" = preflight ] && echo '{{"gpu": "none", "modules_failed": {{}}}}' > "$2/preflight.json"
[ -f {fake}/$GPU_CHECK_STEP.fail ] && {{ echo broken >&2; exit 3; }}
[ -f {fake}/$GPU_CHECK_STEP.json ] && exec cat {fake}/$GPU_CHECK_STEP.json
[ -f {fake}/$GPU_CHECK_STEP.sleep ] && exec sleep 60
exit 0
"""


def test_a_killed_a_timed_out_and_a_failed_step_and_the_deadline_leave_the_other_figures(tmp_path):
    """The steps' commands are stand-ins (the run above is the real one): scan's figures are canned,
    phases outlives its 1 s timeout, scan_dxd is SIGKILLed, dsl fails, bridge runs into the 12 s
    deadline, and sample is skipped. Each is recorded, the rest go on, the summary comes."""
    fake = tmp_path / "fake"
    fake.mkdir()
    python = fake / "python"
    python.write_text(FAKE_PYTHON.format(python=sys.executable, fake=fake))
    python.chmod(0o755)
    (fake / "scan.json").write_text(json.dumps({"timing": {
        "warm_seconds": 2.0, "warm_tokens": 4000, "tokens_forwarded": 5000, "forward_seconds": 3.0, "rows": 100,
        "geometry_seconds_per_layer": 0.5}}))
    for name in ("phases", "scan_dxd", "bridge"):
        (fake / f"{name}.sleep").touch()
    (fake / "dsl.fail").touch()
    out = tmp_path / "out"
    began = time.monotonic()
    done = gpu_check(out, 120, PY=str(python), GPU_CHECK_DEADLINE="12", GPU_CHECK_TIMEOUT_phases="1",
                     GPU_CHECK_KILL="scan_dxd")
    assert time.monotonic() - began < 12 + 20  # the deadline held (bridge's sleep is 60 s)
    assert done.returncode != 0  # not every step succeeded
    figures = json.loads((out / "gpu_check.json").read_text())
    status = {name: state["status"] for name, state in figures["steps"].items()}
    assert list(status) == ORDER, status
    assert status["preflight"] == status["fixture"] == status["scan"] == status["agree"] == "ok"
    assert status["phases"] == "timed out after 1 s"
    assert status["scan_dxd"] == "killed (signal 9)"
    assert status["dsl"] == "failed (exit 3)"
    assert status["bridge"].startswith("timed out") and status["bridge"].endswith("(deadline)")
    assert status["sample"] == "skipped (deadline)"
    # the import check ran first, the skipped step not at all
    assert (fake / "order").read_text().split() == ORDER[:-1]
    # the figures of the steps that finished are all there
    assert figures["forwarded_tokens_per_second"] == 2000 and figures["geometry_seconds_per_layer"] == 0.5
    assert figures["gpu"] == "none"
    assert_only_small_files(out)
    errors = (out / "errors.txt").read_text()
    for line in ("== phases: timed out", "== scan_dxd: killed (signal 9)", "== dsl: failed (exit 3)", "broken"):
        assert line in errors
    summary = done.stdout[done.stdout.index("== summary"):]
    assert all(name in summary for name in ORDER) and "skipped (deadline)" in summary


def test_the_host_memory_guard_takes_the_override_it_names(monkeypatch):
    import torch

    from geoprobe.errors import BadInput
    from geoprobe.memory import HOST_MEMORY_OVERRIDE, load_dtype, memory_available
    from geoprobe.fixtures import config_for

    monkeypatch.setenv(HOST_MEMORY_OVERRIDE, "0.001")
    assert memory_available(torch.device("cpu")) == int(0.001 * 2**30)
    with pytest.raises(BadInput, match=HOST_MEMORY_OVERRIDE):  # the refusal names the way round it
        load_dtype(config_for("meta-llama/Llama-3.1-8B-Instruct"), torch.bfloat16, "bfloat16", torch.device("cpu"))
    monkeypatch.setenv(HOST_MEMORY_OVERRIDE, "4096")
    assert load_dtype(config_for("meta-llama/Llama-3.1-8B-Instruct"), torch.bfloat16, "bfloat16",
                      torch.device("cpu")) == torch.bfloat16
    monkeypatch.setenv(HOST_MEMORY_OVERRIDE, "lots")
    with pytest.raises(BadInput, match="not a number"):
        memory_available(torch.device("cpu"))


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
