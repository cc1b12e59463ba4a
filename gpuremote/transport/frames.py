"""Length-prefixed frames on a stream socket: the data plane's wire format.

Every frame is a 16-byte header, `kind` (u32), `aux` (u32), `length` (u64), little-endian,
followed by exactly `length` payload bytes:

  ATTACH    client -> daemon, first frame: a gpuremote.v1.Attach (shm: the ring memfds ride along)
  ATTACHED  daemon -> client: a gpuremote.v1.Attached
  MSG       one protobuf message: ClientMessage (op batch) or ServerMessage (reply)
  RAW       bulk bytes of the Upload (or fetch Reply) announced by the previous MSG
  SLOT      bulk bytes waiting in ring slot `aux`; payload: u64 byte count
  ACK       ring slot `aux` has been read and may be written again
  SEGMENT   bulk bytes in registered shared segment `aux`; payload: u64 offset, u64 byte count (client ->
            daemon: an upload's bytes lie there; daemon -> client: a fetch's bytes were written there)
  REGISTER  shared segment `aux` (its memfd rides along as SCM_RIGHTS); payload: u64 size
  ERROR     daemon -> client before it closes a broken connection; payload: UTF-8 reason
  BYE       orderly end
  FORGET    shared segment `aux` is gone on the client: the daemon drops its mapping
  PING      client -> daemon: answered at once with PONG (same aux and payload, at most 1 KiB), without
            touching the session: the channel's own round trip
  PONG      the answer to PING
  QUICK     client -> daemon: a sync point in fixed fields instead of an op batch (aux: QUICK_SYNC or
            QUICK_FETCH); payload: QUICK_HEAD (u64 seq, u64 stream, u32 device, u32 flags (sync: 1 = all
            streams), u64 handle (fetch)), then the application's source line (UTF-8, <= QUICK_SITE_MAX).
            Answered by QUIET when the op ran with nothing else to report, else by the MSG reply a Sync
            or Fetch op of that seq would get (errors, deferred errors, notices, chunked bytes).
  QUIET     daemon -> client: u64 seq; a fetch's adds the array: dtype (8 bytes, NUL-padded), `aux`
            extents (u64 each), then its C-order bytes (at most the link's inline size)

Bulk bytes are received with recv_into straight into their destination (a page-aligned,
pooled buffer), never through an intermediate copy; small frames are read through one
reusable buffer so that a reply costs one recv.
"""

from __future__ import annotations

import array
import math
import os
import socket
import struct
import time

import numpy

from gpuremote._config import DEFAULTS
from gpuremote.memo import Memo
from gpuremote.transport.base import TransportError
from gpuremote.wire.codec import checked_shape, dtype_from_wire

HEADER = struct.Struct("<IIQ")
U64 = struct.Struct("<Q")
U64X2 = struct.Struct("<QQ")
ATTACH, ATTACHED, MSG, RAW, SLOT, ACK, SEGMENT, REGISTER, ERROR, BYE, FORGET, PING, PONG, QUICK, QUIET = range(1, 16)
SEGMENT_ACK = 0xFFFFFFFF      # ACK aux for a SEGMENT frame (not a ring slot)
KIND_NAMES = {ATTACH: "ATTACH", ATTACHED: "ATTACHED", MSG: "MSG", RAW: "RAW", SLOT: "SLOT", ACK: "ACK",
              SEGMENT: "SEGMENT", REGISTER: "REGISTER", ERROR: "ERROR", BYE: "BYE", FORGET: "FORGET",
              PING: "PING", PONG: "PONG", QUICK: "QUICK", QUIET: "QUIET"}
QUICK_SYNC, QUICK_FETCH = 1, 2
QUICK_HEAD = struct.Struct("<QQIIQ")
QUICK_SITE_MAX = 1024
QUICK_ALL_STREAMS = 1
# Most descriptors one frame may carry (the two ring memfds at attach, one segment later).
MAX_FDS = 4
_FD_SPACE = socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)
# Payloads up to this size are sent joined to their header: copying them costs less than sendmsg's
# gather (a small op batch or reply, a PING).
_JOIN_BYTES = 4096


class Quick:
    """A QUICK frame's op: a sync (`code` QUICK_SYNC) or a small fetch of `handle` (QUICK_FETCH)."""

    __slots__ = ("code", "seq", "stream", "device", "flags", "handle", "site")

    def __init__(self, code: int, payload) -> None:
        if code not in (QUICK_SYNC, QUICK_FETCH) or not QUICK_HEAD.size <= len(payload) <= QUICK_HEAD.size + QUICK_SITE_MAX:
            raise TransportError(f"malformed QUICK frame (op code {code}, {len(payload):,} bytes)")
        self.code = code
        self.seq, self.stream, self.device, self.flags, self.handle = QUICK_HEAD.unpack_from(payload)
        self.site = bytes(payload[QUICK_HEAD.size:]).decode("utf-8", "replace")


def quick_payload(seq: int, stream: int, device: int, flags: int, handle: int, site: str) -> bytes:
    return QUICK_HEAD.pack(seq, stream, device, flags, handle) + site.encode("utf-8", "replace")[:QUICK_SITE_MAX]


def quiet_payload(seq: int, host=None) -> bytes:
    """A QUIET frame's payload (its aux is `host.ndim`, or 0): the seq, and a fetched C-contiguous array."""
    if host is None:
        return U64.pack(seq)
    return b"".join((U64.pack(seq), _dtype_field(host.dtype), struct.pack(f"<{host.ndim}Q", *host.shape),
                     host.tobytes()))


def _dtype_field(dtype: numpy.dtype) -> bytes:
    field = _DTYPE_FIELDS.get(dtype)
    if field is None:
        field = _DTYPE_FIELDS.put(dtype, dtype.str.encode().ljust(8, b"\0"))
    return field


def parse_quiet(aux: int, payload, fetch: bool):
    """(seq, the fetched array as a new writable NumPy array, or None for a sync) of a QUIET frame;
    TransportError when its payload does not hold what it says."""
    if not fetch:
        if len(payload) != U64.size:
            raise TransportError(f"malformed QUIET frame for a sync ({len(payload):,} bytes)")
        return U64.unpack(payload)[0], None
    head = U64.size + 8 + 8 * aux
    if aux > DEFAULTS.max_rank or len(payload) < head:
        raise TransportError(f"malformed QUIET frame for a fetch ({aux} extents, {len(payload):,} bytes)")
    field = bytes(payload[8:16])
    dtype = _FIELD_DTYPES.get(field)
    try:
        if dtype is None:
            dtype = _FIELD_DTYPES.put(field, dtype_from_wire(field.rstrip(b"\0").decode("ascii")))
        shape = struct.unpack_from(f"<{aux}Q", payload, 16)
        n = math.prod(shape)
        if not n:       # an empty array: its other extents are checked against NumPy's limits
            shape = checked_shape(shape, dtype.itemsize)
    except (TypeError, ValueError, UnicodeDecodeError) as exc:
        raise TransportError(f"malformed QUIET frame for a fetch: {exc}") from None
    if len(payload) - head != n * dtype.itemsize:
        raise TransportError(f"QUIET frame: {len(payload) - head:,} bytes for an array of shape {shape} of {dtype}")
    # the application's own, writable copy (bytearray: half the cost of frombuffer + copy at this size)
    return U64.unpack_from(payload)[0], numpy.ndarray(shape, dtype, bytearray(payload[head:]))


_DTYPE_FIELDS = Memo(64)       # dtype -> its 8-byte QUIET field (a handful of dtypes ever)
_FIELD_DTYPES = Memo(64)       # and back, validated


class PeerClosed(EOFError):
    """The peer closed the connection (at a frame boundary when `clean`)."""

    def __init__(self, clean: bool):
        super().__init__("the peer closed the connection" + ("" if clean else " in the middle of a frame"))
        self.clean = clean


class FrameSocket:
    """A connected stream socket that sends and receives frames. One thread uses it at a time."""

    def __init__(self, sock: socket.socket, read_bytes: int, with_fds: bool = False, spin_s: float | None = None):
        self.sock = sock
        # Before blocking on an empty socket, poll it a while: the answer to a round trip usually
        # comes within tens of microseconds, while waking a thread that went to sleep costs about
        # 100 us on small VMs (its vCPU halted; the sender pays for the wake-up too). Adaptive, as
        # spinning locks are: when the data came soon after a poll ran out, the next poll is longer
        # (up to spin_s); when it came much later, shorter (down to 1/16), so an oversubscribed
        # host, where every wait is long, soon stops burning CPU on polls.
        self.spin_s = DEFAULTS.spin_us / 1e6 if spin_s is None else spin_s
        self._spin = self.spin_s
        self._buf = bytearray(max(read_bytes, 4096))
        self._view = memoryview(self._buf)
        self._start = 0          # buffered, unread bytes are _buf[_start:_end]
        self._end = 0
        self._with_fds = with_fds
        self._fds: list[int] = []
        self.closed = False

    # -- sending -----------------------------------------------------------------------------
    def send(self, kind: int, aux: int = 0, payload=b"", fds: list[int] | None = None) -> None:
        header = HEADER.pack(kind, aux, len(payload))
        if fds:
            anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
            sent = self.sock.sendmsg([header, payload], anc)
        elif len(payload) <= _JOIN_BYTES:     # one small buffer: cheaper than sendmsg's two
            sent = self.sock.send(header + payload)
        else:
            sent = self.sock.sendmsg([header, payload])
        if sent < HEADER.size + len(payload):
            self._send_rest([header, payload], sent)

    def send_bulk(self, kind: int, aux: int, view: memoryview) -> None:
        """A frame whose payload is `view`, sent from where it lies (no copy in user space)."""
        header = HEADER.pack(kind, aux, len(view))
        sent = self.sock.sendmsg([header, view])
        if sent < HEADER.size + len(view):
            self._send_rest([header, view], sent)

    def _send_rest(self, parts, sent: int) -> None:
        for part in parts:
            part = memoryview(part).cast("B")
            if sent >= len(part):
                sent -= len(part)
                continue
            self.sock.sendall(part[sent:])
            sent = 0

    # -- receiving ---------------------------------------------------------------------------
    def _recv_into(self, view: memoryview) -> int:
        spin = self._spin
        if not spin:
            return self._recv_once(view, 0)
        start = 0.0
        while True:
            try:
                return self._recv_once(view, socket.MSG_DONTWAIT)
            except BlockingIOError:
                now = time.perf_counter()
                if not start:
                    start = now
                elif now - start >= spin:
                    break
        n = self._recv_once(view, 0)
        waited = time.perf_counter() - start
        self._spin = min(self.spin_s, 2 * waited) if waited < self.spin_s else max(spin / 2, self.spin_s / 16)
        return n

    def _recv_once(self, view: memoryview, flags: int) -> int:
        if not self._with_fds:
            return self.sock.recv_into(view, 0, flags)
        n, anc, flags, _ = self.sock.recvmsg_into([view], _FD_SPACE, flags)
        for level, typ, data in anc:
            if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
                self._fds.extend(fds)
        if flags & socket.MSG_CTRUNC or len(self._fds) > MAX_FDS:
            self.drop_fds()
            raise TransportError("the peer passed more file descriptors than the protocol allows")
        return n

    def _fill(self, need: int) -> None:
        """Make at least `need` (<= buffer size) unread bytes available in the buffer."""
        if self._end - self._start >= need:
            return
        if self._start + need > len(self._buf):     # compact: move the unread tail to the front
            rest = self._end - self._start
            self._buf[:rest] = self._buf[self._start:self._end]
            self._start, self._end = 0, rest
        while self._end - self._start < need:
            n = self._recv_into(self._view[self._end:])
            if n == 0:
                raise PeerClosed(clean=self._end == self._start)
            self._end += n

    def read_header(self) -> tuple[int, int, int]:
        self._fill(HEADER.size)
        kind, aux, length = HEADER.unpack_from(self._buf, self._start)
        self._start += HEADER.size
        return kind, aux, length

    def read_payload(self, length: int) -> memoryview:
        """The next `length` bytes; valid until the next read (copy what must outlive it)."""
        if length <= len(self._buf):
            self._fill(length)
            view = self._view[self._start:self._start + length]
            self._start += length
            return view
        out = memoryview(bytearray(length))      # larger than the buffer: a big op batch (rare)
        self.read_into(out)
        return out

    def read_frame(self, max_length: int) -> tuple[int, int, memoryview]:
        kind, aux, length = self.read_header()
        if length > max_length:
            raise TransportError(f"a {KIND_NAMES.get(kind, kind)} frame of {length:,} bytes exceeds the limit "
                                 f"of {max_length:,}")
        return kind, aux, self.read_payload(length)

    def read_into(self, view: memoryview) -> None:
        """Fill `view` exactly: buffered bytes first, then straight from the socket into it."""
        n = len(view)
        have = min(self._end - self._start, n)
        if have:
            view[:have] = self._view[self._start:self._start + have]
            self._start += have
        got = have
        while got < n:
            r = self._recv_into(view[got:])
            if r == 0:
                raise PeerClosed(clean=False)
            got += r

    def skip(self, n: int) -> None:
        """Read and drop `n` payload bytes."""
        while n > 0:
            step = min(n, len(self._buf))
            self._fill(step)
            self._start += step
            n -= step

    def take_fds(self) -> list[int]:
        fds, self._fds = self._fds, []
        return fds

    def drop_fds(self) -> None:
        for fd in self.take_fds():
            try:
                os.close(fd)
            except OSError:
                pass

    # -- ending ------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Wake a thread blocked on this socket (its reads see the end; its writes fail)."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.drop_fds()
            try:
                self.sock.close()
            except OSError:
                pass
