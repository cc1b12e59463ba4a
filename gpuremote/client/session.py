"""A client's session with one daemon: op queue, batching, sync points and bulk transfers.

Ops that yield arrays never wait: the client picks result handles itself and queues the op;
queued ops leave as one stream message when `batch_flush_ops` have gathered (fewer in the first
batches after a sync point, when the daemon waits for work) or at the next sync point. A sync
point (`request`) sends what is queued plus one op that wants a reply and blocks for it; errors
of earlier asynchronous ops come back with that reply and are raised there, naming the op and
the application's source line that issued it.

A call made again at the same source line with arguments of the same kinds (a loop's step)
becomes a call template the second time (`Call.define_template`); from the third time on it
leaves as a few integers in a `Replay` op: the template id and its handles (daemon/templates.py).
"""

from __future__ import annotations

import itertools
import math
import os
import queue
import signal
import socket
import sys
import threading
import time
from typing import Any, Callable

import grpc
import numpy

from gpuremote._config import DEFAULTS, PROTOCOL_VERSION
from gpuremote.client.stats import STATS
from gpuremote.errors import DeviceLostError, LimitExceededError, ProtocolError, rebuild
from gpuremote.memo import Memo
from gpuremote.transport import attach as attach_link
from gpuremote.transport import buffers, grpc_chunks, host_id
from gpuremote.transport.base import PeerEnded
from gpuremote.transport.base import lost as link_lost
from gpuremote.transport.frames import QUICK_ALL_STREAMS, QUICK_FETCH, QUICK_SYNC
from gpuremote.transport.grpc_channel import open_channel, translate
from gpuremote.wire import pb, vpb
from gpuremote.wire.codec import decode, dtype_from_wire, encode

_CLOSE = None
# NumPy scalar types, and the encoded Value of each NumPy scalar seen (bounded): loops pass the
# same few (a learning rate, a batch size) thousands of times.
_SCALAR_TYPES = frozenset(numpy.sctypeDict.values()) - {bool, int, float, complex, str, bytes, object,
                                                        numpy.str_, numpy.bytes_, numpy.void, numpy.object_}
_SCALARS = Memo(4096)


def _scalar_bytes(a) -> bytes:
    key = (type(a), a.tobytes())
    data = _SCALARS.get(key)
    if data is None:
        v = vpb.Value()
        encode(a, v, lambda obj: None)
        data = _SCALARS.put(key, v.SerializeToString())
    return data
# Releases queued into one message at most: keeps it far below the message size limit.
_RELEASES_PER_MESSAGE = 1 << 16
# Ops in the first batch after a sync point (the batches after it double up to batch_flush_ops).
_FIRST_FLUSH_OPS = 8


class _InterruptsDeferred:
    """While a reply is awaited in the main thread, a first SIGINT is noted rather than raised (the
    reply is read whole, and then KeyboardInterrupt is raised): raised in the middle, it would leave
    the reply unread and the next one out of step. A second SIGINT raises at once. Only where
    Python's own SIGINT handler is in place: a program's own handler is left alone."""

    __slots__ = ("pending", "_on")

    def __init__(self):
        self.pending = False
        self._on = False

    def _note(self, signum, frame):
        if self.pending:
            raise KeyboardInterrupt
        self.pending = True

    def __enter__(self):
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, self._note)
            self._on = True

    def __exit__(self, *exc) -> None:
        if self._on:
            signal.signal(signal.SIGINT, signal.default_int_handler)


class Session:
    # The array proxy type of the API layer above; it registers itself here so that encoding
    # its instances is one type check (this layer never imports the API layer).
    proxy_type: type = type(None)

    def __init__(self, address: str, client_name: str | None = None,
                 timeout: float = DEFAULTS.connect_timeout_s, transport: str | None = None, grants=()):
        self.address = address
        # Pool grants (gpuremote.v1.SignedGrant) the session presents: a pool's daemon requires them.
        self.grants = list(grants)
        # The session's fast op channel (gpuremote/transport), when one attached; else the gRPC stream.
        self._link = None
        self.transport = "grpc"
        self._channel = open_channel(address, timeout)
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._chunk_credits = threading.Semaphore(DEFAULTS.grpc_chunks_in_flight)
        self._lock = threading.RLock()
        self._seq = itertools.count(1)
        self._handles = itertools.count(1)
        self._releases: list[int] = []
        self._msg = pb.ClientMessage()
        self._ops = self._msg.batch.ops
        # Ops a batch gathers before it is sent: _flush_limit, except right after a sync point, when
        # the daemon has nothing queued: then the first batch leaves after a few ops and each next
        # one may hold twice as many, so the device starts at once instead of idling while a whole
        # batch fills (the training example idled ~0.8 ms after each of its loss reads).
        self._flush_limit = DEFAULTS.batch_flush_ops
        self._flush_ops = self._flush_limit
        self._batch_bytes = 0
        self._queued = 0            # calls queued in the batch, those inside Replay runs included
        # Call templates: key -> template id; keys seen once (a second sighting defines one);
        # the open Replay run (its op and its integers), which the next other op or a flush closes.
        self._templates: dict[tuple, int] = {}
        self._sighted = Memo(4096)
        self._template_ids = itertools.count(1)
        self._max_templates = 0
        self._run: list[int] | None = None
        self._run_op: pb.Op | None = None
        self._run_calls = 0
        self.lost: Exception | None = None
        self.closed = False
        self._noticed = False      # the daemon's shutdown notice was shown
        self._interrupted: int | None = None     # the thread a Ctrl-C was deferred in while it awaited a reply
        # Chunk messages skip protobuf's copies both ways (transport/grpc_chunks.py; same wire format).
        session_call = self._channel.stream_stream("/gpuremote.v1.Daemon/Session", request_serializer=grpc_chunks.serialize,
                                                   response_deserializer=_server_message)
        self._responses = session_call(self._requests())
        hello = pb.ClientMessage()
        hello.open.protocol_version = PROTOCOL_VERSION
        hello.open.client_name = client_name or os.path.basename(sys.argv[0] if sys.argv and sys.argv[0] else "python")
        hello.open.client_pid = os.getpid()
        hello.open.client_host = socket.gethostname()
        hello.open.client_host_id = host_id()
        hello.open.grants.extend(self.grants)
        self._outbox.put(hello)
        try:
            opened = self._next().opened
        except BaseException:  # refused (version, session limit) or unreachable: leave nothing behind
            self._outbox.put(_CLOSE)
            self._channel.close()
            raise
        self.session_id = opened.session_id
        self.backend = opened.backend
        self.devices = list(opened.devices)
        # bytes this session may hold on each device (its lease's share, or the device), by daemon index
        self.capacity = {d.index: d.memory_total for d in opened.devices}
        self.limits = opened.limits
        # Stay within the daemon's limits: a batch is flushed before it holds max_ops_per_batch ops
        # (a flush adds a Release op) or half of max_message_bytes, and no chunk is near that size.
        max_message = opened.limits.max_message_bytes or DEFAULTS.max_message_bytes
        self._max_batch_bytes = max_message // 2
        if opened.limits.max_ops_per_batch:
            self._flush_limit = max(1, min(self._flush_limit, opened.limits.max_ops_per_batch - 2))
            self._flush_ops = self._flush_limit
        self._max_templates = min(opened.limits.max_templates, DEFAULTS.max_templates)
        self.chunk_bytes = min(opened.limits.chunk_bytes or DEFAULTS.chunk_bytes, max_message // 2)
        try:    # move the op stream to the daemon's data plane when one can be reached (else stay on gRPC)
            self._link = attach_link(address, self.session_id, opened.data_plane, transport)
        except BaseException:
            self._outbox.put(_CLOSE)
            self._channel.close()
            raise
        if self._link is not None:
            self.transport = self._link.name
            # The link has no keepalive of its own that sees a frozen daemon (its kernel still ACKs);
            # the gRPC stream beside it has (HTTP/2 pings): when that stream ends, wake the link.
            self._responses.add_done_callback(self._stream_ended)

    def _stream_ended(self, call) -> None:
        """The session's gRPC stream ended while a data-plane link carries its ops: the daemon is gone,
        froze (keepalive) or ended the session, so a thread blocked on the link must not wait forever."""
        link = self._link
        if link is None or self.closed:
            return
        self._stream_end = translate(call, self.address) if call.code() != grpc.StatusCode.OK else \
            DeviceLostError(f"the gpuremote daemon at {self.address} ended the session")
        fs = getattr(link, "fs", None)
        if fs is not None and hasattr(fs, "shutdown"):
            fs.shutdown()           # a blocked recv sees the end (closing alone would not wake it)
        else:
            link.abandon()

    def _requests(self):
        while True:
            msg = self._outbox.get()
            if msg is _CLOSE:
                return
            if type(msg) is bytes:          # an upload chunk: gRPC takes it now, the next may be made
                self._chunk_credits.release()
            yield msg

    def _next(self) -> pb.ServerMessage:
        if self.lost is not None:
            raise self.lost
        if self._link is not None:
            try:
                return self._link.recv()
            except (OSError, EOFError, ProtocolError, LimitExceededError) as exc:
                raise self._link_lost(exc) from None
        try:
            return next(self._responses)
        except grpc.RpcError as exc:
            self.lost = translate(exc, self.address)
        except StopIteration:
            self.lost = DeviceLostError(f"the gpuremote daemon at {self.address} ended the session")
        raise self.lost

    def _send(self, msg: pb.ClientMessage) -> None:
        link = self._link
        if link is None:
            self._outbox.put(msg)
            return
        try:
            link.send(msg)
        except (OSError, EOFError, ProtocolError, LimitExceededError) as exc:
            raise self._link_lost(exc) from None

    def _link_lost(self, exc: BaseException) -> Exception:
        link = self._link
        # The daemon's own reason, when it left one (an ERROR frame, readable even after the gRPC
        # stream's end shut the link), says more than the stream's status.
        said = isinstance(exc, PeerEnded)
        self.lost = (not said and getattr(self, "_stream_end", None)) or link_lost(exc, self.address, link.name)
        link.abandon()
        return self.lost

    # -- handles ------------------------------------------------------------------------
    def new_handle(self) -> int:
        return next(self._handles)

    def release(self, handle: int) -> None:
        """Queue a release; safe from __del__ in any thread (list.append is atomic)."""
        if not self.closed:
            self._releases.append(handle)

    def handle_of(self, obj: Any) -> int | None:
        session = getattr(obj, "_gr_session", None)
        if session is None:
            return None
        if session is not self:
            raise ValueError(f"an op mixes arrays from two daemons ({session.address} and {self.address}); "
                             "move one first, e.g. cupy.asarray(x.get())")
        return obj._gr_handle

    # -- queueing -----------------------------------------------------------------------
    def _check_open(self) -> None:
        """Raise why the session can take no more ops (lost or closed), if it cannot."""
        if self.lost is not None:
            raise self.lost
        if self.closed:
            raise DeviceLostError(f"the session with {self.address} is closed")

    def _new_op(self, device: int, stream: int, site: str) -> pb.Op:
        self._check_open()
        op = self._add_op(device, stream, site)
        self._queued += 1
        STATS.ops += 1
        return op

    def _add_op(self, device: int, stream: int, site: str) -> pb.Op:
        """Append an op after what is queued: dropped arrays' releases first, the open Replay run closed."""
        if self._releases:
            self._queue_releases()
        if self._run is not None:
            self._close_run()
        op = self._ops.add()
        op.seq = next(self._seq)
        op.device = device
        op.stream = stream
        op.site = site
        return op

    def _fill_call(self, op: pb.Op, name: str, args: tuple, kwargs: dict, results) -> None:
        c = op.call
        c.name = name
        handle_of = self.handle_of
        simple = True   # only handles and Python scalars: the op is small, skip measuring it
        proxy = self.proxy_type
        for a in args:
            v = c.args.add()
            t = type(a)
            if t is proxy:
                if a._gr_session is not self:
                    handle_of(a)  # raises the mixed-daemons error
                v.handle = a._gr_handle
            elif t is float:
                v.float_value = a
            elif t is int and -(2**63) <= a < 2**63:
                v.int_value = a
            elif t in _SCALAR_TYPES:        # a NumPy scalar (a float32 learning rate): encoded once
                v.MergeFromString(_scalar_bytes(a))
            else:
                encode(a, v, handle_of)
                simple = False
        for k, v in kwargs.items():
            c.kwarg_names.append(k)
            encode(v, c.kwarg_values.add(), handle_of)
            t = type(v)
            if not (t is bool or t is int or t is float or v is None):     # small ones need no measuring
                simple = False
        if results:
            c.results.extend(results)
        if not simple:
            size = op.ByteSize()
            if size > DEFAULTS.inline_bytes * 4:
                raise LimitExceededError(f"the arguments of {name} are {size:,} bytes, too large to send "
                                         "inline: move large data to the device first with cupy.asarray")
            self._batch_bytes += size

    def call(self, name: str, args: tuple, kwargs: dict, results, device: int, stream: int, site: str,
             signature: tuple | None = None, proxies: list | tuple = ()) -> None:
        """Queue a call of surface name `name`; its arrays will be bound to `results`.

        `signature` (the API layer's, or None) is what makes two calls the same template: the name,
        each argument's kind and value (an array's shape and dtype); `proxies` are the arrays in
        it, in encoding order. With one, a call repeated at the same site is replayed by id."""
        with self._lock:
            if self.lost is not None or self.closed:
                self._check_open()
            define = 0
            if signature is not None and self._max_templates:
                key = (signature, device, stream, site)
                tid = self._templates.get(key)
                if tid is not None:
                    self._replay(tid, proxies, results)
                    return
                if self._sighted.pop(key, False):
                    define = self._next_template()
                else:
                    self._sighted.put(key, True)
            op = self._add_op(device, stream, site)
            try:
                self._fill_call(op, name, args, kwargs, results)
                if define and op.call.ByteSize() <= DEFAULTS.max_template_bytes:
                    op.call.define_template = define
                    self._templates[key] = define
            except BaseException:
                del self._ops[-1]
                raise
            self._queued += 1
            STATS.ops += 1
            if self._queued >= self._flush_ops or self._batch_bytes >= self._max_batch_bytes:
                self._flush()

    def _next_template(self) -> int:
        """A template id to define; past the daemon's limit, ids are reused from 1 (a definition
        replaces the daemon's template of that id, and the ones here are forgotten)."""
        tid = next(self._template_ids)
        if tid > self._max_templates:
            self._templates.clear()
            self._template_ids = itertools.count(1)
            tid = next(self._template_ids)
        return tid

    def _replay(self, tid: int, proxies, results) -> None:
        handles = [p._gr_handle if p._gr_session is self else self.handle_of(p) for p in proxies]
        if self._releases:
            self._queue_releases()
        run = self._run if self._run is not None else self._open_run()
        if self._run_calls:
            next(self._seq)         # the i-th call of the run has the run op's seq + i
        self._run_calls += 1
        run.append(tid)
        run += handles
        run += results
        self._queued += 1
        STATS.ops += 1
        STATS.replayed += 1
        if self._queued >= self._flush_ops:
            self._flush()

    def _open_run(self) -> list[int]:
        op = self._run_op = self._ops.add()
        op.seq = next(self._seq)
        self._run_calls = 0
        self._run = []
        return self._run

    def _close_run(self) -> None:
        self._run_op.replay.calls.extend(self._run)
        self._run = self._run_op = None

    def _queue_releases(self) -> None:
        """Release dropped arrays before the next op, so that their memory is free for it: in the
        Replay run, as template id 0 and the handle (a few bytes each), at most a message's worth."""
        releases = self._releases
        while True:
            run = self._run if self._run is not None else self._open_run()
            if len(releases) == 1:          # the common case: the array a loop's last op replaced
                run.append(0)
                run.append(releases.pop(0))
                self._batch_bytes += 12
            else:
                handles = releases[:_RELEASES_PER_MESSAGE]
                del releases[:len(handles)]     # only this prefix: __del__ may append meanwhile
                for h in handles:
                    run.append(0)
                    run.append(h)
                self._batch_bytes += 12 * len(handles)
            if not releases:
                return
            self._send_batch()

    def call_value(self, name: str, args: tuple, kwargs: dict, device: int, stream: int, site: str) -> Any:
        """Run a call that returns a host value, and wait for it (a sync point)."""
        return self.request(lambda op: self._fill_call(op, name, args, kwargs, ()), device, stream, site)

    def upload(self, handle: int, host: numpy.ndarray, device: int, stream: int, site: str) -> None:
        """Queue the creation of array `handle` from host memory (H2D)."""
        host = numpy.asarray(host, order="C")
        nbytes = host.nbytes
        with self._lock:
            op = self._new_op(device, stream, site)
            up = op.upload
            up.handle = handle
            up.meta.dtype = host.dtype.str
            up.meta.shape.extend(host.shape)
            STATS.bytes_h2d += nbytes
            link = self._link
            if nbytes <= (DEFAULTS.inline_bytes if link is None else link.inline_bytes):
                up.data = host.tobytes()
                self._batch_bytes += nbytes
                if self._queued >= self._flush_ops or self._batch_bytes >= self._max_batch_bytes:
                    self._flush()
                return
            flat = host.reshape(-1).view(numpy.uint8)
            if link is not None:      # the bytes follow their batch as bulk frames of the link
                up.chunks = link.upload_chunks(flat)
                self._flush()
                try:
                    link.send_upload(flat)
                except (OSError, EOFError, ProtocolError, LimitExceededError) as exc:
                    raise self._link_lost(exc) from None
                STATS.messages += 1
                return
            chunk = self.chunk_bytes
            up.chunks = -(-nbytes // chunk)
            self._flush()
            for offset in range(0, nbytes, chunk):
                # A few chunks in flight, not the whole array: their buffers are then reused memory
                # (fresh memory is slow to touch) and a large upload does not double the process's size.
                while not self._chunk_credits.acquire(timeout=0.5):
                    if self._responses.done():
                        self.lost = self.lost or DeviceLostError(f"the session with the gpuremote daemon at "
                                                                 f"{self.address} ended during an upload")
                        raise self.lost
                self._outbox.put(grpc_chunks.encode(op.seq, offset, memoryview(flat[offset:offset + chunk])))
                STATS.messages += 1

    def flush(self) -> None:
        with self._lock:
            self._flush()

    def _flush(self) -> None:
        if self._releases:
            self._queue_releases()
        self._send_batch()

    def _send_batch(self) -> None:
        if self._run is not None:
            self._close_run()
        if not len(self._ops):
            return
        self._send(self._msg)
        STATS.messages += 1
        self._msg = pb.ClientMessage()
        self._ops = self._msg.batch.ops
        self._batch_bytes = 0
        self._queued = 0
        if self._flush_ops < self._flush_limit:
            self._flush_ops = min(2 * self._flush_ops, self._flush_limit)

    # -- sync points --------------------------------------------------------------------
    def request(self, fill: Callable[[pb.Op], None], device: int = 0, stream: int = 0, site: str = "",
                into: numpy.ndarray | None = None) -> Any:
        """Send queued ops plus one op that wants a reply, wait, and return the reply's result.

        The result is a Python value, a host array (fetch) or (shape, dtype) (describe). A chunked
        fetch lands straight in `into` when that is a C-contiguous, writeable array of the fetched
        shape and dtype (then the result is `into` itself), else in a pooled buffer.
        """
        with self._lock:
            op = self._new_op(device, stream, site)
            op.reply = True
            try:
                fill(op)
            except BaseException:
                del self._ops[-1]
                self._queued -= 1
                raise
            if into is not None and self._link is not None and op.WhichOneof("kind") == "fetch":
                land = self._link.landing(into)     # pinned memory the daemon can write into: one copy
                if land is not None:
                    op.fetch.land_segment, op.fetch.land_offset = land
            seq = op.seq
            self._flush()
            reply, result = self._await(seq, self._next, into)
        return self._conclude(reply, result)

    def sync(self, device: int, stream: int, all_streams: bool, site: str) -> None:
        """Wait until the ops issued to `stream` (every stream: `all_streams`) of `device` have run."""
        if self._link is not None:
            self._quick(QUICK_SYNC, device, stream, QUICK_ALL_STREAMS if all_streams else 0, 0, site)
            return

        def fill(op):
            op.sync.all_streams = all_streams
        self.request(fill, device, stream, site)

    def fetch(self, handle: int, device: int, stream: int, site: str, into: numpy.ndarray | None = None,
              nbytes: int | None = None) -> numpy.ndarray:
        """The host copy of array `handle` (D2H); `nbytes`, when known, lets a small one travel in a
        QUICK round trip. `into` as in `request`."""
        link = self._link
        if link is not None and nbytes is not None and nbytes <= link.inline_bytes:
            return self._quick(QUICK_FETCH, device, stream, 0, handle, site)

        def fill(op):
            op.fetch.handle = handle
        return self.request(fill, device, stream, site, into=into)

    def _quick(self, code: int, device: int, stream: int, flags: int, handle: int, site: str):
        """A sync point as one QUICK frame of the link (frames.py), after what is queued: the daemon
        answers QUIET (the op's outcome alone) or, when it has more to say, the reply a request gets."""
        with self._lock:
            self._check_open()
            self._flush()
            seq = next(self._seq)
            STATS.ops += 1
            STATS.messages += 1

            def ask():
                try:
                    return self._link.quick(code, seq, device, stream, flags, handle, site)
                except (OSError, EOFError, ProtocolError, LimitExceededError) as exc:
                    raise self._link_lost(exc) from None
            reply, result = self._await(seq, ask)
        return self._conclude(reply, result)

    def _await(self, seq: int, receive: Callable[[], Any], into: numpy.ndarray | None = None) -> tuple:
        """(reply, result) of op `seq`, whose answer `receive` waits for: a ServerMessage, or a QUICK
        op's QUIET answer as (seq, result), which has no reply. Ctrl-C waits for the answer, as a
        CUDA call finishes before Python sees it (_InterruptsDeferred)."""
        deferred = _InterruptsDeferred()
        try:
            with deferred:
                answer = self._answer(seq, receive, into)
        except KeyboardInterrupt:
            # a second Ctrl-C: the answer (or the rest of it) is still on its way, so nothing after
            # it could be read in order; the session is given up, not desynchronized
            self.lost = DeviceLostError(f"the session with the gpuremote daemon at {self.address} was abandoned: "
                                        "interrupted twice while waiting for a reply")
            raise
        if deferred.pending:      # raised by _conclude, after the reply's errors are taken
            self._interrupted = threading.get_ident()
        return answer

    def _answer(self, seq: int, receive: Callable[[], Any], into: numpy.ndarray | None) -> tuple:
        start = time.perf_counter()
        try:
            answer = receive()
            if type(answer) is tuple:
                if answer[0] != seq:
                    raise ProtocolError(f"reply for op {answer[0]} arrived while waiting for op {seq}")
                if answer[1] is not None:
                    STATS.bytes_d2h += answer[1].nbytes
                return None, answer[1]
            reply = answer.reply
            if reply.seq != seq:
                raise ProtocolError(f"reply for op {reply.seq} arrived while waiting for op {seq}")
            return reply, self._result(reply, into)
        finally:
            STATS.round_trips += 1
            STATS.blocked_s += time.perf_counter() - start
            self._flush_ops = min(_FIRST_FLUSH_OPS, self._flush_limit)

    def _conclude(self, reply: pb.Reply | None, result: Any) -> Any:
        """After the session's lock: the reply's notice and errors, then the result (or the
        KeyboardInterrupt deferred while it was awaited, with the reply's errors as its cause)."""
        interrupted = self._interrupted == threading.get_ident()
        if interrupted:
            self._interrupted = None
        try:
            if reply is not None:
                if reply.notice:
                    self._notice(reply.notice)
                self._raise_errors(reply)
        except Exception as errors:
            if interrupted:
                raise KeyboardInterrupt from errors
            raise
        if interrupted:
            raise KeyboardInterrupt
        return result

    def _notice(self, text: str) -> None:
        """The daemon announces its shutdown: tell the application once, on stderr."""
        if not self._noticed:
            self._noticed = True
            print(f"gpuremote: {text} (daemon {self.address})", file=sys.stderr, flush=True)

    def _result(self, reply: pb.Reply, into: numpy.ndarray | None = None) -> Any:
        outcome = reply.WhichOneof("outcome")
        if outcome == "value":
            if reply.value.WhichOneof("kind") == "none":    # a sync's reply: nothing to decode or count
                return None
            value = decode(reply.value, _no_handles, writable=True)
            if isinstance(value, numpy.ndarray):
                STATS.bytes_d2h += value.nbytes
            elif isinstance(value, (bool, int, float)):
                STATS.bytes_d2h += 8  # a scalar read back (item(), float(x), ...)
            elif isinstance(value, complex):
                STATS.bytes_d2h += 16
            return value
        if outcome == "meta":
            return tuple(reply.meta.shape), dtype_from_wire(reply.meta.dtype)
        if outcome == "chunked":
            return self._receive_chunks(reply, into)
        return None

    @staticmethod
    def _landing(into: numpy.ndarray | None, shape: tuple, dtype: numpy.dtype) -> tuple[numpy.ndarray, numpy.ndarray]:
        """(bytes a fetch is received into, the array they make): the caller's array when it can
        take them as they come (no copy afterwards), else a page-aligned, reused buffer."""
        if (into is not None and into.shape == shape and into.dtype == dtype and into.flags.c_contiguous
                and into.flags.writeable):
            return into.reshape(-1).view(numpy.uint8), into
        flat = buffers.take(math.prod(shape) * dtype.itemsize)
        return flat, flat.view(dtype).reshape(shape)

    def _receive_chunks(self, reply: pb.Reply, into: numpy.ndarray | None = None) -> numpy.ndarray:
        meta = reply.chunked.meta
        flat, out = self._landing(into, tuple(meta.shape), dtype_from_wire(meta.dtype))
        if self._link is not None:   # straight from the link
            try:
                self._link.receive_fetch(reply.chunked.chunks, flat)
            except (OSError, EOFError, ProtocolError, LimitExceededError) as exc:
                raise self._link_lost(exc) from None
            STATS.bytes_d2h += flat.nbytes
            return out
        offset = 0
        for _ in range(reply.chunked.chunks):
            chunk = self._next().chunk
            if chunk.seq != reply.seq or chunk.offset != offset or offset + len(chunk.data) > flat.size:
                raise ProtocolError(f"chunk for op {chunk.seq} at offset {chunk.offset} is out of order")
            flat[offset:offset + len(chunk.data)] = numpy.frombuffer(chunk.data, numpy.uint8)
            offset += len(chunk.data)
        if offset != flat.size:
            raise ProtocolError(f"fetch delivered {offset} of {flat.size} bytes")
        STATS.bytes_d2h += out.nbytes
        return out

    @staticmethod
    def _raise_errors(reply: pb.Reply) -> None:
        if not reply.deferred_errors and reply.WhichOneof("outcome") != "error":
            return      # the common case, checked cheaply: this runs at every sync point
        errors = list(reply.deferred_errors)
        if reply.WhichOneof("outcome") == "error" and all(e.seq != reply.error.seq for e in errors):
            errors.append(reply.error)
        if not errors:
            return
        first = errors[0]
        where = f"{first.op} issued at {first.site}" if first.site else first.op
        more = len(errors) - 1 + reply.dropped_errors
        note = f" ({more} later op(s) failed too)" if more else ""
        raise rebuild(first.type, f"{first.message}\n  [gpuremote: in {where}{note}]", first.traceback)

    def forked(self) -> None:
        """Called in a forked child: the parent's stream is not ours to use or close."""
        self.closed = True
        self.lost = DeviceLostError(f"this array belongs to the parent process's session with {self.address}; "
                                    "a forked child has its own session: create the arrays it needs there")

    def close(self) -> None:
        """Flush, end the stream (the daemon frees the session's memory) and close the channel."""
        with self._lock:
            if self.closed:
                return
            try:
                if self.lost is None:
                    self._flush()
            finally:
                self.closed = True
                link, self._link = self._link, None
                if link is not None:    # after the daemon has run what it was sent
                    link.close() if self.lost is None else link.abandon()
                self._outbox.put(_CLOSE)
        def drain():  # until the daemon ends the stream, so its cleanup has run when close returns
            try:
                for _ in self._responses:
                    pass
            except grpc.RpcError:
                pass

        drainer = threading.Thread(target=drain, daemon=True)
        drainer.start()
        drainer.join(timeout=DEFAULTS.keepalive_timeout_ms / 1000)
        self._channel.close()


def _server_message(data: bytes):
    return grpc_chunks.decode(data) or pb.ServerMessage.FromString(data)


def _no_handles(handle: int):
    raise ProtocolError("a reply named a remote handle; replies carry host values only")
