"""experiments/pages.py: the figures, names and tables every results page shares, checked against
hand-written expectations; and the SmolLM2 script's --page-only, which writes a page and runs nothing."""

import json
import sys

import pytest

from experiments.pages import plain, plain_text, role, tidy_table, tidy_tables


@pytest.mark.parametrize("value, text", [(107106.3, "107,106"), (8192000.0, "8,192,000"), (3382.0, "3,382"),
                                         (40.61, "40.61"), (0.006889, "0.006889"), (-0.2937, "-0.2937"),
                                         (16.0, "16"), (0.0, "0"), (float("nan"), "—"), (None, "—")])
def test_plain_writes_large_figures_whole_and_small_ones_to_four_digits(value, text):
    assert plain(value) == text


def test_scientific_notation_keeps_the_digits_it_was_written_with():
    assert plain_text("1.071e+05 (1.007e+05–1.136e+05)") == "107,100 (100,700–113,600)"
    assert plain_text("8.192e+06 tokens, eps 1e-06, lr 3e-3") == "8,192,000 tokens, eps 0.000001, lr 0.003"
    assert plain_text("layer-03 v1e5x") == "layer-03 v1e5x"  # not figures


@pytest.mark.parametrize("generator, name", [
    ("bridges/layer-03/seed-0", "DiHAL, layer 3"), ("bridges/layer-12/seed-1", "DiHAL, layer 12, seed 1"),
    ("bridges/layer-00/seed-0 (round)", "rounding, layer 0"), ("results/mdlm", "MDLM"), ("runs/x/dsl", "DSL"),
    ("runs/bridges/layer-03/seed-0 (stack-only)", "DiHAL, layer 3, stack-only"),
    ("bridges/layer-12/seed-2 (stack-only)", "DiHAL, layer 12, seed 2, stack-only"),
    ("results/dsl-smollm2", "DSL from SmolLM2"), ("results/codar", "CoDAR"),
    ("builtin:smollm2 (AR ceiling)", "SmolLM2 (AR)"), ("results/other", "other")])
def test_generators_are_named_by_role(generator, name):
    assert role(generator) == name


def test_a_tidy_table_drops_empty_columns_says_shared_ones_once_and_explains_short_names():
    lines = ["| generator | evaluator | gen_ppl | oracle |", "|---|---|---|---|",
             *[f"| results/{g} | builtin:smollm2 | {p} | — |" for g, p in (("dsl", "1.071e+05"), ("mdlm", "824"),
                                                                        ("sed", "3382"), ("codar", "40.61"))]]
    out = tidy_table(lines, {"gen_ppl": ("PPL", "Gen.PPL under the evaluator")}, {"generator": role})
    header = [c.strip() for c in out[0].strip("|").split("|")]
    assert header == ["generator", "PPL"]  # oracle always empty, evaluator the same in every row
    assert [c.strip() for c in out[2].strip("|").split("|")] == ["DSL", "107,100"]
    assert out[-1] == "Every row: evaluator builtin:smollm2. `PPL`: Gen.PPL under the evaluator."
    assert tidy_table(lines[:4], {})[0].count("|") == 4  # two rows: a shared column stays a column
    text = "intro\n\n" + "\n".join(lines) + "\n\nafter"
    tidied = tidy_tables(text, {})
    assert tidied.startswith("intro\n\n| generator") and tidied.endswith("\n\nafter")


def test_page_only_writes_the_page_from_the_records_and_runs_nothing(tmp_path, monkeypatch):
    import experiments.smollm2_results as script
    import geoprobe.workflows.page as page
    from tests.test_smollm2_results import write_sweep

    run = tmp_path / "run"
    run.mkdir()
    write_sweep(run)
    report = tmp_path / "report.md"
    report.write_text("# Report\n\n## Bridge sweep\n\nb\n")
    monkeypatch.setattr(page, "write_report", lambda run: report)
    (tmp_path / "timings.json").write_text(json.dumps({"scan": {"seconds": 60.0, "command": "geoprobe scan"}}))

    def no_step(*args, **kwargs):
        raise AssertionError("--page-only ran a step")

    monkeypatch.setattr(script, "in_process", no_step)
    out = tmp_path / "page.md"
    monkeypatch.setattr(sys, "argv", ["smollm2_results", "--page-only", "--out", str(tmp_path), "--page", str(out)])
    script.main()
    text = out.read_text()
    assert text.splitlines()[2].startswith("**Tested:**") and "| scan | 60      | `geoprobe scan` |" in text
