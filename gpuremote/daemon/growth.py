"""Upper bounds, in bytes, of what a call op will allocate, computed before it runs.

Why: on the emulated backend device memory is the daemon's own host memory, so one request whose
result is huge (tile with reps (10**6, 10**6), bincount([2**40]), fft with n=2**40) would exhaust
the host and kill the daemon with every tenant's session; under a pool lease it would pass the
lease's share before the ledger noticed. session.py checks `bound(...)` against the device's (or
the lease's) ledger before every call op: OutOfMemoryError, and nothing is allocated.

How: from the decoded arguments' shapes, dtypes and small value arguments (shapes, reps, n, axes),
never by running the op and never by building a large array. The rules with an O(1) metadata rule
take gpuremote.meta's exact result metadata; every other surface name has a bound function here or
is in NO_GROWTH. The only reads of data: bincount and isin(kind='table') reduce an input for its
max/min, repeat sums its repeats: a reduction on the device, far cheaper than what it bounds.

A bound counts the results, and where an op works on copies of its inputs (sort, median, linalg,
fft, ...) those copies too, at the inputs' logical size: a broadcast view (zero strides) holds one
element but is copied at its full size. Copies of inputs that hold their own memory are at most that
memory. Arrays NumPy makes of inline host values (numbers, lists: at most the message size) are not
counted. A bound may overestimate; it must never underestimate (tests/test_growth.py runs NumPy on
small cases to check). Sizes use `_span` (zero-length dims counted as 1) where a result keeps only
some of an input's dims: a reduction of an empty (0, 10**12) array has 10**12 elements.
"""

from __future__ import annotations

import math
import operator
from typing import Callable

import numpy

from gpuremote.errors import UnsupportedOperationError
from gpuremote.meta import NOT_ARRAY, RANDOM_GENERATOR, derive, virtual, without_generator
from gpuremote.surface import UFUNC_METHODS, Entry

# Rules whose results gpuremote.meta derives with an O(1) rule (no NumPy run on real-sized
# stand-ins): the bound is exactly the results' size. `creation` probes NumPy when an argument is
# a device array (full(shape, fill_value=x) would build the whole result): handled apart.
_DERIVED = frozenset({"elementwise", "matmul", "rmatmul", "dot", "astype", "like", "creation", "random",
                      "special", "generator"})
_NOTHING = frozenset({"none", "self", "value"})     # in place or host values: no new arrays
_INDEX = 8                                          # intp
_MAX_VALUES = 4096      # value arguments (shapes, reps, axes) longer than this are no shape NumPy takes
_ARRAY_OBJECT = 256     # host bytes of one returned view (split into 10**9 pieces is 10**9 objects)
_PY_DTYPES = {bool: numpy.dtype(bool), int: numpy.dtype(numpy.int64), float: numpy.dtype(numpy.float64),
              complex: numpy.dtype(numpy.complex128)}
_BASIC_INDEX = frozenset({int, slice, type(None), type(Ellipsis)})


class _Absent(Exception):
    """A required argument is missing: the op itself raises NumPy's TypeError."""


_REQUIRED = object()


def bound(entry: Entry, args: tuple, kwargs: dict, meta_of: Callable, room: int | None = None) -> int:
    """Upper bound, in bytes, of what the op allocates (0: views or nothing).

    `room` (free bytes, or None) lets a cheap, looser bound through when it fits; a tight one is
    computed only when it would not. Raises what NumPy raises for some malformed arguments, and
    NotImplementedError where nothing can be bounded (histogram with a string `bins`, as in CuPy).
    """
    rule = entry.rule
    if RANDOM_GENERATOR in kwargs and entry.name.startswith("random."):
        kwargs = without_generator(kwargs)
    if rule == "elementwise" and room is not None and not kwargs:
        cheap = _elementwise_cheap(args, entry.nout, meta_of)
        if cheap is not None and cheap <= room:
            return cheap
    if rule in _DERIVED:
        # (meta's creation rule probes NumPy when a top-level argument is an array)
        if rule != "creation" or all([meta_of(a) is NOT_ARRAY for a in (*args, *kwargs.values())]):
            metas = derive(entry, args, kwargs, meta_of)
            if metas is not None:
                n = 0
                for shape, dt in metas:
                    n += math.prod(shape) * dt.itemsize
                return n
        return _derived_fallback(entry, args, kwargs, meta_of)
    if rule in _NOTHING:
        return 0
    if rule == "reduce" or rule == "accumulate":
        return _reduction(entry, args, kwargs, meta_of, room)
    name = entry.name
    try:
        if name.startswith("ndarray.") and (not args or meta_of(args[0]) is NOT_ARRAY):
            return 0                    # not a method call on an array: the daemon refuses it
        fn = _VIEWS.get(name)
        if fn is not None:
            return fn(args, kwargs, meta_of)
        per = NO_GROWTH.get(name)
        if per is not None:
            return _no_growth(per, args, kwargs, meta_of)
        fn = _BOUNDS.get(name)
        if fn is not None:
            return fn(args, kwargs, meta_of) + _copies(args, kwargs, meta_of)
        if rule == "view":
            return 0                    # a view shares its base's memory
    except _Absent:
        return 0
    raise UnsupportedOperationError(f"{name}: gpuremote/daemon/growth.py has no size bound for it, so the "
                                    "daemon does not run it")


def _elementwise_cheap(args: tuple, nout: int, meta_of: Callable) -> int | None:
    """A loose bound for the hot path: inputs of one shape (or scalars), at 32 bytes per element of
    each result (the widest element, complex256). None when shapes differ (broadcasting)."""
    shape = None
    for a in args:
        m = meta_of(a)
        if m is NOT_ARRAY:
            continue
        if shape is None:
            shape = m[0]
        elif m[0] != shape:
            return None
    if shape is None:
        return None
    return math.prod(shape) * 32 * max(nout, 1)


def known(entry: Entry) -> bool:
    """Whether `bound` has a rule for the entry (tests check that every surface name has one)."""
    return (entry.rule in _DERIVED or entry.rule in _NOTHING or entry.rule in ("reduce", "accumulate", "view")
            or entry.name in _VIEWS or entry.name in NO_GROWTH or entry.name in _BOUNDS)


# -- argument helpers ------------------------------------------------------------------------------

def _arg(args, kwargs, pos, name, default=_REQUIRED):
    if len(args) > pos:
        return args[pos]
    if name in kwargs:
        return kwargs[name]
    if default is _REQUIRED:
        raise _Absent
    return default


def _meta(obj, meta_of) -> tuple[tuple, numpy.dtype]:
    """(shape, dtype) of an array-like argument: a device array, or small inline data as NumPy
    reads it; a sequence holding device arrays counts as one flat array of all their elements."""
    m = meta_of(obj)
    if m is not NOT_ARRAY:
        return m
    if type(obj) in (list, tuple) and _any_array(obj, {}, meta_of):
        dtypes: set = set()
        n = _leaves(obj, meta_of, dtypes)
        return (n,), numpy.result_type(*dtypes)
    a = numpy.asarray(obj)      # inline data: bounded by the message size
    return a.shape, a.dtype


def _any_array(args, kwargs, meta_of, depth=0) -> bool:
    for a in (*args, *kwargs.values()):
        if meta_of(a) is not NOT_ARRAY:
            return True
        if type(a) in (list, tuple) and depth < 64 and _any_array(a, {}, meta_of, depth + 1):
            return True
    return False


def _leaves(obj, meta_of, dtypes: set, depth=0) -> int:
    """Elements of an array-like argument as NumPy would convert it, counted without converting it;
    their dtypes are added to `dtypes`."""
    m = meta_of(obj)
    if m is not NOT_ARRAY:
        dtypes.add(m[1])
        return math.prod(m[0])
    if type(obj) in (list, tuple) and depth < 64:
        return sum([_leaves(x, meta_of, dtypes, depth + 1) for x in obj])
    dt = _PY_DTYPES.get(type(obj))
    dtypes.add(dt if dt is not None else numpy.asarray(obj).dtype)
    return 1


def _values(obj, meta_of):
    """A value argument (shape, reps, n, axes) as host values; device arrays in it are read."""
    m = meta_of(obj)
    if m is not NOT_ARRAY:
        if math.prod(m[0]) > _MAX_VALUES:
            raise ValueError(f"an array of {math.prod(m[0])} elements where a few values (a shape, "
                             "repetitions, axes) are expected")
        return obj.tolist()
    if type(obj) in (list, tuple):
        return type(obj)(_values(x, meta_of) for x in obj)
    return obj


def _int(obj, meta_of) -> int:
    return operator.index(_values(obj, meta_of))


def _count(obj, meta_of) -> int:
    """A count NumPy also takes as a float (tri(2.5), repeat(x, 2.5)), rounded up."""
    v = _values(obj, meta_of)
    return math.ceil(v) if isinstance(v, float) else operator.index(v)


def _ints(obj, meta_of) -> list[int]:
    v = _values(obj, meta_of)
    return [operator.index(x) for x in v] if isinstance(v, (list, tuple)) else [operator.index(v)]


def _span(shape) -> int:
    """Elements of `shape` with zero-length dims counted as 1: at least the size of any result
    made of some of its dims (a reduction, a diagonal, a per-matrix determinant)."""
    if 0 not in shape:
        return math.prod(shape)
    return math.prod([d or 1 for d in shape])


def _bcast(shapes) -> tuple:
    """Per dim (aligned right) the largest length: at least NumPy's broadcast of the shapes, and
    never an error (when they do not broadcast, the op raises before it allocates)."""
    nd = max((len(s) for s in shapes), default=0)
    out = [0] * nd
    for s in shapes:
        for i, d in enumerate(s, nd - len(s)):
            out[i] = max(out[i], d)
    return tuple(out)


def _axes(axis, nd) -> set | None:
    """Normalized axes of an axis argument; None when it names a dim that does not exist."""
    xs = axis if isinstance(axis, (list, tuple)) else (axis,)
    out = set()
    for x in xs:
        x = operator.index(x)
        if not -nd <= x < nd:
            return None
        out.add(x % nd)
    return out


def _kept_span(shape, axis) -> int:
    """Span of the dims a reduction over `axis` keeps (all of them for a bad axis)."""
    if axis is None:
        return 1
    axes = _axes(axis, len(shape))
    if axes is None:
        return _span(shape)
    return _span([d for i, d in enumerate(shape) if i not in axes])


def _dtype_args(args, kwargs) -> int:
    """The largest itemsize among dtype arguments (numpy.dtype from the codec, or a scalar type)."""
    return max([numpy.dtype(a).itemsize for a in (*args, *kwargs.values())
                if isinstance(a, numpy.dtype) or (isinstance(a, type) and issubclass(a, numpy.generic))], default=0)


def _inputs(args, kwargs, meta_of) -> tuple[int, int, int]:
    """(span of all array-like inputs, their largest itemsize, their promoted itemsize), with dtype
    arguments counted in both itemsizes. Top-level Python numbers are left out: NumPy promotes them
    weakly, and they are axes, counts and flags more often than data."""
    n, arrays, dtypes = 0, 0, set()
    for a in (*args, *kwargs.values()):
        m = meta_of(a)
        if m is not NOT_ARRAY:
            n += _span(m[0])
            arrays = max(arrays, m[1].itemsize)
            dtypes.add(m[1])
        elif type(a) in (list, tuple):
            found: set = set()
            n += max(_leaves(a, meta_of, found), 1)
            dtypes |= found
            arrays = max([arrays] + [d.itemsize for d in found])
    extra = _dtype_args(args, kwargs)
    promoted = numpy.result_type(*dtypes).itemsize if dtypes else 8
    return n, max(arrays, extra) or promoted, max(promoted, extra)


def _promoted(objs, meta_of, args=(), kwargs=None) -> int:
    """Itemsize of NumPy's promotion of the array-like `objs` (and any dtype argument)."""
    dtypes = {_meta(o, meta_of)[1] for o in objs if o is not None}
    isz = numpy.result_type(*dtypes).itemsize if dtypes else 8
    return max(isz, _dtype_args(args, kwargs or {}))


def _copies(args, kwargs, meta_of) -> int:
    """Logical bytes of the broadcast views (a zero stride on a dim longer than 1) among the
    arguments: an op that copies its inputs copies those at their full size."""
    n = 0
    for a in (*args, *kwargs.values()):
        m = meta_of(a)
        if m is not NOT_ARRAY and _broadcast(a, m[0]):
            n += math.prod(m[0]) * m[1].itemsize
    return n


def _broadcast(arr, shape) -> bool:
    strides = arr.strides
    return 0 in strides and any([s == 0 and d > 1 for s, d in zip(strides, shape)])


# -- rules ---------------------------------------------------------------------------------------

def _derived_fallback(entry, args, kwargs, meta_of) -> int:
    """The derived rules where gpuremote.meta has no cheap answer."""
    name, rule = entry.name, entry.rule
    if name == "where" and len(args) == 1:
        return _nonzero(args, kwargs, meta_of)
    if rule in ("matmul", "rmatmul", "dot") and "out" in kwargs:
        return 0                                        # the result is `out`
    if name in ("linspace", "logspace"):
        return _linspace(args, kwargs, meta_of, log=name == "logspace")
    if rule == "creation":
        # Device arrays read as values (a shape, N, k): after that, meta's shape rules apply.
        # A large array can only be a fill value (as a shape, NumPy refuses it): a 0-d stand-in.
        def host(a):
            m = meta_of(a)
            if m is NOT_ARRAY:
                return type(a)(host(x) for x in a) if type(a) in (list, tuple) else a
            return a.tolist() if math.prod(m[0]) <= _MAX_VALUES else numpy.zeros((), m[1])
        metas = derive(entry, tuple(host(a) for a in args), {k: host(v) for k, v in kwargs.items()}, meta_of)
        if metas is None:               # meta has a shape rule for every creation name but linspace's
            raise NotImplementedError(f"{name}: no size bound for these arguments")
        return sum(math.prod(s) * dt.itemsize for s, dt in metas)
    # No shape rule (random parameters given as lists holding arrays, matmul of a list): the
    # results broadcast the inputs, which is at most the product of their sizes.
    n = 1
    for a in (*args, *kwargs.values()):
        if type(a) in (list, tuple) or meta_of(a) is not NOT_ARRAY:
            n *= max(_leaves(a, meta_of, set()), 1)
    _, _, isz = _inputs(args, kwargs, meta_of)
    return n * max(16, isz) * max(entry.nout, 1)


def _reduction(entry, args, kwargs, meta_of, room) -> int:
    """Reductions and accumulations: at most one result element per input element (the span: an
    empty axis still leaves the others), of at most 8 bytes or the input's own itemsize. When that
    does not fit, gpuremote.meta's shape rule gives the exact size; but a broadcast input keeps the
    loose bound, since var, nansum and count_nonzero work on a copy of it at its full size."""
    if not args:
        return 0                        # the op raises NumPy's TypeError
    x = args[0]
    m = meta_of(x)
    array = m is not NOT_ARRAY
    shape, dtype = m if array else _meta(x, meta_of)
    isz = dtype.itemsize
    # a dtype argument comes third (sum(a, axis, dtype)) or by name
    out = max(8, isz, _dtype_args(args, kwargs)) if len(args) > 2 or "dtype" in kwargs else max(8, isz)
    loose = _span(shape) * (out + isz)
    if not array or (room is not None and loose <= room) or _broadcast(x, shape):
        return loose
    try:
        metas = derive(entry, args, kwargs, meta_of)
    except Exception:                   # e.g. axis=0 of a 0-d array, which NumPy takes: no tighter answer
        metas = None
    return loose if metas is None else sum(math.prod(s) * dt.itemsize for s, dt in metas)


def _no_growth(per_element: Callable, args, kwargs, meta_of) -> int:
    n, isz, promoted = _inputs(args, kwargs, meta_of)
    return n * per_element(isz, promoted)


# Ops whose results never hold more elements than their array inputs together (counted by span),
# each with its bytes per input element: results plus the working copies the op makes (sort and
# median copy their input, linalg hands LAPACK a copy, unique sorts a flat copy and returns indices).
# SAME: the input's dtype; INDEX: intp; WIDE: float64/int64, or wider when the inputs are; SETS:
# values, indices, inverse, counts and the sorted copy.
_SAME = lambda isz, wide: isz                                # noqa: E731
_SAME2 = lambda isz, wide: 2 * isz                           # noqa: E731
_INDEX2 = lambda isz, wide: _INDEX + isz                     # noqa: E731
_WIDE2 = lambda isz, wide: 2 * max(8, wide)                  # noqa: E731
_WIDE3 = lambda isz, wide: 3 * max(8, wide)                  # noqa: E731
_WIDE4 = lambda isz, wide: 4 * max(8, wide)                  # noqa: E731
_SETS = lambda isz, wide: 2 * wide + 5 * _INDEX              # noqa: E731
NO_GROWTH: dict[str, Callable[[int, int], int]] = {
    **dict.fromkeys(["delete", "iscomplex", "isreal", "packbits"], _SAME),
    **dict.fromkeys(["sort", "roll", "copy", "ascontiguousarray", "asfortranarray", "compress", "extract",
                     "trim_zeros", "fft.fftshift", "fft.ifftshift"], _SAME),
    **dict.fromkeys(["partition", "convolve", "correlate"], _SAME2),
    **dict.fromkeys(["argsort", "ndarray.argsort", "argpartition", "ndarray.argpartition", "lexsort", "digitize"],
                    _INDEX2),
    "ndarray.compress": _SAME,
    **dict.fromkeys(["trace", "ndarray.trace", "vdot", "linalg.det", "linalg.slogdet", "linalg.norm",
                     "linalg.eigvalsh", "linalg.matrix_rank", "linalg.inv", "linalg.cholesky",
                     "linalg.tensorinv", "linalg.tensorsolve"], _WIDE2),
    **dict.fromkeys(["median", "nanmedian", "interp", "linalg.eigh", "linalg.matrix_power"], _WIDE3),
    **dict.fromkeys(["average", "unwrap", "linalg.pinv"], _WIDE4),
    **dict.fromkeys(["unique", "intersect1d", "union1d", "setdiff1d", "setxor1d"], _SETS),
}


def _nonzero(args, kwargs, meta_of) -> int:
    m = _meta(_arg(args, kwargs, 0, "a"), meta_of)
    return max(len(m[0]), 1) * math.prod(m[0]) * _INDEX


def _reshape(args, kwargs, meta_of) -> int:
    """A view when the input's layout allows it (contiguous in the order asked), else a copy."""
    x = _arg(args, kwargs, 0, "a")
    m = meta_of(x)
    if m is NOT_ARRAY:
        return 0
    order = _arg(args, kwargs, 2, "order", "C")
    f = x.flags
    contiguous = f.c_contiguous if order == "C" else f.f_contiguous if order == "F" else \
        f.c_contiguous or f.f_contiguous
    if contiguous and not kwargs.get("copy"):
        return 0
    return math.prod(m[0]) * m[1].itemsize


def _method_reshape(args, kwargs, meta_of) -> int:
    return _reshape(args[:1], kwargs, meta_of)          # x.reshape(*shape, order=...)


def _ravel(args, kwargs, meta_of) -> int:
    return _reshape(args[:1], {"order": _arg(args, kwargs, 1, "order", "C")}, meta_of)


def _flatten(args, kwargs, meta_of) -> int:
    m = meta_of(args[0])
    return math.prod(m[0]) * m[1].itemsize


def _imag(args, kwargs, meta_of) -> int:
    m = meta_of(args[0])                                # the imaginary part of a real array: new zeros
    return 0 if m[1].kind == "c" else math.prod(m[0]) * m[1].itemsize


def _getitem(args, kwargs, meta_of) -> int:
    """Basic indexing makes a view; integer or boolean arrays in the key gather a copy whose
    size is the broadcast of the index arrays times the dims that slices, Ellipsis and the
    untouched trailing dims keep."""
    key = _arg(args, kwargs, 1, "key")
    t = type(key)
    if t in _BASIC_INDEX:
        return 0
    keys = key if t is tuple else (key,)
    if t is tuple and all([type(k) in _BASIC_INDEX for k in key]):
        return 0
    shape, dtype = meta_of(args[0])
    advanced, walk, consumed = [], [], 0
    for k in keys:
        tk = type(k)
        if tk is bool or isinstance(k, numpy.bool_):
            advanced.append((1,))                       # x[True]: a new axis of length 1 (or 0)
        elif tk is int or isinstance(k, numpy.integer):
            walk.append(1)
            consumed += 1
        elif tk is slice or k is None or k is Ellipsis:
            walk.append(k)
            consumed += k is not None and k is not Ellipsis
        else:
            km = _meta(k, meta_of)
            if km[1].kind == "b":                       # a mask: at most one hit per element
                advanced.append((math.prod(km[0]),))
                walk.append(len(km[0]))
                consumed += len(km[0])
            else:
                advanced.append(km[0])
                walk.append(1)
                consumed += 1
    if not advanced:
        return 0
    nd, d, kept = len(shape), 0, 1
    for w in walk:
        if w is Ellipsis:
            n = max(nd - consumed, 0)
            kept *= math.prod(shape[d:d + n])
            d += n
        elif type(w) is slice:
            kept *= len(range(*w.indices(shape[d]))) if d < nd else 1
            d += 1
        elif w is not None:
            d += w
    kept *= math.prod(shape[d:])
    return kept * math.prod(_bcast(advanced)) * dtype.itemsize


def _split(args, kwargs, meta_of) -> int:
    """Views, but each is a host object: split into 10**9 sections is 10**9 of them."""
    sections = _values(_arg(args, kwargs, 1, "indices_or_sections"), meta_of)
    n = len(sections) + 1 if isinstance(sections, (list, tuple)) else _count(sections, meta_of)
    return max(n, 1) * _ARRAY_OBJECT


def _zero(args, kwargs, meta_of) -> int:
    return 0


# Views (and ops that are views unless their input's layout forces a copy): no _copies added.
_VIEWS: dict[str, Callable] = {
    "reshape": _reshape, "ndarray.reshape": _method_reshape, "ravel": _ravel, "ndarray.ravel": _ravel,
    "ndarray.flatten": _flatten, "ndarray.imag": _imag, "ndarray.__getitem__": _getitem,
    "ndarray.view": _zero, "broadcast_arrays": _zero,
    **dict.fromkeys(["split", "array_split", "hsplit", "vsplit", "dsplit"], _split),
}


# -- growing ops ---------------------------------------------------------------------------------

def _concat(args, kwargs, meta_of) -> int:
    dtypes: set = set()
    n = _leaves(_arg(args, kwargs, 0, "arrays" if "arrays" in kwargs else "tup"), meta_of, dtypes)
    isz = numpy.result_type(*dtypes).itemsize if dtypes else 8
    return n * max(isz, _dtype_args(args, kwargs))


def _tile(args, kwargs, meta_of) -> int:
    shape, dtype = _meta(_arg(args, kwargs, 0, "A"), meta_of)
    n = math.prod(shape)
    for r in _ints(_arg(args, kwargs, 1, "reps"), meta_of):
        n *= max(r, 0)
    return n * dtype.itemsize


def _repeat(args, kwargs, meta_of) -> int:
    shape, dtype = _meta(_arg(args, kwargs, 0, "a"), meta_of)
    repeats = _arg(args, kwargs, 1, "repeats")
    axis = _arg(args, kwargs, 2, "axis", None)
    if meta_of(repeats) is NOT_ARRAY:
        repeats = numpy.asarray(repeats)
    size = math.prod(shape)
    if repeats.size <= 1:
        return size * max(_count(repeats.reshape(()).tolist() if repeats.size else 0, meta_of), 0) * dtype.itemsize
    axes = {0} if axis is None else _axes(axis, len(shape))
    length = size if axis is None else shape[axes.pop()] if axes else -1
    if repeats.dtype.kind not in "biu" or repeats.size != length:
        return 0                                        # NumPy refuses them (and sums nothing)
    # one count per element along the axis: the total is their sum (in float64 on the device,
    # which cannot overflow; the margin covers its rounding)
    total = float(repeats.sum(dtype=numpy.float64))
    total = math.ceil(max(total, 0.0) * (1 + 2**-12)) + 1
    return total * (size // length if length else 0) * dtype.itemsize


def _pad(args, kwargs, meta_of) -> int:
    shape, dtype = _meta(_arg(args, kwargs, 0, "array"), meta_of)
    widths = numpy.asarray(_values(_arg(args, kwargs, 1, "pad_width"), meta_of), dtype=object)
    widths = numpy.broadcast_to(widths, (len(shape), 2))        # NumPy's own reading, and its error
    n = 1
    for d, (before, after) in zip(shape, widths.tolist()):
        n *= d + max(round(before), 0) + max(round(after), 0)
    return n * dtype.itemsize


def _kron(args, kwargs, meta_of) -> int:
    a, b = _meta(_arg(args, kwargs, 0, "a"), meta_of), _meta(_arg(args, kwargs, 1, "b"), meta_of)
    isz = numpy.result_type(a[1], b[1]).itemsize
    return 2 * math.prod(a[0]) * math.prod(b[0]) * isz      # the outer product, and its reordered copy


def _outer(args, kwargs, meta_of) -> int:
    a, b = _meta(_arg(args, kwargs, 0, "a"), meta_of), _meta(_arg(args, kwargs, 1, "b"), meta_of)
    return math.prod(a[0]) * math.prod(b[0]) * numpy.result_type(a[1], b[1]).itemsize


def _append(args, kwargs, meta_of) -> int:
    """append(arr, values): both, flattened or joined, in their promoted dtype."""
    n, _, promoted = _inputs(args, kwargs, meta_of)
    return n * promoted


def _ravel_multi_index(args, kwargs, meta_of) -> int:
    """Flat indices (intp) of the index arrays broadcast together."""
    index = _arg(args, kwargs, 0, "multi_index")
    shapes = [_meta(i, meta_of)[0] for i in index] if type(index) in (list, tuple) else [_meta(index, meta_of)[0]]
    return math.prod(_bcast(shapes)) * _INDEX


def _resize(args, kwargs, meta_of) -> int:
    """resize(a, new_shape) joins whole copies of `a` and keeps the first elements: the result is a
    view of those copies (and a flat copy of `a` may come first)."""
    shape, dtype = _meta(_arg(args, kwargs, 0, "a"), meta_of)
    n, size = math.prod([max(s, 0) for s in _ints(_arg(args, kwargs, 1, "new_shape"), meta_of)]), math.prod(shape)
    copies = -(-n // size) if size else 0
    return max(n, (copies + 1) * size) * dtype.itemsize     # (an empty `a` gives zeros of the new shape)


def _select(args, kwargs, meta_of) -> int:
    """select(condlist, choicelist, default): the broadcast of every condition and choice, at most
    16 bytes an element."""
    shapes = []
    for group in (_arg(args, kwargs, 0, "condlist"), _arg(args, kwargs, 1, "choicelist")):
        for item in (group if type(group) in (list, tuple) else [group]):
            shapes.append(_meta(item, meta_of)[0])
    return math.prod(_bcast(shapes)) * 16


def _vander(args, kwargs, meta_of) -> int:
    shape, dtype = _meta(_arg(args, kwargs, 0, "x"), meta_of)
    n = _arg(args, kwargs, 1, "N", None)
    columns = math.prod(shape) if n is None else max(_int(n, meta_of), 0)
    return math.prod(shape) * columns * max(8, dtype.itemsize)


def _unravel_index(args, kwargs, meta_of) -> int:
    """One intp array per dimension of `shape`, each the size of the indices."""
    shape, _ = _meta(_arg(args, kwargs, 0, "indices"), meta_of)
    return max(len(_ints(_arg(args, kwargs, 1, "shape"), meta_of)), 1) * _span(shape) * _INDEX


def _diag_indices(args, kwargs, meta_of) -> int:
    """`ndim` index arrays of n entries; ndim is the rank of the arrays they index, so at most 64
    (NumPy's limit): more would be that many separate results for one call."""
    ndim = _int(_arg(args, kwargs, 1, "ndim", 2), meta_of)
    if ndim > 64:
        raise ValueError(f"diag_indices: ndim={ndim} is more dimensions than an array can have (64)")
    return max(_int(_arg(args, kwargs, 0, "n"), meta_of), 0) * max(ndim, 1) * _INDEX


def _tri_indices(args, kwargs, meta_of) -> int:
    """tril_indices(n, k, m) and triu_indices: two index arrays, at most n * m entries each."""
    n = max(_int(_arg(args, kwargs, 0, "n"), meta_of), 0)
    m = _arg(args, kwargs, 2, "m", None)
    return 2 * n * (n if m is None else max(_int(m, meta_of), 0)) * _INDEX


def _ufunc_outer(args, kwargs, meta_of) -> int:
    """add.outer(a, b) and the like: a.shape + b.shape, of any dtype (a dtype= may widen it)."""
    a, b = _meta(_arg(args, kwargs, 0, "A"), meta_of), _meta(_arg(args, kwargs, 1, "B"), meta_of)
    return math.prod(a[0]) * math.prod(b[0]) * 16


def _inner(args, kwargs, meta_of) -> int:
    a, b = _meta(_arg(args, kwargs, 0, "a"), meta_of), _meta(_arg(args, kwargs, 1, "b"), meta_of)
    isz = numpy.result_type(a[1], b[1]).itemsize
    if not a[0] or not b[0]:                            # a scalar operand: an elementwise product
        return max(math.prod(a[0]), math.prod(b[0])) * isz
    return math.prod(a[0][:-1]) * math.prod(b[0][:-1]) * isz


def _tensordot(args, kwargs, meta_of) -> int:
    a, b = _meta(_arg(args, kwargs, 0, "a"), meta_of), _meta(_arg(args, kwargs, 1, "b"), meta_of)
    axes = _values(_arg(args, kwargs, 2, "axes", 2), meta_of)
    na, nb = len(a[0]), len(b[0])
    if isinstance(axes, (list, tuple)):
        xa, xb = axes
    else:
        k = operator.index(axes)
        xa, xb = list(range(-k, 0)), list(range(k))
    xa, xb = _axes(xa, na) or set(), _axes(xb, nb) or set()   # a bad axis contracts nothing (NumPy refuses)
    n = math.prod([d for i, d in enumerate(a[0]) if i not in xa]) * \
        math.prod([d for i, d in enumerate(b[0]) if i not in xb])
    return n * numpy.result_type(a[1], b[1]).itemsize


def _einsum(args, kwargs, meta_of) -> int:
    """The output's labels' sizes (and with `optimize`, its largest intermediate), read on zero-strided
    stand-ins, on which NumPy's subscript parser and path finder only look at shapes."""
    stand = [virtual(m) if (m := meta_of(a)) is not NOT_ARRAY else a for a in args]
    ops = [a for a in stand if isinstance(a, numpy.ndarray)]
    isz = max(numpy.result_type(*[o.dtype for o in ops]).itemsize if ops else 8, _dtype_args(args, kwargs))
    try:
        from numpy._core.einsumfunc import _parse_einsum_input    # how np.einsum reads its subscripts
        inputs, output, operands = _parse_einsum_input(stand)
        sizes: dict = {}
        for term, op in zip(inputs.split(","), operands):
            for label, d in zip(term, numpy.shape(op)):
                sizes[label] = max(sizes.get(label, 0), d)
        n = math.prod([sizes.get(label, 1) for label in output])
        if kwargs.get("optimize"):
            text = numpy.einsum_path(*stand, optimize=kwargs["optimize"])[1]
            largest = float(text.split("Largest intermediate:")[1].split()[0])
            n += math.ceil(largest * 1.001)
    except (ImportError, AttributeError, IndexError):
        # every output label's size is one operand dim: the product of all of them bounds it
        n = math.prod([_span(o.shape) for o in ops]) * (2 if kwargs.get("optimize") else 1)
    return n * isz


def _diag(args, kwargs, meta_of) -> int:
    shape, dtype = _meta(_arg(args, kwargs, 0, "v"), meta_of)
    k = abs(_int(_arg(args, kwargs, 1, "k", 0), meta_of))
    if len(shape) == 1:                                 # a vector becomes a square matrix
        return (shape[0] + k) ** 2 * dtype.itemsize
    return min(shape, default=1) * dtype.itemsize


def _diagflat(args, kwargs, meta_of) -> int:
    shape, dtype = _meta(_arg(args, kwargs, 0, "v"), meta_of)
    k = abs(_int(_arg(args, kwargs, 1, "k", 0), meta_of))
    return (math.prod(shape) + k) ** 2 * dtype.itemsize


def _tri_part(args, kwargs, meta_of) -> int:
    """tril/triu: the input's size, a vector made a square matrix; plus the boolean mask."""
    shape, dtype = _meta(_arg(args, kwargs, 0, "m"), meta_of)
    if len(shape) == 1:
        return shape[0] ** 2 * (dtype.itemsize + 1)
    return math.prod(shape) * dtype.itemsize + math.prod(shape[-2:])


def _tri(args, kwargs, meta_of) -> int:
    n = _count(_arg(args, kwargs, 0, "N"), meta_of)
    m = _arg(args, kwargs, 1, "M", None)
    m = n if m is None else _count(m, meta_of)
    dtype = numpy.dtype(_arg(args, kwargs, 3, "dtype", float))
    return max(n, 0) * max(m, 0) * (dtype.itemsize + 1)        # the result and its boolean mask


def _indices(args, kwargs, meta_of) -> int:
    dims = [max(d, 0) for d in _ints(_arg(args, kwargs, 0, "dimensions"), meta_of)]
    isz = numpy.dtype(_arg(args, kwargs, 1, "dtype", int)).itemsize
    if _arg(args, kwargs, 2, "sparse", False):
        return sum(dims) * isz
    return len(dims) * math.prod(dims) * isz


def _meshgrid(args, kwargs, meta_of) -> int:
    metas = [_meta(a, meta_of) for a in args]
    if not kwargs.get("copy", True):
        return 0                                        # broadcast views of the inputs
    if kwargs.get("sparse", False):
        return sum(math.prod(s) * dt.itemsize for s, dt in metas)
    total = math.prod([math.prod(s) for s, _ in metas])
    return sum(total * dt.itemsize for _, dt in metas)


def _cross(args, kwargs, meta_of) -> int:
    a, b = _meta(_arg(args, kwargs, 0, "a"), meta_of), _meta(_arg(args, kwargs, 1, "b"), meta_of)
    axis = _arg(args, kwargs, 5, "axis", None)
    axa = axis if axis is not None else _arg(args, kwargs, 2, "axisa", -1)
    axb = axis if axis is not None else _arg(args, kwargs, 3, "axisb", -1)

    def batch(shape, ax):                               # the dims besides the vector's
        axes = _axes(ax, len(shape))
        return tuple(d for i, d in enumerate(shape) if not axes or i not in axes)
    return 3 * math.prod(_bcast([batch(a[0], axa), batch(b[0], axb)])) * numpy.result_type(a[1], b[1]).itemsize


def _take(args, kwargs, meta_of) -> int:
    shape, dtype = _meta(_arg(args, kwargs, 0, "a"), meta_of)
    idx = _meta(_arg(args, kwargs, 1, "indices"), meta_of)
    axis = _arg(args, kwargs, 2, "axis", None)
    if axis is None:
        return math.prod(idx[0]) * dtype.itemsize
    axes = _axes(axis, len(shape))
    if not axes:
        return 0                                        # NumPy refuses the axis
    ax = axes.pop()
    return math.prod([d for i, d in enumerate(shape) if i != ax]) * math.prod(idx[0]) * dtype.itemsize


def _take_along_axis(args, kwargs, meta_of) -> int:
    shape, dtype = _meta(_arg(args, kwargs, 0, "arr"), meta_of)
    idx = _meta(_arg(args, kwargs, 1, "indices"), meta_of)[0]
    axis = _arg(args, kwargs, 2, "axis", -1)
    if axis is None or len(idx) != len(shape):
        return math.prod(idx) * dtype.itemsize
    axes = _axes(axis, len(shape)) or set()
    return math.prod([i_ if k in axes else max(a, i_) for k, (a, i_) in enumerate(zip(shape, idx))]) * \
        dtype.itemsize


def _choose(args, kwargs, meta_of) -> int:
    a = _meta(_arg(args, kwargs, 0, "a"), meta_of)
    choices = _arg(args, kwargs, 1, "choices")
    if meta_of(choices) is not NOT_ARRAY or type(choices) not in (list, tuple):
        m = _meta(choices, meta_of)
        shapes, dtypes = [m[0][1:]], [m[1]]
    else:
        metas = [_meta(c, meta_of) for c in choices]
        shapes, dtypes = [s for s, _ in metas], [dt for _, dt in metas]
    isz = numpy.result_type(*dtypes).itemsize if dtypes else 8
    return math.prod(_bcast([a[0], *shapes])) * isz


def _searchsorted(args, kwargs, meta_of) -> int:
    return math.prod(_meta(_arg(args, kwargs, 1, "v"), meta_of)[0]) * _INDEX


def _quantile(args, kwargs, meta_of) -> int:
    shape, dtype = _meta(_arg(args, kwargs, 0, "a"), meta_of)
    q = _meta(_arg(args, kwargs, 1, "q"), meta_of)
    kept = _kept_span(shape, _arg(args, kwargs, 2, "axis", None))
    isz = max(8, dtype.itemsize, q[1].itemsize)
    return (max(math.prod(q[0]), 1) * kept + _span(shape)) * isz    # results, and the partitioned copy


def _nanquantile(args, kwargs, meta_of) -> int:
    """nanpercentile/nanquantile: quantile's bound, and a copy of the data with its NaN mask."""
    shape, dtype = _meta(_arg(args, kwargs, 0, "a"), meta_of)
    return _quantile(args, kwargs, meta_of) + _span(shape) * (max(8, dtype.itemsize) + 1)


def _unpackbits(args, kwargs, meta_of) -> int:
    """Eight bits of each byte, or `count` bits of each row along the axis (zeros past its bytes)."""
    shape, _ = _meta(_arg(args, kwargs, 0, "a"), meta_of)
    axis, count = _arg(args, kwargs, 1, "axis", None), _arg(args, kwargs, 2, "count", None)
    along = _span(shape) if axis is None else max(_span([shape[a] for a in _axes(axis, len(shape)) or ()]), 1)
    bits = 8 * along if count is None else max(abs(_int(count, meta_of)), 8 * along)
    return _span(shape) // max(along, 1) * bits + _span(shape)      # the result, and a contiguous copy


def _histogram2d(args, kwargs, meta_of) -> int:
    """(H, xedges, yedges): H holds a bin per pair of edges; NumPy also stacks the samples, finds
    each one's bin along both axes and counts the flat bins (bincount)."""
    x, _ = _meta(_arg(args, kwargs, 0, "x"), meta_of)
    bins = _arg(args, kwargs, 2, "bins", 10)
    if isinstance(bins, str) or (type(bins) in (list, tuple) and any(isinstance(b, str) for b in bins)):
        raise NotImplementedError("histogram2d: only integer and array bins are implemented (as in CuPy)")
    m = meta_of(bins)
    if m is not NOT_ARRAY:
        edges = [math.prod(m[0])] * 2           # one array: the edges of both axes
    elif type(bins) in (list, tuple) and len(bins) == 2:
        edges = [math.prod(_meta(b, meta_of)[0]) if meta_of(b) is not NOT_ARRAY or type(b) in (list, tuple)
                 else operator.index(b) + 1 for b in bins]
    else:
        edges = [operator.index(bins) + 1] * 2
    cells = math.prod(max(e, 1) + 1 for e in edges)
    return (3 * cells + sum(edges)) * 8 + 6 * _span(x) * 8


def _ix(args, kwargs, meta_of) -> int:
    """ix_: each argument as an index array shaped to broadcast (a view of an integer array, the
    indices of the True items of a boolean one, a new array of a list)."""
    return sum(max(_leaves(a, meta_of, set()), 1) if meta_of(a) is NOT_ARRAY else _span(meta_of(a)[0])
               for a in args) * _INDEX


def _cov(args, kwargs, meta_of) -> int:
    """cov/corrcoef: a V x V matrix of the V variables (rows, or columns with rowvar=False)."""
    m = _meta(_arg(args, kwargs, 0, "m" if "m" in kwargs else "x"), meta_of)
    y = _arg(args, kwargs, 1, "y", None)
    rowvar = _arg(args, kwargs, 2, "rowvar", True)
    metas = [m] if y is None else [m, _meta(y, meta_of)]
    v = sum(1 if len(s) < 2 else s[0] if rowvar else s[1] for s, _ in metas)
    n = sum(_span(s) for s, _ in metas)
    isz = max(8, numpy.result_type(*[dt for _, dt in metas]).itemsize, _dtype_args(args, kwargs))
    return (v * v + 2 * n) * isz                        # the result; the stacked and the centred copies


def _histogram(args, kwargs, meta_of) -> int:
    shape, _ = _meta(_arg(args, kwargs, 0, "a"), meta_of)
    bins = _arg(args, kwargs, 1, "bins", 10)
    if isinstance(bins, str):
        # the number of bins would come from the data; CuPy refuses string bins too
        raise NotImplementedError("histogram: only integer and array bins are implemented (as in CuPy)")
    if meta_of(bins) is not NOT_ARRAY or type(bins) in (list, tuple):
        edges = math.prod(_meta(bins, meta_of)[0])
    else:
        edges = operator.index(bins) + 1
    # counts, edges and a bincount of `edges` bins, plus a sorted copy of the data and weights
    return (3 * max(edges, 1) + 2 * _span(shape)) * 16


def _bincount(args, kwargs, meta_of) -> int:
    x = _arg(args, kwargs, 0, "x")
    if meta_of(x) is NOT_ARRAY:
        x = numpy.asarray(x)
    minlength = _arg(args, kwargs, 2, "minlength", 0)
    n = 0 if minlength is None else _int(minlength, meta_of)
    # one count per value up to the largest: read it (NumPy refuses non-integers and uint64)
    if x.size and x.dtype.kind in "biu" and x.dtype != numpy.uint64:
        n = max(n, int(x.max()) + 1)
    return max(n, 0) * 8


def _isin(args, kwargs, meta_of) -> int:
    a, b = _meta(_arg(args, kwargs, 0, "element"), meta_of), _meta(_arg(args, kwargs, 1, "test_elements"), meta_of)
    n = _span(a[0]) + _span(b[0])
    total = n * (2 * max(8, numpy.result_type(a[1], b[1]).itemsize) + 2 * _INDEX) + 6 * n  # sorting; auto table
    test = _arg(args, kwargs, 1, "test_elements")
    if kwargs.get("kind") == "table" and math.prod(b[0]) and b[1].kind in "iu":
        # a lookup table over the test values' range, whatever its size: read the range
        if meta_of(test) is NOT_ARRAY:
            test = numpy.asarray(test)
        total += int(test.max()) - int(test.min()) + 1
    return total


def _diff(args, kwargs, meta_of) -> int:
    x = _arg(args, kwargs, 0, "a")
    span = _span(_meta(x, meta_of)[0])
    ends = [_arg(args, kwargs, i, k, None) for i, k in ((3, "prepend"), (4, "append"))]
    ends = [e for e in ends if e is not None]
    # a scalar end is broadcast to one slice of `a`: at most its span
    n = span + sum(max(_span(_meta(e, meta_of)[0]), span) for e in ends)
    return 2 * n * _promoted([x, *ends], meta_of)   # the joined copy, and the differences


def _gradient(args, kwargs, meta_of) -> int:
    shape, dtype = _meta(_arg(args, kwargs, 0, "f"), meta_of)
    axis = kwargs.get("axis")
    k = len(shape) if axis is None else len(axis) if isinstance(axis, (list, tuple)) else 1
    return (k + 1) * _span(shape) * max(8, dtype.itemsize)


def _cumulative_sum(args, kwargs, meta_of) -> int:
    shape, dtype = _meta(_arg(args, kwargs, 0, "x"), meta_of)
    n = _span(shape) * (2 if kwargs.get("include_initial") else 1)   # plus one slice of initial values
    return n * max(8, dtype.itemsize, _dtype_args(args, kwargs))


def _polyval(args, kwargs, meta_of) -> int:
    p, x = _meta(_arg(args, kwargs, 0, "p"), meta_of), _meta(_arg(args, kwargs, 1, "x"), meta_of)
    n = math.prod(_bcast([x[0], p[0][1:]]))             # coefficient rows broadcast against x
    return 2 * n * max(8, numpy.result_type(p[1], x[1]).itemsize)


def _polyfit(args, kwargs, meta_of) -> int:
    x, y = _meta(_arg(args, kwargs, 0, "x"), meta_of), _meta(_arg(args, kwargs, 1, "y"), meta_of)
    n = max(_int(_arg(args, kwargs, 2, "deg"), meta_of) + 1, 1)
    m = _span(x[0])
    k = y[0][1] if len(y[0]) == 2 else 1
    cov = n * n * k if _arg(args, kwargs, 6, "cov", False) else 0
    # the Vandermonde matrix and its scaled copy, lstsq's copies; coefficients, singular values, cov
    return (3 * m * n + 2 * m * k + n * k + 2 * n + cov + 8) * 16


def _solve(args, kwargs, meta_of) -> int:
    a, b = _meta(_arg(args, kwargs, 0, "a"), meta_of), _meta(_arg(args, kwargs, 1, "b"), meta_of)
    sa, sb = a[0], b[0]
    if len(sa) < 2:
        return 0                                        # NumPy refuses it
    n = sa[-1]
    if len(sb) == 1:
        elems = math.prod(sa[:-2]) * (n * n + n)
    else:                                               # stacks broadcast: (N,1,n,n) with (1,M,n,k)
        elems = math.prod(_bcast([sa[:-2], sb[:-2]])) * (n * n + sb[-2] * sb[-1])
    return elems * max(8, numpy.result_type(a[1], b[1]).itemsize)


def _matrix(args, kwargs, meta_of):
    shape, dtype = _meta(_arg(args, kwargs, 0, "a"), meta_of)
    if len(shape) < 2:
        raise _Absent                                   # NumPy refuses it
    m, n = shape[-2], shape[-1]
    return _span(shape[:-2]), m, n, min(m, n), max(8, dtype.itemsize)


def _qr(args, kwargs, meta_of) -> int:
    b, m, n, k, isz = _matrix(args, kwargs, meta_of)
    mode = _arg(args, kwargs, 1, "mode", "reduced")
    q = m * m if mode == "complete" else m * k          # 'complete' makes an m x m Q of an m x n input
    return b * (q + k * n + m * n + 2 * k + n) * isz    # Q, R, the working copy, tau


def _svd(args, kwargs, meta_of) -> int:
    b, m, n, k, isz = _matrix(args, kwargs, meta_of)
    full = _arg(args, kwargs, 1, "full_matrices", True)
    uv = 0 if not _arg(args, kwargs, 2, "compute_uv", True) else m * m + n * n if full else m * k + k * n
    return b * (uv + k + m * n) * isz                   # U and Vh (m x m and n x n when full), S, the copy


def _lstsq(args, kwargs, meta_of) -> int:
    a, b = _meta(_arg(args, kwargs, 0, "a"), meta_of), _meta(_arg(args, kwargs, 1, "b"), meta_of)
    if len(a[0]) != 2:
        return 0                                        # NumPy refuses it
    m, n = a[0]
    k = b[0][1] if len(b[0]) == 2 else 1
    isz = max(8, numpy.result_type(a[1], b[1]).itemsize)
    return (n * k + k + min(m, n) + 1 + m * n + max(m, n) * k) * isz


def _multi_dot(args, kwargs, meta_of) -> int:
    metas = [_meta(a, meta_of) for a in _arg(args, kwargs, 0, "arrays")]
    if len(metas) < 2:
        return 0                                        # NumPy refuses it
    dims = [metas[0][0][0] if len(metas[0][0]) == 2 else 1]
    dims += [s[-1] if s else 1 for s, _ in metas[:-1]]
    dims.append(metas[-1][0][-1] if len(metas[-1][0]) == 2 else 1)
    top = sorted(dims)[-2:]                             # any intermediate is dims[i] x dims[j]
    isz = numpy.result_type(*[dt for _, dt in metas]).itemsize
    return (len(metas) - 1) * top[0] * top[1] * isz


_FFT_C2R = frozenset({"fft.irfft", "fft.hfft", "fft.irfft2", "fft.irfftn"})


def _fft(name):
    one_d = name in ("fft.fft", "fft.ifft", "fft.rfft", "fft.irfft", "fft.hfft", "fft.ihfft")

    def fn(args, kwargs, meta_of) -> int:
        """The input's shape with each transformed axis resized to its n (s); a complex-to-real
        transform's default length is 2(m-1). Plus the resized, complex working copy."""
        shape, dtype = _meta(_arg(args, kwargs, 0, "a"), meta_of)
        shape, nd = list(shape), len(shape)
        if one_d:
            n = _arg(args, kwargs, 1, "n", None)
            axes, sizes = [_arg(args, kwargs, 2, "axis", -1)], [None if n is None else _int(n, meta_of)]
        else:
            s = _arg(args, kwargs, 1, "s", None)
            s = None if s is None else _ints(s, meta_of)
            axes = _arg(args, kwargs, 2, "axes", None)
            if axes is not None:
                axes = _ints(axes, meta_of)
            elif name.endswith("2"):
                axes = [-2, -1]
            else:
                axes = list(range(-len(s), 0)) if s is not None else list(range(nd))
            sizes = s if s is not None else [None] * len(axes)
        for i, (ax, n) in enumerate(zip(axes, sizes)):
            ax = operator.index(ax)
            if not -nd <= ax < nd:
                continue                                # NumPy refuses it
            old = shape[ax]
            if n is None or n == -1:
                n = 2 * old if name in _FFT_C2R and i == len(axes) - 1 else old
            shape[ax] = max(n, 0)
        out = dtype.itemsize if dtype.kind == "c" else max(16, 2 * dtype.itemsize)   # complex results
        return 2 * math.prod(shape) * out
    return fn


def _fftfreq(args, kwargs, meta_of) -> int:
    n = _int(_arg(args, kwargs, 0, "n"), meta_of)
    d = _arg(args, kwargs, 1, "d", 1.0)
    dm = _meta(d, meta_of)
    return max(n, 0) * _span(dm[0]) * max(8, 2 * dm[1].itemsize)   # n samples, broadcast against d


def _linspace(args, kwargs, meta_of, log=False) -> int:
    ends = [_arg(args, kwargs, 0, "start"), _arg(args, kwargs, 1, "stop")]
    if log:                                             # logspace(start, stop, num, endpoint, base)
        ends.append(_arg(args, kwargs, 4, "base", 10.0))
    num = _int(_arg(args, kwargs, 2, "num", 50), meta_of)
    metas = [_meta(e, meta_of) for e in ends]
    n = max(num, 0) * math.prod([_span(s) for s, _ in metas])   # samples, at the ends' broadcast shape
    isz = max(8, numpy.result_type(*[dt for _, dt in metas]).itemsize, _dtype_args(args, kwargs))
    return (n + math.prod([_span(s) for s, _ in metas])) * isz  # and the step


def _permutation(args, kwargs, meta_of) -> int:
    x = _arg(args, kwargs, 0, "x")
    if meta_of(x) is NOT_ARRAY and isinstance(x, (int, numpy.integer)):
        return max(int(x), 0) * _INDEX                  # permutation(n): a shuffled arange(n)
    shape, dtype = _meta(x, meta_of)
    return math.prod(shape) * dtype.itemsize


def _param_types(params: str, inputs: int) -> list[int]:
    """Itemsizes of a kernel's parameters ("float32 y, T z"); a type placeholder takes the widest input."""
    out = []
    for p in params.split(","):
        words = p.split()
        try:
            dt = numpy.dtype(words[-2]) if len(words) >= 2 else None
        except TypeError:
            dt = None
        out.append(dt.itemsize if dt is not None and dt.kind in "biufc" else max(inputs, 8))
    return out


def _kernel(reduction: bool):
    def fn(args, kwargs, meta_of) -> int:
        spec = _arg(args, kwargs, 0, "spec")
        if not isinstance(spec, dict):
            return 0                                    # the daemon refuses it
        metas = [m for m in map(meta_of, args[1:]) if m is not NOT_ARRAY]
        inputs = max([dt.itemsize for _, dt in metas], default=8)
        if reduction:
            n = 1 if kwargs.get("axis") is None else _span(_bcast([s for s, _ in metas]))
        else:
            size = kwargs.get("size")
            n = operator.index(size) if size is not None else math.prod(_bcast([s for s, _ in metas]))
        return n * sum(_param_types(str(spec.get("out_params", "")), inputs))
    return fn


def _compare(args, kwargs, meta_of) -> int:
    """array_equal/allclose/array_equiv: one boolean, but NumPy compares (allclose subtracts)
    at the inputs' broadcast shape: a few float temporaries of that shape."""
    metas = [_meta(_arg(args, kwargs, i, k), meta_of) for i, k in ((0, "a1" if "a1" in kwargs else "a"),
                                                                   (1, "a2" if "a2" in kwargs else "b"))]
    isz = max(8, numpy.result_type(*[dt for _, dt in metas]).itemsize)
    return math.prod(_bcast([s for s, _ in metas])) * (2 * isz + 2)


_BOUNDS: dict[str, Callable] = {
    **dict.fromkeys(["concatenate", "stack", "hstack", "vstack", "dstack", "column_stack"], _concat),
    "tile": _tile, "repeat": _repeat, "ndarray.repeat": _repeat, "pad": _pad, "kron": _kron,
    "outer": _outer, "inner": _inner, "tensordot": _tensordot, "einsum": _einsum, "diag": _diag,
    "diagflat": _diagflat, "tril": _tri_part, "triu": _tri_part, "tri": _tri, "indices": _indices,
    "meshgrid": _meshgrid, "cross": _cross, "take": _take, "ndarray.take": _take,
    "take_along_axis": _take_along_axis, "choose": _choose, "ndarray.choose": _choose, "searchsorted": _searchsorted,
    "ndarray.searchsorted": _searchsorted, "percentile": _quantile, "quantile": _quantile,
    "nanpercentile": _nanquantile, "nanquantile": _nanquantile, "unpackbits": _unpackbits,
    "histogram2d": _histogram2d, "ix_": _ix,
    "cov": _cov, "corrcoef": _cov, "histogram": _histogram, "bincount": _bincount, "isin": _isin,
    "in1d": _isin, "diff": _diff, "gradient": _gradient, "cumulative_sum": _cumulative_sum,
    "polyval": _polyval, "polyfit": _polyfit, "linalg.solve": _solve, "linalg.qr": _qr,
    "linalg.svd": _svd, "linalg.lstsq": _lstsq, "linalg.multi_dot": _multi_dot,
    "fft.fftfreq": _fftfreq, "fft.rfftfreq": _fftfreq, "random.permutation": _permutation,
    "nonzero": _nonzero, "ndarray.nonzero": _nonzero, "flatnonzero": _nonzero, "argwhere": _nonzero,
    "array_equal": _compare, "allclose": _compare, "array_equiv": _compare,
    "kernel.elementwise": _kernel(False), "kernel.reduction": _kernel(True),
    **{f"{u}.outer": _ufunc_outer for u in UFUNC_METHODS},
    "append": _append, "ravel_multi_index": _ravel_multi_index, "resize": _resize, "select": _select,
    "vander": _vander, "unravel_index": _unravel_index, "diag_indices": _diag_indices,
    "tril_indices": _tri_indices, "triu_indices": _tri_indices,
    **{n: _fft(n) for n in ("fft.fft", "fft.ifft", "fft.fft2", "fft.ifft2", "fft.fftn", "fft.ifftn",
                            "fft.rfft", "fft.irfft", "fft.rfft2", "fft.irfft2", "fft.rfftn", "fft.irfftn",
                            "fft.hfft", "fft.ihfft")},
}
