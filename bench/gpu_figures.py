"""The figures of one bench/gpu_check.sh step, printed and added to OUT/gpu_check.json as the
step ends (a run cut short keeps what it measured).

    python bench/gpu_figures.py OUT STEP SECONDS BATCH SEQ      # STEP "summary": the goals
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

GOALS = {"forwarded_tokens_per_second": (">=", 20000), "geometry_seconds_per_layer": ("<=", 5.0),
         "dxd_geometry_seconds_per_layer": ("<=", 5.0)}


def peak_memory_mib(out: Path) -> int | None:
    """The most GPU memory in use so far (nvidia-smi sampled every 250 ms by the script)."""
    log = out / "gpu_memory.log"
    if not log.is_file():
        return None
    return max((int(line) for line in log.read_text().split() if line.strip().isdigit()), default=None)


def figures_of(out: Path, step: str, batch: int, seq: int) -> dict:
    read = lambda: json.loads((out / f"{step}.json").read_text() or "{}")
    if step == "scan":
        timing = read()["timing"]
        warm = timing.get("warm_seconds") and timing["warm_tokens"] / timing["warm_seconds"]
        return {"forwarded_tokens_per_second": warm or timing["tokens_forwarded"] / timing["forward_seconds"],
                "forwarded_tokens_per_second_with_first_batch": timing["tokens_forwarded"] / timing["forward_seconds"],
                "stored_rows_per_second": timing["rows"] / timing["forward_seconds"],
                "tokens_forwarded": timing["tokens_forwarded"], "rows": timing["rows"],
                "geometry_seconds_per_layer": timing["geometry_seconds_per_layer"]}
    if step == "scan_dxd":
        timing = read()["timing"]
        return {"dxd_rows": timing["rows"], "dxd_geometry_seconds_per_layer": timing["geometry_seconds_per_layer"]}
    if step == "bridge":
        return {"bridge_tokens_per_second": read()["steps_per_second"] * batch * seq}
    if step == "dsl":
        return {"dsl_steps_per_second": read()["steps_per_second"]}
    if step == "dsl_init":
        metrics = read()
        peak = metrics.get("device_bytes_peak")
        return {"dsl_init_steps_per_second": metrics["steps_per_second"],
                "dsl_init_tokens_per_second": metrics["steps_per_second"] * batch * seq,
                "dsl_init_planned_gib": metrics["device_bytes_planned"] / 2 ** 30,
                "dsl_init_peak_gib": peak / 2 ** 30 if peak else None,
                "dsl_init_peak_over_plan": peak / metrics["device_bytes_planned"] if peak else None}
    if step == "sample":
        return {"sample_tokens_per_second": read()["meta"]["tokens_per_second"]}
    return {}


def verdict(key: str, value, tiny: bool) -> str:
    goal = GOALS.get(key)
    if tiny or goal is None or not isinstance(value, (int, float)):
        return ""
    met = value >= goal[1] if goal[0] == ">=" else value <= goal[1]
    return "  goal met" if met else f"  GOAL MISSED ({goal[0]} {goal[1]})"


def main() -> None:
    out, step, seconds, batch, seq = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    path = out / "gpu_check.json"
    record = json.loads(path.read_text())
    if step == "summary":
        for key, value in record.items():
            if key in GOALS:
                print(f"{key:40s} {value:,.2f}{verdict(key, value, record['tiny'])}")
        return
    found = figures_of(out, step, batch, seq)
    found[f"{step}_seconds"] = seconds
    # ops without a deterministic CUDA kernel warn (geoprobe.device.deterministic_cuda): reruns of
    # this step may then differ in the last bits
    log = out / f"{step}.err"
    found[f"{step}_nondeterministic_op_warnings"] = log.read_text(errors="replace").count(
        "does not have a deterministic implementation") if log.is_file() else None
    found["peak_gpu_memory_mib"] = peak_memory_mib(out)
    record.update(found)
    path.write_text(json.dumps(record, indent=2))
    for key, value in found.items():
        shown = f"{value:,.2f}" if isinstance(value, float) else value
        print(f"{key:40s} {shown}{verdict(key, value, record['tiny'])}", flush=True)


if __name__ == "__main__":
    main()
