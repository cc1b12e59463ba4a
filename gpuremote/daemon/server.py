"""The daemon's gRPC service: sessions over bidirectional streams, and daemon facts.

Each session's stream is served by one thread of the server's pool, which runs the session's
ops in order. When the stream ends (the client closed it, died, or the network dropped it and
keepalive noticed), the session is closed and every byte it held is freed.

Shutdown (`DaemonServer.drain`, on SIGTERM): the daemon opens no new session, lets the open ones
keep working up to a deadline while every reply tells their clients it is coming, then ends each
one between two ops with a reason the client reports (its data-plane connection gets an ERROR
frame, a gRPC stream that is running a batch ends with UNAVAILABLE and the reason; an idle gRPC
stream can only be cancelled, so that client learns the reason from the notices, if it synced).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from concurrent import futures

import grpc
from google.protobuf.message import DecodeError

from gpuremote import __version__
from gpuremote._config import DEFAULTS, PROTOCOL_VERSION
from gpuremote.daemon.admission import Admission, Refusal
from gpuremote.daemon.backends.base import Backend
from gpuremote.daemon.dataplane import DataPlane
from gpuremote.daemon.session import Session, SessionEnded, _StreamBroken
from gpuremote.transport import auth, grpc_chunks
from gpuremote.transport.grpc_channel import options as grpc_options
from gpuremote.v1 import daemon_pb2_grpc
from gpuremote.wire import pb

log = logging.getLogger("gpuremote.daemon")


class _Malformed:
    """Stands in for a stream message that is not a valid ClientMessage (see _parse_client_message)."""

    def __init__(self, size: int, reason: str):
        self.size = size
        self.reason = reason


def _parse_client_message(data: bytes):
    # gRPC's own handling of a deserializer failure is an INTERNAL "Exception deserializing
    # request!", which tells the client nothing; the session reports it clearly instead.
    try:
        return grpc_chunks.decode(data) or pb.ClientMessage.FromString(data)   # chunks without protobuf's copies
    except (DecodeError, RuntimeError, ValueError) as exc:
        return _Malformed(len(data), str(exc)[:200])


def _checked(request_iterator, context):
    while True:
        try:
            msg = next(request_iterator)
        except StopIteration:
            return
        except grpc.RpcError:   # the stream was cancelled (client gone, or its data-plane connection broke)
            return
        if isinstance(msg, _Malformed):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"a message of {msg.size} bytes on the session stream is not a valid "
                          f"gpuremote.v1.ClientMessage ({msg.reason or 'undecodable'}); only gpuremote clients "
                          "of the same protocol version can talk to this daemon: install the same gpuremote "
                          "release on both sides")
        yield msg


def add_to_server(service: "DaemonService", server: grpc.Server) -> None:
    """Register the Daemon service, with a session deserializer that never raises."""
    handlers = {
        "Session": grpc.stream_stream_rpc_method_handler(
            service.Session, request_deserializer=_parse_client_message,
            response_serializer=grpc_chunks.serialize),
        "Info": grpc.unary_unary_rpc_method_handler(
            service.Info, request_deserializer=pb.InfoRequest.FromString,
            response_serializer=pb.InfoReply.SerializeToString),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("gpuremote.v1.Daemon", handlers),))
    server.add_registered_method_handlers("gpuremote.v1.Daemon", handlers)


def session_limits() -> pb.Limits:
    """The limits every session of this daemon gets (SessionOpened.limits), from DEFAULTS."""
    u32, u64 = 2**32 - 1, 2**64 - 1      # (a GPUREMOTE_<NAME> past the wire's field is its maximum)
    return pb.Limits(max_message_bytes=min(DEFAULTS.max_message_bytes, u64),
                     max_ops_per_batch=min(DEFAULTS.max_ops_per_batch, u32),
                     max_handles=min(DEFAULTS.max_handles, u64),
                     # a chunk (fetch or upload) must fit in one message with room to spare
                     chunk_bytes=min(DEFAULTS.chunk_bytes, DEFAULTS.max_message_bytes // 2, u64),
                     max_rank=min(DEFAULTS.max_rank, u32), max_templates=min(DEFAULTS.max_templates, u32))


class DaemonService(daemon_pb2_grpc.DaemonServicer):
    def __init__(self, backend: Backend, max_sessions: int = DEFAULTS.max_sessions,
                 admission: Admission | None = None):
        self.backend = backend
        self.max_sessions = max_sessions
        # Who may open a session and on what (pool grants): gpuremote/daemon/admission.py.
        self.admission = admission if admission is not None else Admission(backend)
        self.sessions: dict[str, Session] = {}
        self._lock = threading.Lock()
        self.drain_deadline: float | None = None    # monotonic; set when shutting down (drain)
        self.dataplane: DataPlane | None = None     # the framed-socket op channel (set by DaemonServer)
        # Ops and bytes of the sessions closed so far (metrics add the open ones).
        self.closed_totals = {"ops": 0, "bytes_h2d": 0, "bytes_d2h": 0}
        self.limits = session_limits()

    def _devices(self, out, session: Session | None = None) -> None:
        # A session under pool grants sees only its granted devices, sized by its lease's limit.
        memory = self.backend.memory if session is None else session.memory
        for p, mem, sched in zip(self.backend.props, memory, self.backend.schedulers):
            if session is None or session.flows[p.index] is not None:
                out.add(index=p.index, name=p.name, memory_total=mem.capacity, memory_used=mem.used,
                        compute_capability=p.compute_capability, multiprocessor_count=p.multiprocessor_count,
                        utilization=sched.utilization())

    def open_sessions(self) -> list[Session]:
        with self._lock:
            return list(self.sessions.values())

    def start_drain(self, timeout: float) -> None:
        """Open no more sessions; tell the open ones, in their replies, that they end in `timeout` s."""
        with self._lock:
            self.drain_deadline = time.monotonic() + timeout
            for s in self.sessions.values():
                s.drain_deadline = self.drain_deadline

    def end_sessions(self, reason: str) -> None:
        """Each open session stops between two ops; an idle one attached to the data plane is told why."""
        for s in self.open_sessions():
            s.ending = reason
            if self.dataplane is not None:
                self.dataplane.end(s, reason)

    def Info(self, request, context):
        reply = pb.InfoReply(version=__version__, protocol_version=PROTOCOL_VERSION, backend=self.backend.kind)
        if self.drain_deadline is not None:
            reply.draining = True
            reply.drain_remaining_s = max(0.0, self.drain_deadline - time.monotonic())
        self._devices(reply.devices)
        now = time.monotonic()
        with self._lock:
            sessions = list(self.sessions.values())
        for s in sessions:
            info = reply.sessions.add(session_id=s.id, client_name=s.client.client_name,
                                      client_pid=s.client.client_pid, client_host=s.client.client_host,
                                      handles=len(s.handles), ops=s.ops, age_s=now - s.started,
                                      lease_id=s.lease_id, devices=s.tenancy.devices)
            for i, used in enumerate(s.memory_used):
                if used:
                    info.memory_used[i] = used
            info.transport = self.dataplane.transport_of(s.id) if self.dataplane is not None else "grpc"
        return reply

    def Session(self, request_iterator, context):
        request_iterator = _checked(request_iterator, context)
        first = next(request_iterator, None)
        if first is None or first.WhichOneof("kind") != "open":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          "the first message of a session must be OpenSession")
        opened = first.open
        if opened.protocol_version != PROTOCOL_VERSION:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"protocol version mismatch: the client speaks version {opened.protocol_version}, "
                          f"this daemon (gpuremote {__version__}) speaks version {PROTOCOL_VERSION}; "
                          "install the same gpuremote release on both sides")
        try:
            tenancy = self.admission.admit(opened)
        except Refusal as exc:
            context.abort(exc.code, exc.message)
        session = Session(self.backend, opened, self.limits, tenancy)
        session.cancel = context.cancel
        with self._lock:
            if self.drain_deadline is not None:
                session.close()
                context.abort(grpc.StatusCode.UNAVAILABLE,
                              "this gpuremote daemon is shutting down and opens no new sessions; use another "
                              "daemon (a pool places you elsewhere), or start again once it is back")
            if len(self.sessions) >= self.max_sessions:
                session.close()
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                              f"the daemon already serves {self.max_sessions} sessions (its limit); try again "
                              "later or raise --max-sessions")
            self.sessions[session.id] = session
        log.info("session %s opened by %s (pid %s on %s)", session.id, opened.client_name,
                 opened.client_pid, opened.client_host)
        try:
            hello = pb.ServerMessage()
            hello.opened.protocol_version = PROTOCOL_VERSION
            hello.opened.session_id = session.id
            hello.opened.backend = self.backend.kind
            hello.opened.limits.CopyFrom(self.limits)
            self._devices(hello.opened.devices, session)
            if self.dataplane is not None:      # attach token and where to attach
                self.dataplane.register(session, context, opened, hello.opened.data_plane)
            yield hello

            def next_message():
                return next(request_iterator, None)

            for msg in request_iterator:
                kind = msg.WhichOneof("kind")
                if kind == "batch":
                    with self.dataplane.grpc_batch(session) if self.dataplane else contextlib.nullcontext():
                        yield from session.run_batch(msg.batch, next_message)
                elif kind == "chunk":
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                  f"unexpected chunk (seq {msg.chunk.seq}, offset {msg.chunk.offset}) in an open "
                                  "session: chunks must directly follow the batch whose Upload op announced them")
                else:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                  f"unexpected {kind or 'empty'} message in an open session: after OpenSession "
                                  "a client sends only op batches and the chunks of their uploads")
        except SessionEnded as exc:
            context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        except _StreamBroken as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        finally:
            with self._lock:
                self.sessions.pop(session.id, None)
                totals = self.closed_totals
                totals["ops"] += session.ops
                totals["bytes_h2d"] += session.bytes_h2d
                totals["bytes_d2h"] += session.bytes_d2h
            if self.dataplane is not None:
                self.dataplane.unregister(session)   # its connection stops before the session closes
            session.close()
            log.info("session %s closed after %d ops", session.id, session.ops)


class DaemonServer:
    """A running daemon: `DaemonServer(backend, "127.0.0.1:0").start()` then `.port`."""

    def __init__(self, backend: Backend, listen: str = "127.0.0.1:0", max_sessions: int = DEFAULTS.max_sessions,
                 admission: Admission | None = None, security: auth.ServerSecurity | None = None):
        # security: token and/or TLS (gpuremote/transport/auth.py); None serves unauthenticated, loopback only.
        self.service = DaemonService(backend, max_sessions, admission)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_sessions + 8,
                                                             thread_name_prefix="gpuremote-session"),
                                  # No SO_REUSEPORT: a second daemon on a port in use must fail to
                                  # start, not silently share the port's connections with the first.
                                  options=grpc_options(DEFAULTS.max_message_bytes) + [("grpc.so_reuseport", 0)],
                                  maximum_concurrent_rpcs=max_sessions + 8,
                                  interceptors=auth.server_interceptors(security))
        add_to_server(self.service, self.server)
        host = listen.rpartition(":")[0]
        self.port = auth.add_port(self.server, listen, security)
        if self.port == 0:
            raise OSError(f"cannot listen on {listen}: the address is in use or not local")
        self.address = f"{host}:{self.port}"
        if DEFAULTS.dataplane:   # plaintext TCP only where gRPC is plaintext too; the Unix socket never leaves the host
            self.service.dataplane = DataPlane(host, max_sessions + 8, tcp=not (security is not None and security.tls))

    def start(self) -> "DaemonServer":
        self.server.start()
        if self.service.dataplane is not None:
            self.service.dataplane.start()
        return self

    def drain(self, timeout: float, interrupted=None, say=None) -> None:
        """Graceful shutdown, before `stop`: no new sessions; the open ones keep working until they end
        or `timeout` s pass (counted from `service.start_drain` when that came first) or `interrupted`
        (an Event, or cli_common.SignalFlag: is_set and wait) is set, and are then ended with a reason
        their clients see. `say(text)` tells the operator."""
        service = self.service
        if service.drain_deadline is None:
            service.start_drain(timeout)
        deadline = service.drain_deadline
        interrupted = interrupted or threading.Event()
        open_now = len(service.open_sessions())
        if open_now and say is not None:
            say(f"draining: {open_now} session(s) open; they may work for {timeout:g} s more "
                "(signal again to stop now)")
        while service.open_sessions() and time.monotonic() < deadline and not interrupted.is_set():
            interrupted.wait(min(0.1, max(0.0, deadline - time.monotonic())))
        left = service.open_sessions()
        if not left:
            return
        how = "stopped at once" if interrupted.is_set() else f"shut down after a {timeout:g} s drain"
        service.end_sessions(f"the daemon {how}; the session's arrays are gone: start again on another device")
        # Sessions stop between two ops; give them (and their clients reading the reason) a moment.
        end = time.monotonic() + 1.0
        while service.open_sessions() and time.monotonic() < end:
            time.sleep(0.02)
        if say is not None:
            say(f"ended {len(left)} session(s) still open " + ("when signalled again" if interrupted.is_set()
                                                                else "at the deadline"))

    def stop(self, grace: float | None = 2.0) -> None:
        self.server.stop(grace).wait()
        if self.service.dataplane is not None:
            self.service.dataplane.stop()
        self.service.backend.close()

    def wait(self) -> None:
        self.server.wait_for_termination()
