"""`geoprobe demo --tiny`: the whole pipeline on the testbed (builtin:hmm-tiny and its HMM
corpus), the answers it must be able to give, and the comparison's budget check."""

import json
import math
import re

import pytest

from geoprobe.synthetic import hmm_from_spec
from geoprobe.verdict import learned_below
from geoprobe.testbed import CORPUS
from tests.helpers import assert_one_line_error, invoke

pytestmark = pytest.mark.slow  # minutes: not in `make check`


@pytest.fixture(scope="module")
def tiny_demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    code, _, err = invoke("-q", "demo", "--tiny", "--out", out)
    assert code == 0, err
    return out


def markdown_tables(text: str) -> list[list[list[str]]]:
    tables, current = [], []
    for line in text.splitlines():
        if line.startswith("|---"):
            continue
        if line.startswith("|"):
            current.append([c.strip() for c in line.strip("|").split("|")])
        elif current:
            tables.append(current)
            current = []
    return tables + ([current] if current else [])


def test_tiny_demo_writes_a_report_with_every_row_filled(tiny_demo):
    report = (tiny_demo / "run" / "report.md").read_text()
    for section in ("## Geometry and ranking", "## Bridge sweep", "## Generation"):
        assert section in report
    tables = markdown_tables(report)
    tables = [t for t in tables if t[0][0] in ("layer", "generator")]
    assert len(tables) >= 4  # ranking (twice when a layer has massive channels), sweep, comparison, steps
    tables = [tables[0], *tables[-3:]]
    for table in tables:
        assert len(table) >= 5  # header + at least four rows
        for row in table[1:]:
            for column, cell in zip(table[0], row):
                for number in re.findall(r"-?\d+\.?\d*(?:e[-+]?\d+)?", cell):
                    assert math.isfinite(float(number)), (row, cell)
                if column in ("train_tokens", "used_tokens") and "(AR)" in row[0]:
                    continue  # a pretrained backbone: its training tokens are not ours to count
                if column in ("other_evaluators", "own_evaluator"):
                    continue  # empty where there is none
                assert cell not in ("—", "nan", "inf", ""), (column, row)
    header, *rows = tables[2]
    generators = [row[0] for row in rows]
    assert any("(AR)" in g for g in generators) and any("(round)" in g for g in generators)
    assert sum(g.endswith("/dsl") for g in generators) == 4 and sum(g.endswith("/mdlm") for g in generators) == 1
    sweep = json.loads((tiny_demo / "run" / "sweep.json").read_text())["verdict"]
    for role in ("chosen", "worst", "oracle"):  # every role's bridge is in the table, once per layer
        assert f"bridges/layer-{sweep[role + '_layer']:02d}/seed-0" in generators
    samplers = [row[header.index("sampler")] for row in rows]  # and the chosen one left to right, once
    assert samplers.count("ltr") == 1 and generators[samplers.index("ltr")].endswith(
        f"bridges/layer-{sweep['chosen_layer']:02d}/seed-0")
    trained = {row[header.index("train_tokens")] for row in rows if "(AR)" not in row[0]}
    assert len(trained) == 1 and {row[header.index("budget")] for row in rows} == {"matched"}
    steps_header, *curve = tables[3]
    for sampler in ("mdlm", "remdm-loop", "roar", "hybrid"):  # three step counts per sampler
        assert sorted(int(r[2]) for r in curve if r[1] == sampler) == [8, 16, 32]
    for plot in ("geometry.png", "sweep.png", "sweep-curves.png", "compare.png", "steps.png"):
        assert (tiny_demo / "run" / "plots" / plot).stat().st_size > 20000
    for folder in (tiny_demo / "samples").iterdir():  # one `eval` call, one metrics file beside each samples file
        metrics = json.loads((folder / "samples.metrics.json").read_text())["results"]
        assert list(metrics) == [str(folder / "samples.jsonl")]


def test_compare_refuses_mismatched_budgets_unless_allowed(tiny_demo):
    dsl = tiny_demo / "dsl"
    other = tiny_demo / "samples" / "mdlm-64"
    common = ["--model", dsl, "--sampler", "mdlm", "--num", 12, "--length", 32, "--device", "cpu"]
    assert invoke("-q", "sample", *common, "--steps", 64, "--out", other)[0] == 0
    assert invoke("-q", "eval", other / "samples.jsonl", "--evaluator", "builtin:hmm-tiny",
                  "--references", CORPUS, "--device", "cpu")[0] == 0
    files = [tiny_demo / "samples" / "dsl-mdlm" / "samples.jsonl", other / "samples.jsonl"]
    code, _, err = invoke("compare", *files, "--out", tiny_demo / "cmp")
    assert_one_line_error(code, err, 2, "the generators have different budgets")
    code, out, err = invoke("--format", "json", "compare", *files, "--out", tiny_demo / "cmp",
                            "--allow-mismatch")
    assert code == 0, err
    assert {r["budget"] for r in json.loads(out)["rows"]} == {"MISMATCH"}
    code, _, err = invoke("compare", tiny_demo / "nothing.jsonl", "--out", tiny_demo / "cmp")
    assert_one_line_error(code, err, 2, "samples file not found")


def test_tiny_demo_runs_the_sweep_protocol_on_layers_1_to_5_with_two_seeds(tiny_demo):
    sweep = json.loads((tiny_demo / "run" / "sweep.json").read_text())
    rows, v = sweep["rows"], sweep["verdict"]
    assert sorted({(r["layer"], r["seed"]) for r in rows}) == [(l, s) for l in range(6) for s in (0, 1)]
    for row in rows:
        assert row["stop"] in ("plateau", "cap") and row["val_curve"] and row["steps_run"] == row["val_curve"][-1][0]
        assert 0 <= row["best_step"] <= row["steps_run"] and row["val_curve"][0][0] == 0  # step 0 is scored
        bar = learned_below(row["control_lookup_nmse_dim"], row["control_lookup_ridge_nmse_dim"])  # amendment 9
        assert row["beats_lookup"] == (row["nmse_dim"] < bar) and bar < row["control_lookup_nmse_dim"] + 1e-12
        # layer 0's state is its token's embedding, so its lookup is exact; above it the lookup is not
        assert (row["control_lookup_nmse_dim"] < 1e-9) == (row["layer"] == 0)
        for loss in ("nmse", "nmse_dim", "delta_ce", "nmse_noisy", "objective"):
            assert math.isfinite(row[loss])
    assert v["compared_layers"] == [1, 2, 3, 4, 5] and v["source_layers"] == [0]  # layer 0 is the source
    for loss, test in v["tests"].items():
        assert -1 <= test["rho"] <= 1 and 0 < test["p"] <= 1 and test["n"] == 5 and test["alternative"] == "less"
    assert v["reliability"]["nmse_dim"] is not None
    report = (tiny_demo / "run" / "report.md").read_text()
    for line in v["statement"]:  # the verdict's plain lines are the report's
        assert line in report
    assert v["statement"][0] in report.split("## ")[0]  # and its first one opens the page, above the geometry
    # the convergence criterion (docs/method.md) from the rows themselves, and the first line says what it found
    tested = [r for r in rows if r["layer"] in v["compared_layers"]]
    plateau = sum(r["stop"] == "plateau" for r in tested)
    converged = plateau >= 0.8 * len(tested) and all(r["beats_lookup"] for r in tested)
    assert v["convergence"]["converged"] == converged and v["convergence"]["plateau"] == plateau
    assert v["statement"][0].startswith("Primary test (fixed in advance)" if converged else
                                        "Inconclusive: the bridges did not converge")
    assert v["outcome"].startswith("inconclusive") != converged
    for number in re.findall(r"-?\d+\.\d+(?:e[-+]?\d+)?|nan|inf", " ".join(v["statement"])):
        assert math.isfinite(float(number)), v["statement"]


def test_the_testbeds_layers_are_not_interchangeable(tiny_demo):
    """Some two layers' trace-normalised curvature intervals are disjoint: the geometry has
    learned structure, unlike a random backbone's."""
    layers = json.loads((tiny_demo / "run" / "geometry.json").read_text())["layers"]
    intervals = [l["trace"]["curv"]["ci"] for l in layers]
    assert max(lo for lo, _ in intervals) > min(hi for _, hi in intervals)


def test_every_generator_is_scored_by_the_true_hmm_and_the_ar_ceiling_checks_the_measurement(tiny_demo):
    from geoprobe.workflows.compare import read_rows

    rows = read_rows(tiny_demo / "run" / "compare.csv")
    verdict = json.loads((tiny_demo / "run" / "sweep.json").read_text())["verdict"]
    bridges = {verdict[f"{role}_layer"] for role in ("chosen", "worst", "oracle")}  # a layer in two roles: one row
    # 4 DSL samplers, MDLM, a row per distinct bridge layer, the chosen bridge left to right, layer 0's
    # rounding, the AR ceiling
    assert len(rows) == 8 + len(bridges) and all(r["oracle_nll_per_word"] is not None for r in rows)
    assert {r["generator"] for r in rows if r["generator"].startswith("bridges/") and "(round)" not in r["generator"]} \
        == {f"bridges/layer-{l:02d}/seed-0" for l in bridges}
    for r in rows:  # 95% bootstrap intervals over the samples, around the row's value
        assert r["oracle_nll_lo"] <= r["oracle_nll_per_word"] <= r["oracle_nll_hi"], r
        assert r["gen_ppl_lo"] < r["gen_ppl_hi"] and r["evaluator"] == "builtin:hmm-tiny"
        assert 0 <= r["bigram_tv_hmm"] < 1 and 0 <= r["bigram_tv"] <= 1
        # the testbed scores the AR ceiling and the bridges (its own upper stack writes their text)
        own = "(AR)" in r["generator"] or ("bridges/" in r["generator"] and "(round)" not in r["generator"])
        assert (r["own_evaluator"] == "builtin:hmm-tiny") == own, r
    report = (tiny_demo / "run" / "report.md").read_text()
    assert "the evaluator is the generator's own backbone for" in report
    assert "not ranked" in report
    rate = hmm_from_spec(CORPUS).entropy_rate()
    ceiling = next(r for r in rows if "(AR)" in r["generator"])
    assert ceiling["oracle_nll_per_word"] <= 1.10 * rate, (ceiling["oracle_nll_per_word"], rate)


@pytest.mark.real
def test_make_demos_report_says_what_was_found_first_with_no_nan(tiny_demo, smollm2_scan, tmp_path):
    """`make demo`'s report, composed (as run_demo does) from the SmolLM2 scan and the testbed
    experiment this session ran already: its first lines are the findings, the sweep's verdict
    among them, and no number in it is NaN or infinite."""
    from geoprobe.workflows.page import write_demo_report
    from tests.helpers import copy_run

    scan = copy_run(smollm2_scan, tmp_path / "smollm2")
    path, found = write_demo_report(tmp_path, scan, tiny_demo / "run")
    report = path.read_text()
    lines = report.splitlines()
    assert lines[:4] == ["# geoprobe demo", "", "## What was found", ""]
    assert all(f"- {line}" in report for line in found)
    assert found[0].startswith("builtin:smollm2 on `kjv`") and "P(first)" in found[0]
    assert "massive channels excluded" in found[0] and "massive channels kept" in found[0]  # both rankings
    assert any(line.startswith("Massive activations: massive channels at") for line in found)
    verdict = json.loads((tiny_demo / "run" / "sweep.json").read_text())["verdict"]
    assert f"Testbed sweep: {verdict['statement'][0]}" in found
    comparisons = [line for line in found if line.startswith("Testbed generation")]
    assert len(comparisons) == 4 and all("not ranked" in l or "beyond the intervals" in l for l in comparisons)
    assert any("decoded left to right vs in random order" in line for line in comparisons)
    assert any("leave out the spread between training seeds" in line for line in found)
    for number in re.findall(r"-?\d+\.?\d*(?:e[-+]?\d+)?|\bnan\b|\binf\b", report):
        assert math.isfinite(float(number)), number
    assert (scan / "report.md").is_file() and "smollm2/report.md" in report and "run/report.md" in report


def test_each_demo_step_reports_its_time_and_an_estimate_of_what_remains(monkeypatch):
    import geoprobe.workflows.demo as demo
    from geoprobe.workflows.demo import EXPECTED, Steps, testbed_steps

    clock = [100.0]  # a clock of the test's own: real sleeps of milliseconds jitter on a busy machine
    monkeypatch.setattr(demo.time, "perf_counter", lambda: clock[0])

    def work(seconds, result=None):
        clock[0] += seconds
        return result

    seen = []
    steps = Steps(["scan builtin:hmm-tiny", "sweep", "sample", "eval"], lambda *a: seen.append(a))
    # each step takes a thousandth of its expected time: a machine 1000 times faster than the table's
    assert steps("scan builtin:hmm-tiny", lambda x: work(EXPECTED["scan builtin:hmm-tiny"] / 1000, x * 2),
                 21) == 42  # the step's own result comes back
    for what, kind in (("sweep --layers 0-5", "sweep"), ("sample dsl-mdlm --steps 32", "sample"), ("eval", "eval")):
        steps(what, work, EXPECTED[kind] / 1000)
    assert [w for w, _, _ in seen] == ["scan builtin:hmm-tiny", "sweep --layers 0-5", "sample dsl-mdlm --steps 32",
                                       "eval"]
    assert [t for _, t, _ in seen] == pytest.approx([EXPECTED[k] / 1000 for k in ("scan builtin:hmm-tiny", "sweep",
                                                                                  "sample", "eval")])
    remaining = [r for _, _, r in seen]
    assert remaining[-1] == 0 and all(a > b for a, b in zip(remaining, remaining[1:]))
    # the estimate after each step is what is left at the pace seen so far: here a thousandth of the table's
    assert remaining[0] == pytest.approx((EXPECTED["sweep"] + EXPECTED["sample"] + EXPECTED["eval"]) / 1000)
    assert remaining[1] == pytest.approx((EXPECTED["sample"] + EXPECTED["eval"]) / 1000)
    # a cached testbed is not trained again
    assert testbed_steps(cached=False)[0] == "train the testbed" and "train the testbed" not in testbed_steps(True)
    # the CLI's line for each step takes what Steps gives it
    import contextlib
    import io

    from geoprobe.cli.report import _print_step

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        Steps(["sweep"], _print_step)("sweep --layers 0-5", lambda: None)
    assert "geoprobe sweep --layers 0-5" in err.getvalue() and "min so far, about 0 min left" in err.getvalue()
