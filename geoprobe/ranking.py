"""Layer selection: s_l = a z(curv) + b z(mono) - c z(erank), z-scores across the scanned layers.

High curvature and monotonicity proxies mean a well-conditioned, locally flat score field;
a low effective rank means the variation sits on few directions: both make a layer an easy
place for diffusion to enter. With `log`, the z-scores are of the logarithms (the proxies
span orders of magnitude across depth). The same formula is applied to every bootstrap
replicate (z-scores within the replicate), which gives the score's interval and the rank
stability: the fraction of replicates in which each layer ranks first.
"""

from __future__ import annotations

import numpy as np

from geoprobe.errors import BadInput

PROXIES = ("curv", "mono", "erank")
SIGNS = (1.0, 1.0, -1.0)


WEIGHTS = "1,1,1"  # --weights: the proxies count equally unless told otherwise (the registered score's weights)


def parse_weights(spec: str | None) -> tuple[float, float, float]:
    if not spec:
        return (1.0, 1.0, 1.0)
    try:
        weights = tuple(float(w) for w in spec.split(","))
    except ValueError:
        raise BadInput(f"malformed --weights {spec!r}: three numbers a,b,c") from None
    if len(weights) != 3 or not all(np.isfinite(weights)):
        raise BadInput(f"malformed --weights {spec!r}: three numbers a,b,c")
    return weights


def zscore(values: np.ndarray) -> np.ndarray:
    """z-scores along the last axis (layers); a constant row scores 0."""
    mean = values.mean(axis=-1, keepdims=True)
    std = values.std(axis=-1, keepdims=True)
    return np.divide(values - mean, std, out=np.zeros_like(values), where=std > 0)


def selection_score(proxies: dict[str, np.ndarray], weights=(1.0, 1.0, 1.0), log: bool = False) -> np.ndarray:
    """Score per layer (last axis); leading axes (bootstrap replicates) are kept."""
    total = 0.0
    for name, sign, weight in zip(PROXIES, SIGNS, weights):
        values = np.asarray(proxies[name], dtype=np.float64)
        if log:
            values = np.log(values)
        total = total + sign * weight * zscore(values)
    return total


def rank_layers(geometry: dict, weights=(1.0, 1.0, 1.0), log: bool = False, other_channels: bool = False,
                blocks: int | None = None) -> dict:
    """The ranking table of a geometry result (normalisation as recorded in its settings).
    `other_channels`: rank on the proxies computed with the opposite choice about massive
    channels (excluded if the geometry kept them, kept if it excluded them); layers without
    massive channels are the same either way. `blocks`, the model's number of blocks, marks the
    layers that can host a bridge (`bridgeable`: a block above them); the chosen layer is the
    best-ranked of those, and `passed_over` the better-ranked layers that cannot (None: every
    layer can)."""
    norm = geometry["settings"]["normalize"]
    drop = bool(geometry["settings"].get("drop_massive_channels", False)) != other_channels
    layers = [{**l, **l.get("other_channels", {})} if other_channels else l for l in geometry["layers"]]
    if len(layers) < 2:
        raise BadInput("ranking needs at least two layers")
    points = {p: np.array([l[norm][p]["value"] for l in layers]) for p in PROXIES}
    score = selection_score(points, weights, log)
    has_reps = all("replicates" in l for l in layers)
    if has_reps:
        reps = {p: np.array([l["replicates"][p] for l in layers]).T for p in PROXIES}  # (B, L)
        if norm == "trace":
            scale = np.array([l["replicates"]["scale"] for l in layers]).T
            reps["curv"], reps["mono"] = reps["curv"] * scale, reps["mono"] * scale
        rep_scores = selection_score(reps, weights, log)
        first = np.bincount(rep_scores.argmax(axis=1), minlength=len(layers)) / len(rep_scores)
        score_ci = np.percentile(rep_scores, [2.5, 97.5], axis=0).T
    else:
        first = np.full(len(layers), np.nan)
        score_ci = np.full((len(layers), 2), np.nan)
    first_reseed = _first_over_reseeds(layers, norm, weights, log)
    order = np.argsort(-score, kind="stable")
    rank = np.empty(len(layers), dtype=int)
    rank[order] = np.arange(1, len(layers) + 1)
    rows = []
    for idx, layer in enumerate(layers):
        row = {"layer": layer["layer"]}
        for p in PROXIES:
            row[p] = layer[norm][p]["value"]
            row[f"{p}_lo"], row[f"{p}_hi"] = layer[norm][p]["ci"]
        row.update(score=float(score[idx]), score_lo=float(score_ci[idx, 0]), score_hi=float(score_ci[idx, 1]),
                   rank=int(rank[idx]), p_first=float(first[idx]), p_first_reseed=float(first_reseed[idx]),
                   participation_ratio=layer["participation_ratio"], entropy_rank=layer["entropy_rank"],
                   duplicate_fraction=layer["duplicate_fraction"], massive=layer["massive"],
                   massive_channels=len(layer.get("massive_channels", [])),
                   channel_share=layer.get("massive_channel_share", 0.0),
                   bridgeable=blocks is None or layer["layer"] < blocks)
        rows.append(row)
    best, passed_over = bridge_choice(rows)
    return {"normalize": norm, "weights": list(weights), "log": log, "chosen_layer": best["layer"],
            "passed_over": passed_over,
            "chosen_p_first": best["p_first"], "chosen_p_first_reseed": best["p_first_reseed"],
            "reseeds": len(layers[0].get("reseeds", {}).get("curv", [])) + 1 if has_reseeds(layers) else 0,
            "drop_massive_channels": drop, "rows": rows}


def bridge_choice(rows: list[dict]) -> tuple[dict, list[int]]:
    """(the best-ranked row that can host a bridge, the better-ranked layers that cannot): a
    bridge at layer l needs block l + 1 above it, so the last block's output never hosts one."""
    ranked = sorted(rows, key=lambda r: r["rank"])
    usable = [r for r in ranked if r.get("bridgeable", True)]
    if not usable:
        raise BadInput("no ranked layer has a block above it to host a bridge")
    return usable[0], [r["layer"] for r in ranked[:ranked.index(usable[0])]]


def passed_over_line(ranking: dict) -> str | None:
    """Why the chosen layer is not the first-ranked one, in one line (None when it is)."""
    skipped = ranking.get("passed_over") or []
    if not skipped:
        return None
    return (f"layer {', '.join(map(str, skipped))} ranks higher but is the last block's output, and a bridge needs a "
            f"block above its layer: the chosen layer is {ranking['chosen_layer']}, the best-ranked that can host one")


def layer_scores(geometry: dict, layers: list[int], weights=(1.0, 1.0, 1.0), log: bool = False,
                 normalize: str | None = None, other_channels: bool = False) -> dict[int, float]:
    """The selection score of `layers`, z-scored over those layers only (the ranking z-scores over
    every scanned layer, so a layer that is never compared moves the others' scores there).
    `normalize` overrides the geometry's normalisation; `other_channels` as in rank_layers."""
    norm = normalize or geometry["settings"]["normalize"]
    by_layer = {l["layer"]: ({**l, **l.get("other_channels", {})} if other_channels else l)
                for l in geometry["layers"]}
    missing = [l for l in layers if l not in by_layer]
    if missing:
        raise BadInput(f"layers {missing} were not scanned: no geometry score for them")
    points = {p: np.array([by_layer[l][norm][p]["value"] for l in layers]) for p in PROXIES}
    return dict(zip(layers, selection_score(points, weights, log).tolist()))


def has_reseeds(layers: list[dict]) -> bool:
    return all(l.get("reseeds", {}).get("curv") for l in layers)


def _first_over_reseeds(layers: list[dict], norm: str, weights, log: bool) -> np.ndarray:
    """How often each layer ranks first when only the estimator's own randomness changes: the
    point estimate and every redraw of anchors and pairs (same states, erank is deterministic)."""
    if not has_reseeds(layers):
        return np.full(len(layers), np.nan)
    scale = np.array([l["scale"] if norm == "trace" else 1.0 for l in layers])
    draws = {p: np.array([[l[norm][p]["value"]] + [v * s for v in l["reseeds"][p]] for l, s in zip(layers, scale)]).T
             for p in ("curv", "mono")}  # (R + 1, L)
    draws["erank"] = np.broadcast_to([l[norm]["erank"]["value"] for l in layers], draws["curv"].shape)
    scores = selection_score(draws, weights, log)
    return np.bincount(scores.argmax(axis=1), minlength=len(layers)) / len(scores)


def has_massive_channels(geometry: dict) -> bool:
    return any(l.get("massive_channels") for l in geometry["layers"])
