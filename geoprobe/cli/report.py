"""`geoprobe compare`, `geoprobe report` and `geoprobe demo --tiny`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from geoprobe.cli.app import app
from geoprobe.cli.output import show
from geoprobe.cli.options import state


@app.command(epilog="Examples:\n\n  geoprobe compare runs/dsl/samples.jsonl runs/mdlm/samples.jsonl --out runs/demo\n\n"
                    "  geoprobe compare a/samples.jsonl b/samples.jsonl --out runs/x --allow-mismatch")
def compare(
    samples: Annotated[list[Path], typer.Argument(help="samples.jsonl files, each evaluated by `geoprobe eval`.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Where compare.csv, compare.md and the plot go.")],
    allow_mismatch: Annotated[bool, typer.Option(help="Compare generators with different budgets (marked).")] = False,
    curve: Annotated[list[Path] | None, typer.Option("--curve", help="More evaluated samples of the same generators "
                                                     "at other step counts (repeatable): steps.csv and plots/steps.png, "
                                                     "with the table's rows.")] = None,
):
    """One table at one budget: every generator with its sampler, NFE, time and metrics."""
    from geoprobe.report.compare import compare as build, comparison_row, steps_curve, write_comparison
    from geoprobe.store import check_writable

    check_writable(out)
    rows = build(samples, allow_mismatch)
    table, plot = write_comparison(rows, out)
    result = {"rows": rows, "table": str(table), "plot": str(plot)}
    if curve:
        points = [comparison_row(p) for p in curve]
        lines = {(r["generator"], r["sampler"]) for r in points}
        points += [r for r in rows if (r["generator"], r["sampler"]) in lines]
        result["steps_table"], result["steps_plot"] = map(str, steps_curve(points, out))
    from geoprobe.report.terminal import print_table

    keys = ["generator", "sampler", "nfe", "train_tokens", "gen_ppl", "diversity", "mauve", "budget"]
    show(result, lambda: print_table(f"comparison → {table}", keys,
                                     [[r.get(k) if r.get(k) is not None else "—" for k in keys] for r in rows]))


@app.command(epilog="Example:\n\n  geoprobe report runs/demo")
def report(run: Annotated[Path, typer.Argument(help="A run directory.")]):
    """report.md: model, corpus, ranking, sweep, comparison, plots and settings."""
    from geoprobe.report.page import write_report

    path = write_report(run)
    show({"report": str(path)}, lambda: print(f"report: {path}"))


def _step(*argv) -> None:
    """Run one geoprobe command in this process (quietly: one line per step on stderr with its
    time); any failure stops the demo with its message."""
    import sys
    import time

    from geoprobe.cli.app import main

    quiet, fmt = state.quiet, state.format
    started = time.perf_counter()
    try:
        main(["-q", *map(str, argv)])
    except SystemExit as exc:
        if exc.code:
            raise
    finally:
        state.quiet, state.format = quiet, fmt  # the step's own flags must not stick to the demo
    if not quiet:
        shown = " ".join(Path(a).name if isinstance(a, Path) else str(a) for a in argv[:4])
        print(f"  {time.perf_counter() - started:6.1f} s  geoprobe {shown} …", file=sys.stderr, flush=True)


# Every generator in the comparison has one training budget (cap steps x batch x seq_len tokens):
# the DSL and MDLM models train for exactly that; the sweep's bridges may stop earlier, when their
# validation nmse plateaus (compare shows the tokens each one used). SmolLM2 bridges sample through
# the 49k-token converter, many minutes on a CPU, so the full demo compares them only in the sweep.
TINY = {"model": "builtin:hmm-tiny", "corpus": None, "tokens": 2000, "seq_len": 65, "positions": "random:16",
        "doc_blocks": 0,
        "k": 16, "anchors": 512, "pairs": 1024, "bootstrap": 100, "layers": "all",
        "bridge_steps": 1000, "bridge_batch": 16, "bridge_seq": 33, "bridge_width": 64, "bridge_blocks": 2,
        "bridge_lr": 2e-3, "bridge_eval_every": 25,
        "dsl_tokenizer": None, "dsl_steps": 1000, "dsl_batch": 16, "dsl_seq": 33, "dsl_width": 64, "dsl_lr": 2e-3,
        "num": 32, "length": 32, "steps": 32, "curve": (8, 16), "bridges_compared": True}
# the real demo's 4,000 states: 64 random positions from the first block of each of 63 chapters
# (in the seeded document order), not every position of 16 blocks from 6 chapters: its intervals
# resample documents
REAL = {"model": "builtin:smollm2", "corpus": "kjv", "tokens": 4000, "seq_len": 256, "positions": "random:64",
        "doc_blocks": 1,
        "k": 32, "anchors": 2048, "pairs": 4096, "bootstrap": 200, "layers": "0-3",
        "bridge_steps": 40, "bridge_batch": 4, "bridge_seq": 64, "bridge_width": 64, "bridge_blocks": 1,
        "bridge_lr": 1e-3, "bridge_eval_every": 10,
        "dsl_tokenizer": "train:2048", "dsl_steps": 300, "dsl_batch": 8, "dsl_seq": 64, "dsl_width": 128,
        "dsl_lr": 3e-4, "num": 64, "length": 64, "steps": 64, "curve": (16, 32), "bridges_compared": False}


@app.command(epilog="Examples:\n\n  geoprobe demo --tiny --out runs/tiny-demo      # the testbed, ~3 min (+3 once to train it)\n\n"
                    "  geoprobe demo --out runs/demo                  # SmolLM2 on the KJV (what `make demo` runs)")
def demo(
    tiny: Annotated[bool, typer.Option("--tiny", help="The testbed: builtin:hmm-tiny (a small Llama trained on a "
                                                      "synthetic HMM with an exact likelihood) and its corpus.")] = False,
    out: Annotated[Path, typer.Option("--out", "-o", help="Where everything goes.")] = Path("runs/demo"),
    device: Annotated[str, typer.Option("--device")] = "auto",
):
    """The whole pipeline end to end: scan, sweep, DSL, four samplers, eval, compare, report."""
    from geoprobe.backbone import resolve_device
    from geoprobe.store import check_writable
    from geoprobe.testbed import CORPUS

    resolve_device(device)
    check_writable(out)
    p = TINY if tiny else REAL
    corpus = p["corpus"] or CORPUS
    out.mkdir(parents=True, exist_ok=True)
    model = p["model"]
    run = out / "run"
    dev = ["--device", device]
    _step("scan", model, "--corpus", corpus, "--tokens", p["tokens"], "--seq-len", p["seq_len"], "--positions",
          p["positions"], "--doc-blocks", p["doc_blocks"], "--k", p["k"],
          "--anchors", p["anchors"], "--pairs", p["pairs"], "--bootstrap", p["bootstrap"], "--out", run, *dev)
    _step("sweep", "--run", run, "--layers", p["layers"], "--steps", p["bridge_steps"], "--batch-size",
          p["bridge_batch"], "--seq-len", p["bridge_seq"], "--d-model", p["bridge_width"], "--n-layers",
          p["bridge_blocks"], "--lr", p["bridge_lr"], "--eval-every", p["bridge_eval_every"], *dev)
    models = {"dsl": ["--snr", "mixed"], "mdlm": ["--snr", "endpoint"]}  # DSL, and the endpoint-only MDLM model
    for name, snr in models.items():
        _step("dsl", "train", "--corpus", corpus, "--tokenizer", p["dsl_tokenizer"] or model, *snr, "--steps",
              p["dsl_steps"], "--batch-size", p["dsl_batch"], "--seq-len", p["dsl_seq"], "--lr", p["dsl_lr"],
              "--d-model", p["dsl_width"],
              "--n-layers", 2, "--out", out / name, *dev)
    sweep = json.loads((run / "sweep.json").read_text())["correlations"]
    shape = ["--num", p["num"], "--length", p["length"]]
    table = {f"dsl-{s}": ["--model", out / "dsl", "--sampler", s] for s in ("mdlm", "remdm-loop", "roar", "hybrid")}
    table["mdlm-mdlm"] = ["--model", out / "mdlm", "--sampler", "mdlm"]
    if p["bridges_compared"]:
        for role in ("chosen", "worst", "oracle"):  # the same layer may play two roles: one row
            layer = run / "bridges" / f"layer-{sweep[role + '_layer']:02d}"
            table[f"bridge-{layer.name[-2:]}"] = ["--model", layer, "--sampler", "hybrid"]
        table["round-00"] = ["--model", run / "bridges" / "layer-00", "--decode", "round", "--sampler", "mdlm"]
    files, curve = [], []
    for name, args in table.items():
        _step("sample", *args, *shape, "--steps", p["steps"], "--out", out / "samples" / name, *dev)
        files.append(out / "samples" / name / "samples.jsonl")
        if name.startswith("dsl-"):  # the same generators at fewer steps: quality against sampling budget
            for steps in p["curve"]:
                folder = out / "samples" / f"{name}-steps{steps}"
                _step("sample", *args, *shape, "--steps", steps, "--out", folder, *dev)
                curve.append(folder / "samples.jsonl")
    _step("sample", "--model", model, "--sampler", "ar", *shape, "--out", out / "samples" / "ar", *dev)  # the ceiling
    files.append(out / "samples" / "ar" / "samples.jsonl")
    _step("eval", *files, *curve, "--evaluator", model, "--references", corpus, *dev)  # one evaluator load
    _step("compare", *files, *[a for c in curve for a in ("--curve", c)], "--out", run)
    from geoprobe.report.compare import read_rows
    from geoprobe.report.page import write_report

    path = write_report(run)
    losses = [k for k in ("nmse", "nmse_dim", "delta_ce") if k in sweep]
    summary = {"report": str(path), "chosen_layer": sweep["chosen_layer"], "oracle_layer": sweep["oracle_layer"],
               "worst_layer": sweep["worst_layer"], "correlations": {k: sweep[k] for k in losses},
               "depth": sweep.get("depth", {}).get("statement"),
               "generation": [{k: r.get(k) for k in ("generator", "sampler", "gen_ppl", "mauve", "oracle_nll_per_word",
                                                     "budget")} for r in read_rows(run / "compare.csv")]}
    show(summary, lambda: _print_demo(summary, sweep, losses))


def _print_demo(summary: dict, sweep: dict, losses: list[str]) -> None:
    from geoprobe.metrics.correlation import describe
    from geoprobe.report.terminal import print_table

    print_table("generation (matched budget)", ["generator", "sampler", "Gen.PPL", "MAUVE", "oracle NLL/word"],
                [[g["generator"], g["sampler"], g["gen_ppl"], g["mauve"], g["oracle_nll_per_word"] or "—"]
                 for g in summary["generation"]])
    print(f"layers: geometry-chosen {summary['chosen_layer']}, oracle {summary['oracle_layer']}, worst "
          f"{summary['worst_layer']}; {summary['depth']}")
    for loss in losses:
        print(describe(loss, sweep[loss]))
    print(f"report: {summary['report']}")

