"""The experiments' record keeping: finished bridges, sample sets and models copied into tracked
folders (a few KB each, no weights, no text), copied back into a fresh run, and read while a run
goes on.

A record is whole or absent: each file is written beside its target and renamed into place, and
a bridge's metrics.json is copied last. bench/bridge_design.py and experiments/smollm2_results.py
both keep their records here; nothing here imports either of them.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "experiments" / "records"
SMOLLM2 = RECORDS / "smollm2"  # the regression sweep's finished bridges (make results)
BRIDGE_DESIGN = RECORDS / "bridge-design"  # the design study's finished variants (bench/bridge_design.py)
# SmolLM2's --generation: each finished sample set's meta row and compare row, and the
# recipe's models' config, curve and metrics (numbers and names: no text, no weights)
GENERATION = RECORDS / "smollm2-generation"
# per bridge, metrics last (a record is whole when metrics.json is there); the layer's
# controls.json beside them; network.json (the parameter count) only bench/bridge_design.py writes
RECORDED = ("config.json", "curve.csv", "network.json", "metrics.json")


def log(message: str) -> None:
    """One line of a long run's log, with the time of day."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def copy_whole(source: Path, target: Path) -> None:
    """Copy `source` to `target`, whole or not at all: a kill mid-copy leaves no truncated file
    (the partial file is this process's own: two runs may record the same folder at once)."""
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    shutil.copyfile(source, partial)
    os.replace(partial, target)


def record(run: Path, into: Path) -> int:
    """Copy each finished bridge of `run` (and its layer's controls) under `into`.

    Args:
        run: a run folder; its bridges/layer-NN/NAME folders with a metrics.json are finished.
        into: the record folder; it keeps run/bridges' layout.

    Returns:
        How many bridges were new.
    """
    new = 0
    for metrics in sorted((run / "bridges").glob("layer-*/*/metrics.json")):
        bridge = metrics.parent
        target = into / bridge.relative_to(run)
        if (target / "metrics.json").is_file():
            continue
        target.mkdir(parents=True, exist_ok=True)
        for name in RECORDED:
            if (bridge / name).is_file():
                copy_whole(bridge / name, target / name)
        if (bridge.parent / "controls.json").is_file():
            copy_whole(bridge.parent / "controls.json", target.parent / "controls.json")
        print(f"[done] {finished_line(metrics)}", flush=True)
        new += 1
    return new


def copy_folders(pairs: list[tuple[Path, Path]], names: tuple[str, ...]) -> int:
    """Copy each (source, target) folder's files `names` whole, the last one last, where the source
    holds names[-1] and the target does not (a folder is finished, and its copy whole, when that
    file is there). Returns how many folders were copied."""
    copied = 0
    for source, target in pairs:
        if not (source / names[-1]).is_file() or (target / names[-1]).is_file():
            continue
        target.mkdir(parents=True, exist_ok=True)
        for name in names:
            if (source / name).is_file():
                copy_whole(source / name, target / name)
        copied += 1
    return copied


def keep(out: Path, into: Path, folders: list[Path], names: tuple[str, ...]) -> int:
    """Copy each finished folder under `out` into `into`, at its path relative to `out`
    (`copy_folders`). Returns how many folders were new."""
    return copy_folders([(folder, into / folder.relative_to(out)) for folder in folders], names)


def bring_back(into: Path, out: Path, folders: list[Path], names: tuple[str, ...]) -> int:
    """Copy the recorded folders among `folders` (under `out`) back from `into` where `out` lacks
    them (`keep`'s layout). Returns how many were brought back."""
    return copy_folders([(into / folder.relative_to(out), folder) for folder in folders], names)


def finished_line(metrics: Path) -> str:
    """One log line for a finished bridge: how it stopped, its score beside its lookup, its time."""
    known = {k: v for k, v in json.loads(metrics.read_text()).items() if v is not None}
    facts = []
    if "stop" in known and "steps_run" in known:
        facts.append(f"{known['stop']} at step {known['steps_run']:,}")
    if "nmse_dim" in known:
        facts.append(f"validation nmse_dim {known['nmse_dim']:.4f}"
                     + (f" (lookup {known['control_lookup_nmse_dim']:.4f})" if "control_lookup_nmse_dim" in known else ""))
    if "train_seconds" in known:
        facts.append(f"{known['train_seconds']:,.0f} s of training")
    return "/".join(metrics.parent.parts[-2:]) + ": " + ", ".join(facts)


def restore(run: Path, into: Path, only: str = "*") -> int:
    """Copy the recorded bridges back into a run that lacks them.

    Args:
        run: the run folder; a bridge it has (finished, or resuming from a checkpoint) is kept.
        into: the record folder.
        only: restore only the bridge folders of this name (e.g. "ceiling").

    Returns:
        How many bridges were restored.
    """
    restored = 0
    for metrics in sorted(into.glob(f"bridges/layer-*/{only}/metrics.json")):
        bridge = run / metrics.parent.relative_to(into)
        if (bridge / "metrics.json").is_file() or (bridge / "config.json").is_file():
            continue
        bridge.mkdir(parents=True, exist_ok=True)  # may hold a killed run's lock alone
        for name in RECORDED:  # metrics last
            if (metrics.parent / name).is_file():
                copy_whole(metrics.parent / name, bridge / name)
        controls = metrics.parent.parent / "controls.json"
        if controls.is_file() and not (bridge.parent / "controls.json").is_file():
            copy_whole(controls, bridge.parent / "controls.json")
        restored += 1
    return restored


def add_timings(path: Path, ran: dict) -> dict:
    """The timings file with `ran` merged in, read and written whole under a lock.

    Two invocations of one experiment may write it at once; neither loses the other's steps.
    """
    import fcntl

    from geoprobe.files import write_json_atomic

    with open(path.with_name(f".{path.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        log = json.loads(path.read_text()) if path.is_file() else {}
        log.update(ran)
        write_json_atomic(path, log)
    return log


def progress_of(folders: list[tuple[str, Path]], cap: int | None = None) -> list[str]:
    """Where a list of bridge or generator folders stands, read while they train.

    Args:
        folders: (name, folder) pairs, in the order they train.
        cap: the step cap; when given, a training folder's line adds the minutes left to it.

    Returns:
        One line per finished or training folder, then the count of finished and waiting ones.
    """
    lines, waiting, finished = [], [], 0
    for name, folder in folders:
        if (folder / "metrics.json").is_file():
            finished += 1
            m = json.loads((folder / "metrics.json").read_text())
            if "nmse_dim" in m:  # a bridge
                lines.append(f"{name}: {m['stop']} at step {m['steps_run']:,}, validation nmse_dim {m['nmse_dim']:.4f}")
            else:  # a generator: its own metrics
                lines.append(f"{name}: finished")
        elif (folder / "checkpoint.safetensors").is_file():
            lines.append(training_line(name, folder, cap))
        else:
            waiting.append(name)
    lines.append(f"{finished} of {len(folders)} finished" + (f"; {len(waiting)} waiting, next {waiting[0].strip()}"
                                                          if waiting else ""))
    return lines


def training_line(name: str, folder: Path, cap: int | None) -> str:
    """One line for a folder still training, from its checkpoint's metadata."""
    from safetensors import safe_open

    with safe_open(folder / "checkpoint.safetensors", "pt") as handle:
        meta = handle.metadata() or {}
    curve = json.loads(meta.get("val_curve") or "[]")
    score = f", stopping split {curve[-1][1]:.4f}" if curve else ""
    step, seconds = int(meta.get("step", 0)), float(meta.get("seconds") or 0)
    if meta.get("stop"):  # stopped, its last validation and metrics still to come
        return f"{name}: stopped ({meta['stop']}) at step {step:,}{score}, finishing"
    # the cap's end at the rate so far (a plateau rule may stop it sooner; a resume that lost its
    # clock makes the rate look faster than it is)
    left = f", about {(cap - step) * seconds / step / 60:.0f} min to its cap at this rate" if cap and step else ""
    return f"{name}: training, step {step:,}{score}, {seconds / 60:.0f} min so far{left}"
