"""CuPy names built on the client from operations gpuremote already forwards.

Nothing here is a surface name of its own: each function composes forwarded calls (arange, empty,
item assignment, concatenate, ...), so its arrays stay on the device and the daemon's memory checks
see every allocation before it is made (`mgrid[0:10**12]` is an `arange` the daemon refuses, not a
host array). Where CuPy itself works on the host (files, text, frombuffer, fromiter), so does this
module: host data is uploaded and device arrays fetched, as CuPy does.

gpuremote/cupy/__init__.py imports this module last, once every name it calls exists there.
"""

from __future__ import annotations

import builtins
import collections.abc
import itertools
import math
import operator
import os

import numpy
from numpy.lib.array_utils import normalize_axis_index

import gpuremote.cupy as _cp    # still initialising when this runs: its names are looked up at call time
from gpuremote.cupy._core import ndarray
from gpuremote.errors import OutOfMemoryError

__all__ = [
    "mgrid", "ogrid", "r_", "c_", "s_", "index_exp",
    "fromfunction", "frombuffer", "fromiter",
    "tril_indices_from", "triu_indices_from", "diag_indices_from",
    "apply_along_axis", "piecewise",
    "iscomplexobj", "isrealobj", "isfortran", "common_type", "require", "asarray_chkfinite",
    "array_repr", "array_str",
    "save", "load", "savez", "savez_compressed", "NpzFile",
    "hanning", "hamming", "blackman", "bartlett", "kaiser",
    "ediff1d", "trapz", "isposinf", "isneginf", "sort_complex", "real_if_close",
    "polyadd", "polysub", "polymul", "roots",
    "fromfile", "fromstring", "loadtxt", "genfromtxt", "savetxt",
    "array2string", "format_float_positional", "format_float_scientific",
    "set_printoptions", "get_printoptions", "printoptions",
    "ndindex", "AxisError", "broadcast",
]


# ------------------------------------------------------------------------------------------
# index tricks
# ------------------------------------------------------------------------------------------

def _is_complex(x) -> bool:
    return isinstance(x, (complex, numpy.complexfloating))


def _slice_axis(key, what: str):
    """(start, step, size, values that decide the dtype) of one slice of an N-d grid, read as
    NumPy's nd_grid reads it: a complex step's magnitude is a number of points, stop included."""
    if not isinstance(key, slice):
        raise TypeError(f"{what}[...] takes slices (start:stop:step), not {type(key).__name__}")
    if key.stop is None:
        raise TypeError(f"{what}[...]: each slice needs a stop, got {key!r}")
    start = 0 if key.start is None else key.start
    step = 1 if key.step is None else key.step
    if _is_complex(step):
        size = int(abs(step))
        typing = abs(step)
        step = (key.stop - start) / float(size - 1) if size != 1 else 1
    else:
        size = math.ceil((key.stop - start) / step)
        typing = step
    return start, step, size, (start, key.stop, typing)


def _scaled(a, start, step):
    """a * step + start, skipped where it changes nothing (an index grid: the dtype already
    accounts for start and step, see _Grid)."""
    return a if step == 1 and start == 0 else a * step + start


def _along(a, axis: int, ndim: int):
    """1-D `a` reshaped to lie along `axis` of `ndim` axes (1 elsewhere), to broadcast."""
    return a.reshape((1,) * axis + (a.shape[0],) + (1,) * (ndim - axis - 1))


def _range_1d(key, what: str):
    """One slice: arange(start, stop, step), or for a complex step that many points from start
    to stop inclusive (as NumPy's mgrid and r_ make them)."""
    if not isinstance(key, slice):
        raise TypeError(f"{what}[...] takes slices (start:stop:step), not {type(key).__name__}")
    if key.stop is None:
        raise TypeError(f"{what}[...]: the slice needs a stop, got {key!r}")
    start = 0 if key.start is None else key.start
    if not _is_complex(key.step):
        return _cp.arange(start, key.stop) if key.step is None else _cp.arange(start, key.stop, key.step)
    length = int(abs(key.step))
    dtype = numpy.result_type(start, key.stop, abs(key.step))
    step = (key.stop - start) / float(length - 1) if length != 1 else 1
    return _cp.arange(0, length, 1, dtype=dtype) * step + start


def _dense_grid(axes: list, dtype):
    """The (len(axes), *sizes) array whose row i is start + step * index along axis i, for each
    (start, step, size) in `axes`: built as numpy.indices builds its grid (an empty array, row i
    assigned one arange broadcast along axis i), so the client knows its metadata and the device
    holds no full-size temporary. Row i is cast to `dtype` by the assignment, as in NumPy's mgrid."""
    out = _cp.empty((len(axes),) + tuple(size for _, _, size in axes), dtype=dtype)
    for i, (start, step, size) in enumerate(axes):
        out[i] = _along(_scaled(_cp.arange(size, dtype=dtype), start, step), i, len(axes))
    return out


class _Grid:
    """mgrid (dense) and ogrid (open): a grid of coordinates from slices, on the device.

    `mgrid[0:5, 0:3]` is numpy.mgrid's (2, 5, 3) array, `ogrid[0:5, 0:3]` its two broadcastable
    axes; a complex step (`0:1:5j`) is a number of points, stop included. The dtype is NumPy's
    (numpy.result_type of the starts, stops and steps). Differences from NumPy: as in CuPy, ogrid
    of several slices returns a list (NumPy 2: a tuple); every slice must have a stop.
    """

    def __init__(self, sparse: bool):
        self.sparse = sparse
        self._what = "ogrid" if sparse else "mgrid"

    def __getitem__(self, key):
        if isinstance(key, slice):
            return _range_1d(key, self._what)
        if not isinstance(key, tuple):
            raise TypeError(f"{self._what}[...] takes slices (start:stop:step), not {type(key).__name__}")
        specs = [_slice_axis(k, self._what) for k in key]
        dtype = numpy.result_type(0, *(v for spec in specs for v in spec[3]))
        axes = [spec[:3] for spec in specs]
        if not self.sparse:
            return _dense_grid(axes, dtype)
        # each axis on its own, shaped to broadcast against the others (not cast back to dtype:
        # NumPy's ogrid keeps arange * step + start as it comes)
        return [_along(_scaled(_cp.arange(size, dtype=dtype), start, step), i, len(axes))
                for i, (start, step, size) in enumerate(axes)]

    def __len__(self) -> int:
        return 0


mgrid = _Grid(sparse=False)
ogrid = _Grid(sparse=True)


def _directive(text: str, axis: int, ndmin: int, trans1d: int) -> tuple[int, int, int]:
    """NumPy's r_/c_ string directives: 'axis', 'axis,ndmin' or 'axis,ndmin,trans1d'."""
    if text in ("r", "c"):
        raise NotImplementedError(f"r_/c_ directive {text!r} makes a numpy.matrix, which CuPy does not have")
    try:
        if "," in text:
            parts = [int(p) for p in text.split(",")]
            if len(parts) not in (2, 3):
                raise ValueError
            return parts[0], parts[1], parts[2] if len(parts) == 3 else trans1d
        return int(text), ndmin, trans1d
    except ValueError:
        raise ValueError(f"unknown special directive {text!r}: r_/c_ take 'axis', 'axis,ndmin' or "
                         "'axis,ndmin,trans1d'") from None


def _lift(a, ndmin: int, trans1d: int):
    """A device array given at least `ndmin` axes as numpy.r_ gives them: ones in front, then the
    original axes moved to start at `trans1d` (c_: a 1-D array becomes a column)."""
    ndim = a.ndim
    if ndim >= ndmin:
        return a
    a = a.reshape((1,) * (ndmin - ndim) + a.shape)
    if trans1d == -1:
        return a
    k2, k1 = ndmin - ndim, trans1d
    if k1 < 0:
        k1 += k2 + 1
    axes = list(range(ndmin))
    return a.transpose(axes[:k1] + axes[k2:] + axes[k1:k2])


class _Concatenator:
    """r_ and c_: concatenation of slices, scalars, lists and arrays along an axis, on the device.

    Slices become ranges (`r_[0:3, 7, x]`; a complex step is a number of points), scalars and
    host data are uploaded, device arrays are used in place; all are cast to NumPy's result type
    and concatenated. c_ stacks along the last axis, 1-D inputs becoming columns. NumPy's string
    directives 'axis[,ndmin[,trans1d]]' are understood (CuPy supports none); 'r', 'c' and a
    string alone (numpy.matrix builders) raise NotImplementedError, as in CuPy.
    """

    def __init__(self, what: str, axis: int = 0, ndmin: int = 1, trans1d: int = -1):
        self._what = what
        self.axis, self.ndmin, self.trans1d = axis, ndmin, trans1d

    def __getitem__(self, key):
        if isinstance(key, str):
            raise NotImplementedError(f"{self._what} of a string alone builds a numpy.matrix, which CuPy does not have")
        axis, ndmin, trans1d = self.axis, self.ndmin, self.trans1d
        objs, typing = [], []
        for i, item in enumerate(key if isinstance(key, tuple) else (key,)):
            if isinstance(item, str):
                if i != 0:
                    raise ValueError(f"{self._what}: special directives must be the first entry.")
                axis, ndmin, trans1d = _directive(item, axis, ndmin, trans1d)
                continue
            if isinstance(item, slice):
                obj = _range_1d(item, self._what)
                if ndmin > 1:
                    obj = obj.reshape((1,) * (ndmin - 1) + obj.shape)
                    if trans1d != -1:
                        obj = obj.swapaxes(-1, trans1d)
            elif type(item) in numpy.ScalarType:
                obj = item          # kept a scalar: it takes part in the dtype as NumPy's weak scalars do
            else:
                obj = _lift(_cp.asarray(item), ndmin, trans1d)
            objs.append(obj)
            typing.append(obj if type(obj) in numpy.ScalarType else obj.dtype)
        if not objs:
            raise ValueError("need at least one array to concatenate")
        dtype = numpy.result_type(*typing)
        parts = [(o if o.dtype == dtype else o.astype(dtype)) if type(o) is ndarray
                 else _cp.asarray(numpy.array(o, dtype=dtype, ndmin=ndmin)) for o in objs]
        return _cp.concatenate(parts, axis=axis)

    def __len__(self) -> int:
        return 0


r_ = _Concatenator("r_")
c_ = _Concatenator("c_", axis=-1, ndmin=2, trans1d=0)
# Index expressions are plain tuples of slices: NumPy's objects build them, as in CuPy.
s_ = numpy.s_
index_exp = numpy.index_exp


# ------------------------------------------------------------------------------------------
# creation from functions, buffers and iterables
# ------------------------------------------------------------------------------------------

def fromfunction(function, shape, *, dtype=float, **kwargs):
    """An array whose element at index i, j, ... is function(i, j, ..., **kwargs).

    `function` is called once with the coordinate arrays (numpy.indices(shape, dtype) split along
    its first axis) as device arrays, so it must use array operations, as with NumPy. Difference
    from CuPy 13: CuPy runs numpy.fromfunction on the host and uploads the result; here the grid
    is made and the function evaluated on the device (a shape too large for the device is refused
    by the daemon, not allocated on the host). A result that is not a device array (a scalar) is
    uploaded, as CuPy's asarray would.
    """
    if not callable(function):
        raise TypeError(f"fromfunction: function must be callable, not {type(function).__name__}")
    result = function(*_dense_grid([(0, 1, size) for size in tuple(shape)], dtype), **kwargs)
    return result if type(result) is ndarray else _cp.asarray(result)


def frombuffer(buffer, dtype=float, count=-1, offset=0):
    """A 1-D device array with the bytes of `buffer` (numpy.frombuffer on the host, uploaded; as CuPy)."""
    return _cp.asarray(numpy.frombuffer(buffer, dtype=dtype, count=count, offset=offset))


# Items of an iterable read and uploaded at a time when fromiter is not given a count.
_FROMITER_CHUNK_BYTES = 16 * 2**20


def _free_bytes() -> int:
    return int(_cp.cuda.runtime.memGetInfo()[0])


def _too_many(dtype, items: int, free: int, endless: bool = False) -> OutOfMemoryError:
    what = (f"the iterable had yielded {items:,} items of {dtype} and not ended (pass count= to bound it)" if endless
            else f"{items:,} items of {dtype} need {items * dtype.itemsize:,} bytes")
    return OutOfMemoryError(f"fromiter: {what}; device {_cp.cuda.get_device_id()} has {free:,} bytes free")


def fromiter(iter, dtype, count=-1):  # noqa: A002  (NumPy's and CuPy's parameter name)
    """A 1-D device array of the items of an iterable (numpy.fromiter on the host, uploaded, as CuPy).

    Unlike numpy.fromiter, memory is bounded by the device's: a count whose array would not fit in
    the free memory of the current device is refused (OutOfMemoryError) before anything is read,
    and with count=-1 the items are read and uploaded in chunks of 16 MiB until the iterable ends,
    an iterable that yields more than the device could hold (an endless generator) being refused
    once it has, so the host never holds more than one chunk.
    """
    dtype = numpy.dtype(dtype)
    if not isinstance(count, (int, numpy.integer)):
        raise TypeError(f"fromiter: count must be an integer, not {type(count).__name__}")
    if count >= 0:
        if count * dtype.itemsize > _FROMITER_CHUNK_BYTES:
            free = _free_bytes()
            if count * dtype.itemsize > free:
                raise _too_many(dtype, int(count), free)
        return _cp.asarray(numpy.fromiter(iter, dtype, count))
    items = builtins.iter(iter)
    chunk = max(1, _FROMITER_CHUNK_BYTES // max(1, dtype.itemsize))
    host = numpy.fromiter(itertools.islice(items, chunk), dtype)
    if len(host) < chunk:           # the common case: one upload, no question to the daemon
        return _cp.asarray(host)
    free, parts, total = _free_bytes(), [], 0
    while True:
        total += len(host)
        if total * dtype.itemsize > free:
            raise _too_many(dtype, total, free, endless=True)
        parts.append(_cp.asarray(host))
        if len(host) < chunk:
            return _cp.concatenate(parts)
        host = numpy.fromiter(itertools.islice(items, chunk), dtype)


# ------------------------------------------------------------------------------------------
# indices of an array's triangles and diagonal
# ------------------------------------------------------------------------------------------

def tril_indices_from(arr, k=0):
    """Indices of the lower triangle of the 2-D `arr` (tril_indices(rows, k, cols)), as device arrays."""
    shape = _cp.shape(arr)
    if len(shape) != 2:
        raise ValueError("input array must be 2-d")
    return _cp.tril_indices(shape[-2], k=k, m=shape[-1])


def triu_indices_from(arr, k=0):
    """Indices of the upper triangle of the 2-D `arr` (triu_indices(rows, k, cols)), as device arrays."""
    shape = _cp.shape(arr)
    if len(shape) != 2:
        raise ValueError("input array must be 2-d")
    return _cp.triu_indices(shape[-2], k=k, m=shape[-1])


def diag_indices_from(arr):
    """Indices of the main diagonal of `arr` (at least 2-d, all sides equal): diag_indices(n, ndim)."""
    shape = _cp.shape(arr)
    if len(shape) < 2:
        raise ValueError("input array must be at least 2-d")
    if len(set(shape)) != 1:
        raise ValueError("All dimensions of input must be of equal length")
    return _cp.diag_indices(shape[0], len(shape))


# ------------------------------------------------------------------------------------------
# functional
# ------------------------------------------------------------------------------------------

def apply_along_axis(func1d, axis, arr, *args, **kwargs):
    """func1d applied to each 1-D slice of `arr` along `axis`; the results stacked on the device.

    As in CuPy, a Python loop calls func1d(slice, *args, **kwargs) once per slice (each slice a
    device view); each result (device array, or host value uploaded) is written into one device
    array shaped like `arr` with `axis` replaced by the result's axes. The dtype is that of the
    first result. A 0-d `arr` has no axis to apply along (AxisError).
    """
    arr = _cp.asarray(arr)
    axis = normalize_axis_index(axis, arr.ndim, msg_prefix="apply_along_axis")
    view = _cp.moveaxis(arr, axis, -1)
    # a trailing Ellipsis keeps each slice an array even where the iteration index is complete
    indices = (index + (Ellipsis,) for index in numpy.ndindex(view.shape[:-1]))
    first = next(indices, None)
    if first is None:
        raise ValueError("Cannot apply_along_axis when any iteration dimensions are 0")
    result = _cp.asarray(func1d(view[first], *args, **kwargs))
    out = _cp.empty(view.shape[:-1] + result.shape, dtype=result.dtype)
    out[first] = result
    for index in indices:
        out[index] = _cp.asarray(func1d(view[index], *args, **kwargs))
    for _ in range(result.ndim):    # the result's axes, made last, go where `axis` was
        out = _cp.moveaxis(out, -1, axis)
    return out


def _conditions(condlist, x) -> list:
    """piecewise's conditions as a list: a single condition (a scalar, or one array of x's rank)
    is a list of one, as NumPy reads it."""
    if numpy.isscalar(condlist):
        return [condlist]
    if type(condlist) is ndarray:
        return [condlist] if condlist.ndim == x.ndim else list(condlist)
    if x.ndim != 0 and len(condlist) and not isinstance(condlist[0], (list, tuple, numpy.ndarray, ndarray)):
        return [condlist]
    return list(condlist)


def piecewise(x, condlist, funclist):
    """funclist[i] where condlist[i] holds (a later condition winning), 0 elsewhere, or the extra
    last value of funclist where no condition holds; the result has x's shape and dtype.

    As in CuPy, the values must be scalars (or 0-d device arrays): callables, and NumPy's *args and
    **kw for them, raise NotImplementedError. Conditions may be device arrays, host data or bools.
    """
    x = _cp.asarray(x)
    conditions = _conditions(condlist, x)
    values = list(funclist)
    if any(callable(v) for v in values):
        raise NotImplementedError("piecewise: callable functions are not supported (CuPy: scalars only)")
    if len(values) == len(conditions):
        out = _cp.zeros(x.shape, dtype=x.dtype)
    elif len(values) == len(conditions) + 1:
        out = _cp.full(x.shape, values.pop(), dtype=x.dtype)
    else:
        raise ValueError(f"with {len(conditions)} condition(s), either {len(conditions)} or "
                         f"{len(conditions) + 1} functions are expected")
    for condition, value in zip(conditions, values):
        # unsafe casting, as numpy.piecewise's y[cond] = value and CuPy's kernel assign it
        _cp.copyto(out, value, where=_cp.asarray(condition, dtype=bool), casting="unsafe")
    return out


# ------------------------------------------------------------------------------------------
# type and layout predicates, conversions
# ------------------------------------------------------------------------------------------

def iscomplexobj(x) -> bool:
    """True when x's dtype is complex (its type is checked, not its values); numpy.iscomplexobj for host objects."""
    return x.dtype.kind == "c" if type(x) is ndarray else numpy.iscomplexobj(x)


def isrealobj(x) -> bool:
    """True when x's dtype is not complex; numpy.isrealobj for host objects."""
    return x.dtype.kind != "c" if type(x) is ndarray else numpy.isrealobj(x)


def isfortran(a) -> bool:
    """True when `a` is Fortran-contiguous and not C-contiguous (the daemon is asked its layout
    once per array); numpy.isfortran for host arrays."""
    if type(a) is not ndarray:
        return numpy.isfortran(a)
    flags = a.flags
    return flags.f_contiguous and not flags.c_contiguous


def common_type(*arrays):
    """The scalar type (float16 ... complex128) every input can be converted to: integers count as
    float64, bool is refused (TypeError). NumPy's rule, applied to the arrays' dtypes."""
    return numpy.common_type(*(numpy.empty(0, a.dtype) if type(a) is ndarray else a for a in arrays))


_REQUIREMENTS = {"C": "C", "C_CONTIGUOUS": "C", "CONTIGUOUS": "C", "F": "F", "F_CONTIGUOUS": "F",
                 "FORTRAN": "F", "O": "O", "OWNDATA": "O"}


def require(a, dtype=None, requirements=None):
    """`a` as a device array of `dtype` meeting `requirements`: 'C' (C_CONTIGUOUS, CONTIGUOUS),
    'F' (F_CONTIGUOUS, FORTRAN) and 'O' (OWNDATA: a copy of its own), as CuPy supports; NumPy's
    'A', 'W' and 'E' are refused (ValueError), as in CuPy. Host data is uploaded."""
    wanted = set()
    for flag in requirements or ():
        if not isinstance(flag, str) or flag.upper() not in _REQUIREMENTS:
            raise ValueError(f'Incorrect flag "{flag}" in requirements')
        wanted.add(_REQUIREMENTS[flag.upper()])
    if {"C", "F"} <= wanted:
        raise ValueError('Cannot specify both "C" and "F" order')
    try:
        arr = _cp.asarray(a, dtype=dtype)
    except TypeError:
        raise ValueError(f'Incorrect dtype "{dtype}" provided') from None
    if "F" in wanted:
        arr = _cp.asfortranarray(arr)
    elif "C" in wanted:
        arr = _cp.ascontiguousarray(arr)
    # a fresh upload already owns its data; a device input, or a view of it, is copied
    if "O" in wanted and type(a) is ndarray:
        arr = _cp.copy(arr)
    return arr


def asarray_chkfinite(a, dtype=None, order=None):
    """`a` as a device array (host data uploaded), raising ValueError if it holds an inf or NaN.

    The check is one reduction on the device and one scalar read (a sync point, as in CuPy);
    integer and bool arrays are finite without it. order 'C' or 'F' lays the result out so.
    """
    arr = _cp.asarray(a, dtype=dtype)
    if order in ("C", "c"):
        arr = _cp.ascontiguousarray(arr)
    elif order in ("F", "f"):
        arr = _cp.asfortranarray(arr)
    elif order not in (None, "A", "a", "K", "k"):
        raise ValueError(f"order must be one of 'C', 'F', 'A' or 'K', not {order!r}")
    if arr.dtype.kind in "fc" and not bool(_cp.isfinite(arr).all()):
        raise ValueError("array must not contain infs or NaNs")
    return arr


# ------------------------------------------------------------------------------------------
# text and files (host work, as in CuPy)
# ------------------------------------------------------------------------------------------

def array_repr(arr, max_line_width=None, precision=None, suppress_small=None) -> str:
    """repr of an array, as numpy.array_repr writes it (the array is fetched to the host, as CuPy
    does; with no options a device array's own repr is used)."""
    if type(arr) is ndarray and max_line_width is None and precision is None and suppress_small is None:
        return repr(arr)
    return numpy.array_repr(_cp.asnumpy(arr), max_line_width, precision, suppress_small)


def array_str(arr, max_line_width=None, precision=None, suppress_small=None) -> str:
    """str of an array's contents, as numpy.array_str writes it (fetched to the host, as CuPy
    does; with no options a device array's own str is used)."""
    if type(arr) is ndarray and max_line_width is None and precision is None and suppress_small is None:
        return str(arr)
    return numpy.array_str(_cp.asnumpy(arr), max_line_width, precision, suppress_small)


def save(file, arr, allow_pickle=None) -> None:
    """numpy.save of the array (fetched to the host); allow_pickle defaults to True, as in CuPy."""
    numpy.save(file, _cp.asnumpy(arr), allow_pickle=True if allow_pickle is None else allow_pickle)


def savez(file, *args, **kwds) -> None:
    """numpy.savez of the arrays (fetched to the host): positional ones as arr_0, arr_1, ..."""
    numpy.savez(file, *map(_cp.asnumpy, args), **{k: _cp.asnumpy(v) for k, v in kwds.items()})


def savez_compressed(file, *args, **kwds) -> None:
    """numpy.savez_compressed of the arrays (fetched to the host)."""
    numpy.savez_compressed(file, *map(_cp.asnumpy, args), **{k: _cp.asnumpy(v) for k, v in kwds.items()})


class NpzFile(collections.abc.Mapping):
    """The arrays of an .npz file, each uploaded to the current device when first looked up
    (`npz["x"]`), as CuPy's NpzFile; a context manager that closes the file. Beyond CuPy's, it is
    a read-only mapping (keys(), `in`, len(), iteration over the names, without uploading)."""

    def __init__(self, npz_file):
        self.npz_file = npz_file

    def __getitem__(self, key):
        return _cp.array(self.npz_file[key])

    def __iter__(self):
        return iter(self.npz_file.files)

    def __len__(self) -> int:
        return len(self.npz_file.files)

    def __contains__(self, key) -> bool:
        return key in self.npz_file.files

    @property
    def files(self) -> list:
        return list(self.npz_file.files)

    def close(self) -> None:
        self.npz_file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<gpuremote NpzFile {self.files}>"


def load(file, mmap_mode=None, allow_pickle=None):
    """numpy.load on the host: an .npy array is uploaded to the current device, an .npz file is an
    NpzFile that uploads each array when it is looked up (as in CuPy). allow_pickle defaults to
    False; a pickled object array cannot become a device array (object dtypes are refused)."""
    obj = numpy.load(file, mmap_mode=mmap_mode, allow_pickle=bool(allow_pickle))
    if isinstance(obj, numpy.ndarray):
        return _cp.array(obj)
    if isinstance(obj, numpy.lib.npyio.NpzFile):
        return NpzFile(obj)
    return obj


def _device_array(x, name: str, what: str):
    """`x` itself when it is a device array; else TypeError, as CuPy raises for host data here
    (nothing is uploaded behind the caller's back)."""
    if type(x) is not ndarray:
        raise TypeError(f"{name}: `{what}` must be a device array (cupy.ndarray), not {type(x).__name__}")
    return x


def _is_number(x) -> bool:
    return isinstance(x, (int, float, complex, numpy.number, numpy.bool_))       # bool is an int


# ------------------------------------------------------------------------------------------
# window functions (built on the device: one arange and elementwise ops)
# ------------------------------------------------------------------------------------------

def _points(M, name: str) -> int:
    try:
        return operator.index(M)
    except TypeError:
        raise TypeError(f"{name}: M must be an integer number of points, not {type(M).__name__}") from None


def _window(M, name: str, shape):
    """The float64 window of M points: empty for M <= 0, [1.] for M == 1, else shape(n, M - 1)
    with n = 1 - M, 3 - M, ..., M - 1 (the points, symmetric about 0) made by one arange on the
    device, so a length the device cannot hold is refused by the daemon, not built on the host."""
    m = _points(M, name)
    if m <= 0:
        return _cp.zeros(0, dtype=numpy.float64)
    if m == 1:
        return _cp.ones(1, dtype=numpy.float64)
    return shape(_cp.arange(1 - m, m, 2, dtype=numpy.float64), m - 1)


def hanning(M):
    """The Hanning window of M points (float64; empty for M <= 0), 0.5 + 0.5 cos(pi n / (M - 1)).

    As in CuPy, M must be an integer (NumPy also takes a float). The angles are float64 (CuPy's
    kernel takes its step as float32), so the values are NumPy's.
    """
    return _window(M, "hanning", lambda n, span: _cp.cos(n * (math.pi / span)) * 0.5 + 0.5)


def hamming(M):
    """The Hamming window of M points (float64; empty for M <= 0), 0.54 + 0.46 cos(pi n / (M - 1)).
    M must be an integer, as in CuPy; computed in float64 throughout (see hanning)."""
    return _window(M, "hamming", lambda n, span: _cp.cos(n * (math.pi / span)) * 0.46 + 0.54)


def blackman(M):
    """The Blackman window of M points (float64; empty for M <= 0),
    0.42 + 0.5 cos(pi n / (M - 1)) + 0.08 cos(2 pi n / (M - 1)). M must be an integer, as in CuPy."""
    def shape(n, span):
        angle = n * (math.pi / span)
        return _cp.cos(angle) * 0.5 + 0.42 + _cp.cos(angle * 2.0) * 0.08
    return _window(M, "blackman", shape)


def bartlett(M):
    """The Bartlett (triangular) window of M points (float64; empty for M <= 0), 1 - |n| / (M - 1).
    M must be an integer, as in CuPy."""
    return _window(M, "bartlett", lambda n, span: 1.0 - _cp.absolute(n) / span)


def kaiser(M, beta):
    """The Kaiser window of M points (float64; empty for M <= 0), i0(beta sqrt(1 - (n / (M - 1))**2))
    / i0(beta), with i0 the modified Bessel function of order 0 (cupy.i0, on the device).

    M must be an integer and beta a real number (its i0 is one host scalar); CuPy's kernel takes
    beta as float32, here it stays float64, as in NumPy.
    """
    if not _is_number(beta) or isinstance(beta, (complex, numpy.complexfloating)):
        raise TypeError(f"kaiser: beta must be a real number, not {type(beta).__name__}")
    beta = float(beta)
    scale = float(numpy.i0(beta))
    return _window(M, "kaiser",
                   lambda n, span: _cp.i0(_cp.sqrt(1.0 - (n / span) ** 2) * beta) / scale)


# ------------------------------------------------------------------------------------------
# differences, integration, infinities, sorting, complex parts
# ------------------------------------------------------------------------------------------

def _edge(values, dtype, name: str, what: str):
    if values is None:
        return None
    _device_array(values, name, what)
    if not numpy.can_cast(values.dtype, dtype, casting="same_kind"):
        raise TypeError(f"{name}: `{what}` ({values.dtype}) does not cast to arr's dtype {dtype} under the "
                        "'same_kind' rule")
    return values.ravel()


def ediff1d(arr, to_end=None, to_begin=None):
    """The differences between consecutive elements of the flattened `arr` (arr[1:] - arr[:-1]),
    with `to_begin` prepended and `to_end` appended; the result has arr's dtype.

    As in CuPy, `arr`, `to_begin` and `to_end` must be device arrays (NumPy also takes host data and
    scalars): anything else is a TypeError, as is a `to_begin`/`to_end` whose dtype does not cast to
    arr's under the 'same_kind' rule.
    """
    flat = _device_array(arr, "ediff1d", "arr").ravel()
    if to_begin is None and to_end is None:
        return flat[1:] - flat[:-1]
    begin = _edge(to_begin, flat.dtype, "ediff1d", "to_begin")
    end = _edge(to_end, flat.dtype, "ediff1d", "to_end")
    n_begin = 0 if begin is None else begin.size
    n_end = 0 if end is None else end.size
    n_diff = max(flat.size - 1, 0)
    out = _cp.empty(n_begin + n_diff + n_end, dtype=flat.dtype)
    if n_begin:
        out[:n_begin] = begin
    if n_end:
        out[n_begin + n_diff:] = end
    _cp.subtract(flat[1:], flat[:-1], out=out[n_begin:n_begin + n_diff])
    return out


def trapz(y, x=None, dx=1.0, axis=-1):
    """The integral of `y` along `axis` by the composite trapezoidal rule, over the sample points
    `x` (a 1-D array spacing that axis, or an array shaped like `y`) or a uniform spacing `dx`.

    As in CuPy (whose name this is: numpy.trapezoid in NumPy 2), `y` and `x` must be device arrays
    and the result is a device array (0-d for a 1-D `y`, where NumPy gives a scalar).
    """
    _device_array(y, "trapz", "y")
    axis = normalize_axis_index(axis, y.ndim, msg_prefix="trapz")
    if x is None:
        spacing = dx
    else:
        _device_array(x, "trapz", "x")
        if x.ndim == 1:
            spacing = _cp.diff(x)
            spacing = spacing.reshape((1,) * axis + spacing.shape + (1,) * (y.ndim - axis - 1))
        else:
            spacing = _cp.diff(x, axis=axis)
    head = (slice(None),) * axis
    upper, lower = y[head + (slice(1, None),)], y[head + (slice(None, -1),)]
    return (spacing * (upper + lower) / 2.0).sum(axis)


def _sign_test(x, name: str):
    if type(x) is not ndarray:
        if not _is_number(x):
            raise TypeError(f"{name}: x must be a device array or a number, not {type(x).__name__}")
        x = _cp.asarray(x)
    if x.dtype.kind == "c":
        raise TypeError(f"{name}: {x.dtype} values have no sign to test (+inf and -inf are real)")
    return x


def isposinf(x, out=None):
    """True where `x` is +inf (isinf and not signbit), as a bool device array; `out`, a device
    array, receives the result (CuPy ignores its `out`). Complex input is a TypeError, as in NumPy
    and CuPy; a number is uploaded as a 0-d array."""
    x = _sign_test(x, "isposinf")
    return _cp.logical_and(_cp.isinf(x), ~_cp.signbit(x), out=out)


def isneginf(x, out=None):
    """True where `x` is -inf (isinf and signbit), as a bool device array; `out` as in isposinf."""
    x = _sign_test(x, "isneginf")
    return _cp.logical_and(_cp.isinf(x), _cp.signbit(x), out=out)


def sort_complex(a):
    """A sorted copy of the device array `a` (along its last axis; real part first, then the
    imaginary part), always complex: complex64 for int8/int16/uint8/uint16, complex128 for other
    real dtypes, complex dtypes kept (NumPy's rule)."""
    out = _cp.sort(_device_array(a, "sort_complex", "a"))
    if out.dtype.kind == "c":
        return out
    return out.astype(numpy.complex64 if out.dtype.char in "bhBH" else numpy.complex128)


def real_if_close(a, tol=100):
    """The real part of the device array `a` if every imaginary part is below `tol` (in machine
    epsilons of a's dtype when tol > 1, else absolute), else `a` itself; a real `a` is returned as
    is. The result's dtype depends on the data: one reduction on the device and one scalar read (a
    sync point), as in CuPy."""
    _device_array(a, "real_if_close", "a")
    if a.dtype.kind != "c":
        return a
    if tol > 1:
        tol = numpy.finfo(a.dtype).eps * tol
    return a.real if bool(_cp.all(_cp.absolute(a.imag) < tol)) else a


# ------------------------------------------------------------------------------------------
# polynomials (coefficients from highest to lowest degree, on the device)
# ------------------------------------------------------------------------------------------

def _coefficients(p, name: str):
    """A polynomial argument as a 1-D device array: a device array (0-d made 1-D), or a number made
    a one-element array of its NumPy dtype on the device; CuPy's rules (host arrays and lists are a
    TypeError, more than one axis a ValueError)."""
    if type(p) is ndarray:
        if p.ndim == 0:
            return p.reshape(1)
        if p.ndim != 1:
            raise ValueError(f"{name}: multidimensional inputs are not supported")
        return p
    if _is_number(p):
        return _cp.full(1, p, dtype=numpy.asarray(p).dtype)
    raise TypeError(f"{name}: unsupported type {type(p).__name__} (a device array or a number)")


def _leading_zeros(c, size: int):
    """1-D `c` with zeros in front up to `size` coefficients."""
    if c.size >= size:
        return c
    return _cp.concatenate([_cp.zeros(size - c.size, dtype=c.dtype), c])


def polyadd(a1, a2):
    """The sum of two polynomials (1-D device arrays of coefficients, highest degree first, or
    numbers). CuPy's poly1d is not provided, so neither is a poly1d result."""
    a1, a2 = _coefficients(a1, "polyadd"), _coefficients(a2, "polyadd")
    size = builtins.max(a1.size, a2.size)
    return _leading_zeros(a1, size) + _leading_zeros(a2, size)


def polysub(a1, a2):
    """The difference a1 - a2 of two polynomials (as polyadd)."""
    a1, a2 = _coefficients(a1, "polysub"), _coefficients(a2, "polysub")
    size = builtins.max(a1.size, a2.size)
    return _leading_zeros(a1, size) - _leading_zeros(a2, size)


def _trimmed(c):
    c = _cp.trim_zeros(c, trim="f")
    return c if c.size else _cp.zeros(1, dtype=c.dtype)


def polymul(a1, a2):
    """The product of two polynomials (as polyadd): the convolution of their coefficients.

    As in CuPy, leading zeros are removed from each input first (its size is read from the device,
    a sync point), so polymul([0, 1], [1, 1]) is [1, 1] where NumPy gives [0, 1, 1].
    """
    return _cp.convolve(_trimmed(_coefficients(a1, "polymul")), _trimmed(_coefficients(a2, "polymul")))


def roots(p):
    """The roots of the polynomial with coefficients `p` (a 1-D device array, highest degree first),
    in the cases CuPy's roots handles: degree 0 (no roots: an empty float64 array), degree 1
    (-p[1] / p[0]; float64 where that root is 0), and polynomials whose companion matrix is real
    symmetric or complex Hermitian, whose roots are that matrix's eigenvalues (linalg.eigvalsh, in
    ascending order, not NumPy's). Every other polynomial raises NotImplementedError, as in CuPy:
    with no general eigenvalue solver, the only such polynomials of degree >= 2 are a x**2 + b x - a
    with b / a real. Leading zeros are dropped (a sync point); integer coefficients count as float64.
    """
    if type(p) is not ndarray:
        raise TypeError(f"roots: p must be a device array (cupy.ndarray), not {type(p).__name__}")
    if p.dtype.kind == "b":
        raise NotImplementedError("roots: boolean inputs are not supported")
    if p.ndim == 0:
        raise TypeError("roots: 0-dimensional input is not allowed")
    if p.ndim != 1:
        raise ValueError("roots: the coefficient array is not 1-d")
    if p.size < 2:
        return _cp.zeros(0, dtype=numpy.float64)
    dtype = numpy.dtype(numpy.common_type(numpy.empty(0, p.dtype)))
    c = _cp.trim_zeros(p, trim="f")
    if c.size < 2:
        return _cp.zeros(0, dtype=numpy.float64)
    c = c[::-1].astype(dtype)           # lowest degree first
    if c.size == 2:
        root = (-c[0] / c[1]).reshape(1)
        return root.real.astype(numpy.float64) if bool(c[0] == 0) else root
    if c.size > 3:                      # a companion matrix of side >= 3 is never symmetric
        raise NotImplementedError("roots: only polynomials whose companion matrix is complex Hermitian or real "
                                  "symmetric are supported (CuPy's restriction)")
    companion = _cp.zeros((2, 2), dtype=dtype)
    companion[1, 0] = 1
    companion[:, 1] = -c[:2] / c[2]
    if not bool(_cp.array_equal(companion, companion.conj().T)):
        raise NotImplementedError("roots: only polynomials whose companion matrix is complex Hermitian or real "
                                  "symmetric are supported (CuPy's restriction)")
    return _cp.linalg.eigvalsh(companion).astype(dtype)


# ------------------------------------------------------------------------------------------
# files and text (NumPy on the host, then one upload; as in CuPy)
# ------------------------------------------------------------------------------------------

def fromfile(file, dtype=float, count=-1, sep="", offset=0):
    """numpy.fromfile on the host, uploaded to the current device (as CuPy; big-endian data comes
    out in native byte order). Beyond CuPy: a binary file (sep='') named by its path whose array would
    not fit in the current device's free memory is refused (OutOfMemoryError) before it is read."""
    dtype = numpy.dtype(dtype)
    if sep == "" and isinstance(file, (str, bytes, os.PathLike)) and dtype.itemsize:
        items = count if count >= 0 else builtins.max(os.path.getsize(file) - offset, 0) // dtype.itemsize
        if items * dtype.itemsize > _FROMITER_CHUNK_BYTES:
            free = _free_bytes()
            if items * dtype.itemsize > free:
                raise OutOfMemoryError(f"fromfile: {items:,} items of {dtype} need {items * dtype.itemsize:,} bytes;"
                                       f" device {_cp.cuda.get_device_id()} has {free:,} bytes free")
    return _cp.asarray(numpy.fromfile(file, dtype=dtype, count=count, sep=sep, offset=offset))


def fromstring(*args, **kwargs):
    """numpy.fromstring on the host (text with a separator), uploaded to the current device, as CuPy."""
    return _cp.asarray(numpy.fromstring(*args, **kwargs))


def loadtxt(*args, **kwargs):
    """numpy.loadtxt on the host, uploaded to the current device, as CuPy (structured dtypes cannot
    be device arrays: TypeError)."""
    return _cp.asarray(numpy.loadtxt(*args, **kwargs))


def genfromtxt(*args, **kwargs):
    """numpy.genfromtxt on the host, uploaded to the current device, as CuPy (missing values filled
    as NumPy fills them; structured results, e.g. dtype=None with names, are a TypeError)."""
    return _cp.asarray(numpy.genfromtxt(*args, **kwargs))


def savetxt(fname, X, *args, **kwargs) -> None:
    """numpy.savetxt of the array (fetched to the host), as CuPy."""
    numpy.savetxt(fname, _cp.asnumpy(X), *args, **kwargs)


# ------------------------------------------------------------------------------------------
# printing, iteration and errors: NumPy's host objects, as CuPy re-exports them
# ------------------------------------------------------------------------------------------

def array2string(a, *args, **kwargs) -> str:
    """numpy.array2string of the array (fetched to the host), as CuPy."""
    return numpy.array2string(_cp.asnumpy(a), *args, **kwargs)


def _host_scalar(x):
    host = _cp.asnumpy(x)
    return host[()] if isinstance(host, numpy.ndarray) and host.ndim == 0 else host


def format_float_positional(x, *args, **kwargs) -> str:
    """numpy.format_float_positional of a float (a 0-d device array is fetched, as a scalar)."""
    return numpy.format_float_positional(_host_scalar(x), *args, **kwargs)


def format_float_scientific(x, *args, **kwargs) -> str:
    """numpy.format_float_scientific of a float (a 0-d device array is fetched, as a scalar)."""
    return numpy.format_float_scientific(_host_scalar(x), *args, **kwargs)


# Device arrays print through NumPy (ndarray.__repr__/__str__ fetch and format the host copy), so
# NumPy's print options govern them, as in CuPy.
set_printoptions = numpy.set_printoptions
get_printoptions = numpy.get_printoptions
printoptions = numpy.printoptions
ndindex = numpy.ndindex
AxisError = numpy.exceptions.AxisError


class broadcast:  # noqa: N801  (CuPy's class name)
    """The broadcast of device arrays (and numbers), as cupy.broadcast: `shape`, `nd` and `size` of
    the broadcast shape, derived from the shapes alone (no data is read), and `values`, the inputs
    as broadcast views on the device (made when first asked for; numbers are kept as they are).
    As in CuPy it is not an iterator; shapes that do not broadcast are a ValueError, host arrays and
    lists a TypeError."""

    def __init__(self, *arrays):
        shapes = []
        for a in arrays:
            if type(a) is ndarray:
                shapes.append(a.shape)
            elif _is_number(a):
                shapes.append(())
            else:
                raise TypeError(f"broadcast: arguments must be device arrays or numbers, not {type(a).__name__}")
        self._arrays = arrays
        self._values = None
        self.shape = numpy.broadcast_shapes(*shapes)
        self.nd = len(self.shape)
        self.size = math.prod(self.shape)

    @property
    def values(self) -> tuple:
        if self._values is None:
            self._values = tuple(_cp.broadcast_to(a, self.shape) if type(a) is ndarray else a
                                 for a in self._arrays)
        return self._values

    def __repr__(self) -> str:
        return f"<gpuremote broadcast shape={self.shape}>"
