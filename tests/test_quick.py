"""QUICK frames: sync points with nothing queued on the daemon's side travel as fixed fields, not
op batches (gpuremote/transport/frames.py). They must give exactly what the op-batch path gives
(values, errors with the line that caused them, notices), and the daemon must refuse malformed ones
without harm to anyone else.
"""

from __future__ import annotations

import socket

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gpuremote
from gpuremote.transport import frames
from gpuremote.transport.base import TransportError
from gpuremote.wire import pb

from conftest import DaemonProcess, backend_args
from test_transport_socket import _attach_raw, _raw_open, _used
from transport_util import connected, settle

TRANSPORTS = ["grpc", "tcp", "unix", "shm"]    # grpc: the op-batch path the others must match


@pytest.fixture(scope="module")
def daemon():
    d = DaemonProcess(*backend_args(devices=1, memory="1GiB"))
    yield d
    d.stop()


def _samples(rng, inline: int) -> list[np.ndarray]:
    return [np.array(2.5, np.float32), np.array([True, False, True]), rng.integers(-9, 9, (3, 4, 5)).astype(np.int16),
            (rng.standard_normal((2, 2)) + 1j).astype(np.complex128), np.zeros((0, 7)),
            rng.standard_normal(inline // 8),            # exactly the inline size: still QUICK
            rng.standard_normal(inline // 8 + 1)]        # one element more: the op-batch path


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_small_reads_and_syncs_give_what_the_op_path_gives(daemon, transport, monkeypatch):
    from gpuremote.transport import sockets
    quiet = []      # the QUIET answers the client read: every small read and sync on a data plane
    parse = sockets.parse_quiet
    monkeypatch.setattr(sockets, "parse_quiet", lambda *a, **k: quiet.append(a[0]) or parse(*a, **k))
    rng = np.random.default_rng(5)
    with connected(daemon.address, transport) as (cp, session):
        inline = session._link.inline_bytes if session._link is not None else 16 << 10
        for host in _samples(rng, inline):
            dev = cp.asarray(host)
            before = gpuremote.stats()["round_trips"]
            got = dev.get()
            assert gpuremote.stats()["round_trips"] == before + 1
            assert got.dtype == host.dtype and got.shape == host.shape and got.flags.writeable
            np.testing.assert_array_equal(got, host)
            if host.size == 1:
                assert dev.item() == host.item() and type(dev.item()) is type(host.item())
                assert float(dev.real if host.dtype.kind == "c" else dev) == float(host.real)
        grid = cp.asarray(np.arange(12.0).reshape(3, 4))
        np.testing.assert_array_equal(grid.T.get(), np.arange(12.0).reshape(3, 4).T)     # not contiguous:
        np.testing.assert_array_equal(grid[:, ::2].get(), np.arange(12.0).reshape(3, 4)[:, ::2])   # the op path
        dev.get()[0] = 7.0                      # a copy: the device array is untouched
        assert dev.get()[0] != 7.0
        before = gpuremote.stats()["round_trips"]
        cp.cuda.Device().synchronize()
        stream = cp.cuda.Stream()
        with stream:
            y = dev * 2
        stream.synchronize()
        assert gpuremote.stats()["round_trips"] == before + 2
        np.testing.assert_array_equal(y.get(), host * 2)
        # the 0-d array: get(), item() twice, float(); five more small arrays: get(); two syncs. The
        # array past the inline size (dev, and y) never; the two views ask QUICK and get the op's reply.
        assert len(quiet) == (0 if transport == "grpc" else 4 + 5 + 2), quiet


@pytest.mark.parametrize("transport", ["tcp", "unix", "shm"])
def test_errors_reach_the_quick_sync_points_with_their_line(daemon, transport):
    baseline = _used(daemon)
    with connected(daemon.address, transport) as (cp, _):
        a = cp.asarray(np.zeros((3, 3)))
        inv = cp.linalg.inv(a)                  # fails on the daemon: reported at the next sync point
        with pytest.raises(np.linalg.LinAlgError, match="[Ss]ingular") as info:
            cp.cuda.Device().synchronize()
        assert "linalg.inv issued at" in str(info.value) and "test_quick.py" in str(info.value)
        with pytest.raises(np.linalg.LinAlgError):
            inv.get()                           # the poisoned result fails its read the same way
        with pytest.raises(np.linalg.LinAlgError):
            float(inv[0, 0])
        assert cp.asarray(np.ones(3)).get().sum() == 3       # and the session goes on
    settle(daemon.info, baseline)


def test_quiet_payloads_round_trip_and_malformed_ones_are_refused():
    for host in (np.float64(3.0) * np.ones(()), np.arange(12, dtype=np.uint8).reshape(3, 4), np.zeros((0,), bool)):
        seq, got = frames.parse_quiet(host.ndim, memoryview(frames.quiet_payload(9, host)), fetch=True)
        assert seq == 9 and got.dtype == host.dtype and got.shape == host.shape
        np.testing.assert_array_equal(got, host)
    assert frames.parse_quiet(0, frames.quiet_payload(4), fetch=False) == (4, None)
    good = frames.quiet_payload(1, np.arange(4, dtype=np.int32))
    bad = [
        (1, good[:-1], True),                                    # a byte short
        (1, good + b"x", True),                                  # a byte over
        (2, good, True),                                         # claims a second extent
        (0, good, False),                                        # a sync's answer with a body
        (1, good[:8], True),                                     # no dtype
        (65, good + bytes(8 * 64), True),                        # rank past the limit
        (1, good[:8] + b"|O8\0\0\0\0\0" + good[16:], True),      # object dtype
        (1, good[:8] + b"\xff" * 8 + good[16:], True),           # not a dtype at all
        (1, good[:16] + (2**62).to_bytes(8, "little") + good[24:], True),   # extent past any memory
        (2, good[:16] + bytes(8) + (2**63 + 5).to_bytes(8, "little"), True),  # empty, one extent past NumPy's
    ]
    for aux, payload, fetch in bad:
        with pytest.raises(TransportError):
            frames.parse_quiet(aux, memoryview(payload), fetch=fetch)
    for code, payload in ((3, bytes(32)), (frames.QUICK_SYNC, bytes(31)),
                          (frames.QUICK_FETCH, bytes(32 + frames.QUICK_SITE_MAX + 1))):
        with pytest.raises(TransportError):
            frames.Quick(code, payload)
    q = frames.Quick(frames.QUICK_FETCH, frames.quick_payload(5, 2, 0, 0, 77, "x.py:3 \udcff" + "é" * 2000))
    assert (q.seq, q.stream, q.handle) == (5, 2, 77) and q.site.startswith("x.py:3")


def _quick(sock: socket.socket, code: int, seq: int, device: int = 0, handle: int = 0, site: str = "raw:1",
           payload: bytes | None = None) -> tuple[int, int, bytes]:
    body = frames.quick_payload(seq, 0, device, 0, handle, site) if payload is None else payload
    sock.sendall(frames.HEADER.pack(frames.QUICK, code, len(body)) + body)
    fs = frames.FrameSocket(sock, 1 << 20)
    kind, aux, data = fs.read_frame(1 << 20)
    return kind, aux, bytes(data)


def test_hostile_quick_frames(daemon):
    """Unknown handles and devices get error replies and the connection serves on; malformed frames
    end that connection alone, with an ERROR frame; the daemon and its other sessions are unharmed."""
    baseline = _used(daemon)
    bystander = gpuremote.connect(daemon.address, transport="unix")
    try:
        import gpuremote.cupy as cp
        kept = cp.asarray(np.arange(5.0))
        channel, outbox, responses, opened = _raw_open(daemon.address)
        try:
            sock, (kind, reply) = _attach_raw(opened, opened.data_plane.attach_token)
            assert kind == frames.ATTACHED and not reply.error
            sock.settimeout(10)
            kind, _, data = _quick(sock, frames.QUICK_SYNC, 1)
            assert kind == frames.QUIET and frames.parse_quiet(0, data, fetch=False) == (1, None)
            for seq, device, handle, code in ((2, 0, 12345, frames.QUICK_FETCH), (3, 7, 0, frames.QUICK_SYNC),
                                              (4, 2**32 - 1, 1, frames.QUICK_FETCH), (5, 0, 2**64 - 1, frames.QUICK_FETCH)):
                kind, _, data = _quick(sock, code, seq, device=device, handle=handle, site="hostile.py:9")
                assert kind == frames.MSG
                r = pb.ServerMessage.FromString(data).reply
                assert r.seq == seq and r.WhichOneof("outcome") == "error", r
                assert r.error.site == "hostile.py:9"
            # a malformed frame (here: no such op) ends this connection and its session
            body = frames.quick_payload(6, 0, 0, 0, 0, "")
            sock.sendall(frames.HEADER.pack(frames.QUICK, 9, len(body)) + body)
            rest = b""
            while True:
                chunk = sock.recv(1 << 16)
                if not chunk:
                    break
                rest += chunk
            assert frames.HEADER.unpack_from(rest)[0] == frames.ERROR and b"QUICK" in rest
            sock.close()
        finally:
            outbox.put(None)
            channel.close()
        for body in (b"\0" * 7, b"\0" * (1 << 20)):          # too short; far too long
            channel, outbox, responses, opened = _raw_open(daemon.address)
            try:
                sock, (kind, reply) = _attach_raw(opened, opened.data_plane.attach_token)
                sock.settimeout(10)
                try:
                    sock.sendall(frames.HEADER.pack(frames.QUICK, frames.QUICK_SYNC, len(body)) + body)
                except OSError:
                    pass        # the daemon may close before the whole oversized frame is sent
                data = b""
                try:
                    while True:
                        chunk = sock.recv(1 << 16)
                        if not chunk:
                            break
                        data += chunk
                except OSError:
                    pass
                assert frames.HEADER.unpack_from(data)[0] == frames.ERROR
                sock.close()
            finally:
                outbox.put(None)
                channel.close()
        np.testing.assert_array_equal(kept.get(), np.arange(5.0))     # the bystander's session is intact
    finally:
        gpuremote.disconnect()
        del bystander
    settle(daemon.info, baseline)


_U64 = st.integers(0, 2**64 - 1)
_U32 = st.integers(0, 2**32 - 1)
_LAID_OUT = st.builds(frames.quick_payload, _U64, _U64, st.one_of(st.just(0), _U32), _U32,
                      st.one_of(st.integers(0, 8), _U64), st.text(max_size=40))


@settings(max_examples=60, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(code=st.one_of(st.sampled_from([frames.QUICK_SYNC, frames.QUICK_FETCH]), _U32),
       payload=st.one_of(_LAID_OUT, st.binary(max_size=frames.QUICK_SITE_MAX + 64)))
def test_arbitrary_quick_frames(daemon, code, payload):
    """Whatever a QUICK frame holds, the daemon answers it (QUIET, a reply) or ends that connection with
    an ERROR frame; a connection it answered still serves."""
    channel, outbox, responses, opened = _raw_open(daemon.address)
    try:
        sock, (kind, reply) = _attach_raw(opened, opened.data_plane.attach_token)
        sock.settimeout(10)
        kind, _, data = _quick(sock, code, 1, payload=payload)
        assert kind in (frames.QUIET, frames.MSG, frames.ERROR), kind
        if kind != frames.ERROR:
            kind, _, data = _quick(sock, frames.QUICK_SYNC, 2)
            assert kind == frames.QUIET and frames.parse_quiet(0, data, fetch=False)[0] == 2
        sock.close()
    finally:
        outbox.put(None)
        channel.close()
    assert daemon.info().devices


@pytest.mark.parametrize("transport", ["unix", "shm"])
def test_threads_share_a_session_through_quick_round_trips(daemon, transport):
    """Several threads reading and syncing on one session at once: each gets its own answers."""
    import threading
    with connected(daemon.address, transport) as (cp, _):
        arrays = [cp.asarray(np.full(16, float(i))) for i in range(4)]
        failures: list = []

        def work(i: int) -> None:
            try:
                for k in range(150):
                    if k % 3 == 0:
                        cp.cuda.Device().synchronize()
                    got = arrays[i].get()
                    if not (got == float(i)).all() or float(arrays[i][k % 16]) != float(i):
                        failures.append((i, k, got[:3]))
                        return
            except Exception as exc:        # reported below, with the thread that met it
                failures.append((i, repr(exc)))

        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in threads), "a thread is stuck in a round trip"
        assert not failures, failures
