"""The figures of one bench/gpu_check.sh step, printed and added to OUT/gpu_check.json as the
step ends (a run cut short keeps what it measured), and the summary at the end.

    python bench/gpu_figures.py OUT STEP --status ok --seconds S --timeout T --memory-from LINE \
        --logs WORK/logs --batch B --seq L
    python bench/gpu_figures.py OUT summary      # every step's status, the goals, the MFU

Reads only small files (the step's JSON output under --logs, OUT/preflight.json, OUT/phases.json,
OUT/gpu_memory.log) and imports neither torch nor geoprobe: it runs in a fraction of a second.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

# docs/scaling.md estimates 25,000 tokens/s at 40% of the bf16 peak; the goal leaves room below it
GOALS = {"forwarded_tokens_per_second": (">=", 20000), "geometry_seconds_per_layer": ("<=", 5.0),
         "dxd_geometry_seconds_per_layer": ("<=", 5.0),
         "agree_within_tolerance": (">=", 1),  # CPU and CUDA agree (a bool)
         # issue 63's goals: roar through the 8B layer-3 bridge at --num 4, the bridge step's share of the GEMM rate
         "roar_num4_tokens_per_second": (">=", 250), "bridge_device_8x128_gemm_fraction": (">=", 0.25),
         "geometry_peak_over_plan": ("<=", 1.0), "dsl_step_peak_over_plan": ("<=", 1.0),  # the plans hold
         "fsdp_peak_over_plan": ("<=", 1.0)}
# Llama-3.1-8B's forward per token with no LM head: 2 x 6.98 G block parameters, plus attention's
# 2 x 2 x 32 layers x 4,096 x 1,024 (a causal 2,048-token block: on average half the positions)
SCAN_FLOP_PER_TOKEN = 2 * 6.98e9 + 4 * 32 * 4096 * 1024
NONDETERMINISM = ("does not have a deterministic implementation",  # PyTorch's warn-only kernels
                  "defaults to a non-deterministic algorithm")  # SDPA's own backward warning
PREFLIGHT = ("gpu", "torch", "transformers", "modules_imported", "host_memory_total_gib",
             "host_memory_available_gib", "work_disk_free_gib", "gemm_tflops", "copy_gb_per_second",
             "eigh_fp64_seconds", "eigvalsh_seconds")


def peak_memory_mib(out: Path, first_line: int) -> int | None:
    """The most GPU memory in use (every process, reserved and context included) in the log lines
    from `first_line` on: this step's window of the nvidia-smi samples."""
    log = out / "gpu_memory.log"
    if not log.is_file():
        return None
    lines = log.read_text().splitlines()[first_line:]
    return max((int(line) for line in lines if line.strip().isdigit()), default=None)


def figures_of(out: Path, logs: Path, step: str, batch: int, seq: int) -> dict:
    read = lambda: json.loads((logs / f"{step}.out").read_text() or "{}")
    if step == "preflight":
        found = json.loads((out / "preflight.json").read_text())
        return {key: found[key] for key in PREFLIGHT if key in found} | {
            "modules_failed": len(found.get("modules_failed", {}))}
    if step == "agree":
        return read()
    if step == "phases":  # bench/gpu_phases.py's headline figures, and each phase's status (the rest: phases.json)
        found = json.loads((out / "phases.json").read_text())
        return {**found["figures"], "phases_status": {name: p["status"] for name, p in found["phases"].items()}}
    if step == "scan":
        timing = read()["timing"]
        warm = timing.get("warm_seconds") and timing["warm_tokens"] / timing["warm_seconds"]
        return {"forwarded_tokens_per_second": warm or timing["tokens_forwarded"] / timing["forward_seconds"],
                "forwarded_tokens_per_second_with_first_batch": timing["tokens_forwarded"] / timing["forward_seconds"],
                "stored_rows_per_second": timing["rows"] / timing["forward_seconds"],
                "tokens_forwarded": timing["tokens_forwarded"], "rows": timing["rows"],
                "geometry_seconds_per_layer": timing["geometry_seconds_per_layer"],
                "scan_warning": (read().get("warning") or "")[:400]}  # the massive channels, by layer
    if step == "scan_dxd":
        timing = read()["timing"]
        return {"dxd_rows": timing["rows"], "dxd_geometry_seconds_per_layer": timing["geometry_seconds_per_layer"]}
    if step == "bridge":
        return {"bridge_tokens_per_second": read()["steps_per_second"] * batch * seq}
    if step == "dsl":
        return {"dsl_steps_per_second": read()["steps_per_second"]}
    if step == "sample":
        return {"sample_tokens_per_second": read()["meta"]["tokens_per_second"]}
    return {}


def verdict(key: str, value, tiny: bool) -> str:
    goal = GOALS.get(key)
    if tiny or goal is None or not isinstance(value, (int, float)):
        return ""
    met = value >= goal[1] if goal[0] == ">=" else value <= goal[1]
    return "  goal met" if met else f"  GOAL MISSED ({goal[0]} {goal[1]:,})"


def shown(value) -> str:
    return f"{value:,.4g}" if isinstance(value, float) else str(value)


def summary(record: dict) -> dict:
    """The figures computed from several steps', printed with every step's status."""
    found = {}
    rate, ceiling = record.get("forwarded_tokens_per_second"), record.get("gemm_tflops")
    if rate and ceiling and not record["tiny"]:  # the tiny model's FLOP count is not the 8B's
        found["scan_mfu_vs_measured_gemm"] = rate * SCAN_FLOP_PER_TOKEN / (ceiling * 1e12)
    print("== summary")
    for step, state in record["steps"].items():
        print(f"{step:12s} {state['status']:36s} {state['seconds']:>5} s")
    for key in ("gpu", "host_memory_available_gib", "host_memory_total_gib", "host_memory_override_gib",
                "gemm_tflops", "forward_determinism_cost", "dsl_step_blocks", *GOALS, *found):
        value = found.get(key, record.get(key))
        if value is not None:
            print(f"{key:40s} {shown(value)}{verdict(key, value, record['tiny'])}")
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("step")
    parser.add_argument("--status", default="ok")
    parser.add_argument("--seconds", type=int, default=0)
    parser.add_argument("--timeout", type=int, default=0)
    parser.add_argument("--memory-from", type=int, default=0)
    parser.add_argument("--logs", type=Path)
    parser.add_argument("--batch", type=int, default=0)
    parser.add_argument("--seq", type=int, default=0)
    args = parser.parse_args()
    path = args.out / "gpu_check.json"
    record = json.loads(path.read_text())
    if args.step == "summary":
        record.update(summary(record))
        path.write_text(json.dumps(record, indent=2))
        return
    state = {"status": args.status, "seconds": args.seconds, "timeout": args.timeout}
    found = {}
    try:  # a step that did not succeed may still have left its figures (the preflight's file)
        found = figures_of(args.out, args.logs, args.step, args.batch, args.seq)
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError) as exc:
        if args.status == "ok":
            state["figures_error"] = f"{type(exc).__name__}: {exc}"[:300]
    # ops without a deterministic CUDA kernel warn (geoprobe.device.deterministic_cuda): reruns of
    # this step may then differ in the last bits
    log = args.logs / f"{args.step}.err" if args.logs else None
    if log is not None and log.is_file():
        text = log.read_text(errors="replace")
        state["nondeterministic_op_warnings"] = sum(text.count(phrase) for phrase in NONDETERMINISM)
    state["peak_gpu_memory_mib"] = peak_memory_mib(args.out, args.memory_from)
    record["steps"][args.step] = state
    record.update(found)
    if args.step == "preflight":
        override = os.environ.get("GEOPROBE_HOST_MEMORY_GIB")
        record["host_memory_override_gib"] = float(override) if override else None
    path.write_text(json.dumps(record, indent=2))
    print(f"{args.step + '_status':40s} {args.status}")
    for key, value in {**found, f"{args.step}_seconds": args.seconds,
                       f"{args.step}_peak_gpu_memory_mib": state["peak_gpu_memory_mib"]}.items():
        print(f"{key:40s} {shown(value)}{verdict(key, value, record['tiny'])}", flush=True)


if __name__ == "__main__":
    main()
