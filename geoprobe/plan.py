"""`geoprobe scan MODEL --plan`: what a scan will need, from the model's config alone.

The parameters are counted on an empty-weight skeleton (accelerate's `init_empty_weights`: no
memory, no download beyond config.json). Figures, in bytes:

* parameters: count x the bytes of the load dtype (what `--dtype` resolves to on the device);
* activations of one forward batch (B sequences of L tokens, the deepest captured layer c):
  the captured states B·L·d per layer kept on the device, the residual stream and one block's
  working set (attention scores B·heads·L² in the compute dtype, the MLP's B·L·2I), and nothing
  above layer c (the capture stops the forward there);
* disk: rows x (captured layers x d x the storage bytes + 4 int64 meta columns); Parquet
  without compression adds a few bytes per page;
* geometry, one layer at a time after the model is unloaded: `geometry.peak_bytes` (0.77-1.02 of
  the peak on a pretend device at four shapes in tests/test_device.py, 0.96 of CUDA's on an H200
  at N = 200k). N = 1M rows at d = 4,096 need about 49 GB for the two copies of the layer plus
  53 GB for the largest phase: one H200.

A scan is refused before it starts when the disk under --out or the device's memory (free GPU
memory, or available RAM on a CPU) will not hold it.
"""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from geoprobe import memory
from geoprobe.backbone import (check_architecture, load_config, parse_layers, resolve_device, resolve_dtype,
    resolve_source)
from geoprobe.errors import BadInput
from geoprobe.files import human, nearest_existing
from geoprobe.geometry import GeometrySettings, peak_bytes
from geoprobe.store import check_writable

META_BYTES = 4 * 8  # doc_id, seq_id, position, token_id as int64


@dataclass
class ScanPlan:
    model: str
    device: str
    dtype: str
    parameters: int
    parameter_bytes: int
    layers: int
    hidden_size: int
    rows: int
    batch_size: int
    seq_len: int
    captured_bytes: int  # captured states of one batch, on the device
    working_bytes: int  # residual stream + one block's attention and MLP working set
    disk_bytes: int
    memory_available: int
    disk_available: int
    geometry_bytes: int  # one layer's geometry on the device (geometry.peak_bytes), after the model is unloaded

    @property
    def activation_bytes(self) -> int:
        return self.captured_bytes + self.working_bytes

    @property
    def memory_bytes(self) -> int:
        return self.parameter_bytes + self.activation_bytes

    def record(self) -> dict:
        return {**asdict(self), "activation_bytes": self.activation_bytes, "memory_bytes": self.memory_bytes}


def plan_scan(model: str, out: Path, *, tokens: int, seq_len: int, layers: str, storage: str, batch_size: int,
              device: str, dtype: str, trust_remote_code: bool = False,
              settings: GeometrySettings | None = None) -> ScanPlan:

    check_writable(out)
    config = load_config(resolve_source(model), trust_remote_code)
    check_architecture(config)
    target = resolve_device(device)
    load_dtype = resolve_dtype(dtype, target, getattr(config, "dtype", None) or getattr(config, "torch_dtype", None))
    width = torch.finfo(load_dtype).bits // 8
    count = memory.parameter_count(config)
    d, n = config.hidden_size, config.num_hidden_layers
    captured = parse_layers(layers, n)
    captured_bytes = batch_size * seq_len * d * width * len(captured)
    working = memory.working_bytes(config, width, batch_size, seq_len)
    storage_bytes = 2 if storage == "float16" else 4
    disk = tokens * (len(captured) * d * storage_bytes + META_BYTES)
    free = memory.memory_available(target)
    return ScanPlan(model=model, device=str(target), dtype=str(load_dtype).removeprefix("torch."), parameters=count,
                    parameter_bytes=count * width, layers=len(captured), hidden_size=d, rows=tokens,
                    batch_size=batch_size, seq_len=seq_len, captured_bytes=captured_bytes, working_bytes=working,
                    disk_bytes=disk, memory_available=free, disk_available=shutil.disk_usage(nearest_existing(Path(out))).free,
                    geometry_bytes=peak_bytes(tokens, d, settings or GeometrySettings()))


def geometry_refusal(need: int, free: int, device) -> str | None:
    if need <= free:
        return None
    return (f"the geometry of one layer needs {human(need)} on {device} but only {human(free)} is free; lower "
            "--tokens, or use --positions random:K")


def check_geometry_fits(model: str, rows: int, settings: GeometrySettings, device: torch.device,
                        trust_remote_code: bool = False) -> None:
    """A scan whose geometry will not fit the device (`rows` per layer on this process) is
    refused before it extracts anything (config.json alone is read)."""
    config = load_config(resolve_source(model), trust_remote_code)
    refusal = geometry_refusal(peak_bytes(rows, config.hidden_size, settings), memory.memory_available(device), device)
    if refusal:
        raise BadInput(refusal)


def check_fits(plan: ScanPlan) -> None:
    if plan.disk_bytes > plan.disk_available:
        raise BadInput(f"the shards need {human(plan.disk_bytes)} but only {human(plan.disk_available)} is free "
                       f"under --out; lower --tokens or --layers, use --positions random:K, or another --out")
    refusal = geometry_refusal(plan.geometry_bytes, plan.memory_available, plan.device)
    if refusal:
        raise BadInput(refusal)
    if plan.memory_bytes > plan.memory_available:
        raise BadInput(f"the model and one batch need {human(plan.memory_bytes)} on {plan.device} but only "
                       f"{human(plan.memory_available)} is free; lower --batch-size, use --dtype bfloat16, "
                       "or --device-map auto")


