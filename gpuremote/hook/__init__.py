"""Import interception: `import cupy` (and `cupyx`) resolve to gpuremote's modules.

`gpuremote run` puts gpuremote/hook/site on PYTHONPATH; its sitecustomize calls `install()`
at interpreter start-up in the command and in every Python process it starts (the
environment is inherited), then runs any sitecustomize that was there before. The same
pattern as opentelemetry-instrument and ddtrace-run.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

ALIASES = {"cupy": "gpuremote.cupy", "cupyx": "gpuremote.cupyx"}


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec):
        return importlib.import_module(self.target)

    def exec_module(self, module):
        pass  # the target module is already executed


class CupyAliasFinder(importlib.abc.MetaPathFinder):
    """Serves `cupy[.x]` from `gpuremote.cupy[.x]` (the same module objects, not copies)."""

    def find_spec(self, fullname, path, target=None):
        root, _, rest = fullname.partition(".")
        if root not in ALIASES:
            return None
        target_name = ALIASES[root] + ("." + rest if rest else "")
        if importlib.util.find_spec(target_name) is None:
            return None
        is_package = hasattr(importlib.import_module(target_name), "__path__")
        return importlib.util.spec_from_loader(fullname, _AliasLoader(target_name), is_package=is_package)


def install() -> None:
    """Make `import cupy` resolve to gpuremote.cupy in this interpreter (idempotent)."""
    if not any(isinstance(f, CupyAliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, CupyAliasFinder())
    for name in [m for m in sys.modules if m.partition(".")[0] in ALIASES]:
        del sys.modules[name]  # a real cupy imported before us must not shadow the shim
