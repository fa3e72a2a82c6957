"""geoprobe: where can diffusion enter a pretrained language model?

The toolkit measures the geometry of every layer's hidden states, ranks the layers, and
(with its subpackages geoprobe.bridges and geoprobe.samplers, the folders bridges/ and samplers/
of the source tree) trains and samples diffusion models at the chosen interface. See
docs/architecture.md for the architecture and README.md for the CLI.
"""

import os


KEEP_BELOW = 256 << 20  # bytes: freed blocks up to this size stay in the process's heap


def _keep_freed_memory() -> bool:
    """Let glibc keep freed blocks of up to 256 MB for reuse. By default it hands every freed
    block above 32 MB back to the kernel at once and maps fresh zeroed pages for the next
    allocation of that size, so a CPU loop that allocates the same large temporaries each pass
    (the geometry's kNN chunks and neighbourhoods, training steps) spends much of its time in
    page faults: a SmolLM2 scan's geometry took 131 s of system time in 157 s of wall time.
    Kept, the geometry of a layer takes about 0.6x the time (bench/cpu_allocator.py). No number
    changes; the heap holds at most 256 MB of freed memory beyond what is in use.
    Nothing happens where the C library is not glibc, or with GEOPROBE_KEEP_FREED=0 (the
    bench's baseline). Returns whether it applied."""
    if os.environ.get("GEOPROBE_KEEP_FREED") == "0":
        return False
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        mmap_threshold, trim_threshold, top_pad = -3, -1, -2  # glibc's M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, M_TOP_PAD
        return all([libc.mallopt(mmap_threshold, KEEP_BELOW), libc.mallopt(trim_threshold, KEEP_BELOW),
                    libc.mallopt(top_pad, 64 << 20)])
    except (OSError, AttributeError):  # not glibc (macOS, musl): its allocator is left as it is
        return False


_keep_freed_memory()  # process-wide: every command and notebook on a CPU avoids page-fault storms



def _flush_denormals_where_torch_runs() -> None:
    """Where torch was imported before geoprobe, flush denormals now (`geoprobe.device.flush_denormals`),
    so that at least the threads started from here on inherit it; elsewhere the first geoprobe
    module that computes does it, and `import geoprobe` stays free of torch."""
    import sys

    if "torch" in sys.modules:
        import geoprobe.device  # noqa: F401


_flush_denormals_where_torch_runs()

def _find_siblings_in_a_source_tree() -> None:
    """bridges/ and samplers/ install inside this package (geoprobe.bridges, geoprobe.samplers:
    pyproject.toml's package-dir); run from a source tree that nobody installed (the GPU
    machine's copy of the working tree), they are found where they are, beside this folder."""
    import importlib.util

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if importlib.util.find_spec("geoprobe.bridges") is None and os.path.isdir(os.path.join(root, "bridges")):
        __path__.append(root)


_find_siblings_in_a_source_tree()

_API = ("Run", "open_run", "scan", "bridge", "sample")


def __getattr__(name):
    """`geoprobe.open_run`, `geoprobe.scan`, ... (imported on first use: pandas stays out of the CLI's start-up)."""
    if name == "__version__":  # pyproject.toml owns the number; read only when asked
        from importlib.metadata import version

        return version("geoprobe")
    if name in _API:
        from geoprobe import api

        return getattr(api, name)
    raise AttributeError(f"module 'geoprobe' has no attribute {name!r}")
