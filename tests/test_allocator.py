"""validator.allocator: the glibc malloc settings that keep freed memory in the process."""

import subprocess
import sys

import pytest

PROBE = r"""
import ctypes, sys
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
libc.sbrk.restype = ctypes.c_void_p
libc.sbrk.argtypes = (ctypes.c_ssize_t,)
if sys.argv[1] == "tuned":
    from validator.allocator import tune_allocator
    assert tune_allocator()
block = libc.malloc(24 << 20)                 # 24 MiB: above glibc's default mmap threshold
on_heap = block < libc.sbrk(0)                # below the program break: from the heap, not mmap
libc.free(block)
brk_after_free = libc.sbrk(0)
again = libc.malloc(24 << 20)
print(on_heap, again == block, libc.sbrk(0) == brk_after_free)
"""


def _probe(mode: str) -> str:
    result = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt")
def test_tuned_allocator_serves_large_blocks_from_the_heap_and_keeps_them():
    on_heap, reused, heap_kept = _probe("tuned")
    assert on_heap == "True" and reused == "True" and heap_kept == "True"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt")
def test_default_allocator_maps_the_same_block_instead():
    assert _probe("default")[0] == "False"  # the settings are what changes it
