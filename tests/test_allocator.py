"""runtime.tune_malloc: a role process stops paying page faults for every megabyte it moves."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from framework.runtime.allocator import tune_malloc

ROOT = Path(__file__).resolve().parents[1]

# The allocation pattern of one 1 MiB message through an MQTT client (read buffer grown by
# socket reads, decoding copies, a framed copy, the client's packet and the slice it writes),
# repeated; prints the page faults per message.
MESSAGES = """
import resource, sys
if sys.argv[1] == "tuned":
    from framework.runtime.allocator import tune_malloc
    assert tune_malloc()
piece = bytes(64 << 10)
def message():
    buf = bytearray()
    for _ in range(16):
        buf += piece
    a = bytes(buf[2:]); b = bytes(a[10:]); c = bytes(b[2:])
    del buf, a, b
    out = b"".join((b"h" * 48, c))
    del c
    pkt = bytearray(b"0") + out
    return pkt[1:]
message()
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(100):
    message()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / 100)
"""


def faults_per_message(mode: str) -> float:
    out = subprocess.run([sys.executable, "-c", MESSAGES, mode], cwd=ROOT, capture_output=True, text=True, check=True)
    return float(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="page-fault counts and mallopt are glibc/Linux")
def test_tuned_processes_reuse_their_megabyte_buffers():
    if not tune_malloc():
        pytest.skip("not glibc")
    tuned, stock = faults_per_message("tuned"), faults_per_message("stock")
    # one freshly mapped MiB is 256 faults; the tuned heap keeps its pages
    assert tuned < 64, (tuned, stock)
