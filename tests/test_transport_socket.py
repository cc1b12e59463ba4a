"""The framed-socket data plane (TCP and Unix socket) against a real daemon process: exact bytes of
every dtype at every size that matters, fallbacks, hostile attaches, and clients killed mid-transfer.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
import warnings

import grpc
import numpy as np
import pytest

from gpuremote._config import PROTOCOL_VERSION
from gpuremote.client.session import Session as ClientSession
from gpuremote.errors import DeviceLostError, ProtocolError
from gpuremote.transport import buffers, frames, host_id, plan
from gpuremote.v1 import daemon_pb2_grpc
from gpuremote.wire import pb

from conftest import DaemonProcess, backend_args
from transport_util import check_exact_bytes, connected, kill_mid_transfer, settle

TRANSPORTS = ["grpc", "tcp", "unix"]


@pytest.fixture(scope="module")
def daemon():
    d = DaemonProcess(*backend_args(devices=1, memory="1GiB"))
    yield d
    d.stop()


def _used(d) -> list[int]:
    return [dev.memory_used for dev in d.info().devices]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_exact_bytes_every_dtype_and_size(daemon, transport):
    check_exact_bytes(daemon, transport, "grpc" if transport == "grpc" else "socket")


def test_ops_interleave_with_bulk_in_order(daemon):
    """Async ops, uploads and fetches on one ordered channel: results reflect issue order."""
    with connected(daemon.address, "unix") as (cp, _):
        a = cp.zeros(1_000_000)
        for i in range(5):
            a += 1
            b = cp.asarray(np.full(1_000_000, float(i)))   # raw frame right after its batch
            a = a + b
        np.testing.assert_array_equal(a.get(), np.full(1_000_000, 5.0 + 10.0))


def test_fetched_buffers_are_reused_only_when_free(daemon):
    with connected(daemon.address, "tcp") as (cp, _):
        x = cp.asarray(np.arange(1 << 20, dtype=np.float64))
        first = x.get()
        addr = first.ctypes.data
        assert addr % buffers.PAGE == 0
        second = x.get()                       # `first` is alive: a different buffer
        assert second.ctypes.data != addr
        first[:] = -1                          # writing one never changes the other
        np.testing.assert_array_equal(second, np.arange(1 << 20, dtype=np.float64))
        del first
        third = x.get()                        # its buffer is free again
        assert third.ctypes.data == addr
        np.testing.assert_array_equal(third, second)


def test_env_selects_transport_and_reports_it(daemon):
    code = textwrap.dedent("""
        import sys, numpy as np, gpuremote, gpuremote.cupy as cp
        s = gpuremote.connect(sys.argv[1])
        assert float(cp.asarray(np.arange(4.0)).sum()) == 6.0
        print(s.transport, getattr(s._link, "via", "-"))
    """)
    seen = {}
    for value in ("grpc", "socket", "tcp", "auto"):
        out = subprocess.run([sys.executable, "-c", code, daemon.address], capture_output=True, text=True, timeout=60,
                             env=dict(os.environ, GPUREMOTE_TRANSPORT=value))
        assert out.returncode == 0, out.stderr
        seen[value] = out.stdout.split()
    assert seen["grpc"] == ["grpc", "-"]
    assert seen["socket"] == ["socket", "unix"]        # same host: the Unix socket
    assert seen["tcp"] == ["socket", "tcp"]
    assert seen["auto"][0] in ("shm", "socket")


def test_unknown_transport_is_a_clear_error(daemon):
    with pytest.raises(ValueError, match="unknown transport 'carrier-pigeon'.*auto"):
        ClientSession(daemon.address, transport="carrier-pigeon")
    settle(daemon.info, None)


def test_plan_prefers_fast_paths():
    dp = pb.DataPlane(tcp_port=5, unix_path="@x", attach_token=b"t" * 32, transports=["socket", "shm"],
                      host_id=host_id())
    assert plan("auto", dp) == ["shm", "unix", "tcp"]
    assert plan("socket", dp) == ["unix", "tcp", "shm"]
    assert plan("tcp", dp) == ["tcp", "shm", "unix"]
    assert plan("grpc", dp) == []
    other = pb.DataPlane(tcp_port=5, attach_token=b"t" * 32, transports=["socket"], host_id="elsewhere/h")
    assert plan("auto", other) == ["tcp"]
    assert plan("shm", other) == ["shm", "tcp"]      # asked for, tried, then what auto takes
    assert plan("auto", pb.DataPlane()) == []        # no data plane offered: gRPC


# -- fallbacks ----------------------------------------------------------------------------------

def test_dataplane_off_falls_back_to_grpc():
    d = DaemonProcess(*backend_args(devices=1, memory="64MiB"), env={"GPUREMOTE_DATAPLANE": "0"})
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with connected(d.address, "tcp") as (cp, session):
                assert session.transport == "grpc"
                assert int(cp.arange(10).sum()) == 45
        assert any("transport 'tcp'" in str(w.message) and "using grpc" in str(w.message) for w in caught)
        with connected(d.address, "auto") as (cp, session):
            assert session.transport == "grpc"
            host = np.arange(300_000, dtype=np.float64)
            np.testing.assert_array_equal(cp.asarray(host).get(), host)
    finally:
        d.stop()


def test_socket_refused_falls_back_to_grpc():
    """The daemon advertises a data plane whose listeners are gone: connections are refused."""
    from gpuremote.daemon.backends import create
    from gpuremote.daemon.server import DaemonServer
    server = DaemonServer(create("emulated", None, 1, 64 * 2**20), "127.0.0.1:0").start()
    try:
        server.service.dataplane.stop()      # closes both listeners; sessions still advertise them
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with connected(server.address, "socket") as (cp, session):
                assert session.transport == "grpc"
                x = cp.asarray(np.arange(100_000, dtype=np.int64))
                assert int(x.sum()) == sum(range(100_000))
        assert any("using grpc" in str(w.message) for w in caught)
        with connected(server.address, None) as (cp, session):     # auto: quietly gRPC
            assert session.transport == "grpc"
            assert int(cp.arange(5).sum()) == 10
    finally:
        server.stop(grace=1)


# -- hostile and broken connections -----------------------------------------------------------

def _raw_open(address: str):
    """Open a session with a raw gRPC stream; returns (channel, outbox, SessionOpened)."""
    import queue
    channel = grpc.insecure_channel(address)
    outbox: queue.SimpleQueue = queue.SimpleQueue()

    def requests():
        while True:
            m = outbox.get()
            if m is None:
                return
            yield m
    responses = daemon_pb2_grpc.DaemonStub(channel).Session(requests())
    outbox.put(pb.ClientMessage(open=pb.OpenSession(protocol_version=PROTOCOL_VERSION, client_name="raw",
                                                    client_host_id=host_id())))
    opened = next(responses).opened
    return channel, outbox, responses, opened


def _attach_raw(opened, token: bytes, first: bytes | None = None) -> tuple[socket.socket, tuple]:
    sock = socket.create_connection(("127.0.0.1", opened.data_plane.tcp_port), timeout=10)
    if first is None:
        req = pb.Attach(session_id=opened.session_id, attach_token=token, transport="socket").SerializeToString()
        first = frames.HEADER.pack(frames.ATTACH, 0, len(req)) + req
    sock.sendall(first)
    fs = frames.FrameSocket(sock, 1 << 16)
    try:
        kind, _, payload = fs.read_frame(1 << 16)
        return sock, (kind, pb.Attached.FromString(payload) if kind == frames.ATTACHED else bytes(payload))
    except EOFError:
        return sock, (None, None)


def test_wrong_token_and_garbage_are_refused(daemon):
    baseline = _used(daemon)
    channel, outbox, responses, opened = _raw_open(daemon.address)
    try:
        assert len(opened.data_plane.attach_token) == 32 and opened.data_plane.tcp_port
        sock, (kind, reply) = _attach_raw(opened, b"x" * 32)
        assert kind == frames.ATTACHED and "wrong attach token" in reply.error
        sock.close()
        sock, (kind, reply) = _attach_raw(opened, b"", first=b"GET / HTTP/1.1\r\n\r\n" + b"\0" * 64)
        assert kind in (frames.ATTACHED, None)
        sock.close()
        big = frames.HEADER.pack(frames.ATTACH, 0, 1 << 40)
        sock, (kind, reply) = _attach_raw(opened, b"", first=big)
        assert kind in (frames.ATTACHED, None)
        sock.close()
        # the real token still works once, and only once
        good, (kind, reply) = _attach_raw(opened, opened.data_plane.attach_token)
        assert kind == frames.ATTACHED and not reply.error and reply.transport == "socket"
        again, (kind, reply) = _attach_raw(opened, opened.data_plane.attach_token)
        assert "already attached" in reply.error
        again.close()
        # garbage after attaching ends the session (the daemon cancels its gRPC stream)
        good.sendall(frames.HEADER.pack(frames.MSG, 0, 5) + b"\xff\xff\xff\xff\xff")
        good.settimeout(10)
        data = b""
        while True:
            chunk = good.recv(65536)
            if not chunk:
                break
            data += chunk
        assert frames.HEADER.unpack_from(data)[0] == frames.ERROR
        good.close()
        with pytest.raises(grpc.RpcError):
            next(responses)
    finally:
        outbox.put(None)
        channel.close()
    settle(daemon.info, baseline)


def test_grpc_batch_after_attach_is_refused(daemon):
    baseline = _used(daemon)
    s = ClientSession(daemon.address, transport="tcp")
    try:
        assert s.transport == "socket"
        msg = pb.ClientMessage()
        op = msg.batch.ops.add(seq=10**6, reply=True)
        op.sync.SetInParent()
        s._outbox.put(msg)                      # an op on the gRPC stream of an attached session
        settle(daemon.info, baseline)
        with pytest.raises((DeviceLostError, ProtocolError)):
            s.request(lambda o: o.sync.SetInParent())
    finally:
        s.close()


@pytest.mark.parametrize("transport,direction", [("tcp", "upload"), ("unix", "fetch")])
def test_client_killed_mid_transfer_leaves_daemon_clean(daemon, transport, direction):
    kill_mid_transfer(daemon, transport, direction, "socket")


def test_daemon_gone_is_device_lost():
    d = DaemonProcess(*backend_args(devices=1, memory="64MiB"))
    try:
        with connected(d.address, "tcp") as (cp, session):
            x = cp.ones(10)
            assert float(x.sum()) == 10.0
            d.stop()
            with pytest.raises(DeviceLostError, match="lost the .*connection"):
                for _ in range(50):                          # bounded: the loss shows at a sync point
                    float(x.sum())
                    time.sleep(0.05)
    finally:
        d.stop()


@pytest.mark.parametrize("transport", ["grpc", "tcp", "unix", "shm"])
def test_get_into_out_lands_in_place(daemon, transport, monkeypatch):
    """x.get(out=a) with a C-contiguous array of the right shape and dtype receives the bytes straight
    into `a` (no staging buffer is taken); any other `out` still gets the right values, by a copy."""
    import gpuremote.cupyx as cx
    from gpuremote.client import session as client_session
    staged = []
    take = client_session.buffers.take
    monkeypatch.setattr(client_session.buffers, "take", lambda n: staged.append(n) or take(n))
    host = np.random.default_rng(3).standard_normal((600, 700)).astype(np.float32)    # chunked, not inline
    with connected(daemon.address, transport) as (cp, session):
        assert session.transport == {"tcp": "socket", "unix": "socket"}.get(transport, transport)
        dev = cp.asarray(host)
        for out in (np.empty_like(host), cx.empty_pinned(host.shape, host.dtype)):
            assert dev.get(out=out) is out
            np.testing.assert_array_equal(out, host)
        assert host.nbytes not in staged
        assert dev.get().nbytes == host.nbytes and host.nbytes in staged      # without out: staged
        fortran = np.empty(host.shape, host.dtype, order="F")
        assert dev.get(out=fortran) is fortran
        np.testing.assert_array_equal(fortran, host)
        wider = np.empty(host.shape, np.float64)
        np.testing.assert_array_equal(dev.get(out=wider), host.astype(np.float64))
        with pytest.raises(ValueError, match="shape"):
            dev.get(out=np.empty((600, 701), np.float32))


@pytest.mark.parametrize("transport", ["grpc", "tcp", "unix", "shm"])
def test_fetched_arrays_are_writable(daemon, transport):
    """What get(), asnumpy() and tolist-style reads hand the application is its own NumPy array, as
    with CuPy: writable, at every size (inline in the reply or in bulk), and not shared with the next
    fetch."""
    with connected(daemon.address, transport) as (cp, _):
        for n in (1, 64, 4096, 300_000):
            dev = cp.arange(n, dtype=cp.float32)
            first = dev.get()
            second = cp.asnumpy(dev)
            for host in (first, second):
                assert host.flags.writeable, (n, transport)
                host[0] = -1.0
            assert second[0] == -1.0 and first[0] == -1.0
            np.testing.assert_array_equal(dev.get(), np.arange(n, dtype=np.float32))   # the device copy untouched
            np.testing.assert_array_equal(first[1:], np.arange(1, n, dtype=np.float32))
