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

def _shape_of(arr) -> tuple:
    return arr.shape if type(arr) is ndarray else numpy.shape(arr)


def tril_indices_from(arr, k=0):
    """Indices of the lower triangle of the 2-D `arr` (tril_indices(rows, k, cols)), as device arrays."""
    shape = _shape_of(arr)
    if len(shape) != 2:
        raise ValueError("input array must be 2-d")
    return _cp.tril_indices(shape[-2], k=k, m=shape[-1])


def triu_indices_from(arr, k=0):
    """Indices of the upper triangle of the 2-D `arr` (triu_indices(rows, k, cols)), as device arrays."""
    shape = _shape_of(arr)
    if len(shape) != 2:
        raise ValueError("input array must be 2-d")
    return _cp.triu_indices(shape[-2], k=k, m=shape[-1])


def diag_indices_from(arr):
    """Indices of the main diagonal of `arr` (at least 2-d, all sides equal): diag_indices(n, ndim)."""
    shape = _shape_of(arr)
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
