"""`--log-to tensorboard` (geoprobe/tracking.py): every training command writes its training
loss, learning rate, rates and validation scores as TensorBoard event files, read back here
with the TFRecord framing and tensorboardX's Event protocol buffer (no TensorBoard needed)."""

from __future__ import annotations

import csv
import json
import math
import struct
from pathlib import Path

import pytest

from geoprobe.bridges.train import TrainConfig, lr_lambda
from tests.helpers import assert_one_line_error, copy_run, invoke


def scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] of every event file under `folder` (a TFRecord: length, its CRC,
    the record, its CRC)."""
    from tensorboardX.proto import event_pb2

    found: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(folder.glob("events.out.tfevents.*")):
        data, at = path.read_bytes(), 0
        while at < len(data):
            (length,) = struct.unpack("<Q", data[at:at + 8])
            event = event_pb2.Event.FromString(data[at + 12:at + 12 + length])
            at += 12 + length + 4
            for value in event.summary.value:
                found.setdefault(value.tag, []).append((event.step, value.simple_value))
    return found


def test_dsl_train_logs_every_step_and_evaluation_to_tensorboard(tmp_path, corpus_txt):
    out = tmp_path / "dsl"
    code, stdout, err = invoke("--format", "json", "dsl", "train", "--corpus", corpus_txt, "--tokenizer", "words",
                               "--steps", 12, "--batch-size", 4, "--seq-len", 16, "--d-model", 16, "--n-layers", 1,
                               "--warmup", 4, "--lr", "0.002", "--eval-every", 4, "--device", "cpu",
                               "--log-to", "tensorboard", "--out", out)
    assert code == 0, err
    logged = scalars(out / "tensorboard")
    curve = [(int(r["step"]), float(r["loss"])) for r in csv.DictReader(open(out / "curve.csv"))]
    assert [s for s, _ in logged["train/loss"]] == [s for s, _ in curve] == list(range(12))
    for (_, a), (_, b) in zip(logged["train/loss"], curve):
        assert a == pytest.approx(b, rel=1e-5)  # float32 in the event, 6 decimals in curve.csv
    schedule = lr_lambda(TrainConfig(steps=12, warmup=4, lr=0.002))
    assert [v for _, v in logged["train/lr"]] == pytest.approx([0.002 * schedule(s) for s in range(12)], rel=1e-6)
    metrics = json.loads(stdout)
    assert [(s, pytest.approx(v, rel=1e-6)) for s, v in metrics["val_curve"]] == logged["validation/score"]
    assert [s for s, _ in logged["train/tokens_per_second"]] == [10, 12]  # every LOG_EVERY steps and at the end
    rates = dict(logged["train/steps_per_second"])
    assert all(v > 0 and math.isfinite(v) for v in rates.values())
    assert dict(logged["train/tokens_per_second"])[12] == pytest.approx(rates[12] * 4 * 16, rel=1e-5)


def test_bridge_and_baseline_log_to_tensorboard_and_the_flag_is_not_part_of_a_run(tmp_path, scanned_run, corpus_txt):
    run = copy_run(scanned_run, tmp_path / "run")
    flags = ["--run", run, "--layer", "1", "--steps", 6, "--until", "steps", "--batch-size", 4, "--d-model", 32,
             "--n-layers", 1, "--device", "cpu"]
    code, stdout, err = invoke("--format", "json", "bridge", *flags, "--log-to", "tensorboard")
    assert code == 0, err
    folder = Path(json.loads(stdout)["dir"])
    assert [s for s, _ in scalars(folder / "tensorboard")["train/loss"]] == list(range(6))
    code, _, err = invoke("bridge", *flags)  # the same bridge without logging: finished, not another run
    assert code == 0, err
    code, _, err = invoke("baseline", "train", "sed", "--corpus", corpus_txt, "--tokenizer", "words", "--steps", 3,
                          "--batch-size", 4, "--seq-len", 16, "--d-model", 16, "--n-layers", 1, "--n-heads", 2,
                          "--device", "cpu", "--log-to", "tensorboard", "--out", tmp_path / "sed")
    assert code == 0, err
    assert [s for s, _ in scalars(tmp_path / "sed" / "tensorboard")["train/loss"]] == [0, 1, 2]


def test_a_resumed_run_purges_the_events_of_the_steps_it_repeats(tmp_path):
    """A run that crashed at step 10 had logged steps 0-9 (every LOG_EVERY = 10 steps) and saved
    its checkpoint at step 8; resumed there, it marks step 8 as a new start (TensorBoard's
    purge_step), so the events read as TensorBoard reads them hold each step once."""
    import torch
    from tensorboardX.proto import event_pb2

    from geoprobe.bridges.dsl import DSLConfig, DSLModel, DSLTrainSettings, dsl_objective
    from geoprobe.bridges.train import train
    from geoprobe.tracking import tracking

    data = torch.randint(0, 40, (48, 12), generator=torch.Generator().manual_seed(0))
    settings = DSLTrainSettings(seq_len=12, train=TrainConfig(steps=12, batch_size=4, save_every=8, precision="float32"))

    def session(stop_at: int):
        model = DSLModel(DSLConfig(vocab_size=40, d_tok=8, d_model=16, n_layers=1, n_heads=2), seed=0)
        loss_fn, _ = dsl_objective(model, data, settings, torch.device("cpu"))

        def crashing(m, generator, shard):
            if generator.initial_seed() == stop_at:  # step_generator(seed 0, step) = step
                raise RuntimeError("simulated crash")
            return loss_fn(m, generator, shard)

        with tracking("tensorboard"):
            train(model, crashing, settings.train, out=tmp_path, device=torch.device("cpu"))

    with pytest.raises(RuntimeError, match="simulated crash"):
        session(10)
    session(-1)
    kept: dict[int, float] = {}
    for path in sorted((tmp_path / "tensorboard").glob("events.out.tfevents.*")):  # in the order written
        data_, at = path.read_bytes(), 0
        while at < len(data_):
            (length,) = struct.unpack("<Q", data_[at:at + 8])
            event = event_pb2.Event.FromString(data_[at + 12:at + 12 + length])
            at += 12 + length + 4
            if event.HasField("session_log") and event.session_log.status == event_pb2.SessionLog.START:
                kept = {s: v for s, v in kept.items() if s < event.step}  # TensorBoard's purge
            for value in event.summary.value:
                if value.tag == "train/loss":
                    assert event.step not in kept, event.step  # never logged twice after the purge
                    kept[event.step] = value.simple_value
    assert sorted(kept) == list(range(12))
    raw = [s for s, _ in scalars(tmp_path / "tensorboard")["train/loss"]]
    assert raw.count(8) == raw.count(9) == 2  # the crashed session's steps 8 and 9 were in the files


def test_an_unknown_log_destination_is_refused_before_the_backbone_loads(tmp_path, scanned_run):
    code, _, err = invoke("bridge", "--run", scanned_run, "--layer", "1", "--out", tmp_path / "b", "--log-to", "mlflow")
    assert_one_line_error(code, err, 2, "--log-to must be one of none, tensorboard, got 'mlflow'")
