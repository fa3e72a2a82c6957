"""One layer's geometry at the size of a real 8B scan, N = 200,000 rows x d = 4,096, on the GPU:
the seconds of `layer_geometry` (synchronized, after a warm-up on 2,048 rows) and CUDA's peak
allocated memory against `geometry.peak_bytes`' plan (what `scan --plan` uses to refuse a layer),
with the scan's settings (k = 32, 2,048 anchors, 4,096 pairs, 200 bootstrap replicates).

Synthetic states, as a real layer looks to the geometry: a geometric spectrum, one massive
channel (about half the variance at d = 4,096), 10 % repeated rows and 32-row documents; held in float32 as
compute_geometry holds a layer. Prints one JSON object. On a CPU (--tiny) N = 4,000 x d = 64.

    python bench/gpu_geometry.py [--tiny]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def states(n: int, d: int, device: torch.device, generator: torch.Generator) -> torch.Tensor:
    spectrum = torch.logspace(0, -2, d, device=device).sqrt()
    x = torch.randn(n, d, device=device, generator=generator) * spectrum
    x[:, 7] *= 30 * spectrum[0] / spectrum[7]  # one massive channel
    repeated = torch.randint(0, n, (n // 10,), device=device, generator=generator)
    x[torch.randperm(n, device=device, generator=generator)[: n // 10]] = x[repeated]
    return x


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tiny", action="store_true")
    args = parser.parse_args()
    from geoprobe.backbone import resolve_device
    from geoprobe.device import choose_determinism
    from geoprobe.geometry import GeometrySettings, bootstrap_counts, layer_geometry, peak_bytes

    # as a scan resolves it: on CUDA, the deterministic kernels (the 2026-12-04 run timed without them)
    choose_determinism(True)
    device = resolve_device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    n, d = (4000, 64) if args.tiny else (200_000, 4096)
    settings = GeometrySettings(anchors=256, pairs=1024, bootstrap=50) if args.tiny else GeometrySettings()
    generator = torch.Generator(device).manual_seed(0)
    x = states(n, d, device, generator)
    docs = torch.arange(n, device=device) // 32
    counts = torch.from_numpy(bootstrap_counts(n // 32 + (n % 32 > 0), settings.bootstrap, 0)).to(device)
    warm = min(n, 4096) // 2
    layer_geometry(x[:warm].clone(), docs[:warm], settings, counts[:, : int(docs[warm - 1]) + 1])
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    sync()
    began = time.perf_counter()
    result = layer_geometry(x, docs, settings, counts)
    sync()
    seconds = time.perf_counter() - began
    planned = peak_bytes(n, d, settings) - 4 * n * d  # the layer itself is already allocated here
    found = {"geometry_rows": n, "geometry_d": d, "geometry_seconds": round(seconds, 3),
             "geometry_planned_gib": planned / 2**30,
             "geometry_massive_channels": result.get("massive_channels"),
             "geometry_curv": result["trace"]["curv"]["value"]}
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated() - before
        found |= {"geometry_peak_allocated_gib": peak / 2**30, "geometry_peak_over_plan": peak / planned}
    print(json.dumps(found))


if __name__ == "__main__":
    main()
