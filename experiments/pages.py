"""Page writing shared by the experiments: the three opening lines, plain numbers, generators
named by their role, and markdown tables with short column names and a legend.

The report sections an experiment copies into its page come from the library as markdown;
`tidy_tables` rewrites their tables in place (plain figures, role names, no always-empty column,
the columns every row shares said once below the table) and leaves everything else as it is.
"""

from __future__ import annotations

import math
import re

import numpy as np

EMPTY = "—"
# a figure in scientific notation, as the library's tables print large values (1.071e+05)
SCIENTIFIC = re.compile(r"(?<![\w.])(-?\d+(?:\.\d+)?)e([+-]\d+)(?![\w.])")
# generators named by the folder they were trained into, by their role on the page
ROLES = {"dsl": "DSL", "mdlm": "MDLM", "dsl-smollm2": "DSL from SmolLM2", "diffusion-lm": "Diffusion-LM",
         "sed": "SED", "codar": "CoDAR"}


def three_lines(tested: str, outcome: str, rests_on: str) -> list[str]:
    """A results page's opening: what was tested, the outcome, what the outcome rests on."""
    return [f"**Tested:** {tested}  ", f"**Outcome:** {outcome}  ", f"**Rests on:** {rests_on}"]


def plain(value: float, digits: int = 4) -> str:
    """A figure in plain notation: 1,000 and more as a whole number with thousands separators
    (107,106), smaller ones to `digits` significant digits (0.006889)."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return EMPTY
    if abs(value) >= 1000:
        return f"{round(value):,}"
    if value == 0:
        return "0"
    places = digits - 1 - math.floor(math.log10(abs(value)))
    return f"{value:.{max(places, 0)}f}".rstrip("0").rstrip(".") if places > 0 else f"{round(value)}"


def commas(text: str) -> str:
    """`text` with thousands separators in every figure of 10,000 or more (163904 -> 163,904)."""
    return re.sub(r"(?<![\w.,])\d{5,}", lambda m: f"{int(m.group(0)):,}", text)


def sentence(text: str) -> str:
    """`text` with its first letter capitalised where it is a Latin one ("ρ(loss, depth)" stays as
    it is: its capital is the Greek "Ρ")."""
    return text[:1].upper() + text[1:] if text[:1].isascii() else text


def whole(text: str) -> str:
    """`text` with every figure of 100 or more written whole, with thousands separators
    (1357.49 (1251.05–1469.07) -> 1,357 (1,251–1,469)); smaller ones as they are."""
    return re.sub(r"(?<![\w.,])\d{3,}(?:\.\d+)?", lambda m: f"{float(m.group(0)):,.0f}", text)


def plain_text(text: str) -> str:
    """`text` with every figure in scientific notation written plainly (1.071e+05 -> 107,100)."""

    def written(match: re.Match) -> str:  # as many significant digits as it was written with
        value = float(match.group(0))
        if abs(value) < 1000:
            return plain(value, len(match.group(1).lstrip("-").replace(".", "").lstrip("0")) or 1)
        digits = len(match.group(1).lstrip("-").replace(".", "").lstrip("0")) or 1
        return f"{round(value, digits - 1 - math.floor(math.log10(abs(value)))):,.0f}"

    return SCIENTIFIC.sub(written, text)


def role(generator: str) -> str:
    """A generator's name on a page, from the folder or spec a comparison row names it by.

    A bridge's folder (bridges/layer-03/seed-0) is "DiHAL, layer 3"; decoded without the channel's
    evidence (" (stack-only)") "DiHAL, layer 3, stack-only"; the layer-0 bridge decoded by
    rounding is "rounding, layer 0"; a trained generator's folder is its method (results/mdlm ->
    "MDLM"); a pretrained model sampled left to right is its name with "(AR)".
    """
    found = re.search(r"bridges/layer-(\d+)/seed-(\d+)(?: \((round|stack-only)\))?$", generator)
    if found:
        layer, seed, decode = int(found.group(1)), int(found.group(2)), found.group(3)
        name = f"{'rounding' if decode == 'round' else 'DiHAL'}, layer {layer}"
        name += f", seed {seed}" if seed else ""
        return f"{name}, stack-only" if decode == "stack-only" else name
    if generator.startswith("builtin:"):
        return generator.removeprefix("builtin:").split(" ")[0].replace("smollm2", "SmolLM2") + " (AR)"
    last = generator.rstrip("/").split("/")[-1]
    return ROLES.get(last, last)


def markdown_table(header: list[str], rows: list[list[str]], pad: int = 40) -> list[str]:
    """A markdown table, one line per row, columns padded to their widest cell up to `pad` characters."""
    widths = [min(pad, max(len(str(c)) for c in column)) for column in zip(header, *rows)]
    line = lambda cells: "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    return [line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)]


def p_value(p: float, digits: int = 3) -> str:
    """A p-value to `digits` significant digits, never in scientific notation (0.0000772)."""
    return plain_text(f"{p:.{digits}g}")


def rows_table(rows: list[dict]) -> list[str]:
    """Records (dicts with one set of keys) as a markdown table, every figure in full (`plain`)."""
    def shown(value) -> str:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return EMPTY
        return plain(value) if isinstance(value, float) else str(value)

    header = list(rows[0])
    return markdown_table(header, [[shown(row.get(key)) for key in header] for row in rows])


def read_table(lines: list[str]) -> tuple[list[str], list[list[str]]]:
    """The header and rows of a markdown table's lines."""
    cells = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines]
    return cells[0], cells[2:]


def tidy_table(lines: list[str], names: dict[str, str], relabel: dict[str, callable] | None = None,
               shared_after: int = 3) -> list[str]:
    """One markdown table made readable, with its legend below it.

    Args:
        lines: the table's lines.
        names: by a column's long name, its short name, or (short name, what it means); a
            renamed column is explained in the legend (by its meaning, else its long name).
        relabel: per column, a function rewriting each cell (e.g. `role` for the generator).
        shared_after: a column whose every cell is the same is said once in the legend, when the
            table has more rows than this.

    Returns:
        The new table's lines, then a legend line when there is anything to explain.
    """
    header, rows = read_table(lines)
    keep, shared = [], []
    for i, name in enumerate(header):
        column = [row[i] if i < len(row) else "" for row in rows]
        if rows and all(c in (EMPTY, "") for c in column):
            continue  # always empty here: the column belongs to another kind of run
        if len(rows) > shared_after and len(set(column)) == 1:
            shared.append(f"{short(names, name)} {table_cell(name, column[0], relabel)}")
            continue
        keep.append(i)
    out_rows = [[table_cell(header[i], row[i], relabel) for i in keep] for row in rows]
    out = markdown_table([short(names, header[i]) for i in keep], out_rows)
    legend = [f"`{short(names, header[i])}`: {meaning(names, header[i])}." for i in keep if header[i] in names]
    notes = ([f"Every row: {', '.join(shared)}."] if shared else []) + legend
    return out + ([""] + [" ".join(notes)] if notes else [])


def short(names: dict, column: str) -> str:
    """A column's name in a tidied table."""
    name = names.get(column, column)
    return name[0] if isinstance(name, tuple) else name


def meaning(names: dict, column: str) -> str:
    """What a renamed column holds, for the legend."""
    name = names.get(column, column)
    return name[1] if isinstance(name, tuple) else column


def table_cell(column: str, value: str, relabel: dict[str, callable] | None) -> str:
    """One table cell as a page shows it: relabelled where its column says, figures written plainly."""
    if relabel and column in relabel:
        value = relabel[column](value)
    value = plain_text(value)
    return commas(value) if re.fullmatch(r"[-\d., ()–±\[\]]+", value) else value


def tidy_tables(text: str, names: dict[str, str], relabel: dict[str, callable] | None = None) -> str:
    """Every markdown table of `text` through `tidy_table`; the text around them unchanged."""
    lines, out, block = text.split("\n"), [], []
    for line in lines + [""]:
        if line.startswith("|"):
            block.append(line)
            continue
        if block:
            out += tidy_table(block, names, relabel) if len(block) > 2 else block
            block = []
        out.append(line)
    return "\n".join(out[:-1])


def mean_sd(values) -> tuple[float, float]:
    """The mean and sample sd of the finite values (sd 0 for one value; NaNs for none)."""
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return math.nan, math.nan
    return float(np.mean(values)), float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


def cell(values, digits: int = 3) -> str:
    """A table cell: the values' mean ± sd, or a dash for none."""
    m, sd = mean_sd(values)
    return EMPTY if math.isnan(m) else f"{m:.{digits}f} ± {sd:.{digits}f}"


def disjoint(a, b) -> bool:
    """Whether the seed intervals (mean ± sd) of two lists of values do not overlap."""
    (ma, sa), (mb, sb) = mean_sd(a), mean_sd(b)
    return ma + sa < mb - sb or mb + sb < ma - sa
