"""The first step of bench/gpu_check.sh (seconds): does every module the steps use import on this
machine's versions, what is the machine, and what can its GPU do at most.

Writes OUT/preflight.json and prints one line per figure. The measured ceilings are the
denominators of the figures after it (a scan's MFU is against the GEMM rate measured here, not a
datasheet's). On a CPU (--tiny) every measurement runs at a toy size, so the code path is tested.

    python bench/gpu_preflight.py OUT WORK [--tiny]
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import platform
import shutil
import subprocess
import sys
import time
import traceback
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("geoprobe", "geoprobe.bridges", "geoprobe.samplers")  # every module of these, as the steps import them
# the device machine has no gguf, mauve-text or faiss: a module needing them at import is reported
VERSIONS = ("torch", "transformers", "tokenizers", "safetensors", "accelerate", "huggingface_hub", "numpy",
            "scipy", "pyarrow", "psutil", "typer", "rich", "gguf", "mauve-text", "faiss-cpu")


def import_check() -> dict:
    """Each module of PACKAGES imported; the failures with the exception's last line."""
    sys.path.insert(0, str(ROOT))
    failed, count = {}, 0
    for package in PACKAGES:
        try:
            root = importlib.import_module(package)
        except Exception as exc:  # noqa: BLE001 - any failure is the finding
            failed[package] = traceback.format_exception_only(exc)[-1].strip()
            continue
        count += 1
        # the package's own folder only: a source tree's geoprobe also looks beside itself for bridges/
        for info in pkgutil.walk_packages(root.__path__[:1], prefix=f"{package}."):
            if info.name.endswith("__main__"):
                continue  # runs the CLI when imported
            count += 1
            try:
                importlib.import_module(info.name)
            except Exception as exc:  # noqa: BLE001
                failed[info.name] = traceback.format_exception_only(exc)[-1].strip()
    return {"modules_imported": count - len(failed), "modules_failed": failed}


def versions() -> dict:
    found = {"python": platform.python_version()}
    for name in VERSIONS:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def host(work: Path) -> dict:
    import psutil

    memory = psutil.virtual_memory()
    work.mkdir(parents=True, exist_ok=True)
    return {"cpu_count": psutil.cpu_count(), "host_memory_total_gib": memory.total / 2**30,
            "host_memory_available_gib": memory.available / 2**30,
            "work_disk_free_gib": shutil.disk_usage(work).free / 2**30}


def gpu() -> dict:
    import torch

    if not torch.cuda.is_available():
        return {"gpu": "none"}
    props = torch.cuda.get_device_properties(0)
    found = {"gpu": props.name, "gpu_memory_gib": props.total_memory / 2**30,
             "gpu_memory_free_gib": torch.cuda.mem_get_info()[0] / 2**30, "cuda": torch.version.cuda}
    try:  # clocks now and at most: a throttled card explains a slow figure
        line = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.max.sm,clocks.mem,power.limit,driver_version",
                               "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20).stdout
        sm, sm_max, mem, power, driver = [part.strip() for part in line.splitlines()[0].split(",")]
        found.update(sm_clock_mhz=sm, sm_clock_max_mhz=sm_max, memory_clock_mhz=mem, power_limit_w=power, driver=driver)
    except Exception as exc:  # noqa: BLE001 - clocks are a nicety
        found["clocks_error"] = str(exc)[:200]
    return found


def timed(fn, repeats: int) -> float:
    """Seconds per call, after one warm-up call, synchronized on CUDA."""
    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    fn()
    sync()
    began = time.perf_counter()
    for _ in range(repeats):
        fn()
    sync()
    return (time.perf_counter() - began) / repeats


def ceilings(tiny: bool) -> dict:
    """bf16 GEMM, device-to-device copy, fp64 eigh at d = 4,096 (the geometry's Σ), batched small
    eigvalsh (the neighbourhoods'): the most each figure below can reach on this machine."""
    import torch

    cuda = torch.cuda.is_available() and not tiny
    device = "cuda" if cuda else "cpu"
    n, copy_bytes, d, batch, k = (8192, 2**30, 4096, 4096, 32) if cuda else (256, 2**22, 128, 64, 8)
    gemm_dtype = torch.bfloat16 if cuda else torch.float32  # the CPU's bf16 matmul is an emulation
    a = torch.randn(n, n, device=device, dtype=gemm_dtype)
    b = torch.randn(n, n, device=device, dtype=gemm_dtype)
    gemm = timed(lambda: a @ b, 10 if cuda else 3)
    del a, b
    src = torch.empty(copy_bytes // 4, device=device, dtype=torch.float32)
    dst = torch.empty_like(src)
    copy = timed(lambda: dst.copy_(src), 10 if cuda else 3)
    del src, dst
    x = torch.randn(d, d, device=device, dtype=torch.float64)
    sym = x @ x.T
    eigh = timed(lambda: torch.linalg.eigh(sym), 1)
    del x, sym
    y = torch.randn(batch, k, k, device=device, dtype=torch.float64)
    small = y @ y.transpose(1, 2)
    eigvalsh = timed(lambda: torch.linalg.eigvalsh(small), 2)
    return {"ceiling_device": device, "ceiling_gemm_dtype": str(gemm_dtype).removeprefix("torch."),
            "gemm_n": n, "gemm_tflops": 2 * n**3 / gemm / 1e12,
            # a copy reads and writes each byte
            "copy_gib": copy_bytes / 2**30, "copy_gb_per_second": 2 * copy_bytes / copy / 1e9,
            "eigh_fp64_d": d, "eigh_fp64_seconds": eigh,
            "eigvalsh_batch": f"{batch} x {k} x {k}", "eigvalsh_seconds": eigvalsh}


def main() -> None:
    out, work, tiny = Path(sys.argv[1]), Path(sys.argv[2]), "--tiny" in sys.argv[3:]
    found = {"tiny": tiny, **versions(), **import_check(), **host(work), **gpu()}
    try:
        found.update(ceilings(tiny))
    except Exception as exc:  # noqa: BLE001 - the versions and imports above are worth keeping
        found["ceilings_error"] = traceback.format_exception_only(exc)[-1].strip()
    (out / "preflight.json").write_text(json.dumps(found, indent=2))
    for key, value in found.items():
        shown = f"{value:,.4g}" if isinstance(value, float) else value
        print(f"{key:40s} {shown}", flush=True)
    if found["modules_failed"] or "ceilings_error" in found:
        sys.exit(1)  # recorded as failed; the steps still run (gpu_check.sh goes on)


if __name__ == "__main__":
    main()
