"""Builds module-level functions of gpuremote.cupy and its submodules from the surface table."""

from __future__ import annotations

import numpy

from gpuremote.cupy._core import compiled_call, elementwise_fast, forward, ndarray, ufunc_inputs
from gpuremote.surface import SURFACE, UFUNC_METHODS, module_names


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


def _ufunc_methods(name: str) -> dict:
    """reduce, accumulate, outer and at of the module function `name`, with NumPy's signatures."""
    def options(axis, **given):     # the axis always: its default is 0 here, None for sum and the like
        return {"axis": axis, **{k: v for k, v in given.items() if v is not None}}

    def reduce(array, axis=0, dtype=None, out=None, keepdims=False):
        return forward(f"{name}.reduce", (array,), options(axis, dtype=dtype, out=out, keepdims=keepdims or None))

    def accumulate(array, axis=0, dtype=None, out=None):
        return forward(f"{name}.accumulate", (array,), options(axis, dtype=dtype, out=out))

    def outer(A, B, **kwargs):
        return forward(f"{name}.outer", (A, B), kwargs)

    def at(a, indices, b=None):
        """In place, unbuffered: a[indices] = {name}(a[indices], b), each index as often as it occurs."""
        if type(a) is not ndarray:
            raise TypeError(f"{name}.at writes into a device array, not {type(a).__module__}.{type(a).__name__}")
        forward(f"{name}.at", (a, indices) if b is None else (a, indices, b), {})

    methods = {"reduce": reduce, "accumulate": accumulate, "outer": outer, "at": at}
    for attr, fn in methods.items():
        fn.__name__, fn.__qualname__ = attr, f"{name}.{attr}"
    return methods


_UFUNC_FACTS = ("nin", "nout", "nargs", "identity", "types", "signature", "ntypes")


def add_ufunc_methods(namespace: dict) -> None:
    """Give the module's binary ufuncs (surface.UFUNC_METHODS) their methods, cupy.add.at(x, i, v),
    and every function standing for a NumPy ufunc that ufunc's facts (cupy.add.nin, .nout,
    .identity, .types): code that inspects a ufunc before calling it works as with CuPy."""
    for name in UFUNC_METHODS:
        for attr, fn in _ufunc_methods(name).items():
            setattr(namespace[name], attr, fn)
    for name, fn in list(namespace.items()):
        ufunc = getattr(numpy, name, None)
        if isinstance(ufunc, numpy.ufunc) and callable(fn) and not isinstance(fn, numpy.ufunc):
            for fact in _UFUNC_FACTS:
                setattr(fn, fact, getattr(ufunc, fact))


def unknown_attribute(module: str, attr: str) -> AttributeError:
    return AttributeError(f"module {module!r} has no attribute {attr!r}: gpuremote forwards only the CuPy names "
                          "listed in its surface table (gpuremote/surface.py)")
