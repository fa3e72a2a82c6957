#!/usr/bin/env bash
# The GPU figures of geoprobe on one lent H200 or H100 (at most 10 minutes a command, a few small
# files back from $OUT), on the paths a user's run takes. Steps, in order of value (seconds measured
# on one H200 on 2026-12-04, the phases estimated; each has its own timeout, and a global deadline,
# 540 s by default, skips what is left; about 510 s in all by these figures):
#   preflight  import check of every module the steps use, versions, GPU, free host memory and
#              disk, measured ceilings (bf16 GEMM, copy, fp64 eigh, batched eigvalsh)      11 s
#   fixture    a random-weight Llama-3.1-8B-Instruct built on the machine (no network there),
#              real vocabulary size (128,256), a massive channel through every block        58 s
#   phases     bench/gpu_phases.py: the backbone loaded once, then forward with determinism on
#              and off, roar through a default bridge at --num 4/16/64 (bridge, blocks, head,
#              host), bridge steps from the host and the device pool at 8 x 128 and 64 x 512,
#              the 8B DSL step split (forward, backward, clipping, optimiser, EMA; 12 blocks
#              where 32 do not fit: an H100), FSDP on one GPU, one layer's geometry at N = 200k
#              by phase with both massive-channel choices; each phase under its own deadline
#              (its timeout 170 s, so that bridge and sample still fit the deadline)  ~140 s (estimated)
#   scan       204,800 forwarded tokens (bfloat16, all 33 layers): forward rate after the first
#              batch, geometry on the Gram path (3,200 rows < d = 4,096)                   36 s
#   agree      a tiny case on the CPU and on CUDA with the same flags (states, proxies, ranking,
#              a DSL's loss curve), and CUDA's geometry.json against a rerun's, byte for byte  83 s
#   scan_dxd   5 blocks at every position (~10k rows >= 2d) at three layers: the d x d path 21 s
#   dsl        `geoprobe dsl train` at V = 128,256, 200 steps, then its likelihoods         23 s
#   bridge     `geoprobe bridge --layer 3`, 200 steps                                     115 s
#   sample     `geoprobe sample --sampler roar` through the bridge                         22 s
# A step that fails, is killed or times out is recorded and the run goes on (a step whose input
# step did not succeed is skipped). Each step's figures are printed and added to
# $OUT/gpu_check.json as it ends; the summary (every step's status, the goals) is printed and
# written even when the deadline cut the run short.
#
# $OUT holds only small files: gpu_check.json (figures and statuses), preflight.json, phases.json
# (every phase's figures), gpu_memory.log (CUDA: nvidia-smi every 250 ms), errors.txt (the log
# tails of the steps that did not succeed). Everything large (the 16 GB fixture, runs, checkpoints, full logs) lives under
# $GPU_CHECK_WORK (a temporary folder on local disk, removed at the end unless given).
#
#   bash bench/gpu_check.sh            # on the GPU machine
#   bash bench/gpu_check.sh --tiny     # the same steps on a CPU, every size shrunk (make test runs it)
#
# Settings (environment): GPU_CHECK_DEADLINE (seconds, 540), GPU_CHECK_TIMEOUT_<step> (seconds),
# GPU_CHECK_WORK (kept), GPU_CHECK_HF (a fixture cache of one's own, kept between runs),
# GEOPROBE_HOST_MEMORY_GIB (overrides the host-RAM figure the memory guards read). Fault
# injection for tests: GPU_CHECK_KILL=<step> SIGKILLs that step GPU_CHECK_KILL_AFTER (1) seconds
# after it starts, as the OOM killer would.
set -uo pipefail  # no -e: a step's failure is recorded, not fatal

TINY=0
[[ "${1:-}" == "--tiny" ]] && TINY=1
cd "$(dirname "$0")/.."
PY=${PY:-$([[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3)}
OUT=${OUT:-$(mktemp -d)}
WORK=${GPU_CHECK_WORK:-}
KEEP_WORK=$([[ -n $WORK ]] && echo 1 || echo 0)
WORK=${WORK:-$(mktemp -d)}
mkdir -p "$OUT" "$WORK/logs"
HF_HOME=${GPU_CHECK_HF:-$WORK/hf}
DEADLINE=${GPU_CHECK_DEADLINE:-540}
KILL=${GPU_CHECK_KILL:-}
export HF_HOME HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
MODEL=meta-llama/Llama-3.1-8B-Instruct
GP=("$PY" -m geoprobe --format json)

if [[ $TINY == 1 ]]; then
  DEVICE=cpu DTYPE=float32 SEQ=64 POSITIONS=random:16 TOKENS=1600 ANCHORS=256 STEPS=20 BATCH=4 BSEQ=32
  DXD_SEQ=64 DXD_TOKENS=320 DXD_LAYERS=1,3
  CORPUS="synthetic:hmm?docs=200&length=120&seed=1" FIXTURE=(--tiny) PREFLIGHT=(--tiny)
  LIMIT=300  # every step's timeout on a shared CPU
else
  # the first 2,048-token block of 100 documents (~2,270 tokens each) = 204,800 forwarded tokens;
  # 32 random positions of each stored: 3,200 rows x 33 layers
  DEVICE=cuda DTYPE=bfloat16 SEQ=2048 POSITIONS=random:32 TOKENS=3200 ANCHORS=2048 STEPS=200 BATCH=8 BSEQ=128
  DXD_SEQ=2048 DXD_TOKENS=10000 DXD_LAYERS=1,16,31
  CORPUS="synthetic:hmm?docs=110&length=1000&seed=1" FIXTURE=() PREFLIGHT=()
  LIMIT=
  # psutil's available RAM starts small and grows on some of these VMs: the host guards (loading
  # the 8B, the teacher states' room) read this instead, 80% of the host's total
  total_kib=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo 2>/dev/null || echo 0)
  export GEOPROBE_HOST_MEMORY_GIB=${GEOPROBE_HOST_MEMORY_GIB:-$((total_kib * 8 / 10 / 1048576))}
fi
echo "{\"tiny\": $([[ $TINY == 1 ]] && echo true || echo false), \"deadline_seconds\": $DEADLINE, \"steps\": {}}" \
  > "$OUT/gpu_check.json"
SUCCEEDED=" "  # the steps that succeeded, for the steps that need their output

memory_lines() { [[ -f $OUT/gpu_memory.log ]] && wc -l < "$OUT/gpu_memory.log" || echo 0; }

record() {  # record NAME OUTCOME SECONDS LIMIT MEMORY_FROM: the figures and status into gpu_check.json
  "$PY" bench/gpu_figures.py "$OUT" "$1" --status "$2" --seconds "$3" --timeout "$4" --memory-from "$5" \
    --logs "$WORK/logs" --batch "$BATCH" --seq "$BSEQ" || echo "figures of $1 unavailable (exit $?)" >&2
}

step() {  # step NAME TIMEOUT NEEDS COMMAND...: run it under its timeout and the deadline, record it
  local name=$1 limit=${LIMIT:-$2} needs=$3; shift 3
  local override="GPU_CHECK_TIMEOUT_$name" need cut="" outcome status began from
  limit=${!override:-$limit}
  local left=$((DEADLINE - SECONDS))
  if ((left <= 0)); then
    echo "== $name skipped: deadline" >&2; record "$name" "skipped (deadline)" 0 "$limit" 0; return
  fi
  for need in ${needs//,/ }; do
    if [[ $SUCCEEDED != *" $need "* ]]; then
      echo "== $name skipped: needs $need" >&2; record "$name" "skipped (needs $need)" 0 "$limit" 0; return
    fi
  done
  ((left < limit)) && { limit=$left; cut=" (deadline)"; }
  echo "== $name (timeout ${limit} s)" >&2
  began=$SECONDS from=$(memory_lines)
  # --kill-after: a step that ignores SIGTERM is killed 10 s later; GPU_CHECK_LIMIT: its own deadline
  GPU_CHECK_STEP=$name GPU_CHECK_LIMIT=$limit timeout --kill-after=10 "$limit" "$@" \
    > "$WORK/logs/$name.out" 2> "$WORK/logs/$name.err" < /dev/null &
  STEP_PID=$!
  if [[ $name == "$KILL" ]]; then  # fault injection: the step's process dies as under the OOM killer
    sleep "${GPU_CHECK_KILL_AFTER:-1}"
    pkill -KILL -P "$STEP_PID"
  fi
  wait "$STEP_PID"
  status=$?
  STEP_PID=
  local seconds=$((SECONDS - began))
  if ((status == 0)); then outcome=ok; SUCCEEDED+="$name "
  elif ((status == 124 || (status == 137 && seconds >= limit))); then outcome="timed out after ${limit} s$cut"
  elif ((status > 128)); then outcome="killed (signal $((status - 128)))"
  else outcome="failed (exit $status)"; fi
  if [[ $outcome != ok ]]; then
    echo "$name: $outcome" >&2
    { echo "== $name: $outcome"; tail -30 "$WORK/logs/$name.err"; } | tee -a "$OUT/errors.txt" >&2
  fi
  record "$name" "$outcome" "$seconds" "$limit" "$from"
}

finish() {
  trap - EXIT INT TERM
  [[ -n ${SAMPLER:-} ]] && kill "$SAMPLER" 2>/dev/null
  [[ -n ${STEP_PID:-} ]] && kill "$STEP_PID" 2>/dev/null  # interrupted mid-step: timeout passes it on
  "$PY" bench/gpu_figures.py "$OUT" summary || echo "summary unavailable (exit $?)" >&2
  [[ $KEEP_WORK == 1 ]] || rm -rf "$WORK"
}
trap finish EXIT
trap 'exit 130' INT TERM  # the summary still comes (finish runs on EXIT)

if command -v nvidia-smi >/dev/null && [[ $TINY == 0 ]]; then  # every process's GPU memory, each step's window
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 250 > "$OUT/gpu_memory.log" &
  SAMPLER=$!
fi

step preflight 90 "" "$PY" bench/gpu_preflight.py "$OUT" "$WORK" "${PREFLIGHT[@]}"
step fixture 240 "" "$PY" -m geoprobe.fixtures "$MODEL" --hf-home "$HF_HOME" "${FIXTURE[@]}"
# what this run is for (issue 63): where the GPU's time goes, phase by phase, in one process
step phases 170 fixture "$PY" bench/gpu_phases.py "$OUT" --model "$MODEL" "${PREFLIGHT[@]}"
step scan 180 fixture "${GP[@]}" scan "$MODEL" --corpus "$CORPUS" --tokens $TOKENS --seq-len $SEQ \
  --positions $POSITIONS --doc-blocks 1 --anchors $ANCHORS --device $DEVICE --dtype $DTYPE --batch-size 8 \
  --out "$WORK/run"
# CPU against CUDA on a tiny case, and CUDA twice: are the GPU's numbers right at all (seconds)
step agree 150 "" "$PY" bench/gpu_agree.py "$WORK" "${PREFLIGHT[@]}"
step scan_dxd 150 fixture "${GP[@]}" scan "$MODEL" --corpus "$CORPUS" --tokens $DXD_TOKENS --seq-len $DXD_SEQ \
  --positions all --doc-blocks 1 --layers $DXD_LAYERS --anchors $ANCHORS --device $DEVICE --dtype $DTYPE \
  --batch-size 2 --out "$WORK/run_dxd"
# --save-every 0 --eval-every 0: no checkpoint write or scoring inside the timed loop
step dsl 120 fixture "${GP[@]}" dsl train --corpus "$CORPUS" --tokenizer "$MODEL" --steps $STEPS --batch-size 16 \
  --seq-len $BSEQ --warmup 10 --save-every 0 --eval-every 0 --out "$WORK/dsl" --device $DEVICE
step bridge 180 scan "${GP[@]}" bridge --run "$WORK/run" --layer 3 --steps $STEPS --until steps --batch-size $BATCH \
  --seq-len $BSEQ --device $DEVICE --dtype $DTYPE
step sample 90 bridge "${GP[@]}" sample --model "$WORK/run/bridges/layer-03/seed-0" --sampler roar --num 4 \
  --length $BSEQ --out "$WORK/samples" --device $DEVICE
# the exit status: 0 when every step succeeded (the summary says which did not)
[[ $SUCCEEDED == " preflight fixture phases scan agree scan_dxd dsl bridge sample " ]]
