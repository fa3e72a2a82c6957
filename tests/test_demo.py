"""`geoprobe demo --tiny`: the whole pipeline on the synthetic corpus and a tiny model, and the
comparison's budget check."""

import json
import math
import re

import pytest

from tests.test_extract import assert_one_line_error, invoke


@pytest.fixture(scope="module")
def tiny_demo(tmp_path_factory):
    from geoprobe.cli.app import main

    out = tmp_path_factory.mktemp("demo")
    try:
        main(["-q", "demo", "--tiny", "--out", str(out)])
    except SystemExit as exc:
        assert not exc.code
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
    assert len(tables) == 4  # ranking, sweep, comparison, quality against steps
    for table in tables:
        assert len(table) >= 5  # header + at least four rows
        for row in table[1:]:
            for column, cell in zip(table[0], row):
                for number in re.findall(r"-?\d+\.?\d*(?:e[-+]?\d+)?", cell):
                    assert math.isfinite(float(number)), (row, cell)
                if column == "train_tokens" and "AR ceiling" in row[0]:
                    continue  # a pretrained backbone: its training tokens are not ours to count
                assert cell not in ("—", "nan", "inf", ""), (column, row)
    header, *rows = tables[2]
    generators = [row[0] for row in rows]
    assert any("AR ceiling" in g for g in generators) and any("(round)" in g for g in generators)
    assert sum(g.endswith("/dsl") for g in generators) == 4 and sum(g.endswith("/mdlm") for g in generators) == 1
    sweep = json.loads((tiny_demo / "run" / "sweep.json").read_text())["correlations"]
    for role in ("chosen", "worst", "oracle"):  # every role's bridge is in the table, once per layer
        assert f"bridges/layer-{sweep[role + '_layer']:02d}" in generators
    trained = {row[header.index("train_tokens")] for row in rows if "AR ceiling" not in row[0]}
    assert len(trained) == 1 and {row[header.index("budget")] for row in rows} == {"matched"}
    steps_header, *curve = tables[3]
    for sampler in ("mdlm", "remdm-loop", "roar", "hybrid"):  # three step counts per sampler
        assert sorted(int(r[2]) for r in curve if r[1] == sampler) == [8, 16, 32]
    for plot in ("geometry.png", "sweep.png", "compare.png", "steps.png"):
        assert (tiny_demo / "run" / "plots" / plot).stat().st_size > 20000
    for folder in (tiny_demo / "samples").iterdir():  # one `eval` call, one metrics file beside each samples file
        metrics = json.loads((folder / "samples.metrics.json").read_text())["results"]
        assert list(metrics) == [str(folder / "samples.jsonl")]


def test_compare_refuses_mismatched_budgets_unless_allowed(tiny_demo, capsys):
    dsl = tiny_demo / "dsl"
    other = tiny_demo / "samples" / "mdlm-64"
    common = ["--model", dsl, "--sampler", "mdlm", "--num", 12, "--length", 32, "--device", "cpu"]
    assert invoke(capsys, "-q", "sample", *common, "--steps", 64, "--out", other)[0] == 0
    spec = "synthetic:hmm?states=6&vocab=60&docs=300&length=60&seed=0"
    assert invoke(capsys, "-q", "eval", other / "samples.jsonl", "--evaluator", tiny_demo / "tiny-model",
                  "--references", spec, "--device", "cpu")[0] == 0
    files = [tiny_demo / "samples" / "dsl-mdlm" / "samples.jsonl", other / "samples.jsonl"]
    code, _, err = invoke(capsys, "compare", *files, "--out", tiny_demo / "cmp")
    assert_one_line_error(code, err, 2, "the generators have different budgets")
    code, out, err = invoke(capsys, "--format", "json", "compare", *files, "--out", tiny_demo / "cmp",
                            "--allow-mismatch")
    assert code == 0, err
    assert {r["budget"] for r in json.loads(out)["rows"]} == {"MISMATCH"}
    code, _, err = invoke(capsys, "compare", tiny_demo / "nothing.jsonl", "--out", tiny_demo / "cmp")
    assert_one_line_error(code, err, 2, "samples file not found")
