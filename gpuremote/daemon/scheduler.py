"""Compute sharing on one device: weighted fair queueing of execution time between flows.

Every device of a daemon has one `DeviceScheduler`. A *flow* is what gets a share: the lease
on that device (all sessions presenting grants of one lease share it, as they share its memory
limit) or, on a standalone daemon, one session with share 1. A session runs each call op
between `flow.enter()` and `flow.leave(mark)`; one op runs on a device at a time.

Start-time fair queueing on virtual time: an op's start tag is max(V, the flow's last finish
tag), its finish tag is start + device_time / share, V is the start tag of the op that last got
the device, and waiting ops are served by lowest start tag. So a flow that has used more than
its share while others wait is served after them, and a flow coming back from idle does not
bring credit (it starts at V).

A Replay run (call templates) holds the device across its calls while no other flow waits
(`Hold`): the whole stretch is charged as one op, bookkeeping between the calls included.

Sessions are closed loops (one op in flight each), so at the moment an op leaves, the flow that
is *behind* is usually not waiting yet: it is a few microseconds from its next op. When the
leaving flow is behind every waiter, the device is held for it for `scheduler_anticipate_s`
(anticipation, as disk schedulers do); without it two busy flows would simply alternate, 50/50
whatever their shares. If it does not come back in that window the waiters go on.

Work-conserving where it matters: an op arriving at a free device with nobody waiting and no
anticipation pending runs at once (the fast path: one lock round trip at enter, one at leave,
two clock reads), so a session alone on a device is never slowed.

Device time: `Backend.time_begin/time_end/time_poll`. On the emulated backend an op's time is
its execution time on the host clock, known at `leave`. On the cupy backend it is measured with
CUDA events around the op and charged when the events complete (polled at the flow's next ops),
so a flow's tags lag its launches by the GPU's queue depth.

Beware:
- Waiting is not bounded in time: an op waits as long as the ops ahead of it run. A wait is
  bounded in count (each leave serves the lowest tag; anticipation lasts one window).
- Only call ops go through the scheduler: uploads, fetches and syncs move bytes or wait and
  are not gated (nor charged).
- Shares are relative among the flows active on the device: two flows of share 0.25 alone on
  a device each get half of it (work conservation), not a quarter and an idle device.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import threading
import time
from typing import Any

from gpuremote._config import DEFAULTS

_perf_counter = time.perf_counter


class Flow:
    """One tenant's stake in a device: its share, tags, and device time used.

    Obtained with `DeviceScheduler.flow(key, share)` and given back with `release()`; the same
    key gets the same Flow while any holder keeps it.
    """

    __slots__ = ("sched", "key", "share", "start", "finish", "refs", "used_s", "pending")

    def __init__(self, sched: "DeviceScheduler", key: str, share: float):
        self.sched = sched
        self.key = key
        self.share = share
        self.start = 0.0
        self.finish = 0.0
        self.refs = 0
        self.used_s = 0.0        # device time charged to this flow
        self.pending: collections.deque = collections.deque()   # cupy: measurements not done yet

    def enter(self, stream: int = 0, streams: dict | None = None) -> Any:
        """Wait for this flow's turn on the device; returns the mark `leave` takes."""
        s = self.sched
        if self.pending:          # charge finished measurements first: they move this op's start tag
            self._harvest()
        s._lock.acquire()
        if s._running is None and (s._reserved is self or (not s._waiting and s._reserved is None)):
            s._running = self
            s._reserved = None
            start = self.finish if self.finish > s._vtime else s._vtime
            s._vtime = self.start = start
            s._lock.release()
        else:
            s._wait(self)
        if s._host_clock:
            return _perf_counter()
        return s._begin(s.index, stream, streams)

    def leave(self, mark: Any, stream: int = 0, streams: dict | None = None) -> None:
        """The op that `enter` admitted is done: charge its device time and let the next one run."""
        s = self.sched
        spent = _perf_counter() - mark if s._host_clock else s._end(mark, s.index, stream, streams)
        s._lock.acquire()
        if spent.__class__ is float:
            self.finish = self.start + spent / self.share
            self.used_s += spent
            s.busy_s += spent
        else:                     # charged when the device has done it (_harvest)
            if self.finish < self.start:
                self.finish = self.start
            self.pending.append(spent)
        s._running = None
        if s._waiting:
            if self.finish < s._waiting[0][0]:
                # This flow is behind every waiter: hold the device for its next op a moment.
                s._reserved = self
                s._reserved_until = time.monotonic() + s.anticipate_s
            s._cond.notify_all()
        s._lock.release()

    def _harvest(self, block: bool = False) -> None:
        """Charge finished pending measurements (cupy backend); with `block`, wait for the oldest."""
        s = self.sched
        poll = s._poll
        while self.pending:
            spent = poll(self.pending[0], block)
            if spent is None:
                break
            block = False
            self.pending.popleft()
            with s._lock:
                self.finish += spent / self.share
                self.used_s += spent
                s.busy_s += spent
        if len(self.pending) > s.max_pending:
            self._harvest(block=True)

    def release(self) -> None:
        """Drop one holder; the flow is forgotten when none is left."""
        self.sched._drop(self)


class Hold:
    """A device held across consecutive calls of one flow and stream (a Replay run) while no
    other flow waits: one enter and one leave for the stretch, charged as one op, instead of a
    pair per call. Another flow's arrival ends the stretch after the call that is running (as it
    would have to wait for that call anyway), and from then on each call takes its own turn."""

    __slots__ = ("flow", "stream", "streams", "mark")

    def __init__(self, streams: dict | None):
        self.flow: Flow | None = None
        self.stream = 0
        self.streams = streams
        self.mark: Any = None

    def take(self, flow: Flow, stream: int) -> None:
        """Hold `flow`'s device for a call on `stream` (waiting for the turn unless already held)."""
        if self.flow is flow and self.stream == stream:
            return
        self.drop()
        self.mark = flow.enter(stream, self.streams)
        self.flow, self.stream = flow, stream

    def call_done(self) -> None:
        """Between two calls: give the device back if another flow is waiting for it."""
        f = self.flow
        if f is not None and f.sched._waiting:    # read without the lock: at worst one call late
            self.drop()

    def drop(self) -> None:
        f = self.flow
        if f is not None:
            self.flow = None
            f.leave(self.mark, self.stream, self.streams)


class DeviceScheduler:
    """The scheduler of one device; `backend` supplies device time (time_begin/time_end/time_poll)."""

    def __init__(self, index: int, backend: Any, anticipate_s: float | None = None):
        self.index = index
        self._begin = backend.time_begin
        self._end = backend.time_end
        self._poll = backend.time_poll
        # The backend times ops on the host clock (base.Backend's hooks): read it inline, it is the hot path.
        from gpuremote.daemon.backends.base import Backend
        self._host_clock = (type(backend).time_begin is Backend.time_begin
                            and type(backend).time_end is Backend.time_end)
        self.anticipate_s = DEFAULTS.scheduler_anticipate_s if anticipate_s is None else anticipate_s
        self.max_pending = DEFAULTS.scheduler_max_pending
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._running: Flow | None = None
        self._waiting: list = []          # heap of [start tag, arrival, flow]
        self._arrivals = itertools.count()
        self._reserved: Flow | None = None
        self._reserved_until = 0.0
        self._vtime = 0.0
        self._flows: dict[str, Flow] = {}
        self.busy_s = 0.0                 # device time of every op so far
        self._samples: collections.deque = collections.deque([(time.monotonic(), 0.0)])

    def flow(self, key: str, share: float = 1.0) -> Flow:
        """The flow for `key` (a lease id, or a session id on a standalone daemon), one more holder."""
        if not 0 < share <= 1:
            raise ValueError(f"compute share {share} is not in (0, 1]")
        with self._lock:
            f = self._flows.get(key)
            if f is None:
                f = self._flows[key] = Flow(self, key, share)
                f.finish = self._vtime
            f.refs += 1
            return f

    def _drop(self, f: Flow) -> None:
        with self._lock:
            f.refs -= 1
            if f.refs <= 0 and self._flows.get(f.key) is f:
                del self._flows[f.key]
                if self._reserved is f:
                    self._reserved = None
                    self._cond.notify_all()

    def _wait(self, f: Flow) -> None:
        """Slow path of enter (called with the lock held; returns with it released, owning the device)."""
        ticket = [max(f.finish, self._vtime), next(self._arrivals), f]
        heapq.heappush(self._waiting, ticket)
        try:
            while True:
                if self._running is None and self._waiting[0] is ticket:
                    reserved = self._reserved
                    if reserved is None or reserved is f:
                        break
                    left = self._reserved_until - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                else:
                    # Bounded, so a missed wake-up costs a moment, never a hang.
                    self._cond.wait(0.05)
            heapq.heappop(self._waiting)
            self._running = f
            self._reserved = None
            start = ticket[0] if ticket[0] > f.finish else f.finish
            self._vtime = f.start = start
        except BaseException:
            if ticket in self._waiting:
                self._waiting.remove(ticket)
                heapq.heapify(self._waiting)
            self._cond.notify_all()
            raise
        finally:
            self._lock.release()

    def flows(self) -> dict[str, tuple[float, float]]:
        """{key: (share, device seconds used)} of the flows known now."""
        with self._lock:
            return {k: (f.share, f.used_s) for k, f in self._flows.items()}

    def utilization(self) -> float:
        """Busy fraction of the device over about the last `scheduler_window_s` seconds."""
        now = time.monotonic()
        with self._lock:
            busy = self.busy_s
            samples = self._samples
            if now - samples[-1][0] >= DEFAULTS.scheduler_window_s / 8:
                samples.append((now, busy))
            while len(samples) > 2 and now - samples[1][0] >= DEFAULTS.scheduler_window_s:
                samples.popleft()
            t0, b0 = samples[0]
        if now - t0 <= 0:
            return 0.0
        return min(1.0, max(0.0, (busy - b0) / (now - t0)))
