"""`kernels` for the codec modules: plugins/compressors/kernels.py, imported (with numba, ~0.5 s)
on the first attribute looked up, that is at the first encode or decode. Building a compressor,
listing plugins and timing-only runs never pay for it."""

from __future__ import annotations

import importlib
from types import ModuleType


class _Lazy:
    _module: ModuleType | None = None

    def __getattr__(self, name: str):
        if _Lazy._module is None:
            _Lazy._module = importlib.import_module("plugins.compressors.kernels")
        return getattr(_Lazy._module, name)


kernels = _Lazy()
