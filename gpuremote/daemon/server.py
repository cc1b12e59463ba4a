"""The daemon's gRPC service: sessions over bidirectional streams, and daemon facts.

Each session's stream is served by one thread of the server's pool, which runs the session's
ops in order. When the stream ends (the client closed it, died, or the network dropped it and
keepalive noticed), the session is closed and every byte it held is freed.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent import futures

import grpc
from google.protobuf.message import DecodeError

from gpuremote import __version__
from gpuremote._config import DEFAULTS, PROTOCOL_VERSION
from gpuremote.daemon.backends.base import Backend
from gpuremote.daemon.session import Session, _StreamBroken
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
        return pb.ClientMessage.FromString(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        return _Malformed(len(data), str(exc)[:200])


def _checked(request_iterator, context):
    for msg in request_iterator:
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
            response_serializer=pb.ServerMessage.SerializeToString),
        "Info": grpc.unary_unary_rpc_method_handler(
            service.Info, request_deserializer=pb.InfoRequest.FromString,
            response_serializer=pb.InfoReply.SerializeToString),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("gpuremote.v1.Daemon", handlers),))
    server.add_registered_method_handlers("gpuremote.v1.Daemon", handlers)


class DaemonService(daemon_pb2_grpc.DaemonServicer):
    def __init__(self, backend: Backend, max_sessions: int = DEFAULTS.max_sessions):
        self.backend = backend
        self.max_sessions = max_sessions
        self.sessions: dict[str, Session] = {}
        self._lock = threading.Lock()
        self.limits = pb.Limits(max_message_bytes=DEFAULTS.max_message_bytes,
                                max_ops_per_batch=DEFAULTS.max_ops_per_batch,
                                max_handles=DEFAULTS.max_handles,
                                # a chunk (fetch or upload) must fit in one message with room to spare
                                chunk_bytes=min(DEFAULTS.chunk_bytes, DEFAULTS.max_message_bytes // 2),
                                max_rank=DEFAULTS.max_rank)

    def _devices(self, out) -> None:
        for p, mem in zip(self.backend.props, self.backend.memory):
            out.add(index=p.index, name=p.name, memory_total=mem.capacity, memory_used=mem.used,
                    compute_capability=p.compute_capability, multiprocessor_count=p.multiprocessor_count)

    def Info(self, request, context):
        reply = pb.InfoReply(version=__version__, protocol_version=PROTOCOL_VERSION, backend=self.backend.kind)
        self._devices(reply.devices)
        now = time.monotonic()
        with self._lock:
            sessions = list(self.sessions.values())
        for s in sessions:
            info = reply.sessions.add(session_id=s.id, client_name=s.client.client_name,
                                      client_pid=s.client.client_pid, client_host=s.client.client_host,
                                      handles=len(s.handles), ops=s.ops, age_s=now - s.started)
            for i, used in enumerate(s.memory_used):
                if used:
                    info.memory_used[i] = used
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
        session = Session(self.backend, opened, self.limits)
        with self._lock:
            if len(self.sessions) >= self.max_sessions:
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
            self._devices(hello.opened.devices)
            yield hello

            def next_message():
                return next(request_iterator, None)

            for msg in request_iterator:
                kind = msg.WhichOneof("kind")
                if kind == "batch":
                    yield from session.run_batch(msg.batch, next_message)
                elif kind == "chunk":
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                  f"unexpected chunk (seq {msg.chunk.seq}, offset {msg.chunk.offset}) in an open "
                                  "session: chunks must directly follow the batch whose Upload op announced them")
                else:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                  f"unexpected {kind or 'empty'} message in an open session: after OpenSession "
                                  "a client sends only op batches and the chunks of their uploads")
        except _StreamBroken as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        finally:
            with self._lock:
                self.sessions.pop(session.id, None)
            session.close()
            log.info("session %s closed after %d ops", session.id, session.ops)


class DaemonServer:
    """A running daemon: `DaemonServer(backend, "127.0.0.1:0").start()` then `.port`."""

    def __init__(self, backend: Backend, listen: str = "127.0.0.1:0", max_sessions: int = DEFAULTS.max_sessions):
        self.service = DaemonService(backend, max_sessions)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_sessions + 8,
                                                             thread_name_prefix="gpuremote-session"),
                                  # No SO_REUSEPORT: a second daemon on a port in use must fail to
                                  # start, not silently share the port's connections with the first.
                                  options=grpc_options(DEFAULTS.max_message_bytes) + [("grpc.so_reuseport", 0)],
                                  maximum_concurrent_rpcs=max_sessions + 8)
        add_to_server(self.service, self.server)
        host = listen.rpartition(":")[0]
        self.port = self.server.add_insecure_port(listen)
        if self.port == 0:
            raise OSError(f"cannot listen on {listen}: the address is in use or not local")
        self.address = f"{host}:{self.port}"

    def start(self) -> "DaemonServer":
        self.server.start()
        return self

    def stop(self, grace: float | None = 2.0) -> None:
        self.server.stop(grace).wait()
        self.service.backend.close()

    def wait(self) -> None:
        self.server.wait_for_termination()
