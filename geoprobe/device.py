"""Moving tensors between the host and the device (a leaf module: every layer may import it)."""

from __future__ import annotations

import torch


def upload(x: torch.Tensor, device) -> torch.Tensor:
    """A host tensor on `device` without the host waiting: on CUDA a copy from pageable memory
    waits until the device has run everything queued before it (the previous training step), so
    the tensor is pinned first and copied asynchronously (the caching host allocator keeps the
    pinned buffer until the copy is done). A no-op for a tensor already there."""
    device = torch.device(device)
    if x.device == device:
        return x
    if device.type == "cuda" and x.device.type == "cpu":
        x = x.pin_memory()
    return x.to(device, non_blocking=True)
