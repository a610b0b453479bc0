"""`python -m framework.worker role=<name> [overrides]`: run one role of a run elsewhere.

    python -m framework.worker role=stage1 runtime.run_id=r1a2b3 \\
        transport.broker.host=192.168.1.10 transport.broker.port=1883

The role joins the run through the broker, receives the run's config, the coordinator's plan
and the initial weights from the coordinator (`python -m framework runtime=remote ...`), runs its program and
reports back. Only transport settings and the run id are needed here; everything else comes
from the coordinator. `runtime=local` starts these processes itself.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf, open_dict

from framework import registry
from framework.config import input_errors
from framework.config.dirs import CONF_DIR
from framework.errors import PipelabError, one_line
from framework.runtime.allocator import tune_malloc
from framework.runtime.role_process import TRANSPORT_FAILED_EXIT, run_role
from framework.runtime.transport import TransportError


def parse(argv: list[str]) -> tuple[str, list[str]]:
    role, rest = None, []
    for a in argv:
        if a.startswith("role="):
            role = a.split("=", 1)[1]
        elif a in ("-h", "--help"):
            print(__doc__)
            sys.exit(0)
        else:
            rest.append(a)
    if not role:
        print("error: role=<name> is required (the coordinator prints each role's command)", file=sys.stderr)
        sys.exit(2)
    return role, rest


def main(argv: list[str] | None = None) -> int:
    role, overrides = parse(sys.argv[1:] if argv is None else argv)
    registry.load_plugins()
    if not any(o.startswith("transport=") for o in overrides):
        overrides = ["transport=mqtt", *overrides]
    if not any(o.startswith("runtime=") for o in overrides):
        overrides = ["runtime=remote", *overrides]
    problem = input_errors.override_problem(overrides)
    if problem:
        print(f"error: {one_line(problem)}", file=sys.stderr)
        return 2
    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            cfg = compose(config_name="config", overrides=overrides)
    except Exception as e:  # Hydra's errors composing the config: one line, as the CLI says them
        line = None if os.environ.get("HYDRA_FULL_ERROR") == "1" else input_errors.hydra_problem(e, overrides)
        if line is None:
            raise
        print(f"error: {one_line(line)}", file=sys.stderr)
        return 2
    try:
        if not cfg.runtime.get("run_id"):
            raise PipelabError("runtime.run_id: required; the coordinator prints it with each role's command")
        if cfg.runtime.get("tune_malloc", True):
            tune_malloc()
        network = registry.build("transport", cfg.transport)

        def build(config: dict, plan: dict):
            from framework.job import build_scheduler  # start-up: the role joins the run before it imports the job's modules (torch models, data)

            run_cfg = OmegaConf.create(config)
            with open_dict(run_cfg):
                run_cfg.runtime.progress = False
            return build_scheduler(run_cfg, role=role, plan=plan)

        signal.signal(signal.SIGTERM, lambda *_: os._exit(143))  # stopped by the coordinator: nothing to save
        return asyncio.run(run_role(network.endpoint(), cfg.runtime.run_id, role, build))
    except PipelabError as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return TRANSPORT_FAILED_EXIT if isinstance(e, TransportError) else 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
