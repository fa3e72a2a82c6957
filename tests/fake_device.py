"""A pretend accelerator for CPU-only tests: what CUDA would refuse, refused here too.

Inside `accelerator()`, tensors created on (or moved to) `DEVICE` are real CPU tensors wrapped
in `OnDevice`, whose `.device` says `lazy:0` (a device type with a guard in every CPU build, so
autograd and nn.Module work on it, and which no code here treats specially, unlike `meta`, which
`load_state_dict` skips). Every aten call is checked as CUDA checks it: tensors of more than zero
dimensions from both sides in one call raise `DeviceMixing` (CUDA allows CPU scalars, and CPU
index tensors into device tensors, which it uploads: counted as a wait); a random op drawn with
a generator of the other side raises too. The calls a CUDA device would make the host wait for are counted in
`Accelerator.syncs` by name (`item`, `to_host`, `nonzero`, ...), where they come from in
`Accelerator.where`, host-to-device copies in `Accelerator.uploads`.

Why not the meta device itself: it has no values, so `.item()`, `.tolist()` and every
data-dependent step fail; FakeTensorMode has the same limit. Why not CUDA's own checks: no GPU
here. The wrapper runs the real computation, so results can be compared with a plain CPU run.

What it cannot see: whether an upload's memory was pinned (a `non_blocking=True` upload counts as
no wait), CUDA's refusals of CPU scalars outside elementwise ops, and the bf16 autocast a CUDA
run trains under (`lazy` has none, so the device tests run in float32).

`torch.Generator(device=DEVICE)` is not possible; `accelerator()` replaces `torch.Generator` by a
class that draws on the CPU and reports the device it was asked for.
"""

from __future__ import annotations

import traceback
import weakref
from collections import Counter
from contextlib import contextmanager

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

DEVICE = torch.device("lazy", 0)
CPU = torch.device("cpu")
aten = torch.ops.aten


class DeviceMixing(RuntimeError):
    pass


class OnDevice(torch.Tensor):
    """A CPU tensor that says it lives on DEVICE."""

    @staticmethod
    def __new__(cls, inner: torch.Tensor):
        out = torch.Tensor._make_wrapper_subclass(cls, inner.shape, strides=inner.stride(), dtype=inner.dtype,
                                                  device=DEVICE, requires_grad=inner.requires_grad,
                                                  storage_offset=inner.storage_offset())
        out.inner = inner
        return out

    def __repr__(self, **kwargs) -> str:
        return f"OnDevice({self.inner!r})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise DeviceMixing(f"{func}: a device tensor used outside accelerator()")

    def tolist(self):
        return self.cpu().tolist()

    def numpy(self, *args, **kwargs):
        raise DeviceMixing("numpy() of a device tensor: CUDA refuses it too (call .cpu() first)")


class _Generator(torch.Generator):
    """Draws on the CPU; reports the device it was made for."""

    def __new__(cls, device=CPU):
        return super().__new__(cls)

    def __init__(self, device=CPU):
        super().__init__()
        self._where = torch.device(device)

    @property
    def device(self):
        return self._where


# calls a CUDA device answers only after the host has waited for the queue
_DATA_DEPENDENT = {aten.nonzero.default: "nonzero", aten.masked_select.default: "masked_select",
                   aten._unique2.default: "unique", aten.unique_dim.default: "unique",
                   aten.unique_consecutive.default: "unique", aten.repeat_interleave.Tensor: "repeat_interleave"}


class _Functions(TorchFunctionMode):
    """What aten does not see: a random draw's generator must live where its output will (aten
    gets a plain CPU generator); `torch.tensor(data, device=...)` builds its tensor outside the
    dispatcher (it is built on the CPU here and then moved, which the dispatcher sees)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.tensor, torch.as_tensor) and kwargs.get("device") is not None:
            device = kwargs.pop("device")
            return func(*args, **kwargs).to(device)
        generator = kwargs.get("generator")
        if generator is None:
            generator = next((a for a in args if isinstance(a, torch.Generator)), None)
        if generator is not None:
            target = kwargs.get("device")
            tensors = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]
            wanted = torch.device(target) if target is not None else (tensors[0].device if tensors else CPU)
            if generator.device.type != wanted.type:
                raise DeviceMixing(f"{func.__name__}: a {generator.device.type} generator for a {wanted.type} tensor")
        return func(*args, **kwargs)


class Accelerator(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.syncs: Counter = Counter()
        self.uploads = 0
        self.where: Counter = Counter()  # (kind, the caller's file:line) -> count, to find a sync
        self._storages: dict[int, list] = {}  # storage address -> [bytes, live device tensors on it]
        self.live_bytes = self.peak_bytes = 0  # device memory held by tensors: now, and the most so far

    def reset(self) -> None:
        self.syncs.clear()
        self.where.clear()
        self.uploads = 0
        self.peak_bytes = self.live_bytes

    def wrap(self, inner: torch.Tensor) -> OnDevice:
        """A device tensor, its storage counted until the last device tensor on it is gone (what a
        caching allocator would hand back; kernels' internal workspaces are not seen)."""
        out = OnDevice(inner)
        storage = inner.untyped_storage()
        key = storage.data_ptr()
        entry = self._storages.setdefault(key, [storage.nbytes(), 0])
        if entry[1] == 0:
            self.live_bytes += entry[0]
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        entry[1] += 1
        weakref.finalize(out, self._release, key)
        return out

    def _release(self, key: int) -> None:
        entry = self._storages[key]
        entry[1] -= 1
        if entry[1] == 0:
            self.live_bytes -= entry[0]
            del self._storages[key]

    def _sync(self, kind: str) -> None:
        self.syncs[kind] += 1
        caller = next((f for f in reversed(traceback.extract_stack()[:-2])
                       if "/torch/" not in f.filename and not f.filename.endswith("fake_device.py")), None)
        self.where[(kind, f"{caller.filename.rsplit('/', 2)[-2:]}:{caller.lineno}" if caller else "?")] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        flat, _ = tree_flatten((args, kwargs))
        on_device = any(isinstance(x, OnDevice) for x in flat)
        host = [x for x in flat if isinstance(x, torch.Tensor) and not isinstance(x, OnDevice) and x.dim() > 0]
        target = kwargs.get("device")
        target = None if target is None else torch.device(target)
        if func in (aten._to_copy.default, aten.copy_.default):
            self._count_copy(func, args, kwargs, target)
        elif on_device and host:
            if func in (aten.index.Tensor, aten.index_put_.default, aten.index_put.default):
                self.uploads += 1  # CUDA uploads CPU indices itself, from pageable memory: a wait
                self._sync("blocking_upload")
            else:
                raise DeviceMixing(f"{func}: tensors on {DEVICE.type} and cpu in one call "
                                   f"(cpu shapes {[tuple(x.shape) for x in host]})")
        if on_device:
            if func is aten._local_scalar_dense.default:
                self._sync("item")
            elif func in _DATA_DEPENDENT:
                self._sync(_DATA_DEPENDENT[func])
            elif func is aten.index.Tensor and any(
                    isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1] if i is not None):
                self._sync("boolean_index")
        unwrapped_args, unwrapped_kwargs = tree_map(lambda x: x.inner if isinstance(x, OnDevice) else x,
                                                    (args, kwargs))
        if target is not None:
            unwrapped_kwargs["device"] = CPU
        out = func(*unwrapped_args, **unwrapped_kwargs)
        device_out = target.type == DEVICE.type if target is not None else on_device
        if func is aten.copy_.default:  # in place: the destination keeps its side
            return args[0]
        if func is aten._to_copy.default and target is not None:
            device_out = target.type == DEVICE.type
        if not device_out:
            return out
        return tree_map(lambda x: self.wrap(x) if isinstance(x, torch.Tensor) and not isinstance(x, OnDevice) else x,
                        out)

    def _count_copy(self, func, args, kwargs, target) -> None:
        source = args[1] if func is aten.copy_.default else args[0]
        destination_on = isinstance(args[0], OnDevice) if func is aten.copy_.default else (
            target.type == DEVICE.type if target is not None else isinstance(source, OnDevice))
        source_on = isinstance(source, OnDevice)
        if source_on and not destination_on:
            self._sync("to_host")
        elif destination_on and not source_on and source.dim() > 0:
            self.uploads += 1
            blocking = not (kwargs.get("non_blocking") or (func is aten.copy_.default and len(args) > 2 and args[2]))
            if blocking:  # from pageable memory CUDA waits for the queue to drain first
                self._sync("blocking_upload")


@contextmanager
def accelerator():
    """`with accelerator() as acc:` code run on `DEVICE` fails where CUDA would; `acc.syncs`."""
    real = torch.Generator
    mode = Accelerator()
    torch.Generator = _Generator
    try:
        with mode, _Functions():
            yield mode
    finally:
        torch.Generator = real
