"""Faults that really happen: kill -9 in every long command, two writers on one directory, a
full disk, shards and checkpoints damaged after they were written. Each test produces the fault
for real (a SIGKILL, a second process, a small tmpfs, flipped bytes) and checks that nothing is
lost and nothing is computed on bad data."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from safetensors.torch import load_file

from geoprobe.files import LOCK
from geoprobe.store import RunReader, read_manifest
from tests.helpers import (ONE_THREAD, SCAN, all_rows, assert_one_line_error, copy_run, invoke, read_json, run_cli,
                           write_corpus)

# a kill test's uninterrupted reference (started first) runs beside its victim, both ONE_THREAD


def start(args) -> subprocess.Popen:
    return run_cli("--quiet", *args, background=True, env=ONE_THREAD)


def finish(args) -> subprocess.CompletedProcess:
    return run_cli("--quiet", *args, env=ONE_THREAD)


def reference(args) -> subprocess.Popen:
    """The uninterrupted run, started now in the background; `finished(reference)` waits for it."""
    return start(args)


def finished(process: subprocess.Popen) -> None:
    assert process.wait(timeout=600) == 0, process.stderr.read()


def kill_when(victim: subprocess.Popen, ready, timeout: float = 300) -> None:
    """SIGKILL `victim` as soon as `ready()` holds (fails if it finished first)."""
    deadline = time.time() + timeout
    while not ready():
        assert victim.poll() is None, f"finished before it could be killed: {victim.stderr.read()}"
        assert time.time() < deadline, "never reached the point to kill it"
        time.sleep(0.02)
    victim.send_signal(signal.SIGKILL)
    victim.wait()


def tensors(path: Path) -> dict:
    return load_file(path)


def same_weights(a: Path, b: Path) -> bool:
    x, y = tensors(a), tensors(b)
    return x.keys() == y.keys() and all((x[k] == y[k]).all() for k in x)


RESULT_KEYS = ("nmse", "nmse_dim", "delta_ce", "final_train_loss", "steps_run", "stop", "val_curve",
               "val_mdlm_elbo_nats_per_token")


def results(folder: Path) -> dict:
    metrics = read_json(folder / "metrics.json")
    return {k: metrics[k] for k in RESULT_KEYS if k in metrics}


@pytest.fixture(scope="module")
def scanned(tmp_path_factory, scanned_run):
    """The shared scanned run, copied: the faults below read it and write beside it."""
    return copy_run(scanned_run, tmp_path_factory.mktemp("faults") / "run")


# the extraction flags the scanned run was made with: rerunning them resumes that run
EXTRACT = ["--tokens", SCAN["tokens"], "--seq-len", SCAN["seq_len"]]
BRIDGE = ["--steps", 300, "--until", "steps", "--batch-size", 4, "--seq-len", 32, "--d-model", 32, "--n-layers", 1,
          "--device", "cpu"]


# kill -9 ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_kill_9_during_bridge_then_rerun_equals_an_uninterrupted_run(scanned, tmp_path):
    args = ["bridge", "--run", scanned, "--layer", 1, *BRIDGE]
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    uninterrupted = reference([*args, "--out", clean])
    victim = start([*args, "--out", killed])
    checkpoint = killed / "bridges" / "layer-01" / "seed-0" / "checkpoint.safetensors"
    kill_when(victim, checkpoint.is_file)  # after step 100 of 300: the rerun resumes mid-training
    assert not (killed / "bridges" / "layer-01" / "seed-0" / "metrics.json").exists()
    done = finish([*args, "--out", killed])
    assert done.returncode == 0, done.stderr
    finished(uninterrupted)
    a, b = killed / "bridges" / "layer-01" / "seed-0", clean / "bridges" / "layer-01" / "seed-0"
    assert same_weights(a / "model.safetensors", b / "model.safetensors")
    assert results(a) == results(b) and results(a)["steps_run"] == 300
    assert not (a / LOCK).exists()


@pytest.mark.slow
def test_kill_9_between_and_inside_sweep_layers_resumes_and_keeps_finished_ones(scanned, tmp_path):
    killed, clean = shutil.copytree(scanned, tmp_path / "killed"), shutil.copytree(scanned, tmp_path / "clean")
    args = ["sweep", "--layers", "0-2", *BRIDGE]
    first = killed / "bridges" / "layer-00" / "seed-0" / "metrics.json"
    uninterrupted = reference([*args, "--run", clean])
    # between layers: the moment layer 0's record is whole, before layer 1 has a checkpoint
    victim = start([*args, "--run", killed])
    kill_when(victim, first.is_file)
    assert not (killed / "bridges" / "layer-01" / "seed-0" / "checkpoint.safetensors").exists()
    kept = first.stat().st_mtime_ns
    # inside a layer: the rerun is killed again, part-way through layer 1
    victim = start([*args, "--run", killed])
    kill_when(victim, (killed / "bridges" / "layer-01" / "seed-0" / "checkpoint.safetensors").is_file)
    assert not (killed / "sweep.csv").exists()
    done = finish([*args, "--run", killed])
    assert done.returncode == 0, done.stderr
    finished(uninterrupted)
    assert first.stat().st_mtime_ns == kept  # the finished layer was neither retrained nor revalidated
    for layer in range(3):
        a, b = (root / "bridges" / f"layer-{layer:02d}" / "seed-0" for root in (killed, clean))
        assert same_weights(a / "model.safetensors", b / "model.safetensors"), layer
        assert results(a) == results(b), layer
    assert (killed / "sweep.csv").read_text() == (clean / "sweep.csv").read_text()


@pytest.mark.slow
def test_kill_9_during_dsl_train_then_rerun_equals_an_uninterrupted_run(tmp_path, corpus_txt):
    args = ["dsl", "train", "--corpus", corpus_txt, "--tokenizer", "words", "--steps", 600, "--batch-size", 8,
            "--seq-len", 32, "--warmup", 10, "--d-model", 32, "--n-layers", 1, "--d-tok", 16, "--device", "cpu"]
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    uninterrupted = reference([*args, "--out", clean])
    victim = start([*args, "--out", killed])
    kill_when(victim, (killed / "checkpoint.safetensors").is_file)  # after step 200 of 600
    done = finish([*args, "--out", killed])
    assert done.returncode == 0, done.stderr
    finished(uninterrupted)
    assert same_weights(killed / "model.safetensors", clean / "model.safetensors")
    assert results(killed) == results(clean) and results(killed)["steps_run"] == 600


# one writer per directory ----------------------------------------------------------------------------


@pytest.mark.slow
def test_ctrl_c_during_dsl_train_exits_130_with_one_line_and_keeps_its_checkpoint(tmp_path):
    """A real SIGINT (what Ctrl-C sends) to `dsl train` on the testbed's corpus: exit 130 (so a
    script's `&&` stops there), the one line saying how to resume, and its checkpoint kept."""
    from geoprobe.testbed import CORPUS

    out = tmp_path / "dsl"
    args = ["dsl", "train", "--corpus", CORPUS, "--tokenizer", "words", "--steps", 100_000, "--batch-size", 2,
            "--seq-len", 16, "--d-model", 16, "--n-layers", 1, "--n-heads", 2, "--d-tok", 8, "--save-every", 5,
            "--device", "cpu", "--out", out]
    victim = start(args)
    deadline = time.time() + 300
    while not (out / "checkpoint.safetensors").is_file():
        assert victim.poll() is None, victim.stderr.read()
        assert time.time() < deadline, "never wrote a checkpoint"
        time.sleep(0.02)
    victim.send_signal(signal.SIGINT)
    assert victim.wait(timeout=120) == 130
    assert_one_line_error(130, victim.stderr.read(), 130, "interrupted; what was saved is kept")
    from safetensors import safe_open

    with safe_open(out / "checkpoint.safetensors", "pt") as handle:
        saved = int(handle.metadata()["step"])
    assert saved >= 5 and not (out / "metrics.json").exists()  # stopped mid-run, its checkpoint kept

@pytest.mark.slow
def test_a_second_extract_on_the_same_out_is_refused_at_once_naming_the_holder(tmp_path, tiny_models):
    corpus = write_corpus(tmp_path / "big.txt", n_docs=300, seed=3)
    args = ["extract", tiny_models("llama"), "--corpus", corpus, "--tokens", 6000, "--seq-len", 64,
            "--shard-rows", 256, "--batch-size", 1, "--device", "cpu", "--out", tmp_path / "r"]
    first = start(args)
    lock = tmp_path / "r" / LOCK
    deadline = time.time() + 120
    while not lock.is_file() and time.time() < deadline:
        time.sleep(0.02)
    # the first run is paused while the second starts: a tiny extract can finish within the seconds
    # a second interpreter takes to start, and the test would then race it (it did, twice)
    os.kill(first.pid, signal.SIGSTOP)
    try:
        began = time.perf_counter()
        second = finish(args)
    finally:
        os.kill(first.pid, signal.SIGCONT)
    assert second.returncode == 2 and second.stderr.count("\n") == 1, second.stderr
    assert f"pid {first.pid}" in second.stderr and "'geoprobe extract'" in second.stderr
    assert time.perf_counter() - began < 30  # refused before loading anything
    assert first.wait(timeout=300) == 0, first.stderr.read()
    assert not lock.exists()
    manifest = read_manifest(tmp_path / "r")
    assert manifest["status"] == "complete" and manifest["rows"] == 6000
    RunReader(tmp_path / "r", verify=True)  # every shard whole: no interleaved writer


@pytest.mark.parametrize("command", [
    ["extract", "{model}", "--corpus", "{corpus}", "--tokens", 100, "--out", "{out}"],
    ["scan", "{model}", "--corpus", "{corpus}", "--tokens", 100, "--anchors", 16, "--k", 4, "--out", "{out}"],
    ["bridge", "--model", "{model}", "--corpus", "{corpus}", "--layer", 1, "--out", "{root}"],
    ["dsl", "train", "--corpus", "{corpus}", "--tokenizer", "words", "--out", "{out}"],
], ids=["extract", "scan", "bridge", "dsl-train"])
def test_every_writer_is_refused_on_a_locked_directory(command, tmp_path, tiny_models, corpus_txt):
    out = tmp_path / "out"
    held = out / "bridges" / "layer-01" / "seed-0" if command[0] == "bridge" else out
    with held_by_another_process(held) as holder:
        argv = [str(a).format(model=tiny_models("llama"), corpus=corpus_txt, out=out, root=out) for a in command]
        code, _, err = invoke(*argv, "--device", "cpu")
        assert_one_line_error(code, err, 2, f"is in use by 'a test holding the directory' (pid {holder.pid}")
    assert not any(out.rglob("*.safetensors")) and not (out / "manifest.json").exists()


@pytest.mark.parametrize("command", [["rank", "{run}"], ["report", "{run}"], ["demo", "--tiny", "--out", "{run}"]],
                         ids=["rank", "report", "demo"])
def test_the_commands_that_rewrite_a_run_are_refused_on_a_locked_one(command, scanned_run, tmp_path):
    """rank, report and demo hold the directory they write, as the training commands do: a second
    writer is refused in one line and the first one's files stay as they were."""
    run = copy_run(scanned_run, tmp_path / "run")
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}  # the killed holder's lock is left out
    with held_by_another_process(run) as holder:
        code, _, err = invoke(*[str(a).format(run=run) for a in command])
        assert_one_line_error(code, err, 2, f"is in use by 'a test holding the directory' (pid {holder.pid}")
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != LOCK} == before


@contextlib.contextmanager
def held_by_another_process(directory: Path):
    """`directory` locked by a second process (the lock is re-entrant within one) until the block ends."""
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from geoprobe.files import acquire; "
                               "acquire(sys.argv[1], 'a test holding the directory'); time.sleep(600)",
                               str(directory)])
    try:
        deadline = time.time() + 60
        while not (directory / LOCK).is_file():
            assert time.time() < deadline and holder.poll() is None
            time.sleep(0.02)
        yield holder
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.slow
def test_a_stale_lock_of_a_killed_process_is_taken_over(tmp_path, tiny_models, corpus_txt):
    dead = subprocess.Popen(["sleep", "60"])
    dead.kill()
    dead.wait()
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / LOCK).write_text(json.dumps({"pid": dead.pid, "host": os.uname().nodename,
                                                   "command": "geoprobe extract"}))
    done = finish(["extract", tiny_models("llama"), "--corpus", corpus_txt, "--tokens", 100, "--device", "cpu",
                   "--out", tmp_path / "r"])
    assert done.returncode == 0, done.stderr
    assert read_manifest(tmp_path / "r")["status"] == "complete" and not (tmp_path / "r" / LOCK).exists()


# a full disk -------------------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs (root can mount one; elsewhere every write past 1 MiB raises ENOSPC) and a
    function that frees space (grows it)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
                             capture_output=True).returncode == 0
    if mounted:
        yield mount, lambda: subprocess.run(["mount", "-o", "remount,size=64m", str(mount)], check=True)
        subprocess.run(["umount", "-l", str(mount)])
        return
    budget = {"bytes": 1 << 20}
    real_write = pq.write_table

    def write_table(table, where, **kw):  # the write a full disk would refuse
        real_write(table, where, **kw)
        used = sum(p.stat().st_size for p in mount.rglob("*") if p.is_file())
        if used > budget["bytes"]:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(where))

    mp = pytest.MonkeyPatch()
    mp.setattr("geoprobe.store.pq.write_table", write_table)
    yield mount, lambda: budget.update(bytes=1 << 40)
    mp.undo()


def test_disk_full_while_writing_shards_then_resume_after_freeing_space(small_disk, tmp_path, tiny_models):
    mount, free_space = small_disk
    corpus = write_corpus(tmp_path / "big.txt", n_docs=300, seed=3)
    args = ["extract", tiny_models("llama"), "--corpus", corpus, "--tokens", 6000, "--seq-len", 64,
            "--shard-rows", 256, "--device", "cpu"]
    code, _, err = invoke(*args, "--out", mount / "r")
    assert_one_line_error(code, err, 2, "disk full while writing")
    assert "the run still needs about" in err
    manifest = read_manifest(mount / "r")
    assert manifest["status"] != "complete" and manifest["shards"]
    RunReader(mount / "r", verify=True)  # the manifest lists only whole shards
    assert not list((mount / "r" / "hidden").glob(".*.tmp"))  # no partial shard left holding space
    free_space()
    assert invoke(*args, "--out", mount / "r")[0] == 0
    assert invoke(*args, "--out", tmp_path / "clean")[0] == 0
    assert all_rows(mount / "r").equals(all_rows(tmp_path / "clean"))


def test_disk_full_while_writing_a_checkpoint_is_one_line(tmp_path, corpus_txt, monkeypatch):
    mount = tmp_path / "disk"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)]).returncode:
        def full(tensors, path, **kw):  # where no small filesystem can be mounted: the write a full disk refuses
            Path(path).write_bytes(b"part of a checkpoint")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

        monkeypatch.setattr("safetensors.torch.save_file", full)  # looked up by write_tensors when it writes
    try:
        code, _, err = invoke("dsl", "train", "--corpus", corpus_txt, "--tokenizer", "words", "--steps", 4,
                              "--batch-size", 4, "--seq-len", 32, "--d-model", 32, "--n-layers", 1, "--device", "cpu",
                              "--out", mount / "dsl")
        assert_one_line_error(code, err, 2, "disk full while writing")
        assert not list((mount / "dsl").glob(".*.tmp"))
    finally:
        subprocess.run(["umount", "-l", str(mount)])


# damaged data ------------------------------------------------------------------------------------------


def damage(path: Path, how: str) -> None:
    if how == "deleted":
        path.unlink()
    elif how == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    else:  # one flipped byte inside a data page: same size, same footer
        data = bytearray(path.read_bytes())
        data[len(data) // 3] ^= 0xFF
        path.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["flipped", "truncated", "deleted"])
def test_a_damaged_shard_is_never_computed_on_and_extract_rewrites_it(how, scanned, tmp_path, tiny_models,
                                                                       corpus_txt):
    run = shutil.copytree(scanned, tmp_path / "run")
    (run / "geometry.json").unlink()
    shard = run / read_manifest(run)["shards"][0]["file"]
    damage(shard, how)
    code, _, err = invoke("geometry", run, "--anchors", 64, "--k", 8, "--pairs", 256, "--device", "cpu")
    assert_one_line_error(code, err, 2, f"shard {shard}")
    assert not (run / "geometry.json").exists()
    with pytest.raises(Exception, match="shard .*part-00000"):
        reader = RunReader(run)
        for layer in reader.layers:
            reader.read_layer(layer)
    if how != "flipped":  # the bridge checks sizes and footers of the run it trusts
        code, _, err = invoke("bridge", "--run", run, "--layer", 1, *BRIDGE)
        assert_one_line_error(code, err, 2, f"shard {shard}")
    # the message's advice: delete it and rerun the extraction, which re-extracts exactly that shard
    shard.unlink(missing_ok=True)
    manifest = read_manifest(scanned)
    code, _, err = invoke("extract", tiny_models("llama"), "--corpus", corpus_txt, *EXTRACT, "--out", run,
                          "--device", "cpu")
    assert code == 0 and "re-extracting 1 missing or damaged shard" in err, err
    assert [s["sha256"] for s in read_manifest(run)["shards"]] == [s["sha256"] for s in manifest["shards"]]


def test_a_changed_shard_is_rewritten_when_extraction_resumes(scanned, tmp_path, tiny_models, corpus_txt):
    run = shutil.copytree(scanned, tmp_path / "run")
    damage(run / read_manifest(run)["shards"][0]["file"], "flipped")
    code, _, err = invoke("extract", tiny_models("llama"), "--corpus", corpus_txt, *EXTRACT, "--out", run,
                          "--device", "cpu")
    assert code == 0 and "re-extracting 1" in err, err
    assert all_rows(run).equals(all_rows(scanned))


@pytest.mark.parametrize("target", ["checkpoint.safetensors", "config.json", "model.safetensors"])
def test_a_truncated_checkpoint_or_config_is_one_line(target, tmp_path, corpus_txt):
    args = ["dsl", "train", "--corpus", corpus_txt, "--tokenizer", "words", "--steps", 4, "--batch-size", 4,
            "--seq-len", 32, "--d-model", 32, "--n-layers", 1, "--device", "cpu", "--out", tmp_path / "dsl"]
    assert invoke(*args)[0] == 0
    damage(tmp_path / "dsl" / target, "truncated")
    code, _, err = invoke("sample", "--model", tmp_path / "dsl", "--num", 1, "--length", 8,
                          "--device", "cpu") if target == "model.safetensors" else invoke(*args)
    assert_one_line_error(code, err, 2, "truncated")


def test_a_config_from_another_version_is_one_line(tmp_path, corpus_txt):
    args = ["dsl", "train", "--corpus", corpus_txt, "--tokenizer", "words", "--steps", 4, "--batch-size", 4,
            "--seq-len", 32, "--d-model", 32, "--n-layers", 1, "--device", "cpu", "--out", tmp_path / "dsl"]
    assert invoke(*args)[0] == 0
    config = read_json(tmp_path / "dsl" / "config.json")
    config["network"]["attention_kind"] = "linear"  # a field this version does not know
    (tmp_path / "dsl" / "config.json").write_text(json.dumps(config))
    code, _, err = invoke("sample", "--model", tmp_path / "dsl", "--num", 1, "--length", 8, "--device", "cpu")
    assert_one_line_error(code, err, 2, "another version")


def test_a_lock_is_re_entrant_however_the_folder_is_spelled(tmp_path, monkeypatch):
    """One process holding runs/x holds /abs/runs/x too: a nested writer spelling it otherwise is not refused."""
    from geoprobe.files import holding

    monkeypatch.chdir(tmp_path)
    with holding(Path("x"), "outer"):
        with holding(tmp_path / "x", "inner"):
            assert (tmp_path / "x" / LOCK).is_file()
        assert (tmp_path / "x" / LOCK).is_file()  # the outer hold is still on
    assert not (tmp_path / "x").exists()  # created by the hold, left empty: removed with it
