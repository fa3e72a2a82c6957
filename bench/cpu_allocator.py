"""glibc keeping freed blocks (geoprobe/__init__.py) vs its default, side by side: the geometry
of one SmolLM2-sized layer (4,000 rows, d = 576, the scan's default settings with --reseeds 2),
each setting in its own process (the allocator is set when geoprobe is imported), alternated,
best and median of 3. The results must be equal bit for bit: only the allocation changes.

    .venv/bin/python bench/cpu_allocator.py
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROWS, WIDTH, DOCS = 4000, 576, 63


def child() -> None:
    sys.path.insert(0, str(ROOT))
    import torch

    from geoprobe.geometry import GeometrySettings, bootstrap_counts, layer_geometry

    g = torch.Generator().manual_seed(0)
    # a few high-variance channels, as a real layer has
    states = torch.randn(ROWS, WIDTH, generator=g) * torch.linspace(0.2, 3.0, WIDTH)
    docs = torch.arange(ROWS) * DOCS // ROWS
    settings = GeometrySettings(reseeds=2)
    counts = torch.from_numpy(bootstrap_counts(DOCS, settings.bootstrap, 0))
    started = time.perf_counter()
    result = layer_geometry(states, docs, settings, counts, rng_key=1)
    seconds = time.perf_counter() - started
    print(json.dumps({"seconds": seconds, "result": repr(sorted(result.items()))}))


def main() -> None:
    runs = {"default": [], "kept": []}
    answers = set()
    for _ in range(3):
        for name in runs:
            env = {**os.environ, "GEOPROBE_KEEP_FREED": "0" if name == "default" else "1"}
            done = subprocess.run([sys.executable, __file__, "--child"], env=env, capture_output=True, text=True,
                                  check=True)
            record = json.loads(done.stdout.strip().splitlines()[-1])
            runs[name].append(record["seconds"])
            answers.add(record["result"])
    for name, seconds in runs.items():
        print(f"{name:8s} best {min(seconds):6.2f} s   median {statistics.median(seconds):6.2f} s")
    print(f"kept / default: best {min(runs['kept']) / min(runs['default']):.2f}, "
          f"median {statistics.median(runs['kept']) / statistics.median(runs['default']):.2f}")
    print("results equal bit for bit" if len(answers) == 1 else "RESULTS DIFFER")
    sys.exit(0 if len(answers) == 1 else 1)


if __name__ == "__main__":
    child() if sys.argv[1:] == ["--child"] else main()
