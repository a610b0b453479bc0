"""glibc malloc settings for processes that move megabyte messages (runtime.tune_malloc).

A role process allocates and frees several megabyte-sized buffers per message: the MQTT
client's read buffer and the copies paho makes while decoding, the frame we publish, paho's
packet. With glibc's defaults, a freed block at the top of the heap is handed back to the
kernel as soon as more than ~2x the largest recently freed block is free there
(M_TRIM_THRESHOLD follows M_MMAP_THRESHOLD dynamically), and every new megabyte then costs 256
page faults to map and zero it again. Measured here (experiments/bench_transport.py, 1 MiB
round trips through mosquitto): about 1,400 page faults per echoed message for our transport
and 450 for bare aiomqtt; with these settings none, and our round trips went from 238 to about
400 MB/s (`--no-tune-malloc` runs the benchmark with glibc's defaults).

Settings: blocks up to 32 MiB (the most glibc's own dynamic threshold would reach) come from
the heap, and up to 64 MiB of freed heap stays mapped. Larger blocks (a reassembled 64 MiB
message) still come from mmap and go back to the kernel when freed, so memory stays bounded:
live data + at most 64 MiB per process. Not glibc (macOS, musl): nothing to do.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 64 << 20

_done = False


def tune_malloc() -> bool:
    """Apply the settings above to this process once. True if glibc took them."""
    global _done
    if _done:
        return True
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018  (musl has a do-nothing mallopt; only glibc has this)
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _done = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return _done
