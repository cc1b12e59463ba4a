"""The framed-socket transport: one TCP or Unix stream socket per session.

Op batches and replies are MSG frames holding the same protobuf messages as the gRPC stream;
the bytes of an upload or fetch larger than `inline_bytes` follow their announcing message as
one RAW frame, sent from the array where it lies and received with recv_into straight into a
page-aligned pooled buffer (the kernel's socket buffers pipeline the copy on both ends).
Order with the op stream holds by construction: there is one connection and one reader.
"""

from __future__ import annotations

import socket

import numpy
from google.protobuf.message import DecodeError

from gpuremote._config import DEFAULTS
from gpuremote.transport.base import Link, MessageTooLarge, PeerEnded, TransportError
from gpuremote.transport.frames import (ACK, ATTACH, ATTACHED, BYE, ERROR, KIND_NAMES, MSG, PING, PONG, QUICK,
                                        QUICK_FETCH, QUICK_HEAD, QUICK_SITE_MAX, QUIET, RAW, U64, FrameSocket,
                                        PeerClosed, Quick, parse_quiet, quick_payload, quiet_payload)
from gpuremote.wire import pb

_CONTROL_MAX = 1 << 16      # largest ATTACH/ATTACHED/ERROR frame
QUICK_MAX = QUICK_HEAD.size + QUICK_SITE_MAX


def tune(sock: socket.socket) -> None:
    """Low latency for small frames; a dead peer noticed by keepalive like the gRPC stream's."""
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in (("TCP_KEEPIDLE", max(1, DEFAULTS.keepalive_ms // 1000)),
                            ("TCP_KEEPINTVL", max(1, DEFAULTS.keepalive_timeout_ms // 3000)), ("TCP_KEEPCNT", 3)):
            if hasattr(socket, name):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def unix_address(path: str) -> str:
    """'@name' (as advertised) -> the abstract socket address Linux expects."""
    return "\0" + path[1:] if path.startswith("@") else path


def connect(via: str, address: str, unix_path: str, tcp_port: int, timeout: float) -> socket.socket:
    """A connected stream socket to the daemon's listener, over Unix (`via`="unix") or TCP."""
    if via == "unix":
        if not unix_path:
            raise OSError("the daemon offers no Unix socket to this client (not on its host)")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(unix_address(unix_path))
        except BaseException:
            sock.close()
            raise
    else:
        if not tcp_port:
            raise OSError("the daemon offers no TCP data plane")
        host = address.rpartition(":")[0].strip("[]") or "127.0.0.1"
        sock = socket.create_connection((host, tcp_port), timeout=timeout)
    tune(sock)
    return sock


def handshake(fs: FrameSocket, request: pb.Attach, fds: list[int] | None = None) -> pb.Attached:
    """Send Attach, return the daemon's Attached (TransportError when it refused)."""
    fs.send(ATTACH, 0, request.SerializeToString(), fds=fds)
    kind, _, payload = fs.read_frame(_CONTROL_MAX)
    if kind != ATTACHED:
        raise TransportError(f"the daemon answered the attach with a {KIND_NAMES.get(kind, kind)} frame")
    reply = pb.Attached.FromString(payload)
    if reply.error:
        raise TransportError(f"the daemon refused the attach: {reply.error}")
    return reply


class SocketLink(Link):
    """Client end: frames over a connected socket (used under the session's lock)."""

    name = "socket"

    def __init__(self, fs: FrameSocket, attached: pb.Attached, via: str):
        self.fs = fs
        self.via = via
        self.inline_bytes = attached.inline_bytes
        self._max = DEFAULTS.max_message_bytes

    def send(self, msg: pb.ClientMessage) -> None:
        data = msg.SerializeToString()
        if len(data) > self._max:
            raise MessageTooLarge(f"{len(data):,} bytes, larger than max {self._max:,}")
        try:
            self.fs.send(MSG, 0, data)
        except OSError:
            self._reason()
            raise

    def _reason(self) -> None:
        """After a failed send: raise the daemon's reason if it sent one before closing."""
        try:
            self.fs.sock.settimeout(0.5)
            kind, aux, length = self.fs.read_header()
            while kind != ERROR:
                self.fs.skip(length)
                kind, aux, length = self.fs.read_header()
        except (OSError, EOFError, TransportError):
            return
        self._control(kind, aux, length)

    def recv(self) -> pb.ServerMessage:
        while True:
            kind, aux, length = self.fs.read_header()
            if kind == MSG:
                return self._message(length)
            self._control(kind, aux, length)

    def _message(self, length: int) -> pb.ServerMessage:
        if length > self._max:
            raise TransportError(f"a message of {length:,} bytes exceeds the limit of {self._max:,}")
        try:
            return pb.ServerMessage.FromString(self.fs.read_payload(length))
        except DecodeError:
            raise TransportError(f"a message of {length:,} bytes from the daemon is not a valid "
                                 "gpuremote.v1.ServerMessage") from None

    def quick(self, code: int, seq: int, device: int, stream: int, flags: int, handle: int, site: str):
        """One QUICK sync point (frames.py): (seq, None or the fetched array) when the daemon answered
        QUIET, else the ServerMessage it answered with."""
        try:
            self.fs.send(QUICK, code, quick_payload(seq, stream, device, flags, handle, site))
        except OSError:
            self._reason()
            raise
        while True:
            kind, aux, length = self.fs.read_header()
            if kind == QUIET:
                if aux > DEFAULTS.max_rank or length > U64.size + 8 + 8 * aux + self.inline_bytes:
                    raise TransportError(f"a QUIET frame of {length:,} bytes ({aux} extents) exceeds the inline size "
                                         f"{self.inline_bytes:,}")
                return parse_quiet(aux, self.fs.read_payload(length), code == QUICK_FETCH)
            if kind == MSG:
                return self._message(length)
            self._control(kind, aux, length)

    def _control(self, kind: int, aux: int, length: int) -> None:
        """A frame other than the one expected: the daemon's error, or a subclass's bookkeeping."""
        if kind == ERROR:
            text = bytes(self.fs.read_payload(min(length, _CONTROL_MAX))).decode("utf-8", "replace")
            raise PeerEnded(text)
        raise TransportError(f"unexpected {KIND_NAMES.get(kind, kind)} frame from the daemon")

    def ping(self, payload: bytes = b"") -> bytes:
        """One round trip through the channel and the daemon's connection thread, not the session."""
        self.fs.send(PING, 0, payload)
        kind, aux, length = self.fs.read_header()
        while kind != PONG:
            self._control(kind, aux, length)
            kind, aux, length = self.fs.read_header()
        return bytes(self.fs.read_payload(length))

    def upload_chunks(self, flat: numpy.ndarray) -> int:
        return 1

    def send_upload(self, flat: numpy.ndarray) -> None:
        try:
            self.fs.send_bulk(RAW, 0, memoryview(flat))
        except OSError:
            self._reason()
            raise

    def receive_fetch(self, chunks: int, out: numpy.ndarray) -> None:
        view = memoryview(out)
        offset = 0
        for _ in range(chunks):
            kind, aux, length = self.fs.read_header()
            while kind != RAW:
                self._control(kind, aux, length)
                kind, aux, length = self.fs.read_header()
            if offset + length > len(view):
                raise TransportError(f"fetch: {offset + length:,} bytes arrived for an array of {len(view):,}")
            self.fs.read_into(view[offset:offset + length])
            offset += length
        if offset != len(view):
            raise TransportError(f"fetch delivered {offset:,} of {len(view):,} bytes")

    def close(self) -> None:
        """Say goodbye and wait (bounded) until the daemon has run what was sent and closed its end."""
        fs = self.fs
        if fs.closed:
            return
        try:
            fs.send(BYE)
            fs.sock.settimeout(DEFAULTS.attach_timeout_s)
            while True:                       # drain: replies nobody waits for, acks, until the end
                kind, aux, length = fs.read_header()
                fs.skip(length)
        except (OSError, EOFError, TransportError):
            pass
        finally:
            fs.close()

    def abandon(self) -> None:
        self.fs.close()


class SocketEndpoint:
    """Daemon end of a socket link (used by the connection's thread only)."""

    name = "socket"

    def __init__(self, fs: FrameSocket):
        self.fs = fs
        self.inline_bytes = DEFAULTS.socket_inline_bytes
        self._max = DEFAULTS.max_message_bytes
        self._batch = pb.ClientMessage()

    def attached(self) -> pb.Attached:
        return pb.Attached(transport=self.name, inline_bytes=self.inline_bytes)

    def close(self) -> None:
        """Release what the endpoint holds beyond the socket (the connection's thread is ending)."""

    def read_message(self) -> pb.ClientMessage | Quick | None:
        """The next client message (an op batch, or a QUICK frame's op), or None at an orderly end (BYE,
        or EOF between frames)."""
        while True:
            try:
                kind, aux, length = self.fs.read_header()
            except PeerClosed as exc:
                if exc.clean:
                    return None
                raise
            if kind == MSG:
                if length > self._max:
                    raise TransportError(f"a message of {length:,} bytes exceeds the limit of {self._max:,} "
                                         "(GPUREMOTE_MAX_MESSAGE_BYTES)")
                try:
                    return pb.ClientMessage.FromString(self.fs.read_payload(length))
                except DecodeError:
                    raise TransportError(f"a message of {length:,} bytes is not a valid gpuremote.v1.ClientMessage; only "
                                         "gpuremote clients of the same release can use this data plane") from None
            if kind == BYE:
                return None
            if kind == QUICK:
                if length > QUICK_MAX:
                    raise TransportError(f"a QUICK frame of {length:,} bytes exceeds the limit of {QUICK_MAX:,}")
                return Quick(aux, self.fs.read_payload(length))
            if kind == PING and length <= 1024:
                self.fs.send(PONG, aux, bytes(self.fs.read_payload(length)))
                continue
            self.control(kind, aux, length)

    def control(self, kind: int, aux: int, length: int) -> None:
        raise TransportError(f"unexpected {KIND_NAMES.get(kind, kind)} frame ({length:,} bytes) where an op batch "
                             "was due; the connection is out of step")

    def write(self, msg: pb.ServerMessage) -> None:
        self.fs.send(MSG, 0, msg.SerializeToString())

    def quiet(self, seq: int, host: numpy.ndarray | None = None) -> None:
        """Answer a QUICK frame's op that ran with nothing to report (a fetch: with its bytes)."""
        self.fs.send(QUIET, 0 if host is None else host.ndim, quiet_payload(seq, host))

    def receive_upload(self, chunks: int, dest: numpy.ndarray) -> int:
        """Read the upload's `chunks` bulk frames into `dest`; returns the bytes delivered."""
        view = memoryview(dest)
        offset = 0
        for _ in range(chunks):
            kind, aux, length = self._bulk_header()
            if offset + length > len(view):
                raise TransportError(f"{offset + length:,} bytes arrived for an upload of {len(view):,}")
            self.fs.read_into(view[offset:offset + length])
            offset += length
        return offset

    def _bulk_header(self) -> tuple[int, int, int]:
        kind, aux, length = self.fs.read_header()
        while kind == ACK:
            self.control(kind, aux, length)
            kind, aux, length = self.fs.read_header()
        if kind != RAW:
            raise TransportError(f"expected the bytes of an upload, got a {KIND_NAMES.get(kind, kind)} frame")
        return kind, aux, length

    def discard_upload(self, chunks: int) -> None:
        for _ in range(chunks):
            _, _, length = self._bulk_header()
            self.fs.skip(length)

    def fetch_chunks(self, nbytes: int) -> int:
        return 1

    def landing(self, segment: int, offset: int, nbytes: int) -> numpy.ndarray:
        """`nbytes` of the client's shared segment at `offset` (uint8), for a fetch to land in;
        TransportError when the connection maps no such memory."""
        raise TransportError(f"a fetch asks for its bytes in shared segment {segment}, but this connection is the "
                             f"{self.name} data plane, which maps no client memory (only shm does)")

    def send_fetch(self, flat: numpy.ndarray, landed: tuple[int, int, int] | None = None) -> None:
        self.fs.send_bulk(RAW, 0, memoryview(flat))

    def error(self, text: str) -> None:
        try:
            self.fs.send(ERROR, 0, text.encode("utf-8", "replace")[:_CONTROL_MAX])
        except OSError:
            pass
