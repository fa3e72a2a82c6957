"""experiments/smollm2_results.py's bookkeeping, on made-up sweep files: when a stored sweep counts
as done (every layer and seed of SWEEP, every ceiling), what its cost line adds up, and the
finished bridges' records that carry a sweep to another machine."""

import json
import re
import shutil
import statistics
import os

import subprocess
import sys
from pathlib import Path

import pytest

from experiments.smollm2_results import SWEEP, in_process, record, restore, swept, what_it_says
from geoprobe.verdict import sweep_verdict

LAYERS = range(1, 13)
assert SWEEP[SWEEP.index("--layers") + 1] == "1-12"  # the layers these tests build


@pytest.fixture(autouse=True)
def no_diffusion_sweep(tmp_path, monkeypatch):
    """The script looks for the diffusion sweep's bridges under runs/ and in its records, and keeps
    --generation's records in experiments/records: the tests see empty places instead, whatever this
    checkout holds (a test that wants one writes it there)."""
    import experiments.smollm2_results as script

    monkeypatch.setattr(script, "DIFFUSION_RUN", tmp_path / "diffusion-run")
    monkeypatch.setattr(script, "DIFFUSION_RECORD", tmp_path / "diffusion-records")
    monkeypatch.setattr(script, "GENERATION_RECORD", tmp_path / "generation-records")
    return tmp_path / "diffusion-run"


def write_sweep(run, layers=LAYERS, seeds=(0, 1, 2), ceilings=True):
    rows = [{"layer": layer, "seed": seed, "stop": "plateau", "control_lookup_nmse_dim": 1.0, "train_seconds": 60.0,
             "val_curve": [[0, 1.0], [50, 0.5]],
             **{k: 0.01 * layer + 0.001 * seed for k in ("nmse_dim", "nmse", "delta_ce", "nmse_noisy", "objective")},
             **({"ceiling_nmse_dim": 0.005 * layer, "ceiling_stop": "plateau", "ceiling_train_seconds": 120.0}
                if ceilings else {})}
            for seed in seeds for layer in layers]
    verdict = sweep_verdict(rows, {"score": {layer: -float(layer) for layer in layers}}, {})
    verdict["scores"] = {"score": {str(layer): -float(layer) for layer in layers}}  # as summarise records them
    (run / "sweep.json").write_text(json.dumps({"rows": rows, "verdict": verdict}))


def page_of(run):
    """What the page says of `run`, without the tracked hand-written notes."""
    return what_it_says(run, run, notes=run / "none.md")


def test_a_stored_sweep_is_done_only_with_every_layer_seed_and_ceiling(tmp_path):
    assert not swept(tmp_path, "0,1,2")  # nothing stored
    write_sweep(tmp_path)
    assert swept(tmp_path, "0,1,2") and swept(tmp_path, "0-1")
    assert not swept(tmp_path, "0-3")  # a seed it lacks
    write_sweep(tmp_path, layers=range(1, 12))
    assert not swept(tmp_path, "0,1,2")  # layer 12 missing: a sweep over fewer layers is resumed
    write_sweep(tmp_path, ceilings=False)
    assert not swept(tmp_path, "0,1,2")


def test_the_cost_line_counts_every_bridge_and_each_layers_ceiling_once(tmp_path):
    write_sweep(tmp_path)
    cost = next(line for line in page_of(tmp_path).splitlines() if line.startswith("- Cost:"))
    # 36 bridges x 60 s = 36 min; 12 ceilings x 120 s = 24 min (each copied onto 3 seeds' rows)
    assert cost.startswith("- Cost: 36 bridges trained for at least 36 min in all, and 12 ceiling controls for 24 min")


def test_the_cost_line_says_which_machines_trained_the_bridges_when_more_than_one_did(tmp_path):
    from experiments.smollm2_results import by_machine

    write_sweep(tmp_path)
    sweep = json.loads((tmp_path / "sweep.json").read_text())
    rows = sweep["rows"]
    assert by_machine(rows) == ""  # one machine (here: none named by any record): nothing to say
    for row in rows:
        if row["seed"] == 2:  # seed 2 and every ceiling on a second machine, named by the records
            row["machine"] = "2 × Xeon"
        row["ceiling_machine"] = "2 × Xeon"
    unnamed = "a machine the record does not name (recorded before commit f00b1b5, 2026-12-05 13:51)"
    assert by_machine(rows) == f"trained on more than one machine: 24 runs, 24 min, on {unnamed}; 24 runs, 36 min, on 2 × Xeon"
    (tmp_path / "sweep.json").write_text(json.dumps(sweep))
    cost = next(line for line in page_of(tmp_path).splitlines() if line.startswith("- Cost:"))
    assert cost.endswith(f"; trained on more than one machine: 24 runs, 24 min, on {unnamed}; 24 runs, 36 min, on 2 × Xeon.")
    rows[0]["machine"] = "1 × Epyc"  # the one run of a third machine
    assert "1 run, 1 min, on 1 × Epyc; 23 runs, 23 min, on a machine" in by_machine(rows)
    # every record names its machine (written after f00b1b5): no "at least", no caveat about the old clock
    for row in rows:
        row["machine"] = "2 × Xeon"
    (tmp_path / "sweep.json").write_text(json.dumps(sweep))
    cost = next(line for line in page_of(tmp_path).splitlines() if line.startswith("- Cost:"))
    assert cost == ("- Cost: 36 bridges trained for 36 min in all, and 12 ceiling controls for 24 min. These are their "
                    "training loops, over every invocation of the script; validation adds about a fifth.")
    rows[0]["machine"] = "1 × Epyc"
    (tmp_path / "sweep.json").write_text(json.dumps(sweep))
    cost = next(line for line in page_of(tmp_path).splitlines() if line.startswith("- Cost:"))
    assert cost.endswith("validation adds about a fifth. Trained on more than one machine: 1 run, 1 min, on 1 × Epyc; "
                         "47 runs, 59 min, on 2 × Xeon.")


def test_the_page_names_the_dihal_models_delta_ce_and_whether_its_sampled_bridge_converged(tmp_path):
    write_sweep(tmp_path)  # score -layer: the geometry chooses layer 1; delta_ce 0.010, 0.011, 0.012
    line = next(l for l in page_of(tmp_path).splitlines() if l.startswith("- The DiHAL model"))
    assert line.startswith("- The DiHAL model at the geometry's chosen layer 1: delta_ce 0.011 ± 0.001 nats "
                           "(seed mean ± sd over 3 seeds")
    assert line.endswith("its seed-0 bridge, the one `--generation` samples through (trained again where the run "
                         "keeps only its record), stopped by its plateau.")
    sweep = json.loads((tmp_path / "sweep.json").read_text())
    next(r for r in sweep["rows"] if r["layer"] == 1 and r["seed"] == 0)["stop"] = "cap"
    (tmp_path / "sweep.json").write_text(json.dumps(sweep))
    assert "stopped at its cap: unconverged, its samples are not evidence." in page_of(tmp_path)
    # trained again by --generation (its record kept, no folder here): the line says where each training stopped
    import experiments.smollm2_results as script

    kept = script.GENERATION_RECORD / "bridges" / "layer-01" / "seed-0"
    kept.mkdir(parents=True)
    (kept / "metrics.json").write_text(json.dumps({"stop": "plateau", "steps_run": 1950, "nmse_dim": 0.1432}))
    next(r for r in sweep["rows"] if r["layer"] == 1 and r["seed"] == 0).update(stop="plateau", steps_run=3000)
    (tmp_path / "sweep.json").write_text(json.dumps(sweep))
    line = next(l for l in page_of(tmp_path).splitlines() if l.startswith("- The DiHAL model"))
    assert line.endswith("its seed-0 bridge, stopped by its plateau at step 3,000, validation nmse_dim 0.0100 in the "
                         "sweep. The samples come from that bridge trained again by `--generation` with the same flags "
                         "and seed (the sweep's weights were not kept), which stopped by its plateau at step 1,950, "
                         "validation nmse_dim 0.1432: training is not bit for bit the same across machines and runs.")


def test_the_page_puts_the_bridges_before_the_geometry_and_how_it_ran_last(tmp_path, monkeypatch):
    import experiments.smollm2_results as script
    import geoprobe.workflows.page as page

    write_sweep(tmp_path)
    report = tmp_path / "report.md"
    report.write_text("# Report\n\nintro\n\n## Geometry and ranking\n\ng\n\n## Bridge sweep\n\nb\n\n"
                      "## Generation\n\nx\n")
    monkeypatch.setattr(page, "write_report", lambda run: report)
    out = tmp_path / "docs" / "results.md"
    script.write_page(tmp_path, tmp_path, out, {"scan": {"seconds": 1.0, "command": "geoprobe scan"}}, 1.0)
    headings = [l for l in out.read_text().splitlines() if l.startswith("## ")]
    assert headings == ["## What the numbers say", "## Bridge sweep", "## Geometry and ranking", "## Generation",
                        "## How it was run"]
    # the generation section opens with what its rows share and what they do not, once, before its own text
    generation = out.read_text().split("## Generation\n\n", 1)[1]
    assert generation.startswith("\n".join(script.GENERATION_CAVEATS) + "\nx\n")
    assert out.read_text().count(script.GENERATION_CAVEATS[0]) == 1


def test_each_page_links_its_own_plots_and_never_replaces_another_pages(tmp_path, monkeypatch):
    """results.md and results-gemma.md draw plots of the same names: each page's links reach its
    run's pictures, in a folder named after the page, and writing one leaves the other's alone."""
    import experiments.smollm2_results as script
    import geoprobe.workflows.page as page

    docs = tmp_path / "docs"
    for name in ("smollm2", "gemma"):
        run = tmp_path / name
        (run / "plots").mkdir(parents=True)
        write_sweep(run)
        (run / "plots" / "sweep.png").write_bytes(name.encode())
        (run / "report.md").write_text("# Report\n\nintro\n\n## Bridge sweep\n\n![sweep](plots/sweep.png)\n")
    monkeypatch.setattr(page, "write_report", lambda run: run / "report.md")
    log = {"scan": {"seconds": 1.0, "command": "geoprobe scan"}}
    script.write_page(tmp_path / "smollm2", tmp_path, docs / "results.md", log, 1.0)
    script.write_page(tmp_path / "gemma", tmp_path, docs / "results-gemma.md", log, 1.0)
    for name, page_name in (("smollm2", "results.md"), ("gemma", "results-gemma.md")):
        links = re.findall(r"\]\(([^)]+\.png)\)", (docs / page_name).read_text())
        assert links and all((docs / link).read_bytes() == name.encode() for link in links), (page_name, links)


@pytest.mark.parametrize("after", ["", " MAUVE on 256 samples per generator is biased upwards."])
def test_the_synthetic_corpus_sentence_leaves_a_page_without_its_column_wherever_it_ends(tmp_path, after):
    """The report's sentence on the HMM's exact NLL goes where the table has no such column, both
    where another sentence follows it (256 samples: MAUVE's warning) and where it ends its paragraph."""
    from experiments.smollm2_results import page_report

    write_sweep(tmp_path)
    report = ("# Report\n\nintro\n\n## Generation\n\n`train_tokens` is each model's budget. `oracle_nll_per_word` is "
              "the exact NLL of the samples under the true HMM (synthetic corpora only; `oracle_invalid` counts samples "
              f"holding a word the HMM cannot emit, left out of it).{after}\n\n| generator | gen_ppl |\n|---|---|\n"
              "| results/mdlm | 824 |\n")
    page = page_report(tmp_path, report)
    assert "oracle_nll_per_word" not in page and "`train_tokens` is each model's budget." in page
    assert after.strip() in page


def test_a_sweep_stopped_while_drawing_its_plots_leaves_no_sweep_json_to_skip_it(tmp_path, monkeypatch):
    import geoprobe.report.plots
    from geoprobe.workflows.sweep import write_sweep as write_run_sweep

    write_sweep(tmp_path)
    stored = json.loads((tmp_path / "sweep.json").read_text())
    (tmp_path / "sweep.json").unlink()

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(geoprobe.report.plots, "sweep_plot", interrupted)
    try:
        write_run_sweep(tmp_path, stored["rows"], stored["verdict"], "tiny")
    except KeyboardInterrupt:
        pass
    assert not (tmp_path / "sweep.json").exists() and not swept(tmp_path, "0,1,2")  # the script reruns the sweep
    monkeypatch.undo()
    write_run_sweep(tmp_path, stored["rows"], stored["verdict"], "tiny")
    assert (tmp_path / "plots" / "sweep.png").is_file() and swept(tmp_path, "0,1,2")


def test_finished_bridges_are_recorded_without_weights_and_restored_into_a_fresh_run(tmp_path, capsys):
    run, records = tmp_path / "run", tmp_path / "records"
    finished, ceiling, unfinished = (run / "bridges" / name for name in
                                     ("layer-01/seed-0", "layer-01/ceiling", "layer-02/seed-0"))
    for bridge in (finished, ceiling, unfinished):
        bridge.mkdir(parents=True)
        (bridge / "config.json").write_text(f'{{"bridge": "{bridge.name}"}}')
        (bridge / "curve.csv").write_text("step,loss\n0,1.0\n")
        (bridge / "checkpoint.safetensors").write_bytes(b"weights")
    for bridge in (finished, ceiling):
        (bridge / "metrics.json").write_text(json.dumps({"nmse_dim": 0.03}))
        (bridge / "model.safetensors").write_bytes(b"weights")
    (run / "bridges" / "layer-01" / "controls.json").write_text('{"lookup": 0.04}')
    assert record(run, records) == 2 and record(run, records) == 0  # once each, the unfinished not at all
    logged = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[done]")]
    assert logged == ["[done] layer-01/ceiling: validation nmse_dim 0.0300",
                      "[done] layer-01/seed-0: validation nmse_dim 0.0300"]  # one line each, when recorded
    kept = sorted(str(p.relative_to(records)) for p in records.rglob("*") if p.is_file())
    assert kept == ["bridges/layer-01/ceiling/config.json", "bridges/layer-01/ceiling/curve.csv",
                    "bridges/layer-01/ceiling/metrics.json", "bridges/layer-01/controls.json",
                    "bridges/layer-01/seed-0/config.json", "bridges/layer-01/seed-0/curve.csv",
                    "bridges/layer-01/seed-0/metrics.json"]  # no weights
    fresh = tmp_path / "fresh"
    mine = fresh / "bridges" / "layer-01" / "ceiling"
    mine.mkdir(parents=True)
    (mine / "config.json").write_text('{"resuming": true}')  # a bridge of the fresh run's own: kept as it is
    killed = fresh / "bridges" / "layer-01" / "seed-0"
    killed.mkdir(parents=True)
    (killed / ".geoprobe.lock").write_text("1")  # a run killed before it wrote anything: restored into
    assert restore(fresh, records) == 1
    for name in ("config.json", "curve.csv", "metrics.json"):
        assert (fresh / "bridges/layer-01/seed-0" / name).read_bytes() == (finished / name).read_bytes()
    assert (fresh / "bridges/layer-01/controls.json").read_text() == '{"lookup": 0.04}'
    assert (mine / "config.json").read_text() == '{"resuming": true}' and not (mine / "metrics.json").exists()
    assert restore(fresh, records) == 0


def test_a_failing_step_is_not_logged_runs_again_and_once_finished_is_skipped(tmp_path, capsys):
    """A generation step in this process (`bridge`, refused by the library before anything loads):
    its failure ends the step unlogged, so the next invocation runs it again; the records' copy
    runs once after each try and its own failure only warns; once its output exists the step is
    skipped without its command."""
    from geoprobe.errors import BadInput

    calls, log, done = [], {}, tmp_path / "metrics.json"

    def during():
        calls.append(1)
        raise OSError("disk full")

    for attempt in (1, 2):
        with pytest.raises(BadInput, match="--layer must be >= 0"):  # the command's own failure ends the step
            in_process("bridge", "--layer", "-1", "--out", tmp_path, done=done, log=log, name="bad", during=during)
        assert log == {} and calls == [1] * attempt  # once after the command (it ended within the first minute)
    out = capsys.readouterr().out
    assert out.count(f"[run ] bad: geoprobe bridge --layer -1 --out {tmp_path}") == 2
    assert "[warn] OSError: disk full" in out
    done.write_text("{}")  # finished: skipped, so the command (which would fail) is not run
    in_process("bridge", "--layer", "-1", "--out", tmp_path, done=done, log=log, name="bad", during=during)
    assert calls == [1, 1] and log == {} and "[skip] bad" in capsys.readouterr().out


def test_a_step_the_parser_refuses_or_that_exits_nonzero_raises_and_is_not_logged(tmp_path, monkeypatch):
    """A step's flags go through the CLI's own parser: a value it refuses raises its usage error
    (exit code 2) before the command runs; a command that exits with a nonzero code raises
    typer.Exit with it, in the script as in `main`; neither is logged. The root's options may
    follow the command's name (global_first), as on the command line."""
    import typer

    from geoprobe.cli.app import app
    from geoprobe.cli.options import state
    from tests.helpers import invoke

    log, copies = {}, []
    with pytest.raises(Exception) as refused:  # Typer's click usage error, as `main` reports it
        in_process("sweep", "--run", tmp_path, "--steps", "many", done=None, log=log, name="sweep",
                   during=lambda: copies.append(1))
    assert refused.value.format_message().startswith("Invalid value for '--steps'")
    assert refused.value.exit_code == 2 and log == {} and copies == [1]
    assert not (tmp_path / "bridges").exists()  # the command never ran

    seen = []
    monkeypatch.setattr(app, "registered_commands", list(app.registered_commands))  # the test's command goes after

    @app.command("exits")
    def exits(code: int = 0):
        seen.append((code, state.format, state.quiet))
        raise typer.Exit(code)

    with pytest.raises(typer.Exit) as ended:
        in_process("exits", "--code", 3, done=None, log=log, name="exits")
    assert ended.value.exit_code == 3 and log == {}
    in_process("exits", "--code", 0, "--format", "json", "-q", done=None, log=log, name="exits")
    assert seen == [(3, "table", False), (0, "json", True)] and log["exits"]["command"] == \
        "geoprobe exits --code 0 --format json -q"
    assert invoke("exits", "--code", 4)[0] == 4  # `main` exits with the code invoke raises


def test_a_step_in_process_writes_the_run_and_prints_what_the_command_does_as_a_process(tmp_path, tiny_models,
                                                                                    corpus_txt, capsys):
    """`geoprobe scan` of the tiny Llama as a step of the script and as a fresh process (the same
    thread count): the same ranking, the same run configuration, and the same ranking table on
    stdout, which is not a terminal here (a log file's case: no progress-bar frames on stderr)."""
    import torch

    from tests.helpers import SCAN, flags, read_json, run_cli

    scan = ["scan", tiny_models("llama"), "--corpus", corpus_txt, *flags(SCAN)]
    capsys.readouterr()  # what building the tiny model printed
    log = {}
    in_process(*scan, "--out", tmp_path / "here", done=tmp_path / "here" / "ranking.csv", log=log, name="scan")
    here = capsys.readouterr()
    apart = run_cli(*scan, "--out", tmp_path / "apart", env={"OMP_NUM_THREADS": str(torch.get_num_threads())})
    assert apart.returncode == 0, apart.stderr
    assert (tmp_path / "here" / "ranking.csv").read_text() == (tmp_path / "apart" / "ranking.csv").read_text()
    assert read_json(tmp_path / "here" / "manifest.json")["config"] == read_json(tmp_path / "apart" / "manifest.json")["config"]
    table = here.out[here.out.index("\n") + 1:]  # after the script's own [run ] line; its paths are --out's
    assert "layer ranking" in table and table.replace(str(tmp_path / "here"), str(tmp_path / "apart")) == apart.stdout
    assert "\r" not in here.err and "\x1b[" not in here.err
    assert log["scan"]["command"] == "geoprobe " + " ".join(map(str, scan + ["--out", tmp_path / "here"]))
    in_process(*scan, "--out", tmp_path / "here", done=tmp_path / "here" / "ranking.csv", log={}, name="scan")
    assert capsys.readouterr().out.startswith("[skip] scan")


def test_the_script_ends_a_refused_or_interrupted_step_with_the_commands_one_line_and_code(tmp_path, monkeypatch,
                                                                                             capsys):
    """A step's BadInput ends the script with exit 2, its Ctrl-C (Interrupted, which the CLI makes of
    it) with 130, each as the one line the command prints; the timings keep nothing of the step."""
    import experiments.smollm2_results as script
    from geoprobe.cli.root import INTERRUPTED
    from geoprobe.errors import BadInput, Interrupted

    import click

    monkeypatch.setattr(sys, "argv", ["smollm2_results", "--out", str(tmp_path)])
    for error, code, said in ((BadInput("--layer must be >= 0"), 2, "error: --layer must be >= 0\n"),
                              (Interrupted(INTERRUPTED), 130, f"error: {INTERRUPTED}\n"),
                              (click.UsageError("No such option: --snrr"), 2, "error: No such option: --snrr\n"),
                              (click.exceptions.Exit(3), 3, "")):  # a command's own nonzero code, no traceback
        def failing(*args, error=error, **where):
            raise error

        monkeypatch.setattr(script, "in_process", failing)
        with pytest.raises(SystemExit) as ended:
            script.main()
        assert ended.value.code == code and capsys.readouterr().err == said
    assert json.loads((tmp_path / "timings.json").read_text()) == {}


def test_every_step_of_the_script_reaches_its_commands_library_call(tmp_path, monkeypatch):
    """Every step the script makes (the scan and the sweep of SmolLM2's two sweeps and Gemma's, and
    every --generation step), run as the script runs it, passes the CLI's parser and reaches the
    library call of its command: a flag the script spells but the CLI does not know fails here."""
    import functools

    import geoprobe.bridges.dsl
    import geoprobe.bridges.embedding_diffusion
    import geoprobe.cli.baseline
    import geoprobe.cli.bridge
    import geoprobe.cli.dsl
    import geoprobe.cli.evaluate
    import geoprobe.cli.sample
    import geoprobe.pipeline
    import geoprobe.workflows.compare
    import geoprobe.workflows.evaluate
    import geoprobe.workflows.generate
    import geoprobe.workflows.sweep
    import dataclasses

    import experiments.smollm2_results as script
    from experiments.smollm2_results import experiment, generation

    class Reached(Exception):  # the call stops there
        pass

    def recorder(function):
        @functools.wraps(function)
        def called(*args, **kwargs):
            raise Reached(function.__name__)
        return called

    calls = [((geoprobe.pipeline,), "scan"),  # `scan` imports it when it runs
             ((geoprobe.workflows.sweep, geoprobe.cli.bridge), "sweep_run"),
             ((geoprobe.workflows.sweep, geoprobe.cli.bridge), "bridge_run"),
             ((geoprobe.bridges.dsl, geoprobe.cli.dsl), "fit_dsl"),
             ((geoprobe.bridges.embedding_diffusion, geoprobe.cli.baseline), "fit_baseline"),
             ((geoprobe.workflows.generate, geoprobe.cli.sample), "generate"),
             ((geoprobe.workflows.evaluate, geoprobe.cli.evaluate), "evaluate_samples"),
             ((geoprobe.workflows.compare,), "compare_run")]  # `compare` imports it when it runs
    for modules, name in calls:
        fake = recorder(getattr(modules[0], name))
        for module in modules:
            monkeypatch.setattr(module, name, fake)
    steps = []

    def step(name, *argv, done, during=None):
        steps.append((name, argv))

    class Swept(Exception):  # the script's steps after its sweep are the page's, not commands
        pass

    def recorded(*argv, done, log, name, during=None):
        steps.append((name, argv))
        if argv[0] == "sweep":
            raise Swept

    choice = tmp_path / "choice.json"
    choice.write_text(json.dumps({"sigma_b": 2, "tau_zero": 0.25, "bridge_steps": 8, "confirmed": True}))
    monkeypatch.setattr(script, "in_process", recorded)
    for i, exp in enumerate((experiment(), experiment(bridge="diffusion", choice=choice),
                             experiment("builtin:gemma3", "diffusion", choice=choice))):
        # the script's own scan and sweep steps, with its out dir and records moved under tmp_path
        exp = dataclasses.replace(exp, out=tmp_path / f"exp{i}", record=tmp_path / f"records{i}", shared_scan=None,
                                  ceilings=None)
        with pytest.raises(Swept):
            script.run_experiment(exp)
    assert [argv[0] for _, argv in steps] == ["scan", "sweep"] * 3
    monkeypatch.setattr(script, "in_process", in_process)
    run = tmp_path / "run"
    run.mkdir()
    write_sweep(run)  # its bridges have no weights: the sampled ones are trained again too
    generation(tmp_path, run, step, ["--device", "cpu"])
    expected = {"scan": "scan", "sweep": "sweep_run", "dsl": "fit_dsl", "baseline": "fit_baseline",
                "bridge": "bridge_run", "sample": "generate", "eval": "evaluate_samples", "compare": "compare_run"}
    assert {argv[0] for _, argv in steps} == set(expected)
    for name, argv in steps:
        with pytest.raises(Reached) as reached:
            in_process(*argv, done=None, log={}, name=name)
        assert str(reached.value) == expected[argv[0]], name


@pytest.mark.slow
def test_the_parallel_sweep_gives_the_sequential_sweeps_rows(tmp_path, scanned_run):
    """experiments/parallel_sweep.py (one sweep per layer, side by side, then one that only writes the
    verdict) against `geoprobe sweep` over the same layers on a copy of the run: with the same thread
    count the rows are the same numbers (every column but the clocks), ceilings included."""
    import csv
    import os
    import shutil
    import sys

    small = ["--steps", "20", "--eval-every", "5", "--batch-size", "4", "--seq-len", "32", "--d-model", "32",
             "--n-layers", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    together, alone = shutil.copytree(scanned_run, tmp_path / "a" / "run"), shutil.copytree(scanned_run, tmp_path / "b")
    subprocess.run([sys.executable, "-m", "experiments.parallel_sweep", "--run", together, "--layers", "1-2",
                    "--seeds", "0,1", "--jobs", "2", "--device", "cpu", *small], env=env, check=True)
    subprocess.run([sys.executable, "-m", "geoprobe", "-q", "sweep", "--run", alone, "--layers", "1-2", "--seeds", "0,1",
                    "--ceiling", "--device", "cpu", *small, "--regression"], env=env, check=True)  # SWEEP's bridges
    rows = [list(csv.DictReader((run / "sweep.csv").open())) for run in (together, alone)]
    assert [(r["layer"], r["seed"]) for r in rows[0]] == [("1", "0"), ("1", "1"), ("2", "0"), ("2", "1")]
    assert all(r["ceiling_nmse_dim"] for r in rows[0])
    clocks = [k for k in rows[0][0] if "second" in k]
    assert [{k: v for k, v in r.items() if k not in clocks} for r in rows[0]] == \
        [{k: v for k, v in r.items() if k not in clocks} for r in rows[1]]


def test_a_parallel_sweep_past_its_deadline_trains_nothing_and_writes_no_verdict(tmp_path, scanned_run):
    """A deadline already passed when the parts would start: every layer counts as unfinished, the
    script fails naming them, and the last sweep (which would train them one by one) never runs."""
    import os
    import shutil
    import sys

    run = shutil.copytree(scanned_run, tmp_path / "run")
    done = subprocess.run([sys.executable, "-m", "experiments.parallel_sweep", "--run", run, "--layers", "1-2",
                           "--device", "cpu", "--deadline", "0"], env={**os.environ, "HF_HUB_OFFLINE": "1"},
                          capture_output=True, text=True)
    assert done.returncode != 0 and "layers [1, 2] did not finish" in done.stderr
    assert not (run / "sweep.json").exists() and not list(run.rglob("metrics.json"))


def test_a_bridge_with_every_default_trains_as_the_bridges_of_make_results():
    """`geoprobe bridge --run RUN --layer L` with no flags is the bridge `make results` trains with
    its explicit cap and rule (issue 31, section 2: "with every default ... stops by its plateau")."""
    from experiments.smollm2_results import CAP_AND_RULE
    from geoprobe.workflows.sweep import bridge_settings

    explicit = dict(zip(("steps", "eval_every"), CAP_AND_RULE[1::2]))
    assert bridge_settings().training() == bridge_settings(**explicit).training()
    rule = bridge_settings().training()
    assert (rule.steps, rule.eval_every, rule.min_steps, rule.warmup) == (4000, 50, 250, 100)
    assert bridge_settings(steps=200).training().eval_every == 5  # a short run keeps 40 checks


def test_the_shape_study_pairs_each_variant_with_the_sweeps_bridge_of_its_seed(tmp_path, monkeypatch):
    """The registered rule of docs/bridge-design.md's shape study on made-up bridges: r against the
    sweep's seed 0, δ from the default's own seed ratio (at least log 1.02), a capped variant counts
    only as better, and the step-matched ratio takes both curves' best up to the earlier stop."""
    import math

    from bench.bridge_design import shape_study

    monkeypatch.setattr("experiments.records.SMOLLM2", tmp_path / "records")  # not the real sweep's

    def bridge(nmse_dim, stop="plateau", steps=3000, curve=((0, 0.3), (1000, 0.2), (3000, 0.1))):
        return {"nmse_dim": nmse_dim, "stop": stop, "steps_run": steps, "val_curve": [list(p) for p in curve]}

    def study(variant, seeds, seed=0):
        for s, metrics in seeds.items():
            folder = tmp_path / f"run{len(seeds)}" / "bridges" / "layer-03" / f"seed-{s}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "metrics.json").write_text(json.dumps(metrics))
        row, = shape_study([{**variant, "layer": 3, "variant": "shape width x0.6", "shape": "192x2", "seed": seed}],
                           tmp_path / f"run{len(seeds)}")
        return row

    seeds = {0: bridge(0.100), 1: bridge(0.104, steps=1900)}  # δ = log 1.04
    for nmse_dim, stop, verdict in ((0.103, "plateau", "within noise"), (0.097, "plateau", "within noise"),
                                    (0.110, "plateau", "worse"), (0.095, "plateau", "better"),
                                    (0.099, "cap", "unconverged"), (0.090, "cap", "better")):
        row = study(bridge(nmse_dim, stop), seeds)
        assert row["verdict"] == verdict, (nmse_dim, stop)
        assert row["r"] == pytest.approx(nmse_dim / 0.100) and row["δ"] == pytest.approx(0.04)
    alone = study(bridge(0.103), {0: bridge(0.100)})  # no second seed: δ is the rule's 2 %
    assert alone["δ"] == pytest.approx(0.02) and alone["verdict"] == "worse"
    early = study(bridge(0.15, steps=1000, curve=((0, 0.3), (500, 0.18), (1000, 0.15))), seeds)
    assert early["step-matched"] == pytest.approx(0.15 / 0.2)  # the default's best up to step 1,000
    assert math.isclose(early["r"], 1.5)
    confirming = study(bridge(0.0988), seeds, seed=1)  # a seed-1 run pairs with the sweep's seed 1 (0.104)
    assert confirming["seed"] == 1 and confirming["r"] == pytest.approx(0.0988 / 0.104)
    assert confirming["δ"] == pytest.approx(0.04) and confirming["verdict"] == "better"
    unpaired = study(bridge(0.0988), {0: bridge(0.100)}, seed=1)  # the sweep's seed 1 has not trained there
    assert unpaired["verdict"].startswith("no sweep bridge of seed 1") and "r" not in unpaired

    # the combined shape pairs with width x 1.6's run of its layer and seed, δ still the sweep's
    combined = {**bridge(0.090), "layer": 3, "variant": "shape width x1.6 depth x2", "shape": "512x4", "seed": 0}
    wider = {**bridge(0.095), "layer": 3, "variant": "shape width x1.6", "shape": "512x2", "seed": 0}
    both = {row["variant"]: row for row in shape_study([wider, combined], tmp_path / "run2")}
    assert both["shape width x1.6"]["paired with"] == "sweep" and both["shape width x1.6"]["r"] == pytest.approx(0.95)
    assert both["shape width x1.6 depth x2"]["paired with"] == "shape width x1.6"
    assert both["shape width x1.6 depth x2"]["r"] == pytest.approx(0.090 / 0.095)
    assert both["shape width x1.6 depth x2"]["verdict"] == "better"  # log(0.947) = -0.054 < -log 1.04
    alone, = shape_study([combined], tmp_path / "run2")
    assert alone["verdict"].startswith("no shape width x1.6 bridge of seed 0") and "r" not in alone


@pytest.mark.parametrize("finetune", [True, False])
def test_without_finetune_the_generation_section_neither_trains_nor_samples_dsl_from_smollm2(tmp_path, finetune):
    from experiments.smollm2_results import BUDGET, generation

    run = tmp_path / "run"
    run.mkdir()
    write_sweep(run)
    verdict = json.loads((run / "sweep.json").read_text())["verdict"]
    for role in ("chosen", "worst", "oracle"):  # the sweep's own weights: nothing is retrained
        folder = run / "bridges" / f"layer-{verdict[role + '_layer']:02d}" / "seed-0"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "model.safetensors").touch()
    commands = []
    generation(tmp_path, run, lambda name, *argv, done, during=None: commands.append((name, argv)), ["--device", "cpu"],
               finetune=finetune)
    names = [name for name, _ in commands]
    assert {"train dsl", "train mdlm", "train diffusion-lm", "train sed", "train codar", "sample ar"} <= set(names)
    # the rounding row's layer-0 bridge trains the generators' whole budget, not to the plateau rule
    # (which stops it at its start: its clean score is the lookup's), into its own folder
    layer0 = dict(commands)["bridge layer 0"]
    assert "--until" in layer0 and layer0[layer0.index("--until") + 1] == "steps"
    assert layer0[layer0.index("--steps") + 1] == BUDGET["steps"] and "--eval-every" not in layer0
    out = Path(layer0[layer0.index("--out") + 1])
    assert dict(commands)["sample round-00"][1:3] == ("--model", out / "bridges" / "layer-00" / "seed-0")
    mentions = [name for name, argv in commands if "dsl-smollm2" in name or any("dsl-smollm2" in str(a) for a in argv)]
    if finetune:
        assert "train dsl-smollm2" in names and "sample dsl-smollm2-hybrid" in names
    else:
        assert mentions == []


def test_before_sweep_trains_the_generators_only_and_keeps_the_other_runs_timings(tmp_path, monkeypatch):
    """--generation --before-sweep: the steps that need no sweep (the generators and the layer-0
    bridge) and nothing after them; the timings file it shares with a `make results` running beside
    it keeps that run's entries."""
    import experiments.smollm2_results as script

    ran, timings = [], tmp_path / "timings.json"

    def fake(*args, done, log, name, during=None):
        ran.append(name)
        if name == "train mdlm":  # the make results beside it finishes its sweep step meanwhile
            script.add_timings(timings, {"sweep": {"seconds": 7.0, "command": "geoprobe sweep"}})
        log[name] = {"seconds": 1.0, "command": "geoprobe " + " ".join(map(str, args))}

    monkeypatch.setattr(script, "in_process", fake)
    monkeypatch.setattr(script, "RECORD", tmp_path / "records")
    argv = ["smollm2_results", "--out", str(tmp_path), "--generation", "--before-sweep", "--without-finetune"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit):  # no scan yet: it trains beside a sweep, which needs one
        script.main()
    assert ran == [] and not timings.exists()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "ranking.csv").write_text("layer\n")
    script.main()
    assert ran == ["train dsl", "train mdlm", "train diffusion-lm", "train sed", "train codar", "bridge layer 0"]
    log = json.loads(timings.read_text())
    assert log["sweep"]["seconds"] == 7.0 and set(ran) <= set(log)
    monkeypatch.setattr(sys, "argv", ["smollm2_results", "--out", str(tmp_path), "--before-sweep"])
    with pytest.raises(SystemExit):  # a part of --generation
        script.main()
    # the recipe runs after the generation's rows, which --before-sweep stops before: refused, not ignored
    monkeypatch.setattr(sys, "argv", [*argv, "--recipe"])
    ran.clear()
    with pytest.raises(SystemExit):
        script.main()
    assert ran == []
    # --recipe-models: only the recipe's models, in their timed steps, beside a running --generation
    (n, m) = script.RECIPE["steps"]
    for extra in (["--before-sweep"], ["--recipe"]):  # it stops by itself: neither goes with it
        monkeypatch.setattr(sys, "argv", ["smollm2_results", "--out", str(tmp_path), "--generation", "--recipe-models",
                                          *extra])
        with pytest.raises(SystemExit):
            script.main()
    assert ran == []
    monkeypatch.setattr(sys, "argv", ["smollm2_results", "--out", str(tmp_path), "--generation", "--recipe-models"])
    script.main()
    samplers = script.RECIPE["samplers"]
    assert ran == [name for seed in script.RECIPE["seeds"] for name in (
        f"recipe: train mdlm-{n} seed {seed}", f"recipe: train mdlm-{n}-dsl-{m} seed {seed}",
        *[f"recipe: sample recipe-seed{seed}-{s}" for s in samplers], f"recipe: eval recipe seed {seed}",
        f"recipe: train mdlm-{n + m} seed {seed}", *[f"recipe: sample mdlm-long-seed{seed}-{s}" for s in samplers],
        f"recipe: eval mdlm-long seed {seed}")]
    assert not (tmp_path / "recipe" / "recipe.json").exists()  # the result is --recipe's
    assert set(ran) <= set(json.loads(timings.read_text()))


def test_the_sweeps_pinned_width_gives_the_networks_of_its_recorded_bridges():
    """SWEEP pins the width its sweep started with: at every layer the network it resolves to is the
    one the tracked records of that sweep's finished bridges hold (so a resumed sweep trains its
    remaining bridges like the first, whatever bridge_shape's default becomes; a change of the
    default depth fails here, and must be pinned too). The shape study scales its variants from
    the same shape."""
    from dataclasses import asdict, replace

    from bench.bridge_design import base_shape
    from experiments.smollm2_results import RECORD, SWEEP
    from geoprobe.bridges.fit import OLDER_TRAINING
    from geoprobe.bridges.hidden import OLDER_BRIDGES

    def recorded_seed(config):
        return int(config.parent.name.split("-")[1])

    from types import SimpleNamespace

    from geoprobe.workflows.sweep import bridge_settings

    pairs = [a for a in SWEEP if a not in ("--ceiling", "--regression")]  # every other flag of SWEEP's takes a value
    flags = {name[2:].replace("-", "_"): value for name, value in zip(pairs[::2], pairs[1::2]) if name != "--layers"}
    settings = bridge_settings(**flags, regression="--regression" in SWEEP)
    compared = 0
    for config in sorted((RECORD / "bridges").glob("layer-*/seed-*/config.json")):
        recorded = {**OLDER_BRIDGES, **json.loads(config.read_text())["network"]}  # as check_bridge_dir reads it
        backbone = SimpleNamespace(config=SimpleNamespace(vocab_size=recorded["vocab_size"]),
                                   hidden_size=recorded["hidden_size"])
        pinned = asdict(replace(settings.network_at(recorded["layer"], backbone), support_size=recorded["support_size"]))
        assert pinned == recorded, config
        training = {**OLDER_TRAINING, **json.loads(config.read_text())["training"]}  # as check_bridge_dir reads it
        assert training == {**asdict(settings.training()), "seed": recorded_seed(config)}, config
        assert base_shape(recorded["hidden_size"], recorded["layer"]) == (
            recorded["d_model"], recorded["n_layers"], recorded["n_heads"]), config
        compared += 1
    assert compared >= 12  # seed 0 of layers 1-12 at least


def test_the_default_shape_is_the_study_width_x16_variant_that_was_confirmed():
    """bridge_shape, the CLI's default since the shape study's decision (docs/bridge-design.md), is
    the study's own width x 1.6 variant of the shape of 2026-12-03 (bench/bridge_design.scaled, the
    networks that were measured) at every d and layer, not a re-derivation of it: the same
    rounding (halves up), the same depth, heads of 64 channels. The sweep's pinned width stays 320."""
    from bench.bridge_design import base_shape, scaled
    from experiments.smollm2_results import SHAPE
    from geoprobe.bridges.hidden import bridge_shape

    wider = scaled(width=1.6)
    for d in (16, 64, 200, 256, 320, 576, 960, 1024, 1536, 2048, 2304, 3584, 4096, 5120, 8192):
        for layer in (0, 1, 3, 7, 9, 12, 16, 31):
            width, depth, heads = base_shape(d, layer)
            study = wider(width, depth)
            assert bridge_shape(d, layer) == (study["d_model"], study["n_layers"], study["n_heads"]), (d, layer)
    assert bridge_shape(576, 3) == (512, 2, 8) and bridge_shape(4096, 16) == (1664, 6, 26)
    assert bridge_shape(64, 9)[0] == 192 and SHAPE == ["--d-model", 320]


def test_keep_pages_preloads_jemalloc_where_installed_and_passes_the_commands_status_through():
    """experiments/keep-pages, the long runs' wrapper: the command runs with jemalloc keeping its
    pages where the library is installed (glibc otherwise), its exit status is the command's, and
    with no command it says whether the library is there."""
    import glob

    wrapper = str(Path(__file__).resolve().parents[1] / "experiments" / "keep-pages")
    installed = bool(glob.glob("/usr/lib/*/libjemalloc.so.2"))
    done = subprocess.run(["sh", wrapper, "sh", "-c", 'echo "$LD_PRELOAD|$MALLOC_CONF"; exit 3'],
                          capture_output=True, text=True, env={"PATH": os.environ["PATH"]})
    preload, conf = done.stdout.strip().split("|")
    assert done.returncode == 3
    assert ("libjemalloc.so.2" in preload) == installed and ("retain:true" in conf) == installed
    assert subprocess.run(["sh", wrapper]).returncode == (0 if installed else 1)


def test_the_width_decisions_check_rescales_each_layer_by_its_interpolated_gain(tmp_path):
    """bench/bridge_design.gain_corrected on made-up rows: log r interpolated between the measured
    layers and held beyond them, the tilts at the ends of the compared layers, a common gain that
    leaves the rank test as it was (Spearman sees ranks only), and a tilt strong enough to undo a
    depth-ordered loss's support (the check can fail)."""
    import math

    from bench.bridge_design import gain_corrected

    write_sweep(tmp_path)
    rows = json.loads((tmp_path / "sweep.json").read_text())["rows"]
    seen = []

    def verdict_of(scaled):
        seen.append({(r["layer"], r["seed"]): r["nmse_dim"] for r in scaled})
        return sweep_verdict(scaled, {"score": {layer: -float(layer) for layer in LAYERS}}, {})

    plain = verdict_of(rows)["tests"]["nmse_dim"]
    common = gain_corrected(rows, {3: 0.9, 7: 0.9, 9: 0.9}, 0.0, verdict_of)
    assert all(c["rho"] == pytest.approx(plain["rho"]) and c["p"] == pytest.approx(plain["p"]) for c in common)
    assert seen[1][(5, 0)] == pytest.approx(0.9 * 0.05)

    seen.clear()
    checks = gain_corrected(rows, {3: 0.8, 9: 0.9}, 0.05, verdict_of)
    measured, up, down = seen
    assert measured[(1, 0)] == pytest.approx(0.8 * 0.01) and measured[(12, 0)] == pytest.approx(0.9 * 0.12)
    assert measured[(6, 0)] == pytest.approx(math.sqrt(0.8 * 0.9) * 0.06)  # halfway between 3 and 9, in log r
    assert up[(12, 0)] / measured[(12, 0)] == pytest.approx(math.exp(0.05))  # (12 - 6.5) / 5.5 = 1
    assert down[(1, 0)] / measured[(1, 0)] == pytest.approx(math.exp(0.05))
    assert [c["scaling"] for c in checks] == ["measured gains", "tilted up with depth", "tilted down with depth"]
    assert checks[0]["supports"]  # the made-up loss rises with the layer as the score falls

    reversed_ = gain_corrected(rows, {3: 1.0, 9: 1.0}, 2.0, verdict_of)[2]  # down-tilt e^-2 to e^2: order undone
    assert not reversed_["supports"] and reversed_["rho"] > 0


def test_the_page_says_how_much_the_shape_studys_wider_bridges_beat_the_sweeps(tmp_path):
    """The results page's line on the bridges' shape: every tracked width x 1.6 record with a sweep
    bridge of its seed to pair with, its r computed here from the two records' metrics."""
    from bench.bridge_design import RECORDS
    from experiments.smollm2_results import RECORD, shape_line

    write_sweep(tmp_path)  # the run's own bridges folder is empty: the pairs come from the records
    line = shape_line(tmp_path)
    pairs = 0
    for path in sorted((RECORDS / "shape-width-x1.6" / "bridges").glob("layer-*/seed-*/metrics.json")):
        layer, seed = path.parent.parent.name, path.parent.name
        sweep = RECORD / "bridges" / layer / seed / "metrics.json"
        if sweep.is_file():
            r = json.loads(path.read_text())["nmse_dim"] / json.loads(sweep.read_text())["nmse_dim"]
            assert f"layer {int(layer[6:])} seed {int(seed[5:])}: r {r:.2f}" in line
            pairs += 1
    assert pairs >= 2 and "320 wide" in line


def test_status_lists_finished_and_training_bridges_and_counts_the_rest(tmp_path):
    """--status, read from a made-up run: a finished bridge (its metrics), one training (its
    checkpoint's metadata, as train.py writes it), and the rest counted as waiting in the sweep's
    order (seed by seed, then the ceilings)."""
    import torch
    from safetensors.torch import save_file

    from experiments.smollm2_results import progress

    done = tmp_path / "bridges" / "layer-01" / "seed-0"
    done.mkdir(parents=True)
    (done / "metrics.json").write_text(json.dumps({"stop": "plateau", "steps_run": 500, "nmse_dim": 0.0331}))
    running = tmp_path / "bridges" / "layer-02" / "seed-0"
    running.mkdir(parents=True)
    save_file({"w": torch.zeros(1)}, running / "checkpoint.safetensors",
              metadata={"step": "1200", "seconds": "600.0", "val_curve": json.dumps([[0, 0.3], [1200, 0.1234]])})
    lines = progress(tmp_path, "0,1")
    assert lines[0] == "layer  1, seed 0: plateau at step 500, validation nmse_dim 0.0331"
    assert lines[1] == "layer  2, seed 0: training, step 1,200, stopping split 0.1234, 10 min so far"
    assert lines[-1] == "1 of 36 finished; 34 waiting, next layer  3, seed 0"  # 12 layers x 2 seeds + 12 ceilings


def test_shape_study_status_reads_its_own_variant_folders(tmp_path, monkeypatch, capsys):
    """bench/bridge_design.py --status: the same lines as the sweep's --status, for the variants,
    layers and seed asked, read from --out without restoring or training anything."""
    from bench import bridge_design

    done = tmp_path / "shape-width-x1.6" / "bridges" / "layer-03" / "seed-1"
    done.mkdir(parents=True)
    (done / "metrics.json").write_text(json.dumps({"stop": "plateau", "steps_run": 2900, "nmse_dim": 0.1201}))
    monkeypatch.setattr(sys, "argv", ["bridge_design.py", "--status", "--layers", "3,9", "--variants", "15",
                                      "--seed", "1", "--out", str(tmp_path)])
    bridge_design.main()
    assert capsys.readouterr().out.splitlines() == [
        "shape width x1.6, layer 3, seed 1: plateau at step 2,900, validation nmse_dim 0.1201",
        "1 of 2 finished; 1 waiting, next shape width x1.6, layer 9, seed 1"]
    # nothing restored into --out (the tracked records hold layer 3's and layer 9's seed-0 runs)
    assert [p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file()] == [done.relative_to(tmp_path) / "metrics.json"]


def test_hand_written_bullets_reach_the_page_marked_and_whole(tmp_path):
    write_sweep(tmp_path)
    notes = tmp_path / "notes.md"
    notes.write_text("# heading, not a bullet\n\nprose, not a bullet\n\n- one bullet\n  that goes on\n- two\n\n"
                     "## a later heading\n\nlater prose\n- three\nunindented: not a part of it\n")
    page = what_it_says(tmp_path, tmp_path, notes=notes).splitlines()
    marked = [l for l in page if "(written by hand" in l]
    assert marked == [f"- one bullet that goes on (written by hand: {notes})", f"- two (written by hand: {notes})",
                      f"- three (written by hand: {notes})"]
    assert page.index(marked[0]) > page.index(next(l for l in page if l.startswith("- Cost:")))  # after the computed
    assert not any("written by hand" in l for l in what_it_says(tmp_path, tmp_path, notes=tmp_path / "none.md").splitlines())


def test_generation_status_lists_the_models_it_trains_with_their_time_to_the_cap(tmp_path):
    """--status --generation: finished generators, one training (minutes to the 4,000-step cap at its
    rate so far), the sampled bridges to train again (the run's are records without weights), and
    the sample sets written (by their meta row, the resume marker)."""
    import torch
    from safetensors.torch import save_file

    from experiments.smollm2_results import BASELINES, BUDGET, generation_progress

    run = tmp_path / "run"
    run.mkdir()
    write_sweep(run)  # score -layer: chosen layer 1 (also the easiest), hardest 12
    (tmp_path / "dsl").mkdir()
    (tmp_path / "dsl" / "metrics.json").write_text(json.dumps({"train_loss": 3.2}))
    (tmp_path / "mdlm").mkdir()
    save_file({"w": torch.zeros(1)}, tmp_path / "mdlm" / "checkpoint.safetensors",
              metadata={"step": "1000", "seconds": "600.0", "val_curve": "[]"})
    sample = tmp_path / "samples" / "dsl-mdlm" / "samples.jsonl"
    sample.parent.mkdir(parents=True)
    sample.write_text("{}\n")
    half = tmp_path / "samples" / "mdlm-mdlm" / "samples.jsonl"  # its meta row not yet written: not counted
    half.parent.mkdir(parents=True)
    half.write_text("{}\n")
    (sample.parent / "samples.meta.jsonl").write_text("{}\n")
    lines = generation_progress(tmp_path, run, finetune=False)
    assert lines[0] == "train dsl: finished"
    left = (BUDGET["steps"] - 1000) * 0.6 / 60  # 0.6 s a step so far
    assert lines[1] == f"train mdlm: training, step 1,000, 10 min so far, about {left:.0f} min to its cap at this rate"
    waiting = len(BASELINES) + 3  # the baselines, then the layer-0 bridge and layers 1 and 12 again
    assert lines[2] == f"1 of {waiting + 2} finished; {waiting} waiting, next train {BASELINES[0]}"
    # rounding; the hybrid at layers 1 and 12, stack-only at 1, ltr at 1 and 12; DSL's 4 samplers at
    # 16, 8 and 4 steps; MDLM; the 3 baselines; AR. A set the plan does not hold is not counted
    stray = tmp_path / "samples" / "round-00-plateau" / "samples.jsonl"
    stray.parent.mkdir(parents=True)
    stray.write_text("{}\n")
    (stray.parent / "samples.meta.jsonl").write_text("{}\n")
    lines = generation_progress(tmp_path, run, finetune=False)
    assert lines[3] == "1 of 23 sample sets written, 0 evaluated, 0 with their rows"
    assert generation_progress(tmp_path, run)[3] == "1 of 27 sample sets written, 0 evaluated, 0 with their rows"  # + DSL-from-SmolLM2's 4
    # with the fine-tune, it is the next to train after mdlm
    assert generation_progress(tmp_path, run)[2].endswith(f"{waiting + 1} waiting, next train dsl-smollm2")
    assert lines[4] == "through the diffusion bridge: its chosen layer's seed-0 bridge has not finished"
    assert len(lines) == 5  # no recipe folder: no recipe lines
    # the recipe's models, each arm at its own steps (--recipe-models trains them beside)
    from experiments.smollm2_results import RECIPE, recipe_paths

    (n, m) = RECIPE["steps"]
    start = recipe_paths(tmp_path, 0)["start"]
    start.mkdir(parents=True)
    save_file({"w": torch.zeros(1)}, start / "checkpoint.safetensors",
              metadata={"step": "600", "seconds": "360.0", "val_curve": "[]"})
    lines = generation_progress(tmp_path, run, finetune=False)[5:]
    assert lines[0] == f"recipe start seed 0: training, step 600, 6 min so far, about {(n - 600) * 0.6 / 60:.0f} min " \
                       "to its cap at this rate"
    assert lines[1] == "0 of 3 finished; 2 waiting, next recipe start seed 1"
    assert lines[2] == "0 of 3 finished; 3 waiting, next recipe recipe seed 0"
    assert lines[3].startswith("recipe mdlm-long seed 0: training, step 1,000")  # seed 0's is mdlm, still training
    assert lines[4] == "0 of 3 finished; 2 waiting, next recipe mdlm-long seed 1"
    # a batched set a killed process left: how far it got (geoprobe sample resumes it)
    from geoprobe.workflows.generate import PARTIAL, save_partial

    save_partial(half.parent / PARTIAL, {"num": 1000}, {"done": 250})
    assert generation_progress(tmp_path, run, finetune=False)[4] == "partly drawn: mdlm-mdlm (250 of 1,000)"
    (half.parent / PARTIAL).unlink()
    (run / "sweep.json").unlink()  # before the sweep: no plan yet, every set written
    assert generation_progress(tmp_path, run, finetune=False)[3] == "2 sample sets written, 0 evaluated, 0 with their rows"


def test_the_generation_line_ranks_dihals_rows_only_where_their_intervals_are_disjoint():
    from experiments.smollm2_results import generation_line

    def row(generator, ppl, lo, hi, trigram=None, mauve=0.005, sampler="hybrid"):
        return {"generator": generator, "evaluator": "builtin:smollm2", "gen_ppl": ppl, "gen_ppl_lo": lo,
                "gen_ppl_hi": hi, "mauve": mauve, "other_evaluators": trigram, "sampler": sampler}

    verdict = {"chosen_layer": 3, "worst_layer": 12, "oracle_layer": 3}
    rows = [row("bridges/layer-03/seed-0", 3382, 3115, 3697, "ngram:kjv: 1.585e+04 (1.4e+04–1.7e+04)"),
            row("bridges/layer-00/seed-0 (round)", 107106, 100708, 113621, "ngram:kjv: 1.655e+05 (1.5e+05–1.8e+05)",
                sampler="mdlm"),
            row("bridges/layer-12/seed-0", 2026, 1879, 2183, "ngram:kjv: 4393 (4083–4762)"),
            {**row("results/sed", 1000, 900, 1100), "sampler": "ancestral", "train_tokens": 8e6},
            {**row("results/dsl", 5000, 4000, 6000, "ngram:kjv: 800 (700–900)"), "sampler": "mdlm", "train_tokens": 8e6},
            {**row("results/mdlm", 3000, 2500, 3500), "sampler": "mdlm", "train_tokens": 8e6},
            {**row("builtin:smollm2 (AR)", 40, 37, 45), "sampler": "ar", "train_tokens": None}]
    line = generation_line(verdict, rows)
    assert "chosen layer 3's bridge has Gen.PPL 3,382 (3,115–3,697) under SmolLM2, 15,850 (14,000–17,000) " \
           "under the KJV trigram, MAUVE 0.005" in line
    # 107,106 / 3,382 = 31.7; 165,500 / 15,850 = 10.4
    assert "the hybrid's is 32× lower under SmolLM2, 10× lower under the KJV trigram" in line
    assert "the worst layer 12's bridge Gen.PPL 2,026 (1,879–2,183) under SmolLM2, 4,393 (4,083–4,762) under the " \
           "KJV trigram, MAUVE 0.005 (the chosen layer's is 1.7× higher under SmolLM2, 3.6× higher under the KJV " \
           "trigram)" in line  # one decimal below 10
    assert "oracle layer" not in line  # the oracle is the chosen layer: one row, said once
    # every other trained generator (not the AR ceiling), per evaluator; sed and mdlm have no trigram figure
    assert "by Gen.PPL against the 3 rows of the other generators trained at the same budget, under SmolLM2 it is " \
           "lower than 1 (DSL · mdlm), higher than 1 (SED · ancestral), with intervals overlapping 1 (MDLM · mdlm); " \
           "under the KJV trigram it is higher than 1 (DSL · mdlm), not compared with 2 (SED · ancestral, " \
           "MDLM · mdlm)" in line
    assert "SmolLM2 sampled left to right (the AR row: a pretrained model not trained on the KJV here, so no ceiling " \
        "for KJV text) has Gen.PPL 40 (37–45) under SmolLM2" in line
    # as the real rows are: SmolLM2 is the bridges' and the AR row's own backbone (compare's own_evaluator). Its
    # figure for them carries a star and ranks nothing; the trigram still ranks them
    # (rounding decodes the layer-0 bridge by the nearest embedding: no upper stack, so not flagged)
    mine = [{**r, "own_evaluator": "builtin:smollm2"} if ("bridges/" in r["generator"] and "(round)" not in
            r["generator"]) or r["sampler"] == "ar" else r for r in rows]
    line = generation_line(verdict, mine)
    assert "chosen layer 3's bridge has Gen.PPL 3,382* (3,115–3,697) under SmolLM2, 15,850 (14,000–17,000) " \
           "under the KJV trigram" in line
    # against rounding, whose text SmolLM2's stack did not write, only the trigram ranks
    assert "the hybrid's is not ranked (* the backbone of one of the two) under SmolLM2, 10× lower under the KJV " \
           "trigram" in line
    # against the worst layer's bridge, whose text the same stack wrote, SmolLM2 ranks too (both share the bias)
    assert "(the chosen layer's is 1.7× higher under SmolLM2, 3.6× higher under the KJV trigram)" in line
    assert "under SmolLM2 it is not ranked (* the backbone of one of the two) against 3 (SED · ancestral, DSL · mdlm, " \
           "MDLM · mdlm); under the KJV trigram it is higher than 1 (DSL · mdlm)" in line
    assert "lower than 1 (DSL · mdlm)" not in line and "Gen.PPL 40* (37–45) under SmolLM2" in line
    assert line.endswith("`*`: Gen.PPL scored by the generator's own backbone, which wrote the text; it is ranked only "
                         "against rows that backbone wrote too.")
    # a bridge row against a row trained from scratch: not ranked under SmolLM2
    from experiments.smollm2_results import against

    assert against(mine[0], mine[4]) == "not ranked (* the backbone of one of the two) under SmolLM2, 20× higher " \
                                        "under the KJV trigram"
    # a row without MAUVE or a Gen.PPL (no references, nothing scored) is written without them
    bare = {**row("results/codar", None, None, None), "mauve": None, "sampler": "ancestral", "train_tokens": 8e6}
    assert "not compared with 1 (CoDAR · ancestral)" in generation_line(verdict, rows[:3] + [bare])
    assert "has no row" in generation_line(verdict, rows[1:])


def test_the_generation_section_opens_with_three_lines_under_the_evaluator_no_row_wrote():
    """What the table compares, the chosen bridge's rows beside the range of the rows trained from
    scratch under the KJV trigram (SmolLM2 wrote the bridge rows' text), and what that rests on."""
    from experiments.smollm2_results import generation_opening

    def row(generator, sampler, trigram, **kw):
        return {"generator": generator, "evaluator": "builtin:smollm2", "gen_ppl": 100.0, "gen_ppl_lo": 90.0,
                "gen_ppl_hi": 110.0, "other_evaluators": trigram, "sampler": sampler, "samples": 1000, **kw}

    verdict = {"chosen_layer": 3}
    rows = [row("bridges/layer-03/seed-0", "ltr", "ngram:kjv: 1357.49 (1251.05–1469.07)"),
            row("bridges/layer-03/seed-0", "hybrid", "ngram:kjv: 3607 (3434–3783)"),
            row("bridges/layer-03/seed-0 (stack-only)", "hybrid", "ngram:kjv: 18121 (17330–19016)"),
            row("results/dsl", "mdlm", "ngram:kjv: 800 (700–900)", train_tokens=8e6),
            row("results/mdlm", "mdlm", "ngram:kjv: 359 (340–380)", train_tokens=8e6),
            row("results/sed", "ancestral", None, train_tokens=8e6),  # no trigram figure: left out
            row("builtin:smollm2 (AR)", "ar", "ngram:kjv: 21422 (20000–23000)")]  # not trained here
    tested, outcome, rests = generation_opening(verdict, rows)
    assert tested.startswith("**Tested:** what DiHAL writes through SmolLM2's bridges") and "1,000 samples of 32" in tested
    assert outcome == ("**Outcome:** Under the KJV trigram, the layer-3 bridge's samples score Gen.PPL 1,357 (1,251–1,469) "
                       "left to right; 3,607 (3,434–3,783) in random order with the channel's evidence; 18,121 "
                       "(17,330–19,016) without it; the 2 rows trained from scratch at the same budget score 359 "
                       "(MDLM · mdlm) to 800 (DSL · mdlm).  ")
    assert rests.startswith("**Rests on:** one seed per row")
    assert generation_opening({"chosen_layer": 12}, rows) == []  # the chosen bridge has no rows: nothing to open with


def test_the_generation_plan_samples_the_chosen_bridge_three_ways_and_the_worst_left_to_right(tmp_path):
    """Run 3's DiHAL rows: the chosen bridge by the hybrid with the evidence (the default decode),
    without it (stack-only) and left to right; the worst bridge left to right too. The ltr rows
    take the AR row's flags (no --steps: one evaluation per token), and all are comparison rows."""
    from experiments.smollm2_results import SAMPLES, generation
    from geoprobe.samplers.plan import logits_bytes

    run = tmp_path / "run"
    run.mkdir()
    write_sweep(run)  # score -layer: chosen (and oracle) layer 1, worst 12; no weights, so trained again
    commands = []
    generation(tmp_path, run, lambda name, *argv, done, during=None: commands.append((name, argv)), ["--device", "cpu"],
               finetune=False)
    found = dict(commands)

    def flags(argv):  # {flag: value} of a sample command (--out aside)
        return {a: argv[i + 1] for i, a in enumerate(argv) if str(a).startswith("--") and a != "--out"}

    layer1, layer12 = (tmp_path / "bridges" / f"layer-{n:02d}" / "seed-0" for n in (1, 12))
    shape = {"--num": SAMPLES["num"], "--length": SAMPLES["length"], "--device": "cpu"}
    budget = {**shape, "--steps": SAMPLES["steps"]}
    # the hybrid reads SmolLM2's 49,152-token head at every position of a step: 125 at a time, the
    # 1,000 samples' logits would plan 57 GB (more than a 24 GB machine), 125's 7.1 GB
    batched = {**budget, "--batch": 125}
    assert logits_bytes(SAMPLES["num"] * SAMPLES["length"], 49_152) > 50e9
    assert logits_bytes(125 * SAMPLES["length"], 49_152) < 8e9
    assert flags(found["sample bridge-01"]) == {"--model": layer1, "--sampler": "hybrid", **batched}
    assert flags(found["sample bridge-01-stack-only"]) == {"--model": layer1, "--sampler": "hybrid",
                                                           "--decode": "stack-only", **batched}
    assert flags(found["sample bridge-01-ltr"]) == {"--model": layer1, "--sampler": "ltr", **shape}
    assert flags(found["sample bridge-12-ltr"]) == {"--model": layer12, "--sampler": "ltr", **shape}
    assert flags(found["sample ar"]) == {"--model": "builtin:smollm2", "--sampler": "ar", **shape}
    assert "sample bridge-12-stack-only" not in found and "sample bridge-01-ltr-steps4" not in found
    names = [name for name, _ in commands]  # each bridge trains again just before the samples that read it
    for layer, sets in ((1, ("bridge-01", "bridge-01-stack-only", "bridge-01-ltr")), (12, ("bridge-12", "bridge-12-ltr"))):
        where = [names.index(f"sample {name}") for name in sets]
        # each set then scored and given its row before the next is sampled
        assert names.index(f"bridge layer {layer}") + 1 == min(where) and max(where) - min(where) == 3 * (len(sets) - 1)
        assert all(names[i + 1:i + 3] == [f"eval {name}", f"row {name}"] for i, name in zip(where, sets))
    compared = [str(a) for a in found["compare"]]  # the table reads each set's row, not its samples
    for name in ("bridge-01", "bridge-01-stack-only", "bridge-01-ltr", "bridge-12-ltr"):
        samples = str(tmp_path / "samples" / name / "samples.row.json")
        assert samples in compared and compared[compared.index(samples) - 1] != "--curve"
    assert str(tmp_path / "samples" / "dsl-mdlm-steps4" / "samples.row.json") in compared
    # the shortest trainings first: AR (none), the sweep's bridges trained again, then the layer-0
    # bridge and the generators, in the plan's order; the table keeps the plan's order (rounding first)
    firsts = [names.index(n) for n in ("sample ar", "bridge layer 1", "bridge layer 12", "bridge layer 0", "train dsl",
                                        "train mdlm")]
    assert firsts == sorted(firsts) and names[0] == "sample ar"
    assert compared.index(str(tmp_path / "samples" / "round-00" / "samples.row.json")) == 1


def test_generation_samples_the_diffusion_sweeps_chosen_bridge_once_it_has_finished(tmp_path, no_diffusion_sweep):
    """The SmolLM2 table's bridges are the diffusion sweep's where they exist: once the diffusion
    sweep's seed-0 bridge at the chosen layer has finished, --generation samples it left to right
    and by the hybrid (the regression bridge's flags), after the other groups, and evaluates
    and compares those two sets on their own, after the main comparison; before that, nothing of it runs. Where only its
    record exists (no weights), the same bridge trains again under OUT/diffusion first."""
    import experiments.smollm2_results as script
    from experiments.smollm2_results import SAMPLES, generation, generation_progress

    run = tmp_path / "run"
    run.mkdir()
    write_sweep(run)  # chosen layer 1

    def plan():
        commands = []
        generation(tmp_path, run, lambda name, *argv, done, during=None: commands.append((name, argv)),
                   ["--device", "cpu"], finetune=False)
        return commands

    def through(commands):  # the steps of the diffusion bridge's rows (not diffusion-lm's)
        return [name for name, _ in commands if name.startswith("sample diffusion-0") or "diffusion bridge" in name]

    assert through(plan()) == []
    # its record alone (a fresh machine: the sweep's run has not restored it, or restored it
    # without weights): the same bridge is trained again under OUT/diffusion, then sampled
    record = script.DIFFUSION_RECORD / "bridges" / "layer-01" / "seed-0"
    record.mkdir(parents=True)
    (record / "metrics.json").write_text("{}")
    again = tmp_path / "diffusion" / "bridges" / "layer-01" / "seed-0"
    for where in ("records", "run"):
        if where == "run":
            folder = no_diffusion_sweep / "bridges" / "layer-01" / "seed-0"
            folder.mkdir(parents=True)
            (folder / "metrics.json").write_text("{}")  # a record without weights
        commands = plan()
        names, found = [name for name, _ in commands], dict(commands)
        assert names.index("diffusion bridge layer 1") + 1 == names.index("sample diffusion-01-ltr")
        trained = found["diffusion bridge layer 1"]
        assert trained[:5] == ("bridge", "--run", run, "--layer", 1) and trained[trained.index("--out") + 1] == \
            tmp_path / "diffusion"
        assert list(trained[5:5 + len(script.DIFFUSION_BRIDGE)]) == script.DIFFUSION_BRIDGE
        assert list(trained[5 + len(script.DIFFUSION_BRIDGE):-4]) == script.chosen_diffusion()
        assert found["sample diffusion-01-ltr"][:3] == ("sample", "--model", again)
        # --status lists its training too: finished once its metrics are written
        again.mkdir(parents=True, exist_ok=True)
        (again / "metrics.json").write_text(json.dumps({"stop": "plateau", "steps_run": 1250, "nmse_dim": 0.2}))
        assert any(line.startswith("diffusion bridge layer 1: plateau at step 1,250")
                   for line in generation_progress(tmp_path, run, finetune=False))
        (again / "metrics.json").unlink()
    (folder / "model.safetensors").write_bytes(b"")  # the sweep's own, with its weights: sampled as it is
    commands = plan()
    names = [name for name, _ in commands]
    found = dict(commands)
    assert "diffusion bridge layer 1" not in names
    assert names.index("sample diffusion-01-ltr") < names.index("eval diffusion-01-ltr") \
        < names.index("row diffusion-01-ltr") < names.index("sample diffusion-01") < names.index("compare") \
        < names.index("compare diffusion bridge")
    ltr, hybrid = found["sample diffusion-01-ltr"], found["sample diffusion-01"]
    assert ltr[:5] == ("sample", "--model", folder, "--sampler", "ltr") and "--steps" not in ltr
    assert hybrid[:5] == ("sample", "--model", folder, "--sampler", "hybrid")
    assert hybrid[hybrid.index("--steps") + 1] == SAMPLES["steps"] and hybrid[hybrid.index("--batch") + 1] == 125
    sets = [tmp_path / "samples" / n / "samples.jsonl" for n in ("diffusion-01-ltr", "diffusion-01")]
    assert [a for a in found["eval diffusion-01-ltr"] if isinstance(a, Path) and a.suffix == ".jsonl"] == sets[:1]
    rows = [s.with_suffix(".row.json") for s in sets]
    assert found["compare diffusion bridge"] == ("compare", *rows, "--out", run / "diffusion-bridge")
    assert not any(str(rows[0]) == str(a) for a in found["compare"])  # not in the main table: one name per bridge
    assert generation_progress(tmp_path, run, finetune=False)[-1] == \
        "through the diffusion bridge: 0 of 2 sets written, 0 evaluated"


def test_two_processes_sample_the_diffusion_bridges_sets_side_by_side_once_it_is_trained(tmp_path, no_diffusion_sweep):
    """While the diffusion bridge is still to train, its two sets are one group: a process that
    finds the group's claim held trains nothing and samples neither. Once the bridge has its
    metrics, each set is a group of its own: with the left-to-right set's claim held, the other
    process samples, scores and rows the hybrid set, and leaves the comparisons to the holder."""
    import socket
    import subprocess

    import experiments.smollm2_results as script
    from geoprobe.files import _start_time, lock_name

    run = tmp_path / "run"
    run.mkdir()
    write_sweep(run)  # chosen layer 1
    record = script.DIFFUSION_RECORD / "bridges" / "layer-01" / "seed-0"
    record.mkdir(parents=True)
    (record / "metrics.json").write_text("{}")  # to train again under OUT/diffusion
    claim = tmp_path / "claims" / "diffusion-01-ltr"
    claim.mkdir(parents=True)
    other = subprocess.Popen(["sleep", "120"])
    try:
        (claim / lock_name()).write_text(json.dumps({"pid": other.pid, "host": socket.gethostname(),
                                                     "started": _start_time(other.pid), "command": "--generation"}))
        first = []  # the other groups run; the bridge's one is held
        assert script.generation(tmp_path, run, fake_step(first), ["--device", "cpu"], finetune=False) is False
        assert "sample mdlm-mdlm" in first and not any("diffusion-01" in n or "diffusion bridge" in n for n in first)
        trained = tmp_path / "diffusion" / "bridges" / "layer-01" / "seed-0"
        trained.mkdir(parents=True)
        (trained / "metrics.json").write_text("{}")  # the holder has trained it
        second = []
        assert script.generation(tmp_path, run, fake_step(second), ["--device", "cpu"], finetune=False) is False
        assert second == ["sample diffusion-01", "eval diffusion-01", "row diffusion-01"]
        # the hybrid set's claim released when its set ended: only the other process's is left
        assert sorted(p.name for p in (tmp_path / "claims").iterdir()) == ["diffusion-01-ltr"]
    finally:
        other.kill()
        other.wait()


def fake_step(commands):
    """A step that records the plan and writes what each command would: a trained model's
    metrics.json, a set's samples and meta row, eval's metrics, compare's rows beside the samples."""
    def step(name, *argv, done, during=None):
        if done is not None and Path(done).is_file():
            return
        commands.append(name)
        out = Path(argv[argv.index("--out") + 1]) if "--out" in argv else None
        if argv[0] in ("dsl", "baseline", "bridge"):
            folder = done.parent
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "config.json").write_text("{}")
            (folder / "metrics.json").write_text(json.dumps({"val_mdlm_elbo_nats_per_token": 4.0, "steps_run": 1}))
        elif argv[0] == "sample":
            out.mkdir(parents=True, exist_ok=True)
            (out / "samples.jsonl").write_text(json.dumps({"text": "in the beginning"}) + "\n")
            (out / "samples.meta.jsonl").write_text(json.dumps({"sampler": "x"}) + "\n")
        elif argv[0] in ("eval", "compare") and name != "compare" and not name.startswith("compare "):
            suffix = ".metrics.json" if argv[0] == "eval" else ".row.json"
            for f in (Path(a) for a in argv if str(a).endswith("samples.jsonl")):
                f.with_suffix(suffix).write_text(json.dumps({"results": {str(f): {
                    "gen_ppl": 9.0, "gen_ppl_by_evaluator": {"ngram:kjv": 8.0}}}}))
    return step


def test_generation_keeps_each_finished_sets_row_and_a_fresh_machine_runs_only_what_is_not_kept(tmp_path):
    """--generation records each group's sets as they finish (meta row, metrics, compare row: no
    samples text); on a fresh out dir with those records only the comparison runs, from the rows;
    a set whose record is gone is sampled again, its model trained first, and nothing else."""
    import experiments.smollm2_results as script

    run = tmp_path / "a" / "run"
    run.mkdir(parents=True)
    write_sweep(run)  # no weights: the sampled bridges train again
    record = script.DIFFUSION_RECORD / "bridges" / "layer-01" / "seed-0"  # the diffusion sweep's, weights elsewhere
    record.mkdir(parents=True)
    (record / "metrics.json").write_text("{}")
    first = []
    script.generation(tmp_path / "a", run, fake_step(first), ["--device", "cpu"], finetune=False)
    planned = [*script.sample_sets(tmp_path / "a", run, finetune=False), "diffusion-01-ltr", "diffusion-01"]
    assert sum(n.startswith("sample ") for n in first) == len(planned)
    records = script.GENERATION_RECORD / "samples"
    assert sorted(p.name for p in records.iterdir()) == sorted(planned)
    for folder in records.iterdir():
        assert sorted(p.name for p in folder.iterdir()) == sorted(script.SET_FILES)  # no samples.jsonl
    # every model trained here keeps its config and metrics (no weights): the page describes them elsewhere too
    trained = [script.GENERATION_RECORD / f for f in ("mdlm", "rounding/bridges/layer-00/seed-0",
                                                      "bridges/layer-01/seed-0", "diffusion/bridges/layer-01/seed-0")]
    assert all(sorted(p.name for p in f.iterdir()) == ["config.json", "metrics.json"] for f in trained)
    # a fresh machine: the same plan, nothing of the first out dir but the records
    out = tmp_path / "b"
    shutil.copytree(run, out / "run")
    again = []
    script.generation(out, out / "run", fake_step(again), ["--device", "cpu"], finetune=False)
    assert again == ["compare", "compare diffusion bridge"]  # the diffusion bridge is not trained again
    assert (out / "samples" / "mdlm-mdlm" / "samples.row.json").is_file()
    assert "diffusion bridge layer 1" in first and not (out / "diffusion").exists()
    # so the page describes the bridge its rows came from by the sweep's record
    assert script.described(script.diffusion_bridge(out / "run", out)[1]) == record
    # given the out dir, by the record of its training again on the first machine, which wrote the samples
    assert script.described(script.diffusion_bridge(out / "run", out)[1], out) == trained[-1]
    assert script.described(script.diffusion_bridge(run, tmp_path / "a")[1]) == \
        tmp_path / "a" / "diffusion" / "bridges" / "layer-01" / "seed-0"
    # a set with its row but no record (killed between the two) is recorded on the next pass
    shutil.rmtree(records / "ar")
    script.generation(tmp_path / "a", run, fake_step([]), ["--device", "cpu"], finetune=False)
    assert (records / "ar" / "samples.row.json").is_file()
    # one set's record lost: its model trains, it alone is sampled, scored, rowed and kept again
    shutil.rmtree(out)
    shutil.copytree(run, out / "run")
    shutil.rmtree(records / "mdlm-mdlm")
    again.clear()
    script.generation(out, out / "run", fake_step(again), ["--device", "cpu"], finetune=False)
    assert again == ["train mdlm", "sample mdlm-mdlm", "eval mdlm-mdlm", "row mdlm-mdlm", "compare",
                     "compare diffusion bridge"]
    assert (records / "mdlm-mdlm" / "samples.row.json").is_file()


def test_two_generation_processes_share_the_groups_and_the_one_that_finishes_last_compares(tmp_path):
    """A group whose claim (OUT/claims/FIRST-SET) a live process holds is skipped: nothing of it is
    trained or sampled, and while its rows are missing no comparison runs (generation returns
    False). Once that process has written them, the next pass compares and samples nothing. A
    claim whose process is gone is taken over. The claims are released when a group ends."""
    import socket
    import subprocess

    import experiments.smollm2_results as script
    from geoprobe.files import _start_time, lock_name

    run = tmp_path / "run"
    run.mkdir()
    write_sweep(run)
    planned = script.sample_sets(tmp_path, run, finetune=False)
    claim = tmp_path / "claims" / "mdlm-mdlm"  # the MDLM group: one set
    claim.mkdir(parents=True)
    other = subprocess.Popen(["sleep", "120"])
    try:
        (claim / lock_name()).write_text(json.dumps({"pid": other.pid, "host": socket.gethostname(),
                                                     "started": _start_time(other.pid), "command": "--generation"}))
        first = []
        assert script.generation(tmp_path, run, fake_step(first), ["--device", "cpu"], finetune=False) is False
        assert "train mdlm" not in first and "sample mdlm-mdlm" not in first and "compare" not in first
        assert sum(n.startswith("sample ") for n in first) == len(planned) - 1
        assert sorted(p.name for p in (tmp_path / "claims").iterdir()) == ["mdlm-mdlm"]  # only the other's
        assert f"groups in flight: mdlm-mdlm (pid {other.pid})" in script.generation_progress(tmp_path, run, finetune=False)
        # the other process has written its set's row (its claim still held): this pass compares
        fake_step([])("sample mdlm-mdlm", "sample", "--out", tmp_path / "samples" / "mdlm-mdlm", done=None)
        fake_step([])("row mdlm-mdlm", "compare", tmp_path / "samples" / "mdlm-mdlm" / "samples.jsonl", done=None)
        again = []
        assert script.generation(tmp_path, run, fake_step(again), ["--device", "cpu"], finetune=False) is True
        assert again == ["compare"]
    finally:
        other.kill()
        other.wait()
    # a claim left by a process that is gone: taken over, its group run, the claim released
    shutil.rmtree(tmp_path / "samples" / "mdlm-mdlm")
    shutil.rmtree(script.GENERATION_RECORD / "samples" / "mdlm-mdlm", ignore_errors=True)
    third = []
    assert script.generation(tmp_path, run, fake_step(third), ["--device", "cpu"], finetune=False) is True
    assert third == ["train mdlm", "sample mdlm-mdlm", "eval mdlm-mdlm", "row mdlm-mdlm", "compare"]
    assert not (claim / lock_name()).exists()
    assert not any(line.startswith("groups in flight") for line in script.generation_progress(tmp_path, run, finetune=False))


def test_the_recipe_keeps_each_model_with_its_sets_and_a_fresh_machine_trains_only_what_is_not_kept(tmp_path):
    """The recipe samples each arm as it is trained and keeps the arm's record (config, curve,
    metrics; a fine-tune with its start) with its sets' meta and metrics. On a fresh out dir with
    those records nothing trains and recipe.json is the same, but for seed 0's long arm: that is
    --generation's MDLM, brought back only once --generation's own MDLM row is in."""
    import experiments.smollm2_results as script

    (n, m), first = script.RECIPE["steps"], []
    result = script.recipe(tmp_path / "a", fake_step(first), ["--device", "cpu"])
    assert sum(c.startswith("recipe: train") for c in first) == 9  # 3 seeds x 3 models
    kept = script.GENERATION_RECORD / "recipe"
    assert (kept / f"mdlm-{n}-seed1" / "metrics.json").is_file() and not any(kept.rglob("samples.jsonl"))
    again = []
    out = tmp_path / "b"
    assert script.recipe(out, fake_step(again), ["--device", "cpu"])["rows"] == [
        {**r, "model": r["model"].replace(str(tmp_path / "a"), str(out))} for r in result["rows"]]
    assert [c for c in again if c.startswith("recipe: train")] == [f"recipe: train mdlm-{n + m} seed 0"]
    # with --generation's MDLM row recorded (not yet brought back here), seed 0's long arm comes
    # back too; a lost fine-tune's record trains its start again as well (it reads the start's weights)
    shutil.rmtree(out)
    (script.GENERATION_RECORD / "samples" / "mdlm-mdlm").mkdir(parents=True)
    (script.GENERATION_RECORD / "samples" / "mdlm-mdlm" / "samples.row.json").write_text("{}")
    shutil.rmtree(kept / "samples" / f"recipe-seed2-{script.RECIPE['samplers'][0]}")
    again.clear()
    script.recipe(out, fake_step(again), ["--device", "cpu"])
    assert [c for c in again if c.startswith("recipe: train")] == [f"recipe: train mdlm-{n} seed 2",
                                                                     f"recipe: train mdlm-{n}-dsl-{m} seed 2"]


def test_the_diffusion_bridge_section_sets_its_rows_beside_the_regression_bridges(tmp_path, no_diffusion_sweep):
    """The page's section on DiHAL through the diffusion bridge: what the bridge is (its record),
    its ltr and hybrid rows beside the regression bridge's of the same layer, and a factor only
    where the two intervals are disjoint."""
    from experiments.smollm2_results import diffusion_bridge_section
    from geoprobe.workflows.compare import COLUMNS, write_rows

    run = tmp_path / "run"
    (run / "diffusion-bridge").mkdir(parents=True)
    write_sweep(run)  # chosen layer 1
    folder = no_diffusion_sweep / "bridges" / "layer-01" / "seed-0"
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps({"stop": "plateau", "steps_run": 1950, "nmse_dim_1step": 0.036,
                                                     "control_lookup_nmse_dim": 0.0368, "delta_ce": 0.076}))
    (folder / "config.json").write_text(json.dumps({"network": {"sigma_b": 1.0, "tau_zero": 0.25, "bridge_steps": 32}}))

    def row(generator, sampler, ppl, lo, hi, trigram):
        return {"generator": generator, "sampler": sampler, "evaluator": "builtin:smollm2", "gen_ppl": ppl,
                "gen_ppl_lo": lo, "gen_ppl_hi": hi, "other_evaluators": trigram, "mauve": 0.01,
                "eos_per_sample": 0.0, "seconds_per_sample": 2.5}

    write_rows(run / "compare.csv", [row("bridges/layer-01/seed-0", "ltr", 100, 90, 110, "ngram:kjv: 500 (450–550)"),
                                     row("bridges/layer-01/seed-0", "hybrid", 3000, 2800, 3200, None),
                                     row("results/mdlm", "mdlm", 800, 700, 900, None)], COLUMNS)
    write_rows(run / "diffusion-bridge" / "compare.csv",
               [row("bridges/layer-01/seed-0", "ltr", 300, 270, 330, "ngram:kjv: 520 (470–570)"),
                row("bridges/layer-01/seed-0", "hybrid", 1000, 900, 1100, None)], COLUMNS)
    lines = diffusion_bridge_section(run, folder)
    text = "\n".join(lines)
    assert lines[0] == "## DiHAL through the diffusion bridge (the chosen layer 1)"
    assert "σ_b 1, a τ = 0 mass of 0.25, K 32" in text and "plateau at step 1,950" in text
    assert "0.036 against its token lookup's 0.037" in text and "+0.076 nats" in text
    cells = [[c.strip() for c in l.strip("|").split("|")] for l in lines if l.startswith("| regression")
             or l.startswith("| diffusion")]
    assert [c[:3] for c in cells] == [["regression bridge", "`ltr`", "100 (90–110)"],
                                      ["diffusion bridge", "`ltr`", "300 (270–330)"],
                                      ["regression bridge", "`hybrid`", "3,000 (2,800–3,200)"],
                                      ["diffusion bridge", "`hybrid`", "1,000 (900–1,100)"]]
    assert cells[1][3] == "520 (470–570)" and cells[3][3] == "—"
    assert "- `ltr`: the diffusion bridge's Gen.PPL against the regression bridge's: 3.0× higher under SmolLM2, " \
           "with intervals overlapping (not ranked) under the KJV trigram." in lines
    assert "- `hybrid`: the diffusion bridge's Gen.PPL against the regression bridge's: 3.0× lower under SmolLM2." \
        in lines
    # the regression table without its ltr row: the page says so, and sets nothing against it
    write_rows(run / "compare.csv", [row("bridges/layer-01/seed-0", "hybrid", 3000, 2800, 3200, None)], COLUMNS)
    lines = diffusion_bridge_section(run, folder)
    assert any(l.startswith("| regression bridge | `ltr`") and "no row in its comparison" in l for l in lines)
    assert not any(l.startswith("- `ltr`") for l in lines)


def test_the_generation_line_tells_one_bridges_hybrid_stack_only_and_ltr_rows_apart():
    """Three rows of one bridge folder: the ltr and hybrid rows differ only by sampler, the
    stack-only row by compare's suffix. Each is found and named; the ltr row is set against each
    baseline by its intervals (a factor only where disjoint)."""
    from experiments.smollm2_results import generation_line

    def row(generator, sampler, ppl, lo, hi, train_tokens=8e6):
        return {"generator": generator, "sampler": sampler, "evaluator": "builtin:smollm2", "gen_ppl": ppl,
                "gen_ppl_lo": lo, "gen_ppl_hi": hi, "mauve": None, "other_evaluators": None,
                "train_tokens": train_tokens}

    verdict = {"chosen_layer": 3, "worst_layer": 12, "oracle_layer": 1}
    rows = [row("runs/bridges/layer-03/seed-0", "ltr", 500, 450, 550),  # first: a folder-only find takes it
            row("runs/bridges/layer-03/seed-0 (stack-only)", "hybrid", 4000, 3700, 4300),
            row("runs/bridges/layer-03/seed-0", "hybrid", 3000, 2800, 3200),
            row("runs/bridges/layer-12/seed-0", "ltr", 700, 640, 760),
            row("runs/bridges/layer-12/seed-0", "hybrid", 2000, 1900, 2100),
            row("runs/sed", "ancestral", 3496, 3237, 3777), row("runs/codar", "ancestral", 520, 480, 560),
            row("builtin:smollm2 (AR)", "ar", 40, 37, 45, None)]
    line = generation_line(verdict, rows)
    assert "the chosen layer 3's bridge decoded left to right (`ltr`" in line
    assert "32 against the other rows' 16) has Gen.PPL 500 (450–550) under SmolLM2." in line
    assert "against SED (Gen.PPL 3,496 (3,237–3,777) under SmolLM2) the left-to-right row's is 7.0× lower " \
           "under SmolLM2." in line  # 3,496 / 500
    assert "against CoDAR (Gen.PPL 520 (480–560) under SmolLM2) the left-to-right row's is with intervals " \
           "overlapping (not ranked) under SmolLM2." in line
    assert "Diffusion-LM" not in line  # no row: nothing said
    assert "the hybrid with the channel's evidence (`--decode stack`) through the chosen layer 3's bridge has " \
           "Gen.PPL 3,000 (2,800–3,200) under SmolLM2 (the left-to-right row's is 6.0× lower under SmolLM2)" in line
    assert "the hybrid without it (`--decode stack-only`, the upper stack's logits alone, over the whole vocabulary, " \
           "where the other two draw only tokens the converter can read) Gen.PPL 4,000 " \
           "(3,700–4,300) under SmolLM2 (the hybrid with it is 1.3× lower under SmolLM2)" in line
    assert "the hybrid through the worst layer 12's bridge Gen.PPL 2,000 (1,900–2,100) under SmolLM2 (the chosen " \
           "layer's is 1.5× higher under SmolLM2)" in line
    assert "the worst layer 12's bridge decoded left to right Gen.PPL 700 (640–760) under SmolLM2 (the chosen " \
           "layer's is 1.4× lower under SmolLM2)" in line
    assert "oracle layer" not in line  # layer 1 has no row
    assert "the left-to-right row, by Gen.PPL against the same 2 rows: under SmolLM2 it is lower than 1 " \
           "(SED · ancestral), with intervals overlapping 1 (CoDAR · ancestral)" in line
    # the left-to-right row alone still makes the line; neither chosen row: none
    assert "has Gen.PPL 500" in generation_line(verdict, rows[:1])
    assert "has no row" in generation_line(verdict, rows[1:2] + rows[3:])


def test_the_other_evaluators_column_reads_back_with_and_without_an_interval():
    from geoprobe.workflows.compare import other_gen_ppl

    assert other_gen_ppl("ngram:kjv: 1.585e+04 (1.4e+04–1.7e+04); ./gpt2: 41.2") == {
        "ngram:kjv": (15850.0, 14000.0, 17000.0), "./gpt2": (41.2, None, None)}
    assert other_gen_ppl(None) == {} and other_gen_ppl("an edited cell") == {}


def test_the_diffusion_sweep_shares_the_scan_and_the_ceilings_but_not_the_bridges(tmp_path):
    """`--bridge diffusion`: the regression sweep's scan is hard-linked into its run (not its
    bridges or verdict), and only the ceiling controls come back from the regression records: the
    diffusion sweep's ceiling is the same network as the plain clean regression."""
    from experiments.smollm2_results import share_scan

    scanned = tmp_path / "results" / "run"
    (scanned / "hidden").mkdir(parents=True)
    for name in ("ranking.csv", "geometry.json", "manifest.json", "hidden/part-00000.parquet", "sweep.json"):
        (scanned / name).write_text(name)
    (scanned / "bridges" / "layer-01" / "seed-0").mkdir(parents=True)
    run = tmp_path / "diffusion" / "run"
    share_scan(scanned, run)
    assert (run / "ranking.csv").read_text() == "ranking.csv" and (run / "hidden" / "part-00000.parquet").is_file()
    assert os.stat(run / "ranking.csv").st_ino == os.stat(scanned / "ranking.csv").st_ino  # a link, not a copy
    assert not (run / "bridges").exists() and not (run / "sweep.json").exists()
    records = tmp_path / "records"
    for folder in ("seed-0", "ceiling"):
        bridge = records / "bridges" / "layer-01" / folder
        bridge.mkdir(parents=True)
        for name in ("config.json", "metrics.json"):
            (bridge / name).write_text(json.dumps({"folder": folder}))
    assert restore(run, records, only="ceiling") == 1
    assert (run / "bridges" / "layer-01" / "ceiling" / "metrics.json").is_file()
    assert not (run / "bridges" / "layer-01" / "seed-0").exists()


def test_the_diffusion_sweep_flags_train_the_default_bridge_at_the_regression_sweeps_width():
    """DIFFUSION's sweep is SWEEP without --regression and with a training support (amendment 14):
    the same cap, rule and width, the default (diffusion) objective; its ceiling settings are the
    regression sweep's ceilings', whose records it reuses."""
    from dataclasses import replace

    from experiments.smollm2_results import DIFFUSION
    from geoprobe.workflows.sweep import bridge_settings, ceiling_settings

    assert [a for a in SWEEP if a != "--regression"] == [a for a in DIFFUSION["sweep"] if a not in ("--vocab", "train")]
    assert DIFFUSION["seeds"] == "0,1" and DIFFUSION["sweep"][DIFFUSION["sweep"].index("--vocab") + 1] == "train"
    diffusion = bridge_settings(steps=4000, eval_every=50, d_model=320, vocab="train")
    regression = bridge_settings(steps=4000, eval_every=50, d_model=320, regression=True)
    assert diffusion.network.sigma_b > 0 and diffusion.network.tau_zero < 1 and regression.network.sigma_b == 0
    assert ceiling_settings(diffusion) == ceiling_settings(regression)
    assert replace(diffusion.network, **{k: getattr(regression.network, k) for k in
                                         ("sigma_b", "tau_zero", "bridge_steps", "regression_frac", "vocab")}) == regression.network


def test_the_diffusion_studys_choice_follows_its_registered_rule():
    """bench/bridge_design.diffusion_choice, on made-up rows where each clause decides: the lowest
    mean noisy crps_dim at K = 32 wins unless a variant within 1 % has a lower posterior-mean
    nmse_dim_1step; K is the smallest whose noisy crps_dim and sample nmse_dim are both within 1 %
    of K = 32's, either side, at both layers; a missing row refuses."""
    from bench.bridge_design import diffusion_choice

    names = ["diffusion sb0.5", "diffusion sb1", "diffusion sb2", "diffusion sb1 tau0"]
    finished = [{"variant": name, "layer": layer, "seed": 0, "nmse_dim_1step": one_step}
                for name, one_step in zip(names, (0.10, 0.11, 0.12, 0.13)) for layer in (3, 9)]
    # noisy crps_dim by K: K = 4 is 1.3 % above K = 32's; K = 8's sample nmse_dim is 2 % BELOW
    # (a collapsing sampler), so K = 16 is the first within 1 % either side of both
    crps_by_k = {2: 0.5, 4: 0.304, 8: 0.302, 16: 0.301, 32: 0.300}
    nmse_by_k = {2: 0.4, 4: 0.25, 8: 0.245, 16: 0.2505, 32: 0.25}

    def scan(at_32: dict) -> list[dict]:
        return [{"variant": name, "layer": layer, "k": k, "nmse_dim": nmse_by_k[k],
                 "crps_dim_noisy": (crps_by_k[k] - 0.300 + at_32[name]) * (1 if layer == 3 else 1.2)}
                for name in names for layer in (3, 9) for k in (2, 4, 8, 16, 32)]

    choice = diffusion_choice(finished, scan(dict(zip(names, (0.40, 0.35, 0.30, 0.33)))))
    assert choice["variant"] == "diffusion sb2" and choice["sigma_b"] == 2.0 and choice["tau_zero"] == 0.0
    assert choice["bridge_steps"] == 16
    nmse_by_k[8] = 0.2501  # now K = 8 is within 1 % on both scores
    assert diffusion_choice(finished, scan(dict(zip(names, (0.40, 0.35, 0.30, 0.33)))))["bridge_steps"] == 8
    # sb1 within 1 % of sb2's noisy crps, with a lower nmse_dim_1step, wins
    tied = diffusion_choice(finished, scan(dict(zip(names, (0.40, 0.302, 0.30, 0.33)))))
    assert tied["variant"] == "diffusion sb1" and tied["sigma_b"] == 1.0
    with pytest.raises(ValueError, match="lacks"):
        diffusion_choice(finished, scan(dict(zip(names, (0.40, 0.302, 0.30, 0.33))))[:-1])
    with pytest.raises(ValueError, match="has not finished"):
        diffusion_choice([r for r in finished if r["layer"] == 3], scan(dict(zip(names, (0.4, 0.3, 0.3, 0.3)))))


def test_the_diffusion_sweep_pins_the_studys_choice_and_waits_for_it(tmp_path):
    """chosen_diffusion turns the study's choice.json into the sweep's flags, which the CLI parses
    into the chosen network; without the file it stops with one line naming the study's steps."""
    from experiments.smollm2_results import DIFFUSION, ROOT, chosen_diffusion
    from geoprobe.workflows.sweep import bridge_settings

    choice = tmp_path / "choice.json"
    choice.write_text(json.dumps({"sigma_b": 2.0, "tau_zero": 0.25, "bridge_steps": 8}))
    with pytest.raises(SystemExit, match="--confirm"):  # chosen at 600 steps, not yet confirmed at the plateau
        chosen_diffusion(choice)
    choice.write_text(json.dumps({"sigma_b": 2.0, "tau_zero": 0.25, "bridge_steps": 8, "confirmed": True}))
    flags = [*DIFFUSION["sweep"], *chosen_diffusion(choice)]
    pairs = [a for a in flags if a != "--ceiling"]  # every other flag takes a value
    given = {name[2:].replace("-", "_"): value for name, value in zip(pairs[::2], pairs[1::2]) if name != "--layers"}
    network = bridge_settings(**given).network
    assert (network.sigma_b, network.tau_zero, network.bridge_steps, network.d_model, network.vocab) == (
        2.0, 0.25, 8, 320, "train")
    with pytest.raises(SystemExit, match="--k-scan"):
        chosen_diffusion(ROOT / "experiments" / "records" / "bridge-design" / "no-such-choice.json")


def test_the_bridges_defaults_are_the_design_studys_confirmed_choice():
    """BridgeConfig's sigma_b, tau_zero and K (what `geoprobe bridge` and `sweep` train without
    flags) are the tracked, confirmed record of the design study (issue 60 §1)."""
    from experiments.records import RECORDS
    from geoprobe.bridges.hidden import BridgeConfig

    choice = json.loads((RECORDS / "bridge-design" / "choice.json").read_text())
    config = BridgeConfig(layer=3, vocab_size=100, hidden_size=64)
    assert choice["confirmed"] is True
    assert (config.sigma_b, config.tau_zero, config.bridge_steps) == (
        choice["sigma_b"], choice["tau_zero"], choice["bridge_steps"])
    assert config.sigma_b > 0 and config.tau_zero < 1 and config.bridge_steps > 1  # a diffusion bridge


def test_a_finished_k_scan_is_skipped_and_a_partial_one_is_not(tmp_path):
    """bench/bridge_design.k_scan_done: make's chain reruns --k-scan on every call; the scan is
    skipped only when its record holds every variant x layer x K of K_GRID (a missing K, layer or
    variant, or no record, means scan)."""
    from bench.bridge_design import K_GRID, k_scan_done

    names, layers = ["diffusion sb1", "diffusion sb2"], [3, 9]
    rows = [{"variant": n, "layer": layer, "k": k, "crps_dim_noisy": 0.5} for n in names for layer in layers for k in K_GRID]
    path = tmp_path / "k-scan.json"
    assert not k_scan_done(path, names, layers)
    path.write_text(json.dumps(rows))
    assert k_scan_done(path, names, layers)
    assert not k_scan_done(path, [*names, "diffusion sb0.5"], layers)
    assert not k_scan_done(path, names, [3, 9, 12])
    assert not k_scan_done(path, [], layers)  # no diffusion variant chosen: nothing to skip
    path.write_text(json.dumps(rows[:-1]))  # the last variant's layer 9 lacks K = 32
    assert not k_scan_done(path, names, layers)


def test_the_choice_is_overturned_only_by_a_converged_runner_up_better_by_more_than_1_percent():
    """bench/bridge_design.confirmed_choice: at the plateau (layer 3, seed 1) the runner-up replaces
    the chosen variant only when both stopped by their plateau and its noisy CRPS is > 1 % lower;
    the replacement takes its own K by the K rule; otherwise the choice stands, and says why."""
    from bench.bridge_design import confirmed_choice

    names = ["diffusion sb0.5", "diffusion sb1", "diffusion sb2", "diffusion sb1 tau0"]
    choice = {"variant": "diffusion sb1", "sigma_b": 1.0, "tau_zero": 0.0, "bridge_steps": 16, "layers": [3, 9],
              "crps_dim_noisy": dict(zip(names, (0.32, 0.30, 0.31, 0.33))), "why": []}
    kscan = [{"variant": "diffusion sb2", "layer": layer, "k": k, "nmse_dim": 0.25,
              "crps_dim_noisy": {2: 0.4, 4: 0.301, 8: 0.3, 16: 0.3, 32: 0.3}[k]} for layer in (3, 9) for k in (2, 4, 8, 16, 32)]

    def scores(chosen, runner, stops=("plateau", "plateau")):
        return {"diffusion sb1": {"crps_dim_noisy": chosen, "stop": stops[0], "steps_run": 2000},
                "diffusion sb2": {"crps_dim_noisy": runner, "stop": stops[1], "steps_run": 2500}}

    kept = confirmed_choice(choice, scores(0.30, 0.298), kscan)  # 0.7 % lower: within 1 %
    assert kept["confirmed"] and kept["variant"] == "diffusion sb1" and kept["bridge_steps"] == 16
    assert "the choice stands" in kept["why"][-1]
    turned = confirmed_choice(choice, scores(0.30, 0.29), kscan)
    assert (turned["variant"], turned["sigma_b"], turned["bridge_steps"]) == ("diffusion sb2", 2.0, 4)
    capped = confirmed_choice(choice, scores(0.30, 0.20, ("plateau", "cap")), kscan)
    assert capped["variant"] == "diffusion sb1" and "did not stop by its plateau" in capped["why"][-1]


def test_the_pages_opening_says_where_the_score_cannot_be_separated_from_depth():
    """The sensitivity after the massive channels' onset, in the page's third line, with the score's
    own rho with depth over its layers (amendment 14); a stored verdict from before it has none."""
    from experiments.smollm2_results import verdict_lines

    share = {1: 0.1, 2: 0.14, **{layer: 0.3 + 0.01 * layer for layer in range(3, 9)}}  # the onset is layer 3
    rows = [{"layer": layer, "seed": seed, "stop": "plateau", "control_lookup_nmse_dim": 1.0,
             **{k: (0.5 if layer < 3 else 1 - 0.1 * layer) + 0.001 * seed
                for k in ("nmse_dim", "nmse", "delta_ce", "nmse_noisy", "objective")}}
            for seed in (0, 1) for layer in range(1, 9)]
    verdict = sweep_verdict(rows, {"score": {layer: float(layer) for layer in range(1, 9)}}, share)
    third = verdict_lines(json.loads(json.dumps(verdict)))[-1]
    assert "over layers 3–8, from the massive channels' onset" in third
    assert "and the score's ρ with depth there is 1.00 (not separable from depth)" in third
    del verdict["after_onset"]["score_vs_depth"]
    assert "with depth there" not in verdict_lines(verdict)[-1]


def test_the_openings_outcome_says_which_bridges_left_the_sweep_unconverged():
    """An unconverged sweep's outcome line names the bridges that failed each condition and calls
    the test's numbers no evidence; any other outcome is the verdict's own words with ρ and p."""
    from experiments.smollm2_results import outcome_line

    test = {"rho": 0.6, "p": 0.8333}
    supported = {"outcome": "supported", "convergence": {"converged": True}}
    assert outcome_line(supported, test) == "supported (ρ 0.60, p 0.83)."
    one = {"outcome": "inconclusive: the bridges did not converge (layer 1 (seed 0) does not beat ...)",
           "convergence": {"converged": False, "tested": 24, "plateau": 24, "share": 1.0, "needed": 0.8,
                           "worse_than_lookup": [[1, 0]], "unstopped_layers": []}}
    assert outcome_line(one, test) == (
        "inconclusive. 1 of the 24 tested bridges (layer 1 seed 0) does not beat its token lookup by the registered "
        "bar, so the bridges count as unconverged, and the test's numbers (ρ 0.60, p 0.83) are no evidence either way.")
    many = {"outcome": "inconclusive: ... (provisional: one seed per tested layer, the protocol asks for at least two)",
            "convergence": {"converged": False, "tested": 10, "plateau": 6, "share": 0.6, "needed": 0.8,
                            "worse_than_lookup": [[1, 0], [2, 1]], "unstopped_layers": [4, 5]}}
    said = outcome_line(many, test)
    assert said.startswith("inconclusive. 2 of the 10 tested bridges (layer 1 seed 0, layer 2 seed 1) do not beat "
                           "their token lookup by the registered bar; 6 of 10 stopped by their plateau (80% needed); "
                           "layers 4, 5 have no bridge stopped by its plateau, so")
    assert said.endswith("Provisional: one seed per tested layer.")
    other = {"outcome": "inconclusive: something else", "convergence": {"converged": False, "tested": 4, "plateau": 4,
                                                                        "share": 1.0, "needed": 0.8}}
    assert outcome_line(other, test) == "inconclusive: something else (ρ 0.60, p 0.83)."


def test_the_recipe_comparison_trains_its_arms_per_seed_and_tests_the_paired_bound(tmp_path):
    """The DSL paper's recipe on the KJV: per seed, MDLM for N then DSL from that checkpoint for M,
    against MDLM for N + M (seed 0's is --generation's own `mdlm`); each model sampled by each
    sampler and scored; the page's test is the paired one-sided t on the seeds' bound differences."""
    from scipy import stats

    import experiments.smollm2_results as script

    (n, m), commands = script.RECIPE["steps"], []
    bounds = {}  # model folder -> its bound

    def step(name, *argv, done, during=None):  # records the plan and writes what each step would
        commands.append((name, argv))
        out = Path(argv[argv.index("--out") + 1]) if "--out" in argv else None
        if argv[:2] == ("dsl", "train"):
            seed = int(argv[argv.index("--seed") + 1]) if "--seed" in argv else 0
            bound = 4.0 + 0.01 * seed + (-0.05 if "--init" in argv else 0.0) + 0.002 * (seed == 2) * ("--init" in argv)
            out.mkdir(parents=True)
            steps = int(argv[argv.index("--steps") + 1])
            (out / "metrics.json").write_text(json.dumps({"val_mdlm_elbo_nats_per_token": bound, "steps_run": steps,
                                                          "stop": "budget"}))
            init = str(argv[argv.index("--init") + 1]) if "--init" in argv else None
            (out / "config.json").write_text(json.dumps({  # a config as dsl train writes it, in what matters here
                "network": {"d_model": 256}, "training": {"snr": argv[argv.index("--snr") + 1],
                                                          "train": {"steps": steps, "seed": seed, "lr": 1e-3}},
                "identity": {"init": init}}))
            bounds[out] = bound
        elif argv[0] == "sample":
            out.mkdir(parents=True)
        elif argv[0] == "eval":
            for f in (Path(a) for a in argv if str(a).endswith("samples.jsonl")):
                row = {"gen_ppl": 100.0, "gen_ppl_by_evaluator": {f"ngram:{script.CORPUS}": 50.0}}
                f.with_suffix(".metrics.json").write_text(json.dumps({"results": {str(f): row}}))

    result = script.recipe(tmp_path, step, ["--device", "cpu"])
    plan = dict(commands)
    for seed in script.RECIPE["seeds"]:
        start = tmp_path / "recipe" / f"mdlm-{n}-seed{seed}"
        first = plan[f"recipe: train mdlm-{n} seed {seed}"]
        assert first[first.index("--steps") + 1] == n and first[first.index("--snr") + 1] == "endpoint"
        tuned = plan[f"recipe: train mdlm-{n}-dsl-{m} seed {seed}"]
        assert tuned[tuned.index("--init") + 1] == start and tuned[tuned.index("--steps") + 1] == m
        assert tuned[tuned.index("--snr") + 1] == "mixed" and tuned[tuned.index("--seed") + 1] == seed
        long = plan[f"recipe: train mdlm-{n + m} seed {seed}"]
        assert long[long.index("--steps") + 1] == n + m
        # seed 0's long arm is --generation's MDLM: its folder and flags (no --seed: the default 0)
        assert (long[long.index("--out") + 1] == tmp_path / "mdlm") == (seed == 0) and ("--seed" in long) == (seed > 0)
    assert len([c for c in commands if c[1][0] == "sample"]) == 2 * 3 * len(script.RECIPE["samplers"])
    assert len(result["rows"]) == 2 * 3 * len(script.RECIPE["samplers"])
    assert json.loads((tmp_path / "recipe" / "recipe.json").read_text()) == result
    # the paired test: recipe - mdlm-long per seed = -0.05, -0.05, -0.048
    diff = [-0.05, -0.05, -0.048]
    want = stats.ttest_1samp(diff, 0.0, alternative="less").pvalue
    lines = script.recipe_section(result)
    said = next(l for l in lines if l.startswith("The recipe's bound below MDLM's"))
    test = stats.ttest_1samp(diff, 0.0, alternative="less")
    assert f"mean difference {sum(diff) / 3:+.3f} ± {statistics.stdev(diff):.3f} nats/token" in said
    assert f"t = {test.statistic:.2f}, df = 2, p = {script.p_value(want)}: at α 0.05, shown" in said
    cells = [[c.strip() for c in l.strip("|").split("|")] for l in lines if l.startswith("| `")]
    assert cells[0][:3] == ["`recipe`", "3.961 ± 0.011", "100 ± 0"]  # 3.95, 3.96, 3.972; Gen.PPL in whole numbers
    assert cells[1][:2] == ["`mdlm-long`", "4.010 ± 0.010"]  # 4.00, 4.01, 4.02
    pairs = [[c.strip() for c in l.strip("|").split("|")] for l in lines if l[:4] in ("| 0 ", "| 1 ", "| 2 ")]
    assert [p[3] for p in pairs] == ["-0.0500", "-0.0500", "-0.0480"] and pairs[0][4] == f"{m:,} (budget)"
    assert result["checks"] == [] and any(l.startswith("The pairs are as registered") for l in lines)
    # a pair off the protocol is named on the page: seed 1's long arm stopped early, seed 2's fine-tune
    # started elsewhere, seed 0's long arm (--generation's MDLM, trained earlier) on another rate
    for folder, change in ((tmp_path / "recipe" / f"mdlm-{n + m}-seed1", {"steps_run": 2500, "stop": "plateau"}),):
        (folder / "metrics.json").write_text(json.dumps({**json.loads((folder / "metrics.json").read_text()), **change}))
    config = tmp_path / "recipe" / f"mdlm-{n}-dsl-{m}-seed2" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "identity": {"init": str(tmp_path / "elsewhere")}}))
    config = tmp_path / "mdlm" / "config.json"
    record = json.loads(config.read_text())
    record["training"]["train"]["lr"] = 3e-4
    config.write_text(json.dumps(record))
    # and seed 1's start trained with DSL's SNR scheme, from another model
    config = tmp_path / "recipe" / f"mdlm-{n}-seed1" / "config.json"
    record = json.loads(config.read_text())
    record["training"]["snr"], record["identity"]["init"] = "mixed", str(tmp_path / "elsewhere")
    config.write_text(json.dumps(record))
    checks = script.recipe_checks(tmp_path)
    assert len(checks) == 5 and checks[0].startswith("seed 0") and "training.train.lr" in checks[0]
    assert checks[1:4] == [f"seed 1: mdlm-{n}-seed1 trained with the mixed SNR scheme, not endpoint",
                           f"seed 1: mdlm-{n}-seed1 started from {tmp_path / 'elsewhere'}, not from nothing",
                           f"seed 1: mdlm-{n + m}-seed1 ran 2500 steps (stop plateau), not its budget of {n + m:,}"]
    assert checks[4].startswith("seed 2: the fine-tune started from")
    lines = script.recipe_section({**result, "checks": checks})
    warned = next(i for i, l in enumerate(lines) if l.startswith("**The pairs are not the registered comparison:**"))
    assert "training.train.lr" in lines[warned]
    assert warned < next(i for i, l in enumerate(lines) if l.startswith("The recipe's bound below"))  # above the test
    # a recipe.json written before stop was recorded: the page still renders
    old = [{k: v for k, v in r.items() if k != "stop"} for r in result["rows"]]
    assert any("(stop not recorded)" in l for l in script.recipe_section({"rows": old, **{
        k: v for k, v in result.items() if k not in ("rows", "checks")}}))
    # equal differences: no t, and the page says so instead of a p
    equal = [{**r, "bound": 4.0 - 0.05 * (r["arm"] == "recipe")} for r in result["rows"]]
    said = next(l for l in script.recipe_section({**result, "rows": equal}) if l.startswith("The recipe's bound"))
    assert "t is undefined (the differences are all equal; the recipe's bound is the lower one)" in said
    assert "p =" not in said
    # the recipe's bound higher on every seed: not shown, and the page says which way it went
    worse = [{**r, "bound": r["bound"] + 0.2 * (r["arm"] == "recipe")} for r in result["rows"]]
    said = next(l for l in script.recipe_section({**result, "rows": worse}) if l.startswith("The recipe's bound"))
    assert "not shown: the recipe's bound is the higher one on every seed" in said


def test_the_diffusion_page_sets_its_outcome_beside_the_regression_sweeps_or_else_the_ceilings(tmp_path):
    """The diffusion sweep's page says how its outcome differs from the regression sweep's on the
    same scan, and how the two sweeps' seed-mean losses order the layers; a model with no regression
    sweep (Gemma) gets the ceiling controls' ρ with the score instead. --generation belongs to the
    regression page only."""
    from dataclasses import replace

    import experiments.smollm2_results as script

    regression, diffusion = tmp_path / "regression", tmp_path / "diffusion"
    for folder in (regression, diffusion):
        folder.mkdir()
    write_sweep(regression)  # nmse_dim rises with the layer, the score falls: supported
    write_sweep(diffusion)
    sweep = json.loads((diffusion / "sweep.json").read_text())
    for row in sweep["rows"]:  # the diffusion losses fall with the layer: the opposite order, not supported
        row["objective"] = row["nmse_dim"] = 0.2 - 0.01 * row["layer"] + 0.001 * row["seed"]
    verdict = sweep_verdict(sweep["rows"], {"score": {layer: -float(layer) for layer in LAYERS}}, {})
    verdict["scores"] = {"score": {str(layer): -float(layer) for layer in LAYERS}}
    exp = replace(script.experiment(bridge="diffusion"), shared_scan=regression)
    assert not exp.generation and script.experiment().generation
    line = script.against_regression(verdict, exp)
    theirs = json.loads((regression / "sweep.json").read_text())["verdict"]
    assert theirs["outcome"].startswith("supported") and verdict["outcome"].startswith("not supported")
    assert theirs["outcome"].startswith("supported, but")  # the score follows depth exactly here
    assert line.startswith("- Against the regression sweep ([results.md](results.md)): there the loss was a "
                           f"deterministic regression bridge's {theirs['primary_loss']} and the outcome "
                           "supported, but not robustly (ρ -1.00")
    assert f"here the loss is the diffusion bridge's {verdict['primary_loss']} and the outcome not supported (ρ 1.00"  in line
    assert "Over layers 1–12 the two sweeps' seed-mean losses order the layers with Spearman -1.00." in line
    # seed means over seeds 0-2: 0.201 - 0.01 l here, 0.01 l + 0.001 there; layer 12: 0.081 / 0.121 - 1, layer 1: 0.191 / 0.011 - 1
    assert line.endswith("Layer by layer, the diffusion bridges' posterior mean nmse_dim is -33 % to +1636 % against the "
                         "regression bridges' nmse_dim (seed means; above zero, the diffusion bridge reconstructs the "
                         "layer less well).")
    # no regression sweep: the ceilings (0.005 x layer) against the score (-layer)
    line = script.against_regression(verdict, replace(exp, shared_scan=None))
    assert "ρ(score, ceiling nmse_dim) over layers 1–12 is -1.00, against the diffusion bridge's not supported (ρ 1.00" \
        in line
    assert "posterior mean nmse_dim is +35 % to +3720 % against the ceiling's" in line  # 0.081 / 0.06, 0.191 / 0.005
    # a regression sweep that ran on this scan but whose sweep.json is not here is not called absent
    assert script.against_regression(verdict, replace(exp, shared_scan=tmp_path / "elsewhere")) == (
        "- The regression sweep on this scan has no sweep.json here: its outcome is on [results.md](results.md), "
        "not set beside this one.")
    # constant losses or ceilings give no rho (never "nan"); a one-seed outcome is said to be provisional
    for row in verdict["layers"]:
        row["ceiling_nmse_dim"] = 0.1
    assert script.against_regression(verdict, replace(exp, shared_scan=None)) is None
    one_seed = sweep_verdict([r for r in sweep["rows"] if r["seed"] == 0],
                             {"score": {layer: -float(layer) for layer in LAYERS}}, {})
    assert "provisional" in one_seed["outcome"]
    line = script.against_regression(one_seed, exp)
    assert "and the outcome not supported, provisional (one seed) (ρ 1.00" in line and "nan" not in line


def test_an_unconverged_sweeps_opening_and_dihal_line_say_so(tmp_path):
    """A seed-0 bridge at the chosen layer that stops by its plateau but does not beat its token
    lookup is called unconverged on the DiHAL line; the opening's third line says its figures test
    nothing; a capped bridge is named."""
    write_sweep(tmp_path)
    assert "**Rests on:** ρ(loss, depth) is 1.00;" in page_of(tmp_path)  # converged: no caveat, a small ρ
    sweep = json.loads((tmp_path / "sweep.json").read_text())
    for row in sweep["rows"]:
        if (row["layer"], row["seed"]) == (1, 0):
            row["nmse_dim"] = 0.99  # the lookup is 1.0: not below its 5 % margin
        if (row["layer"], row["seed"]) == (2, 1):
            row["stop"] = "cap"
    sweep["verdict"] = sweep_verdict(sweep["rows"], {"score": {layer: -float(layer) for layer in LAYERS}}, {})
    (tmp_path / "sweep.json").write_text(json.dumps(sweep))
    page = page_of(tmp_path)
    line = next(l for l in page.splitlines() if l.startswith("- The DiHAL model"))
    assert line.endswith("stopped by its plateau, but it does not beat its token lookup by the registered bar: "
                         "unconverged, its samples are not evidence.")
    rests = next(l for l in page.splitlines() if l.startswith("**Rests on:**"))
    assert "The bridges count as unconverged, so these figures describe them and test nothing: ρ(loss, depth)" in rests
    assert "1 of the tested bridges reached the step cap before their plateau (layer 2 seed 1): its loss is" in page
    # layer 1's seed mean is now the highest, and layer 2 the lowest
    assert "The hardest layer by nmse_dim is 1 (with an unconverged bridge)" in page
    assert "The easiest layer by nmse_dim is 2 (with an unconverged bridge)" in page


def test_a_steps_command_names_paths_in_the_repository_from_its_root(capsys):
    """The page's command table (and the log) name a folder under the repository from its root,
    never by this machine's absolute path."""
    from geoprobe.errors import BadInput

    import experiments.smollm2_results as script

    out = script.ROOT / "runs" / "never-written-by-this-test"
    with pytest.raises(BadInput):
        in_process("bridge", "--layer", "-1", "--out", out, done=None, log={}, name="bad")
    assert "[run ] bad: geoprobe bridge --layer -1 --out runs/never-written-by-this-test" in capsys.readouterr().out
    assert not out.exists()
