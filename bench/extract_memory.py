"""Peak RSS of `geoprobe extract` must not grow with the corpus: 4x the tokens <= 1.2x the peak.

Each size runs in a fresh process (`python -m geoprobe extract`, tiny Llama d=256, 8 layers,
every layer captured) and reports its own peak resident set size (ru_maxrss of the child).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import tiny_llama

BASE_TOKENS = 12288


def peak_rss_mb(args: list[str]) -> float:
    code = ("import resource, sys; from geoprobe.cli.app import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)")
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return float(out.stdout.strip().splitlines()[-1])


def main():
    work = Path(tempfile.mkdtemp(prefix="geoprobe-bench-mem-"))
    model, corpus = tiny_llama(work, n_docs=600)
    peaks = {}
    for factor in (1, 4):
        tokens = BASE_TOKENS * factor
        peaks[factor] = peak_rss_mb(["-q", "extract", str(model), "--corpus", str(corpus), "--tokens",
                                     str(tokens), "--seq-len", "256", "--device", "cpu",
                                     "--out", str(work / f"run{factor}")])
        print(f"{tokens:>7} tokens x 9 layers: peak RSS {peaks[factor]:.0f} MB")
    print(f"peak RSS ratio (4x tokens / 1x): {peaks[4] / peaks[1]:.3f}  (target <= 1.2)")


if __name__ == "__main__":
    main()
