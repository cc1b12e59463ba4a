"""Start-up hook of `gpuremote run`: route `import cupy` to gpuremote, then chain to the
sitecustomize this one shadows (if any), so the environment's own start-up code still runs."""

import importlib.util
import os
import sys


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if not entry or os.path.abspath(entry) == here:
            continue
        candidate = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_gpuremote_chained_sitecustomize", candidate)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return


try:
    from gpuremote.hook import install
    install()
except Exception as exc:  # a broken hook must not stop the user's program from starting
    print(f"gpuremote: could not install the cupy import hook: {exc}", file=sys.stderr)
_chain()
