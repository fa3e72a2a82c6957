#!/usr/bin/env bash
# The GPU figures of geoprobe on one H200, in one run of under 8 minutes:
#   a random-weight Llama-3.1-8B-Instruct fixture built on the machine (no network there),
#   `geoprobe scan` over >= 200k forwarded tokens (bfloat16, all 33 layers, geometry on the GPU),
#   `geoprobe bridge --layer 3` for 200 steps, `geoprobe dsl train` for 200 steps, and
#   `geoprobe sample --sampler roar` through that bridge;
# then one table: forwarded tokens/s, stored rows/s, geometry seconds per layer, bridge tokens/s,
# DSL steps/s, sampling tokens/s, peak GPU memory, against the goals (>= 20,000 forwarded
# tokens/s, <= 5 s of geometry per layer). Any failing step stops the script (exit != 0).
#
#   bash bench/gpu_check.sh            # on the GPU machine; figures in $OUT/gpu_check.json
#   bash bench/gpu_check.sh --tiny     # the same steps on a CPU, every size shrunk (make test runs it)
set -euo pipefail

TINY=0
[[ "${1:-}" == "--tiny" ]] && TINY=1
cd "$(dirname "$0")/.."
PY=${PY:-$([[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3)}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
export HF_HOME="$OUT/hf" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
MODEL=meta-llama/Llama-3.1-8B-Instruct
GP=("$PY" -m geoprobe --format json)

if [[ $TINY == 1 ]]; then
  DEVICE=cpu DTYPE=float32 SEQ=64 POSITIONS=random:16 TOKENS=1600 ANCHORS=256 STEPS=20 BATCH=4 BSEQ=32
  CORPUS="synthetic:hmm?docs=200&length=120&seed=1" FIXTURE=(--tiny)
else
  # the first 2,048-token block of 100 documents (~2,270 tokens each) = 204,800 forwarded tokens;
  # 32 random positions of each stored: 3,200 rows x 33 layers
  DEVICE=cuda DTYPE=bfloat16 SEQ=2048 POSITIONS=random:32 TOKENS=3200 ANCHORS=2048 STEPS=200 BATCH=8 BSEQ=128
  CORPUS="synthetic:hmm?docs=110&length=1000&seed=1" FIXTURE=()
fi

step() {  # step NAME COMMAND...: run it, keep its JSON, time it, stop loudly on failure
  local name=$1; shift
  local began=$SECONDS
  echo "== $name" >&2
  if ! "$@" > "$OUT/$name.json" 2> "$OUT/$name.err"; then
    echo "FAILED: $name (exit $?):" >&2; tail -20 "$OUT/$name.err" >&2; exit 1
  fi
  echo "$((SECONDS - began))" > "$OUT/$name.seconds"
}

if command -v nvidia-smi >/dev/null && [[ $TINY == 0 ]]; then  # peak memory of every process on the GPU
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 250 > "$OUT/gpu_memory.log" &
  SAMPLER=$!
  trap 'kill $SAMPLER 2>/dev/null || true' EXIT
fi

step fixture "$PY" -m geoprobe.fixtures "$MODEL" --hf-home "$HF_HOME" "${FIXTURE[@]}"
step scan "${GP[@]}" scan "$MODEL" --corpus "$CORPUS" --tokens $TOKENS --seq-len $SEQ --positions $POSITIONS \
  --doc-blocks 1 --anchors $ANCHORS --device $DEVICE --dtype $DTYPE --batch-size 8 --out "$OUT/run"
step bridge "${GP[@]}" bridge --run "$OUT/run" --layer 3 --steps $STEPS --until steps --batch-size $BATCH \
  --seq-len $BSEQ --device $DEVICE --dtype $DTYPE
step dsl "${GP[@]}" dsl train --corpus "$CORPUS" --tokenizer "$MODEL" --steps $STEPS --batch-size 16 \
  --seq-len $BSEQ --warmup 10 --out "$OUT/dsl" --device $DEVICE
step sample "${GP[@]}" sample --model "$OUT/run/bridges/layer-03/seed-0" --sampler roar --num 4 --length $BSEQ \
  --out "$OUT/samples" --device $DEVICE

"$PY" - "$OUT" $TINY $BATCH $BSEQ <<'EOF'
import json, sys
from pathlib import Path

out, tiny, batch, seq = Path(sys.argv[1]), sys.argv[2] == "1", int(sys.argv[3]), int(sys.argv[4])
read = lambda name: json.loads((out / f"{name}.json").read_text())
timing, bridge, dsl, sample = read("scan")["timing"], read("bridge"), read("dsl"), read("sample")["meta"]
memory = out / "gpu_memory.log"
peak = max((int(l) for l in memory.read_text().split() if l.strip().isdigit()), default=None) if memory.exists() else None
figures = {
    "forwarded_tokens_per_second": timing["tokens_forwarded"] / timing["forward_seconds"],
    "stored_rows_per_second": timing["rows"] / timing["forward_seconds"],
    "tokens_forwarded": timing["tokens_forwarded"],
    "geometry_seconds_per_layer": timing["geometry_seconds_per_layer"],
    "bridge_tokens_per_second": bridge["steps_per_second"] * batch * seq,
    "dsl_steps_per_second": dsl["steps_per_second"],
    "sample_tokens_per_second": sample["tokens_per_second"],
    "peak_gpu_memory_mib": peak,
    "seconds": {n: int((out / f"{n}.seconds").read_text()) for n in ("fixture", "scan", "bridge", "dsl", "sample")},
}
goals = {"forwarded_tokens_per_second": (">=", 20000), "geometry_seconds_per_layer": ("<=", 5.0)}
(out / "gpu_check.json").write_text(json.dumps({"tiny": tiny, **figures}, indent=2))
for key, value in figures.items():
    goal = goals.get(key)
    verdict = "" if tiny or goal is None else (
        "  goal met" if (value >= goal[1] if goal[0] == ">=" else value <= goal[1]) else f"  GOAL MISSED ({goal[0]} {goal[1]})")
    print(f"{key:30s} {value if not isinstance(value, float) else round(value, 2)}{verdict}")
EOF
