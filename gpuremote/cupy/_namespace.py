"""Builds module-level functions of gpuremote.cupy and its submodules from the surface table."""

from __future__ import annotations

from gpuremote.cupy._core import compiled_call, elementwise_fast, forward, ufunc_inputs
from gpuremote.surface import SURFACE, module_names


def make_function(name: str):
    entry = SURFACE[name]
    fast, inputs = compiled_call(name, entry), ufunc_inputs(name, entry)
    nin = inputs if inputs > 0 and entry.nout == 1 else 0
    if nin:  # ufuncs take the hot path unless given outputs (by position or keyword)
        def function(*args, **kwargs):
            if fast is not None:
                result = fast(name, args, kwargs, inputs, False)
                if result is not None:
                    return result
            if not kwargs and len(args) <= nin:
                result = elementwise_fast(name, entry, args)
                if result is not None:
                    return result
            return forward(name, args, kwargs, entry)
    else:
        def function(*args, **kwargs):
            if fast is not None:
                result = fast(name, args, kwargs, inputs, False)
                if result is not None:
                    return result
            return forward(name, args, kwargs, entry)

    function.__name__ = entry.attr
    function.__qualname__ = entry.attr
    function.__doc__ = f"Runs on the gpuremote device with numpy.{name} / cupy.{name} semantics."
    return function


def populate(namespace: dict, prefix: str = "", skip: frozenset = frozenset()) -> list[str]:
    """Add a forwarding function for every surface name under `prefix` not in `skip`; return the names."""
    names = [n for n in module_names(prefix) if n not in skip]
    for n in names:
        namespace[n] = make_function(prefix + n)
    return names


def unknown_attribute(module: str, attr: str) -> AttributeError:
    return AttributeError(f"module {module!r} has no attribute {attr!r}: gpuremote forwards only the CuPy names "
                          "listed in its surface table (gpuremote/surface.py)")
