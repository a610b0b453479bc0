"""An Optuna study kept in a database (`hydra.sweeper.storage=sqlite:///study.db` or
`postgresql://...`), so several sweeps, on one machine or many, share it: each asks the study for
its next trial and sees every other worker's results.

hydra-optuna-sweeper 1.3.0 pins optuna 2.10, whose database storage stamps its schema version
with alembic on a connection it never commits; under SQLAlchemy 2 (which MLflow 3.17 installs)
that stamp is rolled back and the next check fails (`AssertionError` in `get_current_version`),
on every fresh storage. `StudyStorage`, a Hydra callback (conf/config.yaml), prepares the storage
before the sweeper opens it: the tables, the committed stamp and optuna's version row, one
process at a time (workers that start together would otherwise race to create the tables), so
optuna finds a storage it made itself and carries on. A storage that cannot be opened is one
`error: hydra.sweeper.storage: ...` line and exit status 2, before any trial runs.
"""

from __future__ import annotations

import logging
import os
import sys
import zlib
from contextlib import contextmanager
from pathlib import Path

from omegaconf import OmegaConf

from framework.errors import one_line
from framework.tracking.store import _store_creation_lock

try:
    from hydra.experimental.callback import Callback
except ImportError:  # pragma: no cover
    Callback = object


class StudyStorage(Callback):
    """Before a sweep with `hydra.sweeper.storage` set: a database the Optuna sweeper can open."""

    def on_multirun_start(self, config, **kwargs) -> None:
        url = OmegaConf.select(config, "hydra.sweeper.storage", default=None)
        if not url or not isinstance(url, str):  # no storage (an in-memory study), or not Optuna's sweeper
            return
        try:
            prepare(url)
        except Exception as e:
            print(f"error: hydra.sweeper.storage: {url!r}: Optuna cannot open a study there: {one_line(e)}", file=sys.stderr)
            sys.exit(2)


def prepare(url: str) -> None:
    """Create Optuna's tables in the database at `url`, stamp their schema version (committed) and
    write optuna's version row; a storage that has them already is left as it is."""
    import optuna  # start-up: only a sweep with a storage imports it
    import sqlalchemy
    from alembic.migration import MigrationContext
    from optuna.storages._rdb import models  # the schema of optuna's RDB storage (optuna<3, pinned)

    if url.startswith("sqlite:///"):
        Path(url[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)  # its INFO lines ("setup plugin ...") would reach Hydra's log
    engine = sqlalchemy.create_engine(url)
    try:
        with _one_at_a_time(url, engine):
            with engine.begin() as conn:  # committed on leaving the block (optuna 2.10's own stamp is not)
                models.BaseModel.metadata.create_all(conn)
                ctx = MigrationContext.configure(conn)
                if ctx.get_current_revision() is None:
                    script = _alembic_script(models)
                    ctx.stamp(script, script.get_current_head())
            optuna.storages.RDBStorage(url)  # its version row, and its check that the schema is current
    finally:
        engine.dispose()


def _alembic_script(models):
    from alembic.config import Config  # start-up: only preparing a study's storage needs alembic
    from alembic.script import ScriptDirectory

    here = os.path.dirname(models.__file__)
    cfg = Config(os.path.join(here, "alembic.ini"))
    cfg.set_main_option("script_location", os.path.join(here, "alembic").replace("%", "%%"))
    return ScriptDirectory.from_config(cfg)


@contextmanager
def _one_at_a_time(url: str, engine):
    """One process at a time prepares a storage: an flock on a SQLite file's folder (as MLflow's
    store, framework.tracking.store), a session advisory lock on PostgreSQL. Other databases:
    start one worker first."""
    if url.startswith("sqlite:///"):
        with _store_creation_lock(url):
            yield
        return
    if engine.dialect.name != "postgresql":
        yield
        return
    key = zlib.crc32(b"pipelab optuna storage") & 0x7FFFFFFF
    with engine.connect() as conn:
        conn.exec_driver_sql(f"SELECT pg_advisory_lock({key})")
        conn.commit()
        try:
            yield
        finally:
            conn.exec_driver_sql(f"SELECT pg_advisory_unlock({key})")
            conn.commit()
