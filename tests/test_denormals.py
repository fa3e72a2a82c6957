"""Denormal floats are flushed to zero on every CPU thread once a geoprobe module that computes
is imported (`geoprobe.device.flush_denormals`), and kept with GEOPROBE_DENORMALS=1.

The denormals are made from raw bits and checked as bits, so that neither the making nor the
check goes through a thread that already flushes."""

import os
import subprocess
import sys

import pytest

PROBE = """
import torch
import geoprobe.device
torch.set_num_threads(2)
tiny = torch.full((4_000_000,), 0x000B0000, dtype=torch.int32).view(torch.float32)  # about 1e-39: a denormal
x = (tiny * 1.0).view(torch.int32)  # split over both threads
y = (tiny[:64 * 4096].view(64, 4096) @ torch.ones(4096, 8)).view(torch.int32)
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
    if keep:  # kept: every product of a denormal by 1 is that denormal, and a sum of them is not 0
        assert (zero_x, zero_y) == (0, 0)
    else:
        assert (zero_x, zero_y) == (n_x, n_y)
