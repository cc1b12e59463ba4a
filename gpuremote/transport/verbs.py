"""The RDMA (verbs) transport: ops over a TCP socket, bulk bytes by RDMA WRITE (pyverbs).

Each end registers a receive ring (`ring_slots` x `ring_slot_bytes`) and a staging ring of
the same shape, and creates an RC queue pair. The connection parameters (QP number, LID, GID,
PSN, MTU, ring address and rkey) travel in the Attach/Attached frames of the TCP data-plane
connection (gpuremote.v1.VerbsEndpoint), after which both QPs are moved INIT -> RTR -> RTS.
Bulk bytes then follow the shared-memory ring protocol of shm.py exactly (SLOT / ACK frames on
the TCP connection, lazy acknowledgements, pipelined slots); only placing a chunk differs: it is
copied into the local staging slot and written by RDMA WRITE into the peer's receive slot, and
the SLOT frame is sent once the write has completed.

Everything but the verbs calls (`_Rdma`) is shared with the tested shm and socket paths; the
parameter exchange (`describe`/`peer`) is pure and tested on its own. Where pyverbs or an RDMA
device is missing, `available()` says why, the daemon does not advertise verbs, and a client that
asks for it falls back (with a warning) to what `auto` would take.
"""

from __future__ import annotations

import ctypes
import random

import numpy

from gpuremote._config import DEFAULTS
from gpuremote.transport.base import TransportError, Unavailable
from gpuremote.transport.frames import FrameSocket
from gpuremote.transport.shm import _Ring, _RingIO
from gpuremote.transport.sockets import SocketEndpoint, SocketLink, connect, handshake
from gpuremote.wire import pb

_MTUS = {256: 1, 512: 2, 1024: 3, 2048: 4, 4096: 5}     # bytes -> IBV_MTU_* enum value
_PORT = 1


def available() -> tuple[bool, str]:
    """(True, device name) when pyverbs imports and an RDMA device is present; else (False, why)."""
    try:
        import pyverbs.device as device
    except ImportError as exc:
        return False, f"pyverbs is not installed ({exc}); pip install 'gpuremote[rdma]' where rdma-core is"
    try:
        devices = device.get_device_list()
    except Exception as exc:       # pyverbs raises its own PyverbsError types
        return False, f"cannot list RDMA devices: {exc}"
    if not devices:
        return False, "no RDMA device on this host"
    name = devices[0].name
    return True, name.decode() if isinstance(name, bytes) else str(name)


# -- the parameter exchange (pure; tested without a device) -----------------------------------------
def describe(qp_num: int, lid: int, gid: bytes, psn: int, mtu: int, ring_addr: int, ring_rkey: int,
             ring_bytes: int) -> pb.VerbsEndpoint:
    return pb.VerbsEndpoint(qp_num=qp_num, lid=lid, gid=gid, psn=psn, mtu=mtu, ring_addr=ring_addr,
                            ring_rkey=ring_rkey, ring_bytes=ring_bytes)


def peer(msg: pb.VerbsEndpoint, ring_bytes: int) -> pb.VerbsEndpoint:
    """Check the peer's parameters (TransportError naming the bad one) and return them."""
    if not 0 < msg.qp_num < 1 << 24:
        raise TransportError(f"verbs peer: queue pair number {msg.qp_num} is out of range")
    if len(msg.gid) != 16:
        raise TransportError(f"verbs peer: a GID is 16 bytes, got {len(msg.gid)}")
    if msg.psn >= 1 << 24:
        raise TransportError(f"verbs peer: packet sequence number {msg.psn} is out of range")
    if msg.mtu not in _MTUS:
        raise TransportError(f"verbs peer: MTU {msg.mtu} is not one of {sorted(_MTUS)}")
    if msg.lid >= 1 << 16:
        raise TransportError(f"verbs peer: LID {msg.lid} is out of range")
    if msg.ring_bytes != ring_bytes or not msg.ring_addr or not msg.ring_rkey:
        raise TransportError(f"verbs peer: receive ring of {msg.ring_bytes} bytes at {msg.ring_addr:#x} "
                             f"(rkey {msg.ring_rkey}); {ring_bytes} bytes were agreed")
    return msg


# -- the verbs calls ----------------------------------------------------------------------------------
class _Rdma:
    """Device context, protection domain, completion queue, RC queue pair and two registered rings."""

    def __init__(self, ring_bytes: int):
        ok, why = available()
        if not ok:
            raise Unavailable(why)
        import pyverbs.device as device
        import pyverbs.enums as e
        from pyverbs.cq import CQ
        from pyverbs.mr import MR
        from pyverbs.pd import PD
        from pyverbs.qp import QP, QPCap, QPInitAttr
        self._e = e
        self.ctx = device.Context(name=why)
        port = self.ctx.query_port(_PORT)
        self.lid = port.lid
        self.mtu = min(256 << (int(port.active_mtu) - 1), 4096)
        self.gid_index = DEFAULTS.verbs_gid_index
        self.gid = bytes.fromhex(str(self.ctx.query_gid(_PORT, self.gid_index)).replace(":", ""))
        self.pd = PD(self.ctx)
        self.cq = CQ(self.ctx, 2 * DEFAULTS.ring_slots + 4)
        access = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
        self.rx_mr = MR(self.pd, ring_bytes, access)
        self.tx_mr = MR(self.pd, ring_bytes, e.IBV_ACCESS_LOCAL_WRITE)
        cap = QPCap(max_send_wr=2 * DEFAULTS.ring_slots, max_recv_wr=1, max_send_sge=1, max_recv_sge=1)
        self.qp = QP(self.pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap))
        self.psn = random.getrandbits(24)
        self.ring_bytes = ring_bytes
        self.remote: pb.VerbsEndpoint | None = None

    def view(self, mr) -> numpy.ndarray:
        return numpy.frombuffer((ctypes.c_char * self.ring_bytes).from_address(mr.buf), numpy.uint8)

    def local(self) -> pb.VerbsEndpoint:
        return describe(self.qp.qp_num, self.lid, self.gid, self.psn, self.mtu, self.rx_mr.buf, self.rx_mr.rkey,
                        self.ring_bytes)

    def connect(self, remote: pb.VerbsEndpoint) -> None:
        from pyverbs.addr import GID, AHAttr, GlobalRoute
        from pyverbs.qp import QPAttr
        e = self._e
        self.remote = remote
        attr = QPAttr(port_num=_PORT)
        attr.qp_access_flags = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
        self.qp.to_init(attr)
        attr.dest_qp_num = remote.qp_num
        attr.rq_psn = remote.psn
        attr.path_mtu = _MTUS[min(self.mtu, remote.mtu)]
        attr.max_dest_rd_atomic = 1
        attr.min_rnr_timer = 12
        gid = GID(":".join(remote.gid.hex()[i:i + 4] for i in range(0, 32, 4)))
        attr.ah_attr = AHAttr(gr=GlobalRoute(dgid=gid, sgid_index=self.gid_index), is_global=1, dlid=remote.lid,
                              port_num=_PORT)
        self.qp.to_rtr(attr)
        attr.sq_psn = self.psn
        attr.timeout, attr.retry_cnt, attr.rnr_retry, attr.max_rd_atomic = 14, 7, 7, 1
        self.qp.to_rts(attr)

    def write(self, offset: int, n: int) -> None:
        """RDMA WRITE tx_mr[offset:offset+n] to the peer's receive ring at the same offset; wait for it."""
        from pyverbs.wr import SGE, SendWR
        e = self._e
        wr = SendWR(wr_id=offset, opcode=e.IBV_WR_RDMA_WRITE, num_sge=1,
                    sg=[SGE(self.tx_mr.buf + offset, n, self.tx_mr.lkey)], send_flags=e.IBV_SEND_SIGNALED)
        wr.set_wr_rdma(self.remote.ring_rkey, self.remote.ring_addr + offset)
        self.qp.post_send(wr)
        for _ in range(10**8):                    # bounded busy poll: a completion comes within microseconds
            polled, wcs = self.cq.poll()
            if polled:
                if wcs[0].status != e.IBV_WC_SUCCESS:
                    raise TransportError(f"RDMA write failed (work completion status {wcs[0].status})")
                return
        raise TransportError("RDMA write did not complete")

    def close(self) -> None:
        for name in ("qp", "rx_mr", "tx_mr", "cq", "pd", "ctx"):
            obj = getattr(self, name, None)
            if obj is not None:
                try:
                    obj.close()
                except Exception:
                    pass


class _VerbsRing(_RingIO):
    """The shm ring protocol, with chunks placed by RDMA WRITE into the peer's receive ring."""

    rdma: _Rdma

    def _setup_rings(self, rdma: _Rdma, slots: int, slot_bytes: int) -> None:
        self.rdma = rdma
        self.tx = _Ring(rdma.view(rdma.tx_mr), slots, slot_bytes)     # staging: copied here, then written
        self.rx = _Ring(rdma.view(rdma.rx_mr), slots, slot_bytes)     # the peer writes here

    def _put(self, slot: int, chunk: numpy.ndarray) -> None:
        numpy.copyto(self.tx.slot(slot, chunk.size), chunk)
        self.rdma.write(slot * self.tx.slot_bytes, chunk.size)


class VerbsLink(_VerbsRing, SocketLink):
    name = "verbs"

    def __init__(self, fs: FrameSocket, attached: pb.Attached, rdma: _Rdma, slots: int, slot_bytes: int):
        super().__init__(fs, attached, "tcp")
        self._setup_rings(rdma, slots, slot_bytes)

    def _control(self, kind: int, aux: int, length: int) -> None:
        from gpuremote.transport.frames import ACK
        if kind == ACK and not length:
            self._ack(aux)
            return
        super()._control(kind, aux, length)

    def upload_chunks(self, flat: numpy.ndarray) -> int:
        return -(-flat.size // self.tx.slot_bytes)

    def send_upload(self, flat: numpy.ndarray) -> None:
        self._send_chunks(flat)

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.rdma.close()

    def abandon(self) -> None:
        try:
            super().abandon()
        finally:
            self.rdma.close()


class VerbsEndpoint(_VerbsRing, SocketEndpoint):
    name = "verbs"

    def __init__(self, fs: FrameSocket, request: pb.Attach):
        super().__init__(fs)
        slots, slot_bytes = request.ring_slots, request.ring_slot_bytes
        if not 1 <= slots <= 64 or not 4096 <= slot_bytes <= 64 * 2**20:
            raise TransportError(f"verbs ring of {slots} x {slot_bytes} bytes is outside the limits")
        remote = peer(request.verbs, slots * slot_bytes)
        rdma = _Rdma(slots * slot_bytes)
        try:
            rdma.connect(remote)
        except BaseException:
            rdma.close()
            raise
        self._setup_rings(rdma, slots, slot_bytes)

    def attached(self) -> pb.Attached:
        reply = super().attached()
        reply.verbs.CopyFrom(self.rdma.local())
        return reply

    def control(self, kind: int, aux: int, length: int) -> None:
        from gpuremote.transport.frames import ACK
        if kind == ACK and not length:
            self._ack(aux)
            return
        super().control(kind, aux, length)

    def close(self) -> None:
        self.rdma.close()


class DaemonVerbs:
    """The daemon's verbs support: present only where a device is."""

    @classmethod
    def create(cls) -> "DaemonVerbs":
        ok, why = available()
        if not ok:
            raise Unavailable(why)
        return cls()

    def endpoint(self, fs: FrameSocket, request: pb.Attach) -> VerbsEndpoint:
        return VerbsEndpoint(fs, request)

    def close(self) -> None:
        pass


def open_link(address: str, data_plane, request: pb.Attach) -> VerbsLink:
    """Client side: register rings, create the QP, exchange parameters over TCP, connect."""
    if "verbs" not in data_plane.transports:
        raise Unavailable("the daemon offers no verbs transport")
    slots, slot_bytes = DEFAULTS.ring_slots, DEFAULTS.ring_slot_bytes
    rdma = _Rdma(slots * slot_bytes)         # Unavailable without pyverbs or a device
    try:
        sock = connect("tcp", address, "", data_plane.tcp_port, DEFAULTS.attach_timeout_s)
        fs = FrameSocket(sock, DEFAULTS.socket_read_bytes)
        try:
            request.transport = "verbs"
            request.ring_slots, request.ring_slot_bytes = slots, slot_bytes
            request.verbs.CopyFrom(rdma.local())
            attached = handshake(fs, request)
            rdma.connect(peer(attached.verbs, slots * slot_bytes))
            sock.settimeout(None)
        except BaseException:
            fs.close()
            raise
        return VerbsLink(fs, attached, rdma, slots, slot_bytes)
    except BaseException:
        rdma.close()
        raise
