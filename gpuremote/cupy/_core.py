"""The remote array proxy and the one path every forwarded call takes.

`forward(name, args, kwargs)` routes a call to the daemon that owns its arrays, derives the
results' metadata on the client (gpuremote.meta), queues the op and returns proxies at once.
An `ndarray` proxy is a session plus a handle id plus (shape, dtype); releasing happens in
`__del__`, batched with the next op. Like CuPy, a proxy refuses implicit conversion to NumPy.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy
from numpy.lib.stride_tricks import as_strided

from gpuremote._config import DEFAULTS
from gpuremote.client import context
from gpuremote.client.session import Session
from gpuremote.client.stats import STATS
from gpuremote.errors import OutOfMemoryError
from gpuremote.memo import Memo
from gpuremote.meta import (LIST_RESULTS, MAY_RETURN_SEQUENCE, NOT_ARRAY, Unknown, derive, fast_elementwise, nout_of,
                            returns_sequence)
from gpuremote.surface import SURFACE, Entry
from gpuremote.wire.codec import check_dtype

_INLINE = None  # set lazily from DEFAULTS to keep import light

try:    # the compiled path of a call the session already replays (native/forward.c)
    from gpuremote import _forward as _compiled
except ImportError:
    _compiled = None
if getattr(_compiled, "API", None) != 3 or not DEFAULTS.native:    # another forward.c's build, or turned off
    _compiled = None


# id(code) -> (code, whether it is gpuremote's own (skipped when naming the site), {bytecode offset:
# "file:line"}). Keyed by identity: hashing a code object hashes its constants and names each time.
# The entry holds the code, so its id is not reused while the entry lives.
_CODES = Memo(65536)


def site() -> str:
    """'file:line' of the application code that called into gpuremote."""
    f = sys._getframe(2)
    while f is not None:
        code = f.f_code
        rec = _CODES.get(id(code))
        if rec is None:
            rec = _CODES.put(id(code), (code, f.f_globals.get("__name__", "").startswith("gpuremote."), {}))
        if not rec[1]:
            # f_lineno decodes the line table; the offset is at hand, and loops repeat their sites
            lines = rec[2]
            where = lines.get(f.f_lasti)
            if where is None:
                where = lines[f.f_lasti] = f"{code.co_filename}:{f.f_lineno}"
            return where
        f = f.f_back
    return ""


def meta_of(obj: Any):
    if type(obj) is ndarray:
        return None if obj._shape is None else (obj._shape, obj._dtype)
    if isinstance(obj, numpy.ndarray):
        return obj.shape, obj.dtype
    return NOT_ARRAY


def _first_proxy(args, kwargs) -> "ndarray | None":
    for a in args:
        if type(a) is ndarray:
            return a
        if type(a) in (list, tuple):
            for b in a:
                if type(b) is ndarray:
                    return b
    for v in kwargs.values():
        if type(v) is ndarray:
            return v
    return None


def _route(args, kwargs) -> tuple[Session, int, int]:
    """(session, remote device index, process device index) an op runs on."""
    p = _first_proxy(args, kwargs)
    if p is not None:
        return p._gr_session, p._gr_remote, p._gr_device
    index = context.current_device_index()
    ref = context.device(index)
    return ref.session, ref.remote_index, index


def _large_host_to_device(args: tuple, index: int) -> tuple:
    """Host arrays too large to ride inline become temporary device arrays."""
    global _INLINE
    if _INLINE is None:
        from gpuremote._config import DEFAULTS
        _INLINE = DEFAULTS.inline_bytes
    for a in args:
        if isinstance(a, numpy.ndarray) and a.nbytes > _INLINE:
            break
    else:
        return args
    return tuple(from_host(a, index) if isinstance(a, numpy.ndarray) and a.nbytes > _INLINE else a for a in args)


_NIN: dict[str, int | None] = {}


def _ufunc_nin(name: str) -> int | None:
    """Number of inputs of the ufunc `name` stands for; None when it is not a ufunc."""
    try:
        return _NIN[name]
    except KeyError:
        fn = getattr(numpy, name, None)
        nin = fn.nin if isinstance(fn, numpy.ufunc) else None
        _NIN[name] = nin
        return nin


_NO_KWARGS: dict = {}


def elementwise_fast(name: str, entry: Entry, args: tuple):
    """The hot path: an elementwise op on device arrays and Python scalars, no keywords, one
    result. Returns the result proxy, or None when the general path must handle the call."""
    for p in args:
        if type(p) is ndarray:
            break
    else:
        return None
    proxies: list = []
    key = _signature(name, args, _NO_KWARGS, proxies)
    metas = _DERIVED.get(key) if key is not None else None
    if metas is None:
        if key is None:                 # (a host array has no signature)
            _refuse_host_arrays(name, args)
        metas = fast_elementwise(entry, args, meta_of)
        if metas is None:
            return None
        refuse_impossible(metas, p._gr_session, p._gr_remote, p._gr_device)
        if key is not None:
            _DERIVED.put(key, metas)
    if len(metas) != 1:
        return None
    session = p._gr_session
    handle = next(session._handles)
    index = p._gr_device
    session.call(name, args, _NO_KWARGS, (handle,), p._gr_remote, context.current_stream_id(index), site(),
                 key, proxies)
    return ndarray._wrap(session, handle, p._gr_remote, index, metas[0])


# Metadata derived for a call signature: a training loop makes the same calls on the same shapes
# every step, and a dict lookup costs far less than running the metadata rule again. The same
# signature (with the site) makes a call template of the session (client/session.py).
_DERIVED = Memo(8192)
# Rules not worth a signature: no results to describe.
_UNCACHED_RULES = frozenset({"none", "value"})

_PLAIN = frozenset({int, float, bool, complex, str, type(None), type(Ellipsis)})


def _sig(a: Any, proxies: list, depth: int = 0):
    """What derivation reads of one argument, hashable and typed (1, 1.0 and True differ);
    None when it cannot be captured (host arrays, unknown metadata, other objects). Appends the
    arrays met to `proxies`, in the order the wire codec encodes them."""
    t = type(a)
    if t is ndarray:
        if a._shape is None:
            return None
        proxies.append(a)
        return (a._shape, a._dtype)
    if t in _PLAIN:
        if (t is float or t is complex) and (a == 0 or a != a):
            return (t, repr(a))     # -0.0 == 0.0, and NaN equals nothing: tell them apart by text
        return (t, a)
    if t is tuple or t is list:
        if depth > 2 or len(a) > 16:
            return None
        items = tuple([_sig(x, proxies, depth + 1) for x in a])
        return None if None in items else (t, items)
    if t is slice:
        items = (_sig(a.start, proxies, 1), _sig(a.stop, proxies, 1), _sig(a.step, proxies, 1))
        return None if None in items else (t, items)
    if t is numpy.dtype or (t is type and issubclass(a, numpy.generic)):
        return (t, a)
    if isinstance(a, numpy.generic):
        return (t, a.tobytes())     # exact: float32(-0.0) == float32(0.0)
    return None


def _signature(name: str, args: tuple, kwargs: dict, proxies: list) -> tuple | None:
    key = [name]
    for a in args:
        s = _sig(a, proxies)
        if s is None:
            return None
        key.append(s)
    for k, v in kwargs.items():
        s = _sig(v, proxies)
        if s is None:
            return None
        key.append(k)
        key.append(s)
    return tuple(key)


# Rules whose results are new arrays (not views, which can be far larger than what they cost).
_ALLOCATING = frozenset({"creation", "like", "elementwise", "random", "matmul", "rmatmul", "dot", "accumulate",
                         "generator", "special", "astype"})


def refuse_impossible(metas, session: Session, remote: int, index: int) -> None:
    """OutOfMemoryError at the call, as CuPy raises it, for results larger than all the memory this
    session may hold on the device (cupy.zeros((60000, 60000)) on an 8 GiB device): the daemon
    would refuse them anyway, but only at the next sync point. What fits the device but not its
    free memory is still the daemon's to refuse."""
    need = 0
    for shape, dtype in metas:
        need += math.prod(shape) * dtype.itemsize
    capacity = session.capacity.get(remote)
    if capacity is not None and need > capacity:
        raise OutOfMemoryError(f"Out of memory allocating {need:,} bytes: device {index} has {capacity:,} bytes in "
                               "all for this session (refused before the op was sent)")


def _refuse_host_arrays(name: str, args: tuple) -> None:
    """As in CuPy, an elementwise op (ufunc, operator) takes device arrays and scalars, not host
    arrays: converting one would hide a host-to-device copy in every call."""
    for a in args:
        if isinstance(a, numpy.ndarray):
            raise TypeError(f"Unsupported type {type(a)}: {name} takes device arrays and scalars, not a host "
                            "array; move it to the device with cupy.asarray first")


def forward(name: str, args: tuple, kwargs: dict, entry: Entry | None = None) -> Any:
    """Run surface call `name` on the device: queued, results returned as proxies at once."""
    if entry is None:
        entry = SURFACE[name]
    if entry.rule == "elementwise" and "." not in name and "out" not in kwargs:
        nin = _ufunc_nin(name)
        if nin is not None and len(args) > nin:  # ufunc outputs given by position: add(a, b, out)
            outs = tuple(args[nin:])
            args, kwargs = tuple(args[:nin]), dict(kwargs, out=outs[0] if len(outs) == 1 else outs)
    if entry.rule == "elementwise":
        _refuse_host_arrays(name, args)
    out = kwargs.get("out")
    if out is not None:
        for o in (out if type(out) is tuple else (out,)):
            if o is not None and type(o) is not ndarray:
                raise TypeError(f"{name}: out must be a device array (cupy.ndarray), not {type(o).__module__}."
                                f"{type(o).__name__}: write into a device array, then .get() it")
    session, remote, index = _route(args, kwargs)
    args = _large_host_to_device(args, index)
    stream = context.current_stream_id(index)
    where = site()
    rule = entry.rule
    if rule == "value":
        return session.call_value(name, args, kwargs, remote, stream, where)
    proxies: list = []
    # (a service of the daemon's own, such as an event's record, is never a template)
    key = _signature(name, args, kwargs, proxies) if not entry.service else None
    # (item assignment derives no result, but its shape check is worth remembering per signature)
    cached = key is not None and (rule not in _UNCACHED_RULES or name == "ndarray.__setitem__")
    metas = _DERIVED.get(key) if cached else None
    if metas is None:
        metas = derive(entry, args, kwargs, meta_of)
        if metas is not None and rule in _ALLOCATING:
            refuse_impossible(metas, session, remote, index)
        if cached and metas is not None:
            _DERIVED.put(key, metas)
    if rule in ("none", "self") or out is not None:
        session.call(name, args, kwargs, (), remote, stream, where, key, proxies)
        if rule == "self":
            return args[0]
        if type(out) is tuple and len(out) == 1:
            return out[0]  # add(a, b, out=(o,)) returns o, as NumPy and CuPy do
        return out
    if metas is not None:
        n = len(metas)
        if n == 1 and name not in MAY_RETURN_SEQUENCE:     # the common case: one array, returned as it is
            handle = next(session._handles)
            session.call(name, args, kwargs, (handle,), remote, stream, where, key, proxies)
            return ndarray._wrap(session, handle, remote, index, metas[0])
    else:
        try:
            n = nout_of(entry, args, kwargs, meta_of)
        except Unknown:
            for a in args:
                if type(a) is ndarray:
                    a.shape  # noqa: B018 -- fetch the metadata the count depends on
            n = nout_of(entry, args, kwargs, meta_of)
    handles = [session.new_handle() for _ in range(n)]
    session.call(name, args, kwargs, handles, remote, stream, where, key, proxies)
    arrays = [ndarray._wrap(session, h, remote, index, metas[i] if metas is not None else None)
              for i, h in enumerate(handles)]
    if returns_sequence(entry, args, n):
        return arrays if name in LIST_RESULTS else tuple(arrays)
    return arrays[0]


def from_host(host: numpy.ndarray, index: int | None = None) -> "ndarray":
    """Copy a host array to the device (H2D); queued like any op. Non-native byte order is
    converted, as CuPy's arrays are always in the device's (native) order."""
    check_dtype(host.dtype)
    if not host.dtype.isnative:
        host = host.astype(host.dtype.newbyteorder("="))
    if index is None:
        index = context.current_device_index()
    ref = context.device(index)
    session = ref.session
    refuse_impossible([(host.shape, host.dtype)], session, ref.remote_index, index)
    handle = session.new_handle()
    session.upload(handle, host, ref.remote_index, context.current_stream_id(index), site())
    return ndarray._wrap(session, handle, ref.remote_index, index, (tuple(host.shape), host.dtype))


def to_device(a: "ndarray", index: int) -> "ndarray":
    """A copy of device array `a` on process device `index` (CuPy moves an array between devices by
    copying it under the other one). The bytes pass through this process, D2H then H2D: the two
    devices may be on different hosts. The layout (C or Fortran order) is kept."""
    fortran = a.ndim > 1 and a.flags.f_contiguous and not a.flags.c_contiguous
    moved = from_host(a.get(), index)
    return forward("asfortranarray", (moved,), {}) if fortran else moved


def compiled_call(name: str, entry: Entry):
    """native/forward.c's call for surface name `name`, or None where it never applies (no array
    result, a service, a result that may be a sequence) or was not built: call(name, args, kwargs,
    nin, in_place) returns the result of a call the session already replays, or None (the Python
    path runs)."""
    if _compiled is None or entry.rule in _UNCACHED_RULES or entry.service or name in MAY_RETURN_SEQUENCE:
        return None
    return _compiled.call


def ufunc_inputs(name: str, entry: Entry) -> int:
    """What forward() takes for the number of a module function's inputs (more arguments are
    outputs); -1 where it does not look (methods, non-ufuncs)."""
    nin = _ufunc_nin(name) if entry.rule == "elementwise" and "." not in name else None
    return -1 if nin is None else nin


def _method(name: str):
    entry = SURFACE[name]
    fast, in_place = compiled_call(name, entry), entry.rule == "self"
    if entry.rule == "elementwise" and entry.nout == 1:
        def method(self, *args, **kwargs):
            if fast is not None:
                result = fast(name, (self,) + args, kwargs, -1, in_place)
                if result is not None:
                    return result
            if not kwargs:
                result = elementwise_fast(name, entry, (self,) + args)
                if result is not None:
                    return result
            return forward(name, (self,) + args, kwargs, entry)
    else:
        def method(self, *args, **kwargs):
            if fast is not None:
                result = fast(name, (self,) + args, kwargs, -1, in_place)
                if result is not None:
                    return result
            return forward(name, (self,) + args, kwargs, entry)

    method.__name__ = entry.attr
    method.__qualname__ = "ndarray." + entry.attr
    method.__doc__ = f"Forwarded to the device: numpy.ndarray.{entry.attr} semantics."
    return method


def _property(name: str):
    entry = SURFACE[name]
    fast = compiled_call(name, entry)

    def get(self):
        if fast is not None:
            result = fast(name, (self,), _NO_KWARGS, -1, False)
            if result is not None:
                return result
        return forward(name, (self,), {}, entry)
    return property(get, doc=f"ndarray.{entry.attr} (a view)")


class ndarray:
    """A CuPy-compatible array whose data lives on a gpuremote device."""

    __slots__ = ("_gr_session", "_gr_handle", "_gr_remote", "_gr_device", "_shape", "_dtype", "_gr_layout",
                 "__weakref__")
    __array_priority__ = 100.0
    __hash__ = None             # mutable, like numpy and cupy arrays

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        """A NumPy ufunc given a device array runs on the device, as with CuPy: numpy.exp(x) is
        cupy.exp(x), numpy.add.at(x, i, v) is cupy.add.at. As in CuPy, a host array beside it is
        refused, not converted (numpy.add(host, x), and so `host + x`), and a ufunc or method
        gpuremote does not forward gives NotImplemented, for which NumPy raises its TypeError."""
        for a in (*inputs, *kwargs.get("out", ())):
            if isinstance(a, numpy.ndarray):
                raise TypeError(f"Unsupported type {type(a)}: a host array in numpy.{ufunc.__name__} beside a device "
                                "array; move it with cupy.asarray first")
        import gpuremote.cupy as module
        fn = getattr(module, ufunc.__name__, None)
        if method != "__call__":
            fn = getattr(fn, method, None)
        return NotImplemented if fn is None else fn(*inputs, **kwargs)

    def __array_function__(self, func, types, args, kwargs):
        """A NumPy function given a device array runs as gpuremote.cupy's function of the same name,
        as with CuPy: numpy.concatenate([x, y]) is cupy.concatenate, numpy.linalg.norm(x) is
        cupy.linalg.norm. For one gpuremote does not have, NotImplemented: NumPy raises its TypeError."""
        import gpuremote.cupy as target
        for part in func.__module__.split(".")[1:]:     # numpy.linalg.norm: gpuremote.cupy.linalg
            target = getattr(target, part, None) if not part.startswith("_") else None
        mirror = getattr(target, func.__name__, None) if target is not None else None
        if mirror is None or mirror is func or not callable(mirror):
            return NotImplemented
        return mirror(*args, **kwargs)

    def __new__(cls, shape=None, dtype=float, memptr=None, strides=None, order="C"):
        """cupy.ndarray(shape, dtype): a new array; with `memptr` (a MemoryPointer: ndarray.data,
        cupy.cuda.alloc) a view of the device bytes it points at, as CuPy's. Only the contiguous
        strides of `order` are supported for such a view."""
        if shape is None:
            return object.__new__(cls)
        from gpuremote.cupy import empty
        if memptr is None:
            return empty(shape, dtype, order=order)
        from gpuremote.cupy.cuda.memory import MemoryPointer, device_span
        if not isinstance(memptr, MemoryPointer):
            raise TypeError(f"memptr must be a cupy.cuda.MemoryPointer, not {type(memptr).__name__}")
        shape = (shape,) if isinstance(shape, (int, numpy.integer)) else tuple(shape)
        dtype = numpy.dtype(dtype)
        if strides is not None and tuple(strides) != _contiguous_strides(shape, dtype.itemsize, order):
            raise NotImplementedError("ndarray(memptr=..., strides=...): only the contiguous strides of `order` "
                                      "are supported through gpuremote")
        nbytes = math.prod(shape) * dtype.itemsize
        flat, offset = device_span(memptr.ptr, nbytes)      # ValueError past the allocation's end
        return flat[offset:offset + nbytes].view(dtype).reshape(shape, order=order)

    @classmethod
    def _wrap(cls, session, handle, remote, index, meta) -> "ndarray":
        self = object.__new__(cls)
        self._gr_session = session
        self._gr_handle = handle
        self._gr_remote = remote
        self._gr_device = index
        if meta is None:
            self._shape = self._dtype = None
        else:
            self._shape, self._dtype = meta
        return self

    def __del__(self):     # replaced by native/forward.c's where it is built (use_compiled_path)
        try:
            self._gr_session.release(self._gr_handle)
        except Exception:  # never raise from a finaliser (interpreter shutdown, closed session)
            pass

    # -- metadata -------------------------------------------------------------------------
    def _describe(self) -> None:
        handle = self._gr_handle

        def fill(op):
            op.describe.handle = handle
        shape, dtype = self._gr_session.request(fill, self._gr_remote, context.current_stream_id(self._gr_device), site())
        self._shape, self._dtype = shape, dtype

    @property
    def shape(self) -> tuple:
        if self._shape is None:
            self._describe()
        return self._shape

    @property
    def dtype(self) -> numpy.dtype:
        if self._dtype is None:
            self._describe()
        return self._dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def _layout(self) -> tuple:
        """(strides, C-contiguous, F-contiguous), asked of the daemon once (a round trip): only
        it knows how a view lies in memory, and that never changes."""
        try:
            return self._gr_layout
        except AttributeError:
            strides, c, f, *owndata = service_call("cuda.memory.layout", (self,), self._gr_device, value=True)
            self._gr_layout = (tuple(strides), c, f, owndata[0] if owndata else None)   # (a daemon before 0.1.0's last)
            return self._gr_layout

    @property
    def strides(self) -> tuple:
        return self._layout()[0]

    @property
    def flags(self) -> "Flags":
        return Flags(*self._layout()[1:])

    @property
    def data(self):
        """A cupy.cuda.MemoryPointer to this array's bytes (C-contiguous arrays only)."""
        from gpuremote.cupy.cuda.memory import MemoryPointer
        return MemoryPointer(self)

    @property
    def device(self):
        from gpuremote.cupy.cuda import Device
        return Device(self._gr_device)

    # -- data movement --------------------------------------------------------------------
    def get(self, stream=None, order="C", out=None, blocking=True) -> numpy.ndarray:
        """Copy to the host (D2H) and return a numpy.ndarray (into `out` when given)."""
        # The fetch may land in `out` (received or, pinned, written by the daemon) only when it is
        # exactly this array's shape and dtype: otherwise `out` stays untouched until checked below.
        exact = (isinstance(out, numpy.ndarray) and self._shape is not None and out.shape == self._shape
                 and out.dtype == self._dtype)
        host = self._gr_session.fetch(self._gr_handle, self._gr_remote, _stream_id(stream, self._gr_device), site(),
                                      into=out if exact else None, nbytes=None if self._shape is None else self.nbytes)
        if self._shape is None:
            self._shape, self._dtype = host.shape, host.dtype
        if out is not None:
            if host is out:         # the fetch landed in it: no copy
                return out
            if out.shape != host.shape:
                raise ValueError(f"out has shape {out.shape}, the array has shape {host.shape}")
            numpy.copyto(out, host)
            return out
        if order == "F":
            return numpy.asfortranarray(host)
        return host

    def set(self, arr, stream=None) -> None:
        """Copy host array `arr` into this array (H2D)."""
        arr = numpy.asarray(arr)
        if arr.shape != self.shape:
            raise ValueError(f"shape mismatch: the host array has shape {arr.shape}, this array {self.shape}")
        forward("copyto", (self, from_host(arr, self._gr_device)), {})

    def tolist(self):
        return self.get().tolist()

    def item(self, *args):
        if args or self._shape is None or self.size != 1:
            return forward("ndarray.item", (self,) + args, {})
        return self.get().item()     # as CuPy does: one element copied to the host (a small fetch)

    def __array__(self, *args, **kwargs):
        raise TypeError("Implicit conversion to a NumPy array is not allowed. Please use `.get()` to construct "
                        "a NumPy array explicitly.")

    # -- Python protocol ------------------------------------------------------------------
    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    def __iter__(self):
        if not self.shape:
            raise TypeError("iteration over a 0-d array")
        return (self[i] for i in range(self.shape[0]))

    def _scalar(self, kind):
        if self.size != 1:
            if kind is bool:
                raise ValueError("The truth value of an array with more than one element is ambiguous. "
                                 "Use a.any() or a.all()")
            raise TypeError("only 0-dimensional arrays can be converted to Python scalars")
        # as CuPy: convert the host copy, so NumPy's rules apply (int() of a 1-element 1-d array
        # is an error in NumPy 2, bool() of it is not)
        return kind(self.get())

    def __bool__(self) -> bool:
        return self._scalar(bool)

    def __int__(self) -> int:
        return self._scalar(int)

    def __float__(self) -> float:
        return self._scalar(float)

    def __complex__(self) -> complex:
        return self._scalar(complex)

    def __index__(self) -> int:
        if self.dtype.kind not in "iu" or self.ndim != 0:
            raise TypeError("only integer scalar arrays can be converted to a scalar index")
        return int(self.item())

    def __repr__(self) -> str:
        return repr(self.get())

    def __str__(self) -> str:
        return str(self.get())

    def __format__(self, spec: str) -> str:
        host = self.get()
        return format(host[()] if host.ndim == 0 else host, spec)

    def __copy__(self):
        return self.copy()

    def __deepcopy__(self, memo):
        return self.copy()

    def __reduce__(self):
        """Pickled as its contents (fetched to the host), unpickled as a new array on the current
        device of the process that loads it, as CuPy pickles its arrays."""
        return _unpickle, (self.get(),)

    def tobytes(self, order="C") -> bytes:
        """The array's bytes, fetched to the host (numpy.ndarray.tobytes of the copy)."""
        return self.get().tobytes(order)

    def tofile(self, fid, sep="", format="%s") -> None:  # noqa: A002  (NumPy's name)
        """numpy.ndarray.tofile of the array fetched to the host."""
        self.get().tofile(fid, sep, format)

    def dumps(self) -> bytes:
        """The pickle of the array (as pickle.dumps: its contents, fetched to the host)."""
        import pickle
        return pickle.dumps(self)

    def dump(self, file) -> None:
        """Pickle the array into `file` (a path or an open binary file), as numpy.ndarray.dump."""
        import pickle
        if isinstance(file, (str, bytes)) or hasattr(file, "__fspath__"):
            with open(file, "wb") as f:
                pickle.dump(self, f)
        else:
            pickle.dump(self, file)

    def __getitem__(self, key):
        if _getitem_fast is not None:
            result = _getitem_fast("ndarray.__getitem__", (self, key), _NO_KWARGS, -1, False)
            if result is not None:
                return result
        return forward("ndarray.__getitem__", (self, key), {})

    def __setitem__(self, key, value):
        if isinstance(value, numpy.ndarray) and value.dtype.kind not in "biufc":
            check_dtype(value.dtype)
        forward("ndarray.__setitem__", (self, key, value), {})


def _contiguous_strides(shape: tuple, itemsize: int, order: str) -> tuple:
    strides, step = [], itemsize
    for n in (reversed(shape) if order != "F" else shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides)) if order != "F" else tuple(strides)


def _unpickle(host: numpy.ndarray) -> "ndarray":
    return from_host(host)


def _set_shape(self, shape) -> None:
    """x.shape = (2, 3): `x` now names a view of its data in that shape, as NumPy's in-place
    shape change; a shape that needs a copy (a transposed array made flat) is refused, as there."""
    shape = (shape,) if isinstance(shape, (int, numpy.integer)) else tuple(shape)
    # NumPy's own check, on a stand-in with the array's strides over one element (never read):
    # it raises where the new shape would need a copy
    stand_in = as_strided(numpy.zeros(1, self.dtype), self.shape, self._layout()[0], writeable=False)
    stand_in.shape = shape
    view = self.reshape(shape)
    # the proxies swap handles: `self` names the view, and `view`, dropped here, releases the old one
    self._gr_handle, view._gr_handle = view._gr_handle, self._gr_handle
    self._shape, self._dtype = view._shape, view._dtype
    try:
        del self._gr_layout
    except AttributeError:
        pass


def _set_part(name: str):
    def set_part(self, value) -> None:
        if name == "imag" and self.dtype.kind != "c":
            raise TypeError("array does not have imaginary part to set")
        getattr(self, name)[...] = value
    set_part.__name__ = f"set_{name}"
    return set_part


Session.proxy_type = ndarray
_getitem_fast = compiled_call("ndarray.__getitem__", SURFACE["ndarray.__getitem__"])


def _stream_id(stream, index: int) -> int:
    if stream is None:
        return context.current_stream_id(index)
    return stream.id


_SPECIAL = {"__getitem__", "__setitem__", "item"}
for _name in SURFACE:
    if _name.startswith("ndarray.") and _name[8:] not in _SPECIAL:
        _attr = _name[8:]
        if _attr in ("T", "real", "imag"):
            setattr(ndarray, _attr, _property(_name))
        else:
            setattr(ndarray, _attr, _method(_name))
del _name, _attr

_copy_here = ndarray.copy


def _copy(self, order="C"):
    """A copy of the array on the current device: across devices this is how CuPy moves an array
    (`with Device(1): y = x.copy()`), made here through the host (to_device)."""
    index = context.current_device_index()
    if self._gr_device != index:
        moved = to_device(self, index)
        return moved if order in ("K", "A") else forward("copy", (moved,), {"order": order})
    return _copy_here(self) if order == "C" else _copy_here(self, order)


ndarray.copy = _copy
ndarray.shape = property(ndarray.shape.fget, _set_shape, doc=ndarray.shape.__doc__)
ndarray.real = property(ndarray.real.fget, _set_part("real"), doc="The real part (a view); assignable.")
ndarray.imag = property(ndarray.imag.fget, _set_part("imag"), doc="The imaginary part (a view); assignable.")
_astype_here = ndarray.astype


def _astype(self, dtype, *args, **kwargs):
    """The array cast to `dtype` (numpy.ndarray.astype's arguments); with copy=False and the dtype
    it already has, the array itself, as in CuPy and NumPy."""
    copy = args[3] if len(args) > 3 else kwargs.get("copy", True)
    order = args[0] if args else kwargs.get("order", "K")
    if not copy and order in ("K", "A") and self._dtype is not None and numpy.dtype(dtype) == self._dtype:
        return self
    return _astype_here(self, dtype, *args, **kwargs)


ndarray.astype = _astype


_release_on_del = ndarray.__del__


def use_compiled_path(on: bool) -> None:
    """Turn native/forward.c's path on (as at import, where it was built) or off in this process:
    hot_path.py measures the client both ways."""
    if _compiled is None:
        return
    if on:      # the tables it reads: the same ones the Python path fills
        _compiled.configure(ndarray, numpy.generic, _DERIVED, _CODES, context, STATS)
        ndarray.__del__ = _compiled.finalizer()
    else:
        _compiled.configure()
        ndarray.__del__ = _release_on_del


use_compiled_path(True)


class Flags:
    """ndarray.flags: the flags CuPy's arrays have (c_contiguous, f_contiguous, owndata: False for
    a view), as attributes or as flags["C_CONTIGUOUS"], flags["F_CONTIGUOUS"], flags["OWNDATA"]."""

    __slots__ = ("c_contiguous", "f_contiguous", "owndata")

    def __init__(self, c_contiguous: bool, f_contiguous: bool, owndata: bool | None = None):
        self.c_contiguous = c_contiguous
        self.f_contiguous = f_contiguous
        self.owndata = owndata

    def __getitem__(self, name: str) -> bool:
        key = {"C_CONTIGUOUS": "c_contiguous", "C": "c_contiguous", "F_CONTIGUOUS": "f_contiguous", "F": "f_contiguous",
               "OWNDATA": "owndata", "O": "owndata"}
        if name not in key:
            raise KeyError(f"{name!r}: gpuremote arrays have the flags C_CONTIGUOUS, F_CONTIGUOUS and OWNDATA")
        return getattr(self, key[name])

    def __repr__(self) -> str:
        return (f"  C_CONTIGUOUS : {self.c_contiguous}\n  F_CONTIGUOUS : {self.f_contiguous}\n"
                f"  OWNDATA : {self.owndata}")


def service_call(name: str, args: tuple = (), index: int | None = None, stream: int | None = None,
                 value: bool = False) -> Any:
    """A call served by the daemon itself (cuda.*), on process device `index` (default: current)."""
    if index is None:
        index = context.current_device_index()
    ref = context.device(index)
    if stream is None:
        stream = context.current_stream_id(index)
    if value:
        return ref.session.call_value(name, args, {}, ref.remote_index, stream, site())
    ref.session.call(name, args, {}, (), ref.remote_index, stream, site())
    return None


def sync_device(index: int, stream: int | None) -> None:
    """Wait for `stream` (all streams when None) of process device `index`."""
    ref = context.device(index)
    ref.session.sync(ref.remote_index, stream or 0, stream is None, site())
