"""The matched-budget comparison table and the quality-against-steps table (their plots: geoprobe/report/plots.py).

A generator's row joins three files that the other commands write: the samples file
(`geoprobe sample`), its metadata row in `samples.meta.jsonl` (sampler, steps, NFE, wall time,
seed, model) and its `SAMPLES.metrics.json` (`geoprobe eval`). The budget of a row is the
training tokens of its model (steps x batch x sequence length, from the checkpoint's
config.json) and its sampling steps; rows with different budgets are refused unless allowed,
and then marked. A left-to-right row (`ltr`) has no step budget: it takes one evaluation per
token, so only its training tokens are matched. A bridge's row names its decoding where it is
not the default: " (round)", " (stack-only)".

Each compared samples file gets its row beside it, SAMPLES.row.json (`row_path`): numbers and
names, no text. Such a file stands for its samples in a later compare, so a row survives
where its samples, model and evaluator do not (a run's records on another machine).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from geoprobe.bridges.checkpoint import training_tokens
from geoprobe.bridges.kinds import highlight_of
from geoprobe.errors import BadInput
from geoprobe.files import holding, write_json_atomic
from geoprobe.samplers.ltr import LeftToRight
from geoprobe.store import check_writable
from geoprobe.workflows.evaluate import generator_of
from geoprobe.workflows.generate import generator_name

COLUMNS = ["generator", "sampler", "steps", "nfe", "nfe_per_sample", "seconds_per_sample", "train_tokens",
           "used_tokens", "samples", "evaluator", "gen_ppl", "gen_ppl_lo", "gen_ppl_hi", "other_evaluators",
           "own_evaluator", "eos_per_sample", "specials_per_sample", "diversity_within", "diversity_pooled",
           "unigram_entropy", "token_entropy", "mauve",
           "mauve_std", "mauve_samples", "oracle_nll_per_word", "oracle_nll_lo", "oracle_nll_hi", "bigram_tv",
           "bigram_tv_hmm", "oracle_invalid", "budget"]
# the two entropies, named where a table is shown (compare.md): not the same quantity
ENTROPY_LEGEND = ("unigram_entropy: word entropy (unigram, whitespace words), nats per sample; token_entropy: "
                  "token entropy (generator's token ids, as ReMDM/DSL report it), nats per sample. The two are not "
                  "comparable.")
BOOTSTRAP = 1000  # resamples of a row's samples for its 95% intervals
ROW = ".row.json"  # a samples file's recorded row (`row_path`), taken in its place


def bootstrap_interval(numerators: list[float], denominators: list[float] | None = None, transform=None,
                       seed: int = 0) -> tuple[float | None, float | None]:
    """The 95% percentile interval of sum(numerators) / sum(denominators) (default: the mean)
    over BOOTSTRAP resamples of the items (pairs with a non-finite part are left out), through
    `transform` (e.g. exp for a perplexity from log-likelihoods)."""
    import numpy as np

    denominators = [1.0] * len(numerators) if denominators is None else denominators
    pairs = np.array([(a, b) for a, b in zip(numerators, denominators) if a is not None and b
                      and math.isfinite(a) and math.isfinite(b)], dtype=float).reshape(-1, 2)
    if len(pairs) < 2:
        return None, None
    picks = np.random.default_rng(seed).integers(0, len(pairs), (BOOTSTRAP, len(pairs)))
    ratios = pairs[picks, 0].sum(1) / pairs[picks, 1].sum(1)
    lo, hi = np.quantile(ratios, [0.025, 0.975])
    if transform is not None:
        lo, hi = transform(lo), transform(hi)
    return float(lo), float(hi)


def intervals(values: dict) -> dict:
    """A row's bootstrap intervals over its samples, of the statistics the row shows: Gen.PPL =
    exp(total NLL / total tokens) and the oracle NLL per word = total NLL / total words."""
    lo, hi = bootstrap_interval(values.get("nll_per_sample") or [], values.get("tokens_per_sample"), math.exp)
    per_word, words = values.get("oracle_nll_per_sample") or [], values.get("oracle_words_per_sample") or []
    nll_lo, nll_hi = bootstrap_interval([v * n for v, n in zip(per_word, words)], words)
    return {"gen_ppl_lo": lo, "gen_ppl_hi": hi, "oracle_nll_lo": nll_lo, "oracle_nll_hi": nll_hi}


def other_interval(values: dict, evaluator: str) -> str:
    """" (lo–hi)": the 95% interval of another evaluator's Gen.PPL, where eval kept its per-sample
    NLLs (since 2026-12-06); "" where not."""
    scored = (values.get("nll_by_evaluator") or {}).get(evaluator) or {}
    lo, hi = bootstrap_interval(scored.get("nll_per_sample") or [], scored.get("tokens_per_sample"), math.exp)
    return "" if lo is None else f" ({lo:.6g}–{hi:.6g})"


def other_gen_ppl(text: str | None) -> dict[str, tuple[float, float | None, float | None]]:
    """A row's `other_evaluators` read back: each evaluator's (Gen.PPL, interval low, high)."""
    found = {}
    for entry in (text or "").split("; "):
        name, _, value = entry.rpartition(": ")
        ppl, _, interval = value.partition(" (")
        lo, _, hi = interval.rstrip(")").partition("–")
        try:
            found[name] = (float(ppl), float(lo) if lo else None, float(hi) if hi else None)
        except ValueError:  # not an entry compare wrote (an older or edited table): left out
            continue
    return found


def distinguishable(rows: list[dict], key: str) -> tuple[list[tuple[dict, dict]], int]:
    """(pairs (better, worse) whose 95% intervals of `key` (lower is better) are disjoint, the
    number of pairs compared): rows whose intervals overlap are not ranked."""
    have = [r for r in rows if r.get(f"{key}_lo") is not None and r.get(f"{key}_hi") is not None]
    pairs = [(a, b) for a in have for b in have if a is not b and a[f"{key}_hi"] < b[f"{key}_lo"]]
    return pairs, len(have) * (len(have) - 1) // 2


def row_path(samples: Path) -> Path:
    """Where compare writes a samples file's row: SAMPLES.row.json beside it."""
    return Path(samples).with_suffix(ROW)


def comparison_row(samples: Path) -> dict:
    """A samples file's row (its meta row, its eval metrics, its model's training tokens), or the
    row a SAMPLES.row.json file recorded (less its budget mark, which compare sets again)."""

    samples = Path(samples)
    if samples.name.endswith(ROW):
        if not samples.is_file():
            raise BadInput(f"recorded row not found: {samples}")
        return {k: v for k, v in json.loads(samples.read_text()).items() if k != "budget"}
    metrics_path = samples.with_suffix(".metrics.json")
    if not samples.is_file():
        raise BadInput(f"samples file not found: {samples}")
    if not metrics_path.is_file():
        raise BadInput(f"{samples} has no {metrics_path.name}: run `geoprobe eval {samples}` first")
    meta, kind, _ = generator_of(samples)  # and the registry's entry of its model (None: the AR ceiling's plain LM)
    if not meta:
        raise BadInput(f"{samples} has no row in samples.meta.jsonl: it was not written by `geoprobe sample`")
    record = json.loads(metrics_path.read_text())
    metrics = record["results"]
    values = next(iter(metrics.values()))
    model = Path(meta["model"])
    name = generator_name(meta["model"])
    suffix = {"round": " (round)", "stack-only": " (stack-only)", "causal": " (AR)"}.get(meta.get("decode"), "")
    budget, used = training_tokens(model)
    evaluator = values.get("evaluator") or record.get("evaluator")
    others = {k: v for k, v in (values.get("gen_ppl_by_evaluator") or {}).items() if k != evaluator}
    return {"generator": name + suffix, "generator_kind": None if kind is None else kind.name,
            "sampler": meta["sampler"], "steps": meta.get("steps"), "nfe": meta["nfe"],
            "nfe_per_sample": meta.get("nfe_per_sample"),
            "seconds_per_sample": meta["seconds"] / max(1, meta.get("num") or values.get("samples") or 1),
            "train_tokens": budget, "used_tokens": used, "evaluator": evaluator,
            "other_evaluators": "; ".join(f"{k}: {v:.6g}{other_interval(values, k)}" for k, v in others.items()) or None,
            "own_evaluator": ", ".join(values.get("evaluator_is_generator") or []) or None,
            **{k: values.get(k) for k in ("samples", "gen_ppl", "eos_per_sample", "specials_per_sample",
                                          "diversity_within", "diversity_pooled",
                                          "unigram_entropy", "token_entropy", "mauve", "mauve_std", "mauve_samples",
                                          "oracle_nll_per_word", "bigram_tv", "bigram_tv_hmm", "oracle_invalid")},
            **intervals(values)}


def compare(samples: list[Path], allow_mismatch: bool = False) -> list[dict]:
    rows = [comparison_row(p) for p in samples]
    trained = [r for r in rows if r["train_tokens"] is not None]  # AR: pretrained, no training budget
    tokens = {r["train_tokens"] for r in trained}
    steps = {r["steps"] for r in trained if r["sampler"] != LeftToRight.name}  # ltr: one evaluation per token
    mismatch = len(tokens) > 1 or len(steps) > 1
    if mismatch and not allow_mismatch:
        raise BadInput(f"the generators have different budgets (token caps {sorted(tokens)}, sampling steps "
                       f"{sorted(steps, key=str)}); pass --allow-mismatch to compare them anyway")
    for r in rows:
        r["budget"] = "MISMATCH" if mismatch else "matched"
    return rows


def compare_run(samples: list[Path], out: Path, allow_mismatch: bool = False, curve: list[Path] | None = None) -> dict:
    """What `geoprobe compare` does: one table of the evaluated samples at one budget
    (compare.csv, compare.md, plots/compare.png), and with `curve` the same generators at other
    step counts (steps.csv, plots/steps.png). Returns rows and the files written."""

    check_writable(out)
    with holding(Path(out), "geoprobe compare"):
        rows = compare(samples, allow_mismatch)
        points = [comparison_row(p) for p in curve or []]
        for path, row in zip([*samples, *(curve or [])], rows + points):  # each row beside its samples
            if not Path(path).name.endswith(ROW):
                write_json_atomic(row_path(path), row)
        table, plot = write_comparison(rows, out)
        result = {"rows": rows, "table": str(table), "plot": str(plot)}
        if curve:
            lines = {(r["generator"], r["sampler"]) for r in points}
            points += [r for r in rows if (r["generator"], r["sampler"]) in lines]
            result["steps_table"], result["steps_plot"] = map(str, steps_curve(points, out))
        return result


def write_rows(path: Path, rows: list[dict], columns: list[str]) -> None:
    """compare.csv / steps.csv / sweep.csv: `columns` of each row, missing values left empty
    (nullable dtypes: a step count stays 16, not 16.0, beside a missing one)."""
    pd.DataFrame.from_records(rows, columns=columns).convert_dtypes().to_csv(path, index=False)


def with_none(frame: pd.DataFrame) -> pd.DataFrame:
    """Object columns with None where a value is missing (not NaN: a number that means something)."""
    return frame.astype(object).where(frame.notna(), None)


def records(frame: pd.DataFrame) -> list[dict]:
    """A DataFrame's rows as plain dicts, missing values as None."""
    return with_none(frame).to_dict("records")


def read_rows(path: Path) -> list[dict]:
    """The rows of compare.csv, steps.csv or sweep.csv, missing values as None."""
    return records(pd.read_csv(path))


def markdown_table(rows: list[dict], columns=COLUMNS) -> str:
    """`columns` of the rows as a Markdown table: 4 significant digits, a dash where missing."""
    frame = with_none(pd.DataFrame.from_records(rows, columns=columns))
    return frame.to_markdown(index=False, tablefmt="github", floatfmt=".4g", missingval="—")


def write_comparison(rows: list[dict], out: Path) -> tuple[Path, Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_rows(out / "compare.csv", rows, COLUMNS)
    (out / "compare.md").write_text("# Matched-budget comparison\n\n" + markdown_table(rows) + "\n\n"
                                    + ENTROPY_LEGEND + "\n")
    return out / "compare.csv", compare_plot(rows, out / "plots" / "compare.png")


def steps_curve(rows: list[dict], out: Path) -> tuple[Path, Path]:
    """steps.csv and plots/steps.png: Gen.PPL and MAUVE against sampling steps, one line per sampler."""
    from geoprobe.report.plots import steps_plot

    out = Path(out)
    rows = sorted(rows, key=lambda r: (r["generator"], r["sampler"], r["steps"] or 0))
    write_rows(out / "steps.csv", rows, COLUMNS[:-1])  # no budget column: the steps differ by design
    return out / "steps.csv", steps_plot(rows, out / "plots" / "steps.png")


def compare_plot(rows: list[dict], path: Path) -> Path:
    """plots/compare.png (geoprobe/report/plots.py), each row's group from the kinds table: the
    pretrained AR ceiling (no training budget), a kind the table sets apart, or the other trained ones."""
    from geoprobe.report.plots import CEILING_GROUP, compare_plot as draw

    groups = [CEILING_GROUP if r["train_tokens"] is None else highlight_of(r["generator_kind"]) for r in rows]
    return draw(rows, groups, path)
