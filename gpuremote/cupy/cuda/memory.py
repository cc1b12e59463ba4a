"""cupy.cuda.memory: OutOfMemoryError, the memory pool view of the current session, the
allocator settings, and MemoryPointer (`ndarray.data`, `alloc`) over virtual device addresses.

The daemon frees an array's memory as soon as its last reference is released, so the pool
holds no cached blocks: used_bytes() == total_bytes() and free_all_blocks() has nothing to do.
Every allocation is the daemon's, whichever allocator this process sets.
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import numbers
import operator
import threading
import weakref

import numpy

from gpuremote.client import context
from gpuremote.cupy._core import service_call
from gpuremote.cupy.cuda._stream import on_stream
from gpuremote.errors import OutOfMemoryError  # noqa: F401


def _allocation(size) -> "MemoryPointer":
    """A fresh allocation of `size` bytes on the current device: a uint8 array the daemon allocates,
    as a MemoryPointer that keeps it alive. Asking its layout for the address is a round trip, so a
    size the daemon's memory ledger refuses raises OutOfMemoryError here, not at a later sync."""
    size = operator.index(size)
    if size < 0:
        raise ValueError(f"cannot allocate a negative number of bytes ({size})")
    index = context.current_device_index()
    ref = context.device(index)
    total = ref.session.capacity.get(ref.remote_index, 0)
    if size > total:    # refused at once: no op for a size no device here can hold (nor NumPy shape)
        raise OutOfMemoryError(f"cannot allocate {size:,} bytes on device {index}: it has {total:,} bytes in all")
    from gpuremote.cupy import empty
    return MemoryPointer(empty(size, dtype=numpy.uint8))


def _malloc(size: int) -> "MemoryPointer":
    """The raw allocator (set_allocator(None)): a fresh device allocation of `size` bytes."""
    return _allocation(size)


_MANAGED_REFUSAL = ("managed (unified) memory is one address range that host and device both reach, which needs "
                    "the GPU in this process's host; a gpuremote device is on the daemon's host: allocate device "
                    "arrays (cupy.empty) and move data with cupy.asarray / .get()")


def malloc_managed(size: int) -> "MemoryPointer":
    """Refused: a remote device has no unified memory with this process (NotImplementedError)."""
    raise NotImplementedError(_MANAGED_REFUSAL)


class MemoryPool:
    """The session's memory on the current device, seen as CuPy's pool. Every instance sees the same
    memory: what this process holds on the device, allocated and freed by the daemon."""

    def __init__(self, allocator=None):
        if allocator is not None:   # what CuPy's pool would build on: only the daemon's allocation can be
            _accepted(allocator)

    def malloc(self, size: int) -> "MemoryPointer":
        """A fresh device allocation of `size` bytes on the current device, as a MemoryPointer; it is
        freed when the pointer (and anything made from it) is dropped. The daemon allocates it, from no
        cache, exactly `size` bytes (CuPy's pool rounds up to 512). One round trip: a size the daemon
        refuses raises OutOfMemoryError here. As an allocator (set_allocator(pool.malloc)) it is
        accepted, and the daemon's allocator is still the one that runs."""
        return _allocation(size)

    def used_bytes(self) -> int:
        """Bytes this process's session holds on the current device."""
        return int(service_call("cuda.MemoryPool.used_bytes", value=True))

    def total_bytes(self) -> int:
        return int(service_call("cuda.MemoryPool.total_bytes", value=True))

    def free_bytes(self) -> int:
        return 0

    def n_free_blocks(self) -> int:
        return 0

    def free_all_blocks(self, stream=None) -> None:
        service_call("cuda.MemoryPool.free_all_blocks")

    def get_limit(self) -> int:
        """The cap set_limit put on this session's memory on the current device; 0 when none is set
        (the session may still use no more than its device, or its pool lease, allows)."""
        return int(service_call("cuda.MemoryPool.get_limit", value=True))

    def set_limit(self, size=None, fraction=None) -> None:
        """Cap what this session may hold on the current device at `size` bytes, or at `fraction` of
        the device's memory (its lease's share under a pool); neither, or 0: no cap. The daemon
        enforces it: an allocation past it raises OutOfMemoryError naming this limit. Unlike CuPy's
        pool limit, it counts every array of the session on that device, whichever pool made it."""
        if size is not None and fraction is not None:
            raise ValueError("give either size or fraction to set_limit, not both")
        for name, value in (("size", size), ("fraction", fraction)):
            if value is not None and (not isinstance(value, numbers.Real) or isinstance(value, bool)):
                raise TypeError(f"set_limit {name} must be a number, not {type(value).__name__}")
        if fraction is not None and not 0 <= fraction <= 1:
            raise ValueError(f"set_limit fraction must be in [0, 1], got {fraction}")
        if size is not None and not 0 <= size < 2**63:          # NaN too
            raise ValueError(f"set_limit size must be a number of bytes from 0 to 2**63 - 1, got {size}")
        if fraction:
            size = fraction * int(service_call("cuda.runtime.memGetInfo", value=True)[1])
        service_call("cuda.MemoryPool.set_limit", (int(size or 0),), value=True)


_DEFAULT = MemoryPool()


def get_default_memory_pool() -> MemoryPool:
    return _DEFAULT


class PinnedMemoryPool:
    """The pool of pinned host buffers (cupyx.empty_pinned, alloc_pinned_memory): shared segments,
    reused once their arrays are dropped."""

    def n_free_blocks(self) -> int:
        from gpuremote.transport.buffers import pool
        return pool("pinned").free_segments()

    def free_all_blocks(self) -> None:
        from gpuremote.transport.buffers import pool
        pool("pinned").drop_free()


_DEFAULT_PINNED = PinnedMemoryPool()


def get_default_pinned_memory_pool() -> PinnedMemoryPool:
    return _DEFAULT_PINNED


# -- allocator settings ----------------------------------------------------------------------
# Arrays are allocated by the daemon whatever is set here. The setting is kept (globally, and per
# thread inside using_allocator, as CuPy keeps it) for get_allocator() and alloc().
_current_allocator = _malloc
_thread = threading.local()


def _accepted(allocator):
    """The allocator to keep for `allocator`: None is the raw allocator; it and a MemoryPool's malloc
    allocate on the daemon, as every gpuremote allocation does. Anything else would have to run where
    the memory is, on the daemon's host: refused."""
    if allocator is None or allocator is _malloc:
        return _malloc
    if isinstance(getattr(allocator, "__self__", None), MemoryPool) and \
            getattr(allocator, "__func__", None) is MemoryPool.malloc:
        return allocator
    if allocator is malloc_managed:
        raise NotImplementedError(_MANAGED_REFUSAL)
    raise NotImplementedError("a custom device allocator cannot run on a gpuremote device: the daemon allocates "
                              "(and frees at once, without a pool); None and a cupy.cuda.MemoryPool's malloc are "
                              "accepted")


def set_allocator(allocator=None) -> None:
    """Accepts None (no pool) and a MemoryPool's malloc (cupy.cuda.MemoryPool().malloc,
    get_default_memory_pool().malloc): either way the daemon allocates and frees at once, as it
    always does. Any other callable: NotImplementedError. Inside using_allocator: ValueError, as in CuPy."""
    global _current_allocator
    allocator = _accepted(allocator)
    if getattr(_thread, "allocator", None) is not None:
        raise ValueError("set_allocator cannot change the allocator inside a using_allocator block")
    _current_allocator = allocator


def get_allocator():
    """The allocator set (this thread's inside using_allocator); alloc() calls it."""
    return getattr(_thread, "allocator", None) or _current_allocator


@contextlib.contextmanager
def using_allocator(allocator=None):
    """Within the block, this thread's allocator is `allocator`, accepted as set_allocator accepts it
    (None: the raw allocator); the daemon allocates either way."""
    allocator = _accepted(allocator)
    previous = getattr(_thread, "allocator", None)
    _thread.allocator = allocator
    try:
        yield
    finally:
        _thread.allocator = previous


def alloc(size: int) -> "MemoryPointer":
    """`size` bytes from the current allocator, on the current device: a fresh device allocation."""
    return get_allocator()(size)


def set_pinned_memory_allocator(allocator=None) -> None:
    """None (no pinned pool) is accepted: pinned buffers are then still shared segments, still reused.
    Any other allocator: refused, as the daemon maps these buffers itself."""
    if allocator is not None:
        raise NotImplementedError("a custom pinned-memory allocator cannot be used: gpuremote's pinned buffers "
                                  "are shared-memory segments the daemon maps; set_pinned_memory_allocator(None) "
                                  "is accepted")


# -- device addresses ------------------------------------------------------------------------
# A remote array has no address in this process. `ndarray.data` gives each C-contiguous array a
# virtual one on first use, in a range no host pointer can take on 64-bit Linux (above any user
# space, below 2**63 so that it fits an intptr_t): runtime.memcpy and MemoryPointer tell device
# from host addresses by it, and map a device address back to (array, byte offset). Each array
# proxy is its own allocation: a view's address is not its base's plus an offset, as it is in CuPy.
DEVICE_BASE = 1 << 60
_ALIGN = 512                        # as CuPy's allocator rounds
_FIRST_HOST_ADDRESS = 4096          # nothing is ever mapped in the first page (NULL + small offsets)
_next_base = DEVICE_BASE
_bases: list[int] = []              # sorted, of the live entries below
_spans: dict[int, tuple] = {}       # base -> (weakref to the array, its bytes, its flat uint8 view)
_base_of: dict[int, int] = {}       # id(array) -> base, while the array lives (arrays are unhashable)
_lock = threading.Lock()


def _forget(base: int, key: int) -> None:
    with _lock:
        if _spans.pop(base, None) is not None:
            del _bases[bisect.bisect_left(_bases, base)]
        if _base_of.get(key) == base:
            del _base_of[key]


def address_of(arr) -> int:
    """The virtual device address of C-contiguous proxy `arr` (given on first use)."""
    global _next_base
    base = _base_of.get(id(arr))
    entry = _spans.get(base)
    if entry is not None and entry[0]() is arr:
        return base
    if not arr.flags.c_contiguous:
        raise ValueError("gpuremote addresses the bytes of C-contiguous arrays only: use "
                         "cupy.ascontiguousarray(x).data")
    flat = arr.reshape(-1).view(numpy.uint8)      # a view of its bytes, on the daemon
    with _lock:
        base = _base_of.get(id(arr))
        if base is None:
            base = _next_base
            _next_base += -(-max(arr.nbytes, 1) // _ALIGN) * _ALIGN + _ALIGN
            _spans[base] = (weakref.ref(arr, lambda _, b=base, k=id(arr): _forget(b, k)), arr.nbytes, flat)
            bisect.insort(_bases, base)
            _base_of[id(arr)] = base
    return base


def device_span(ptr: int, size: int):
    """(flat uint8 view, byte offset) of the `size` device bytes at `ptr`; ValueError when they are
    not all inside one live array."""
    with _lock:
        i = bisect.bisect_right(_bases, ptr) - 1
        entry = _spans.get(_bases[i]) if i >= 0 else None
        base = _bases[i] if i >= 0 else 0
    arr = entry[0]() if entry else None
    if arr is None or ptr + size > base + entry[1]:
        raise ValueError(f"no gpuremote array holds the {size:,} bytes at device address {ptr:#x}"
                         + (f" (the array there has {entry[1]:,} bytes from {base:#x})" if arr is not None else ""))
    return entry[2], ptr - base


def is_device(ptr: int) -> bool:
    return ptr >= DEVICE_BASE


def host_address(ptr) -> int:
    """`ptr` (an int or ctypes.c_void_p) as a host address; ValueError when it cannot be one. Like
    CUDA, an address that passes is taken on trust."""
    ptr = getattr(ptr, "value", ptr)
    if not isinstance(ptr, int) or isinstance(ptr, bool) or ptr < _FIRST_HOST_ADDRESS or is_device(ptr):
        raise ValueError(f"{ptr!r} is not a host address")
    return ptr


def host_bytes(ptr, size: int) -> numpy.ndarray:
    """`size` bytes of this process's memory at host address `ptr`, as a writable uint8 array over
    them (no copy)."""
    ptr = host_address(ptr)
    if size == 0:
        return numpy.empty(0, numpy.uint8)
    return numpy.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_uint8)), (size,))


class MemoryPointer:
    """cupy.cuda.MemoryPointer for a gpuremote array: `ptr` (its virtual device address plus an
    offset), `device_id`, and the copies between it and host or device memory."""

    __slots__ = ("_owner", "offset", "ptr", "device_id")

    def __init__(self, owner, offset: int = 0):
        self._owner = owner          # keeps the array alive, as CuPy's pointer keeps its memory
        self.offset = int(offset)
        self.ptr = address_of(owner) + self.offset
        self.device_id = owner._gr_device

    def __int__(self) -> int:
        return self.ptr

    def __add__(self, n: int) -> "MemoryPointer":
        return MemoryPointer(self._owner, self.offset + operator.index(n))

    __radd__ = __add__

    def __sub__(self, n: int) -> "MemoryPointer":
        return MemoryPointer(self._owner, self.offset - operator.index(n))

    def __repr__(self) -> str:
        return f"<gpuremote MemoryPointer {self.ptr:#x} on device {self.device_id}>"

    def copy_from_host(self, mem, size: int) -> None:
        from gpuremote.cupy.cuda.runtime import memcpy, memcpyHostToDevice
        memcpy(self.ptr, mem, size, memcpyHostToDevice)

    def copy_to_host(self, mem, size: int) -> None:
        from gpuremote.cupy.cuda.runtime import memcpy, memcpyDeviceToHost
        memcpy(mem, self.ptr, size, memcpyDeviceToHost)

    def copy_from_device(self, src: "MemoryPointer", size: int) -> None:
        from gpuremote.cupy.cuda.runtime import memcpy, memcpyDeviceToDevice
        if not isinstance(src, MemoryPointer):
            raise TypeError(f"copy_from_device takes a MemoryPointer, not {type(src).__name__}")
        memcpy(self.ptr, src.ptr, size, memcpyDeviceToDevice)

    def copy_from(self, mem, size: int) -> None:
        """From a MemoryPointer (device) or a host address."""
        if isinstance(mem, MemoryPointer):
            self.copy_from_device(mem, size)
        else:
            self.copy_from_host(mem, size)

    def memset(self, value: int, size: int) -> None:
        from gpuremote.cupy.cuda.runtime import memset
        memset(self.ptr, value, size)

    # The *_async forms run on `stream` (None: the current one); their host side is done when they return.
    def copy_from_host_async(self, mem, size: int, stream=None) -> None:
        with on_stream(stream):
            self.copy_from_host(mem, size)

    def copy_to_host_async(self, mem, size: int, stream=None) -> None:
        with on_stream(stream):
            self.copy_to_host(mem, size)

    def copy_from_device_async(self, src: "MemoryPointer", size: int, stream=None) -> None:
        with on_stream(stream):
            self.copy_from_device(src, size)

    def copy_from_async(self, mem, size: int, stream=None) -> None:
        with on_stream(stream):
            self.copy_from(mem, size)

    def memset_async(self, value: int, size: int, stream=None) -> None:
        with on_stream(stream):
            self.memset(value, size)
