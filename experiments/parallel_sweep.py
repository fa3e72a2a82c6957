"""The SmolLM2 sweep of `make results` (experiments/smollm2_results.py: SWEEP, seeds 0, 1, 2) with
its layers trained side by side: one `geoprobe sweep` per layer, each in its own copy of the
scanned run (a sweep holds its run's bridges folder), at most --jobs at a time, then the finished
bridges copied back into the run and one last `geoprobe sweep` over it, which finds every bridge
finished and only writes the verdict (sweep.json, sweep.csv, plots).

Meant for a GPU, which a single sweep leaves mostly idle (SmolLM2's bridges are small: a step is a
few milliseconds of kernels), and for a many-core CPU. Each bridge is the one the sequential sweep
trains: the same identity, settings and seed, its teacher states computed for its own layer
(the same forward), so on one device the rows are the sequential sweep's (tests/test_smollm2_results.py).

    python -m experiments.parallel_sweep --run runs/results/run --jobs 12 --device cuda --deadline 400

Resumable: a layer's finished bridges are copied back as its sweep ends (or at the deadline, when
the unfinished sweeps are stopped: they resume from their checkpoints on the next call, which
copies the run's layer folder into the part first).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from experiments.smollm2_results import SEEDS, SWEEP

LOCKS = ".geoprobe*.lock"  # holding()'s lock files (geoprobe.files.lock_name): never copied


def layer_folder(run: Path, layer: int) -> Path:
    return run / "bridges" / f"layer-{layer:02d}"


def part_of(run: Path, layer: int) -> Path:
    """A copy of the scanned run for one layer's sweep: its files hard-linked (read only: shards,
    ranking, manifest), its bridges folder holding that layer alone (copied: it is written)."""
    part = run.parent / "parts" / f"layer-{layer:02d}" / run.name
    part.mkdir(parents=True, exist_ok=True)
    for entry in run.iterdir():
        if entry.name in ("bridges", "sweep.json", "sweep.csv") or (part / entry.name).exists():
            continue
        shutil.copytree(entry, part / entry.name, copy_function=os.link) if entry.is_dir() else os.link(entry, part / entry.name)
    if layer_folder(run, layer).is_dir():
        shutil.copytree(layer_folder(run, layer), layer_folder(part, layer), dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns(LOCKS))
    return part


def copy_back(run: Path, part: Path, layer: int) -> None:
    if layer_folder(part, layer).is_dir():
        shutil.copytree(layer_folder(part, layer), layer_folder(run, layer), dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns(LOCKS))


def sweep(run: Path, layers: str, seeds: str, device: str, extra: list[str]) -> list[str]:
    flags = list(map(str, SWEEP))
    flags[flags.index("--layers") + 1] = layers
    return [sys.executable, "-m", "geoprobe", "-q", "sweep", "--run", str(run), *flags, "--seeds", seeds,
            "--device", device, *extra]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="a scanned run (make results' runs/results/run)")
    parser.add_argument("--layers", default=SWEEP[SWEEP.index("--layers") + 1])
    parser.add_argument("--seeds", default=SEEDS)
    parser.add_argument("--jobs", type=int, default=4, help="layer sweeps at a time")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--deadline", type=float, default=None, help="seconds; then the running sweeps stop")
    args, extra = parser.parse_known_args()
    from geoprobe.workflows.sweep import parse_seeds

    run, began = args.run.resolve(), time.perf_counter()
    if not (run / "ranking.csv").is_file():
        sys.exit(f"{run} has no finished scan (no ranking.csv)")
    waiting = sorted(parse_seeds(args.layers), reverse=True)  # the deepest (slowest) layers first
    running: dict[int, tuple[subprocess.Popen, Path]] = {}
    failed: list[int] = []
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    while waiting or running:
        late = args.deadline is not None and time.perf_counter() - began > args.deadline
        while waiting and len(running) < args.jobs and not late:
            layer = waiting.pop(0)
            part = part_of(run, layer)
            log = (part.parent / "sweep.log").open("a")
            running[layer] = (subprocess.Popen(sweep(part, str(layer), args.seeds, args.device, extra), env=env,
                                               stdout=log, stderr=subprocess.STDOUT), part)
            print(f"[run ] layer {layer}: {part}", flush=True)
        if late:
            waiting.clear()
            for process, _ in running.values():
                process.terminate()
        time.sleep(1)
        for layer, (process, part) in list(running.items()):
            if process.poll() is None:
                continue
            copy_back(run, part, layer)
            del running[layer]
            if process.returncode:
                failed.append(layer)
            print(f"[{'done' if not process.returncode else 'fail'}] layer {layer} after "
                  f"{time.perf_counter() - began:.0f} s (exit {process.returncode}; log {part.parent / 'sweep.log'})",
                  flush=True)
    if failed:
        sys.exit(f"layers {sorted(failed)} did not finish; run again to resume them")
    subprocess.run(sweep(run, args.layers, args.seeds, args.device, extra), env=env, check=True)
    print(f"[done] sweep of layers {args.layers} in {time.perf_counter() - began:.0f} s: {run / 'sweep.json'}")


if __name__ == "__main__":
    main()
