"""docs/architecture.md's "How to add" steps, followed literally: a sampler written as a
`Sampler` subclass and added to `SAMPLERS` in samplers/__init__.py reaches `geoprobe sample`
(its --sampler, --help and knob checks) with no other change."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from tests.helpers import invoke

ROOT = Path(__file__).resolve().parents[1]

# "Write a class that subclasses Sampler. Declare its knobs as dataclass fields with their
# defaults. Implement run(model, num, length, generator)": one denoiser call on the all-masked
# state, every position drawn from its filtered logits
ONE_SHOT = '''
from dataclasses import dataclass

import torch

from geoprobe.samplers.base import Sampler


@dataclass
class OneShot(Sampler):
    name = "oneshot"
    steps: int = 1

    def run(self, model, num, length, generator):
        table = model.denoiser.token_table()
        logits = model(torch.zeros(num, length, table.shape[1], device=table.device))
        return self.draw(logits, generator)
'''

# "Add it to SAMPLERS in samplers/__init__.py": the package's own source with the class added
# to the table, loaded as geoprobe.samplers in a fresh process before anything imports it
REGISTERED = '''
import importlib.util, json, sys
from pathlib import Path

import geoprobe

sys.path.insert(0, sys.argv[1])
spec = importlib.util.find_spec("geoprobe.samplers")
source = Path(spec.origin).read_text()
table, last_import = "LeftToRight, Ancestral)}", "from geoprobe.samplers.roar import ROAR\\n"
assert source.count(table) == 1 and source.count(last_import) == 1, "samplers/__init__.py moved: update this test"
source = source.replace(table, "LeftToRight, Ancestral, OneShot)}").replace(
    last_import, last_import + "from one_shot import OneShot\\n")
module = importlib.util.module_from_spec(spec)
sys.modules["geoprobe.samplers"] = geoprobe.samplers = module
exec(compile(source, spec.origin, "exec"), module.__dict__)

sys.path.insert(0, sys.argv[3])  # the repository: the tests' own in-process CLI call
from tests.helpers import invoke


model, out = sys.argv[2], Path(sys.argv[1]) / "samples"
print(json.dumps({
    "help": invoke("sample", "--help"),
    "sample": invoke("-q", "sample", "--model", model, "--sampler", "oneshot", "--num", 3, "--length", 6,
                     "--top-p", 1e-6, "--out", out, "--device", "cpu"),
    "bad": invoke("sample", "--model", model, "--sampler", "oneshot", "--steps", 0, "--out", out, "--device", "cpu"),
}))
'''


class PatternDenoiser:
    """A TokenDenoiser whose logits at position i favour token i mod V by `margin` nats."""

    vocab_size, s_max = 5, 4.0

    def __init__(self, margin: float):
        self.margin = margin

    def token_table(self) -> torch.Tensor:
        return torch.eye(self.vocab_size, 3)

    def __call__(self, z: torch.Tensor) -> torch.Tensor:
        num, length, _ = z.shape
        favoured = torch.arange(length) % self.vocab_size
        logits = torch.zeros(num, length, self.vocab_size)
        logits[:, torch.arange(length), favoured] = self.margin
        return logits


def _one_shot(tmp_path):
    (tmp_path / "one_shot.py").write_text(ONE_SHOT)
    spec = importlib.util.spec_from_file_location("one_shot", tmp_path / "one_shot.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.OneShot


def test_a_new_sampler_draws_from_the_token_denoiser_protocol(tmp_path):
    OneShot = _one_shot(tmp_path)
    # a nucleus below every token's probability keeps only the favoured one: position i gets i mod 5
    greedy = OneShot(top_p=1e-6).sample(PatternDenoiser(margin=1.0), num=4, length=12, seed=0)
    assert greedy.tokens.tolist() == [[i % 5 for i in range(12)]] * 4
    assert greedy.nfe == 1 and greedy.nfe_per_sample == 1 and greedy.settings["sampler"] == "oneshot"
    # the full posterior: the favoured token with probability e^m / (e^m + 4), 4,000 draws
    draws = OneShot().sample(PatternDenoiser(margin=np.log(6.0)), num=400, length=10, seed=1).tokens
    hits = (draws == torch.arange(10) % 5).double().mean().item()
    p = 6 / 10
    assert abs(hits - p) < 5 * np.sqrt(p * (1 - p) / draws.numel())


def test_a_sampler_added_to_the_table_reaches_geoprobe_sample(tmp_path, corpus_txt):
    _one_shot(tmp_path)
    dsl = tmp_path / "dsl"
    code, _, err = invoke("-q", "dsl", "train", "--corpus", corpus_txt, "--tokenizer", "words", "--steps", 2,
                          "--batch-size", 2, "--seq-len", 16, "--d-model", 16, "--n-layers", 1, "--out", dsl,
                          "--device", "cpu")
    assert code == 0, err
    done = subprocess.run([sys.executable, "-c", REGISTERED, str(tmp_path), str(dsl), str(ROOT)], capture_output=True,
                          text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    code, help_text, _ = result["help"]
    assert code == 0 and "oneshot" in help_text  # --sampler's help lists the table
    code, _, err = result["sample"]
    assert code == 0, err
    rows = [json.loads(line) for line in (tmp_path / "samples" / "samples.jsonl").read_text().splitlines()]
    meta = json.loads((tmp_path / "samples" / "samples.meta.jsonl").read_text().splitlines()[-1])
    assert meta["sampler"] == "oneshot" and meta["nfe"] == 1 and len(rows) == 3
    # the oracle: with the nucleus at 1e-6 each token is the DSL's argmax at the all-masked state
    from geoprobe.bridges.kinds import load_denoiser

    denoiser, _ = load_denoiser(dsl, "cpu")
    with torch.no_grad():
        argmax = denoiser(torch.zeros(3, 6, denoiser.token_table().shape[1])).argmax(-1)
    assert [r["token_ids"] for r in rows] == argmax.tolist()
    code, _, err = result["bad"]  # the knob checks of the base class hold for it
    assert code == 2 and err.strip().startswith("error: ") and "--steps" in err
