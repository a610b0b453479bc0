"""Hand a secret to a child process through an inherited pipe, never its environment or argv.

A process's environment stays readable in /proc/<pid>/environ for the process's whole life,
whatever the process later removes from `os.environ` (that file shows the block the process
started with), and its command line is world-readable (`ps`). A pipe's contents are read once
and are gone: the parent writes the secret into a pipe whose read end only that child inherits
(`pass_fds`; Python's descriptors are close-on-exec otherwise, so no other child gets it) and
names the descriptor in `$PIPELAB_SECRET_FD`, which is no secret; the child reads the pipe to
its end and closes it (`take`).
"""

from __future__ import annotations

import os
import subprocess

ENV = "PIPELAB_SECRET_FD"


def popen(cmd: list[str], secret: bytes | None, *, env: dict[str, str], **kwargs) -> subprocess.Popen:
    """subprocess.Popen(cmd, env=env, **kwargs), with `secret` (if any) waiting in a pipe for
    the child's `take()`."""
    if secret is None:
        return subprocess.Popen(cmd, env=env, **kwargs)
    r, w = os.pipe()
    try:
        try:
            proc = subprocess.Popen(cmd, env={**env, ENV: str(r)}, pass_fds=(r,), **kwargs)
        finally:
            os.close(r)
        view = memoryview(secret)
        while view:  # a few hundred bytes fit the pipe at once; a larger secret waits for the child to read
            try:
                view = view[os.write(w, view):]
            except BrokenPipeError:  # the child died first: the runtime's watchdog reports it
                break
    finally:
        os.close(w)
    return proc


def take() -> bytes | None:
    """The secret the parent left for this process (once: the pipe is then closed), or None
    if it left none."""
    fd = os.environ.pop(ENV, None)
    if fd is None:
        return None
    chunks = []
    try:
        while chunk := os.read(int(fd), 1 << 16):
            chunks.append(chunk)
    finally:
        os.close(int(fd))
    return b"".join(chunks)
