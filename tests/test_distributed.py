"""Several ranks (gloo on CPU, 2 processes): the same numbers and rows as one process."""

from __future__ import annotations

import csv
import os
import pickle
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from geoprobe.geometry import GeometrySettings, bootstrap_counts, layer_geometry
from geoprobe.store import read_journal
from tests import distributed_worker
from tests.helpers import ONE_THREAD, all_rows, copy_run, read_json, run_cli, write_corpus

pytestmark = pytest.mark.slow  # minutes: not in `make check`


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(fn, world_size: int, *args) -> None:
    mp.start_processes(fn, args=(world_size, free_port(), *args), nprocs=world_size, join=True, start_method="spawn")


def assert_same_numbers(a, b, rel: float, path: str = "") -> None:
    """Every float of a (nested) result within `rel` of the other; everything else equal."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for key in a:
            assert_same_numbers(a[key], b[key], rel, f"{path}/{key}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (u, v) in enumerate(zip(a, b)):
            assert_same_numbers(u, v, rel, f"{path}[{i}]")
    elif isinstance(a, float):
        assert a == pytest.approx(b, rel=rel, abs=1e-300), path
    else:
        assert a == b, path


def layer_with_everything(seed: int = 0):
    """Anisotropic states with exact duplicates (also across the ranks' halves), a few massive
    outliers and uneven documents: every branch of the distributed geometry."""
    rng = np.random.default_rng(seed)
    n, d = 1201, 24  # odd: the ranks' shares differ in size
    x = rng.standard_normal((n, d)) * np.linspace(3.0, 0.2, d) + 1.5
    x[900:1000] = x[100:200]  # duplicates held by the other rank
    x[50:60] = x[40]  # a run of identical states within a rank
    x[[7, 700]] *= 200.0  # massive states, one per rank
    docs = np.sort(rng.integers(0, 37, size=n))
    settings = GeometrySettings(k=12, anchors=300, pairs=900, bootstrap=40, seed=3, chunk=64)
    counts = torch.from_numpy(bootstrap_counts(37, settings.bootstrap, settings.seed))
    return torch.from_numpy(x), torch.from_numpy(docs), settings, counts


def embedding_like_layer(seed: int = 1):
    """An embedding layer: 52 distinct float16-rounded states repeated 1,500 times, so nearly
    every distinct state is first seen (and held) by rank 0 and rank 1 holds only a few of them."""
    rng = np.random.default_rng(seed)
    table = (rng.standard_normal((52, 32)) * 0.02).astype(np.float16).astype(np.float64)
    x = table[rng.integers(0, 52, 1500)]
    docs = np.sort(rng.integers(0, 30, 1500))
    settings = GeometrySettings(k=8, anchors=256, pairs=512, bootstrap=40, seed=0)
    return torch.from_numpy(x), torch.from_numpy(docs), settings, torch.from_numpy(bootstrap_counts(30, 40, 0))


@pytest.mark.parametrize("make", [layer_with_everything, embedding_like_layer])
def test_two_rank_geometry_equals_one_rank(tmp_path, make):
    x, docs, settings, counts = make()
    single = layer_geometry(x, docs, settings, counts, rng_key=5, layer=0)
    if make is layer_with_everything:
        assert single["massive"] == 2 and single["duplicate_fraction"] > 0.05
    else:
        assert single["duplicate_fraction"] > 0.95
    data = tmp_path / "layer.pkl"
    data.write_bytes(pickle.dumps((x, docs, settings, counts)))
    spawn(distributed_worker.geometry_worker, 2, str(data), str(tmp_path / "result"))
    ranks = [pickle.loads((tmp_path / f"result.{r}").read_bytes()) for r in (0, 1)]
    assert_same_numbers(ranks[0], ranks[1], rel=0.0)  # every rank returns the same result
    assert_same_numbers(single, ranks[0], rel=1e-9)


# --- whole commands under torchrun (2 CPU processes, gloo) ----------------------------------

def torchrun(*args, nproc: int = 2, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **ONE_THREAD}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
               f"--master-port={free_port()}", "-m", "geoprobe", "-q", *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def scan_args(tiny_models, tmp_path_factory):
    corpus = write_corpus(tmp_path_factory.mktemp("dcorpus") / "docs.txt", n_docs=60, seed=5)
    return ["scan", tiny_models("llama"), "--corpus", corpus, "--tokens", 3000, "--seq-len", 64, "--shard-rows", 256,
            "--k", 8, "--anchors", 256, "--pairs", 512, "--bootstrap", 20, "--device", "cpu"]


def test_two_rank_scan_equals_one_rank_scan(tmp_path, scan_args):
    # the one-process reference on one core while the ranks started by hand (below) use the other
    single = run_cli("-q", *scan_args, "--out", tmp_path / "one", background=True, env=ONE_THREAD)
    # ranks started by hand, one after the other: the first stops after its shards, the last computes the
    # geometry alone (they share no process group), equal to one process's
    first = run_cli("-q", *scan_args, "--out", tmp_path / "hand", "--rank", 0, "--world-size", 2,
                    env=ONE_THREAD)
    assert first.returncode != 0 and "rerun the remaining ranks" in first.stderr
    last = run_cli("-q", *scan_args, "--out", tmp_path / "hand", "--rank", 1, "--world-size", 2,
                   env=ONE_THREAD)
    assert last.returncode == 0, last.stderr[-3000:]
    assert single.wait(timeout=600) == 0, single.stderr.read()
    double = torchrun(*scan_args, "--out", tmp_path / "two")
    assert double.returncode == 0, double.stderr[-3000:]
    one, two = read_json(tmp_path / "one" / "manifest.json"), read_json(tmp_path / "two" / "manifest.json")
    assert two["status"] == "complete" and len(two["shards"]) >= 4  # both ranks wrote shards
    assert [s["sha256"] for s in two["shards"]] == [s["sha256"] for s in one["shards"]]  # same rows, same bytes
    assert not (tmp_path / "two" / "parts").exists()  # folded into the manifest
    geometry = [read_json(tmp_path / run / "geometry.json") for run in ("one", "two")]
    assert_same_numbers(geometry[0]["layers"], geometry[1]["layers"], rel=1e-9)
    rankings = [list(csv.DictReader(open(tmp_path / run / "ranking.csv"))) for run in ("one", "two")]
    assert [r["rank"] for r in rankings[0]] == [r["rank"] for r in rankings[1]]
    for a, b in zip(*rankings):
        assert float(a["score"]) == pytest.approx(float(b["score"]), rel=1e-9, abs=1e-12)
    assert_same_numbers(geometry[0]["layers"], read_json(tmp_path / "hand" / "geometry.json")["layers"], rel=1e-9)


def test_a_killed_rank_resumes_with_any_world_size(tmp_path, tiny_models):
    corpus = write_corpus(tmp_path / "big.txt", n_docs=300, seed=3)
    args = ["--quiet", "extract", tiny_models("llama"), "--corpus", corpus, "--tokens", 20000, "--seq-len", 64,
            "--shard-rows", 256, "--batch-size", 1, "--device", "cpu"]
    run = tmp_path / "shared"
    victim = run_cli(*args, "--out", run, "--rank", 1, "--world-size", 2, background=True)
    part = run / "parts" / "rank-001.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not len(read_journal(part)) >= 2:
        time.sleep(0.05)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    killed_with = len(read_journal(part))
    rank0 = run_cli(*args, "--out", run, "--rank", 0, "--world-size", 2)
    assert rank0.returncode == 0, rank0.stderr
    assert read_json(run / "manifest.json")["status"] == "running"  # rank 1's share is unfinished
    resumed = run_cli(*args, "--out", run)  # one process finishes what rank 1 left
    assert resumed.returncode == 0, resumed.stderr
    clean = run_cli(*args, "--out", tmp_path / "clean")
    assert clean.returncode == 0, clean.stderr
    merged, reference = read_json(run / "manifest.json"), read_json(tmp_path / "clean" / "manifest.json")
    assert merged["status"] == "complete" and killed_with >= 2
    assert [s["sha256"] for s in merged["shards"]] == [s["sha256"] for s in reference["shards"]]
    assert all_rows(run).equals(all_rows(tmp_path / "clean"))


def test_two_rank_bridge_training_equals_one_rank_with_the_whole_batch(tmp_path, tiny_models, corpus_txt):
    from safetensors.torch import load_file

    args = ["bridge", "--model", tiny_models("llama"), "--corpus", corpus_txt, "--layer", 1, "--steps", 4,
            "--precision", "float32",  # the data-parallel arithmetic is what is compared, at float32
            "--batch-size", 4, "--seq-len", 32, "--d-model", 32, "--n-layers", 1, "--device", "cpu"]
    single = run_cli("-q", *args, "--out", tmp_path / "one")
    assert single.returncode == 0, single.stderr
    double = torchrun(*args, "--out", tmp_path / "two")
    assert double.returncode == 0, double.stderr[-3000:]
    weights = [load_file(tmp_path / run / "bridges" / "layer-01" / "seed-0" / "checkpoint.safetensors") for run in ("one", "two")]
    assert weights[0].keys() == weights[1].keys()
    ema = [k[4:] for k in weights[0] if k.startswith("ema.")]
    moved = max(float((weights[0][f"model.{k}"].float() - weights[0][f"ema.{k}"]).abs().max()) for k in ema)
    assert moved > 1e-4  # the weights moved (the EMA lags them), so the agreement below is not trivial
    for key in weights[0]:
        assert torch.allclose(weights[0][key].float(), weights[1][key].float(), rtol=1e-4, atol=1e-5), key
    metrics = [read_json(tmp_path / run / "bridges" / "layer-01" / "seed-0" / "metrics.json") for run in ("one", "two")]
    assert metrics[1]["nmse"] == pytest.approx(metrics[0]["nmse"], rel=1e-3)


def test_two_rank_sweep_splits_its_bridges_and_gives_the_one_rank_rows(tmp_path, scanned_run):
    """The sweep's bridges (2 layers x 2 seeds and the ceilings) split over 2 ranks, each bridge
    trained by one rank alone: the same rows as one process, bit for bit, and the teacher pass
    run once in all (each block forwarded by one rank)."""
    flags = ["--layers", "1-2", "--seeds", "0,1", "--ceiling", "--steps", 4, "--eval-every", 2, "--batch-size", 4,
             "--seq-len", 32, "--d-model", 32, "--n-layers", 1, "--bridge-steps", 4, "--precision", "float32",
             "--device", "cpu"]
    one, two = (copy_run(scanned_run, tmp_path / name) for name in ("one", "two"))
    single = run_cli("-q", "sweep", "--run", one, *flags, env=ONE_THREAD)
    assert single.returncode == 0, single.stderr
    double = torchrun("--", "sweep", "--run", two, *flags)  # `--`: torchrun would take --run for its --run-path
    assert double.returncode == 0, double.stderr[-3000:]
    timed = ("train_seconds", "steps_per_second", "ceiling_train_seconds")
    rows = [[{k: v for k, v in row.items() if k not in timed} for row in read_json(run / "sweep.json")["rows"]]
            for run in (one, two)]
    assert [(r["layer"], r["seed"]) for r in rows[1]] == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert rows[1] == rows[0]  # every loss, control, curve and the ceiling's numbers
    assert read_json(two / "sweep.json")["verdict"] == read_json(one / "sweep.json")["verdict"]
    spread = read_json(two / "bridges" / "spread.json")  # layer 1's bridges on rank 0, layer 2's on rank 1
    assert spread == {"world_size": 2, "ranks": [["layer-01/seed-0", "layer-01/seed-1", "layer-01/ceiling"],
                                                 ["layer-02/seed-0", "layer-02/seed-1", "layer-02/ceiling"]]}
    teacher = read_json(two / "bridges" / "teacher-states" / "pass.json")
    assert teacher["world_size"] == 2 and teacher["layers"] == [0, 1, 2]
    for split, blocks in enumerate(teacher["blocks"]):  # each split's blocks forwarded once, by one rank
        ranges = [tuple(rank["ranges"][split]) for rank in teacher["ranks"]]
        assert ranges[0][0] == 0 and ranges[0][1] == ranges[1][0] and ranges[1][1] == blocks, ranges
    forwarded = [rank["forwarded"] for rank in teacher["ranks"]]
    assert sum(forwarded) == sum(teacher["blocks"]) and min(forwarded) > 0
    assert not list((two / "bridges" / "teacher-states").glob("part-*"))  # the shared parts are gone once read
    assert not (one / "bridges" / "teacher-states").exists()  # one process keeps its pass in memory


def test_batch_not_divisible_by_the_ranks_is_refused(tmp_path, tiny_models, corpus_txt):
    done = torchrun("bridge", "--model", tiny_models("llama"), "--corpus", corpus_txt, "--layer", 1, "--steps", 2,
                    "--batch-size", 3, "--seq-len", 32, "--device", "cpu", "--out", tmp_path / "odd")
    assert done.returncode != 0
    assert "--batch-size 3 (the global batch) must be a multiple of the 2 ranks" in done.stderr


def test_rank_flags_out_of_range_are_refused(tmp_path, tiny_models, corpus_txt):
    done = run_cli("extract", tiny_models("llama"), "--corpus", corpus_txt, "--tokens", 100, "--out", tmp_path / "r",
                   "--rank", 2, "--world-size", 2, "--device", "cpu")
    assert done.returncode == 2 and done.stderr.strip() == "error: --rank must be in 0..1, got 2"
    assert not (tmp_path / "r").exists()


def test_two_rank_dsl_training_equals_one_rank(tmp_path, tiny_models, corpus_txt):
    from safetensors.torch import load_file

    args = ["dsl", "train", "--corpus", corpus_txt, "--tokenizer", tiny_models("llama"), "--steps", 4,
            "--precision", "float32",
            "--batch-size", 4, "--seq-len", 16, "--d-model", 16, "--d-tok", 8, "--n-layers", 1, "--warmup", 1,
            "--device", "cpu"]
    single = run_cli("-q", *args, "--out", tmp_path / "one")
    assert single.returncode == 0, single.stderr
    double = torchrun(*args, "--out", tmp_path / "two")
    assert double.returncode == 0, double.stderr[-3000:]
    weights = [load_file(tmp_path / run / "checkpoint.safetensors") for run in ("one", "two")]
    for key in weights[0]:
        assert torch.allclose(weights[0][key].float(), weights[1][key].float(), rtol=1e-4, atol=1e-5), key
    assert read_json(tmp_path / "two" / "metrics.json").keys() == read_json(tmp_path / "one" / "metrics.json").keys()


@pytest.mark.parametrize("before, after", [(2, 1), (1, 2)])
def test_training_resumes_on_another_world_size(tmp_path, before, after):
    from safetensors.torch import load_file

    spawn(distributed_worker.train_worker, 1, str(tmp_path / "straight"), 0)
    spawn(distributed_worker.train_worker, before, str(tmp_path / "resumed"), 5)  # crashes at step 5
    assert not (tmp_path / "resumed" / "model.safetensors").exists()  # it did stop early
    spawn(distributed_worker.train_worker, after, str(tmp_path / "resumed"), 0)
    straight, resumed = (load_file(tmp_path / run / "checkpoint.safetensors") for run in ("straight", "resumed"))
    for key in straight:
        assert torch.allclose(straight[key], resumed[key], rtol=1e-5, atol=1e-6), key


def test_placement_gives_each_rank_its_own_gpu_and_refuses_shared_ones(monkeypatch):
    from geoprobe.distributed import World, world_from
    from geoprobe.errors import BadInput

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    for variable in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(variable, raising=False)
    # ranks started by hand have no LOCAL_RANK: each still gets its own GPU (rank modulo the GPUs)
    assert [world_from(r, 6).device("auto") for r in range(6)] == [f"cuda:{i}" for i in (0, 1, 2, 3, 0, 1)]
    # under torchrun the local rank picks the GPU (two nodes of two: global rank 3 is local rank 1)
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert world_from(connect=False).device("cuda") == "cuda:1"
    assert World(0, 1, 0).device("cuda:2") == "cuda:2"  # one process: the request as given
    with pytest.raises(BadInput, match="all 2 ranks on one GPU"):
        World(1, 2, 1).device("cuda:0")
    with pytest.raises(BadInput, match="each would do so"):
        World(1, 2, 1).device("auto", device_map="auto")
    with pytest.raises(BadInput, match="would ignore --device cuda:1"):
        World(0, 1, 0).device("cuda:1", device_map="auto")
    assert World(0, 1, 0).device("auto", device_map="auto") == "auto"
