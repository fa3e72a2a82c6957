"""The registered test of docs/baselines-sensitivity.md on made-up sample sets: which variant is
each baseline's best, the three outcomes, and an unconverged variant's exclusion."""

from experiments.baselines_sensitivity import verdict


def sets(variant, baseline, evaluations, values):
    return [{"variant": variant, "baseline": baseline, "evaluations": evaluations, "seed": s,
             "oracle_nll_per_word": v} for s, v in enumerate(values)]


BRIDGE = sets("bridge-chosen", None, 32, [3.90, 3.92, 3.94])
FAR = [4.60, 4.65, 4.70]  # beaten by the bridge: p well below 0.05
NEAR = [3.91, 3.93, 3.95]  # as likely as the bridge: p near 0.5


def table(changed=None):
    rows = {("diffusion-lm", 32): FAR, ("diffusion-lm @2000", 2000): FAR, ("diffusion-lm no-wd", 32): FAR,
            ("diffusion-lm no-wd", 2000): FAR, ("sed", 32): FAR, ("sed @1000", 1000): FAR,
            ("sed unclipped", 32): FAR, ("sed unclipped", 1000): FAR, ("codar", 32): FAR, ("codar @1000", 1000): FAR}
    rows.update(changed or {})
    return BRIDGE + [r for (variant, e), values in rows.items()
                     for r in sets(variant, variant.split(" ")[0], e, values)]


def test_the_verdict_survives_when_the_bridge_beats_every_baselines_best_variant():
    v = verdict(table(), set())
    assert v["outcome"] == "survives"
    assert all(b["p"] < 0.05 and b["p_matched"] < 0.05 for b in v["baselines"].values())


def test_a_baseline_as_good_only_at_its_whole_schedule_leaves_the_verdict_at_matched_evaluations():
    v = verdict(table({("diffusion-lm @2000", 2000): NEAR}), set())
    assert v["outcome"] == "survives at matched evaluations only"
    assert v["baselines"]["diffusion-lm"]["best"] == ("diffusion-lm @2000", 2000)
    assert v["baselines"]["diffusion-lm"]["best_matched"][1] == 32
    assert v["baselines"]["diffusion-lm"]["p"] > 0.05


def test_two_baselines_as_good_only_at_their_whole_schedules_still_leave_it_at_matched_evaluations():
    v = verdict(table({("diffusion-lm no-wd", 2000): NEAR, ("codar @1000", 1000): NEAR}), set())
    assert v["outcome"] == "survives at matched evaluations only"
    assert v["baselines"]["diffusion-lm"]["best"] == ("diffusion-lm no-wd", 2000)
    assert v["baselines"]["codar"]["best"] == ("codar @1000", 1000)


def test_a_retrained_variant_as_good_at_32_evaluations_overturns_it():
    v = verdict(table({("sed unclipped", 32): NEAR}), set())
    assert v["outcome"] == "does not survive"
    assert v["baselines"]["sed"]["best_matched"] == ("sed unclipped", 32)


def test_an_unconverged_variant_cannot_be_a_best_variant_at_any_evaluations():
    v = verdict(table({("sed unclipped", 32): NEAR, ("sed unclipped", 1000): NEAR}), {"sed unclipped"})
    assert v["outcome"] == "survives"
    assert v["baselines"]["sed"]["best"][0] != "sed unclipped"
    assert v["baselines"]["sed"]["best_matched"][0] != "sed unclipped"
