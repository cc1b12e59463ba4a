"""cupy.cuda.memory: OutOfMemoryError, the memory pool view of the current session, and
MemoryPointer (`ndarray.data`) over virtual device addresses.

The daemon frees an array's memory as soon as its last reference is released, so the pool
holds no cached blocks: used_bytes() == total_bytes() and free_all_blocks() has nothing to do.
"""

from __future__ import annotations

import bisect
import ctypes
import operator
import threading
import weakref

import numpy

from gpuremote.cupy._core import service_call
from gpuremote.cupy.cuda._stream import on_stream
from gpuremote.errors import OutOfMemoryError  # noqa: F401


class MemoryPool:
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
        return int(service_call("cuda.runtime.memGetInfo", value=True)[1])


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


def set_allocator(allocator=None) -> None:
    """None (allocate and free directly, no pool) is what the daemon does already: accepted. Any
    other allocator would have to run where the memory is, on the daemon's host: refused."""
    if allocator is not None:
        raise NotImplementedError("a custom device allocator cannot run on a gpuremote device: the daemon "
                                  "allocates (and frees at once, without a pool); set_allocator(None) is accepted")


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
