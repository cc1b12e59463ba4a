"""Python values <-> gpuremote.v1.Value messages.

Both ends use this module. Encoding turns a remote array into its handle through a callback
(the codec knows nothing of proxies); decoding turns a handle back into whatever the caller's
`resolve` returns (an array on the daemon). Everything decoded is validated: dtype kinds
outside bool/int/uint/float/complex, ranks past the limit, byte counts that do not match the
shape and nesting deeper than the limit are refused with a clear error.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy

from gpuremote._config import DEFAULTS
from gpuremote.errors import LimitExceededError, UnsupportedOperationError
from gpuremote.v1 import value_pb2 as vpb

# Device arrays hold these dtype kinds only, as on CuPy: bool, signed, unsigned, float, complex.
ARRAY_KINDS = frozenset("biufc")
_INT64 = (-(2**63), 2**63 - 1)
_DTYPE_CACHE: dict[str, numpy.dtype] = {}


def check_dtype(dtype: Any) -> numpy.dtype:
    """Return numpy.dtype(dtype) if a device array may hold it, else raise TypeError."""
    try:
        dt = numpy.dtype(dtype)
    except TypeError as exc:
        raise TypeError(f"not a dtype: {dtype!r}") from exc
    if dt.kind not in ARRAY_KINDS or dt.fields is not None or dt.subdtype is not None:
        raise TypeError(f"dtype {dt} is not supported on the device: use bool, integer, float or complex")
    return dt


def dtype_from_wire(text: str) -> numpy.dtype:
    dt = _DTYPE_CACHE.get(text)
    if dt is None:
        if len(text) > 16:
            raise TypeError(f"not a dtype: {text[:32]!r}")
        dt = check_dtype(text)
        _DTYPE_CACHE[text] = dt
    return dt


def checked_shape(shape, itemsize: int, max_bytes: int | None = None) -> tuple[int, ...]:
    """Validate a shape (rank, non-negative extents, total size) and return it as a tuple of ints."""
    shape = tuple(map(int, shape))       # (one pass in C: this runs for every array that crosses the wire)
    if len(shape) > DEFAULTS.max_rank:
        raise LimitExceededError(f"array rank {len(shape)} exceeds the limit of {DEFAULTS.max_rank}")
    nonzero = 1
    for s in shape:
        if s < 0:
            raise ValueError(f"negative dimensions are not allowed: {shape}")
        if s:
            nonzero *= s
    # NumPy's own bounds: each extent and the byte size of the nonzero extents fit in intp.
    if nonzero * max(itemsize, 1) > _INT64[1]:
        raise ValueError(f"array is too big; `arr.size * arr.dtype.itemsize` is larger than the maximum "
                         f"possible size (shape {shape}, {itemsize} bytes per element)")
    nbytes = 0 if 0 in shape else nonzero * itemsize
    limit = max_bytes if max_bytes is not None else 2**62
    if nbytes > limit:
        raise LimitExceededError(f"array of shape {shape} needs {nbytes} bytes, more than the limit of {limit}")
    return shape


def fill_array(msg: vpb.HostArray, arr: numpy.ndarray, scalar: bool = False) -> None:
    dt = arr.dtype
    if dt.kind not in ARRAY_KINDS:
        raise TypeError(f"arrays of dtype {dt} cannot be sent to the device (object, string and "
                        "structured dtypes are not supported)")
    msg.dtype = dt.str
    msg.shape.extend(arr.shape)
    msg.data = numpy.ascontiguousarray(arr).tobytes()
    msg.scalar = scalar


def array_from_wire(msg: vpb.HostArray, writable: bool = False) -> numpy.ndarray:
    dt = dtype_from_wire(msg.dtype)
    shape = msg.shape[:]    # each read of a message field makes a new object: read each one once
    data = msg.data
    if not shape:  # 0-d (NumPy scalars such as a float32 learning rate): the common small case
        if len(data) != dt.itemsize:
            raise ValueError(f"array payload is {len(data)} bytes, but a 0-d {dt} needs {dt.itemsize}")
        arr = numpy.frombuffer(data, dtype=dt).reshape(())
        return arr.copy() if writable else arr
    shape = checked_shape(shape, dt.itemsize)
    if len(data) != math.prod(shape) * dt.itemsize:
        raise ValueError(f"array payload is {len(data)} bytes, but shape {shape} of {dt} needs "
                         f"{math.prod(shape) * dt.itemsize}")
    arr = numpy.frombuffer(data, dtype=dt).reshape(shape)
    return arr.copy() if writable else arr


def is_dtype_like(obj: Any) -> bool:
    return isinstance(obj, numpy.dtype) or (isinstance(obj, type) and (
        issubclass(obj, numpy.generic) or obj in (bool, int, float, complex)))


def encode(obj: Any, msg: vpb.Value, handle_of: Callable[[Any], int | None], depth: int = 0) -> None:
    """Fill `msg` with `obj`. `handle_of(obj)` returns a remote array's handle, or None."""
    if depth > DEFAULTS.max_value_depth:
        raise LimitExceededError(f"value nested deeper than {DEFAULTS.max_value_depth} levels")
    t = type(obj)
    if t is bool:
        msg.bool_value = obj
    elif t is int:
        if not _INT64[0] <= obj <= _INT64[1]:
            raise OverflowError(f"integer {obj} does not fit in 64 bits")
        msg.int_value = obj
    elif t is float:
        msg.float_value = obj
    elif obj is None:
        msg.none.SetInParent()
    elif t is tuple or t is list:
        seq = msg.tuple if t is tuple else msg.list
        seq.SetInParent()
        for item in obj:
            encode(item, seq.items.add(), handle_of, depth + 1)
    elif t is complex:
        msg.complex_value.real = obj.real
        msg.complex_value.imag = obj.imag
    elif t is str:
        msg.str_value = obj
    elif t is slice:
        msg.slice.SetInParent()
        for name in ("start", "stop", "step"):
            part = getattr(obj, name)
            if part is not None:
                encode(part, getattr(msg.slice, name), handle_of, depth + 1)
    elif obj is Ellipsis:
        msg.ellipsis.SetInParent()
    elif t is dict:
        msg.dict.SetInParent()
        for key, item in obj.items():
            if type(key) is not str:
                raise TypeError(f"only dicts with string keys can be sent, got key {key!r}")
            msg.dict.keys.append(key)
            encode(item, msg.dict.values.add(), handle_of, depth + 1)
    elif isinstance(obj, numpy.ndarray):
        fill_array(msg.array, obj)
    elif isinstance(obj, numpy.generic):
        fill_array(msg.array, numpy.asarray(obj), scalar=True)
    elif is_dtype_like(obj) or isinstance(obj, type):
        msg.dtype = check_dtype(obj).str  # TypeError naming the dtype for object, str, bytes ...
    else:
        handle = handle_of(obj)
        if handle is None:
            raise TypeError(f"values of type {t.__module__}.{t.__qualname__} cannot be sent to the device")
        msg.handle = handle


def decode(msg: vpb.Value, resolve: Callable[[int], Any], depth: int = 0, writable: bool = False) -> Any:
    """The Python value `msg` stands for; handles go through `resolve`. Arrays are read-only views
    of the message's bytes unless `writable` (then copies the caller may keep and write, as a
    NumPy array handed to an application is)."""
    if depth > DEFAULTS.max_value_depth:
        raise LimitExceededError(f"value nested deeper than {DEFAULTS.max_value_depth} levels")
    kind = msg.WhichOneof("kind")
    if kind == "handle":
        return resolve(msg.handle)
    if kind in ("int_value", "float_value", "bool_value", "str_value"):
        return getattr(msg, kind)
    if kind == "none":
        return None
    if kind == "tuple":
        return tuple(decode(v, resolve, depth + 1, writable) for v in msg.tuple.items)
    if kind == "list":
        return [decode(v, resolve, depth + 1, writable) for v in msg.list.items]
    if kind == "array":
        if msg.array.scalar:
            return array_from_wire(msg.array)[()]
        return array_from_wire(msg.array, writable)
    if kind == "dtype":
        return dtype_from_wire(msg.dtype)
    if kind == "complex_value":
        return complex(msg.complex_value.real, msg.complex_value.imag)
    if kind == "slice":
        s = msg.slice
        return slice(*(decode(getattr(s, n), resolve, depth + 1, writable) if s.HasField(n) else None
                       for n in ("start", "stop", "step")))
    if kind == "ellipsis":
        return Ellipsis
    if kind == "dict":
        d = msg.dict
        if len(d.keys) != len(d.values) or len(set(d.keys)) != len(d.keys):
            raise ValueError("malformed dict value: keys and values do not pair up uniquely")
        return {k: decode(v, resolve, depth + 1, writable) for k, v in zip(d.keys, d.values)}
    if kind is None:
        raise ValueError("empty value: no field of Value is set")
    raise UnsupportedOperationError(f"value kind {kind!r} is not supported")
