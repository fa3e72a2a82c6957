"""The ranking table as CSV, Markdown and a rich terminal table."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
from geoprobe.report.terminal import stdout_console

COLUMNS = ["layer", "curv", "curv_lo", "curv_hi", "mono", "mono_lo", "mono_hi", "erank", "erank_lo", "erank_hi",
           "score", "score_lo", "score_hi", "rank", "p_first", "p_first_reseed", "participation_ratio", "entropy_rank",
           "duplicate_fraction", "massive", "massive_channels", "channel_share", "bridgeable"]


def _fmt(value) -> str:
    if isinstance(value, float):
        return "—" if math.isnan(value) else f"{value:.4g}"  # NaN only ever means "no interval"
    return str(value)


def write_csv(ranking: dict, path: Path) -> None:
    """ranking.csv: one row per layer, every proxy and interval (nan: no interval)."""
    pd.DataFrame.from_records(ranking["rows"], columns=COLUMNS).to_csv(path, index=False, na_rep="nan")


def _interval(row, name) -> str:
    return f"{_fmt(row[name])} [{_fmt(row[name + '_lo'])}, {_fmt(row[name + '_hi'])}]"


def display_rows(ranking: dict, intervals: bool = True) -> tuple[list[str], list[list[str]]]:
    """Rows for people: every proxy with its interval (Markdown), or the score's only (terminal)."""
    def cell(r, name):
        return _interval(r, name) if intervals else _fmt(r[name])

    head = ["layer", "curv", "mono", "erank", "score", "score 95% CI", "rank", "P(first)", "P(first) reseeds", "dup",
            "massive states", "mch (var)"]
    rows = [[str(r["layer"]) + ("" if r.get("bridgeable", True) else " †"), cell(r, "curv"), cell(r, "mono"), cell(r, "erank"), _fmt(r["score"]),
             f"[{_fmt(r['score_lo'])}, {_fmt(r['score_hi'])}]", str(r["rank"]), _percent(r["p_first"]),
             _percent(r.get("p_first_reseed", float("nan"))),
             f"{r['duplicate_fraction']:.2f}", str(r["massive"]),
             f"{r.get('massive_channels', 0)} ({r.get('channel_share', 0.0):.0%})"] for r in ranking["rows"]]
    if intervals:
        head = ["layer", "curv [95% CI]", "mono [95% CI]", "erank [95% CI]", "score [95% CI]", "rank", "P(first)",
                "P(first) reseeds", "dup", "massive states", "massive channels (their variance share)"]
        for row, r in zip(rows, ranking["rows"]):
            row[4:6] = [_interval(r, "score")]
    return head, rows


def _percent(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.0%}"


def caption(ranking: dict, geometry: dict) -> str:
    s = geometry["settings"]
    unit, units = geometry.get("bootstrap_unit", "document"), geometry.get("bootstrap_units", geometry["n_docs"])
    intervals = {"document": f"intervals resample the {units} documents",
                 "block": f"fewer than 20 documents: intervals resample the {units} blocks (sequences) instead"
                          + (", too few for more than a rough interval" if units < 20 else ""),
                 "none": "fewer than 20 documents and 5 blocks: no interval can be given"}[unit]
    return (f"{geometry.get('model')}: {geometry['rows']} states/layer from {geometry['n_docs']} documents "
            f"({intervals}); "
            f"normalize={ranking['normalize']}, weights={ranking['weights']}, log={ranking['log']}, k={s['k']}, "
            f"anchors={s['anchors']}, pairs={s['pairs']}, alpha={s['alpha']}, bootstrap={s['bootstrap']}, "
            f"seed={s['seed']}, drop_massive={s['drop_massive']} (`massive states`: the states whose norm exceeds "
            f"{s.get('massive_factor', 20.0):g}x the median, {'dropped' if s['drop_massive'] else 'kept'}; `dup`: the "
            f"share of duplicate states), massive channels "
            f"{'excluded' if ranking.get('drop_massive_channels') else 'kept'} (a channel is massive when its variance "
            f"exceeds {s.get('channel_factor', 20.0):g}x the median channel variance). Chosen layer: {ranking['chosen_layer']} "
            f"(ranked first in {_percent(ranking['chosen_p_first'])} of bootstrap replicates"
            + (f" and in {_percent(ranking['chosen_p_first_reseed'])} of {ranking['reseeds']} draws of anchors and pairs"
               if ranking.get("reseeds") else "") + ")."
            + (" †: the last block's output, with no block above it to host a bridge; the chosen layer is the "
               "best-ranked of the others." if any(not r.get("bridgeable", True) for r in ranking["rows"]) else ""))


def write_markdown(ranking: dict, geometry: dict, path: Path, other: dict | None = None) -> None:
    """ranking.md; with `other` (the ranking under the opposite choice about massive channels)
    a second table follows the first."""
    lines = ["# Layer ranking", ""]
    for table in [ranking] + ([other] if other else []):
        head, rows = display_rows(table)
        if other:
            lines += [f"## Massive channels {'excluded' if table['drop_massive_channels'] else 'kept'}"
                      f"{' (the primary ranking)' if table is ranking else ''}", ""]
        cells = pd.DataFrame(rows, columns=head).to_markdown(index=False, tablefmt="github", disable_numparse=True)
        lines += [caption(table, geometry), "", cells, ""]
    path.write_text("\n".join(lines))


# the columns an 80-column terminal shows (ranking.md and --format json keep every one)
NARROW = ("layer", "curv", "mono", "erank", "score", "rank", "P(first)")


def print_ranking(ranking: dict, geometry: dict, console=None) -> None:
    """The ranking for a terminal: every column where it is wide enough (110 characters), else the
    proxies, the score, the rank and P(first), whole (no cell cut to "0.0…")."""
    from rich.table import Table

    console = console or stdout_console()
    head, rows = display_rows(ranking, intervals=False)
    keep = [i for i, name in enumerate(head) if console.width >= 110 or name in NARROW]
    table = Table(title="layer ranking", caption=caption(ranking, geometry))
    for i in keep:
        table.add_column(head[i], justify="right", overflow="fold")
    for row, data in zip(rows, ranking["rows"]):
        table.add_row(*[row[i] for i in keep], style="bold green" if data["layer"] == ranking["chosen_layer"] else None)
    console.print(table)
