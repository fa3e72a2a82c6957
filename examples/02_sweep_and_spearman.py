"""Train one bridge per layer and ask whether the geometry score predicts the bridge's loss.

    python examples/02_sweep_and_spearman.py [RUN]      # after 01 (or any `geoprobe scan`)
    GEOPROBE_EXAMPLE_TINY=1 python examples/02_sweep_and_spearman.py

The sweep reports the pre-registered verdict (docs/method.md); this script recomputes rho with
scipy from sweep.csv's seed means as an independent check.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

from scipy.stats import spearmanr

import geoprobe

TINY = os.environ.get("GEOPROBE_EXAMPLE_TINY") == "1"
run = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/example-scan")
budget = ["--steps", "60", "--batch-size", "8", "--seq-len", "33", "--d-model", "32", "--n-layers", "1",
          "--eval-every", "10", "--include-source", "--seeds", "0,1"] if TINY else ["--steps", "2000", "--seeds", "0,1,2"]

# the command does the work (each layer to its plateau, resumable layer by layer)
subprocess.run([sys.executable, "-m", "geoprobe", "-q", "sweep", "--run", str(run), *budget], check=True)

sweep = geoprobe.open_run(run).sweep()  # one row per (layer, seed)
print(sweep[["score", "rank", "objective", "nmse_dim_1step", "nmse_dim", "delta_ce", "steps_run", "best_step", "stop"]])
verdict = json.loads((run / "sweep.json").read_text())["verdict"]
print("\n".join(verdict["statement"]))
if "tests" in verdict:  # an independent check of rho: scipy on the seed means of the tested layers
    means = sweep.groupby(level="layer").mean(numeric_only=True).loc[verdict["compared_layers"]]
    score = [verdict["scores"]["score"][str(l)] for l in means.index]
    for loss in verdict["tests"]:  # the primary (a diffusion bridge's: its objective) and its Holm family
        rho = spearmanr(score, means[loss]).statistic
        print(f"{loss}: rho = {rho:+.3f} (the sweep: {verdict['tests'][loss]['rho']:+.3f}, one-sided p = "
              f"{verdict['tests'][loss]['p']:.3f}); the claim is rho < 0: a higher score, a lower loss")
