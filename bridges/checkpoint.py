"""A trained model's directory (a bridge, a DSL model, an embedding baseline): the one writer
and reader of its record.

    config.json        {"kind": its entry in bridges/kinds.py, "network": the network's config,
                        "training": its training settings, "budget": {steps, batch_size, seq_len},
                        "identity": what it was trained on}
    model.safetensors  the EMA weights (the best by the stopping split where one was kept): what
                       sampling and evaluation load
    metrics.json       written last: a directory holding it has finished
    curve.csv, plots/curve.png   the training curve

bridges/train.py keeps its resumable training state beside them. Records written before the
schema was shared (the network under the kind's name or "model", no "budget") are read as this
schema. Which kinds there are is bridges/kinds.py's to say, not this module's.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from geoprobe.errors import BadInput
from geoprobe.files import disk_full_message, is_disk_full, read_json, short, write_json_atomic

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
METRICS = "metrics.json"
def save_config(folder: Path, kind: str, network, training: dict, budget: dict, identity: dict) -> None:
    """config.json, written whole before any weight (so that a started directory always loads)."""
    write_json_atomic(Path(folder) / CONFIG, {"kind": kind, "network": asdict(network), "training": training,
                                              "budget": budget, "identity": identity})


def read_config(folder: Path, kind: str | None = None) -> dict:
    """A checkpoint directory's config.json in the one schema, or one line saying why it cannot be
    read (or, with `kind`, that it holds the other kind of model)."""
    path = Path(folder) / CONFIG
    record = read_json(path, f"{folder} is not a geoprobe checkpoint directory (no {CONFIG}: a DSL model, a bridge or a baseline)")
    if not isinstance(record, dict) or not isinstance(record.get("kind"), str):
        raise BadInput(f"{path} is not a geoprobe checkpoint config (no 'kind'); written by another tool or version")
    if kind is not None and record["kind"] != kind:
        raise BadInput(f"{folder} holds a {record['kind']!r} checkpoint, not a {kind!r} one")
    if "network" not in record:  # written before the schema was shared: under the kind's name or "model"
        record["network"] = record.pop(record["kind"], None) or record.pop("model", {})
    if "budget" not in record:
        record["budget"] = _old_budget(record)
    return record


def _old_budget(record: dict) -> dict:
    training = record.get("training") or {}
    loop = training.get("train", training)  # a DSL record nests its loop's settings
    return {"steps": loop.get("steps"), "batch_size": loop.get("batch_size"),
            "seq_len": training.get("seq_len") or record.get("identity", {}).get("seq_len")}


def build_network(config_class, record: dict, folder: Path, older: dict | None = None):
    """`config_class` from the record's network (over `older`: the defaults of records written
    before a field existed), or one line when the fields come from another version."""
    try:
        return config_class(**{**(older or {}), **record["network"]})
    except TypeError as exc:
        raise BadInput(f"{Path(folder) / CONFIG} was written by another version of geoprobe ({short(exc)})") from exc


def write_tensors(path: Path, tensors: dict, metadata: dict) -> None:
    """A safetensors file replaced whole (a reader or a resume never sees half of it); a full disk is one line."""
    from safetensors.torch import save_file

    tmp = path.with_name(f".{path.name}.tmp")
    try:
        save_file(tensors, tmp, metadata=metadata)
    except Exception as exc:
        tmp.unlink(missing_ok=True)
        if is_disk_full(exc):
            raise BadInput(disk_full_message(path, sum(t.numel() * t.element_size() for t in tensors.values()))) \
                from exc
        raise
    tmp.replace(path)


def save_weights(folder: Path, weights: dict, metadata: dict) -> None:
    """model.safetensors: the weights sampling and evaluation load."""
    write_tensors(Path(folder) / WEIGHTS, weights, metadata)


def load_weights(module, folder: Path) -> None:
    """The directory's model.safetensors into `module`, or one line: missing, truncated, or of another shape."""
    from safetensors.torch import load_file

    path = Path(folder) / WEIGHTS
    if not path.is_file():
        raise BadInput(f"{path.parent} has no {path.name}: training has not finished (rerun it to resume)")
    try:
        module.load_state_dict(load_file(path))
    except Exception as exc:
        raise BadInput(f"{path} is truncated, corrupt or from another version ({short(exc)})") from exc


def write_record(out: Path, metrics: dict, trained, title: str) -> None:
    """metrics.json, curve.csv (step, training loss, validation score where evaluated) and
    plots/curve.png (drawn by report/plots.py): the end of a trained model's directory."""
    from geoprobe.report.plots import curve_plot  # matplotlib: imported only when a record is written

    out = Path(out)
    scored = dict((int(s), v) for s, v in trained.val_curve)
    (out / "curve.csv").write_text("step,loss,val\n" + "".join(
        f"{s},{l:.6f},{'' if s + 1 not in scored else f'{scored[s + 1]:.6f}'}\n" for s, l in trained.curve))
    curve_plot(trained.curve, out / "plots" / "curve.png", f"{title}: stopped at step {trained.steps} "
               f"({trained.stop})", val_curve=trained.val_curve)
    write_json_atomic(out / METRICS, metrics)  # last: its presence means the record is whole


def training_tokens(folder: Path) -> tuple[int | None, int | None]:
    """(budget, used): the tokens a model was allowed (step cap x batch x sequence length) and
    those it trained on (steps run, from metrics.json: fewer when the plateau rule stopped it).
    (None, None) for a directory that is not a checkpoint (a causal LM, the AR ceiling)."""
    if not (Path(folder) / CONFIG).is_file():
        return None, None
    budget = read_config(folder)["budget"]
    if not all(budget.get(k) for k in ("steps", "batch_size", "seq_len")):
        return None, None
    per_step = int(budget["batch_size"]) * int(budget["seq_len"])
    metrics = Path(folder) / METRICS
    ran = read_json(metrics, "").get("steps_run") if metrics.is_file() else None
    return int(budget["steps"]) * per_step, (int(ran) * per_step if ran else None)
