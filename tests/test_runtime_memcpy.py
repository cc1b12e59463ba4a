"""cupy.cuda.runtime.memcpy-style calls: `ndarray.data` (MemoryPointer) addresses, memcpy/memcpyAsync
of every kind, memset, and the MemoryPointer copies, through each transport; bad addresses, sizes
and kinds are clear errors that change nothing."""

from __future__ import annotations

import ctypes
import gc

import numpy as np
import pytest

from conftest import DaemonProcess, backend_args
from transport_util import connected


@pytest.fixture(scope="module")
def daemon():
    d = DaemonProcess(*backend_args(devices=1, memory="1GiB"))
    yield d
    d.stop()


@pytest.mark.parametrize("transport", ["grpc", "unix", "shm"])
def test_copies_of_every_kind_move_exact_bytes(daemon, transport):
    rng = np.random.default_rng(7)
    with connected(daemon.address, transport) as (cp, _):
        rt = cp.cuda.runtime
        for n in (1, 7, 4096, (16 << 10) + 1, 1_200_003):
            host = rng.integers(0, 256, n + 16, dtype=np.uint8)
            dev = cp.zeros(n + 16, dtype=cp.uint8)
            rt.memcpy(dev.data.ptr + 16, host.ctypes.data, n, rt.memcpyHostToDevice)        # at an offset
            back = np.zeros(n, np.uint8)
            rt.memcpy(back.ctypes.data, dev.data.ptr + 16, n, rt.memcpyDeviceToHost)
            np.testing.assert_array_equal(back, host[:n])
            np.testing.assert_array_equal(dev.get()[:16], 0)
            other = cp.empty(n, dtype=cp.uint8)
            rt.memcpy(other.data.ptr, dev.data.ptr + 16, n, rt.memcpyDefault)               # D2D, inferred
            np.testing.assert_array_equal(other.get(), host[:n])
            again = np.zeros(n, np.uint8)
            rt.memcpy(again.ctypes.data, back.ctypes.data, n, rt.memcpyHostToHost)
            np.testing.assert_array_equal(again, back)
        # typed arrays are their C-order bytes; a stream's async form is ordered with its ops
        f = cp.asarray(np.arange(12, dtype=np.float64).reshape(3, 4))
        g = cp.empty((4, 3), dtype=cp.float64)
        stream = cp.cuda.Stream()
        rt.memcpyAsync(g.data.ptr, f.data.ptr, f.nbytes, rt.memcpyDeviceToDevice, stream.ptr)
        stream.synchronize()
        np.testing.assert_array_equal(g.get(), np.arange(12.0).reshape(4, 3))
        rt.memsetAsync(g.data.ptr, 0, 8, stream)
        g.data.copy_from_host_async(np.float64([5.0]).ctypes.data, 8, stream)   # after the memset, in order
        stream.synchronize()
        assert g.get()[0, 0] == 5.0


def test_memory_pointer_methods_and_memset(daemon):
    with connected(daemon.address, "unix") as (cp, _):
        rt = cp.cuda.runtime
        x = cp.arange(8, dtype=cp.int32)
        p = x.data
        assert isinstance(p, cp.cuda.MemoryPointer) and p.device_id == 0 and int(p) == p.ptr == x.data.ptr
        assert (p + 8).ptr == p.ptr + 8 and (8 + p).ptr == p.ptr + 8 and ((p + 8) - 4).ptr == p.ptr + 4
        host = np.array([100, 101], np.int32)
        (p + 8).copy_from_host(host.ctypes.data, 8)
        (p + 16).copy_from(ctypes.c_void_p(host.ctypes.data), 4)
        out = np.zeros(8, np.int32)
        p.copy_to_host(out.ctypes.data, 32)
        np.testing.assert_array_equal(out, [0, 1, 100, 101, 100, 5, 6, 7])
        y = cp.zeros(8, dtype=cp.int32)
        y.data.copy_from_device(p, 32)
        (y.data + 4).copy_from(x.data, 4)
        np.testing.assert_array_equal(y.get(), [0, 0, 100, 101, 100, 5, 6, 7])
        y.data.memset(0xFF, 4)
        rt.memsetAsync(y.data.ptr + 28, 0x101, 4)            # the low byte, as cudaMemset
        assert y.get()[0] == -1 and y.get()[7] == 0x01010101
        kept = cp.full(4, 3.0).data                          # a pointer keeps its array alive
        gc.collect()
        back = np.zeros(4)
        kept.copy_to_host(back.ctypes.data, 32)
        np.testing.assert_array_equal(back, 3.0)


def test_bad_addresses_sizes_and_kinds_change_nothing(daemon):
    with connected(daemon.address, "shm") as (cp, _):
        rt = cp.cuda.runtime
        x = cp.arange(10, dtype=cp.float32)
        h = np.arange(10, dtype=np.float32) + 100
        bad = [
            ((x.data.ptr, h.ctypes.data, x.nbytes + 1, rt.memcpyHostToDevice), "no gpuremote array holds"),
            ((x.data.ptr + 40, h.ctypes.data, 1, rt.memcpyHostToDevice), "no gpuremote array holds"),
            ((x.data.ptr - 1, h.ctypes.data, 4, rt.memcpyHostToDevice), "no gpuremote array holds"),
            ((x.data.ptr, h.ctypes.data, -1, rt.memcpyHostToDevice), "must not be negative"),
            ((x.data.ptr, h.ctypes.data, 4, 7), "invalid memcpy kind"),
            ((x.data.ptr, h.ctypes.data, 4, "h2d"), "invalid memcpy kind"),
            ((x.data.ptr, h.ctypes.data, 4, rt.memcpyDeviceToHost), "does not match the addresses"),
            ((h.ctypes.data, x.data.ptr, 4, rt.memcpyHostToDevice), "does not match the addresses"),
            ((0, x.data.ptr, 4, rt.memcpyDeviceToHost), "not a host address"),
            ((-8, x.data.ptr, 4, rt.memcpyDefault), "not a host address"),
            ((16, x.data.ptr, 4, rt.memcpyDefault), "not a host address"),
            ((2**62, x.data.ptr, 4, rt.memcpyDeviceToDevice), "no gpuremote array holds"),
        ]
        for args, message in bad:
            with pytest.raises(ValueError, match=message):
                rt.memcpy(*args)
        with pytest.raises(ValueError, match="not a device address"):
            rt.memset(h.ctypes.data, 0, 4)
        with pytest.raises(ValueError, match="no stream has ptr"):
            rt.memcpyAsync(x.data.ptr, h.ctypes.data, 4, rt.memcpyHostToDevice, 987654321)
        with pytest.raises(TypeError):
            rt.memsetAsync(x.data.ptr, 0, 4, "stream")
        with pytest.raises(ValueError, match="must not be negative"):
            rt.memset(x.data.ptr, 0, -4)
        with pytest.raises(TypeError, match="MemoryPointer"):
            x.data.copy_from_device(h.ctypes.data, 4)
        with pytest.raises(TypeError):
            rt.memcpy(x.data.ptr, h.ctypes.data, 2.5, rt.memcpyHostToDevice)
        with pytest.raises(ValueError, match="C-contiguous"):
            x[::2].data
        with pytest.raises(ValueError, match="C-contiguous"):
            cp.arange(12.0).reshape(3, 4).T.data
        rt.memcpy(x.data.ptr, h.ctypes.data, 0, rt.memcpyHostToDevice)         # nothing to copy
        np.testing.assert_array_equal(x.get(), np.arange(10, dtype=np.float32))  # untouched by all of it
        gone = cp.ones(4).data.ptr
        gc.collect()
        with pytest.raises(ValueError, match="no gpuremote array holds"):     # its array was freed
            rt.memcpy(h.ctypes.data, gone, 4, rt.memcpyDeviceToHost)


def test_layout_queries_match_numpy_and_refuse_what_is_not_one_array(daemon):
    with connected(daemon.address, "unix") as (cp, _):
        from gpuremote.cupy._core import service_call
        for args in ((), (5,), ("x",), (cp.zeros(2), cp.zeros(2))):
            with pytest.raises(TypeError, match="one device array"):
                service_call("cuda.memory.layout", args, value=True)
        host = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
        dev = cp.asarray(host)
        owns = (True, False, False, False, False, False, True)    # a view owns no data (x[0, 0, 0]: a 0-d view)
        for view, own in zip((lambda x: x, lambda x: x.T, lambda x: x[:, ::2], lambda x: x[1], lambda x: x[0, 0, 0],
                              lambda x: x.reshape(4, 6)[:, 1:3], lambda x: x.astype(np.float64, order="F")), owns):
            want, got = view(host), view(dev)
            assert got.flags.owndata is got.flags["OWNDATA"] is own
            assert got.strides == want.strides
            assert (got.flags.c_contiguous, got.flags.f_contiguous) == (want.flags.c_contiguous, want.flags.f_contiguous)
            assert got.flags["C_CONTIGUOUS"] == want.flags["C_CONTIGUOUS"] and got.flags["F"] == want.flags["F"]
        with pytest.raises(KeyError, match="C_CONTIGUOUS, F_CONTIGUOUS and OWNDATA"):
            dev.flags["WRITEABLE"]
        assert "C_CONTIGUOUS : True" in repr(dev.flags) and "OWNDATA : True" in repr(dev.flags)


def test_device_to_device_between_two_daemons(daemon):
    import gpuremote
    other = DaemonProcess(*backend_args(devices=1, memory="256MiB"))
    try:
        with connected(daemon.address, "unix") as (cp, _):
            gpuremote.connect(other.address)
            a = cp.asarray(np.arange(100, dtype=np.int64))
            with cp.cuda.Device(1):
                b = cp.zeros(100, dtype=cp.int64)
            assert b.device.id == 1 and a.device.id == 0
            cp.cuda.runtime.memcpy(b.data.ptr + 80, a.data.ptr, 400, cp.cuda.runtime.memcpyDeviceToDevice)
            np.testing.assert_array_equal(b.get(), np.r_[np.zeros(10, np.int64), np.arange(50), np.zeros(40, np.int64)])
    finally:
        other.stop()
