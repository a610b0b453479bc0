"""Built-in schedulers: one package per system, each declaring its schedulers in its own
`__init__` (framework.registry.declare: names, schemas and docs; the code is imported when a
scheduler is built). Importing this package imports every one of them, so a new system is one
folder here plus its YAML in conf/scheduler/ (docs: "Add a system")."""

import importlib
import pkgutil

for _system in sorted(m.name for m in pkgutil.iter_modules(__path__) if m.ispkg):
    importlib.import_module(f"{__name__}.{_system}")
