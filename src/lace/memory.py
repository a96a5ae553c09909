"""Keep freed memory in the process instead of handing it back to the kernel after every step.

A training step allocates and frees the same large buffers each time: activations, and gradients such as
the token embedding's dense (49408, 64) one. glibc's malloc serves blocks above a threshold with fresh
`mmap`s and returns freed memory at the top of the heap to the kernel, so each step faults those pages in
and zeroes them again: about 680k page faults in 100 steps of the demo's base model, a tenth of its time
(docs/results.md, "make demo"). Raising both thresholds keeps the memory mapped between steps; the peak
resident size does not change.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 2**20
"""Blocks up to this size come from the heap (glibc's largest allowed threshold on 64-bit)."""
TRIM_THRESHOLD = 256 * 2**20
"""Free memory at the top of the heap kept before any is returned to the kernel."""


def keep_freed_memory() -> bool:
    """Set glibc's mmap and trim thresholds for this process (and the processes it forks); whether they were set
    (False where the C library is not glibc)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    mallopt = getattr(ctypes.CDLL(name), "mallopt", None)
    if mallopt is None:
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
