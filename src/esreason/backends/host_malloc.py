"""glibc malloc settings for CPU decode loops: keep freed buffers in the heap instead of returning them.

Why. glibc serves every allocation above its mmap threshold (dynamic, at most 32 MiB) with a fresh
``mmap`` and gives it back with ``munmap`` when freed; the next allocation of that size then faults
every page in again. A CPU decode loop allocates and frees tensors of that size at every step and
every cache compaction (the demo's evaluation call: 2,048 rows, KV buffers of 10-80 MB per layer).
With the thresholds below the demo's call (benchmarks/eval_call.py shapes) makes a third of the
page faults and spends a third of the system time, runs about 30 % faster and peaks at the same
RSS (docs/measurements.md). This is the effect PyTorch's CPU
performance guides obtain by preloading jemalloc or tcmalloc; glibc's own ``mallopt`` gives it
without a preload.

What. :func:`tune` sets ``M_MMAP_THRESHOLD`` (allocations below it come from the heap) and
``M_TRIM_THRESHOLD`` (free memory at the top of the heap kept up to it) to :data:`THRESHOLD_BYTES`.
Allocations above it still use ``mmap``. It is process-wide, so it is applied only where a model is
loaded to run on the CPU (:func:`esreason.backends.hf.load_model`), once per process; GPU processes
keep glibc's defaults. ``ESREASON_MALLOC=default`` turns it off. Non-glibc platforms (macOS, musl)
are left alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

THRESHOLD_BYTES = 1 << 30
"""1 GiB: every per-step buffer of a CPU decode fits below it; a larger allocation still maps."""
_M_TRIM_THRESHOLD = -1  # glibc malloc.h
_M_MMAP_THRESHOLD = -3
ENV = "ESREASON_MALLOC"

_applied: bool | None = None


def tune() -> bool:
    """Apply the thresholds once per process; returns whether they are in effect.

    False where the platform has no glibc, where ``ESREASON_MALLOC=default``, or where glibc refused.
    """
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    if os.environ.get(ENV, "") == "default" or platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    name = ctypes.util.find_library("c") or "libc.so.6"
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return False
    # mallopt returns 1 on success, 0 on error
    _applied = bool(libc.mallopt(_M_MMAP_THRESHOLD, THRESHOLD_BYTES)) and bool(
        libc.mallopt(_M_TRIM_THRESHOLD, THRESHOLD_BYTES))
    return _applied
