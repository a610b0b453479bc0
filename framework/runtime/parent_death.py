"""Child processes that end with the process that started them: `die_with_parent`, a Popen
`preexec_fn` (Linux), so a killed coordinator leaves no role processes or broker behind.
Elsewhere the roles notice the coordinator's MQTT last will instead."""

from __future__ import annotations

import ctypes
import sys


def _libc_prctl():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _libc_prctl()  # resolved now: a preexec_fn must not import or take locks


def die_with_parent() -> None:
    """preexec_fn of child processes (Linux): be sent SIGTERM when the parent dies, even by
    SIGKILL."""
    if _PRCTL is not None:
        _PRCTL(1, 15)  # PR_SET_PDEATHSIG, SIGTERM
