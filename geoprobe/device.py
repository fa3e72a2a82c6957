"""Moving tensors between the host and the device, the precision a network trains in, denormals
on the CPU, and the name of the machine a run's times were measured on (a leaf module: every
layer may import it)."""

from __future__ import annotations

import os
import platform
from enum import Enum
from pathlib import Path

import torch

from geoprobe.errors import BadInput


class Precision(str, Enum):
    """--precision of a trained network: AUTO computes its products in bf16 (autocast) where the
    device does bf16 natively and keeps float32 weights; FLOAT32 never leaves float32; BFLOAT16
    holds and trains the weights themselves in bfloat16 (bridges/optim.py). A str, so records and
    flags keep the plain value ("auto")."""

    AUTO = "auto"
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"

    @classmethod
    def parse(cls, value: str) -> Precision:
        try:
            return cls(value)
        except ValueError:
            raise BadInput(f"--precision must be one of {', '.join(p.value for p in cls)}, got {value!r}") from None

    @property
    def weights(self) -> str:
        """What the trained weights are held in: bfloat16 under BFLOAT16, else float32."""
        return "bfloat16" if self is Precision.BFLOAT16 else "float32"

    @property
    def weights_dtype(self) -> torch.dtype:
        return getattr(torch, self.weights)



def flush_denormals() -> bool:
    """Treat float numbers below the smallest normal (about 1.2e-38 in float32) as zero on the CPU.

    A softmax over a large vocabulary at a clean channel state puts most tokens at such values,
    and the CPU multiplies them in microcode: the DSL converter's mixing product at SmolLM2's
    vocabulary took 6.0 s a call with them and 0.08 s without, with the same bits out
    (bench/denormals.py). The setting is per thread, and the CPU's worker threads inherit it
    when they start, so it applies when this module is first imported, before any parallel work
    starts the pool. A pool that torch started before geoprobe was imported (a notebook that ran
    a model first) keeps its workers' setting: restart the process, or import geoprobe first.
    GEOPROBE_DENORMALS=1 keeps them (the bench's baseline). Returns whether it applied."""
    if os.environ.get("GEOPROBE_DENORMALS") == "1":
        return False
    return torch.set_flush_denormal(True)


flush_denormals()  # process-wide from the first geoprobe module that computes

def upload(x: torch.Tensor, device) -> torch.Tensor:
    """A host tensor on `device` without the host waiting: on CUDA a copy from pageable memory
    waits until the device has run everything queued before it (the previous training step), so
    the tensor is pinned first and copied asynchronously (the caching host allocator keeps the
    pinned buffer until the copy is done). A no-op for a tensor already there."""
    device = torch.device(device)
    if x.device == device:
        return x
    if x.device.type == "cpu" and device.type != "cpu":
        if device.type == "cuda":  # pinned (a contiguous copy: an expanded view cannot be)
            x = x.contiguous().pin_memory()
        return x.to(device, non_blocking=True)
    return x.to(device)  # a read back as a plain copy: a non-blocking one would not be synchronised


_deterministic = [False]  # this process's choice (--deterministic), applied when a CUDA device is resolved


def choose_determinism(on: bool) -> None:
    """--deterministic for this process: a command's library call says it first, before any
    device is resolved (on by default for scan, extract and geometry, whose bytes are compared;
    off for training and sampling, where the deterministic kernels' cost buys nothing checked)."""
    _deterministic[0] = bool(on)


def deterministic_cuda(on: bool | None = None) -> None:
    """With `on` (default: the process's choice), reruns on one GPU give the same bits, as on a
    CPU: deterministic cuDNN and cuBLAS (cuBLAS reads its workspace setting when it starts, so
    this runs before any CUDA work) and PyTorch's deterministic kernels where they exist (a
    warning, not an error, where they do not), without their filling of every new tensor with NaN
    (`fill_uninitialized_memory`: a write over all memory allocated, which nothing here reads
    before writing). Off: PyTorch's defaults. Called when a command resolves a CUDA device; CPU
    runs are left as they are."""
    on = _deterministic[0] if on is None else on
    if on:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = on
    torch.use_deterministic_algorithms(on, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = False


def machine_name(device: torch.device | str = "cpu") -> str:
    """What a run's times were measured on, for records and pages: the accelerator's name, or
    the CPU's cores and model (records trained on different machines are not comparable in time)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpuinfo = Path("/proc/cpuinfo")
    cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                if line.startswith("model name")), None) if cpuinfo.is_file() else None
    return f"{os.cpu_count()} × {cpu or platform.processor() or platform.machine()}"
