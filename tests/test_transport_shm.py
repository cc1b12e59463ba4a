"""The shared-memory transport (same host) against a real daemon process: exact bytes, pinned
buffers read in place, fallbacks when shm cannot be had, hostile memfds, and clients killed
mid-transfer."""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import socket
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

from gpuremote._config import DEFAULTS
from gpuremote.transport import buffers, frames, shm
from gpuremote.wire import pb

from conftest import DaemonProcess, backend_args
from test_transport_socket import _raw_open
from transport_util import check_exact_bytes, connected, kill_mid_transfer, random_array, same_bytes, settle

pytestmark = pytest.mark.skipif(not shm.supported(), reason="shared memory needs Linux memfds and Unix sockets")


@pytest.fixture(scope="module")
def daemon():
    d = DaemonProcess(*backend_args(devices=1, memory="1GiB"))
    yield d
    d.stop()


def _used(d) -> list[int]:
    return [dev.memory_used for dev in d.info().devices]


def test_exact_bytes_every_dtype_and_size(daemon):
    check_exact_bytes(daemon, "shm", "shm")


def test_auto_takes_shm_on_the_same_host(daemon):
    with connected(daemon.address) as (cp, session):
        assert session.transport == "shm"
        assert int(cp.arange(10).sum()) == 45


def test_pinned_upload_is_read_in_place(daemon):
    import gpuremote.cupyx as cx
    with connected(daemon.address, "shm") as (cp, session):
        link = session._link
        for dtype, shape in ((np.float32, (1000, 1000)), (np.uint8, (12_345_679,)), (np.complex128, (3, 5, 7))):
            host = cx.empty_pinned(shape, dtype)
            host[...] = np.random.default_rng(1).random(shape).astype(dtype) if dtype != np.uint8 else 7
            ref, _ = buffers.find_shared(host)
            dev = cp.asarray(host)                      # one SEGMENT frame; returns once the daemon read it
            assert (ref.id in link._registered) == (host.nbytes > link.inline_bytes)
            expect = host.copy()
            host[...] = 0                                # the application may reuse its buffer at once
            np.testing.assert_array_equal(dev.get(), expect)
            out = cx.empty_pinned(shape, dtype)
            dev.get(out=out)
            np.testing.assert_array_equal(out, expect)
        # A view inside a pinned buffer (offset, partial) and a Fortran-ordered pinned array
        host = cx.empty_pinned((4096,), np.int64)
        host[:] = np.arange(4096)
        np.testing.assert_array_equal(cp.asarray(host[1000:3000]).get(), np.arange(1000, 3000))
        f = cx.zeros_pinned((300, 200), np.float64, order="F")
        f[:] = np.arange(60_000.0).reshape(300, 200)
        np.testing.assert_array_equal(cp.asarray(f).get(), np.arange(60_000.0).reshape(300, 200))


def test_segments_gone_on_the_client_are_forgotten(daemon):
    import gpuremote.cupyx as cx
    pinned = buffers.pool("pinned")
    saved = pinned.max_bytes
    pinned.max_bytes = 0                  # nothing pooled: each array's segment dies with it
    try:
        with connected(daemon.address, "shm") as (cp, session):
            link = session._link
            a = cx.empty_pinned(1 << 20, np.uint8)
            a[:] = 5
            x = cp.asarray(a)
            first = buffers.find_shared(a)[0].id
            assert first in link._registered
            del a
            b = cx.empty_pinned(1 << 20, np.uint8)
            b[:] = 6
            y = cp.asarray(b)                       # FORGET for the first, REGISTER for this one
            assert first not in link._registered and len(link._registered) == 1
            assert int(x.sum()) == 5 << 20 and int(y.sum()) == 6 << 20
    finally:
        pinned.max_bytes = saved


# -- fallbacks ----------------------------------------------------------------------------------

def test_shm_off_on_the_daemon_falls_back_to_the_unix_socket():
    d = DaemonProcess(*backend_args(devices=1, memory="64MiB"), env={"GPUREMOTE_SHM": "0"})
    try:
        with connected(d.address) as (cp, session):                # auto: quietly the socket
            assert session.transport == "socket" and session._link.via == "unix"
            host = np.arange(1_000_000, dtype=np.float32)
            np.testing.assert_array_equal(cp.asarray(host).get(), host)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with connected(d.address, "shm") as (cp, session):
                assert session.transport == "socket"
                assert int(cp.arange(4).sum()) == 6
        assert any("transport 'shm'" in str(w.message) and "using socket" in str(w.message) for w in caught)
        settle(d.info, None)
    finally:
        d.stop()


def test_shm_refused_by_the_daemon_falls_back(daemon):
    """The daemon refuses this client's ring (too many slots): the attach fails cleanly and the
    session goes on over the Unix socket, with a warning naming why."""
    code = textwrap.dedent("""
        import sys, warnings, numpy as np, gpuremote, gpuremote.cupy as cp
        warnings.simplefilter("always")
        with warnings.catch_warnings(record=True) as caught:
            s = gpuremote.connect(sys.argv[1])
        host = np.arange(3_000_000, dtype=np.int16)
        assert np.array_equal(cp.asarray(host).get(), host)
        print(s.transport, s._link.via)
        print(*[w.message for w in caught])
    """)
    out = subprocess.run([sys.executable, "-c", code, daemon.address], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, GPUREMOTE_TRANSPORT="shm", GPUREMOTE_RING_SLOTS="1000"))
    assert out.returncode == 0, out.stderr
    first, second = out.stdout.splitlines()[:2]
    assert first == "socket unix"
    assert "transport 'shm'" in second and "1000 x" in second and "using socket" in second
    settle(daemon.info, None)


# -- hostile memfds ------------------------------------------------------------------------------

def _memfd(size: int, seal: bool) -> int:
    fd = os.memfd_create("hostile", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if seal:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
    return fd


def _attach_shm(opened, fds: list[int], slots=2, slot_bytes=1 << 16):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect("\0" + opened.data_plane.unix_path[1:])
    fs = frames.FrameSocket(sock, 1 << 16)
    req = pb.Attach(session_id=opened.session_id, attach_token=opened.data_plane.attach_token, transport="shm",
                    ring_slots=slots, ring_slot_bytes=slot_bytes)
    fs.send(frames.ATTACH, 0, req.SerializeToString(), fds=fds)
    kind, _, payload = fs.read_frame(1 << 16)
    return fs, pb.Attached.FromString(payload)


@contextlib.contextmanager
def _raw_session(d):
    """(SessionOpened, memfd list) of a raw gRPC session on daemon `d` for hand-made frames; at the
    end the memfds are closed, the session too, and the daemon must be back to what it held."""
    baseline = _used(d)
    channel, outbox, responses, opened = _raw_open(d.address)
    fds: list[int] = []
    try:
        yield opened, fds
    finally:
        for fd in fds:
            os.close(fd)
        outbox.put(None)
        channel.close()
    settle(d.info, baseline)


def _frames_until_closed(fs) -> list[tuple[int, bytes]]:
    """(kind, payload) of every frame the daemon sends until it closes the connection."""
    fs.sock.settimeout(10)
    got = []
    try:
        while True:
            kind, aux, length = fs.read_header()
            got.append((kind, bytes(fs.read_payload(length)) if length else b""))
    except (EOFError, OSError):
        pass
    fs.close()
    return got


@pytest.mark.parametrize("case", ["unsealed", "too_small", "two_fds", "no_fd"])
def test_bad_ring_memfds_are_refused(daemon, case):
    with _raw_session(daemon) as (opened, fds):
        assert "shm" in opened.data_plane.transports and opened.data_plane.unix_path
        need = 2 * 2 * (1 << 16)
        fds += {"unsealed": [_memfd(need, False)], "too_small": [_memfd(need - 4096, True)],
                "two_fds": [_memfd(need, True), _memfd(need, True)], "no_fd": []}[case]
        fs, reply = _attach_shm(opened, list(fds))
        assert reply.error, case
        fs.close()
        # the token is still good: a proper ring attaches
        good = _memfd(need, True)
        fds.append(good)
        fs, reply = _attach_shm(opened, [good])
        assert not reply.error and reply.transport == "shm"
        fs.close()


@pytest.mark.parametrize("case", ["unsealed_segment", "segment_out_of_range", "unknown_segment", "bad_slot"])
def test_hostile_bulk_frames_end_the_session(daemon, case):
    with _raw_session(daemon) as (opened, fds):
        ring = _memfd(4 << 16, True)
        fds.append(ring)
        fs, reply = _attach_shm(opened, [ring])
        assert not reply.error
        seg = _memfd(1 << 16, case != "unsealed_segment")
        fds.append(seg)
        msg = pb.ClientMessage()
        op = msg.batch.ops.add(seq=1, reply=True)
        op.upload.handle = 1
        op.upload.meta.dtype = "|u1"
        op.upload.meta.shape.append(1 << 16)
        op.upload.chunks = 1
        # The daemon may end the connection at the first hostile frame, before the rest is sent.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            if case != "unknown_segment":
                fs.send(frames.REGISTER, 9, frames.U64.pack(1 << 16), fds=[seg])
            fs.send(frames.MSG, 0, msg.SerializeToString())
            if case == "bad_slot":
                fs.send(frames.SLOT, 77, frames.U64.pack(10))
            else:
                fs.send(frames.SEGMENT, 9, frames.U64X2.pack(1 << 15 if case == "segment_out_of_range" else 0,
                                                             1 << 16))
        kinds = [kind for kind, _ in _frames_until_closed(fs)]
        assert frames.ERROR in kinds and frames.MSG not in kinds, kinds


@pytest.mark.parametrize("direction", ["upload", "fetch", "pinned", "pinned_fetch"])
def test_client_killed_mid_transfer_leaves_daemon_clean(daemon, direction):
    kill_mid_transfer(daemon, "shm", direction, "shm")


def test_ring_mapping_survives_the_client(daemon):
    """The daemon maps the client's memfd: after the client's session ends, nothing of it stays mapped."""
    with connected(daemon.address, "shm") as (cp, session):
        region = session._link._region
        assert isinstance(region, mmap.mmap)
        assert int(cp.asarray(np.ones(10_000_000, np.uint8)).sum()) == 10_000_000
    pid = daemon.proc.pid
    settle(daemon.info, None)
    maps = open(f"/proc/{pid}/maps").read()
    assert "gpuremote-ring" not in maps


@pytest.fixture(scope="module")
def tight_daemon():
    """A daemon that lets a session register at most 2 shared segments of 8 MiB in all."""
    d = DaemonProcess(*backend_args(devices=1, memory="1GiB"),
                      env={"GPUREMOTE_SHM_MAX_SEGMENTS": "2", "GPUREMOTE_SHM_MAX_SEGMENT_BYTES": "8MiB"})
    yield d
    d.stop()


def test_pinned_buffers_past_the_segment_limits_are_copied_through_the_ring(tight_daemon, monkeypatch):
    import dataclasses

    import gpuremote.cupyx as cx
    from gpuremote._config import DEFAULTS
    monkeypatch.setattr(shm, "DEFAULTS", dataclasses.replace(DEFAULTS, shm_max_segments=2,
                                                             shm_max_segment_bytes=8 << 20))
    with connected(tight_daemon.address, "shm") as (cp, session):
        link = session._link
        # three live pinned buffers (the third past the count), then one too large for what is left
        hosts = [cx.empty_pinned((1 << 20,), np.uint8) for _ in range(3)] + [cx.empty_pinned((7 << 20,), np.uint8)]
        for i, host in enumerate(hosts):
            host[:] = i + 1
        devs = [cp.asarray(h) for h in hosts]
        assert len(link._registered) == 2
        for i, dev in enumerate(devs):
            assert int(dev[-1]) == i + 1 and int(dev.sum()) == (i + 1) * dev.size
    settle(tight_daemon.info, None)


def test_registering_past_the_segment_limits_ends_the_session(tight_daemon):
    with _raw_session(tight_daemon) as (opened, fds):
        fds.append(_memfd(4 << 16, True))
        fs, reply = _attach_shm(opened, [fds[0]])
        assert not reply.error
        for sid in range(3):
            fds.append(_memfd(1 << 16, True))
            fs.send(frames.REGISTER, sid, frames.U64.pack(1 << 16), fds=[fds[-1]])
        errors = [payload for kind, payload in _frames_until_closed(fs) if kind == frames.ERROR]
        assert any(b"past the limits of 2 segments" in e for e in errors), errors
    with connected(tight_daemon.address, "shm") as (cp, session):     # others are served as before
        assert int(cp.arange(10).sum()) == 45


# -- fetches written straight into pinned memory (Fetch.land_segment) ---------------------------

def test_pinned_fetch_is_written_in_place(daemon):
    """x.get(out=pinned): the daemon copies once, into the client's segment; the ring stays unused."""
    import gpuremote.cupyx as cx
    rng = np.random.default_rng(7)
    slot = DEFAULTS.ring_slot_bytes
    with connected(daemon.address, "shm") as (cp, session):
        link = session._link
        for dtype, nbytes in ((np.uint8, link.inline_bytes + 1), (np.float32, slot - 4), (np.int64, slot + 8),
                              (np.complex128, 3 * slot + 16), (np.uint8, 3 * slot + 7), (np.float64, 64 << 20)):
            host = random_array(nbytes, dtype, rng)
            dev = cp.asarray(host)
            out = cx.empty_pinned(host.shape, dtype)
            ring_before = link.rx.next
            assert dev.get(out=out) is out
            assert same_bytes(out, host) and link.rx.next == ring_before, (dtype, nbytes)
            assert link._land is None
        # a view at an offset inside a larger pinned buffer
        big = cx.empty_pinned((3 << 20,), np.uint8)
        part = big[12_345:12_345 + (1 << 20)]
        host = random_array(1 << 20, np.uint8, rng)
        cp.asarray(host).get(out=part)
        assert same_bytes(part, host) and not big[:12_345].any()
        # a device array that is not contiguous (a transpose), into pinned memory at an odd offset
        src = random_array(300 * 200 * 8, np.float64, rng).reshape(300, 200)
        odd = big[3:3 + src.nbytes].view(np.float64).reshape(200, 300)
        assert cp.asarray(src).T.get(out=odd) is odd and not odd.flags.aligned
        assert same_bytes(odd, np.ascontiguousarray(src.T)) and link.rx.next == ring_before
        # `out` of another shape is refused untouched, as before (nothing written into it)
        wrong = cx.zeros_pinned((2, 1 << 19), np.uint8)
        with pytest.raises(ValueError, match="shape"):
            cp.asarray(host).get(out=wrong)
        assert not wrong.any()
    settle(daemon.info, None)


def _fetch_landing(session, handle: int, segment: int, offset: int):
    def fill(op):
        op.fetch.handle = handle
        op.fetch.land_segment, op.fetch.land_offset = segment, offset
    return session.request(fill)


def test_bad_landing_requests_fail_the_op_and_the_session_serves_on(daemon):
    import gpuremote.cupyx as cx
    from gpuremote.errors import ProtocolError
    with connected(daemon.address, "shm") as (cp, session):
        x = cp.arange(1 << 18, dtype=cp.float32)       # 1 MiB: past the inline size
        pinned = cx.empty_pinned((1 << 18,), np.float32)
        segment, offset = session._link.landing(pinned)  # registers the segment
        session._link._land = None
        with pytest.raises(ProtocolError, match="not registered"):
            _fetch_landing(session, x._gr_handle, segment + 1000, 0)
        with pytest.raises(ProtocolError, match="at offset"):
            _fetch_landing(session, x._gr_handle, segment, offset + 4096)
        with pytest.raises(ProtocolError, match="at offset"):
            _fetch_landing(session, x._gr_handle, segment, 2**63)
        assert int(x[-1]) == (1 << 18) - 1 and x.get()[7] == 7       # still served, in step
    for transport, message in (("unix", "maps no client memory"), ("grpc", "no shared-memory data plane")):
        with connected(daemon.address, transport) as (cp, session):
            x = cp.arange(1 << 18, dtype=cp.float32)
            with pytest.raises(ProtocolError, match=message):
                _fetch_landing(session, x._gr_handle, 1, 0)
            assert int(x[-1]) == (1 << 18) - 1
    settle(daemon.info, None)


def test_alloc_pinned_memory_is_shared_both_ways(daemon):
    """cupy.cuda.alloc_pinned_memory, viewed with numpy.frombuffer as CuPy programs do: an upload
    from it is read in place and a fetch into it is written in place (the ring stays unused)."""
    with connected(daemon.address, "shm") as (cp, session):
        link = session._link
        n = 3 << 18
        src = np.frombuffer(cp.cuda.alloc_pinned_memory(n * 4), np.float32, n)
        src[:] = np.arange(n, dtype=np.float32)
        ring = (link.tx.next, link.rx.next)
        dev = cp.asarray(src) * 2
        dst = np.frombuffer(cp.cuda.alloc_pinned_memory(n * 4), np.float32, n)
        assert dev.get(out=dst) is dst
        np.testing.assert_array_equal(dst, np.arange(n, dtype=np.float32) * 2)
        assert (link.tx.next, link.rx.next) == ring and len(link._registered) >= 2
