"""FSDP2 training (`--fsdp`, bridges/parallel.py) on 2 gloo ranks: the same weights as one
process without it, an exact resume after a crash, a resume on another number of ranks, and the
command line's flag."""

from __future__ import annotations

import pickle
import shutil

import pytest
import torch
from safetensors.torch import load_file

from geoprobe.bridges.parallel import Execution
from geoprobe.distributed import SINGLE
from tests import distributed_worker
from tests.helpers import read_json, run_cli
from tests.test_distributed import spawn, torchrun

pytestmark = pytest.mark.slow  # multi-process runs: not in `make check`


def close(a: dict, b: dict, rtol: float = 1e-4, atol: float = 1e-5) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.allclose(a[key].float(), b[key].float(), rtol=rtol, atol=atol), key


def moved(trained_dir, start: dict) -> float:
    """How far the kept weights are from the initial ones (the agreement checked is not trivial)."""
    end = load_file(trained_dir / "model.safetensors")
    return max(float((end[k].float() - start[k].float()).abs().max()) for k in end if end[k].numel())


def test_fsdp_on_two_ranks_equals_one_rank_without_it(tmp_path, tiny_models):
    """The tiny Llama's blocks as the DSL's (each block one FSDP unit, the head and embedding
    matrix the root, the table and converter replicated), the plateau rule scoring the EMA on the
    shards, clipping active: the kept weights and every validation score match one process."""
    llama = str(tiny_models("llama"))
    start = distributed_worker.dsl_problem(llama)[0].state_dict()
    one = distributed_worker.train_dsl_problem(str(tmp_path / "one"), llama, Execution(), SINGLE)
    spawn(distributed_worker.fsdp_worker, 2, str(tmp_path / "two"), llama, 0)
    two = pickle.loads((tmp_path / "two" / "trained.pkl").read_bytes())
    assert moved(tmp_path / "one", start) > 1e-3
    close(load_file(tmp_path / "one" / "model.safetensors"), load_file(tmp_path / "two" / "model.safetensors"))
    assert [s for s, _ in two.val_curve] == [s for s, _ in one.val_curve] == [2, 4, 6]
    for (_, a), (_, b) in zip(one.val_curve, two.val_curve):
        assert a == pytest.approx(b, rel=1e-6)
    assert two.best_step == one.best_step and two.steps == one.steps == 6
    assert sorted(p.name for p in (tmp_path / "two" / "checkpoint").iterdir()) == [
        ".metadata", "__0_0.distcp", "__1_0.distcp", "training.json"]  # each rank wrote its shards
    assert not (tmp_path / "two" / "checkpoint.safetensors").exists()


def test_a_crashed_fsdp_run_resumes_exactly_and_on_one_rank(tmp_path):
    """Crashed at step 5 after the sharded checkpoint of step 4: resumed on the same 2 ranks it
    ends with the uninterrupted run's bits; resumed on 1 rank (the checkpoint resharded) within
    float tolerance. Gradient accumulation of 2 runs throughout."""
    spawn(distributed_worker.fsdp_worker, 2, str(tmp_path / "straight"), None, 0, 2)
    spawn(distributed_worker.fsdp_worker, 2, str(tmp_path / "resumed"), None, 5, 2)
    assert not (tmp_path / "resumed" / "model.safetensors").exists()  # it did stop early
    assert read_json(tmp_path / "resumed" / "checkpoint" / "training.json")["step"] == "4"
    shutil.copytree(tmp_path / "resumed", tmp_path / "on-one")
    spawn(distributed_worker.fsdp_worker, 2, str(tmp_path / "resumed"), None, 0, 2)
    spawn(distributed_worker.fsdp_worker, 1, str(tmp_path / "on-one"), None, 0, 2)
    straight = load_file(tmp_path / "straight" / "model.safetensors")
    resumed = load_file(tmp_path / "resumed" / "model.safetensors")
    assert straight.keys() == resumed.keys()
    for key in straight:
        assert torch.equal(straight[key], resumed[key]), key
    close(straight, load_file(tmp_path / "on-one" / "model.safetensors"))
    runs = [pickle.loads((tmp_path / run / "trained.pkl").read_bytes()) for run in ("straight", "resumed")]
    assert runs[0].val_curve == runs[1].val_curve and runs[1].session_steps == 2


def test_ddp_with_accumulated_micro_batches_equals_one_rank(tmp_path):
    """DDP synchronises once per step (no_sync for the first micro-batches): 2 ranks x 2
    micro-batches give one process's weights and scores."""
    one = distributed_worker.train_dsl_problem(str(tmp_path / "one"), None, Execution(), SINGLE)
    spawn(distributed_worker.fsdp_worker, 2, str(tmp_path / "two"), None, 0, 2, False)
    two = pickle.loads((tmp_path / "two" / "trained.pkl").read_bytes())
    close(load_file(tmp_path / "one" / "checkpoint.safetensors"), load_file(tmp_path / "two" / "checkpoint.safetensors"))
    for (_, a), (_, b) in zip(one.val_curve, two.val_curve):
        assert a == pytest.approx(b, rel=1e-6)


def test_dsl_train_with_fsdp_under_torchrun_equals_one_process(tmp_path, tiny_models, corpus_txt):
    args = ["dsl", "train", "--corpus", corpus_txt, "--tokenizer", tiny_models("llama"), "--steps", 4,
            "--precision", "float32", "--batch-size", 4, "--seq-len", 16, "--d-model", 16, "--d-tok", 8,
            "--n-layers", 2, "--warmup", 1, "--device", "cpu"]
    single = run_cli("-q", *args, "--out", tmp_path / "one")
    assert single.returncode == 0, single.stderr
    double = torchrun(*args, "--fsdp", "--grad-accum", 2, "--activation-checkpointing", "--out", tmp_path / "two")
    assert double.returncode == 0, double.stderr[-3000:]
    close(load_file(tmp_path / "one" / "model.safetensors"), load_file(tmp_path / "two" / "model.safetensors"))
    metrics = [read_json(tmp_path / run / "metrics.json") for run in ("one", "two")]
    assert metrics[1]["val_mdlm_elbo_nats_per_token"] == pytest.approx(metrics[0]["val_mdlm_elbo_nats_per_token"],
                                                                       rel=1e-4)
    again = run_cli("-q", *args, "--out", tmp_path / "two")  # the sharded run's folder without --fsdp
    assert again.returncode == 2
    assert "holds a sharded checkpoint (trained with --fsdp): resume it with --fsdp" in again.stderr
