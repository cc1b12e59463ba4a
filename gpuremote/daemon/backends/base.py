"""The interface every device backend implements, and the memory ledger they share.

A backend supplies the array namespace (`xp`: numpy or cupy), host<->device copies, the
identity of the buffer an array lives in (for exact memory accounting: views share their
owner's bytes), device facts, streams, events, random generators and kernels. Everything
else (handles, sessions, limits, errors) is the daemon's and is the same for every backend.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any, Callable

import numpy

from gpuremote.daemon.ledger import MemoryLedger
from gpuremote.daemon.scheduler import DeviceScheduler
from gpuremote.meta import special_dtype


@dataclasses.dataclass
class DeviceProps:
    index: int
    name: str
    total_memory: int
    compute_capability: str      # "90" for 9.0, as cupy.cuda.Device.compute_capability
    multiprocessor_count: int
    extra: dict = dataclasses.field(default_factory=dict)

    def as_properties(self) -> dict:
        """The dict cupy.cuda.runtime.getDeviceProperties returns (the keys programs read most); the
        client turns `name` into bytes, as CUDA gives it."""
        major, minor = int(self.compute_capability[:-1] or 0), int(self.compute_capability[-1:] or 0)
        props = {"name": self.name, "totalGlobalMem": self.total_memory, "major": major,
                 "minor": minor, "multiProcessorCount": self.multiprocessor_count}
        props.update(self.extra)
        return props


class DeviceMemory(MemoryLedger):
    """Bytes in use on one device, across every session: the capacity is never exceeded (the
    counters are a Ledger's, which the compiled replay loop charges directly: daemon/ledger.py)."""

    limit = "device capacity"


def special_function(fn: Callable, is_array: Callable[[Any], bool]) -> Callable:
    """A cupyx.scipy.special function `fn` (SciPy's or CuPy's), called for the result dtype
    gpuremote.meta.special_dtype gives: the one the client derived, on every backend.

    A ufunc is handed that dtype. A plain function takes none (SciPy's zeta, CuPy's round): its
    arguments are cast to the dtype first, scalars too (a float64 NumPy scalar would widen SciPy's
    zeta of float32 arrays), and its result is cast to it (CuPy's round keeps what it is given)."""
    if type(fn).__name__ == "ufunc":        # numpy.ufunc and CuPy's ufunc class alike
        def call(*args):
            return fn(*args, dtype=special_dtype([a.dtype for a in args if is_array(a)]))
    else:
        def call(*args):
            dtype = special_dtype([a.dtype for a in args if is_array(a)])
            cast = [a.astype(dtype, copy=False) if is_array(a) else dtype.type(a) for a in args]
            return fn(*cast).astype(dtype, copy=False)
    call.__name__ = getattr(fn, "__name__", "special")
    return call


class Backend:
    kind: str = ""
    xp: Any = None

    def __init__(self, props: list[DeviceProps]):
        self.props = props
        self.memory = [DeviceMemory(p.total_memory) for p in props]
        # Compute sharing between sessions/leases on each device (gpuremote/daemon/scheduler.py).
        self.schedulers = [DeviceScheduler(i, self) for i in range(len(props))]

    # -- arrays ---------------------------------------------------------------------------
    def is_array(self, obj: Any) -> bool:
        raise NotImplementedError

    def owner(self, arr: Any) -> tuple[Any, int]:
        """(buffer object, its size in bytes) of the memory `arr` lives in."""
        raise NotImplementedError

    # True where owner(arr) is the last array of array_type down arr's `.base` chain and its nbytes:
    # the compiled replay loop (native/replay.c) then finds it itself instead of calling owner().
    owner_by_base = False

    def from_host(self, arr: numpy.ndarray, device: int, owned: bool = False) -> Any:
        """A device array with arr's contents; `owned` means arr is a fresh buffer nobody else holds."""
        raise NotImplementedError

    def to_host(self, arr: Any, out: numpy.ndarray | None = None) -> numpy.ndarray:
        """arr's contents on the host (D2H); with `out` (C-contiguous, arr's shape and dtype: host
        memory the client shares, Fetch.land_segment) copied straight into it, which is returned."""
        raise NotImplementedError

    def empty(self, shape: tuple, dtype: numpy.dtype, device: int) -> Any:
        raise NotImplementedError

    def resolve(self, name: str) -> Callable:
        """The function a module-level surface name stands for ("add", "linalg.inv", "fft.fft")."""
        raise NotImplementedError

    # The class of the backend's arrays: a replayed call template looks its method up on it once.
    array_type: type = numpy.ndarray

    # -- execution context ----------------------------------------------------------------
    # Whether `activate` does anything: where it does not, the hot path skips the context manager.
    scoped = False

    def activate(self, device: int, stream: int, streams: dict) -> contextlib.AbstractContextManager:
        """Context in which an op of (device, stream) runs; `streams` is the session's stream table."""
        return contextlib.nullcontext()

    def synchronize(self, device: int, stream: int | None, streams: dict) -> None:
        """Wait for the device's work (one stream, or all when stream is None)."""

    def record_event(self, device: int, stream: int, streams: dict) -> Any:
        raise NotImplementedError

    def elapsed_ms(self, start: Any, end: Any) -> float:
        raise NotImplementedError

    def event_done(self, event: Any) -> bool:
        return True

    # -- device time, for the compute scheduler -------------------------------------------
    def time_begin(self, device: int, stream: int, streams: dict | None) -> Any:
        """A mark taken just before an op runs. Host clock: right for a backend that executes
        synchronously (emulated); an asynchronous one records a device event instead."""
        return time.perf_counter()

    def time_end(self, mark: Any, device: int, stream: int, streams: dict | None) -> Any:
        """The op's device time in seconds (a float), or a pending measurement for time_poll."""
        return time.perf_counter() - mark

    def time_poll(self, pending: Any, block: bool = False) -> float | None:
        """Seconds of a pending measurement once the device finished it (waiting if `block`), else None."""
        return None

    def mem_info(self, device: int) -> tuple[int, int]:
        """(free, total) bytes of the device."""
        mem = self.memory[device]
        return mem.capacity - mem.used, mem.capacity

    def random_state(self, seed: int | None) -> Any:
        raise NotImplementedError

    def generator(self, seed: int | None) -> Any:
        """A cupy.random.Generator (default_rng) with the methods of surface.GENERATOR_METHODS."""
        raise NotImplementedError

    def kernel(self, kind: str, spec: dict) -> Callable:
        """A compiled kernel callable (cached by the caller)."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the backend holds."""
