"""Steady host-memory allocation for rank processes (glibc malloc settings).

With glibc's defaults, blocks above a dynamic threshold (128 KiB, adapted up to 32 MiB) come from
mmap and freed heap tops above the trim threshold go back to the OS, so a training step that
frees and re-allocates multi-MiB tensors (weight gradients, activations of several micro-batches)
page-faults a varying share of them: measured here, the backward of MLP stage 3-6 in a GPipe order
(4 micro-batches of 8) took 2.3-4.8 ms per micro-batch from one process to the next with the
defaults and 2.2-2.6 ms with the settings below. PyTorch's CPU performance guides recommend an
allocator that keeps freed memory (jemalloc, tcmalloc) for this reason; `mallopt` gets the same
from glibc without a preload: no trimming, and mmap only above 32 MiB (glibc's upper bound for
M_MMAP_THRESHOLD on 64-bit; setting it also turns the dynamic threshold off, see mallopt(3)).

Calibration and validation ranks both call `tune_allocator()` (validator.launch.init_rank and
the torchrun worker), so microbenchmarks and plan runs see the same allocator.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
TRIM_THRESHOLD_BYTES = 2**31 - 1  # an int: mallopt takes one; 2 GiB of free heap top before trimming


def tune_allocator() -> bool:
    """Apply the settings to this process's glibc malloc; False where there is no glibc (no-op)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl, macOS, Windows: no mallopt
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
