"""Epoch-end checkpoints written by a thread while the run goes on, where their bytes are copies.

A checkpoint is taken at an epoch's end (framework.checkpoints.state): the state's bytes come to the
host, and the file is written. In a GPU run the first step already copies every device tensor
into one host block (framework/checkpoints/tensor_file.py), so nothing the next epoch does can change
what is written; writing the file (300 MB for 64 FL devices of VGG-5) is then plain I/O, and a
thread does it while the next epoch trains (a device's block is one write call, which releases
the interpreter's lock). A CPU run's tensors are written from their own memory, which the next
epoch updates, so there the file is written before the run goes on: copying 151 MB first took
27-30 ms on the 2-core machine, writing it 44 ms, and the A/B of whole runs was within its noise.

One checkpoint is in flight at most: the next `save` (and `wait`) first finishes the last one,
then runs its `then` (logging the files to MLflow) in the caller's thread. The thread is not a
daemon, so an interpreter that exits still finishes the file; a run that fails waits for it too
(Job.run), so its last checkpoint is whole. Writing stays atomic (`PreparedCheckpoint.write`):
a crash mid-write keeps the previous checkpoint.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable

from framework.checkpoints import state as ck
from framework.checkpoints.tensor_file import on_device


class CheckpointWriter:
    """Writes a run's checkpoints, in the background where their bytes are copies (above)."""

    def __init__(self, background: bool | None = None):
        """`background`: None, where the bytes are copies anyway (state on a GPU); True, always
        (a CPU run's bytes copied first: for tests, and where the disk is slower than a copy);
        False, never."""
        self.background = background
        self._thread: threading.Thread | None = None
        self._path: Path | None = None
        self._error: BaseException | None = None
        self._then: Callable[[Path], None] | None = None

    @property
    def writing(self) -> bool:
        """Whether a checkpoint is being written now."""
        return self._thread is not None

    def save(self, run_dir, bag: ck.Bag, then: Callable[[Path], None] | None = None) -> None:
        """Write `bag` to <run_dir>/checkpoint, now or (its bytes copied first) in the background;
        `then(path)` runs once the files are in place, in this thread (here, or at the next
        `save` or `wait`)."""
        self.wait()
        detach = on_device(bag.tensors.values()) if self.background is None else self.background
        prepared = ck.prepare(run_dir, bag, detach_from_run=detach)
        if not detach:
            path = prepared.write()
            if then is not None:
                then(path)
            return
        self._then = then
        self._thread = threading.Thread(target=self._write, args=(prepared,), name="pipelab-checkpoint")
        self._thread.start()

    def _write(self, prepared: ck.PreparedCheckpoint) -> None:
        try:
            self._path = prepared.write()
        except BaseException as e:  # handed to the run's thread by `wait`
            self._error = e

    def wait(self) -> None:
        """Finish the checkpoint in flight, if any, and run its `then`; a failed write raises
        here (a CheckpointError naming the cause)."""
        thread = self._thread
        if thread is None:
            return
        thread.join()
        self._thread = None
        error, self._error = self._error, None
        then, self._then = self._then, None
        path, self._path = self._path, None
        if error is not None:
            raise ck.CheckpointError(f"writing the checkpoint failed: {type(error).__name__}: {error}") from error
        if then is not None:
            then(path)
