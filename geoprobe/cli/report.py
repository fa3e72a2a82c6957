"""`geoprobe compare`, `geoprobe report` and `geoprobe demo --tiny`."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from geoprobe.cli.bridge import print_verdict
from geoprobe.cli.options import state
from geoprobe.cli.output import show
from geoprobe.cli.root import app
from geoprobe.report.terminal import print_table
from geoprobe.workflows.demo import run_demo


@app.command(epilog="Examples:\n\n  geoprobe compare runs/dsl/samples/roar/samples.jsonl runs/mdlm/samples/mdlm/samples.jsonl "
                    "--out runs/demo\n\n"
                    "  geoprobe compare a/samples.jsonl b/samples.jsonl --out runs/x --allow-mismatch")
def compare(
    *,
    samples: Annotated[list[Path], typer.Argument(help="samples.jsonl files, each evaluated by `geoprobe eval` "
                                                           "(or a SAMPLES.row.json an earlier compare wrote beside one, "
                                                           "in its place).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Where compare.csv, compare.md and the plot go.")],
    allow_mismatch: Annotated[bool, typer.Option(help="Compare generators with different budgets (marked).")] = False,
    curve: Annotated[list[Path] | None, typer.Option("--curve", help="More evaluated samples of the same generators "
                                                     "at other step counts (repeatable): steps.csv and plots/steps.png, "
                                                     "with the table's rows.")] = None,
):
    """One table at one budget: every generator with its sampler, NFE, time and metrics."""
    from geoprobe.workflows.compare import compare_run

    result = compare_run(samples, out, allow_mismatch, curve)
    rows, table = result["rows"], result["table"]

    # the tokens each model trained on, beside its cap (a run its plateau stopped used fewer)
    keys = ["generator", "sampler", "nfe", "used_tokens", "train_tokens", "evaluator", "gen_ppl",
            "oracle_nll_per_word", "diversity_within", "mauve", "budget"]
    head = [{"used_tokens": "tokens used", "train_tokens": "token cap"}.get(k, k) for k in keys]
    show(result, lambda: print_table(f"comparison → {table}", head,
                                     [[r.get(k) if r.get(k) is not None else "—" for k in keys] for r in rows]))


@app.command(epilog="Example:\n\n  geoprobe report runs/demo")
def report(run: Annotated[Path, typer.Argument(help="A run directory.")]):
    """report.md: model, corpus, ranking, sweep, comparison, plots and settings."""
    from geoprobe.workflows.page import write_report

    path = write_report(run)
    show({"report": str(path)}, lambda: print(f"report: {path}"))


@app.command(epilog="Examples:\n\n  geoprobe demo --tiny --out runs/tiny-demo      # the testbed, ~3 min (+3.5 once to train it)\n\n"
                    "  geoprobe demo --out runs/demo                  # + the SmolLM2 scan first (what `make demo` runs)")
def demo(
    *,
    tiny: Annotated[bool, typer.Option("--tiny", help="Only the testbed experiment (builtin:hmm-tiny, a small Llama "
                                                      "trained on a synthetic HMM with an exact likelihood), not "
                                                      "the SmolLM2 scan.")] = False,
    out: Annotated[Path, typer.Option("--out", "-o", help="Where everything goes.")] = Path("runs/demo"),
    device: Annotated[str, typer.Option("--device")] = "auto",
):
    """What is meaningful on a laptop: the SmolLM2 scan (both rankings), then the testbed's sweep verdict
    and generation comparison with intervals, then one report that says what was found."""

    global _BEGAN
    _BEGAN = time.perf_counter()
    summary = run_demo(out, tiny=tiny, device=device, on_step=None if state.quiet else _print_step)
    show(summary, lambda: _print_demo(summary))


_BEGAN = time.perf_counter()


def _print_step(what: str, seconds: float, remaining: float) -> None:
    """One line per step on stderr: its time, the time so far and an estimate of what remains."""
    elapsed = time.perf_counter() - _BEGAN
    print(f"  {seconds:6.1f} s  geoprobe {what}   [{elapsed / 60:4.1f} min so far, about {remaining / 60:.0f} min "
          "left]", file=sys.stderr, flush=True)


def _print_demo(summary: dict) -> None:

    def interval(g, key, value):
        if g.get(value) is None:
            return "—"
        if g.get(f"{key}_lo") is None:
            return f"{g[value]:.4g}"
        return f"{g[value]:.4g} [{g[f'{key}_lo']:.4g}, {g[f'{key}_hi']:.4g}]"

    evaluator = next((g["evaluator"] for g in summary["generation"] if g.get("evaluator")), "?")
    print_table(f"testbed generation (matched budget; Gen.PPL by {evaluator}; 95% bootstrap intervals over samples; "
                "* = the evaluator is the generator's own backbone)",
                ["generator", "sampler", "Gen.PPL", "MAUVE", "oracle NLL/word"],
                [[g["generator"], g["sampler"], interval(g, "gen_ppl", "gen_ppl") + (" *" if g.get("own_evaluator") else ""),
                  g["mauve"], interval(g, "oracle_nll", "oracle_nll_per_word")] for g in summary["generation"]])
    print_verdict("the testbed sweep's verdict", summary["verdict"])
    if summary.get("found"):
        print("\nWhat was found:")
        for line in summary["found"]:
            print(f"- {line}")
    print(f"report: {summary['report']}")

