"""The memory ledger's counters: bytes in use against a capacity, with a parent every charge also
takes from (a lease's ledger charges its device's too).

`Ledger` is the compiled one (native/replay.c) where it was built, else PyLedger below; both have
`capacity`, `used`, `parent`, and two primitives that change the whole chain at once:
`_take(nbytes)` -> 0 when taken, else the depth (1: this ledger, 2: its parent) of the first
without room, nothing taken; `_give(nbytes)` gives bytes back (AssertionError if one went
negative). The compiled replay loop charges a Ledger's counters without a Python call; the error
messages and the rest of the interface are Python's: MemoryLedger below, which
backends/base.DeviceMemory and admission.LeaseMemory are."""

from __future__ import annotations

import sys
import threading

from gpuremote._config import DEFAULTS
from gpuremote.daemon import native
from gpuremote.errors import OutOfMemoryError

_LOCK = threading.Lock()    # one for every PyLedger: a charge changes two ledgers at once


class PyLedger:
    """The compiled Ledger's rules in Python, under a lock."""

    __slots__ = ("capacity", "used", "parent")

    def __init__(self, capacity: int, parent: PyLedger | None = None):
        if type(capacity) is not int:
            raise TypeError(f"a ledger's capacity must be an int, not {type(capacity).__name__}")
        if parent is not None and not isinstance(parent, PyLedger):
            raise TypeError("a ledger's parent must be a ledger or None")
        self.capacity, self.used, self.parent = capacity, 0, parent

    def _take(self, nbytes: int) -> int:
        with _LOCK:
            depth, ledger = 1, self
            while ledger is not None:
                if ledger.used + nbytes > ledger.capacity:
                    return depth
                depth, ledger = depth + 1, ledger.parent
            ledger = self
            while ledger is not None:
                ledger.used += nbytes
                ledger = ledger.parent
            return 0

    def _give(self, nbytes: int) -> None:
        with _LOCK:
            negative, ledger = False, self
            while ledger is not None:
                ledger.used -= nbytes
                negative |= ledger.used < 0
                ledger = ledger.parent
        if negative:
            raise AssertionError("memory ledger went negative")


def _compiled():
    """The compiled Ledger, or None: not built, turned off (GPUREMOTE_NATIVE=0), or a Python without
    the GIL (its check-then-update relies on holding it)."""
    if native.replay is None or not DEFAULTS.native or not getattr(sys, "_is_gil_enabled", lambda: True)():
        return None
    return native.replay.Ledger


Ledger = _compiled() or PyLedger


class MemoryLedger(Ledger):
    """A ledger as a session uses it (charge, credit, check): a refusal is CuPy's OutOfMemoryError,
    naming the ledger in the chain that ran out by its `limit` (what its capacity is)."""

    limit = "capacity"

    def charge(self, nbytes: int) -> None:
        depth = self._take(nbytes)
        if depth:
            ledger = self
            for _ in range(depth - 1):
                ledger = ledger.parent
            raise ledger.refusal(nbytes)

    def credit(self, nbytes: int) -> None:
        self._give(nbytes)

    def check(self, nbytes: int) -> None:
        """Raise OutOfMemoryError now if `nbytes` more could not fit (before running an op)."""
        ledger = self
        while ledger is not None:
            if ledger.used + nbytes > ledger.capacity:
                raise ledger.refusal(nbytes)
            ledger = ledger.parent

    def refusal(self, nbytes: int) -> OutOfMemoryError:
        return OutOfMemoryError(f"Out of memory allocating {nbytes:,} bytes (allocated so far: {self.used:,} bytes, "
                                f"{self.limit}: {self.capacity:,} bytes).")


class SessionCap:
    """A cap a session put on its own memory on one device (cupy.cuda.MemoryPool.set_limit): a
    charge passes to `parent` (the device's or the lease's ledger, which may still refuse it) only
    while the session's own bytes stay within `capacity`. Used by one session's thread alone, so
    plain counters; the compiled replay loop calls its charge and credit methods (it is no Ledger)."""

    limit = "limit this session set (cupy.cuda.MemoryPool.set_limit)"

    def __init__(self, capacity: int, parent, used: int):
        self.capacity, self.parent, self.used = capacity, parent, used

    def charge(self, nbytes: int) -> None:
        if self.used + nbytes > self.capacity:
            raise self.refusal(nbytes)
        self.parent.charge(nbytes)
        self.used += nbytes

    def credit(self, nbytes: int) -> None:
        self.parent.credit(nbytes)
        self.used -= nbytes

    def check(self, nbytes: int) -> None:
        if self.used + nbytes > self.capacity:
            raise self.refusal(nbytes)
        self.parent.check(nbytes)

    refusal = MemoryLedger.refusal
