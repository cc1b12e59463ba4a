"""cupy.cuda for gpuremote devices: Device, Stream, Event, runtime, memory pools.

Device indices are the process's: 0..N-1 over every connected daemon. Streams and events
are ordered on the daemon; `synchronize()` and elapsed-time queries are sync points.
"""

from __future__ import annotations

from gpuremote.cupy.cuda import memory, runtime  # noqa: F401
from gpuremote.cupy.cuda._device import Device, get_device_id  # noqa: F401
from gpuremote.cupy.cuda._stream import Event, Stream, get_current_stream, get_elapsed_time  # noqa: F401
from gpuremote.cupy.cuda.memory import (MemoryPointer, MemoryPool, OutOfMemoryError, PinnedMemoryPool,  # noqa: F401
                                         alloc, get_allocator, malloc_managed, set_allocator,
                                         set_pinned_memory_allocator, using_allocator)

__all__ = ["Device", "Event", "MemoryPointer", "MemoryPool", "OutOfMemoryError", "PinnedMemoryPool", "Stream",
           "alloc", "alloc_pinned_memory", "get_allocator", "get_current_stream", "get_default_memory_pool",
           "get_device_id", "get_elapsed_time", "is_available", "malloc_managed", "memory", "runtime",
           "set_allocator", "set_pinned_memory_allocator", "using_allocator"]


def is_available() -> bool:
    """True when at least one device is reachable."""
    try:
        return runtime.getDeviceCount() > 0
    except Exception:
        return False


def get_default_memory_pool() -> MemoryPool:
    return memory.get_default_memory_pool()


def alloc_pinned_memory(size: int) -> memoryview:
    """`size` bytes of pinned host memory (shared with a daemon on this host; see cupyx.empty_pinned),
    as a writable buffer: numpy.frombuffer(mem, dtype, count) views it, as with CuPy's."""
    from gpuremote.transport.buffers import pinned
    return memoryview(pinned((int(size),), "u1")).cast("B")
