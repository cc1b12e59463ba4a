"""The CuPy names gpuremote builds on the client from forwarded operations (gpuremote/cupy/_composed.py,
cupy.testing's decorators, cupyx.profiler, cupyx.rsqrt): each compared with NumPy's through a real
daemon (`check` runs the device side three times: full call, template definition, replay), and the
bad inputs each refused with a clear error, hostile sizes by the daemon's memory checks."""

from __future__ import annotations

import inspect
import io
import itertools
import re

import numpy as np
import pytest

from conftest import DaemonProcess, backend_args
from test_equivalence import check, check_raises
from transport_util import connected


def sync(cp, obj):
    """A sync point after `obj`'s ops: errors of asynchronous ops (the daemon's refusals) surface."""
    for a in obj if isinstance(obj, (list, tuple)) else (obj,):
        if type(a) is cp.ndarray:
            a.get()
    cp.cuda.Device().synchronize()


# ------------------------------------------------------------------------------------------
# index tricks
# ------------------------------------------------------------------------------------------

GRIDS = ["[0:5, 0:3]", "[0:1:5j, 2:4]", "[-1:1:0.5, 0:3]", "[0:5]", "[0:1:5j]", "[3:-3:-1.5]", "[0:4:2, 1:2:3j, 0:2]",
         "[1:2:1j, 0:3]", "[np.float32(0):2, 0:2]", "[()]"]


@pytest.mark.parametrize("key", GRIDS)
def test_mgrid_ogrid(cp, key):
    np_ns = {"np": np}
    check(lambda xp, rng: eval("xp.mgrid" + key, {"xp": xp, **np_ns}), cp)
    # CuPy's ogrid gives a list where NumPy 2's gives a tuple: compare the arrays
    check(lambda xp, rng: (lambda g: tuple(g) if isinstance(g, (list, tuple)) else g)(
        eval("xp.ogrid" + key, {"xp": xp, **np_ns})), cp)


def test_ogrid_is_a_list_as_in_cupy(cp):
    assert isinstance(cp.ogrid[0:2, 0:3], list) and len(cp.mgrid) == 0


CONCATENATIONS = {
    "r-arrays-scalars": lambda xp: xp.r_[xp.arange(3), 0, 0, xp.arange(3)],
    "r-slices-list": lambda xp: xp.r_[0:3, 7, [1.5, 2]],
    "r-complex-step": lambda xp: xp.r_[0:1:4j, 5],
    "r-float32-scalar": lambda xp: xp.r_[xp.arange(3, dtype=np.float32), 2.5],
    "r-numpy-scalar": lambda xp: xp.r_[np.float32(1), xp.arange(2)],
    "r-directive-axis-ndmin": lambda xp: xp.r_["0,2", xp.arange(3), xp.arange(3)],
    "r-directive-trans1d": lambda xp: xp.r_["1,2,0", xp.arange(3), xp.arange(3)],
    "r-directive-axis": lambda xp: xp.r_["-1", xp.ones((2, 2)), xp.zeros((2, 1))],
    "r-2d": lambda xp: xp.r_[xp.ones((2, 2)), xp.zeros((1, 2))],
    "r-host-array": lambda xp: xp.r_[np.array([1, 2], np.int32), xp.asarray(np.array([3], np.int32))],
    "c-columns": lambda xp: xp.c_[xp.arange(3), xp.arange(3.0)],
    "c-rows": lambda xp: xp.c_[xp.arange(3).reshape(1, 3), 0, 0, xp.arange(3).reshape(1, 3)],
    "c-slice": lambda xp: xp.c_[0:3, xp.arange(3)],
}


@pytest.mark.parametrize("body", CONCATENATIONS.values(), ids=CONCATENATIONS.keys())
def test_r_c(cp, body):
    check(lambda xp, rng: body(xp), cp)


def test_s_index_exp(cp):
    assert cp.s_ is np.s_ and cp.index_exp is np.index_exp
    check(lambda xp, rng: xp.arange(12).reshape(3, 4)[xp.s_[1:, ::2]], cp)


# ------------------------------------------------------------------------------------------
# creation
# ------------------------------------------------------------------------------------------

FROMFUNCTION = {
    "sum": lambda xp: xp.fromfunction(lambda i, j: i * 10 + j, (3, 4)),
    "int-compare": lambda xp: xp.fromfunction(lambda i, j: i == j, (3, 3), dtype=int),
    "kwargs": lambda xp: xp.fromfunction(lambda i, scale: i * scale, (4,), scale=2.5),
    "float32-3d": lambda xp: xp.fromfunction(lambda i, j, k: i - j * k, (2, 3, 2), dtype=np.float32),
}


@pytest.mark.parametrize("body", FROMFUNCTION.values(), ids=FROMFUNCTION.keys())
def test_fromfunction(cp, body):
    check(lambda xp, rng: body(xp), cp)


def test_fromfunction_scalar_result_is_a_device_array(cp):
    out = cp.fromfunction(lambda i: 7, (3,))
    assert type(out) is cp.ndarray and out.get() == 7


def test_frombuffer_fromiter(cp):
    data = np.arange(10, dtype=np.float32).tobytes()
    check(lambda xp, rng: (xp.frombuffer(data, dtype=np.float32, count=4, offset=8),
                           xp.frombuffer(b"\x01\x02\x03", dtype=np.uint8)), cp)
    check(lambda xp, rng: (xp.fromiter((i * i for i in range(6)), float),
                           xp.fromiter(iter(range(10)), np.int32, count=4),
                           xp.fromiter(iter([]), np.float32)), cp)


def test_fromiter_without_count_reads_in_chunks(cp, monkeypatch):
    import gpuremote.cupy._composed as composed
    monkeypatch.setattr(composed, "_FROMITER_CHUNK_BYTES", 32)       # 4 float64 items a chunk
    for n in (0, 3, 4, 9, 12):
        out = cp.fromiter(iter(range(n)), np.float64)
        np.testing.assert_array_equal(out.get(), np.arange(n, dtype=np.float64))


def test_fromiter_refuses_what_the_device_cannot_hold(cp):
    with pytest.raises(cp.OutOfMemoryError, match="1,000,000,000,000 items"):
        cp.fromiter(itertools.count(), float, count=10**12)      # refused before reading anything
    # an endless generator with count=-1, on a 1 MiB device: refused after its first 16 MiB chunk
    small = DaemonProcess(*backend_args(devices=1, memory="1MiB"))
    try:
        with connected(small.address, "unix") as (tiny, _):
            with pytest.raises(tiny.OutOfMemoryError, match="not ended"):
                tiny.fromiter(itertools.count(), float)
            assert tiny.fromiter(iter(range(5)), float).get().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    finally:
        small.stop()


# ------------------------------------------------------------------------------------------
# indices, functional
# ------------------------------------------------------------------------------------------

def test_indices_from(cp):
    check(lambda xp, rng: (xp.tril_indices_from(xp.zeros((3, 4))), xp.tril_indices_from(xp.zeros((4, 3)), k=-1),
                           xp.triu_indices_from(xp.zeros((3, 4)), 1), xp.diag_indices_from(xp.zeros((3, 3, 3)))), cp)


APPLY = {
    "double-axis1": lambda xp, a: xp.apply_along_axis(lambda v: v * 2, 1, a),
    "sum-axis0": lambda xp, a: xp.apply_along_axis(xp.sum, 0, a),
    "outer-new-axes": lambda xp, a: xp.apply_along_axis(lambda v: xp.outer(v, v), 0, a),
    "3d-neg-axis-args": lambda xp, a: xp.apply_along_axis(lambda v, k: v[:k], -1, a.reshape(2, 2, 3), 2),
    "1d": lambda xp, a: xp.apply_along_axis(xp.cumsum, 0, a[0]),
}


@pytest.mark.parametrize("body", APPLY.values(), ids=APPLY.keys())
def test_apply_along_axis(cp, body):
    check(lambda xp, rng: body(xp, xp.asarray(rng.standard_normal((4, 3)))), cp)


PIECEWISE = {
    "two-conditions": lambda xp, x: xp.piecewise(x, [x < 0, x >= 0], [-1, 1]),
    "otherwise": lambda xp, x: xp.piecewise(x, [x < -1, x > 1], [-1, 1, 0.5]),
    "single-condition": lambda xp, x: xp.piecewise(x, x > 0, [3]),
    "later-wins": lambda xp, x: xp.piecewise(x, [x > 0, x > 1], [1, 2]),
    "int-x-float-value": lambda xp, x: xp.piecewise((x * 2).astype(np.int32), [x > 0], [2.7, -1]),
    "scalar-condition": lambda xp, x: xp.piecewise(x, True, [4]),
}


@pytest.mark.parametrize("body", PIECEWISE.values(), ids=PIECEWISE.keys())
def test_piecewise(cp, body):
    check(lambda xp, rng: body(xp, xp.linspace(-2, 2, 9)), cp)


# ------------------------------------------------------------------------------------------
# predicates and conversions
# ------------------------------------------------------------------------------------------

def test_type_and_layout_predicates(cp):
    def body(xp, rng):
        a = xp.asarray(rng.standard_normal((3, 4)))
        c = a.astype(np.complex64)
        f = xp.asfortranarray(a)
        return [xp.iscomplexobj(a), xp.iscomplexobj(c), xp.isrealobj(a), xp.isrealobj(c), xp.iscomplexobj([1j]),
                xp.isfortran(a), xp.isfortran(a.T), xp.isfortran(f), xp.isfortran(xp.zeros(3)),
                xp.common_type(a), xp.common_type(a.astype(np.float32), c), xp.common_type(xp.arange(3)),
                xp.common_type(a.astype(np.float16))]
    check(body, cp)


def test_require(cp):
    a = cp.arange(6.0).reshape(2, 3)
    f = cp.require(a, np.float32, ["F"])
    assert f.dtype == np.float32 and cp.isfortran(f)
    c = cp.require(a.T, requirements="C")
    assert c.flags.c_contiguous and not cp.isfortran(c)
    owned = cp.require(a, requirements=["O"])
    owned[0, 0] = 99
    assert float(a[0, 0]) == 0.0            # a copy of its own
    assert cp.require(a) is a
    np.testing.assert_array_equal(cp.require([[1, 2]], requirements=("c", "owndata")).get(), [[1, 2]])


def test_asarray_chkfinite(cp):
    check(lambda xp, rng: (xp.asarray_chkfinite([1.0, 2.0]), xp.asarray_chkfinite(xp.arange(3)),
                           xp.asarray_chkfinite(xp.ones((2, 2)), dtype=np.float32, order="F")), cp)
    for bad in ([1.0, np.inf], np.array([np.nan, 1.0], np.float32), np.array([1 + np.inf * 1j])):
        check_raises(lambda xp, rng: xp.asarray_chkfinite(xp.asarray(bad)), cp, ValueError)


# ------------------------------------------------------------------------------------------
# text and files
# ------------------------------------------------------------------------------------------

def test_array_repr_str(cp):
    host = np.linspace(0, 1, 7).reshape(7, 1) * 1e-9
    a = cp.asarray(host)
    assert cp.array_repr(a) == np.array_repr(host) == repr(a)
    assert cp.array_str(a) == np.array_str(host)
    assert cp.array_repr(a, precision=3, suppress_small=True) == np.array_repr(host, precision=3, suppress_small=True)
    assert cp.array_str(a, max_line_width=20) == np.array_str(host, max_line_width=20)
    assert cp.array_repr(cp.asarray(np.float32(2.5))) == np.array_repr(np.array(2.5, np.float32))


def test_save_load_savez(cp, tmp_path):
    import gpuremote
    a, b = cp.arange(6.0).reshape(2, 3), cp.asarray(np.array([1, 2], np.int16))
    cp.save(tmp_path / "a.npy", a)
    loaded = cp.load(tmp_path / "a.npy")
    assert type(loaded) is cp.ndarray and loaded.dtype == a.dtype
    np.testing.assert_array_equal(loaded.get(), a.get())
    np.testing.assert_array_equal(np.load(tmp_path / "a.npy"), a.get())      # plain .npy, for NumPy too
    for saver in (cp.savez, cp.savez_compressed):
        buffer = io.BytesIO()
        saver(buffer, a, b=b)
        buffer.seek(0)
        with cp.load(buffer) as npz:
            before = gpuremote.stats()["bytes_h2d"]
            assert sorted(npz) == ["arr_0", "b"] and "b" in npz and len(npz) == 2
            assert gpuremote.stats()["bytes_h2d"] == before             # nothing uploaded until looked up
            got = npz["b"]
            assert type(got) is cp.ndarray and got.dtype == np.int16
            np.testing.assert_array_equal(got.get(), [1, 2])
            np.testing.assert_array_equal(npz["arr_0"].get(), a.get())


# ------------------------------------------------------------------------------------------
# windows, differences, integration, infinities, complex helpers
# ------------------------------------------------------------------------------------------

def test_windows(cp):
    sizes = (-3, 0, 1, 2, 5, 12)
    check(lambda xp, rng: tuple(getattr(xp, name)(m) for name in ("hanning", "hamming", "blackman", "bartlett")
                                for m in sizes)
          + tuple(xp.kaiser(m, beta) for m in sizes for beta in (0, 8.6, np.float32(14))), cp)
    assert cp.hanning(np.int16(4)).shape == (4,)


def test_ediff1d(cp):
    def body(xp, rng):
        a = xp.asarray(rng.integers(-9, 9, (3, 4)))
        f = xp.asarray(rng.standard_normal(5).astype(np.float32))
        return (xp.ediff1d(a), xp.ediff1d(f), xp.ediff1d(a, to_begin=xp.asarray(np.array([-99]))),
                xp.ediff1d(a, to_end=xp.asarray(np.array([[88, 99]], np.int8)), to_begin=xp.asarray(np.int64(7))),
                xp.ediff1d(f, to_end=xp.asarray(np.array([1.5, 2.5]))),       # float64 into float32: same kind
                xp.ediff1d(f[:1], to_begin=xp.asarray(np.array([3]))), xp.ediff1d(f[:0]))
    check(body, cp)


def test_trapz(cp):
    def body(xp, rng):
        trapz = np.trapezoid if xp is np else xp.trapz
        y = xp.asarray(rng.standard_normal((3, 5)))
        x1 = xp.asarray(np.cumsum(rng.random(5)))
        x0 = xp.asarray(np.cumsum(rng.random(3)))
        return (trapz(y), trapz(y[0]), trapz(y, dx=0.5, axis=0), trapz(y, x1), trapz(y, x0, axis=0),
                trapz(y, xp.asarray(rng.random((3, 5))), axis=-2), trapz(xp.asarray(np.arange(6).reshape(2, 3))),
                trapz(y.astype(np.float32), dx=2))
    check(body, cp)


def test_isposinf_isneginf(cp):
    def body(xp, rng):
        x = xp.asarray(np.array([[1.0, -np.inf, np.inf], [np.nan, -0.0, -2.0]]))
        out = xp.ones((2, 3), dtype=bool)
        got = xp.isneginf(x, out=out)
        return (xp.isposinf(x), xp.isneginf(x), xp.isposinf(x.astype(np.float32)), xp.isposinf(xp.arange(3)),
                got is out, out)
    check(body, cp)


def test_sort_complex(cp):
    check(lambda xp, rng: tuple(xp.sort_complex(xp.asarray(h)) for h in (
        np.array([5, 3, 6, 2, 1], np.int8), np.array([5, 3, 1], np.uint16), np.array([[4, 1], [3, -2]]),
        np.array([3.5, -1], np.float32), np.array([1 + 2j, 2 - 1j, 3 - 2j, 3 - 3j, 3 + 5j], np.complex64))), cp)


def test_real_if_close(cp):
    def body(xp, rng):
        close = xp.asarray(np.array([2.1 + 4e-14j, 5.2 + 3e-15j]))
        return (xp.real_if_close(close, tol=1000), xp.real_if_close(close), xp.real_if_close(close, tol=1e-13),
                xp.real_if_close(close.astype(np.complex64)), xp.real_if_close(xp.arange(3.0)))
    check(body, cp)
    a = cp.arange(3.0)
    assert cp.real_if_close(a) is a


# ------------------------------------------------------------------------------------------
# polynomials
# ------------------------------------------------------------------------------------------

def test_polyadd_polysub_polymul(cp):
    def body(xp, rng):
        a = xp.asarray(np.array([1, 2, 3]))
        b = xp.asarray(np.array([2.5, -1], np.float32))
        c = xp.asarray(np.array([1 + 1j, 2]))
        return (xp.polyadd(a, b), xp.polyadd(b, a), xp.polysub(a, b), xp.polysub(b, a), xp.polyadd(a, 2.0),
                xp.polysub(3, b), xp.polymul(a, b), xp.polymul(b, c), xp.polymul(a, 2), xp.polyadd(a, c),
                xp.polyadd(xp.asarray(np.float32(2)), b))
    check(body, cp)
    # as in CuPy, polymul drops leading zeros first (NumPy keeps them)
    got = cp.polymul(cp.asarray(np.array([0, 0, 1, 1])), cp.asarray(np.array([0.0, 0.0])))
    assert got.dtype == np.float64 and got.get().tolist() == [0.0, 0.0]
    assert cp.polymul(cp.asarray(np.array([0, 1])), cp.asarray(np.array([1, 1]))).get().tolist() == [1, 1]


ROOTS = {
    "linear": np.array([2.0, -3.0]),
    "linear-int": np.array([4, 2]),
    "linear-zero-root": np.array([3, 0]),
    "symmetric-quadratic": np.array([2.0, 3.0, -2.0]),
    "symmetric-quadratic-float32": np.array([1.0, -0.5, -1.0], np.float32),
    "leading-zeros": np.array([0, 0, 1, 1, -1]),
    "hermitian-complex": np.array([1 + 1j, 2 + 2j, -1 - 1j]),
    "constant": np.array([0.0, 5.0]),
}


@pytest.mark.parametrize("coefficients", ROOTS.values(), ids=ROOTS.keys())
def test_roots(cp, coefficients):
    # CuPy's roots comes from eigvalsh: ascending order, not NumPy's; compare sorted values
    check(lambda xp, rng: xp.sort(xp.roots(xp.asarray(coefficients))), cp)


def test_roots_empty(cp):
    for p in (np.array([3.0]), np.array([7]), np.array([0.0, 0.0, 0.0])):
        got = cp.roots(cp.asarray(p))
        assert got.shape == (0,) and got.dtype == np.float64 and np.roots(p).size == 0


# ------------------------------------------------------------------------------------------
# files and text, printing, NumPy's host objects
# ------------------------------------------------------------------------------------------

def test_text_and_file_io(cp, tmp_path):
    host = np.arange(12.0).reshape(3, 4) / 3
    cp.savetxt(tmp_path / "a.txt", cp.asarray(host), fmt="%.6f", delimiter=",")
    np.savetxt(tmp_path / "want.txt", host, fmt="%.6f", delimiter=",")
    assert (tmp_path / "a.txt").read_text() == (tmp_path / "want.txt").read_text()
    check(lambda xp, rng: (xp.loadtxt(tmp_path / "a.txt", delimiter=","),
                           xp.loadtxt(tmp_path / "a.txt", delimiter=",", dtype=np.float32, usecols=(1, 3)),
                           xp.genfromtxt(io.StringIO("1,2\n3,\n"), delimiter=",", filling_values=-1),
                           xp.fromstring("1 2 3", dtype=np.int16, sep=" ")), cp)
    host.astype(">f4").tofile(tmp_path / "big_endian.bin")
    np.arange(10, dtype=np.int32).tofile(tmp_path / "ints.bin")
    check(lambda xp, rng: (xp.fromfile(tmp_path / "ints.bin", dtype=np.int32),
                           xp.fromfile(str(tmp_path / "ints.bin"), dtype=np.int32, count=3, offset=8)), cp)
    got = cp.fromfile(tmp_path / "big_endian.bin", dtype=">f4")
    assert got.dtype == np.float32 and np.allclose(got.get(), host.ravel())      # native byte order on the device
    with open(tmp_path / "ints.bin", "rb") as f:
        np.testing.assert_array_equal(cp.fromfile(f, dtype=np.int32, count=2).get(), [0, 1])


def test_fromfile_refuses_what_the_device_cannot_hold(cp, tmp_path):
    path = tmp_path / "sparse.bin"
    with open(path, "wb") as f:
        f.truncate(2**40)                   # a sparse 1 TiB file: refused before a byte is read
    with pytest.raises(cp.OutOfMemoryError, match="fromfile"):
        cp.fromfile(path, dtype=np.uint8)
    with pytest.raises(cp.OutOfMemoryError, match="fromfile"):
        cp.fromfile(str(path), dtype=np.float64, count=2**37)


def test_printing_and_numpy_objects(cp):
    assert cp.set_printoptions is np.set_printoptions and cp.get_printoptions is np.get_printoptions
    assert cp.printoptions is np.printoptions and cp.ndindex is np.ndindex
    assert cp.AxisError is np.exceptions.AxisError
    host = np.linspace(0, 1, 4) / 3
    a = cp.asarray(host)
    with cp.printoptions(precision=2):                   # device arrays print through NumPy's options
        assert repr(a) == repr(host) == "array([0.  , 0.11, 0.22, 0.33])" and str(a) == str(host)
        assert cp.get_printoptions()["precision"] == 2
    assert cp.array2string(a, precision=3, separator=";") == np.array2string(host, precision=3, separator=";")
    assert cp.array2string(host) == np.array2string(host)
    x = cp.asarray(np.float32(1 / 3))
    assert cp.format_float_positional(x, precision=4) == np.format_float_positional(np.float32(1 / 3), precision=4)
    assert cp.format_float_scientific(x, precision=2) == np.format_float_scientific(np.float32(1 / 3), precision=2)
    assert cp.format_float_positional(0.25) == "0.25"
    assert list(cp.ndindex(2, 1)) == [(0, 0), (1, 0)]


def test_broadcast(cp):
    a, b = cp.zeros((3, 1)), cp.arange(4)
    for args, host in (((a, b), (np.zeros((3, 1)), np.arange(4))), ((a, 2.0, b[None]), (np.zeros((3, 1)), 2.0,
                       np.arange(4)[None])), ((), ()), ((cp.zeros((0, 2)), 1), (np.zeros((0, 2)), 1))):
        got, want = cp.broadcast(*args), np.broadcast(*host)
        assert (got.shape, got.nd, got.size) == (want.shape, want.nd, want.size)
    import gpuremote
    before = gpuremote.stats()["ops"]
    z = cp.broadcast(a, b)
    assert gpuremote.stats()["ops"] == before          # shapes only: nothing sent
    va, vb = z.values
    assert va.shape == vb.shape == (3, 4)
    np.testing.assert_array_equal(vb.get(), np.broadcast_to(np.arange(4), (3, 4)))
    assert cp.broadcast(a, 5).values[1] == 5


# ------------------------------------------------------------------------------------------
# bad input
# ------------------------------------------------------------------------------------------

BAD = {
    # hostile sizes: the daemon's memory checks refuse them, nothing is made on the host
    "mgrid-huge-1d": (lambda cp: cp.mgrid[0:10**12], MemoryError),
    "mgrid-huge-2d": (lambda cp: cp.mgrid[0:10**6, 0:10**6], MemoryError),
    "mgrid-huge-points": (lambda cp: cp.mgrid[0:1:10**12 * 1j], MemoryError),
    "ogrid-huge": (lambda cp: cp.ogrid[0:10**12, 0:2], MemoryError),
    "r_-huge": (lambda cp: cp.r_[0:10**12], MemoryError),
    "fromfunction-huge": (lambda cp: cp.fromfunction(lambda i, j: i + j, (10**6, 10**6)), MemoryError),
    # wrong types and values
    "mgrid-int": (lambda cp: cp.mgrid[1], TypeError),
    "mgrid-int-item": (lambda cp: cp.mgrid[1, 0:2], TypeError),
    "mgrid-no-stop": (lambda cp: cp.mgrid[0:, 0:2], TypeError),
    "mgrid-negative-size": (lambda cp: cp.mgrid[5:0, 0:2], ValueError),
    "r_-unknown-directive": (lambda cp: cp.r_["x", 1], ValueError),
    "r_-late-directive": (lambda cp: cp.r_[1, "0"], ValueError),
    "r_-matrix-directive": (lambda cp: cp.r_["r", 1, 2], NotImplementedError),
    "r_-matrix-string": (lambda cp: cp.r_["1 2; 3 4"], NotImplementedError),
    "r_-nothing": (lambda cp: cp.r_[()], ValueError),
    "r_-object": (lambda cp: cp.r_[object()], TypeError),
    "fromfunction-not-callable": (lambda cp: cp.fromfunction(3, (2,)), TypeError),
    "fromiter-count-type": (lambda cp: cp.fromiter([1], float, count=1.5), TypeError),
    "fromiter-too-short": (lambda cp: cp.fromiter(iter([1, 2]), float, count=5), ValueError),
    "fromiter-object-dtype": (lambda cp: cp.fromiter(iter([1]), object), TypeError),
    "frombuffer-str": (lambda cp: cp.frombuffer("abc"), TypeError),
    "apply-0d": (lambda cp: cp.apply_along_axis(lambda v: v, 0, cp.asarray(3.0)), np.exceptions.AxisError),
    "apply-axis": (lambda cp: cp.apply_along_axis(lambda v: v, 2, cp.zeros((2, 2))), np.exceptions.AxisError),
    "apply-empty": (lambda cp: cp.apply_along_axis(lambda v: v, 1, cp.zeros((0, 2))), ValueError),
    "apply-ragged": (lambda cp: cp.apply_along_axis(lambda v: cp.zeros(3 if int(v[0]) else 2), 1, cp.eye(2)),
                     ValueError),
    "tril-from-1d": (lambda cp: cp.tril_indices_from(cp.zeros(3)), ValueError),
    "triu-from-3d": (lambda cp: cp.triu_indices_from(cp.zeros((2, 2, 2))), ValueError),
    "diag-from-1d": (lambda cp: cp.diag_indices_from(cp.zeros(3)), ValueError),
    "diag-from-unequal": (lambda cp: cp.diag_indices_from(cp.zeros((2, 3))), ValueError),
    "piecewise-callable": (lambda cp: cp.piecewise(cp.zeros(3), [cp.zeros(3, bool)], [abs]), NotImplementedError),
    "piecewise-count": (lambda cp: cp.piecewise(cp.zeros(3), [cp.zeros(3, bool)], [1, 2, 3]), ValueError),
    "common-type-bool": (lambda cp: cp.common_type(cp.zeros(3, bool)), TypeError),
    "require-flag": (lambda cp: cp.require(cp.zeros(3), requirements=["W"]), ValueError),
    "require-c-and-f": (lambda cp: cp.require(cp.zeros(3), requirements="CF"), ValueError),
    "chkfinite-order": (lambda cp: cp.asarray_chkfinite([1.0], order="X"), ValueError),
    "load-object-array": (lambda cp: cp.load(_object_npy(), allow_pickle=True), TypeError),
    "load-pickle-refused": (lambda cp: cp.load(_object_npy()), ValueError),
    # windows: a hostile length is the daemon's refusal of the arange, not a host array
    "hanning-huge": (lambda cp: cp.hanning(10**13), MemoryError),
    "hamming-huge": (lambda cp: cp.hamming(10**12), MemoryError),
    "blackman-huge": (lambda cp: cp.blackman(2**40), MemoryError),
    "bartlett-huge": (lambda cp: cp.bartlett(10**13), MemoryError),
    "kaiser-huge": (lambda cp: cp.kaiser(10**13, 5.0), MemoryError),
    "hanning-float": (lambda cp: cp.hanning(2.5), TypeError),
    "hanning-str": (lambda cp: cp.hanning("5"), TypeError),
    "hanning-array": (lambda cp: cp.hanning(cp.arange(3)), TypeError),
    "kaiser-complex-beta": (lambda cp: cp.kaiser(5, 1j), TypeError),
    "kaiser-str-beta": (lambda cp: cp.kaiser(5, "1"), TypeError),
    "ediff1d-host": (lambda cp: cp.ediff1d([1, 2, 3]), TypeError),
    "ediff1d-host-edge": (lambda cp: cp.ediff1d(cp.arange(3), to_end=[1]), TypeError),
    "ediff1d-unsafe-edge": (lambda cp: cp.ediff1d(cp.arange(3), to_begin=cp.ones(1)), TypeError),
    "ediff1d-bool": (lambda cp: cp.ediff1d(cp.zeros(3, bool)), TypeError),
    "trapz-host": (lambda cp: cp.trapz([1.0, 2.0]), TypeError),
    "trapz-host-x": (lambda cp: cp.trapz(cp.ones(3), [1, 2, 3]), TypeError),
    "trapz-axis": (lambda cp: cp.trapz(cp.ones((2, 3)), axis=2), np.exceptions.AxisError),
    "trapz-0d": (lambda cp: cp.trapz(cp.asarray(1.0)), np.exceptions.AxisError),
    "trapz-x-length": (lambda cp: cp.trapz(cp.ones(3), cp.ones(5)), ValueError),
    "isposinf-complex": (lambda cp: cp.isposinf(cp.zeros(2, complex)), TypeError),
    "isneginf-list": (lambda cp: cp.isneginf([1.0]), TypeError),
    "isposinf-out-shape": (lambda cp: cp.isposinf(cp.zeros(3), out=cp.zeros(2, bool)), ValueError),
    "sort-complex-host": (lambda cp: cp.sort_complex([1, 2]), TypeError),
    "real-if-close-host": (lambda cp: cp.real_if_close([1j]), TypeError),
    "polyadd-2d": (lambda cp: cp.polyadd(cp.ones((2, 2)), cp.ones(2)), ValueError),
    "polysub-list": (lambda cp: cp.polysub([1, 2], cp.ones(2)), TypeError),
    "polymul-str": (lambda cp: cp.polymul("12", cp.ones(2)), TypeError),
    "roots-host": (lambda cp: cp.roots([1.0, 2.0]), TypeError),
    "roots-bool": (lambda cp: cp.roots(cp.ones(3, bool)), NotImplementedError),
    "roots-0d": (lambda cp: cp.roots(cp.asarray(1.0)), TypeError),
    "roots-2d": (lambda cp: cp.roots(cp.ones((2, 2))), ValueError),
    "roots-quadratic": (lambda cp: cp.roots(cp.asarray(np.array([1.0, -3.0, 2.0]))), NotImplementedError),
    "roots-complex-diagonal": (lambda cp: cp.roots(cp.asarray(np.array([1j, 2, -1j]))), NotImplementedError),
    "roots-cubic": (lambda cp: cp.roots(cp.asarray(np.array([1.0, 0.0, 0.0, -1.0]))), NotImplementedError),
    "broadcast-mismatch": (lambda cp: cp.broadcast(cp.ones(2), cp.ones(3)), ValueError),
    "broadcast-list": (lambda cp: cp.broadcast(cp.ones(2), [1, 2]), TypeError),
    "loadtxt-structured": (lambda cp: cp.loadtxt(io.StringIO("1 2"), dtype="i4,f8"), TypeError),
    "fromfile-missing": (lambda cp: cp.fromfile("/nonexistent/gpuremote.bin"), OSError),
}


def _object_npy() -> io.BytesIO:
    buffer = io.BytesIO()
    np.save(buffer, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    buffer.seek(0)
    return buffer


@pytest.mark.parametrize("body,exc", BAD.values(), ids=BAD.keys())
def test_bad_input_is_refused_clearly(cp, body, exc):
    with pytest.raises(exc):
        sync(cp, body(cp))
    cp.cuda.Device().synchronize()      # nothing left to surface in the next test
    assert cp.arange(3).sum().get() == 3


# ------------------------------------------------------------------------------------------
# cupy.testing decorators
# ------------------------------------------------------------------------------------------

def test_numpy_cupy_decorators_compare_both_runs(cp):
    from gpuremote.cupy import testing
    calls = []

    @testing.for_all_dtypes(no_float16=True)
    @testing.numpy_cupy_allclose(rtol={np.float32: 1e-6, "default": 1e-7})
    def mean_all(xp, dtype):
        calls.append((xp.__name__, dtype))
        return testing.shaped_arange((2, 3), xp, dtype).sum(axis=0)

    # xp and dtype come from the decorators: with defaults in the signature, pytest asks no fixture for them
    assert all(p.default is None for p in inspect.signature(mean_all).parameters.values())
    mean_all()
    assert len(calls) == 2 * 15 and {m for m, _ in calls} == {"numpy", "gpuremote.cupy"}

    @testing.for_float_dtypes(name="t")
    @testing.numpy_cupy_array_equal()
    def transposed(xp, t):
        return xp.arange(6, dtype=t).reshape(2, 3).T, xp.float32(1)

    transposed()

    @testing.numpy_cupy_allclose(accept_error=ValueError)
    def both_raise(xp):
        return xp.zeros(3).reshape(4)

    both_raise()


@pytest.mark.parametrize("case", ["values", "dtype", "one-raises", "error-not-accepted", "types"])
def test_numpy_cupy_decorators_fail_on_a_difference(cp, case):
    from gpuremote.cupy import testing

    @testing.numpy_cupy_allclose()
    def body(xp):
        device = xp is not np
        if case == "values":
            return xp.arange(3) + int(device)
        if case == "dtype":
            return xp.arange(3, dtype=np.float32 if device else np.float64)
        if case == "one-raises":
            return xp.zeros(3).reshape(4 if device else 3)
        if case == "error-not-accepted":
            return xp.zeros(3).reshape(4)
        return xp.arange(3) if device else [0, 1, 2]
    with pytest.raises(AssertionError):
        body()


def test_numpy_cupy_decorators_refuse_sparse(cp):
    from gpuremote.cupy import testing
    with pytest.raises(NotImplementedError):
        testing.numpy_cupy_allclose(sp_name="sp")


# ------------------------------------------------------------------------------------------
# cupyx: profiler, rsqrt
# ------------------------------------------------------------------------------------------

def test_benchmark(cp):
    from gpuremote.cupyx import profiler
    a = cp.arange(100.0)
    result = profiler.benchmark(lambda x: cp.sin(x) * 2, (a,), n_repeat=5, n_warmup=1, name="sin")
    assert result.cpu_times.shape == (5,) and result.gpu_times.shape == (1, 5)
    assert (result.cpu_times > 0).all() and (result.gpu_times >= 0).all()
    assert re.fullmatch(r"sin {17}: {4}CPU: *[\d.]+ us {3}\+/- *[\d.]+ \(min: *[\d.]+ / max: *[\d.]+\) us"
                        r" {5}GPU-0: *[\d.]+ us {3}\+/- *[\d.]+ \(min: *[\d.]+ / max: *[\d.]+\) us", str(result))
    one = profiler.benchmark(cp.sum, (a,), kwargs={"axis": 0}, n_repeat=100, max_duration=0)
    assert one.cpu_times.shape == (1,) and str(one).startswith("sum ")
    for bad in ({"func": 3}, {"args": [a]}, {"kwargs": ()}, {"n_repeat": 1.5}, {"name": 3}, {"n_warmup": -1},
                {"max_duration": "1"}, {"devices": [0]}):
        with pytest.raises(ValueError):
            profiler.benchmark(**{"func": cp.sum, "args": (a,), "n_repeat": 1, **bad})


def test_time_range(cp):
    from gpuremote.cupyx import profiler
    from gpuremote.hook import CupyAliasFinder
    assert CupyAliasFinder().find_spec("cupyx.profiler", None) is not None       # `import cupyx.profiler`

    @profiler.time_range()
    def double(x):
        return x * 2
    assert double.__name__ == "double" and double(cp.arange(2)).get().tolist() == [0, 2]
    with profiler.time_range("block", color_id=1, sync=True) as r:
        assert r.message == "block"
    with pytest.raises(ValueError):
        profiler.time_range("x", color_id=1, argb_color=0xFF00FF00)
    with pytest.raises(ValueError):
        with profiler.time_range():
            pass


def test_rsqrt(cp):
    import gpuremote.cupyx as cupyx
    for host in (np.array([1.0, 4.0, 0.25]), np.array([1, 4, 16], np.int8), np.array([1, 9], np.int32),
                 np.array([4.0], np.float32), np.array([1j, 4])):
        got = cupyx.rsqrt(cp.asarray(host))
        want = 1 / np.sqrt(host)
        assert got.dtype == want.dtype, host.dtype
        np.testing.assert_allclose(got.get(), want, rtol=1e-3 if want.dtype == np.float16 else 1e-6)
    out = cp.empty(2)
    assert cupyx.rsqrt(cp.asarray([4.0, 16.0]), out=out) is out
    np.testing.assert_allclose(out.get(), [0.5, 0.25])
