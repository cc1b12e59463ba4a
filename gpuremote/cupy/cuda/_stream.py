"""Streams and events. A stream is an id the daemon maps to its own stream; ops on one stream
run in issue order, events record a point in a stream and time the span between two points."""

from __future__ import annotations

import contextlib
import itertools
import operator
import weakref

from gpuremote.client import context
from gpuremote.cupy._core import service_call, sync_device

_stream_ids = itertools.count(1)
_event_ids = itertools.count(1)
_streams: "weakref.WeakValueDictionary[int, Stream]" = weakref.WeakValueDictionary()


def on_stream(stream):
    """The context that issues ops on `stream`: a Stream, its ptr, or 0/None (the current stream),
    as runtime calls and MemoryPointer's *_async methods take it."""
    if stream is None or (isinstance(stream, int) and stream == 0):
        return contextlib.nullcontext()
    if isinstance(stream, Stream):
        return stream
    found = _streams.get(operator.index(stream))
    if found is None:
        raise ValueError(f"no stream has ptr {stream!r}: pass a cupy.cuda.Stream or its .ptr")
    return found


class Stream:
    null: "Stream"

    def __init__(self, null=False, non_blocking=False, ptds=False):
        self.id = 0 if null else next(_stream_ids)
        self.device_id = context.current_device_index()
        self.non_blocking = non_blocking
        self._previous: list[int] = []
        if self.id:
            _streams[self.id] = self

    @property
    def ptr(self) -> int:
        """The stream's handle, as runtime calls take it (0: the null stream)."""
        return self.id

    def use(self) -> "Stream":
        context.set_current_stream(self.device_id, self.id)
        return self

    def __enter__(self) -> "Stream":
        self._previous.append(context.current_stream_id(self.device_id))
        context.set_current_stream(self.device_id, self.id)
        return self

    def __exit__(self, *exc) -> None:
        context.set_current_stream(self.device_id, self._previous.pop())

    def synchronize(self) -> None:
        """Wait for every op issued on this stream."""
        sync_device(self.device_id, self.id)

    def record(self, event: "Event | None" = None) -> "Event":
        event = event or Event()
        event.record(self)
        return event

    def wait_event(self, event: "Event") -> None:
        """Ops issued on this stream after this call run after the point `event` recorded. The daemon
        has no service that makes one of its streams wait for an event, so the client keeps the order
        itself: it waits (a sync point) until the event's stream has run everything issued on it so
        far, the event's point included, and only then returns, so this stream's later ops reach the
        daemon after it. Differences from CuPy: the host waits, and so do ops issued on the event's
        stream after the record. An event on this same stream needs no wait; one never recorded is
        no wait at all, as in CUDA."""
        if not isinstance(event, Event):
            raise TypeError(f"wait_event takes a cupy.cuda.Event, not {type(event).__name__}")
        if event.device_id is None or (event.device_id, event.stream_id) == (self.device_id, self.id):
            return
        event.synchronize()

    @property
    def done(self) -> bool:
        return self.record().done

    def __eq__(self, other) -> bool:
        return isinstance(other, Stream) and other.id == self.id and other.device_id == self.device_id

    def __hash__(self) -> int:
        return hash((self.id, self.device_id))

    def __repr__(self) -> str:
        return f"<gpuremote Stream {self.id} on device {self.device_id}>"


class _NullStream(Stream):
    """The null stream of whichever device is current when it is used."""

    def __init__(self):
        self.id = 0
        self.non_blocking = False
        self._previous = []

    @property
    def device_id(self) -> int:  # type: ignore[override]
        return context.current_device_index()


Stream.null = _NullStream()


def get_current_stream(device_id: int | None = None) -> Stream:
    if device_id is None:
        device_id = context.current_device_index()
    sid = context.current_stream_id(device_id)
    return _streams.get(sid) or Stream.null if sid else Stream.null


class Event:
    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self.id = next(_event_ids)
        self.device_id: int | None = None
        self.stream_id = 0

    def record(self, stream: Stream | None = None) -> None:
        """Mark the current point of `stream` (the current stream when None); queued, no wait."""
        self.device_id = context.current_device_index() if stream is None else stream.device_id
        self.stream_id = context.current_stream_id(self.device_id) if stream is None else stream.id
        service_call("cuda.Event.record", (self.id,), self.device_id, self.stream_id)

    def synchronize(self) -> None:
        """Wait until the point the event recorded has been reached."""
        self._check_recorded()
        sync_device(self.device_id, self.stream_id)

    @property
    def done(self) -> bool:
        self._check_recorded()
        return bool(service_call("cuda.Event.query", (self.id,), self.device_id, self.stream_id, value=True))

    def _check_recorded(self) -> None:
        if self.device_id is None:
            raise RuntimeError("the event has not been recorded: call record() first")

    def __repr__(self) -> str:
        return f"<gpuremote Event {self.id}>"


def get_elapsed_time(start_event: Event, end_event: Event) -> float:
    """Milliseconds between two recorded events (waits for the end event)."""
    start_event._check_recorded()
    end_event._check_recorded()
    if start_event.device_id != end_event.device_id:
        raise ValueError("both events must be recorded on the same device")
    return float(service_call("cuda.Event.elapsed", (start_event.id, end_event.id), end_event.device_id,
                              end_event.stream_id, value=True))
