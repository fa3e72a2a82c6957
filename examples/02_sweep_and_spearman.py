"""Train one bridge per layer and ask whether the geometry score predicts the bridge's loss.

    python examples/02_sweep_and_spearman.py [RUN]      # after 01 (or any `geoprobe scan`)
    GEOPROBE_EXAMPLE_TINY=1 python examples/02_sweep_and_spearman.py

The sweep reports Spearman's rho with a permutation p and a bootstrap interval; this script
recomputes rho with scipy from sweep.csv as an independent check.
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
          "--eval-every", "10"] if TINY else ["--steps", "2000"]

# the command does the work (each layer to its plateau, resumable layer by layer)
subprocess.run([sys.executable, "-m", "geoprobe", "-q", "sweep", "--run", str(run), *budget], check=True)

sweep = geoprobe.open_run(run).sweep()
print(sweep[["score", "rank", "nmse", "nmse_dim", "delta_ce", "steps_run", "stop"]])
reported = json.loads((run / "sweep.json").read_text())["correlations"]
for loss in ("nmse", "nmse_dim", "delta_ce"):
    rho = spearmanr(sweep["score"], sweep[loss]).statistic
    print(f"{loss}: rho = {rho:+.3f} (sweep reported {reported[loss]['rho']:+.3f}, p = {reported[loss]['p']:.3f}); "
          "the claim is rho < 0: a higher score, a lower loss")
