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

Resumable: a layer's bridges folder is copied back into the run as its sweep ends, is stopped at the
deadline, or is stopped when this script is interrupted (a stopped bridge keeps its last
checkpoint); the next call copies it into the part again and the part's sweep resumes. A deadline
that passes with layers still waiting or stopped ends the script with an error and no verdict.
The run is locked while the parts run, so no other sweep writes it meanwhile.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from experiments.smollm2_results import SEEDS, SWEEP, flag
from geoprobe.files import holding, is_lock
from geoprobe.workflows.sweep import bridge_dir


def not_copied(folder: str, names: list[str]) -> list[str]:
    """holding()'s lock files: a copy must not carry another process's lock."""
    return [name for name in names if is_lock(Path(folder) / name)]


def part_of(run: Path, layer: int) -> Path:
    """A copy of the scanned run for one layer's sweep: its read-only files hard-linked (shards,
    ranking, manifest), its bridges folder holding that layer alone, copied (it is written); no
    plots (a part's sweep rewrites them, which through a link would rewrite the run's)."""
    part = run.parent / "parts" / f"layer-{layer:02d}" / run.name
    part.mkdir(parents=True, exist_ok=True)
    for entry in run.iterdir():
        if entry.name in ("bridges", "plots", "sweep.json", "sweep.csv") or (part / entry.name).exists():
            continue
        shutil.copytree(entry, part / entry.name, copy_function=os.link) if entry.is_dir() else os.link(entry, part / entry.name)
    copy_layer(run, part, layer)
    return part


def copy_layer(source: Path, target: Path, layer: int) -> None:
    """A layer's bridges folder (controls, every seed's and the ceiling's bridge) from one run into another."""
    folder = bridge_dir(source, layer).parent  # the sweep's own naming of a layer's folder
    if folder.is_dir():
        shutil.copytree(folder, target / "bridges" / folder.name, dirs_exist_ok=True, ignore=not_copied)


def sweep(run: Path, layers: str, seeds: str, device: str, extra: list[str]) -> list[str]:
    flags = list(map(str, SWEEP))
    flags[flags.index("--layers") + 1] = layers
    return [sys.executable, "-m", "geoprobe", "-q", "sweep", "--run", str(run), *flags, "--seeds", seeds,
            "--device", device, *extra]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="a scanned run (make results' runs/results/run)")
    parser.add_argument("--layers", default=flag("--layers"))
    parser.add_argument("--seeds", default=SEEDS)
    parser.add_argument("--jobs", type=int, default=4, help="layer sweeps at a time")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--deadline", type=float, default=None, help="seconds; then the running sweeps stop and "
                        "no new one starts (run again to resume)")
    args, extra = parser.parse_known_args()
    from geoprobe.backbone import parse_layers

    run, began = args.run.resolve(), time.perf_counter()
    if not (run / "ranking.csv").is_file():
        sys.exit(f"{run} has no finished scan (no ranking.csv)")
    waiting = sorted(parse_layers(args.layers, 10 ** 6), reverse=True)  # the deepest (slowest) layers first
    running: dict[int, tuple[subprocess.Popen, Path]] = {}
    unfinished: list[int] = []
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}

    def finish(layer: int, process: subprocess.Popen, part: Path) -> None:
        copy_layer(part, run, layer)
        if process.returncode:
            unfinished.append(layer)
        print(f"[{'fail' if process.returncode else 'done'}] layer {layer} after {time.perf_counter() - began:.0f} s "
              f"(exit {process.returncode}; log {part.parent / 'sweep.log'})", flush=True)

    with holding(run / "bridges", "parallel_sweep"):  # no sweep of the run beside the parts' copies back
        try:
            while waiting or running:
                late = args.deadline is not None and time.perf_counter() - began > args.deadline
                if late:
                    unfinished += waiting
                    waiting.clear()
                    for process, _ in running.values():
                        process.terminate()
                while waiting and len(running) < args.jobs:
                    layer = waiting.pop(0)
                    part = part_of(run, layer)
                    with (part.parent / "sweep.log").open("a") as log:
                        running[layer] = (subprocess.Popen(sweep(part, str(layer), args.seeds, args.device, extra),
                                                           env=env, stdout=log, stderr=subprocess.STDOUT), part)
                    print(f"[run ] layer {layer}: {part}", flush=True)
                time.sleep(1)
                for layer, (process, part) in list(running.items()):
                    if process.poll() is not None:
                        del running[layer]
                        finish(layer, process, part)
        finally:  # interrupted: stop the parts (each resumes from its checkpoints) and keep what they finished
            for layer, (process, part) in running.items():
                process.terminate()
                try:
                    process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
                finish(layer, process, part)
    if unfinished:
        sys.exit(f"layers {sorted(set(unfinished))} did not finish; run again to resume them")
    subprocess.run(sweep(run, args.layers, args.seeds, args.device, extra), env=env, check=True)
    print(f"[done] sweep of layers {args.layers} in {time.perf_counter() - began:.0f} s: {run / 'sweep.json'}")


if __name__ == "__main__":
    main()
