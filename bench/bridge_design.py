"""The bridge's design, measured on SmolLM2 (docs/bridge-design.md): the training distribution
before and after tau = 0 got its own mass, and the smallest width x depth that reaches its
plateau at the CPU budget, at two layers.

    python bench/bridge_design.py                       # layers 3 and 9, about 20 min on 2 cores
    python bench/bridge_design.py --layers 3 --steps 100 --out /tmp/design   # a quick look

Every variant trains one bridge with the sweep's own code (geoprobe.sweep.train_bridge: the
plateau rule on the stopping split, best EMA weights, validation on other held-out blocks drawn
as the scan draws its states: 256-token blocks, the first block of each chapter) under one step
cap, and is resumable: a finished variant is read back, not retrained.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# name: (BridgeConfig fields). "before" is the training distribution and CLI shape of 4646d02.
VARIANTS = {
    "before 128x2 (tau_zero 0)": dict(d_model=128, n_layers=2, tau_zero=0.0),
    "after 64x1": dict(d_model=64, n_layers=1),
    "after 128x2": dict(d_model=128, n_layers=2),
    "after 256x4": dict(d_model=256, n_layers=4),
}
METRICS = ("nmse_dim", "nmse", "delta_ce", "nmse_noisy", "objective")


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", default="3,9")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--variants", default="all", help="comma-separated indices into VARIANTS (default: all)")
    parser.add_argument("--page-only", action="store_true", help="write the page from the finished variants")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bridge-design")
    parser.add_argument("--page", type=Path, default=ROOT / "docs" / "bridge-design.md")
    args = parser.parse_args()

    from bridges.hidden import BridgeConfig
    from geoprobe.files import holding
    from geoprobe.sweep import BridgeSettings, bridge_dir, open_source, train_bridge

    if args.page_only:
        write_page(finished(args.out), args)
        return
    source = open_source(None, "builtin:smollm2", "kjv", args.seq_len, "cpu", "auto", doc_blocks=1)
    names = list(VARIANTS) if args.variants == "all" else [list(VARIANTS)[int(i)] for i in args.variants.split(",")]
    for layer in [int(x) for x in args.layers.split(",")]:
        for name in names:
            fields = VARIANTS[name]
            network = replace(BridgeConfig(layer=0, vocab_size=0, hidden_size=0), **fields)
            settings = BridgeSettings(network, steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len,
                                      eval_every=10)
            root = args.out / name.split(" (")[0].replace(" ", "-")
            with holding(bridge_dir(root, layer, settings.seed), "bench/bridge_design.py"):  # as the sweep does
                metrics, _ = train_bridge(source, layer, root, settings)
            print(f"layer {layer} {name}: nmse_dim {metrics['nmse_dim']:.3f} nmse {metrics['nmse']:.3f} "
                  f"steps {metrics['steps_run']} ({metrics['stop']}, best at {metrics['best_step']}) "
                  f"{metrics['train_seconds']:.0f} s", flush=True)
    write_page(finished(args.out), args)


def finished(out: Path) -> list[dict]:
    """Every finished variant under `out` (from every invocation), read from its metrics.json."""
    results = []
    for layer_dir in sorted(out.glob("*/bridges/layer-*")):
        path = layer_dir / "seed-0" / "metrics.json"
        name = next((n for n in VARIANTS if n.split(" (")[0].replace(" ", "-") == layer_dir.parts[-3]), None)
        if name is None or not path.is_file():
            continue
        metrics = json.loads(path.read_text())
        params = sum(t.numel() for _, t in _trained(layer_dir.parent.parent, metrics["layer"]))
        results.append({"layer": metrics["layer"], "variant": name, "network_parameters": params, **metrics})
    return sorted(results, key=lambda r: (r["layer"], list(VARIANTS).index(r["variant"])))


def _trained(root: Path, layer: int):
    """The bridge's network parameters (not the token table, whose rows outside the corpus never
    train, nor the buffers)."""
    from safetensors import safe_open

    path = root / "bridges" / f"layer-{layer:02d}" / "seed-0" / "model.safetensors"
    with safe_open(path, "pt") as handle:
        for name in handle.keys():
            if name not in ("support", "source_mean", "target_mean", "source_scale", "target_scale") \
                    and not name.startswith("table."):
                yield name, handle.get_tensor(name)


def findings(results: list[dict], tolerance: float = 0.02) -> list[str]:
    """What the table says, computed: before vs after at the same shape, and the smallest shape
    whose nmse_dim is within `tolerance` (relative) of the best shape's, per layer."""
    lines = []
    for layer in sorted({r["layer"] for r in results}):
        rows = {r["variant"]: r for r in results if r["layer"] == layer}
        before, after = rows.get("before 128x2 (tau_zero 0)"), rows.get("after 128x2")
        if before and after:
            lines.append(f"- Layer {layer}, training distribution (128 x 2): nmse_dim {before['nmse_dim']:.3f} before, "
                         f"{after['nmse_dim']:.3f} after ({after['nmse_dim'] / before['nmse_dim'] - 1:+.1%}); delta_ce "
                         f"{before['delta_ce']:.2f} vs {after['delta_ce']:.2f} nats.")
        shapes = [rows[n] for n in VARIANTS if n.startswith("after") and n in rows]
        if len(shapes) > 1:
            best = min(r["nmse_dim"] for r in shapes)
            smallest = next(r for r in shapes if r["nmse_dim"] <= (1 + tolerance) * best)
            lines.append(f"- Layer {layer}, shape: the smallest within {tolerance:.0%} of the best nmse_dim ({best:.3f}) "
                         f"is {smallest['variant'].split()[1]} ({smallest['nmse_dim']:.3f}, "
                         f"{smallest['network_parameters']:,} network parameters).")
    return lines


def write_page(results: list[dict], args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd
    import torch

    layers = sorted({r["layer"] for r in results})
    fig, axes = plt.subplots(1, len(layers), figsize=(6 * len(layers), 4.2), squeeze=False)
    for ax, layer in zip(axes[0], layers):
        for r in results:
            if r["layer"] == layer and r["val_curve"]:
                steps, values = zip(*r["val_curve"])
                ax.plot(steps, values, label=r["variant"])
        ax.set_title(f"layer {layer}: the stopping split's score")
        ax.set_xlabel("step")
        ax.set_ylabel("nmse")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    pictures = args.page.parent / "bridge-design"
    pictures.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(pictures / "curves.png", dpi=110)
    columns = ["layer", "variant", "network_parameters", *METRICS, "steps_run", "best_step", "stop", "train_seconds"]
    table = pd.DataFrame(results)[columns].to_markdown(index=False, tablefmt="github", floatfmt=".4g")
    cpu = next((l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                if l.startswith("model name")), platform.processor())
    text = [
        "# The bridge's design, measured", "",
        f"Made by `python bench/bridge_design.py --layers L --variants V --steps {args.steps} --batch-size "
        f"{args.batch_size} --seq-len {args.seq_len}` (every finished variant under --out is shown) on {os.cpu_count()} × {cpu}, torch {torch.__version__}. "
        "SmolLM2-135M-Instruct on the KJV; every variant is one bridge trained by the sweep's own code "
        "(plateau rule on a stopping split of 8 held-out blocks, the best EMA weights kept, validated on 16 other "
        "held-out blocks: the first 256-token block of each held-out chapter, as the scan draws its states). "
        "Seed 0 only: differences of a few per cent are within seed noise (see the sweep's reliability).", "",
        "`before` is the training distribution of 4646d02 (tau ~ U[0, 1]; with sigma_b = 0 every tau > 0 can be "
        "solved for the target, so only tau near 0 teaches the regression that validation scores) at the CLI's "
        "old shape; `after` puts half of the sequences at tau = 0 (BridgeConfig.tau_zero = 0.5).", "",
        table, "", *findings(results), "", "![curves](bridge-design/curves.png)", "",
        "Note: the layer-3 runs (2026-11-30) stopped on the scalar nmse of the stopping split (the rule at "
        "commit 132f8e7), and their curves show it; the layer-9 runs (2026-12-01) stopped, as the sweep's bridges "
        "now do, on nmse_dim, and their curves show that. Both differences, before vs after, are about the "
        "seed spread the sweep measured (sd 0.01-0.02 in nmse_dim): with one seed, neither layer says the tau = 0 "
        "mass helps or hurts. `objective` is each bridge's own loss under its own tau "
        "distribution, so it does not compare `before` with `after`. `train_seconds` were measured while other "
        "jobs shared the 2 cores: they do not compare the shapes either.", "",
    ]
    args.page.write_text("\n".join(text) + "\n")
    print(f"wrote {args.page}")


if __name__ == "__main__":
    main()
