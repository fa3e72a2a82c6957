#!/usr/bin/env bash
# Evaluate samples, compare generators at one budget, write the report.
#   bash examples/04_eval_compare_report.sh            # after 01-03
#   GEOPROBE_EXAMPLE_TINY=1 bash examples/04_eval_compare_report.sh
set -euo pipefail
PY=${PY:-python}
DSL=${DSL:-runs/example-dsl} RUN=${RUN:-runs/example-scan}
if [[ "${GEOPROBE_EXAMPLE_TINY:-}" == 1 ]]; then
  EVALUATOR=builtin:hmm-tiny REFERENCES="synthetic:hmm?states=16&vocab=128&emission=0.1&transition=0.1&stick=0.9&docs=300&length=64"
else
  EVALUATOR=builtin:smollm2 REFERENCES=kjv
fi
# Gen.PPL under the evaluator, diversity, entropy, MAUVE against held-out references
# (and, for a synthetic:hmm corpus, the exact NLL of the samples under the true HMM)
$PY -m geoprobe -q eval "$DSL"/samples/mdlm/samples.jsonl "$DSL"/samples/roar/samples.jsonl \
    --evaluator "$EVALUATOR" --references "$REFERENCES"
# one table at one budget (refuses generators with different budgets unless --allow-mismatch)
$PY -m geoprobe compare "$DSL"/samples/mdlm/samples.jsonl "$DSL"/samples/roar/samples.jsonl --out "$RUN"
$PY -m geoprobe report "$RUN"
echo "report: $RUN/report.md"
