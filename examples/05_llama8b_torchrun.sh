#!/usr/bin/env bash
# The paper's backbone on 8 GPUs: plan, scan, sweep, with the real flags.
#   bash examples/05_llama8b_torchrun.sh                  # needs the model in the HF cache and 8 GPUs
#   GEOPROBE_EXAMPLE_TINY=1 bash examples/05_llama8b_torchrun.sh   # same commands: 2 CPU ranks, a downsized
#                                                                 # random-weight fixture (make test runs it)
set -euo pipefail
PY=${PY:-python}
MODEL=meta-llama/Llama-3.1-8B-Instruct
OUT=${OUT:-/data/runs/llama8b}
if [[ "${GEOPROBE_EXAMPLE_TINY:-}" == 1 ]]; then
  export HF_HOME=${HF_HOME:-$(mktemp -d)} HF_HUB_OFFLINE=1
  $PY -m geoprobe.fixtures $MODEL --hf-home "$HF_HOME" --tiny >/dev/null   # the architecture, every size shrunk
  GPUS=2 DEVICE=cpu DTYPE=float32 CORPUS="synthetic:hmm?docs=200&length=120" TOKENS=1600 SEQ=64 POS=random:16
  SWEEP=(--layers 1,2 --steps 4 --until steps --batch-size 2 --seq-len 32 --d-model 16 --n-layers 1)
  GEOMETRY=(--anchors 256 --k 8 --pairs 256 --bootstrap 20)
else
  GPUS=8 DEVICE=cuda DTYPE=bfloat16 CORPUS="hf:Salesforce/wikitext?config=wikitext-103-raw-v1&split=train"
  TOKENS=3906250 SEQ=2048 POS=random:8
  SWEEP=(--batch-size 64 --seeds 0,1,2)   # the global batch: 8 per GPU; three replicates per layer
  GEOMETRY=()
fi
# 1. figures only (config alone, no weights): refuses if the disk or a GPU cannot hold it
$PY -m geoprobe scan $MODEL --plan --dtype $DTYPE --tokens $TOKENS --seq-len $SEQ --positions $POS \
    --corpus "$CORPUS" --out "$OUT" --device $DEVICE
# 2. extract + geometry + ranking, one rank per GPU (interrupted? run the same line again)
$PY -m torch.distributed.run --nproc-per-node $GPUS -m geoprobe -q scan $MODEL --dtype $DTYPE --tokens $TOKENS \
    --seq-len $SEQ --positions $POS --corpus "$CORPUS" --out "$OUT" --device $DEVICE "${GEOMETRY[@]}"
# 3. one bridge per layer and seed, data parallel, and the pre-registered verdict (docs/method.md)
$PY -m torch.distributed.run --nproc-per-node $GPUS -m geoprobe -- -q sweep --run "$OUT" --device $DEVICE \
    --dtype $DTYPE "${SWEEP[@]}"
$PY -c "import geoprobe, sys; print(geoprobe.open_run(sys.argv[1]).sweep())" "$OUT"
