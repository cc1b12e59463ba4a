"""cupyx for gpuremote: pinned host buffers and the scipy.special basics.

Pinned buffers are ordinary page-aligned host arrays here: the transfer path, not the page
lock, decides the copy cost over the network.
"""

from __future__ import annotations

import numpy

from gpuremote.cupyx import scipy  # noqa: F401


def empty_pinned(shape, dtype=float, order="C") -> numpy.ndarray:
    return numpy.empty(shape, dtype=dtype, order=order)


def zeros_pinned(shape, dtype=float, order="C") -> numpy.ndarray:
    return numpy.zeros(shape, dtype=dtype, order=order)


def empty_like_pinned(a, dtype=None, order="K", subok=None, shape=None) -> numpy.ndarray:
    return numpy.empty(a.shape if shape is None else shape, dtype=a.dtype if dtype is None else dtype)


def zeros_like_pinned(a, dtype=None, order="K", subok=None, shape=None) -> numpy.ndarray:
    return numpy.zeros(a.shape if shape is None else shape, dtype=a.dtype if dtype is None else dtype)


def get_array_module(*args):
    from gpuremote.cupy import get_array_module as _gam
    return _gam(*args)
