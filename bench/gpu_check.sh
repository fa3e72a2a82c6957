#!/usr/bin/env bash
# The GPU figures of geoprobe on one H200, in one run estimated at 8-10 minutes (not yet
# measured), on the paths a user's run takes:
#   fixture   a random-weight Llama-3.1-8B-Instruct built on the machine (no network there), with
#             its real vocabulary size (128,256) and one massive channel (the second geometry
#             pass runs, as on a real model);
#   scan      >= 200k forwarded tokens (bfloat16, all 33 layers): forward rate after the first
#             batch, geometry on the Gram path (3,200 rows < d = 4,096);
#   scan_dxd  5 blocks at every position (~10k rows >= 2d) at three layers: the d x d path of a
#             real N = 200k scan;
#   bridge    `geoprobe bridge --layer 3`, 200 steps;
#   dsl       `geoprobe dsl train` at V = 128,256, 200 steps, then its likelihoods;
#   dsl_init  `geoprobe dsl train --init-from` the 8B fixture with --precision bfloat16 (bfloat16
#             weights, gradients and EMA, float32 AdamW moments: ~128 GB), 20 steps of 8 x 128,
#             no resumable checkpoint (112 GB); the memory plan beside CUDA's measured peak;
#   sample    `geoprobe sample --sampler roar` through the bridge (before dsl_init, which is last).
# Each step's figures are printed and added to $OUT/gpu_check.json as the step ends, so a run
# cut short still leaves the figures of the steps it finished. A failing step stops the script
# with that step's exit status and the tail of its log.
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
# the 16 GB fixture lives outside $OUT (which is copied back from the GPU machine); a folder of
# one's own keeps it between runs: GPU_CHECK_HF=/data/hf
HF_HOME=${GPU_CHECK_HF:-$(mktemp -d)}
WORK=$(mktemp -d)  # the 8B DSL's weights (16 GB) stay out of $OUT too
export HF_HOME HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
MODEL=meta-llama/Llama-3.1-8B-Instruct
GP=("$PY" -m geoprobe --format json)

if [[ $TINY == 1 ]]; then
  DEVICE=cpu DTYPE=float32 SEQ=64 POSITIONS=random:16 TOKENS=1600 ANCHORS=256 STEPS=20 BATCH=4 BSEQ=32 INIT_STEPS=4
  DXD_SEQ=64 DXD_TOKENS=320 DXD_LAYERS=1,3
  CORPUS="synthetic:hmm?docs=200&length=120&seed=1" FIXTURE=(--tiny)
else
  # the first 2,048-token block of 100 documents (~2,270 tokens each) = 204,800 forwarded tokens;
  # 32 random positions of each stored: 3,200 rows x 33 layers
  DEVICE=cuda DTYPE=bfloat16 SEQ=2048 POSITIONS=random:32 TOKENS=3200 ANCHORS=2048 STEPS=200 BATCH=8 BSEQ=128
  INIT_STEPS=20
  DXD_SEQ=2048 DXD_TOKENS=10000 DXD_LAYERS=1,16,31
  CORPUS="synthetic:hmm?docs=110&length=1000&seed=1" FIXTURE=()
fi
echo "{\"tiny\": $([[ $TINY == 1 ]] && echo true || echo false)}" > "$OUT/gpu_check.json"

step() {  # step NAME COMMAND...: run it, keep its JSON and log, time it, report its figures
  local name=$1; shift
  local began=$SECONDS status=0
  echo "== $name" >&2
  "$@" > "$OUT/$name.json" 2> "$OUT/$name.err" || status=$?
  if [[ $status != 0 ]]; then
    echo "FAILED: $name (exit $status):" >&2; tail -20 "$OUT/$name.err" >&2; exit $status
  fi
  # a figure that cannot be read must not stop the steps after it
  "$PY" bench/gpu_figures.py "$OUT" "$name" $((SECONDS - began)) $BATCH $BSEQ \
    || echo "figures of $name unavailable (exit $?)" >&2
}

if command -v nvidia-smi >/dev/null && [[ $TINY == 0 ]]; then  # peak memory of every process on the GPU
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 250 > "$OUT/gpu_memory.log" &
  SAMPLER=$!
  trap 'kill $SAMPLER 2>/dev/null || true' EXIT
fi
trap 'kill ${SAMPLER:-} 2>/dev/null || true; rm -rf "$WORK"; [[ -n "${GPU_CHECK_HF:-}" ]] || rm -rf "$HF_HOME"' EXIT

step fixture "$PY" -m geoprobe.fixtures "$MODEL" --hf-home "$HF_HOME" "${FIXTURE[@]}"
step scan "${GP[@]}" scan "$MODEL" --corpus "$CORPUS" --tokens $TOKENS --seq-len $SEQ --positions $POSITIONS \
  --doc-blocks 1 --anchors $ANCHORS --device $DEVICE --dtype $DTYPE --batch-size 8 --out "$OUT/run"
step scan_dxd "${GP[@]}" scan "$MODEL" --corpus "$CORPUS" --tokens $DXD_TOKENS --seq-len $DXD_SEQ --positions all \
  --doc-blocks 1 --layers $DXD_LAYERS --anchors $ANCHORS --device $DEVICE --dtype $DTYPE --batch-size 2 \
  --out "$OUT/run_dxd"
step bridge "${GP[@]}" bridge --run "$OUT/run" --layer 3 --steps $STEPS --until steps --batch-size $BATCH \
  --seq-len $BSEQ --device $DEVICE --dtype $DTYPE
step dsl "${GP[@]}" dsl train --corpus "$CORPUS" --tokenizer "$MODEL" --steps $STEPS --batch-size 16 \
  --seq-len $BSEQ --warmup 10 --out "$OUT/dsl" --device $DEVICE
step sample "${GP[@]}" sample --model "$OUT/run/bridges/layer-03/seed-0" --sampler roar --num 4 --length $BSEQ \
  --out "$OUT/samples" --device $DEVICE
# last: the heaviest step, so that a run cut short has every other figure
step dsl_init "${GP[@]}" dsl train --corpus "$CORPUS" --init-from "$MODEL" --precision bfloat16 --steps $INIT_STEPS \
  --batch-size $BATCH --seq-len $BSEQ --warmup 2 --save-every 0 --out "$WORK/dsl_init" --device $DEVICE
"$PY" bench/gpu_figures.py "$OUT" summary 0 $BATCH $BSEQ || echo "summary unavailable (exit $?)" >&2
