"""Denormal floats are flushed to zero on every CPU thread once a geoprobe module that computes
is imported (`geoprobe.device.flush_denormals`), and kept with GEOPROBE_DENORMALS=1."""

import os
import subprocess
import sys

import pytest

PROBE = """
import torch
import geoprobe.device
torch.set_num_threads(2)
x = torch.full((4_000_000,), 1e-39) * 1.0   # split over the worker threads
y = torch.full((64, 4096), 1e-39) @ torch.ones(4096, 8)
print(int((x == 0).sum()), int((y == 0).sum()), x.numel(), y.numel())
"""


@pytest.mark.parametrize("keep", [False, True])
def test_denormals_are_flushed_on_every_thread_unless_kept(keep):
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    env.pop("GEOPROBE_DENORMALS", None)
    if keep:
        env["GEOPROBE_DENORMALS"] = "1"
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True).stdout
    zero_x, zero_y, n_x, n_y = map(int, out.split())
    if keep:  # 1e-39 is a denormal float32: kept, every product stays nonzero
        assert (zero_x, zero_y) == (0, 0)
    else:
        assert (zero_x, zero_y) == (n_x, n_y)
