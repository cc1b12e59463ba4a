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

from gpuremote import __version__
from gpuremote._config import DEFAULTS, PROTOCOL_VERSION
from gpuremote.daemon.backends.base import Backend
from gpuremote.daemon.session import Session, _StreamBroken
from gpuremote.transport.grpc_channel import options as grpc_options
from gpuremote.v1 import daemon_pb2_grpc
from gpuremote.wire import pb

log = logging.getLogger("gpuremote.daemon")


class DaemonService(daemon_pb2_grpc.DaemonServicer):
    def __init__(self, backend: Backend, max_sessions: int = DEFAULTS.max_sessions):
        self.backend = backend
        self.max_sessions = max_sessions
        self.sessions: dict[str, Session] = {}
        self._lock = threading.Lock()
        self.limits = pb.Limits(max_message_bytes=DEFAULTS.max_message_bytes,
                                max_ops_per_batch=DEFAULTS.max_ops_per_batch,
                                max_handles=DEFAULTS.max_handles, chunk_bytes=DEFAULTS.chunk_bytes,
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
                else:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                  f"unexpected {kind or 'empty'} message in an open session")
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
                                  options=grpc_options(DEFAULTS.max_message_bytes),
                                  maximum_concurrent_rpcs=max_sessions + 8)
        daemon_pb2_grpc.add_DaemonServicer_to_server(self.service, self.server)
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
