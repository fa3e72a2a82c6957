"""Every script in examples/ runs with its tiny settings (GEOPROBE_EXAMPLE_TINY=1), so that none
of them can rot: scan and rank, sweep and Spearman, DSL and every sampler, eval/compare/report,
and the 8B torchrun script on two CPU ranks and a downsized fixture; and the README's tour runs as
written on the testbed.

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
    assert outputs["02"].count("(the sweep:") == 5 and "Primary test" in outputs["02"]  # the primary and its 4 secondaries
    assert all(name in outputs["03"] for name in ("mdlm", "remdm-loop", "roar", "continuous", "hybrid"))
    assert (tmp_path / "runs" / "example-scan" / "report.md").is_file()
    sweep = pd.read_csv(tmp_path / "llama8b" / "sweep.csv")
    assert list(sweep["layer"]) == [1, 2] and (tmp_path / "llama8b" / "ranking.csv").is_file()


def tour_block(readme: Path) -> str:
    """The first bash block of the README's "A tour of the commands" section, as written."""
    section = readme.read_text().split("## A tour of the commands", 1)[1]
    return section.split("```bash\n", 1)[1].split("\n```", 1)[0]


def test_the_readme_tour_runs_as_written_on_the_testbed(testbed, tmp_path):
    """The README's tour, parsed out of README.md (so the page and this test cannot drift) and run
    top to bottom by bash in an empty folder, as a new user would: every command succeeds, each
    sample set keeps its own file, compare matches the budgets, and the report gathers it all."""
    import json

    script = tour_block(EXAMPLES.parent / "README.md")
    assert script.count("geoprobe ") >= 15 and "demo" not in script  # every command but the demo (minutes)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",  # one thread, as the examples run
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=900, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = tmp_path / "runs"
    files = sorted(runs.glob("*/samples/*/samples.jsonl"))
    assert [f"{p.parts[-4]}/{p.parts[-2]}" for p in files] == [
        "dsl/mdlm-steps-32-length-32", "dsl/roar-steps-32-length-32", "mdlm/mdlm-steps-32-length-32",
        "sed/ancestral-steps-32-length-32"]
    assert all(len(p.read_text().splitlines()) == 8 for p in files)
    assert list(runs.glob("tour/bridges/layer-03/seed-0/samples/hybrid-*/samples.jsonl"))
    rows = pd.read_csv(runs / "tour" / "compare.csv")
    assert len(rows) == 5 and set(rows["budget"]) == {"matched"}
    ranking = pd.read_csv(runs / "tour" / "ranking.csv").set_index("layer")
    assert list(ranking.index[~ranking["bridgeable"]]) == [6]  # the last of the testbed's 6 blocks' outputs
    chosen = int(ranking[ranking["bridgeable"]]["rank"].idxmin())  # where `bridge --run` trained
    assert json.loads((runs / "tour" / "bridges" / f"layer-{chosen:02d}" / "seed-0" / "metrics.json").read_text())[
        "steps_run"] == 200
    page = (runs / "tour" / "report.md").read_text()
    assert "## Generation" in page and "sweep verdict" in page
