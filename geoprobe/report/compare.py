"""The matched-budget comparison table and the report of a run directory.

A generator's row joins three files that the other commands write: the samples file
(`geoprobe sample`), its metadata row in `samples.meta.jsonl` (sampler, steps, NFE, wall time,
seed, model) and its `SAMPLES.metrics.json` (`geoprobe eval`). The budget of a row is the
training tokens of its model (steps x batch x sequence length, from the checkpoint's
config.json) and its sampling steps; rows with different budgets are refused unless allowed,
and then marked.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from geoprobe.errors import BadInput

COLUMNS = ["generator", "sampler", "steps", "nfe", "seconds", "train_tokens", "gen_ppl", "diversity",
           "unigram_entropy", "mauve", "mauve_std", "oracle_nll_per_word", "budget"]


def training_tokens(model_dir: Path) -> int | None:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        return None
    record = json.loads(path.read_text())
    training = record.get("training", {})
    loop = training.get("train", training)
    seq_len = training.get("seq_len") or record.get("identity", {}).get("seq_len")
    if not all(k in loop for k in ("steps", "batch_size")) or not seq_len:
        return None
    return int(loop["steps"]) * int(loop["batch_size"]) * int(seq_len)


def comparison_row(samples: Path) -> dict:
    samples = Path(samples)
    metrics_path = samples.with_suffix(".metrics.json")
    meta_path = samples.with_name("samples.meta.jsonl")
    if not samples.is_file():
        raise BadInput(f"samples file not found: {samples}")
    if not metrics_path.is_file():
        raise BadInput(f"{samples} has no {metrics_path.name}: run `geoprobe eval {samples}` first")
    metas = [json.loads(l) for l in meta_path.read_text().splitlines() if l.strip()] if meta_path.is_file() else []
    metas = [m for m in metas if Path(m.get("file", "")).name == samples.name]
    if not metas:
        raise BadInput(f"{samples} has no row in {meta_path.name}: it was not written by `geoprobe sample`")
    meta = metas[-1]
    metrics = json.loads(metrics_path.read_text())["results"]
    values = next(iter(metrics.values()))
    model = Path(meta["model"])
    name = f"{model.parent.name}/{model.name}" if model.is_dir() else meta["model"]
    suffix = {"round": " (round)", "causal": " (AR ceiling)"}.get(meta.get("decode"), "")
    return {"generator": name + suffix,
            "sampler": meta["sampler"], "steps": meta.get("steps"), "nfe": meta["nfe"],
            "seconds": meta["seconds"], "train_tokens": training_tokens(model),
            **{k: values.get(k) for k in ("gen_ppl", "diversity", "unigram_entropy", "mauve", "mauve_std",
                                          "oracle_nll_per_word")}}


def compare(samples: list[Path], allow_mismatch: bool = False) -> list[dict]:
    rows = [comparison_row(p) for p in samples]
    budgets = {(r["train_tokens"], r["steps"]) for r in rows if r["train_tokens"] is not None}  # AR: pretrained
    mismatch = len(budgets) > 1
    if mismatch and not allow_mismatch:
        raise BadInput(f"the generators have different budgets (train tokens, steps): {sorted(budgets, key=str)}; "
                       "pass --allow-mismatch to compare them anyway")
    for r in rows:
        r["budget"] = "MISMATCH" if mismatch else "matched"
    return rows


def _fmt(v) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return "inf" if math.isinf(v) else f"{v:.4g}"
    return str(v)


def markdown_table(rows: list[dict], columns=COLUMNS) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_fmt(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def write_comparison(rows: list[dict], out: Path) -> tuple[Path, Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "compare.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows({k: r.get(k) for k in COLUMNS} for r in rows)
    (out / "compare.md").write_text("# Matched-budget comparison\n\n" + markdown_table(rows) + "\n")
    return out / "compare.csv", compare_plot(rows, out / "plots" / "compare.png")


def compare_plot(rows: list[dict], path: Path) -> Path:
    from geoprobe.report.plots import plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for r in rows:
        label = f"{r['generator']} · {r['sampler']}"
        left.scatter(r["nfe"], r["gen_ppl"], label=label)
        if r.get("mauve") is not None:
            right.scatter(r["nfe"], r["mauve"], label=label)
    left.set_xlabel("denoiser evaluations (NFE)")
    left.set_ylabel("Gen.PPL under the evaluator (lower is better)")
    left.set_yscale("log")
    right.set_xlabel("denoiser evaluations (NFE)")
    right.set_ylabel("MAUVE vs. references (higher is better)")
    for ax, title in ((left, "Gen.PPL against sampling budget"), (right, "MAUVE against sampling budget")):
        ax.set_title(title)
        ax.grid(alpha=0.3)
    right.legend(fontsize=7, loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(run: Path) -> Path:
    """report.md of a run directory: everything the other commands wrote, with its settings."""
    from geoprobe.store import read_manifest

    run = Path(run)
    manifest = read_manifest(run)
    parts = [f"# geoprobe report: {manifest['model']['spec']}", "",
             f"- corpus: `{manifest['config']['corpus']}`, {manifest.get('rows')} states per layer, "
             f"layers {manifest['layers'][0]}..{manifest['layers'][-1]}, seq_len {manifest['config']['seq_len']}, "
             f"seed {manifest['config']['seed']}",
             f"- model: {manifest['model'].get('architecture')}, config sha256 "
             f"`{manifest['model']['config_sha256'][:16]}…`, dtype {manifest['model'].get('dtype')}", ""]
    if (run / "ranking.md").is_file():
        geometry = json.loads((run / "geometry.json").read_text())
        parts += ["## Geometry and ranking", "", f"Settings: `{json.dumps(geometry['settings'])}`", "",
                  (run / "ranking.md").read_text().split("\n", 2)[2], "", "![geometry](plots/geometry.png)", ""]
    if (run / "sweep.json").is_file():
        sweep = json.loads((run / "sweep.json").read_text())
        c = sweep["correlations"]
        parts += ["## Bridge sweep", "", markdown_table(sweep["rows"], ["layer", "score", "rank", "nmse", "delta_ce",
                                                                       "nmse_noisy"]), ""]
        for loss in ("nmse", "delta_ce", "nmse_noisy"):
            parts.append(f"- Spearman(score, {loss}) = {c[loss]['rho']:.3f}, permutation p = {c[loss]['p']:.3g}, "
                         f"95% CI [{c[loss]['ci'][0]:.3f}, {c[loss]['ci'][1]:.3f}], n = {c[loss]['n']}")
        parts += [f"- geometry-chosen layer {c['chosen_layer']}, oracle layer {c['oracle_layer']}, "
                  f"worst layer {c['worst_layer']}", "", "![sweep](plots/sweep.png)", ""]
    if (run / "compare.md").is_file():
        parts += ["## Generation", "", (run / "compare.md").read_text().split("\n", 2)[2], "",
                  "![compare](plots/compare.png)", ""]
    path = run / "report.md"
    path.write_text("\n".join(parts) + "\n")
    return path
