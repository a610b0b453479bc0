"""Shipped per-cut profile tables: measured training times of a model on named real devices.

Papers publish (or their code ships) how long one training iteration of a model's first `l`
units takes on an edge device, and of the remaining units on a server, for every cut `l`. Such a
table lives in `conf/profile_tables/<name>.yaml`:

    model: resnet50          units: 19          batch: 32
    iteration_s:
      prefix: {pi4b: [...], tx2: [...]}   # units [0, l) on that device, l = 1..units
      suffix: {rtx2080ti: [...]}          # units [l, units), l = 1..units (0 at l = units)
    feature_MB: [...]                     # optional: fp32 output of unit l (MB = 2^20 bytes)
    compress_s: {pi4b: [...]}             # optional: seconds to quantize that feature

The `table` device time model (framework.cluster) prices a unit range from one column: a prefix
column prices [a, b) as prefix(b) - prefix(a), a suffix column as suffix(a) - suffix(b) (the rows
are measured cumulatively, so these differences are what the table knows; a negative
difference of a non-monotone measured row counts as 0). The iteration's seconds split into
forward (`forward_fraction`, default 1/3: backward costs about twice the forward) and backward;
the optimizer step is inside the measured iteration and costs nothing extra. Other batch sizes
scale linearly (an approximation the tables cannot refine).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from framework.config import knobs
from framework.config.schemas import DeviceConfig
from framework.errors import ConfigError

TABLE_DIR = Path(__file__).resolve().parent.parent / "conf" / "profile_tables"


def table_names() -> list[str]:
    return sorted(p.stem for p in TABLE_DIR.glob("*.yaml"))


@dataclass(frozen=True)
class ProfileTable:
    name: str
    model: str
    units: int
    batch: int
    prefix: dict  # device -> [seconds of units [0, l)] for l = 1..units
    suffix: dict  # device -> [seconds of units [l, units)] for l = 1..units
    feature_MB: tuple = ()
    compress_s: dict | None = None

    @property
    def devices(self) -> list[str]:
        return sorted(self.prefix) + sorted(self.suffix)

    def side(self, device: str) -> str:
        if device in self.prefix:
            return "prefix"
        if device in self.suffix:
            return "suffix"
        raise KeyError(device)

    def cumulative(self, device: str, l: int) -> float:
        """Seconds of the table's cumulative row at cut `l` (0 <= l <= units) for `device`."""
        if device in self.prefix:
            return 0.0 if l == 0 else float(self.prefix[device][l - 1])
        row = self.suffix[device]
        if l == 0:
            raise ValueError(f"profile table {self.name!r} has no row for all {self.units} units on {device!r} (a suffix column starts at cut 1)")
        return float(row[l - 1])

    def iteration_seconds(self, device: str, start: int, stop: int) -> float:
        """Seconds of one training iteration (forward + backward, at `batch`) of units [start, stop)."""
        if device in self.prefix:
            return max(0.0, self.cumulative(device, stop) - self.cumulative(device, start))
        return max(0.0, self.cumulative(device, start) - (0.0 if stop == self.units else self.cumulative(device, stop)))


def _floats(xs, where: str) -> list[float]:
    try:
        return [float(x) for x in xs]
    except (TypeError, ValueError):
        raise ConfigError(where, f"{xs!r} is not a list of numbers") from None


@lru_cache(maxsize=None)
def load(name: str) -> ProfileTable:
    """The shipped table `name` (ConfigError naming the choices if there is none)."""
    path = TABLE_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError("table", f"no profile table {name!r}; choices: {', '.join(table_names())}")
    raw = yaml.safe_load(path.read_text())
    units = int(raw["units"])
    where = f"conf/profile_tables/{name}.yaml"
    cols = {}
    for side in ("prefix", "suffix"):
        cols[side] = {}
        for dev, row in (raw["iteration_s"].get(side) or {}).items():
            vals = _floats(row, f"{where}: iteration_s.{side}.{dev}")
            if len(vals) != units:
                raise ConfigError(f"{where}: iteration_s.{side}.{dev}", f"has {len(vals)} rows, the table {units} units")
            cols[side][dev] = tuple(vals)
    compress = {d: tuple(_floats(r, f"{where}: compress_s.{d}")) for d, r in (raw.get("compress_s") or {}).items()} or None
    return ProfileTable(name, str(raw["model"]), units, int(raw["batch"]), cols["prefix"], cols["suffix"],
                        tuple(_floats(raw.get("feature_MB") or [], f"{where}: feature_MB")), compress)


def device_table(cfg, name: str, num_units: int | None) -> ProfileTable:
    """The table a `time_model: table` device names, checked against the device and the model."""
    where = f"cluster.devices.{name}"
    if not cfg.table:
        raise ConfigError(f"{where}.table", f"time_model=table needs a profile table; choices: {', '.join(table_names())}")
    try:
        table = load(cfg.table)
    except ConfigError as e:
        raise ConfigError(f"{where}.table", e.message) from None
    if cfg.table_device not in table.devices:
        raise ConfigError(f"{where}.table_device", f"{cfg.table_device!r} is not a column of profile table {cfg.table!r}; choices: {', '.join(table.devices)}")
    if num_units is not None and num_units != table.units:
        raise ConfigError(f"{where}.table", f"profile table {cfg.table!r} prices a {table.units}-unit {table.model}, but the model has {num_units} units")
    knobs.check({"forward_fraction": cfg.forward_fraction}, DeviceConfig, where)  # also checked before the run (validate_knobs)
    return table


def work_seconds(table: ProfileTable, cfg, kind: str, start: int, stop: int, batch: int) -> float:
    """Seconds of a forward ('fwd') or backward ('bwd') of units [start, stop) at `batch`; the
    step is part of the measured iteration (0)."""
    if kind == "step":
        return 0.0
    try:
        it = table.iteration_seconds(cfg.table_device, start, stop)
    except ValueError as e:
        raise ConfigError("cluster.devices", str(e)) from None
    share = float(cfg.forward_fraction) if kind == "fwd" else 1.0 - float(cfg.forward_fraction)
    return cfg.slowdown * it * share * batch / table.batch
