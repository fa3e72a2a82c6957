"""Every script in examples/ runs with its tiny settings (GEOPROBE_EXAMPLE_TINY=1), so that none
of them can rot: scan and rank, sweep and Spearman, DSL and every sampler, eval/compare/report,
and the 8B torchrun script on two CPU ranks and a downsized fixture.

Each script runs with one thread (OMP_NUM_THREADS=1), so two independent ones share a 2-core
machine without slowing each other: 01 -> 02 (the scan, then its sweep) beside 03 -> 05 (the DSL,
then the torchrun script), then 04, which reads 01-03's runs."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pytest

pytestmark = pytest.mark.slow  # minutes: not in `make check`

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
CHAINS = (("01", "02"), ("03", "05"))  # independent of each other; 04 runs after both


def test_the_examples_run_in_order_with_tiny_settings(tmp_path):
    env = {**os.environ, "GEOPROBE_EXAMPLE_TINY": "1", "HF_HUB_OFFLINE": "1", "PY": sys.executable,
           "OUT": str(tmp_path / "llama8b"), "HF_HOME": str(tmp_path / "hf"), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(EXAMPLES.parent)}
    scripts = {s.name[:2]: s for s in sorted(EXAMPLES.glob("[0-9][0-9]_*"))}
    assert sorted(scripts) == ["01", "02", "03", "04", "05"]
    assert sorted([*CHAINS[0], *CHAINS[1], "04"]) == sorted(scripts)

    def run(number: str) -> str:
        script = scripts[number]
        runner = [sys.executable] if script.suffix == ".py" else ["bash"]
        done = subprocess.run([*runner, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=600, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, f"{script.name}: {done.stderr[-3000:]}"
        return done.stdout

    with ThreadPoolExecutor(len(CHAINS)) as pool:
        chains = [pool.submit(lambda chain=chain: {n: run(n) for n in chain}) for chain in CHAINS]
        outputs = {k: v for chain in chains for k, v in chain.result().items()}
    outputs["04"] = run("04")
    assert "chosen layer" in outputs["01"]
    assert outputs["02"].count("(the sweep:") == 3 and "Primary test" in outputs["02"]
    assert all(name in outputs["03"] for name in ("mdlm", "remdm-loop", "roar", "continuous", "hybrid"))
    assert (tmp_path / "runs" / "example-scan" / "report.md").is_file()
    sweep = pd.read_csv(tmp_path / "llama8b" / "sweep.csv")
    assert list(sweep["layer"]) == [1, 2] and (tmp_path / "llama8b" / "ranking.csv").is_file()
