"""gpuremote.cupy: a drop-in for `import cupy` whose arrays live on a gpuremote device.

The namespace is generated from the surface table (gpuremote/surface.py): every module
function forwards to the daemon. Creation from host data (array, asarray) uploads; asnumpy
downloads. Dtype objects and dtype helpers are NumPy's, as in CuPy. This package never
imports cupy.
"""

from __future__ import annotations

import builtins as _builtins
import functools as _functools

import numpy as _np
from numpy import (bool_, byte, ubyte, short, ushort, intc, uintc, int_, uint, longlong, ulonglong,  # noqa: F401
                   int8, int16, int32, int64, uint8, uint16, uint32, uint64, intp, uintp, float16,
                   float32, float64, half, single, double, complex64, complex128, csingle, cdouble,
                   dtype, finfo, iinfo, can_cast, promote_types, min_scalar_type, issubdtype,
                   isscalar, newaxis, pi, e, inf, nan, euler_gamma, generic, number, integer,
                   signedinteger, unsignedinteger, floating, complexfloating, inexact)

from gpuremote.cupy import _namespace
from gpuremote.cupy._core import forward as _forward, from_host as _from_host, ndarray, to_device as _to_device
from gpuremote.cupy._kernel import ElementwiseKernel, RawKernel, RawModule, ReductionKernel  # noqa: F401
from gpuremote import __version__ as _gpuremote_version
from gpuremote.errors import OutOfMemoryError  # noqa: F401

# The CuPy API level the surface table forwards, tagged with gpuremote's own version: code that
# reads cupy.__version__ to choose a code path finds the CuPy it is written for. 14: type
# promotion is NumPy 2's (NEP 50), as in CuPy 14 (CuPy 13 promoted scalars by value).
__version__ = f"14.0.0+gpuremote.{_gpuremote_version}"

bool = _np.bool_  # noqa: A001  (cupy.bool, as in NumPy 2)

_HOST_CREATION = frozenset({"copy", "ascontiguousarray", "asfortranarray"})
_names = _namespace.populate(globals(), "", skip=_HOST_CREATION)
_namespace.add_ufunc_methods(globals())


def _holds_device_array(obj, depth: int = 0) -> bool:
    return type(obj) is ndarray or (type(obj) in (list, tuple) and depth < 32       # (any: this module's)
                                     and _builtins.any(_holds_device_array(o, depth + 1) for o in obj))


def _host(convert, obj, **kwargs):
    """convert(obj) for host data; None for a list or tuple holding device arrays (NumPy refuses to
    convert those, and only then is the list searched for them)."""
    try:
        return convert(obj, **kwargs)
    except TypeError:
        if type(obj) in (list, tuple) and _holds_device_array(obj):
            return None
        raise


def _stack_nested(obj):
    """A list or tuple holding device arrays, at any depth, as one device array (as CuPy builds
    it): stacked on the device, host items uploaded first."""
    return stack([_stack_nested(o) if type(o) in (list, tuple) else asarray(o) for o in obj])  # noqa: F821


def _order(order):
    """An order argument as one upper-case letter (NumPy and CuPy take 'f' for 'F'); None stays None."""
    if order is None:
        return None
    if not isinstance(order, str) or order.upper() not in ("C", "F", "A", "K"):
        raise ValueError(f"order must be one of 'C', 'F', 'A' or 'K', not {order!r}")
    return order.upper()


def _uploaded(host, order):
    """Host array `host` on the current device, in the order asked ("F", or "K"/"A"/None keeping a
    Fortran-ordered host array's layout): uploads are C-ordered, so a Fortran one is laid out again."""
    order = _order(order)
    out = _from_host(host)
    fortran = order == "F" or (order in ("K", "A", None) and host.ndim > 1 and host.flags.f_contiguous
                               and not host.flags.c_contiguous)
    return _forward("asfortranarray", (out,), {}) if fortran and host.ndim > 1 else out


def _here(a):
    """Device array `a`, moved to the current device when it lives on another (as CuPy's array and
    asarray do: its documented way to move data between devices); None when it is already there."""
    index = cuda.runtime.getDevice()
    return _to_device(a, index) if a._gr_device != index else None


def array(obj, dtype=None, copy=True, order="K", subok=False, ndmin=0):
    """An array on the current device from host data (list, numpy array, scalar) or from a device
    array (copied from another device when it lives there)."""
    order = _order(order)
    if type(obj) is not ndarray:
        host = _host(_np.array, obj, dtype=dtype, ndmin=ndmin)
        if host is not None:
            return _uploaded(host, order)
        obj, copy = _stack_nested(obj), False
    moved = _here(obj)
    if moved is not None:
        obj, copy = moved, False
    out = obj.astype(dtype) if dtype is not None else (_forward("copy", (obj,), {}) if copy else obj)
    if ndmin > out.ndim:
        out = out.reshape((1,) * (ndmin - out.ndim) + out.shape)
    if order == "F" and out.ndim > 1 and not out.flags.f_contiguous:
        out = _forward("asfortranarray", (out,), {})
    return out


def asarray(a, dtype=None, order=None):
    """`a` itself when it is already a device array of that dtype on the current device, else a
    device copy (moved from another device when it lives there)."""
    order = _order(order)
    if type(a) is not ndarray:
        host = _host(_np.asarray, a, dtype=dtype)
        if host is not None:
            return _uploaded(host, order)
        a = _stack_nested(a)
    moved = _here(a)
    a = a if moved is None else moved
    out = a if dtype is None or _np.dtype(dtype) == a.dtype else a.astype(dtype)
    if order == "F" and out.ndim > 1 and not out.flags.f_contiguous:
        out = _forward("asfortranarray", (out,), {})
    return out


def asanyarray(a, dtype=None, order=None):
    return asarray(a, dtype, order)


def copy(a, order="K"):
    """A copy on the current device (moved there from another device, as CuPy does)."""
    if type(a) is not ndarray:
        return _uploaded(_np.array(a, order=order), order)
    moved = _here(a)
    return moved if moved is not None else _forward("copy", (a,), {} if order == "K" else {"order": order})


def ascontiguousarray(a, dtype=None):
    return _forward("ascontiguousarray", (a,), {} if dtype is None else {"dtype": dtype}) \
        if type(a) is ndarray else _from_host(_np.ascontiguousarray(a, dtype=dtype))


def asfortranarray(a, dtype=None):
    return _forward("asfortranarray", (a,), {} if dtype is None else {"dtype": dtype}) \
        if type(a) is ndarray else _from_host(_np.asfortranarray(a, dtype=dtype))


_linspace = linspace  # noqa: F821  (made by _namespace.populate above)


def linspace(start, stop, num=50, endpoint=True, retstep=False, dtype=None, axis=0):
    """Evenly spaced numbers; with retstep=True also the spacing, as (array, step) like CuPy.

    The array comes from the device; the step is computed here, as CuPy does on its host
    ((stop - start) / (num - 1 or num); NaN when undefined), so no second result is needed.
    """
    kwargs = {"endpoint": endpoint}
    if dtype is not None:
        kwargs["dtype"] = dtype
    if axis != 0:
        kwargs["axis"] = axis
    out = _linspace(start, stop, num, **kwargs)
    if not retstep:
        return out
    div = (num - 1) if endpoint else num
    step = (stop - start) / div if div > 0 else float("nan")
    return out, step


def asnumpy(a, stream=None, order="C", out=None, blocking=True):
    """A numpy.ndarray with `a`'s contents (D2H for device arrays; see ndarray.get for `blocking`)."""
    if type(a) is ndarray:
        return a.get(stream=stream, order=order, out=out, blocking=blocking)
    if out is not None:
        out[...] = a
        return out
    return _np.asarray(a, order=order)


def is_available() -> bool:
    """True when a gpuremote device is reachable (cupy.is_available)."""
    return cuda.is_available()


def show_config() -> None:
    """What this process runs on: gpuremote's version, and each device with its daemon."""
    from gpuremote.client import context
    print(f"gpuremote.cupy {__version__} (NumPy {_np.__version__})")
    for i, ref in enumerate(context.devices()):
        print(f"  device {i}: {ref.session.address} device {ref.remote_index}")


def get_array_module(*args):
    """This module when any argument is a device array, else numpy (as cupy.get_array_module)."""
    import sys
    for a in args:
        if type(a) is ndarray:
            return sys.modules[__name__]
    return _np


def _as_dtype_like(x):
    return _np.empty(0, x.dtype) if type(x) is ndarray else x


def result_type(*arrays_and_dtypes):
    return _np.result_type(*(_as_dtype_like(x) for x in arrays_and_dtypes))


def shape(a):
    return a.shape if type(a) is ndarray else _np.shape(a)


def ndim(a):
    return a.ndim if type(a) is ndarray else _np.ndim(a)


def size(a, axis=None):
    if type(a) is ndarray:
        return a.size if axis is None else a.shape[axis]
    return _np.size(a, axis)


def __getattr__(attr):
    if attr in ("linalg", "fft", "random", "cuda", "testing", "lib"):
        import importlib
        return importlib.import_module(f"{__name__}.{attr}")
    raise _namespace.unknown_attribute(__name__, attr)


from gpuremote.cupy import cuda, fft, linalg, random  # noqa: E402,F401  (after the names they use)
from gpuremote.cupy.cuda.memory import get_default_memory_pool, get_default_pinned_memory_pool  # noqa: E402,F401


def fuse(*args, **kwargs):
    """cupy.fuse, as `@fuse`, `@fuse()` or `@fuse(kernel_name=...)`: the function runs as written, its
    operations forwarded one by one as any others (the daemon does not fuse them into one kernel), so
    the results are those of the unfused function, which are CuPy's."""
    def decorate(function):
        @_functools.wraps(function)
        def fused(*a, **kw):
            return function(*a, **kw)
        return fused
    if len(args) == 1 and callable(args[0]) and not kwargs:
        return decorate(args[0])
    if args:
        raise TypeError("fuse() takes keyword arguments only (kernel_name), or the function to decorate")
    return decorate
from gpuremote.cupy._composed import *  # noqa: E402,F401,F403  (names built from forwarded ops)
