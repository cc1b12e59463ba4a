"""The daemon's data plane: a framed-socket listener that sessions may move their op stream to.

The daemon listens on TCP (on its gRPC host, port picked at run time) and on a Unix socket
(Linux abstract namespace; offered only to clients on this host). Each gRPC session gets a
random attach token, advertised in SessionOpened.data_plane; a client connects, presents it in
an Attach frame, and from then on its op batches and replies travel on that connection, served
by one thread that calls the same Session.run_batch as the gRPC servicer (with a bulk adapter
so upload and fetch bytes move as raw frames or through shared memory).

Lifetime: the gRPC stream still owns the session. When it ends, `unregister` wakes and stops
the connection's thread before the session is closed; when the connection breaks (a client
killed mid-transfer, a protocol violation), its thread cancels the gRPC stream, so the session
is closed and its memory freed either way. A session runs ops on one channel only: once it has
attached, batches on its gRPC stream are refused.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import os
import secrets
import socket
import tempfile
import threading

from google.protobuf.message import DecodeError

from gpuremote._config import DEFAULTS
from gpuremote.daemon.session import _StreamBroken
from gpuremote.errors import ProtocolError
from gpuremote.transport.base import TransportError, Unavailable, host_id
from gpuremote.transport.frames import (ATTACH, ATTACHED, KIND_NAMES, QUICK_ALL_STREAMS, QUICK_SYNC, FrameSocket,
                                        PeerClosed, Quick)
from gpuremote.transport.sockets import SocketEndpoint, tune
from gpuremote.wire import pb

log = logging.getLogger("gpuremote.daemon.dataplane")
_ATTACH_MAX = 1 << 16


class _Record:
    __slots__ = ("session", "context", "token", "lock", "attached", "dead", "fs", "endpoint", "transport")

    def __init__(self, session, context):
        self.session = session
        self.context = context
        self.token = secrets.token_bytes(32)
        self.lock = threading.Lock()     # held while a batch of this session runs (either channel)
        self.attached = False
        self.dead = False
        self.fs: FrameSocket | None = None
        self.endpoint = None
        self.transport = "grpc"


class _Outgoing:
    """The bytes of a fetch, yielded by Session.run_op after their Reply; `landed`: instead, the
    (shared segment, offset, bytes) of the client's memory they were written into."""

    __slots__ = ("flat", "landed")

    def __init__(self, flat, landed=None):
        self.flat = flat
        self.landed = landed


class _Bulk:
    """What Session.run_batch uses for bulk bytes on a data-plane connection."""

    def __init__(self, endpoint):
        self.endpoint = endpoint
        self.inline_bytes = endpoint.inline_bytes

    def receive(self, seq: int, chunks: int, dest) -> int:
        try:
            return self.endpoint.receive_upload(chunks, dest)
        except (TransportError, EOFError, OSError) as exc:
            raise _StreamBroken(f"upload for op {seq}: {exc}") from exc

    def discard(self, seq: int, chunks: int) -> None:
        try:
            self.endpoint.discard_upload(chunks)
        except (TransportError, EOFError, OSError) as exc:
            raise _StreamBroken(f"upload for op {seq}: {exc}") from exc

    def outgoing(self, flat):
        """(chunks to announce in the Reply, what run_op yields after it)."""
        return self.endpoint.fetch_chunks(flat.size), iter((_Outgoing(flat),))

    def landing(self, seq: int, segment: int, offset: int, nbytes: int):
        """The client's memory a fetch asked to land in (Fetch.land_segment), as uint8; a request
        the endpoint refuses fails its op (ProtocolError) and the connection serves on."""
        try:
            return self.endpoint.landing(segment, offset, nbytes)
        except TransportError as exc:
            raise ProtocolError(f"fetch for op {seq}: {exc}") from None

    def landed(self, segment: int, offset: int, nbytes: int):
        """What run_op yields after the Reply of a fetch written into the client's memory."""
        return iter((_Outgoing(None, (segment, offset, nbytes)),))


def _no_chunk_messages():
    raise _StreamBroken("chunk messages are not used on a data-plane connection: bulk bytes travel as frames")


class DataPlane:
    """Listeners, attach tokens and connection threads for one daemon."""

    def __init__(self, host: str, max_connections: int = DEFAULTS.max_sessions, tcp: bool = True):
        self.host_id = host_id()
        self.max_connections = max_connections
        self._records: dict[str, _Record] = {}
        self._lock = threading.Lock()
        self._conns: set[FrameSocket] = set()
        self._threads: list[threading.Thread] = []
        self._stopping = False
        self._tcp = None
        self.tcp_port = 0
        if tcp:
            host = host.strip("[]") or "0.0.0.0"
            self._tcp = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
            try:
                self._tcp.bind((host, 0))
                self._tcp.listen(64)
            except OSError:
                self._tcp.close()
                raise
            self.tcp_port = self._tcp.getsockname()[1]
        self._unix = None
        self.unix_path = ""
        self._unix_file = None
        try:
            self._unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            name = f"gpuremote-{os.getpid()}-{secrets.token_hex(8)}"
            if os.uname().sysname == "Linux":
                self._unix.bind("\0" + name)        # abstract: nothing on disk to clean up
                self.unix_path = "@" + name
            else:
                self._unix_file = os.path.join(tempfile.gettempdir(), name + ".sock")
                self._unix.bind(self._unix_file)
                self.unix_path = self._unix_file
            self._unix.listen(64)
        except OSError as exc:
            log.warning("no Unix socket data plane (%s); same-host clients use TCP", exc)
            if self._unix is not None:
                self._unix.close()
            self._unix = None
            self.unix_path = ""
        from gpuremote.transport import shm
        self.shm_ok = bool(DEFAULTS.shm) and self._unix is not None and shm.supported()
        try:
            from gpuremote.transport import verbs
            self.verbs = verbs.DaemonVerbs.create()
        except (ImportError, Unavailable, OSError) as exc:
            log.debug("no verbs data plane: %s", exc)
            self.verbs = None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> "DataPlane":
        for listener, via in ((self._tcp, "tcp"), (self._unix, "unix")):
            if listener is not None:
                t = threading.Thread(target=self._accept_loop, args=(listener, via), daemon=True,
                                     name=f"gpuremote-dataplane-{via}")
                t.start()
                self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stopping = True
        for listener in (self._tcp, self._unix):
            if listener is not None:
                with contextlib.suppress(OSError):
                    listener.shutdown(socket.SHUT_RDWR)
                listener.close()
        with self._lock:
            conns = list(self._conns)
        for fs in conns:
            fs.shutdown()
        for t in self._threads:
            t.join(timeout=2)
        if self._unix_file:
            with contextlib.suppress(OSError):
                os.unlink(self._unix_file)
        if self.verbs is not None:
            self.verbs.close()

    # -- sessions (called by the gRPC servicer) ------------------------------------------------
    def register(self, session, context, opened: pb.OpenSession, out: pb.DataPlane) -> None:
        """Give the session an attach token and describe the data plane in `out`."""
        rec = _Record(session, context)
        with self._lock:
            self._records[session.id] = rec
        out.tcp_port = self.tcp_port
        out.attach_token = rec.token
        out.host_id = self.host_id
        out.transports.append("socket")
        if self.unix_path and self.host_id and opened.client_host_id == self.host_id:
            out.unix_path = self.unix_path
            if self.shm_ok:
                out.transports.append("shm")
        if self.verbs is not None:
            out.transports.append("verbs")

    def unregister(self, session) -> None:
        """Stop the session's connection (if any) and wait until no batch of it runs."""
        with self._lock:
            rec = self._records.pop(session.id, None)
        if rec is None:
            return
        rec.dead = True
        if rec.fs is not None:
            rec.fs.shutdown()
        with rec.lock:   # a batch in progress finishes (its I/O now fails fast) before the session closes
            pass

    def end(self, session, reason: str) -> None:
        """Shutdown: an attached session idle between batches is told `reason` (an ERROR frame its
        client reads as the cause) and ended; a busy one stops between two ops by itself
        (Session.ending) and its connection thread sends the reason."""
        rec = self._records.get(session.id)
        if rec is None or not rec.attached or not rec.lock.acquire(timeout=0.2):
            return
        try:
            if rec.dead or rec.endpoint is None:
                return
            rec.dead = True
            with contextlib.suppress(Exception):
                rec.endpoint.error(reason)
            rec.fs.shutdown()
        finally:
            rec.lock.release()
        with contextlib.suppress(Exception):
            rec.context.cancel()            # the gRPC handler closes the session and frees its memory

    @contextlib.contextmanager
    def grpc_batch(self, session):
        """Held while the gRPC stream runs a batch; refuses once the session has attached."""
        rec = self._records.get(session.id)
        if rec is None:
            yield
            return
        with rec.lock:
            if rec.attached:
                raise _StreamBroken("this session's ops travel on its data-plane connection since it attached; "
                                    "the gRPC stream carries none of them")
            yield

    def transport_of(self, session_id: str) -> str:
        rec = self._records.get(session_id)
        return rec.transport if rec is not None else "grpc"

    # -- connections ---------------------------------------------------------------------------
    def _accept_loop(self, listener: socket.socket, via: str) -> None:
        while not self._stopping:
            try:
                sock, _ = listener.accept()
            except OSError:
                if self._stopping:
                    return
                threading.Event().wait(0.05)     # EMFILE and the like: back off, keep serving
                continue
            with self._lock:
                full = len(self._conns) >= self.max_connections
            if full:
                sock.close()
                continue
            threading.Thread(target=self._serve, args=(sock, via), daemon=True,
                             name=f"gpuremote-dataplane-conn-{via}").start()

    def _attach(self, fs: FrameSocket, via: str):
        """Read and check the Attach frame; returns (record, endpoint) or raises TransportError."""
        kind, _, payload = fs.read_frame(_ATTACH_MAX)
        if kind != ATTACH:
            raise TransportError(f"the first frame must be ATTACH, got {KIND_NAMES.get(kind, kind)}")
        try:
            req = pb.Attach.FromString(payload)
        except DecodeError:
            raise TransportError("the ATTACH frame does not hold a gpuremote.v1.Attach message") from None
        fds = fs.take_fds()
        try:
            rec = self._records.get(req.session_id)
            if rec is None or not hmac.compare_digest(rec.token, req.attach_token):
                raise TransportError("unknown session or wrong attach token")
            want = req.transport or "socket"
            if want == "socket":
                endpoint = SocketEndpoint(fs)
            elif want == "shm":
                if via != "unix" or not self.shm_ok:
                    raise TransportError("shm is served only on the Unix socket of a daemon on the client's host")
                from gpuremote.transport import shm
                owned, fds = fds, []
                endpoint = shm.ShmEndpoint(fs, req, owned)     # it closes them, whatever happens
            elif want == "verbs":
                if self.verbs is None:
                    raise TransportError("this daemon has no verbs device")
                endpoint = self.verbs.endpoint(fs, req)
            else:
                raise TransportError(f"unknown transport {want[:40]!r}")
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
        return rec, endpoint

    def _serve(self, sock: socket.socket, via: str) -> None:
        fs = FrameSocket(sock, DEFAULTS.socket_read_bytes, with_fds=(via == "unix"))
        with self._lock:
            self._conns.add(fs)
        rec = None
        endpoint = None
        clean = False
        try:
            tune(sock)
            sock.settimeout(DEFAULTS.attach_timeout_s)
            try:
                rec, endpoint = self._attach(fs, via)
            except (TransportError, Unavailable, ValueError) as exc:
                with contextlib.suppress(OSError):
                    fs.send(ATTACHED, 0, pb.Attached(error=str(exc)[:500]).SerializeToString())
                return
            with rec.lock:
                refused = "the session is closing" if rec.dead else \
                    "the session is already attached" if rec.attached else ""
                if not refused:
                    rec.attached, rec.fs, rec.endpoint, rec.transport = True, fs, endpoint, endpoint.name
            if refused:
                with contextlib.suppress(OSError):
                    fs.send(ATTACHED, 0, pb.Attached(error=refused).SerializeToString())
                rec = None
                return
            fs.send(ATTACHED, 0, endpoint.attached().SerializeToString())
            sock.settimeout(None)
            log.info("session %s attached over %s (%s)", rec.session.id, via, endpoint.name)
            clean = self._run(rec, endpoint)
        except _StreamBroken as exc:
            if endpoint is not None:
                endpoint.error(str(exc))
            log.info("data-plane connection ended: %s", exc)
        except TransportError as exc:
            if endpoint is not None:
                endpoint.error(str(exc))
            log.info("data-plane connection ended: %s", exc)
        except (PeerClosed, OSError) as exc:
            log.info("data-plane connection lost: %s", exc)
        except Exception as exc:     # a bug, not the peer's doing: log it, end the session cleanly
            log.exception("data-plane connection failed")
            if endpoint is not None:
                endpoint.error(f"internal error on the daemon: {type(exc).__name__}: {exc}")
        finally:
            if endpoint is not None:
                endpoint.close()
            fs.close()
            with self._lock:
                self._conns.discard(fs)
            if rec is not None and not clean and not rec.dead:
                # A broken data plane ends the session: the gRPC stream is cancelled, its handler
                # closes the session and frees its memory.
                with contextlib.suppress(Exception):
                    rec.context.cancel()

    def _run(self, rec: _Record, endpoint) -> bool:
        """Serve batches until an orderly end (True) or the session goes away (False)."""
        session = rec.session
        bulk = _Bulk(endpoint)
        write = endpoint.write
        send_fetch = endpoint.send_fetch
        Outgoing = _Outgoing
        while True:
            msg = endpoint.read_message()
            if msg is None:
                return True
            if type(msg) is Quick:
                with rec.lock:
                    if rec.dead:
                        return False
                    if self._quiet(session, msg, endpoint):
                        continue
                batch = _as_batch(msg)      # not that simple: the op runs as in a batch, every reply possible
            else:
                kind = msg.WhichOneof("kind")
                if kind != "batch":
                    raise TransportError(f"unexpected {kind or 'empty'} message on the data plane: after attaching, "
                                         "a client sends only op batches")
                batch = msg.batch
            with rec.lock:
                if rec.dead:
                    return False
                for out in session.run_batch(batch, _no_chunk_messages, bulk):
                    if type(out) is Outgoing:
                        send_fetch(out.flat, out.landed)
                    else:
                        write(out)

    @staticmethod
    def _quiet(session, q: Quick, endpoint) -> bool:
        """Run a QUICK frame's op and answer QUIET when there is nothing else to report."""
        if not session.quiet():
            return False
        if q.code == QUICK_SYNC:
            if not session.quiet_sync(q.device, q.stream, q.flags & QUICK_ALL_STREAMS):
                return False
            endpoint.quiet(q.seq)
            return True
        host = session.quiet_fetch(q.device, q.stream, q.handle, endpoint.inline_bytes)
        if host is None:
            return False
        endpoint.quiet(q.seq, host)
        return True


def _as_batch(q: Quick) -> pb.OpBatch:
    """A QUICK frame's op as the one-op batch it stands for."""
    batch = pb.OpBatch()
    op = batch.ops.add(seq=q.seq, device=q.device, stream=q.stream, site=q.site, reply=True)
    if q.code == QUICK_SYNC:
        op.sync.all_streams = bool(q.flags & QUICK_ALL_STREAMS)
    else:
        op.fetch.handle = q.handle
    return batch
