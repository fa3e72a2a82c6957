"""bench/gpu_phases.py, the GPU check's phase step: its tiny run records every phase with numbers,
its split DSL step is the loop's step, the 8B DSL is truncated where the plan does not fit, and a
phase that fails or overruns is recorded while the next one runs."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from bench import gpu_phases

ROOT = Path(__file__).resolve().parents[1]


def parts_within(splits: dict, total: float, rest: str) -> None:
    """Every region timed and non-negative, the timed regions within the total, `rest` the remainder."""
    timed = {k: v for k, v in splits.items() if k != rest}
    assert all(v >= 0 for v in splits.values()), splits
    assert sum(timed.values()) <= total * (1 + 1e-6) + 1e-6, (splits, total)
    assert math.isclose(sum(splits.values()), total, rel_tol=1e-3, abs_tol=1e-4), (splits, total)


@pytest.fixture(scope="module")
def tiny_phases(tmp_path_factory) -> dict:
    from geoprobe.fixtures import write_fixture

    home = tmp_path_factory.mktemp("hf")
    write_fixture(gpu_phases.MODEL, home, tiny=True)
    out = tmp_path_factory.mktemp("out")
    env = {**os.environ, "HF_HOME": str(home), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("GPU_CHECK_LIMIT", None)
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_phases.py"), str(out), "--tiny"], env=env,
                          capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [p.name for p in out.iterdir()] == ["phases.json"]  # one small file comes back
    return json.loads((out / "phases.json").read_text())


def test_the_tiny_phase_step_records_every_phase_with_numbers(tiny_phases):
    phases = tiny_phases["phases"]
    assert list(phases) == list(gpu_phases.PHASES)
    assert all(p["status"] == "ok" and p["wall_seconds"] > 0 for p in phases.values())
    assert tiny_phases["figures"]["phases_ok"] == len(gpu_phases.PHASES)
    assert phases["load"]["layers"] == 4 and phases["load"]["gemm_tflops"] > 0
    forward = phases["forward"]
    assert forward["tokens"] == 2 * 64 and forward["determinism_cost"] > 0
    assert forward["deterministic_tokens_per_second"] > 0 and forward["nondeterministic_tokens_per_second"] > 0

    roar = phases["roar"]
    assert [run["num"] for run in roar["runs"]] == [4, 16, 64]
    # --num 4 samples all 8 tokens; 16 and 64 stop after the calls timed (one token per sequence each)
    assert [run["calls"] for run in roar["runs"]] == [8, 4, 2]
    for run in roar["runs"]:
        assert math.isclose(run["tokens_per_second"], run["num"] * run["calls"] / run["seconds"], rel_tol=1e-2)
        assert set(run["splits_seconds"]) == {"bridge", "blocks", "head", "host"}
        assert min(run["splits_seconds"][k] for k in ("bridge", "blocks", "head")) > 0
        parts_within(run["splits_seconds"], run["seconds"], "host")

    runs = phases["bridge_steps"]["runs"]
    assert [(r["pool"], r["batch"], r["seq"]) for r in runs] == [("host", 4, 16), ("device", 4, 16), ("device", 8, 32)]
    for run in runs:
        assert run["tokens_per_second"] > 0 and run["gflop_per_step"] > 0 and run["gemm_fraction"] > 0
        assert math.isclose(run["tokens_per_second"], run["steps"] * run["batch"] * run["seq"] / run["seconds"],
                            rel_tol=1e-2)

    for name, blocks in (("dsl_step", 4), ("fsdp", gpu_phases.FSDP_BLOCKS)):
        phase = phases[name]
        assert phase["blocks"] == blocks and phase["steps"] > 0 and math.isfinite(phase["loss"])
        assert list(phase["splits_seconds"]) == [*gpu_phases.DSL_SPLITS, "host"]
        assert min(phase["splits_seconds"][k] for k in gpu_phases.DSL_SPLITS) > 0
        parts_within(phase["splits_seconds"], phase["seconds"], "host")
        assert phase["planned_gib"] > 0 and phase["peak_allocated_gib"] is None  # CUDA's peak: on CUDA only
        assert phase["optimiser_state_gib"] > 0 and phase["optimiser_gb_per_second"] > 0
    assert not phases["dsl_step"]["truncated"] and phases["fsdp"]["world_size"] == 1

    geometry = phases["geometry"]
    assert [run["drop_massive_channels"] for run in geometry["runs"]] == [False, True]
    keep, drop = geometry["runs"]
    assert keep["massive_channels"] == drop["massive_channels"] == 1  # the synthetic layer's one
    assert keep["channels_used"] == 64 and drop["channels_used"] == 63  # dropped in the second run only
    for run in geometry["runs"]:
        assert run["splits_seconds"]["knn"] > 0 and run["splits_seconds"]["spectrum"] > 0
        parts_within(run["splits_seconds"], run["seconds"], "other")


def two_runs(precision: str, tmp_path: Path):
    """Two alike one-process DSL runs on the tiny 8B config's blocks."""
    from geoprobe.bridges.dsl import DSLTrainSettings, dsl_objective
    from geoprobe.bridges.parallel import Execution
    from geoprobe.bridges.train import TrainConfig, _Run
    from geoprobe.distributed import SINGLE
    from geoprobe.fixtures import config_for

    config = config_for(gpu_phases.MODEL, tiny=True)
    data = torch.randint(0, config.vocab_size, (16, 12), generator=torch.Generator().manual_seed(0))
    settings = DSLTrainSettings(seq_len=12, train=TrainConfig(steps=100, batch_size=4, warmup=1, save_every=0,
                                                              precision=precision, clip=0.05))
    runs = []
    for name in ("loop", "split"):
        model = gpu_phases.random_dsl(config, precision)
        loss_fn, _ = dsl_objective(model, data, settings, torch.device("cpu"))
        gpu_phases.randomise(model)
        runs.append(_Run.start(model, loss_fn, settings.train, tmp_path / name, torch.device("cpu"), SINGLE,
                               Execution()))
    return runs


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_the_split_step_is_the_loops_step(precision, tmp_path):
    """split_update times _Run.update's parts: after three steps the weights, the EMA and AdamW's
    state equal the loop's bit for bit (clipping active: a small --clip)."""
    from geoprobe.bridges.train import Shard

    loop, split = two_runs(precision, tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(loop.params.values(), split.params.values()))
    splits = gpu_phases.Splits(torch.device("cpu"))
    for step in range(3):
        assert torch.equal(loop.update(step, Shard()), gpu_phases.split_update(split, step, Shard(), splits))
    for key, value in loop.params.items():
        assert torch.equal(value, split.params[key]), key
        assert torch.equal(loop.ema[key], split.ema[key]), key
    moments = lambda run: [v for s in run.optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    assert all(torch.equal(a, b) for a, b in zip(moments(loop), moments(split)))
    assert any(not torch.equal(a, b) for a, b in zip(loop.params.values(), loop.ema.values()))  # it trained
    assert {k: len(v) for k, v in splits.marks.items()} == {k: 3 for k in gpu_phases.DSL_SPLITS}


def test_the_8b_dsl_is_truncated_where_its_plan_does_not_fit():
    """All 32 blocks on an H200 (the bfloat16 plan, 8 x 128, under its 139 GiB free), 12 on an
    H100 (78 GiB free), whose 12-block plan fits it."""
    from geoprobe.fixtures import config_for

    config = config_for(gpu_phases.MODEL)
    batch, seq, _ = gpu_phases.GPU.dsl
    full = gpu_phases.dsl_plan(config, batch, seq, "bfloat16", cuda=True)
    assert 78 * 2**30 < full < 139 * 2**30
    assert gpu_phases.dsl_blocks(config, 139 * 2**30, batch, seq) == 32
    assert gpu_phases.dsl_blocks(config, 78 * 2**30, batch, seq) == gpu_phases.TRUNCATED_BLOCKS == 12
    config.num_hidden_layers = 12
    assert gpu_phases.dsl_plan(config, batch, seq, "bfloat16", cuda=True) < 78 * 2**30


def test_a_failed_an_overrun_and_a_skipped_phase_are_recorded_and_the_next_runs(tmp_path):
    path, record = tmp_path / "phases.json", {"phases": {}}

    def broken(found):
        found["before"] = 1.5  # what it measured before failing stays
        raise ValueError("no room")

    def endless(found):
        found["first"] = 2.0
        time.sleep(30)

    began = time.monotonic()
    gpu_phases.run_phase(record, path, "load", broken, budget=60, left=60)
    gpu_phases.run_phase(record, path, "forward", endless, budget=1, left=60)
    gpu_phases.run_phase(record, path, "roar", lambda found: found.update(runs=[]), budget=60, left=60)
    gpu_phases.run_phase(record, path, "geometry", lambda found: found.update(never=1), budget=60, left=0.5)
    assert time.monotonic() - began < 10  # the overrun stopped at its 1 s deadline
    written = json.loads(path.read_text())
    phases = written["phases"]
    assert phases["load"]["status"] == "failed: ValueError: no room" and phases["load"]["before"] == 1.5
    assert phases["forward"]["status"] == "timed out after 1 s" and phases["forward"]["first"] == 2.0
    assert phases["roar"]["status"] == "ok"
    assert phases["geometry"]["status"] == "skipped (deadline)" and "never" not in phases["geometry"]
    assert written["figures"]["phases_ok"] == 1
