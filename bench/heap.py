"""jemalloc keeping its pages (experiments/keep-pages, which `make results`, `results-baselines` and
`results-testbed` run under where Debian's libjemalloc2 is installed) against glibc as `import
geoprobe` sets it (freed blocks of up to 256 MB kept: bench/cpu_allocator.py), side by side in one
run: the
DSL-from-SmolLM2 training step of bench/dsl_step.py (or, with --workload bridge, the bridge step of
bench/bridge_step.py), in child processes alternately with and
without the preload, the faster of two runs each; seconds a step, kernel seconds a step and minor
page faults a step and peak memory (getrusage), and whether the two give the same parameters (a
SHA-256 of them). Threads: torch's default, or OMP_NUM_THREADS.

    python bench/heap.py                          # SmolLM2, 8 x 256 tokens, 3 timed steps
    python bench/heap.py --workload bridge --model builtin:smollm2 --corpus kjv --layer 3 --batch 8 --seq 256
    python bench/heap.py --model builtin:hmm-tiny --seq 64 --corpus "$(python -c 'from geoprobe.testbed import CORPUS; print(CORPUS)')"

Why it helps: even so, glibc hands much of a step's freed memory back to the kernel and the next
step faults it in again; jemalloc with retain keeps it (the wrapper's decay hands back only pages
left unused for tens of seconds; the figures in bench/README.md were taken with no decay at all).
Only where memory comes from changes, so the bits do not.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

KEEP_PAGES = str(Path(__file__).resolve().parents[1] / "experiments" / "keep-pages")  # the runs' preload
STEPS = 3


def dsl_workload(argv: list[str]):
    from dsl_step import arguments, build

    return build(arguments(argv))


def bridge_workload(argv: list[str]):
    """bench/bridge_step.py's cached-state bridge step, as a sweep trains it."""
    from bridge_step import arguments, build
    from common import training_step

    bridge, _teacher, _states, loss_fn, _line = build(arguments(argv))
    return training_step(bridge, loss_fn, lr=1e-3)


WORKLOADS = {"dsl": dsl_workload, "bridge": bridge_workload}


def child(argv: list[str]) -> dict:
    import torch

    step, params = WORKLOADS[argv[0]](argv[1:])
    step(0)  # the allocator's first round of the step's buffers
    before, began = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for i in range(1, 1 + STEPS):
        step(i)
    seconds = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_SELF)
    digest = hashlib.sha256(b"".join(p.detach().float().numpy().tobytes() for p in params)).hexdigest()
    return {"seconds": seconds / STEPS, "kernel": (after.ru_stime - before.ru_stime) / STEPS,
            "faults": (after.ru_minflt - before.ru_minflt) / STEPS, "threads": torch.get_num_threads(),
            "peak_gb": after.ru_maxrss / 2 ** 20, "digest": digest,
            "jemalloc": "libjemalloc" in Path("/proc/self/maps").read_text()}  # loaded, not only asked for


def main() -> None:
    argv = sys.argv[1:]
    if argv[:1] == ["--child"]:
        print(json.dumps(child(argv[1:])))
        return
    workload = "dsl"
    if argv[:1] == ["--workload"]:
        workload, argv = argv[1], argv[2:]
    if workload not in WORKLOADS:
        raise SystemExit(f"--workload must be one of {', '.join(WORKLOADS)}, got {workload!r}")
    if subprocess.run(["sh", KEEP_PAGES]).returncode:
        raise SystemExit("libjemalloc.so.2 not found: apt-get install libjemalloc2 (or make .jemalloc)")
    runs = {"glibc, as geoprobe sets it": [], "jemalloc, pages kept": ["sh", KEEP_PAGES]}
    results = {name: [] for name in runs}
    plain = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MALLOC_CONF")}  # glibc's arm is glibc
    for _ in range(2):  # alternated: a machine that slows down or speeds up hits both
        for name, wrapper in runs.items():
            done = subprocess.run([*wrapper, sys.executable, __file__, "--child", workload, *argv], capture_output=True,
                                  text=True, env=plain)
            if done.returncode:
                raise SystemExit(f"the {name} run failed:\n{done.stderr}")
            results[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
            if results[name][-1]["jemalloc"] != bool(wrapper):  # each arm ran under the allocator it names
                raise SystemExit(f"the {name} run had the wrong allocator")
    best = {name: min(r, key=lambda x: x["seconds"]) for name, r in results.items()}
    for name, b in best.items():
        print(f"  {name:22s}: {b['seconds']:7.2f} s a step, kernel {b['kernel']:5.2f} s a step, "
              f"{b['faults']:9,.0f} minor faults a step, peak {b['peak_gb']:.2f} GB ({b['threads']} threads)")
    digests = {r["digest"] for runs_ in results.values() for r in runs_}
    glibc, kept = (best[name]["seconds"] for name in runs)
    print(f"jemalloc / glibc: {glibc / kept:.2f}x steps a second; the same parameters after {STEPS + 1} steps in "
          f"every run: {len(digests) == 1}")


if __name__ == "__main__":
    main()
