"""Run 3 of docs/baselines.md (experiments/baselines_results.py --run 3) on made-up records: the
registered tests decide each clause (supported, not supported, inconclusive by convergence), the
paired secondaries are paired, an unconverged row's secondary does not count, the rows and their
sample sets are the protocol's, and the page writer adds its section without touching the rest."""

import json
import math
import shutil
from pathlib import Path

import pytest
from scipy import stats

import experiments.baselines_results as br
from experiments.baselines_results import (BASELINES, LTR, converged, RESULTS_HEADING, RUN3_BRIDGES, RUN3_HEADING,
                                           paired_less, layers_moved, replace_section, training_minutes, run3_rows,
                                           run3_tests, sample_all, welch_less, write_run3_page)
from geoprobe.workflows.sweep import bridge_dir

ROOT = Path(__file__).resolve().parent.parent
SEEDS = (0, 1, 2)
FAR = [4.60, 4.65, 4.70]  # far less likely than LTR_NLL: every one-sided test rejects
LTR_NLL = [3.70, 3.72, 3.74]
NEAR = [3.71, 3.73, 3.75]  # as likely as LTR_NLL: no test rejects
VERDICT = {"chosen_layer": 4, "worst_layer": 3, "oracle_layer": 1, "convergence": {"converged": True}}


def sets(row, nll, evaluations=32, primary=True, tv=(0.60, 0.61, 0.62), diversity=(0.94, 0.95, 0.96)):
    return [{"row": row, "seed": s, "evaluations": evaluations, "primary": primary, "sampler": "hybrid",
             "oracle_nll_per_word": v, "bigram_tv": tv[s], "diversity_within": diversity[s]}
            for s, v in zip(SEEDS, nll)]


def samples(**changed):
    """Every run-3 row's sets: LTR and the worst layer's ltr row at one set (64 evaluations, primary),
    every other row at 32 (primary) and 64 (described); `changed` replaces a row's NLL at 32 (or,
    as "ROW@64", at 64)."""
    nll = {LTR: LTR_NLL, "bridge-worst-ltr": [4.10, 4.12, 4.14], "bridge-chosen-hybrid": [4.00, 4.05, 4.10],
           "bridge-chosen-stack-only": [4.20, 4.22, 4.30], "dsl": [3.90, 3.95, 4.00], "mdlm": [4.00, 4.05, 4.10],
           **{k: FAR for k in BASELINES}}
    records = []
    for row, values in nll.items():
        values = changed.get(row, values)
        if row.endswith("-ltr"):
            records += sets(row, values, evaluations=64)
        else:
            records += sets(row, values) + sets(row, changed.get(f"{row}@64", values), evaluations=64, primary=False)
    return records


def training(unconverged=()):
    rows = [*RUN3_BRIDGES, "dsl", "mdlm", *BASELINES]
    return {row: [{"steps": 4000 if row in unconverged else 1500, "stop": "cap" if row in unconverged else "plateau",
                   "tokens": 1500 * 32 * 65, "train_seconds": 60.0} for _ in SEEDS] for row in rows}


def sweep(converged=True):
    return {"verdict": {**VERDICT, "convergence": {"converged": converged,
                                                   "reasons": [] if converged else ["2 of 15 bridges at the cap"]}}}


def welch_by_hand(a, b):
    """One-sided Welch p (H1: mean a < mean b) from its formula: t and Welch-Satterthwaite's df."""
    va, vb = (stats.tvar(x) / len(x) for x in (a, b))
    t = (sum(a) / len(a) - sum(b) / len(b)) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    return stats.t.cdf(t, df)


def test_the_primary_is_supported_when_ltr_beats_every_baseline_and_its_p_is_welchs():
    found = run3_tests(samples(), training(), sweep(), 0.944)
    assert found["outcome"] == "supported" and found["unconverged"] == []
    for k in BASELINES:
        assert found["p"][k] == pytest.approx(welch_by_hand(LTR_NLL, FAR), rel=1e-9)
        assert found["p"][k] < 0.05


def test_one_baseline_as_likely_as_ltr_makes_it_not_supported():
    found = run3_tests(samples(sed=NEAR), training(), sweep(), 0.944)
    assert found["outcome"] == "not supported"
    assert found["p"]["sed"] > 0.05 and found["p"]["codar"] < 0.05


@pytest.mark.parametrize("unconverged, bridges_converged, named", [
    (("codar",), True, ["codar"]),  # a baseline reached its cap
    ((), False, [LTR]),  # the sweep misses its convergence criterion
    ((LTR,), True, [LTR]),  # a chosen-layer bridge reached its cap
])
def test_an_unconverged_compared_row_makes_the_primary_inconclusive_even_when_every_test_rejects(
        unconverged, bridges_converged, named):
    found = run3_tests(samples(), training(unconverged), sweep(bridges_converged), 0.944)
    assert all(p < 0.05 for p in found["p"].values())
    assert found["outcome"] == "inconclusive" and found["unconverged"] == named


def test_a_baseline_without_a_training_record_is_unconverged_and_the_ar_row_needs_none():
    records = training()
    del records["sed"]  # its training never ran or its records were lost
    found = run3_tests(samples(), records, sweep(), 0.944)
    assert found["outcome"] == "inconclusive" and found["unconverged"] == ["sed"]
    assert converged("ar", records, sweep()) and not converged("sed", records, sweep())
    del records[LTR]  # a bridge row's records lost: unconverged, not a KeyError
    assert not converged(LTR, records, sweep())


def test_an_unconverged_row_outside_the_primary_leaves_it_and_its_own_secondary_does_not_count():
    found = run3_tests(samples(), training(("bridge-worst-ltr",)), sweep(), 0.944)
    assert found["outcome"] == "supported"
    layer = next(s for s in found["secondary"] if "bridge-worst-ltr" in s["test"])
    assert layer["p"] < 0.05  # it would reject, but the worst layer's bridges are not evidence
    assert layer["unconverged"] == ["bridge-worst-ltr"] and layer["adjusted"] == 1.0
    counted = [s for s in found["secondary"] if not s["unconverged"]]
    assert len(found["secondary"]) == 8 and len(counted) == 7


def test_the_layer_choice_cannot_run_where_the_geometry_chose_the_worst_layer():
    same = {"verdict": {**sweep()["verdict"], "chosen_layer": 5, "worst_layer": 5}}
    found = run3_tests(samples(), training(), same, 0.944)
    layer = next(s for s in found["secondary"] if "bridge-worst-ltr" in s["test"])
    assert layer["p"] < 0.05  # the fixture's worst row differs, but both rows would be one set of bridges
    assert "worst layer (5)" in layer["cannot"] and layer["adjusted"] == 1.0
    assert all(s["cannot"] is None for s in found["secondary"] if s is not layer)
    assert "chose layer 5 and found layer 5 the worst" in layers_moved(same["verdict"])
    assert layers_moved(VERDICT) is None
    apart = next(s for s in run3_tests(samples(), training(), sweep(), 0.944)["secondary"]
                 if s["test"] == layer["test"])
    assert apart["cannot"] is None and apart["adjusted"] < 1.0


def test_holm_runs_over_all_eight_secondaries():
    found = run3_tests(samples(), training(), sweep(), 0.944)
    tests = [s["test"] for s in found["secondary"]]
    assert len(tests) == 8 and sum(t.startswith("bigram distance") for t in tests) == 3
    smallest = min(found["secondary"], key=lambda s: s["p"])
    assert smallest["adjusted"] == pytest.approx(min(1.0, 8 * smallest["p"]))


def test_the_decoding_secondaries_are_paired_by_seed():
    """One bridge per seed decoded two ways: a steady small gain under a wide seed spread is
    significant paired and not under Welch's unpaired test."""
    ltr, hybrid = [3.50, 3.90, 4.30], [3.55, 3.96, 4.34]
    found = run3_tests(samples(**{LTR: ltr, "bridge-chosen-hybrid": hybrid}), training(), sweep(), 0.944)
    test = next(s for s in found["secondary"] if s["test"] == f"NLL: {LTR} < bridge-chosen-hybrid (paired by seed)")
    d = [a - b for a, b in zip(ltr, hybrid)]  # the paired t by hand: mean difference over its standard error
    t = (sum(d) / 3) / (stats.tstd(d) / math.sqrt(3))
    assert test["p"] == pytest.approx(stats.t.cdf(t, 2), rel=1e-9)
    assert test["p"] < 0.05 < welch_less(ltr, hybrid)


def test_matched_evaluations_are_described_from_the_baselines_64_evaluation_sets():
    found = run3_tests(samples(**{"sed@64": NEAR}), training(), sweep(), 0.944)
    matched = found["matched"]
    assert found["outcome"] == "supported"  # the primary compares the baselines at 32
    assert matched["sed"] > 0.05 and matched["codar"] < 0.05


def test_a_test_without_two_values_a_side_or_without_spread_never_rejects():
    assert welch_less([3.0], [4.0, 4.1]) == 1.0
    assert welch_less([3.0, 3.0], [4.0, 4.0]) == 1.0
    assert paired_less({0: 3.0}, {0: 4.0}) == 1.0
    assert paired_less({0: 3.0, 1: 3.5}, {0: 4.0, 1: 4.5}) == 1.0  # the same difference twice: no spread
    assert paired_less({0: 3.1, 1: 3.2, 2: 3.3}, {0: 4.1, 1: 4.2, 2: 4.3}) == 1.0  # the same up to float rounding
    assert paired_less({0: 3.0, 1: 3.5, 2: 3.0}, {0: 4.0, 1: 4.4, 2: 4.2}) < 0.05  # with spread, it tests
    assert paired_less({0: 3.0, 1: 3.1}, {2: 4.0, 3: 4.1}) == 1.0  # no seed in common


def test_run3_rows_decode_the_chosen_and_worst_layers_bridges_as_registered(tmp_path):
    table = run3_rows(tmp_path, VERDICT)
    assert set(table) == {LTR, "bridge-chosen-hybrid", "bridge-chosen-stack-only", "bridge-worst-ltr"}
    expected = {LTR: (4, "ltr", "stack"), "bridge-chosen-hybrid": (4, "hybrid", "stack"),
                "bridge-chosen-stack-only": (4, "hybrid", "stack-only"), "bridge-worst-ltr": (3, "ltr", "stack")}
    for row, (layer, sampler, decode) in expected.items():
        folders, got_sampler, got_decode, words, start = table[row]
        assert folders == {s: bridge_dir(tmp_path / "run", layer, s) for s in SEEDS}
        assert (got_sampler, got_decode, words, start) == (sampler, decode, 64, "blocks:64")


def test_sample_all_draws_ltr_once_per_seed_at_a_step_per_word_and_the_others_at_both_budgets(tmp_path, monkeypatch):
    calls = []

    def score(folder, model, sampler, steps, *, decode, length, start):
        calls.append((folder.relative_to(tmp_path).as_posix(), sampler, steps, decode, length))
        return {"oracle_nll_per_word": 4.0}

    monkeypatch.setattr(br, "score_samples", score)
    table = {k: v for k, v in run3_rows(tmp_path, VERDICT).items() if k in (LTR, "bridge-chosen-stack-only")}
    records = sample_all(tmp_path, table, ar=False)
    ltr = [c for c in calls if c[1] == "ltr"]
    assert ltr == [(f"samples/{LTR}-seed{s}/ltr-64", "ltr", 64, "stack", 64) for s in SEEDS]
    assert [c[2:4] for c in calls if c[1] == "hybrid"] == [(32, "stack-only"), (64, "stack-only")] * 3
    assert {(r["row"], r["evaluations"], r["primary"]) for r in records} == {
        (LTR, 64, True), ("bridge-chosen-stack-only", 32, True), ("bridge-chosen-stack-only", 64, False)}


def test_replace_section_changes_only_its_own_section():
    text = "# Page\n\nprotocol\n\n## Results of run 2\n\nold two\n\n### its table\n\nrows\n\n## Results of run 3\n\nold three\n"
    two = replace_section(text, RESULTS_HEADING, [RESULTS_HEADING, "", "new two", ""])
    assert two == "# Page\n\nprotocol\n\n## Results of run 2\n\nnew two\n\n## Results of run 3\n\nold three\n"
    three = replace_section(text, RUN3_HEADING, [RUN3_HEADING, "", "new three", ""])
    assert three == text.replace("old three\n", "new three\n\n")  # the writer's last "" line, as run 2's page has
    assert replace_section("# Page\n\nx\n", RUN3_HEADING, [RUN3_HEADING, "", "y"]) == \
        "# Page\n\nx\n\n## Results of run 3\n\ny\n"
    assert replace_section("## Results of run 20\n", "## Results of run 2", ["## Results of run 2"]) == \
        "## Results of run 20\n\n## Results of run 2\n"  # a heading matches as a whole line only


def test_the_real_page_is_unchanged_when_run_2s_section_is_rewritten_as_it_stands():
    text = (ROOT / "docs" / "baselines.md").read_text()
    section = text[text.index(RESULTS_HEADING):].split("\n## ")[0]
    lines = section.split("\n")[:-1]  # as the writer gives them: it adds the last newline
    assert replace_section(text, RESULTS_HEADING, lines) == text


def test_the_page_writer_adds_run_3s_section_below_run_2s_and_leaves_the_rest(tmp_path):
    page = tmp_path / "baselines.md"
    text = (ROOT / "docs" / "baselines.md").read_text()
    page.write_text(text[:text.index(RUN3_HEADING)].rstrip() + "\n" if RUN3_HEADING in text else text)  # before run 3
    before = page.read_text()
    records = [{**r, "sampler": RUN3_BRIDGES.get(r["row"], ("", "hybrid", "stack"))[1],
                "decode": RUN3_BRIDGES.get(r["row"], ("", "hybrid", "stack"))[2]} for r in samples()]
    write_run3_page(tmp_path, page, records, training(), sweep(), {}, 60.0)
    after = page.read_text()
    assert after.startswith(before.rstrip() + "\n\n" + RUN3_HEADING + "\n")  # everything above kept, byte for byte
    section = after[after.index(RUN3_HEADING):]
    assert "**Supported**" in section and section.count("Holm-adjusted") == 8
    assert "| `bridge-chosen-stack-only` | hybrid, --decode stack-only |" in section
    assert "they did not all reproduce run 2" in section  # made-up steps are not run 2's
    assert all(f"| `{row}` |" in section for row in [*RUN3_BRIDGES, "dsl", "mdlm", *BASELINES])
    write_run3_page(tmp_path, page, records, training(), sweep(), {}, 60.0)
    assert page.read_text() == after  # rewriting replaces its own section, no second copy


def test_run_3_refuses_an_mdlm_trained_on_the_legacy_objective(tmp_path):
    for seed, objective in zip(SEEDS, ("mdlm", "mdlm", "legacy")):
        folder = tmp_path / "models" / f"mdlm-seed{seed}"
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps({"training": {"mdlm_objective": objective}}))
    with pytest.raises(SystemExit, match="mdlm-seed2 trained on the legacy"):
        br.check_mdlm_objective(tmp_path)
    (tmp_path / "models" / "mdlm-seed2" / "config.json").write_text(json.dumps({"training": {"mdlm_objective": "mdlm"}}))
    br.check_mdlm_objective(tmp_path)


def test_the_run_3_driver_trains_checks_mdlm_first_samples_the_registered_rows_and_writes_its_section(
        tmp_path, monkeypatch):
    """The driver's wiring at no budget: training and sampling are replaced by records written
    where the real ones go (a model folder's metrics.json and config.json), so that
    training_record, the tests and the page read what a real run leaves."""
    def record(folder, objective=None):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "metrics.json").write_text(json.dumps({"steps_run": 1500, "stop": "plateau", "train_seconds": 9.0}))
        (folder / "config.json").write_text(json.dumps({"budget": {"batch_size": 32, "seq_len": 65},
                                                        "training": {"mdlm_objective": objective}}))

    nll = {LTR: 3.7, "bridge-worst-ltr": 4.1, "bridge-chosen-hybrid": 4.0, "bridge-chosen-stack-only": 4.2,
           "dsl": 3.9, "mdlm": 4.0, **{k: 4.7 for k in BASELINES}}
    drawn = []

    def score(folder, model, sampler, steps, *, decode, length, start):
        row, seed = folder.parent.name.rsplit("-seed", 1)
        drawn.append((row, sampler, steps))
        return {"oracle_nll_per_word": nll[row] + 0.01 * int(seed) + 0.001 * (steps == 64), "bigram_tv": 0.6,
                "diversity_within": 0.95, "bigram_tv_hmm": 0.59}

    legacy = {"mdlm": "legacy"}
    monkeypatch.setattr(br, "train_variant", lambda out, name, seed: record(
        out / "models" / f"{name}-seed{seed}", legacy.get(name, "mdlm")))
    monkeypatch.setattr(br, "held_out_bound", lambda folder: {})
    monkeypatch.setattr(br, "train_baseline", lambda out, kind, seed: record(out / "models" / f"{kind}-seed{seed}"))
    monkeypatch.setattr(br, "score_samples", score)
    monkeypatch.setattr(br, "score_ar", lambda folder, seed: {"oracle_nll_per_word": 3.5 + 0.01 * seed})
    monkeypatch.setattr(br, "flops_per_token", lambda out: {})
    monkeypatch.setattr(br, "bridge_flops", lambda out, table: {})

    def sweep_run(out):
        for layer in (3, 4):
            for s in SEEDS:
                record(bridge_dir(out / "run", layer, s))
        return sweep()

    monkeypatch.setattr(br, "bridges", sweep_run)
    page = tmp_path / "baselines.md"
    shutil.copy(ROOT / "docs" / "baselines.md", page)
    with pytest.raises(SystemExit, match="legacy"):  # before any sample is drawn
        br.run(tmp_path / "out", page, 3)
    assert drawn == [] and page.read_text() == (ROOT / "docs" / "baselines.md").read_text()
    legacy.clear()
    shutil.rmtree(tmp_path / "out")
    br.run(tmp_path / "out", page, 3)
    assert {(row, sampler, steps) for row, sampler, steps in drawn if row.endswith("-ltr")} == {
        (LTR, "ltr", 64), ("bridge-worst-ltr", "ltr", 64)}
    assert {row for row, *_ in drawn} == {*RUN3_BRIDGES, "dsl", "mdlm", *BASELINES}
    section = page.read_text().split(RUN3_HEADING)[1]
    assert "**Supported**" in section and "| `ar` | ar |" in section
    assert RESULTS_HEADING not in section and page.read_text().count(RUN3_HEADING) == 1


def test_training_minutes_count_each_model_once_and_every_bridge_of_the_sweep():
    shared = [{"steps": 1500, "stop": "plateau", "train_seconds": 120.0, "folder": f"run/bridges/layer-05/seed-{s}"}
              for s in SEEDS]
    records = {"dsl": [{"steps": 1500, "stop": "plateau", "train_seconds": 60.0, "folder": f"models/dsl-seed{s}"}
                       for s in SEEDS],
               LTR: shared, "bridge-chosen-hybrid": shared, "bridge-worst-ltr": shared}
    assert training_minutes(records) == (pytest.approx((3 * 60 + 3 * 120) / 60), 6)  # the shared bridges once
    sweep = {"rows": [{"layer": l, "seed": s, "train_seconds": 30.0} for l in (1, 2, 3, 4, 5) for s in SEEDS]}
    assert training_minutes(records, sweep) == (pytest.approx((3 * 60 + 15 * 30) / 60), 18)  # the sweep's own bridges
