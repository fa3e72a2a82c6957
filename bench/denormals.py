"""Denormal floats on the CPU, kept against flushed to zero (`geoprobe.device.flush_denormals`), side by side in one run.

A DSL model from scratch with SmolLM2's vocabulary size (49,152), d = 256, 4 blocks, float32,
one torch thread (the setting is per thread: one thread lets one process switch it between
runs). Three jobs, each run with denormals kept and flushed, interleaved, best of `--repeats`:

* mix: the converter's mixing product at clean channel states (4 x 32 positions), where most
  of the posterior's V entries fall below float32's smallest normal;
* train step: the DSL loss at mixed SNR, forward and backward (8 x 64 tokens);
* roar: 4 samples x 32 tokens.

Per job: seconds kept, seconds flushed, their ratio, and whether the outputs are the same bits.

    python bench/denormals.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from geoprobe.bridges.converter import Converter
from geoprobe.bridges.dsl import DSLConfig, DSLModel
from geoprobe.samplers import make_sampler

VOCAB, WIDTH = 49_152, 256


def jobs(model: DSLModel) -> dict:
    """{name: a function of no arguments returning a tensor to compare}."""
    table = model.table().detach()
    ids = torch.randint(0, VOCAB, (4, 32), generator=torch.Generator().manual_seed(0))
    z = model.s_max * table[ids]

    def mix():
        with torch.no_grad():
            return Converter.mix(model.converter(z, table), model.embed.weight, model.mask_vector)

    tokens = torch.randint(0, VOCAB, (8, 64), generator=torch.Generator().manual_seed(1))
    snr = torch.rand(8, 64, generator=torch.Generator().manual_seed(2)) * model.s_max

    def train_step():
        model.zero_grad(set_to_none=True)
        loss = model.loss(tokens, snr, generator=torch.Generator().manual_seed(3))
        loss.backward()
        return torch.cat([loss.detach()[None], model.embed.weight.grad.flatten()[:4096]])

    def roar():
        return make_sampler("roar").sample(model, 4, 32, seed=4).tokens

    return {"mix": mix, "train step": train_step, "roar": roar}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = DSLModel(DSLConfig(vocab_size=VOCAB, d_tok=64, d_model=WIDTH, n_layers=4, n_heads=4))
    print(f"DSL from scratch: V={VOCAB:,}, d={WIDTH}, 4 blocks, float32, 1 torch thread")
    print(f"{'job':12s} {'kept s':>9s} {'flushed s':>10s} {'ratio':>7s}  same bits")
    for name, job in jobs(model).items():
        best, out = {}, {}
        for _ in range(args.repeats):
            for flush in (False, True):
                torch.set_flush_denormal(flush)
                start = time.perf_counter()
                out[flush] = job()
                best[flush] = min(best.get(flush, float("inf")), time.perf_counter() - start)
        torch.set_flush_denormal(True)
        print(f"{name:12s} {best[False]:9.3f} {best[True]:10.3f} {best[False] / best[True]:7.1f}  "
              f"{torch.equal(out[False], out[True])}")


if __name__ == "__main__":
    main()
