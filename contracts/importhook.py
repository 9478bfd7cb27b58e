"""Run code around the first import of one module (its ``exec_module``), without importing it before
something else does: ``around(fullname, wrap)`` where ``wrap(exec_module, module)`` must call
``exec_module(module)``. Used for Prefect's server module (patched once loaded: flows.signals) and for torch
(imported with the stop signals deferred: contracts.shutdown). Each module is wrapped at most once per
process; a module already imported is the caller's to handle (``sys.modules``)."""
from __future__ import annotations

import importlib.abc
import sys
from typing import Any, Callable

Wrap = Callable[[Callable[[Any], None], Any], None]


class _AroundImport(importlib.abc.MetaPathFinder):
    def __init__(self, fullname: str, wrap: Wrap) -> None:
        self.fullname, self.wrap = fullname, wrap

    def find_spec(self, fullname, path, target=None):
        if fullname != self.fullname:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None) if finder is not self else None
            spec = find(fullname, path, target) if find else None
            if spec is not None:
                break
        else:
            return None
        exec_module = getattr(spec.loader, "exec_module", None)
        if exec_module is None:
            return spec
        wrap = self.wrap
        spec.loader.exec_module = lambda module: wrap(exec_module, module)  # this spec's own loader instance
        return spec


def around(fullname: str, wrap: Wrap) -> None:
    if not any(isinstance(f, _AroundImport) and f.fullname == fullname for f in sys.meta_path):
        sys.meta_path.insert(0, _AroundImport(fullname, wrap))
