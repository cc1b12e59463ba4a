"""cupyx for gpuremote: pinned host buffers, scatter_add/max/min (the ufuncs' `at`), rsqrt, the
scipy.special basics and profiler (benchmark, time_range).

Pinned buffers live in page-aligned shared memory (memfd segments, reused once dropped): a
daemon on the same host maps them, so an upload from one is a single copy, read in place by the
daemon (gpuremote/transport/shm.py). With a remote daemon they are ordinary aligned host arrays.
"""

from __future__ import annotations

import numpy

import gpuremote.cupy as _cupy
from gpuremote.cupyx import profiler, scipy  # noqa: F401
from gpuremote.transport.buffers import pinned as _pinned


def empty_pinned(shape, dtype=float, order="C") -> numpy.ndarray:
    return _pinned(shape, dtype, order)


def zeros_pinned(shape, dtype=float, order="C") -> numpy.ndarray:
    out = _pinned(shape, dtype, order)
    out.fill(0)          # a reused buffer holds its last user's bytes
    return out


def empty_like_pinned(a, dtype=None, order="K", subok=None, shape=None) -> numpy.ndarray:
    return _pinned(a.shape if shape is None else shape, a.dtype if dtype is None else dtype,
                   "F" if order == "F" or (order in ("A", "K") and numpy.isfortran(a)) else "C")


def zeros_like_pinned(a, dtype=None, order="K", subok=None, shape=None) -> numpy.ndarray:
    out = empty_like_pinned(a, dtype, order, subok, shape)
    out.fill(0)
    return out


def scatter_add(a, slices, value) -> None:
    """a[slices] += value, each index as often as it occurs (cupy.add.at)."""
    _cupy.add.at(a, slices, value)


def scatter_max(a, slices, value) -> None:
    """a[slices] = maximum(a[slices], value), index by index (cupy.maximum.at)."""
    _cupy.maximum.at(a, slices, value)


def scatter_min(a, slices, value) -> None:
    """a[slices] = minimum(a[slices], value), index by index (cupy.minimum.at)."""
    _cupy.minimum.at(a, slices, value)


def get_array_module(*args):
    from gpuremote.cupy import get_array_module as _gam
    return _gam(*args)


def rsqrt(x, out=None):
    """1 / sqrt(x), elementwise (cupyx.rsqrt): two forwarded ufuncs, sqrt then reciprocal, where
    CuPy runs one kernel. The dtype is sqrt's, as CuPy's loops give it (float16/32/64 and complex;
    an integer or bool array becomes float); 0 gives inf, a negative real NaN."""
    root = _cupy.sqrt(x)
    return _cupy.reciprocal(root) if out is None else _cupy.reciprocal(root, out=out)
