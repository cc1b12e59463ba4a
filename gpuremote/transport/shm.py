"""The shared-memory transport: a Unix socket for ops plus shared rings for bulk bytes (same host).

At attach the client creates one memfd holding two rings of `ring_slots` x `ring_slot_bytes`
(first half: client -> daemon, second half: daemon -> client), seals it against shrinking and
passes it to the daemon with SCM_RIGHTS; both map it. An upload is cut into slot-sized chunks:
the client copies a chunk into the next free slot and sends a SLOT frame; the daemon copies it
out in place into the array's buffer and sends ACK, while the client already fills the next
slot (pipelined; the client reuses a slot only after its ACK). A fetch runs the same way the
other way round. ACKs are consumed lazily wherever frames are read, so a transfer never waits
for its last ACKs.

Pinned host arrays (cupyx.empty_pinned) live in shared memfd segments already
(gpuremote/transport/buffers.py): the first upload from one sends its memfd (REGISTER), then
each upload from it is one SEGMENT frame and the daemon copies straight out of it: one copy.
A fetch into one (`x.get(out=pinned)`) names the segment in the op (Fetch.land_segment): the
daemon copies straight into it and answers with a SEGMENT frame: one copy the other way too.
The daemon checks every memfd it is given (sealed against shrinking, large enough, within the
session's limits), so a client cannot make it fault on a truncated mapping.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import socket
import types

import numpy

from gpuremote._config import DEFAULTS
from gpuremote.transport import buffers
from gpuremote.transport.base import TransportError, Unavailable
from gpuremote.transport.frames import (ACK, FORGET, KIND_NAMES, RAW, REGISTER, SEGMENT, SEGMENT_ACK, SLOT, U64,
                                        U64X2, FrameSocket)
from gpuremote.transport.sockets import SocketEndpoint, SocketLink, connect, handshake

_MAX_SLOTS = 64
_MAX_SLOT_BYTES = 64 * 2**20


def supported() -> bool:
    return (hasattr(os, "memfd_create") and hasattr(fcntl, "F_SEAL_SHRINK") and hasattr(socket, "AF_UNIX")
            and hasattr(socket, "SCM_RIGHTS"))


def _sealed(fd: int) -> bool:
    try:
        return bool(fcntl.fcntl(fd, fcntl.F_GET_SEALS) & fcntl.F_SEAL_SHRINK)
    except OSError:
        return False        # not a memfd: it could shrink under the mapping


class _Ring:
    """One direction's slots."""

    __slots__ = ("view", "slots", "slot_bytes", "busy", "next")

    def __init__(self, view: numpy.ndarray, slots: int, slot_bytes: int):
        self.view, self.slots, self.slot_bytes = view, slots, slot_bytes
        self.busy = [False] * slots      # handed to the peer, not acknowledged yet
        self.next = 0

    def slot(self, i: int, n: int) -> numpy.ndarray:
        start = i * self.slot_bytes
        return self.view[start:start + n]


class _RingIO:
    """Sending through our ring and receiving from the peer's (shared by both ends)."""

    fs: FrameSocket
    tx: _Ring
    rx: _Ring

    def _ack(self, aux: int) -> None:
        if aux >= self.tx.slots:
            raise TransportError(f"acknowledgement of ring slot {aux}, which does not exist")
        self.tx.busy[aux] = False

    def _await_ack(self) -> None:
        kind, aux, length = self.fs.read_header()
        if kind != ACK or length:
            raise TransportError(f"expected a ring acknowledgement, got a {KIND_NAMES.get(kind, kind)} frame")
        self._ack(aux)

    def _put(self, slot: int, chunk: numpy.ndarray) -> None:
        """Place `chunk` in the peer's view of our ring slot (here: one copy into shared memory)."""
        numpy.copyto(self.tx.slot(slot, chunk.size), chunk)

    def _send_chunks(self, flat: numpy.ndarray) -> None:
        ring, fs = self.tx, self.fs
        total = flat.size
        off = 0
        while off < total:
            slot = ring.next
            while ring.busy[slot]:
                self._await_ack()
            n = min(ring.slot_bytes, total - off)
            self._put(slot, flat[off:off + n])
            ring.busy[slot] = True
            ring.next = (slot + 1) % ring.slots
            fs.send(SLOT, slot, U64.pack(n))
            off += n

    def _take_slot(self, aux: int, length: int, dest: numpy.ndarray | None, off: int) -> int:
        """A SLOT frame's chunk: copy it to dest[off:] (None: drop it) and acknowledge the slot."""
        if length != U64.size or aux >= self.rx.slots:
            raise TransportError(f"malformed SLOT frame (slot {aux}, {length} bytes)")
        n = U64.unpack(self.fs.read_payload(U64.size))[0]
        if n > self.rx.slot_bytes or (dest is not None and off + n > dest.size):
            raise TransportError(f"a ring chunk of {n:,} bytes does not fit (slot size {self.rx.slot_bytes:,}, "
                                 f"{0 if dest is None else dest.size - off:,} bytes left)")
        if dest is not None:
            numpy.copyto(dest[off:off + n], self.rx.slot(aux, n))
        self.fs.send(ACK, aux)
        return n

    def receive_fetch(self, chunks: int, out: numpy.ndarray) -> None:
        """Client side: the chunks of a fetch, from our receive ring (or raw frames) into `out`."""
        off = 0
        for _ in range(chunks):
            kind, aux, length = self.fs.read_header()
            while kind == ACK:
                self._control(kind, aux, length)
                kind, aux, length = self.fs.read_header()
            if kind == SLOT:
                off += self._take_slot(aux, length, out, off)
            elif kind == RAW and off + length <= out.size:
                self.fs.read_into(memoryview(out)[off:off + length])
                off += length
            elif kind == SEGMENT and length == U64X2.size:
                off += self._landed(aux, out)
            else:
                raise TransportError(f"fetch: unexpected {KIND_NAMES.get(kind, kind)} frame ({length:,} bytes)")
        if off != out.size:
            raise TransportError(f"fetch delivered {off:,} of {out.size:,} bytes")

    def _landed(self, segment: int, out: numpy.ndarray) -> int:
        """A SEGMENT frame: the daemon wrote the fetch into the segment `landing` named. Usually
        that memory is `out` itself; otherwise (a landing buffer of other shape) copy from it."""
        offset, n = U64X2.unpack(self.fs.read_payload(U64X2.size))
        land, self._land = self._land, None
        if land is None or land[:3] != (segment, offset, n) or n != out.size:
            raise TransportError(f"fetch: the daemon wrote {n:,} bytes to shared segment {segment} at {offset:,}, "
                                 "which is not where this fetch asked for them")
        src = numpy.frombuffer(land[3], numpy.uint8, count=n, offset=offset)
        if src.ctypes.data != out.ctypes.data:
            numpy.copyto(out, src)
        return n

    segments = types.MappingProxyType({})      # registered shared segments (shm endpoints have some)
    # (segment id, offset, bytes, mapping held) of the fetch asked to land (set by ShmLink.landing only:
    # any other end that meets a SEGMENT frame in a fetch refuses it)
    _land = None

    def receive_upload(self, chunks: int, dest: numpy.ndarray | None) -> int:
        """Daemon side: the chunks of an upload (ring slots, registered segments, raw frames) into `dest`."""
        off = 0
        for _ in range(chunks):
            kind, aux, length = self.fs.read_header()
            while kind in (ACK, REGISTER, FORGET):
                self.control(kind, aux, length)
                kind, aux, length = self.fs.read_header()
            if kind == SLOT:
                off += self._take_slot(aux, length, dest, off)
            elif kind == SEGMENT and length == U64X2.size:
                start, n = U64X2.unpack(self.fs.read_payload(U64X2.size))
                seg = self.segments.get(aux)
                if seg is None or start + n > seg.size or (dest is not None and off + n > dest.size):
                    raise TransportError(f"SEGMENT frame names bytes {start:,}+{n:,} of segment {aux}, which "
                                         "is not registered or not that large, or more than the upload holds")
                if dest is not None:
                    numpy.copyto(dest[off:off + n], seg[start:start + n])
                self.fs.send(ACK, SEGMENT_ACK)
                off += n
            elif kind == RAW and (dest is None or off + length <= dest.size):
                if dest is None:
                    self.fs.skip(length)
                else:
                    self.fs.read_into(memoryview(dest)[off:off + length])
                off += length
            else:
                raise TransportError(f"expected the bytes of an upload, got a {KIND_NAMES.get(kind, kind)} frame")
        return off

    def discard_upload(self, chunks: int) -> None:
        self.receive_upload(chunks, None)

    def fetch_chunks(self, nbytes: int) -> int:
        return -(-nbytes // self.tx.slot_bytes)


class ShmLink(_RingIO, SocketLink):
    """Client end."""

    name = "shm"

    def __init__(self, fs: FrameSocket, attached, region: mmap.mmap, slots: int, slot_bytes: int):
        super().__init__(fs, attached, "unix")
        self._region = region
        whole = numpy.frombuffer(region, numpy.uint8)
        half = slots * slot_bytes
        self.tx = _Ring(whole[:half], slots, slot_bytes)
        self.rx = _Ring(whole[half:2 * half], slots, slot_bytes)
        self._registered: dict[int, buffers.SharedRef] = {}
        self._segment = None          # (ref, offset, mapping held) of the upload being planned
        self._segment_acks = 0

    def _control(self, kind: int, aux: int, length: int) -> None:
        if kind == ACK and not length:
            if aux == SEGMENT_ACK:
                self._segment_acks += 1
            else:
                self._ack(aux)
            return
        super()._control(kind, aux, length)

    def _shared(self, arr: numpy.ndarray):
        """(ref, offset, mapping held) of the registered shared segment C-contiguous `arr` lies in,
        registering it with the daemon first if need be; None when it lies in none, or when one
        more segment would pass the daemon's per-session limits (it would end the session)."""
        found = buffers.find_shared(arr)
        held = found[0].hold() if found else None
        if held is None:
            return None
        ref, offset = found
        for sid, old in list(self._registered.items()):     # the daemon unmaps segments that are gone here
            if not old.alive():
                del self._registered[sid]
                self.fs.send(FORGET, sid)
        if ref.id not in self._registered:
            if len(self._registered) >= DEFAULTS.shm_max_segments or \
                    sum(r.size for r in self._registered.values()) + ref.size > DEFAULTS.shm_max_segment_bytes:
                return None
            self.fs.send(REGISTER, ref.id, U64.pack(ref.size), fds=[ref.fd])
            self._registered[ref.id] = ref
        return ref, offset, held

    def upload_chunks(self, flat: numpy.ndarray) -> int:
        self._segment = self._shared(flat)
        return -(-flat.size // self.tx.slot_bytes) if self._segment is None else 1

    def landing(self, into: numpy.ndarray) -> tuple[int, int] | None:
        """(segment, offset) for Fetch.land_segment/land_offset when the daemon can write a fetch
        straight into `into` (pinned memory: a registered shared segment), else None."""
        self._land = None
        if into.nbytes <= self.inline_bytes or not (into.flags.c_contiguous and into.flags.writeable):
            return None     # small fetches ride inside the reply
        shared = self._shared(into)
        if shared is None:
            return None
        ref, offset, held = shared
        self._land = (ref.id, offset, into.nbytes, held)
        return ref.id, offset

    def send_upload(self, flat: numpy.ndarray) -> None:
        segment, self._segment = self._segment, None
        if segment is None:
            self._send_chunks(flat)
            return
        ref, offset, held = segment
        want = self._segment_acks + 1
        self.fs.send(SEGMENT, ref.id, U64X2.pack(offset, flat.size))
        # Like cudaMemcpy from pinned memory, return once the daemon has read the bytes: the
        # application may then write the buffer again.
        while self._segment_acks < want:
            kind, aux, length = self.fs.read_header()
            self._control(kind, aux, length)
        del held


class ShmEndpoint(_RingIO, SocketEndpoint):
    """Daemon end: maps the client's rings and the segments it registers."""

    name = "shm"

    def __init__(self, fs: FrameSocket, request, fds: list[int]):
        super().__init__(fs)
        slots, slot_bytes = request.ring_slots, request.ring_slot_bytes
        if not 1 <= slots <= _MAX_SLOTS or not buffers.PAGE <= slot_bytes <= _MAX_SLOT_BYTES \
                or slot_bytes % buffers.PAGE or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            raise TransportError(f"an shm attach carries one memfd and a ring of 1-{_MAX_SLOTS} slots of whole pages "
                                 f"up to {_MAX_SLOT_BYTES >> 20} MiB; got {len(fds)} memfd(s) and {slots} x "
                                 f"{slot_bytes} bytes")
        fd = fds[0]
        half = slots * slot_bytes
        self._region = self._map(fd, 2 * half, "ring")
        whole = numpy.frombuffer(self._region, numpy.uint8)
        self.rx = _Ring(whole[:half], slots, slot_bytes)            # the client writes, we read
        self.tx = _Ring(whole[half:2 * half], slots, slot_bytes)    # we write, the client reads
        self.segments: dict[int, numpy.ndarray] = {}
        self.segment_bytes = 0

    @staticmethod
    def _map(fd: int, need: int, what: str) -> mmap.mmap:
        """Map a memfd the client passed: sealed against shrinking, at least `need` bytes. Closes fd."""
        try:
            if not _sealed(fd):
                raise TransportError(f"the {what} memfd is not sealed against shrinking (F_SEAL_SHRINK)")
            size = os.fstat(fd).st_size
            if size < need:
                raise TransportError(f"the {what} memfd holds {size:,} bytes, {need:,} are needed")
            return mmap.mmap(fd, need, flags=mmap.MAP_SHARED)
        finally:
            os.close(fd)

    def control(self, kind: int, aux: int, length: int) -> None:
        if kind == ACK and not length:
            self._ack(aux)
        elif kind == REGISTER and length == U64.size:
            size = U64.unpack(self.fs.read_payload(U64.size))[0]
            fds = self.fs.take_fds()
            if len(fds) != 1:
                for fd in fds:
                    os.close(fd)
                raise TransportError(f"a REGISTER frame carries exactly one memfd, got {len(fds)}")
            if aux in self.segments or len(self.segments) >= DEFAULTS.shm_max_segments or \
                    self.segment_bytes + size > DEFAULTS.shm_max_segment_bytes or size == 0:
                os.close(fds[0])
                raise TransportError(f"shared segment {aux} of {size:,} bytes cannot be registered (already known, or "
                                     f"past the limits of {DEFAULTS.shm_max_segments} segments and "
                                     f"{DEFAULTS.shm_max_segment_bytes:,} bytes per session)")
            self.segments[aux] = numpy.frombuffer(self._map(fds[0], size, "segment"), numpy.uint8)
            self.segment_bytes += size
        elif kind == FORGET and not length:
            seg = self.segments.pop(aux, None)
            if seg is not None:
                self.segment_bytes -= seg.size
        else:
            super().control(kind, aux, length)

    def landing(self, segment: int, offset: int, nbytes: int) -> numpy.ndarray:
        seg = self.segments.get(segment)
        if seg is None or offset + nbytes > seg.size:
            raise TransportError(f"a fetch asks for its {nbytes:,} bytes at offset {offset:,} of shared segment "
                                 f"{segment}, which is {'not registered' if seg is None else f'{seg.size:,} bytes'}")
        return seg[offset:offset + nbytes]

    def send_fetch(self, flat: numpy.ndarray, landed: tuple[int, int, int] | None = None) -> None:
        """A fetch's bytes through the ring, or, when they were written into the client's segment
        already (`landed`: segment, offset, bytes), the SEGMENT frame that says so."""
        if landed is None:
            self._send_chunks(flat)
            return
        segment, offset, nbytes = landed
        self.fs.send(SEGMENT, segment, U64X2.pack(offset, nbytes))

    def close(self) -> None:
        self.segments.clear()
        self.rx = self.tx = None
        self._region = None


def open_link(address: str, data_plane, request) -> ShmLink:
    """Attach over the Unix socket with a fresh ring memfd (client side)."""
    if not supported():
        raise Unavailable("shared memory needs Linux memfds and Unix sockets")
    if not data_plane.unix_path:
        raise Unavailable("the daemon is not on this host (no Unix socket offered)")
    slots, slot_bytes = DEFAULTS.ring_slots, -(-DEFAULTS.ring_slot_bytes // buffers.PAGE) * buffers.PAGE
    size = 2 * slots * slot_bytes
    fd = os.memfd_create("gpuremote-ring", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
        region = mmap.mmap(fd, size, flags=mmap.MAP_SHARED)
        sock = connect("unix", address, data_plane.unix_path, 0, DEFAULTS.attach_timeout_s)
        fs = FrameSocket(sock, DEFAULTS.socket_read_bytes)
        try:
            request.transport = "shm"
            request.ring_slots, request.ring_slot_bytes = slots, slot_bytes
            attached = handshake(fs, request, fds=[fd])
            sock.settimeout(None)
        except BaseException:
            fs.close()
            raise
    finally:
        os.close(fd)
    return ShmLink(fs, attached, region, slots, slot_bytes)
