"""Page-aligned, pooled transfer buffers: where bulk bytes are received, and pinned host memory.

Two facts measured on the target machines shape this module: writing memory a process touches
for the first time runs at ~1 GB/s (page faults), against 10-18 GB/s for memory it already
touched; and a copy into a destination that is not page-aligned (a large numpy.empty starts 16
bytes past a page) runs at a quarter of the aligned speed. So every receive buffer is an mmap
(page-aligned by construction), and buffers are reused: a buffer is free again once nothing
references it (its reference count says so), whoever held it (a fetched array the application
dropped, an uploaded array the daemon released).

`BufferPool(shared=True)` makes memfd segments instead of anonymous memory: a daemon on the same
host can map them (the memfd travels over the Unix socket), which is how pinned host arrays
(cupyx.empty_pinned) reach the daemon without a copy. Shared segments are sealed against
shrinking, so a peer that maps one can never fault on a truncated file.
"""

from __future__ import annotations

import itertools
import mmap
import os
import sys
import threading
import weakref

import numpy

PAGE = mmap.PAGESIZE
_MAX_PER_CLASS = 8          # free-list length per size class: bounded scans
_ids = itertools.count(1)


def size_class(nbytes: int) -> int:
    """Round up to a page, then to 2^k or 1.25/1.5/1.75 x 2^k above 64 KiB (at most 25% slack)."""
    n = max(PAGE, -(-nbytes // PAGE) * PAGE)
    if n <= 1 << 16:
        return 1 << (n - 1).bit_length()
    top = 1 << (n.bit_length() - 1)
    step = top // 4
    n = -(-n // step) * step
    return -(-n // PAGE) * PAGE


def _close_fd(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


class Segment:
    """One mmap. `fd` is its memfd when shared (open as long as the mapping lives)."""

    __slots__ = ("mm", "size", "fd", "id", "addr", "__weakref__")

    def __init__(self, size: int, shared: bool, name: str = "gpuremote"):
        self.size = size
        self.id = next(_ids)
        self.fd = -1
        if shared:
            fd = os.memfd_create(f"{name}-{self.id}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            try:
                os.ftruncate(fd, size)
                import fcntl
                fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
                self.mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
            except BaseException:
                os.close(fd)
                raise
            self.fd = fd
            weakref.finalize(self.mm, _close_fd, fd)
        else:
            flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
            self.mm = mmap.mmap(-1, size, flags=flags)
        self.addr = numpy.frombuffer(self.mm, numpy.uint8, count=1).ctypes.data

    def free(self) -> bool:
        # References to the mmap: this object's attribute and getrefcount's argument. Any array
        # made from it (numpy.frombuffer) holds one more through its buffer export.
        return sys.getrefcount(self.mm) <= 2

    def array(self, nbytes: int, offset: int = 0) -> numpy.ndarray:
        return numpy.frombuffer(self.mm, numpy.uint8, count=nbytes, offset=offset)


class SharedRef:
    """What a peer needs to map a shared segment, without keeping the segment alive."""

    __slots__ = ("id", "fd", "addr", "size", "_mm")

    def __init__(self, seg: Segment):
        self.id, self.fd, self.addr, self.size = seg.id, seg.fd, seg.addr, seg.size
        self._mm = weakref.ref(seg.mm)

    def alive(self) -> bool:
        return self._mm() is not None

    def hold(self):
        """The mapping (keeping it, and so the fd, alive while the caller holds it), or None."""
        return self._mm()


class BufferPool:
    """Hands out page-aligned uint8 arrays of exactly the asked size, reusing free segments.

    Holds at most `max_bytes` of segments (in use or free); beyond that, buffers are made for
    the occasion and simply freed when dropped. Thread-safe.
    """

    def __init__(self, max_bytes: int, shared: bool = False, name: str = "gpuremote"):
        self.max_bytes = max_bytes
        self.shared = shared
        self.name = name
        self._classes: dict[int, list[Segment]] = {}
        self._held = 0
        self._lock = threading.RLock()
        # Shared segments alive (the mapping lives as long as any array over it): id -> SharedRef.
        self._live: dict[int, SharedRef] = {}
        self.hits = self.misses = 0

    def take(self, nbytes: int) -> numpy.ndarray:
        # The array (a reference to the segment's mmap) must exist before the lock is released: a
        # segment is "free" by its reference count, so another thread could be handed it meanwhile
        # and two live arrays would share bytes (found by benchmarks/load.py: a corrupted download).
        with self._lock:
            return self.take_segment(nbytes)[0].array(nbytes)

    def take_segment(self, nbytes: int) -> tuple[Segment, int]:
        """A free segment for `nbytes`; call with the pool's lock held until the caller references
        its mmap (see take), or another thread may be handed the same segment."""
        size = size_class(nbytes)
        with self._lock:
            free = self._classes.setdefault(size, [])
            for seg in free:
                if seg.free():
                    self.hits += 1
                    return seg, 0
            self.misses += 1
            seg = Segment(size, self.shared, self.name)
            if len(free) < _MAX_PER_CLASS and self._make_room(size):
                free.append(seg)
                self._held += size
            if self.shared:
                self._live[seg.id] = SharedRef(seg)
            return seg, 0

    def _make_room(self, size: int) -> bool:
        if self._held + size <= self.max_bytes:
            return True
        for lst in self._classes.values():       # evict free segments of any class
            for seg in [s for s in lst if s.free()]:
                lst.remove(seg)
                self._held -= seg.size
                if self._held + size <= self.max_bytes:
                    return True
        return False

    def find(self, addr: int, nbytes: int) -> tuple["SharedRef", int] | None:
        """The live shared segment holding [addr, addr + nbytes), and the offset there."""
        with self._lock:
            for ref in list(self._live.values()):
                if not ref.alive():
                    del self._live[ref.id]
                elif ref.addr <= addr and addr + nbytes <= ref.addr + ref.size:
                    return ref, addr - ref.addr
        return None

    def clear(self) -> None:
        with self._lock:
            self._classes.clear()
            self._held = 0

    def free_segments(self) -> int:
        """How many segments wait free for reuse."""
        with self._lock:
            return sum(1 for lst in self._classes.values() for seg in lst if seg.free())

    def drop_free(self) -> None:
        """Let go of the free segments (in-use ones stay, and are reused when freed)."""
        with self._lock:
            for lst in self._classes.values():
                for seg in [s for s in lst if s.free()]:
                    lst.remove(seg)
                    self._held -= seg.size


_pools: dict[str, BufferPool] = {}
_pools_lock = threading.Lock()


def pool(kind: str = "receive") -> BufferPool:
    """This process's pool: "receive" (a client's fetches), "daemon" (a daemon's uploads), both anonymous
    memory, or "pinned" (shared memfd segments)."""
    p = _pools.get(kind)
    if p is None:
        from gpuremote._config import DEFAULTS
        with _pools_lock:
            p = _pools.get(kind)
            if p is None:
                shared = kind == "pinned" and hasattr(os, "memfd_create")
                budget = DEFAULTS.daemon_pool_bytes if kind == "daemon" else DEFAULTS.buffer_pool_bytes
                p = _pools[kind] = BufferPool(budget, shared=shared, name=f"gpuremote-{kind}")
    return p


def take(nbytes: int) -> numpy.ndarray:
    """A page-aligned uint8 array of `nbytes` from this process's receive pool."""
    return pool("receive").take(nbytes)


def pinned(shape, dtype=float, order: str = "C") -> numpy.ndarray:
    """An array in shared, page-aligned host memory (cupyx.empty_pinned): a daemon on this host maps it
    and copies from it in place, so an upload from it is a single copy."""
    dtype = numpy.dtype(dtype)
    shape = (shape,) if isinstance(shape, (int, numpy.integer)) else tuple(int(s) for s in shape)
    n = 1
    for extent in shape:
        n *= extent
    flat = pool("pinned").take(n * dtype.itemsize) if n else numpy.empty(0, numpy.uint8)
    return flat.view(dtype).reshape(shape, order="F" if order == "F" else "C")


def find_shared(arr: numpy.ndarray) -> tuple[SharedRef, int] | None:
    """The shared segment a C-contiguous array lies in, and its offset there (None if it does not)."""
    p = _pools.get("pinned")
    if p is None or not p.shared or arr.nbytes == 0:
        return None
    return p.find(arr.ctypes.data, arr.nbytes)


def _after_fork_in_child() -> None:
    # A child must not hand out buffers its parent may still be using through shared mappings.
    _pools.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
