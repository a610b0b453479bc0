"""MLflow beside the run: a recorder process writes the run's records while the run trains.

Importing MLflow and its SQLite store's modules costs a fresh process 3-4 s on 2 cores, as long
as importing torch, and a short run waited for both one after the other. For a single run started
from the command line, the CLI forks a recorder before it composes the config (the copy holds
Hydra and OmegaConf, no torch, no threads); the recorder imports MLflow while the run process
imports torch and trains, then holds the run's real `MlflowTracker`. The run's tracker here is a
`RemoteTracker`: each call travels to the recorder as one JSON line over a pipe, in order, and the
recorder calls `MlflowTracker` with it. Nothing is pickled; both sides run this same code.

- Calls are sent, not awaited. Only `run_id` (read when the summary is written) and `end` wait
  for the recorder. The pipe holds 1 MiB of calls (`_widen`), so a recorder still importing
  MLflow does not hold the run up; no thread is needed to send.
- An error in the recorder (a store that cannot be opened or written) stops its work and comes
  back to the run: `run_id` reads None, and `end` raises `TrackingError` after the run's outputs
  are written, so a broken store costs no results.
- Ctrl-C reaches both processes; the recorder ignores it and SIGTERM, and the run process handles
  them as before (its run ends FAILED). If the run process dies without ending the run (SIGKILL,
  the OOM killer), the recorder reads the end of the pipe and ends the run FAILED itself.
- Only where `os.fork` exists, for one run (not a `-m` sweep, whose jobs share a process), and not
  with `PIPELAB_TRACKING_PROCESS=0`; elsewhere, and through the Python API, `MlflowTracker` works
  in the run's own process as before.
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import platform
import select
import shutil
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

from omegaconf import OmegaConf

from framework.errors import PipelabError
from framework.tracking import faults
from framework.tracking.tracker import MlflowTracker, dataset_records

ENV = "PIPELAB_TRACKING_PROCESS"  # 0: MLflow in the run's own process
NOT_A_SINGLE_RUN = ("-m", "--multirun", "--help", "-h", "--hydra-help", "--cfg", "-c", "--info", "-i", "--shell-completion", "-sc", "--plugins")


class TrackingError(PipelabError):
    """MLflow could not record the run (the run itself went on: its outputs are in its folder)."""


def wanted(args: list[str]) -> bool:
    """Whether a command line (`python -m framework ARGS`) runs one job that may track to MLflow."""
    if os.environ.get(ENV, "1") == "0" or not hasattr(os, "fork"):
        return False
    return not any(a in NOT_A_SINGLE_RUN or a.startswith(("--cfg=", "--info=", "--shell-completion=")) for a in args) and "tracking=none" not in args


_recorder: Recorder | None = None


def start(args: list[str]) -> None:
    """Fork the recorder for the run that `args` start, if it may track to MLflow (`wanted`).
    Call before torch is imported: the fork copies this process as it is."""
    global _recorder
    if _recorder is None and wanted(args):
        try:
            _recorder = Recorder()
        except OSError as e:  # no fork now (out of processes or memory): MLflow works in-process
            print(f"note: MLflow records the run in its own process ({e})", file=sys.stderr)
            return
        atexit.register(stop)


def mlflow_tracker(cfg, parent_run_id: str | None = None, run_name: str | None = None, tags: dict | None = None, resume_run_id: str | None = None):
    """MLflow on a SQLite store; metrics batched (what `tracking=mlflow` builds).

    Where the CLI started a recorder for this run, MLflow works there, beside the run; otherwise
    in this process (`MlflowTracker`). Both write the same records."""
    recorder = take_recorder()
    if recorder is not None:
        return RemoteTracker(recorder, cfg, parent_run_id, run_name, tags, resume_run_id)
    return MlflowTracker(cfg, parent_run_id, run_name, tags, resume_run_id)


def take_recorder() -> Recorder | None:
    """The recorder started for this process's run, once (a second tracker works in-process)."""
    global _recorder
    recorder, _recorder = _recorder, None
    return recorder


def stop() -> None:
    """End an unused recorder (the run stopped before it tracked, or tracks elsewhere): it has
    touched no store, so it is killed rather than waited for while it imports MLflow."""
    recorder = take_recorder()
    if recorder is not None:
        recorder.kill()


# ---- the run's side ------------------------------------------------------------------------


class Recorder:
    """The run process's end of the two pipes to a forked recorder."""

    def __init__(self):
        # MLflow's import runs `uname -p` (its telemetry schema reads platform.platform()); a
        # recorder killed then (`stop`) would leave that process orphaned in the run's session.
        # Resolved here (2.5 ms, measured), the fork inherits the cached answer and starts none.
        platform.processor()
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the recorder: it never returns from here
            os.close(req_w)
            os.close(rep_r)
            _serve(req_r, rep_w)
        os.close(req_r)
        os.close(rep_w)
        self.pid = pid
        self._replies = os.fdopen(rep_r, "rb", buffering=0)  # unbuffered: `select` sees every reply
        _widen(req_w)
        self._requests = os.fdopen(req_w, "wb")  # buffered: a flush writes a call whole
        self.error: str | None = None
        self.started_run_id: str | None = None
        self.experiment_id: str | None = None
        self._closed = False
        self._gone = False  # the recorder stopped reading (it died)

    def send(self, op: str, **fields) -> None:
        """One call, written whole; it waits only while the pipe is full (`_widen`)."""
        if self._closed or self._gone:
            return
        try:
            self._requests.write(json.dumps({"op": op, **fields}).encode() + b"\n")
            self._requests.flush()
        except OSError:  # the recorder is gone: `reply` says so at the next wait
            self._gone = True

    def reply(self, block: bool = True) -> dict | None:
        """The recorder's next reply (None without one waiting, when not `block`)."""
        if not block and not select.select([self._replies], [], [], 0)[0]:
            return None
        line = self._replies.readline()
        if not line:
            msg = {"error": f"the recorder process {self.pid} ended without a reply"}
        else:
            msg = json.loads(line)
        if "error" in msg and self.error is None:
            self.error = msg["error"]
        if "run_id" in msg:
            self.started_run_id = msg["run_id"]
            self.experiment_id = msg.get("experiment_id")
        return msg

    def run_id(self) -> str | None:
        """The MLflow run's id, once the recorder has made the run (None if it could not)."""
        while self.started_run_id is None and self.error is None:
            self.reply()
        return self.started_run_id

    def check(self) -> None:
        """Take in any reply that has come (an error, the run's id), without waiting."""
        while self.error is None and not self._closed and self.reply(block=False) is not None:
            pass

    def close(self) -> None:
        """Send the end of the calls and wait until the recorder has done them all and exited."""
        if self._closed:
            return
        self._closed = True
        self._close_requests()
        while self.error is None and not self.reply().get("ended"):
            pass
        self._replies.close()
        self._reap()

    def kill(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._close_requests()
        self._replies.close()
        self._reap()

    def _close_requests(self) -> None:
        try:
            self._requests.close()  # the recorder reads the end of its calls
        except OSError:  # its last flush met a recorder that is gone
            pass

    def _reap(self) -> None:
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass


class RemoteTracker:
    """`MlflowTracker`'s calls, done by the recorder (framework.tracking.recorder)."""

    def __init__(self, recorder: Recorder, cfg, parent_run_id=None, run_name=None, tags=None, resume_run_id=None):
        self.cfg = cfg
        self._recorder = recorder
        self._buffer: list = []
        self.ended = False
        tracking = OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else dict(cfg)
        recorder.send("start", cfg=tracking, parent_run_id=parent_run_id, run_name=run_name, tags=tags or {}, resume_run_id=resume_run_id, process=faults.process_tags())

    @property
    def run_id(self) -> str | None:
        """The MLflow run's id: waits until the recorder has made the run (None if it could not)."""
        return self._recorder.run_id()

    @property
    def experiment_id(self) -> str | None:
        """The MLflow experiment's id: waits as `run_id` does."""
        self._recorder.run_id()
        return self._recorder.experiment_id

    @property
    def known_run_id(self) -> str | None:
        """The run's id if the recorder has made the run already, else None (no waiting)."""
        self._recorder.check()
        return self._recorder.started_run_id

    def log_params(self, params: dict) -> None:
        self._recorder.send("log_params", params={k: str(v) for k, v in params.items()})

    def log_dataset(self, dataset) -> None:
        self._recorder.send("log_dataset_records", records=dataset_records(dataset))

    def log_metric(self, key: str, value: float, step: int = 0) -> None:
        self._buffer.append((key, float(value), int(time.time() * 1000), int(step)))
        if len(self._buffer) >= self.cfg.flush_every:
            self.flush()

    def _send_metrics(self) -> None:
        if self._buffer:
            self._recorder.send("log_metric_records", records=self._buffer)
            self._buffer = []

    def flush(self) -> None:
        self._send_metrics()
        self._recorder.send("flush")
        self._recorder.check()

    def log_artifact(self, path) -> None:
        self._recorder.send("log_artifact", path=str(Path(path).absolute()))

    def log_artifacts(self, folder, artifact_path: str) -> None:
        """A folder that the run replaces later (the checkpoint, at every epoch end) is logged as it
        is now: its files are hard-linked into a snapshot that the recorder logs and removes."""
        self._recorder.send("log_artifacts", folder=snapshot(folder), artifact_path=artifact_path)

    def set_tag(self, key: str, value: str) -> None:
        self._recorder.send("set_tag", key=key, value=str(value))

    def end(self, status: str = "FINISHED") -> None:
        """End the run with `status` and wait until the recorder has written everything."""
        if self.ended:
            return
        self.ended = True
        self._send_metrics()
        self._recorder.send("end", status=status)
        self._recorder.close()
        if self._recorder.error is not None:
            raise TrackingError(f"MLflow could not record the run (tracking.uri={self.cfg.uri}): {self._recorder.error}")


def _widen(fd: int) -> None:
    """Room for 1 MiB of calls in the pipe (Linux; 64 KiB elsewhere), so the run writes on while
    the recorder still imports MLflow: a run's first calls (params, dataset, config) take ~30 KB.
    With the pipe full the run waits for the recorder, as it would wait on MLflow in-process."""
    try:
        import fcntl  # POSIX only (ImportError below)

        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, 1 << 20)
    except (ImportError, AttributeError, OSError):  # not Linux, or above /proc/sys/fs/pipe-max-size
        pass


def snapshot(folder) -> str:
    """A copy of `folder` as it is now, as hard links (no data copied; a copy where the file
    system has none), beside it: `.<name>.logging-<n>`. The run replaces such folders whole
    (framework.checkpoints.state.save writes new files), so the links keep the contents of now."""
    folder = Path(folder).absolute()
    snap = Path(tempfile.mkdtemp(prefix=f".{folder.name}.logging-", dir=folder.parent))
    try:
        shutil.copytree(folder, snap, copy_function=_link_or_copy, dirs_exist_ok=True)
    except BaseException:
        shutil.rmtree(snap, ignore_errors=True)
        raise
    return str(snap)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


# ---- the recorder's side ---------------------------------------------------------------------

CALLS = ("log_params", "log_dataset_records", "log_metric_records", "flush", "log_artifact", "set_tag")


def _serve(req_fd: int, rep_fd: int) -> None:
    """The recorder's life: do each call the run sends, in order; exit when the run ends it or
    goes away. Never returns (a forked copy must not run its parent's code on exit)."""
    code = 0
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the run process handles Ctrl-C and SIGTERM
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        replies = os.fdopen(rep_fd, "wb", buffering=0)
        _warm_up()
        gc.freeze()  # the run process turned collection off for start-up (framework.cli)
        gc.enable()
        _loop(os.fdopen(req_fd, "rb"), replies)
    except BaseException:  # a bug here: say so, and let the run find no reply
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stderr.flush()
        finally:
            os._exit(code)


def _warm_up() -> None:
    """Import what MLflow needs before the run asks for it (no file is touched)."""
    import mlflow  # noqa: F401  (mlflow: start-up; the recorder imports it beside the run)
    import mlflow.store.tracking.sqlalchemy_store  # noqa: F401
    import mlflow.tracking  # noqa: F401


def _loop(requests, replies) -> None:
    def reply(**msg) -> None:
        sys.stderr.flush()  # what the recorder printed comes before the run's next line
        try:
            replies.write(json.dumps(msg).encode() + b"\n")
        except BrokenPipeError:
            pass

    tracker: MlflowTracker | None = None
    failed = False
    for line in requests:
        msg = json.loads(line)
        op = msg.pop("op")
        if failed and op != "end":
            if op == "log_artifacts":  # a snapshot, made for this call alone
                shutil.rmtree(msg["folder"], ignore_errors=True)
            continue
        try:
            if op == "start":
                cfg = OmegaConf.create(msg.pop("cfg"))
                tracker = MlflowTracker(cfg, **msg)
                reply(run_id=tracker.run_id, experiment_id=tracker.experiment_id)
            elif op == "end":
                if tracker is not None:  # a run whose records broke off is no finished run
                    tracker.end("FAILED" if failed else msg["status"])
                reply(ended=True)
                return
            elif op == "log_artifacts":  # always a snapshot (`snapshot`): removed once logged
                try:
                    tracker.log_artifacts(msg["folder"], msg["artifact_path"])
                finally:
                    shutil.rmtree(msg["folder"], ignore_errors=True)
            elif op in CALLS:
                getattr(tracker, op)(**msg)
            else:
                raise ValueError(f"unknown call {op!r}")
        except Exception as e:
            failed = True
            reply(error=f"{type(e).__name__}: {e}")
    # the run process went away without ending its run (SIGKILL, the OOM killer)
    if tracker is not None and not tracker.ended:
        try:
            tracker.set_tag("pipelab.reaped", f"the run's process ended without closing the run (killed?); its recorder {os.getpid()} closed it")
            tracker.end("FAILED")
        except Exception as e:
            print(f"warning: could not close MLflow run {tracker.run_id} after its process ended: {e}", file=sys.stderr)
