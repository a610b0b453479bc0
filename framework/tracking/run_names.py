"""What an MLflow run is called: by what differs from the defaults, so a runs table tells its rows apart.

- a run: `<scheduler> <model> <cluster>` and the overrides the user gave, e.g.
  `gpipe lenet pi4_wifi cluster.devices.dev1.slowdown=4 train.iterations_per_epoch=20`; in a sweep,
  the overrides the sweep varies (its other overrides are the same in every job: the parent's note
  holds them);
- a sweep's parent: what it sweeps, e.g. `sweep scheduler=gpipe,1f1b · compressor=none,mbq`.

Overrides that change how a run is watched or recorded, not what it computes (`tracking.*`,
`hydra.*`, `hydra/launcher=...`, progress bars, threads, checkpoints), and a group choice the name
already says (`scheduler=gpipe` beside `gpipe ...`) are left out.
"""

from __future__ import annotations

from framework.config.schemas import swept_overrides

MAX_NAME = 250  # MLflow's UI shows about this much; the tag `pipelab.overrides` keeps them all
MAX_VALUE = 60  # one override's value in a name (a long list is cut with `...`)

# overrides that do not change what a run computes, by key prefix
NOISE = ("tracking.", "hydra.", "hydra/", "runtime.progress", "runtime.threads", "train.resume", "train.checkpoint")


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def noise(override: str) -> bool:
    """Whether an override changes only how the run is watched or recorded."""
    key = _key(override)
    return any(key == p.rstrip("./") or key.startswith(p) for p in NOISE)


def _short(override: str) -> str:
    """`+a.b=v` -> `a.b=v`, a long value cut to MAX_VALUE characters."""
    override = override.lstrip("+~")
    if "=" not in override:
        return override
    key, value = override.split("=", 1)
    if len(value) > MAX_VALUE:
        value = value[: MAX_VALUE - 3] + "..."
    return f"{key}={value}"


def run_name(scheduler: str, model: str, cluster: str, overrides: list[str], sweep_keys: set[str] | None = None) -> str:
    """A run's name: its scheduler, model and cluster, then the overrides that make it differ
    (a sweep's job: the ones the sweep varies)."""
    base = f"{scheduler} {model} {cluster}"
    said = {"scheduler": scheduler, "model": model, "cluster": cluster}
    if sweep_keys:
        chosen = swept_overrides(overrides, sweep_keys)  # as a sweep job's folder names them
    else:
        chosen = [o for o in overrides if "=" in o and not noise(o)]
    chosen = [o for o in chosen if said.get(_key(o)) != o.split("=", 1)[1]]  # `scheduler=gpipe`: the name says it
    return " ".join([base] + [_short(o) for o in chosen])[:MAX_NAME]


def sweep_name(overrides: list[str], swept: list[str], space: dict[str, str] | None = None) -> str:
    """A sweep parent's name: each swept key with its values, as the command line (or the
    sweeper's search space, `hydra.sweeper.params`) gives them."""
    given = {_key(o): o.split("=", 1)[1] for o in overrides if "=" in o}
    parts = []
    for key in swept:
        value = given.get(key, (space or {}).get(key))
        parts.append(f"{key}={value}" if value is not None else key)
    return ("sweep " + " · ".join(parts) if parts else "sweep")[:MAX_NAME]
