"""NumPy/gpuremote.cupy equivalence: the same test body runs with xp=numpy and xp=gpuremote.cupy.

Modelled on `cupy.testing.numpy_cupy_allclose`: `check(body, cp)` calls `body(numpy, rng)` and
`body(cp, rng)` with identically seeded generators (inputs are made on the host with the rng and
moved with `xp.asarray`), fetches the device results with `.get()` and compares values, shapes
and dtypes -- both the proxy's client-side metadata (derived without a round trip) and the
fetched array's. The daemon runs with GPUREMOTE_STRICT_META=1, so a wrong metadata rule also
fails at the `.get()` with an AssertionError naming the rule.

Random draws cannot be compared with NumPy's; they are checked for reproducibility under
`cupy.random.seed`, for shape, dtype and range instead.
"""

from __future__ import annotations

import operator

import numpy
import numpy as np
import pytest

F32, F64, I32, I64, B, C64 = (np.dtype(t) for t in ("float32", "float64", "int32", "int64", "bool", "complex64"))
DTYPES = [F32, F64, I32, I64, B, C64]


# ------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------

def host(rng, shape=(4, 5), dtype=F64, low=-5.0, high=5.0, nonzero=False, special=False):
    """Random host data of `dtype` in [low, high] (ints: the integers in that range)."""
    dtype = np.dtype(dtype)
    shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
    if dtype.kind == "b":
        out = rng.random(shape) < 0.5
        if nonzero:
            out[...] = True
    elif dtype.kind in "iu":
        out = rng.integers(int(np.ceil(low)), int(np.floor(high)), size=shape, endpoint=True)
        if nonzero:
            out[out == 0] = 1
    else:
        out = rng.uniform(low, high, shape)
        if dtype.kind == "c":
            out = out + 1j * rng.uniform(low, high, shape)
        if nonzero:
            out[abs(out) < 0.25] = 0.5
    out = np.asarray(out).astype(dtype)
    if special and dtype.kind in "fc" and out.size >= 5:
        flat = out.reshape(-1)
        flat[[0, 1, 2, 3]] = [np.nan, np.inf, -np.inf, -0.0]
    return out


def arr(xp, rng, shape=(4, 5), dtype=F64, **kw):
    """Random data made on the host and moved with xp.asarray (numpy: itself)."""
    return xp.asarray(host(rng, shape, dtype, **kw))


def spd(xp, rng, n=4, dtype=F64, batch=()):
    """A symmetric (Hermitian) positive definite, well-conditioned matrix."""
    m = rng.standard_normal(batch + (n, n))
    if np.dtype(dtype).kind == "c":
        m = m + 1j * rng.standard_normal(batch + (n, n))
    a = m @ np.conj(np.swapaxes(m, -1, -2)) + n * np.eye(n)
    return xp.asarray(a.astype(dtype))


def wellcond(xp, rng, n=4, dtype=F64, batch=()):
    """A general well-conditioned square matrix (diagonally dominant)."""
    a = rng.standard_normal(batch + (n, n)) + 2 * n * np.eye(n)
    return xp.asarray(a.astype(dtype))


def _tol(dtype, rtol, atol):
    low = np.dtype(dtype) in (np.dtype(np.float16), F32, C64)
    return (rtol if rtol is not None else (1e-5 if low else 1e-12),
            atol if atol is not None else (1e-5 if low else 1e-12))


def _compare(expected, actual, cp, rtol, atol, values, path):
    if isinstance(expected, (tuple, list)):
        assert isinstance(actual, (tuple, list)), f"{path}: NumPy gave a {type(expected).__name__}, " \
                                                  f"the device a {type(actual).__name__}"
        assert isinstance(actual, list) == isinstance(expected, list), \
            f"{path}: NumPy gave a {type(expected).__name__}, the device a {type(actual).__name__}"
        assert len(actual) == len(expected), f"{path}: {len(expected)} items expected, got {len(actual)}"
        for i, (e, a) in enumerate(zip(expected, actual)):
            _compare(e, a, cp, rtol, atol, values, f"{path}[{i}]")
        return
    if isinstance(expected, (numpy.ndarray, numpy.generic)):
        assert type(actual) is cp.ndarray, f"{path}: expected a device array, got {type(actual).__name__}"
        eshape, edtype = tuple(expected.shape), expected.dtype
        # client-side metadata (derived by gpuremote.meta, or fetched) before the data
        assert actual.shape == eshape, f"{path}: shape {actual.shape} != NumPy's {eshape}"
        assert actual.dtype == edtype, f"{path}: dtype {actual.dtype} != NumPy's {edtype}"
        got = actual.get()
        assert isinstance(got, numpy.ndarray)
        assert got.shape == eshape, f"{path}: fetched shape {got.shape} != NumPy's {eshape}"
        assert got.dtype == edtype, f"{path}: fetched dtype {got.dtype} != NumPy's {edtype}"
        if values:
            exp = numpy.asarray(expected)
            if edtype.kind in "fc":
                r, a = _tol(edtype, rtol, atol)
                numpy.testing.assert_allclose(got, exp, rtol=r, atol=a, err_msg=path)
            else:
                numpy.testing.assert_array_equal(got, exp, err_msg=path)
        return
    assert type(actual) is not cp.ndarray, f"{path}: NumPy gave {expected!r}, the device an array"
    assert type(actual) is type(expected), \
        f"{path}: NumPy gave a {type(expected).__name__}, the device a {type(actual).__name__}"
    if values:
        if isinstance(expected, (float, complex)):
            r, a = _tol(F64, rtol, atol)
            numpy.testing.assert_allclose(actual, expected, rtol=r, atol=a, err_msg=path)
        else:
            assert actual == expected, f"{path}: {actual!r} != NumPy's {expected!r}"


def _no_device(obj, cp):
    if isinstance(obj, (tuple, list)):
        return all(_no_device(x, cp) for x in obj)
    return type(obj) is not cp.ndarray


# The device runs each body this many times: the client sends a call in full the first time,
# defines a call template of it the second, and replays the template from the third on
# (gpuremote/client/session.py), so every case checks all three paths.
RUNS = 3


def check(body, cp, rtol=None, atol=None, values=True, seed=0):
    """Run `body(xp, rng)` with NumPy and with the device; compare results (numpy_cupy_allclose)."""
    expected = body(numpy, numpy.random.default_rng(seed))
    assert _no_device(expected, cp), "the NumPy run produced a device array"
    for run in range(RUNS):
        actual = body(cp, numpy.random.default_rng(seed))
        _compare(expected, actual, cp, rtol, atol, values, f"result (device run {run + 1})")
        cp.cuda.Device().synchronize()  # no deferred error may leak into the next run or test
    return actual


def _sync(obj, cp):
    if isinstance(obj, (tuple, list)):
        for x in obj:
            _sync(x, cp)
    elif type(obj) is cp.ndarray:
        obj.get()
    cp.cuda.Device().synchronize()  # a sync point: errors of ops that returned nothing surface here


def check_raises(body, cp, exc, seed=0):
    """Both runs raise `exc` (the device's may surface at the next sync point)."""
    with pytest.raises(exc):
        body(numpy, numpy.random.default_rng(seed))
    for _ in range(RUNS):
        with pytest.raises(exc):
            _sync(body(cp, numpy.random.default_rng(seed)), cp)


def params(cases: dict):
    """dict name -> body | (body, check kwargs) | (body, kwargs, marks) -> pytest params."""
    out = []
    for name, v in cases.items():
        if callable(v):
            body, kw, marks = v, {}, ()
        elif len(v) == 2:
            (body, kw), marks = v, ()
        else:
            body, kw, marks = v
        out.append(pytest.param(body, kw, id=name, marks=marks))
    return out


def tol(body, **kw):
    return (body, kw)


# ------------------------------------------------------------------------------------------
# creation
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fn", ["zeros", "ones", "empty"])
def test_zeros_ones_empty(cp, fn, dtype):
    check(lambda xp, rng: getattr(xp, fn)((2, 3), dtype=dtype), cp, values=fn != "empty")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_full_dtype(cp, dtype):
    check(lambda xp, rng: xp.full((3, 2), 3, dtype=dtype), cp)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_like_dtype(cp, dtype):
    def body(xp, rng):
        a = arr(xp, rng, (3, 4), F32)
        return (xp.zeros_like(a, dtype=dtype), xp.ones_like(a, dtype=dtype),
                xp.full_like(a, 2, dtype=dtype), (lambda e: (e.shape, e.dtype.str))(xp.empty_like(a, dtype=dtype)))
    check(body, cp)


CREATION = {
    "zeros-int-shape": lambda xp, rng: xp.zeros(5),
    "zeros-0d": lambda xp, rng: xp.zeros(()),
    "zeros-list-shape": lambda xp, rng: xp.zeros([2, 0, 3], dtype="int32"),
    "ones-default": lambda xp, rng: xp.ones((2, 2, 2)),
    "empty-default": (lambda xp, rng: xp.empty((4, 1)), {"values": False}),
    "full-float-fill": lambda xp, rng: xp.full((2, 3), 2.5),
    "full-int-fill": lambda xp, rng: xp.full(4, 7),
    "full-bool-fill": lambda xp, rng: xp.full((2,), True),
    "full-complex-fill": lambda xp, rng: xp.full((2, 2), 1 + 2j),
    "full-cast-fill": lambda xp, rng: xp.full((3,), 2.7, dtype=np.int32),
    "full-0d": lambda xp, rng: xp.full((), -1.5, dtype=np.float32),
    "eye-n": lambda xp, rng: xp.eye(4),
    "eye-nm": lambda xp, rng: xp.eye(3, 5),
    "eye-k": lambda xp, rng: xp.eye(4, 4, 1),
    "eye-k-neg-kw": lambda xp, rng: xp.eye(4, M=3, k=-2, dtype=np.int32),
    "eye-bool": lambda xp, rng: xp.eye(3, dtype=bool),
    "identity": lambda xp, rng: xp.identity(3),
    "identity-dtype": lambda xp, rng: xp.identity(4, dtype=np.complex64),
    "arange-stop": lambda xp, rng: xp.arange(10),
    "arange-start-stop-step": lambda xp, rng: xp.arange(2, 17, 3),
    "arange-negative-step": lambda xp, rng: xp.arange(10, 0, -2),
    "arange-empty": lambda xp, rng: xp.arange(5, 2),
    "arange-float": lambda xp, rng: xp.arange(0, 1, 0.1),
    "arange-float-stop": lambda xp, rng: xp.arange(4.5),
    "arange-float-negative": lambda xp, rng: xp.arange(3.0, -2.0, -0.75),
    "arange-dtype": lambda xp, rng: xp.arange(6, dtype=np.float32),
    "arange-dtype-kw": lambda xp, rng: xp.arange(1, 8, 2, dtype="int32"),
    "arange-np-scalar": lambda xp, rng: xp.arange(np.float32(0.5), 3),
    "arange-np-int32-scalar": lambda xp, rng: xp.arange(np.int32(5)),
    "arange-float32-arithmetic": lambda xp, rng: xp.arange(np.float32(1.0), np.float32(1.6), np.float32(0.2)),
    "arange-float32-arithmetic-2": lambda xp, rng: xp.arange(np.float32(-0.6), np.float32(3.0), np.float32(0.9)),
    "linspace": lambda xp, rng: xp.linspace(0, 1, 7),
    "linspace-no-endpoint": lambda xp, rng: xp.linspace(0, 10, 5, endpoint=False),
    "linspace-f32": lambda xp, rng: xp.linspace(-1, 1, num=9, dtype=np.float32),
    "linspace-int": lambda xp, rng: xp.linspace(0, 10, 6, dtype=np.int32),
    "linspace-default-num": lambda xp, rng: xp.linspace(2.0, 3.0),
    "linspace-retstep": lambda xp, rng: (lambda r: (r[0], float(r[1]), type(r[1]) in (float, np.float64)))(
        xp.linspace(2, 3, num=5, retstep=True)),
    "linspace-retstep-no-endpoint": lambda xp, rng: (lambda r: (r[0], float(r[1])))(
        xp.linspace(-1.0, 4, 4, False, True, np.float32)),
    "linspace-retstep-single": lambda xp, rng: (lambda r: (r[0], bool(np.isnan(float(r[1])))))(
        xp.linspace(0, 1, 1, retstep=True)),
    "logspace": lambda xp, rng: xp.logspace(0, 2, 5),
    "logspace-base": lambda xp, rng: xp.logspace(0, 3, 4, base=2.0),
    "logspace-f32": lambda xp, rng: xp.logspace(-1, 1, 3, dtype=np.float32),
    "zeros_like": lambda xp, rng: xp.zeros_like(arr(xp, rng, (2, 5), I32)),
    "ones_like": lambda xp, rng: xp.ones_like(arr(xp, rng, (3,), C64)),
    "full_like-cast": lambda xp, rng: xp.full_like(arr(xp, rng, (2, 2), I64), 2.7),
    "full_like-nan": lambda xp, rng: xp.full_like(arr(xp, rng, (2, 2), F32), np.nan),
    "empty_like": (lambda xp, rng: xp.empty_like(arr(xp, rng, (2, 3), F32)), {"values": False}),
    "zeros_like-shape": lambda xp, rng: xp.zeros_like(arr(xp, rng, (2, 3)), shape=(4, 1)),
    "array-list": lambda xp, rng: xp.array([[1, 2], [3, 4]]),
    "array-list-float": lambda xp, rng: xp.array([1.5, 2, 3]),
    "array-list-dtype": lambda xp, rng: xp.array([1.5, 2, 3], dtype=np.float32),
    "array-bool-list": lambda xp, rng: xp.array([True, False, True]),
    "array-complex-list": lambda xp, rng: xp.array([1 + 2j, 3]),
    "array-scalar": lambda xp, rng: xp.array(3.25),
    "array-host": lambda xp, rng: xp.array(host(rng, (3, 4), I32)),
    "array-ndmin": lambda xp, rng: xp.array(host(rng, (3,)), ndmin=3),
    "array-of-device": lambda xp, rng: xp.array(arr(xp, rng, (2, 3)), dtype=np.int32),
    "array-of-device-ndmin": lambda xp, rng: xp.array(arr(xp, rng, (3,)), ndmin=2),
    "asarray-list": lambda xp, rng: xp.asarray([[1.0, 2.0], [3.0, 4.0]]),
    "asarray-host-dtype": lambda xp, rng: xp.asarray(host(rng, (5,)), dtype=np.float32),
    "asarray-device-dtype": lambda xp, rng: xp.asarray(arr(xp, rng, (5,)), dtype=np.complex64),
    "zeros-python-int": lambda xp, rng: xp.zeros(3, dtype=int),
    "ones-python-complex": lambda xp, rng: xp.ones((2,), dtype=complex),
    "full-python-bool": lambda xp, rng: xp.full(2, 1, dtype=bool),
    "arange-python-float": lambda xp, rng: xp.arange(3, dtype=float),
    "eye-python-int": lambda xp, rng: xp.eye(2, dtype=int),
    "zeros-dtype-str": lambda xp, rng: xp.zeros(4, dtype="i4"),
    "ones-dtype-str-endian": lambda xp, rng: xp.ones(4, dtype="<f4"),
    "full-np-scalar-fill": lambda xp, rng: xp.full((2, 2), np.float32(1.5)),
    "full-device-fill": lambda xp, rng: xp.full((2, 3), arr(xp, rng, (), I32)),
    "linspace-array-endpoints": lambda xp, rng: xp.linspace(arr(xp, rng, (2,)), 5.0, 4),
    "linspace-array-retstep": lambda xp, rng: xp.linspace(arr(xp, rng, (3,)), arr(xp, rng, (3,)), 3,
                                                          retstep=True),
    "logspace-no-endpoint": lambda xp, rng: xp.logspace(0, 1, 4, endpoint=False),
    "copy": lambda xp, rng: xp.copy(arr(xp, rng, (3, 3), C64)),
    "copy-host": lambda xp, rng: xp.copy(host(rng, (3,))),
}


@pytest.mark.parametrize("body,kw", params(CREATION))
def test_creation(cp, body, kw):
    check(body, cp, **kw)


@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")
def test_creation_errors(cp):
    check_raises(lambda xp, rng: xp.arange(0, 5, 0), cp, ZeroDivisionError)
    check_raises(lambda xp, rng: xp.arange(0.5, 5.0, 0.0), cp, ZeroDivisionError)
    check_raises(lambda xp, rng: xp.arange(np.float64(0.5), 5, 0), cp, ValueError)
    check_raises(lambda xp, rng: xp.zeros((2, -1)), cp, ValueError)
    check_raises(lambda xp, rng: xp.linspace(0, 1, -1), cp, ValueError)
    check_raises(lambda xp, rng: xp.eye(-2), cp, ValueError)


@pytest.mark.xfail(reason="Python ints outside int64 cannot be encoded on the wire (gpuremote/wire/codec.py "
                          "raises OverflowError); NumPy and CuPy accept them as weak scalars", strict=True)
def test_python_int_beyond_int64_as_operand(cp):
    check(lambda xp, rng: arr(xp, rng, (3,)) + 2 ** 63, cp)


def test_asarray_returns_the_same_array(cp):
    def body(xp, rng):
        a = arr(xp, rng, (3,), F32)
        return xp.asarray(a) is a, xp.asarray(a, dtype=np.float32) is a, xp.asarray(a, dtype=np.float64) is a
    check(body, cp)


@pytest.mark.parametrize("how", ["array", "copy", "method", "array-copy"])
def test_copies_are_independent(cp, how):
    def body(xp, rng):
        a = arr(xp, rng, (2, 3))
        b = {"array": lambda: xp.array(a), "copy": lambda: xp.copy(a), "method": a.copy,
             "array-copy": lambda: xp.array(a, copy=True)}[how]()
        b[0, 0] = 100.0
        a[1, 1] = -100.0
        return a, b
    check(body, cp)


# ------------------------------------------------------------------------------------------
# elementwise math: unary
# ------------------------------------------------------------------------------------------

# name, dtypes, input options
UNARY = [
    ("negative", [F32, F64, I32, I64, C64], {}),
    ("positive", [F64, I32], {}),
    ("absolute", [F32, I32, I64, C64], {}),
    ("abs", [F64], {}),
    ("fabs", [F32], {}),
    ("sign", [F64, I32], {}),
    ("sqrt", [F32, F64, I32, C64], {"low": 0, "high": 9}),
    ("square", [F32, I64, C64], {}),
    ("cbrt", [F64], {}),
    ("reciprocal", [F32, F64], {"nonzero": True}),
    ("exp", [F32, F64, C64], {"low": -3, "high": 3}),
    ("exp2", [F64], {}),
    ("expm1", [F32], {"low": -1, "high": 1}),
    ("log", [F32, F64, I32, C64], {"low": 0.1, "high": 9}),
    ("log2", [F64], {"low": 0.1, "high": 9}),
    ("log10", [F32], {"low": 0.1, "high": 9}),
    ("log1p", [F64], {"low": -0.5, "high": 9}),
    ("sin", [F32, F64, C64], {}),
    ("cos", [F64, I64], {}),
    ("tan", [F64], {"low": -1.2, "high": 1.2}),
    ("arcsin", [F32, F64], {"low": -0.95, "high": 0.95}),
    ("arccos", [F64], {"low": -0.95, "high": 0.95}),
    ("arctan", [F64], {}),
    ("sinh", [F64], {"low": -3, "high": 3}),
    ("cosh", [F32], {"low": -3, "high": 3}),
    ("tanh", [F64, C64], {"low": -3, "high": 3}),
    ("arcsinh", [F64], {}),
    ("arccosh", [F64], {"low": 1.1, "high": 9}),
    ("arctanh", [F64], {"low": -0.95, "high": 0.95}),
    ("deg2rad", [F64], {}),
    ("rad2deg", [F32], {}),
    ("degrees", [F64], {}),
    ("radians", [F64], {}),
    ("floor", [F32, F64], {}),
    ("ceil", [F64], {}),
    ("trunc", [F64], {}),
    ("rint", [F32], {}),
    ("fix", [F64], {}),
    ("isnan", [F32, F64, C64], {"special": True}),
    ("isinf", [F64], {"special": True}),
    ("isfinite", [F32, I32], {"special": True}),
    ("signbit", [F64], {"special": True}),
    ("conj", [C64, F64], {}),
    ("conjugate", [C64], {}),
    ("angle", [C64, F64], {}),
    ("real", [C64, F32], {}),
    ("imag", [C64], {}),
    ("sinc", [F64], {}),
    ("i0", [F64], {}),
    ("spacing", [F32], {}),
    ("around", [F64], {}),
    ("round", [F32], {}),
    ("nan_to_num", [F64, C64], {"special": True}),
    ("logical_not", [B, F64], {}),
    ("invert", [I32, B], {}),
    ("bitwise_not", [I64], {}),
]


def _unary_params():
    out = []
    for name, dtypes, opts in UNARY:
        for dt in dtypes:
            out.append(pytest.param(name, dt, opts, id=f"{name}-{dt}"))
    return out


@pytest.mark.parametrize("name,dtype,opts", _unary_params())
def test_unary(cp, name, dtype, opts):
    check(lambda xp, rng: getattr(xp, name)(arr(xp, rng, (4, 5), dtype, **opts)), cp)


@pytest.mark.parametrize("name,dtype,opts", [
    ("sqrt", F64, {"low": 0}), ("exp", F32, {"low": -2, "high": 2}), ("negative", I32, {}),
    ("floor", F64, {}), ("isnan", F32, {"special": True}), ("absolute", C64, {}),
])
def test_unary_out(cp, name, dtype, opts):
    def body(xp, rng):
        a = arr(xp, rng, (3, 4), dtype, **opts)
        o = xp.zeros((3, 4), getattr(np, name)(np.zeros((), dtype)).dtype)
        r = getattr(xp, name)(a, out=o)
        return r is o, o
    check(body, cp)


@pytest.mark.parametrize("name", ["modf", "frexp"])
@pytest.mark.parametrize("dtype", [F32, F64], ids=str)
def test_unary_two_outputs(cp, name, dtype):
    check(lambda xp, rng: getattr(xp, name)(arr(xp, rng, (3, 4), dtype)), cp)


@pytest.mark.parametrize("decimals", [0, 1, 2, -1])
@pytest.mark.parametrize("dtype", [F64, F32, I64], ids=str)
def test_round_decimals(cp, decimals, dtype):
    check(lambda xp, rng: xp.round(arr(xp, rng, (10,), dtype, low=-500, high=500), decimals), cp)


# ------------------------------------------------------------------------------------------
# elementwise math: binary, with scalars, broadcasting and out=
# ------------------------------------------------------------------------------------------

def _binary_inputs(xp, rng, name, da, db, form):
    opts_b = {"nonzero": True} if name in ("divide", "true_divide", "floor_divide", "remainder", "mod",
                                           "fmod", "gcd", "lcm", "divmod") else {}
    opts_a = {}
    if name in ("power", "float_power"):
        opts_a = {"low": 0.5, "high": 2} if np.dtype(da).kind == "f" else {"low": -3, "high": 3}
        opts_b = {"low": -2, "high": 2} if np.dtype(db).kind == "f" else {"low": 0, "high": 3}
    if name == "ldexp":
        opts_b = {"low": -3, "high": 3}
    shape_a, shape_b = {"aa": ((3, 4), (3, 4)), "bcast": ((2, 3, 4), (3, 1)), "row": ((3, 4), (4,)),
                        "0d": ((3, 4), ())}.get(form, ((3, 4), None))
    a = arr(xp, rng, shape_a, da, **opts_a)
    if form == "as":
        return a, (2 if np.dtype(db).kind in "iub" or name in ("power", "ldexp") else 1.75)
    if form == "sa":
        return (3 if np.dtype(db).kind in "iub" or name in ("power", "ldexp") else 1.25), a
    return a, arr(xp, rng, shape_b, db, **opts_b)


BINARY = [  # name, [(dtype a, dtype b)], forms
    ("add", [(F32, F32), (F64, I32), (I32, I64), (B, B), (C64, F32), (F32, F64), (I32, B)],
     ["aa", "bcast", "as", "sa", "0d"]),
    ("subtract", [(F32, F32), (I64, I32), (C64, C64)], ["aa", "bcast", "as", "sa"]),
    ("multiply", [(F64, F64), (I32, I32), (B, B), (F32, I32)], ["aa", "row", "as", "sa"]),
    ("divide", [(F64, F64), (I32, I32), (F32, F32)], ["aa", "bcast", "as", "sa"]),
    ("true_divide", [(F32, F64)], ["aa"]),
    ("floor_divide", [(F64, F64), (I32, I32), (I64, I64)], ["aa", "as", "sa"]),
    ("power", [(F64, F64), (I32, I32), (F32, I32)], ["aa", "as", "sa"]),
    ("float_power", [(I32, I32), (F32, F32)], ["aa"]),
    ("remainder", [(F64, F64), (I32, I32)], ["aa", "as", "sa"]),
    ("mod", [(I64, I64)], ["aa"]),
    ("fmod", [(F64, F64), (I32, I32)], ["aa", "as"]),
    ("arctan2", [(F64, F64), (F32, F32)], ["aa", "bcast"]),
    ("hypot", [(F32, F32)], ["aa", "as"]),
    ("maximum", [(F64, F64), (I32, F32), (I64, I64)], ["aa", "row", "as", "sa"]),
    ("minimum", [(F32, F32), (B, B)], ["aa", "as"]),
    ("fmax", [(F64, F64)], ["aa"]),
    ("fmin", [(F64, F64)], ["aa"]),
    ("copysign", [(F64, F64)], ["aa", "as"]),
    ("nextafter", [(F32, F32)], ["aa"]),
    ("ldexp", [(F64, I32)], ["aa", "as"]),
    ("gcd", [(I32, I32), (I64, I64)], ["aa", "as"]),
    ("lcm", [(I32, I32)], ["aa"]),
    ("heaviside", [(F64, F64)], ["aa", "as"]),
    ("logaddexp", [(F64, F64)], ["aa"]),
    ("logaddexp2", [(F32, F32)], ["aa"]),
    ("isclose", [(F64, F64)], ["aa", "as"]),
    ("divmod", [(F64, F64), (I32, I32)], ["aa", "as"]),
]


def _binary_params(table):
    out = []
    for name, pairs, forms in table:
        for i, (da, db) in enumerate(pairs):
            for form in (forms if i == 0 else forms[:1] + [f for f in forms if f in ("as",)][:1]):
                out.append(pytest.param(name, da, db, form, id=f"{name}-{da}-{db}-{form}"))
    return out


@pytest.mark.parametrize("name,da,db,form", _binary_params(BINARY))
def test_binary(cp, name, da, db, form):
    check(lambda xp, rng: getattr(xp, name)(*_binary_inputs(xp, rng, name, da, db, form)), cp)


@pytest.mark.parametrize("name,da,db", [
    ("add", F64, F64), ("multiply", F32, I32), ("subtract", I32, I32), ("divide", F64, I64),
    ("maximum", F64, F64), ("power", F64, F64), ("greater", F32, F32), ("bitwise_and", I32, I32),
])
def test_binary_out(cp, name, da, db):
    def body(xp, rng):
        a, b = _binary_inputs(xp, rng, name, da, db, "bcast")
        rt = getattr(np, name)(np.ones((), da), np.ones((), db)).dtype
        o = xp.ones((2, 3, 4), rt)
        r = getattr(xp, name)(a, b, out=o)
        return r is o, o
    check(body, cp)


def test_binary_out_casts_to_out_dtype(cp):
    def body(xp, rng):
        a, b = arr(xp, rng, (5,), I32), arr(xp, rng, (5,), I32)
        o = xp.zeros((5,), np.float64)
        xp.add(a, b, out=o)
        return o
    check(body, cp)


def test_binary_scalar_promotion_table(cp):
    # NumPy 2 (NEP 50): Python scalars are weak, NumPy scalars are not
    def body(xp, rng):
        f32, i32, b = arr(xp, rng, (3,), F32), arr(xp, rng, (3,), I32), arr(xp, rng, (3,), B)
        return (f32 + 2, f32 * 2.5, i32 + 3, i32 * 1.5, b + 1, b * 1.5, f32 + np.float64(1.0),
                i32 + np.int64(2), f32 + 1j, i32 - True)
    check(body, cp)


@pytest.mark.parametrize("name", ["clip", "where"])
def test_three_argument_elementwise(cp, name):
    def body(xp, rng):
        a = arr(xp, rng, (3, 4))
        if name == "clip":
            return xp.clip(a, -1, 2), xp.clip(a, arr(xp, rng, (4,), low=-3, high=0), 1.5), \
                xp.clip(arr(xp, rng, (5,), I32), 0, 3)
        c = arr(xp, rng, (3, 4), B)
        return xp.where(c, a, 0.5), xp.where(c, a, arr(xp, rng, (4,), F32)), \
            xp.where(arr(xp, rng, (3, 1), B), arr(xp, rng, (4,), I32), 7)
    check(body, cp)


# ------------------------------------------------------------------------------------------
# comparison, bitwise, logical
# ------------------------------------------------------------------------------------------

COMPARISON = [
    (name, [(F64, F64), (I32, F32), (I64, I64), (B, B), (C64, C64)], ["aa", "bcast", "as", "sa"])
    for name in ("greater", "greater_equal", "less", "less_equal", "equal", "not_equal")
]
BITWISE = [
    ("bitwise_and", [(I32, I32), (I64, I32), (B, B)], ["aa", "bcast", "as", "sa"]),
    ("bitwise_or", [(I64, I64), (B, B)], ["aa", "as"]),
    ("bitwise_xor", [(I32, I32), (B, B)], ["aa", "sa"]),
    ("logical_and", [(B, B), (F64, I32)], ["aa", "as"]),
    ("logical_or", [(B, B), (F32, F32)], ["aa", "bcast"]),
    ("logical_xor", [(B, B)], ["aa", "as"]),
]


def _cmp_inputs(xp, rng, da, db, form):
    # small integers, so that equal elements occur
    kw = {"low": -2, "high": 2}
    shape_a, shape_b = {"aa": ((3, 4), (3, 4)), "bcast": ((2, 3, 4), (3, 1))}.get(form, ((3, 4), None))
    a = xp.asarray(np.round(host(rng, shape_a, F64, **kw)).astype(da))
    if form == "as":
        return a, 1
    if form == "sa":
        return 0, a
    return a, xp.asarray(np.round(host(rng, shape_b, F64, **kw)).astype(db))


@pytest.mark.parametrize("name,da,db,form", _binary_params(COMPARISON) + _binary_params(BITWISE))
def test_comparison_bitwise_logical(cp, name, da, db, form):
    check(lambda xp, rng: getattr(xp, name)(*_cmp_inputs(xp, rng, da, db, form)), cp)


@pytest.mark.parametrize("name", ["left_shift", "right_shift"])
@pytest.mark.parametrize("dtype", [I32, I64], ids=str)
def test_shifts(cp, name, dtype):
    def body(xp, rng):
        a = arr(xp, rng, (3, 4), dtype, low=-100, high=100)
        s = arr(xp, rng, (3, 4), dtype, low=0, high=5)
        return getattr(xp, name)(a, s), getattr(xp, name)(a, 2), getattr(xp, name)(1, s)
    check(body, cp)


def test_isclose_allclose_array_equal(cp):
    def body(xp, rng):
        a = arr(xp, rng, (3, 4))
        b = a + arr(xp, rng, (3, 4), low=-1e-9, high=1e-9)
        # NumPy returns Python bools from allclose/array_equal, CuPy 0-d arrays: compare via bool()
        return (xp.isclose(a, b), bool(xp.allclose(a, b)), bool(xp.allclose(a, b + 1)),
                bool(xp.array_equal(a, a)), bool(xp.array_equal(a, b + 1)), xp.isclose(a, b, rtol=0, atol=0))
    check(body, cp)


# ------------------------------------------------------------------------------------------
# reductions
# ------------------------------------------------------------------------------------------

AXES = [(None, False), (None, True), (0, False), (1, True), (-1, False), ((0, 2), False), ((2, 0), True),
        ((), False)]
REDUCERS = ["sum", "prod", "mean", "std", "var", "max", "min", "any", "all", "amax", "nansum",
            "count_nonzero"]


def _reduce_params():
    out = []
    for name in REDUCERS:
        for axis, keep in AXES:
            if name == "count_nonzero" and axis == ():
                continue
            out.append(pytest.param(name, axis, keep, id=f"{name}-axis={axis}-keepdims={keep}"))
    for name in ("argmax", "argmin"):
        for axis, keep in [(None, False), (None, True), (0, False), (-1, True), (1, False)]:
            out.append(pytest.param(name, axis, keep, id=f"{name}-axis={axis}-keepdims={keep}"))
    return out


@pytest.mark.parametrize("name,axis,keepdims", _reduce_params())
def test_reduce_axes(cp, name, axis, keepdims):
    def body(xp, rng):
        a = arr(xp, rng, (3, 4, 5), low=0.5, high=1.5)
        return getattr(xp, name)(a, axis=axis, keepdims=keepdims)
    check(body, cp)


@pytest.mark.parametrize("name,dtype", [
    pytest.param(n, d, id=f"{n}-{d}") for n in ["sum", "prod", "mean", "std", "var", "max", "min", "argmax", "any",
                                                "all"]
    for d in [F32, I32, I64, B, C64] if not (d == C64 and n in ("max", "min", "argmax"))])
def test_reduce_dtypes(cp, name, dtype):
    def body(xp, rng):
        a = arr(xp, rng, (4, 6), dtype, low=-3, high=3)
        return getattr(xp, name)(a, axis=1), getattr(xp, name)(a)
    check(body, cp)


REDUCE_EXTRA = {
    "sum-dtype": lambda xp, rng: xp.sum(arr(xp, rng, (4, 5), I32), axis=0, dtype=np.float32),
    "sum-positional-axis": lambda xp, rng: xp.sum(arr(xp, rng, (4, 5)), 1),
    "sum-0d": lambda xp, rng: xp.sum(arr(xp, rng, ())),
    "sum-empty": lambda xp, rng: xp.sum(arr(xp, rng, (0, 3)), axis=0),
    "prod-empty": lambda xp, rng: xp.prod(arr(xp, rng, (0,), I32)),
    "mean-dtype": lambda xp, rng: xp.mean(arr(xp, rng, (4, 5), F32), axis=-1, dtype=np.float64),
    "std-ddof": lambda xp, rng: xp.std(arr(xp, rng, (4, 5)), axis=0, ddof=1),
    "var-ddof-keepdims": lambda xp, rng: xp.var(arr(xp, rng, (4, 5)), axis=1, ddof=2, keepdims=True),
    "max-int-neg-axis": lambda xp, rng: xp.max(arr(xp, rng, (2, 3, 4), I64), axis=-2),
    "amin": lambda xp, rng: xp.amin(arr(xp, rng, (2, 3, 4)), axis=(0, 1)),
    "ptp": lambda xp, rng: xp.ptp(arr(xp, rng, (3, 4)), axis=1),
    "nanmean": lambda xp, rng: xp.nanmean(arr(xp, rng, (4, 5), special=False) * xp.asarray(
        [1.0, np.nan, 1.0, 1.0, 1.0]), axis=1),
    "nanmax": lambda xp, rng: xp.nanmax(xp.asarray([[1.0, np.nan, 3.0], [np.nan, -1.0, 0.5]]), axis=0),
    "nanmin": lambda xp, rng: xp.nanmin(xp.asarray([[1.0, np.nan, 3.0], [np.nan, -1.0, 0.5]])),
    "nanargmax": lambda xp, rng: xp.nanargmax(xp.asarray([[1.0, np.nan, 3.0], [np.nan, -1.0, 0.5]]), axis=1),
    "nanstd": lambda xp, rng: xp.nanstd(xp.asarray([[1.0, np.nan, 3.0], [np.nan, -1.0, 0.5]]), axis=1),
    "nanprod": lambda xp, rng: xp.nanprod(xp.asarray([[1.0, np.nan, 3.0], [np.nan, -1.0, 0.5]]), axis=1),
    "count_nonzero-int": lambda xp, rng: xp.count_nonzero(arr(xp, rng, (4, 5), I32, low=-1, high=1), axis=1),
    "median": lambda xp, rng: xp.median(arr(xp, rng, (5, 4)), axis=0),
    "average": lambda xp, rng: xp.average(arr(xp, rng, (5, 4)), axis=1, weights=arr(xp, rng, (4,), low=0.1)),
    "percentile": lambda xp, rng: xp.percentile(arr(xp, rng, (20,)), [10, 50, 90]),
    "trace": lambda xp, rng: xp.trace(arr(xp, rng, (4, 4), I32)),
}


@pytest.mark.parametrize("body,kw", params(REDUCE_EXTRA))
def test_reduce_extra(cp, body, kw):
    check(body, cp, **kw)


def _at(method, shape, index, value):
    """`method.at` on a fresh array, which the body returns (an in-place op's result is its array);
    a list `value` goes to the device as an array."""
    def body(xp, rng):
        a = arr(xp, rng, shape)
        getattr(xp, method).at(a, xp.asarray(index), xp.asarray(value) if type(value) is list else value)
        return a
    return body


UFUNC_METHOD_CASES = {
    "add.reduce": lambda xp, rng: xp.add.reduce(arr(xp, rng, (3, 4))),
    "add.reduce-axis1-keepdims": lambda xp, rng: xp.add.reduce(arr(xp, rng, (3, 4)), axis=1, keepdims=True),
    "add.reduce-dtype": lambda xp, rng: xp.add.reduce(arr(xp, rng, (3, 4), I32), dtype=np.float32),
    "multiply.reduce-int": lambda xp, rng: xp.multiply.reduce(arr(xp, rng, (3, 4), I32, low=-2, high=2), axis=1),
    "maximum.reduce-all": lambda xp, rng: xp.maximum.reduce(arr(xp, rng, (3, 4)), axis=None),
    "logical_or.reduce": lambda xp, rng: xp.logical_or.reduce(arr(xp, rng, (3, 4), B)),
    "bitwise_xor.reduce": lambda xp, rng: xp.bitwise_xor.reduce(arr(xp, rng, (5,), I32, low=0, high=50)),
    "add.accumulate": lambda xp, rng: xp.add.accumulate(arr(xp, rng, (3, 4))),
    "minimum.accumulate-axis1": lambda xp, rng: xp.minimum.accumulate(arr(xp, rng, (3, 4)), axis=1),
    "subtract.outer": lambda xp, rng: xp.subtract.outer(arr(xp, rng, (3,)), arr(xp, rng, (2, 2))),
    "multiply.outer-int": lambda xp, rng: xp.multiply.outer(arr(xp, rng, (4,), I32), arr(xp, rng, (3,), I64)),
    "add.at": _at("add", (5,), [0, 1, 1, 3], 2.0),
    "add.at-array": _at("add", (5,), [4, 4, 0], [1.0, 2.0, 3.0]),
    "subtract.at-2d": _at("subtract", (3, 2), [2, 0, 2], 1.5),
    "maximum.at": _at("maximum", (4,), [1, 1, 2], 10.0),
    "minimum.at": _at("minimum", (4,), [0, 3, 3], -10.0),
}


@pytest.mark.parametrize("body,kw", params(UFUNC_METHOD_CASES))
def test_ufunc_methods(cp, body, kw):
    check(body, cp, **kw)


MORE_FUNCTIONS = {
    "append-flat": lambda xp, rng: xp.append(arr(xp, rng, (2, 3)), arr(xp, rng, (4,), I32)),
    "append-axis0": lambda xp, rng: xp.append(arr(xp, rng, (2, 3)), arr(xp, rng, (1, 3)), axis=0),
    "append-list": lambda xp, rng: xp.append(arr(xp, rng, (3,)), [1.5, 2.5]),
    "delete-int": lambda xp, rng: xp.delete(arr(xp, rng, (5,)), 2),
    "delete-list-axis1": lambda xp, rng: xp.delete(arr(xp, rng, (3, 4)), [0, 2], axis=1),
    "delete-slice": lambda xp, rng: xp.delete(arr(xp, rng, (6,)), slice(1, 4)),
    "iscomplex": lambda xp, rng: xp.iscomplex(arr(xp, rng, (4,), C64)),
    "isreal-real": lambda xp, rng: xp.isreal(arr(xp, rng, (2, 3))),
    "packbits": lambda xp, rng: xp.packbits(arr(xp, rng, (3, 10), B)),
    "packbits-axis1": lambda xp, rng: xp.packbits(arr(xp, rng, (3, 10), B), axis=1),
    "ravel_multi_index": lambda xp, rng: xp.ravel_multi_index(
        (xp.asarray([0, 1, 2]), xp.asarray([3, 0, 1])), (3, 4)),
    "resize-grow": lambda xp, rng: xp.resize(arr(xp, rng, (2, 3)), (4, 4)),
    "resize-shrink": lambda xp, rng: xp.resize(arr(xp, rng, (5,)), 3),
    "select": lambda xp, rng: (lambda x: xp.select([x < -1, x > 1], [x * 2, x * 3], default=-7.0))(
        arr(xp, rng, (3, 4))),
    "vander": lambda xp, rng: xp.vander(arr(xp, rng, (4,))),
    "vander-N-increasing": lambda xp, rng: xp.vander(arr(xp, rng, (3,)), 5, increasing=True),
    "unravel_index": lambda xp, rng: xp.unravel_index(xp.asarray([1, 5, 7, 0]), (2, 4)),
    "unravel_index-scalar-F": lambda xp, rng: xp.unravel_index(7, (2, 2, 2), order="F"),
    "unravel_index-argmax": lambda xp, rng: (lambda x: xp.unravel_index(xp.argmax(x), x.shape))(arr(xp, rng, (3, 4))),
    "diag_indices": lambda xp, rng: xp.diag_indices(4),
    "diag_indices-3d": lambda xp, rng: xp.diag_indices(2, 3),
    "tril_indices": lambda xp, rng: xp.tril_indices(4, -1),
    "triu_indices-m": lambda xp, rng: xp.triu_indices(3, 1, 5),
    "tril_indices-as-index": lambda xp, rng: arr(xp, rng, (4, 4))[xp.tril_indices(4)],
    "asarray-list-of-arrays": lambda xp, rng: xp.asarray([arr(xp, rng, (3,)), arr(xp, rng, (3,), I32)]),
    "array-nested-with-scalars": lambda xp, rng: xp.array([[arr(xp, rng, ()), 2.5], [1.0, arr(xp, rng, ())]]),
    "array-list-dtype-ndmin": lambda xp, rng: xp.array((arr(xp, rng, (2,)), arr(xp, rng, (2,))), dtype=F32,
                                                        ndmin=3),
    "nanpercentile": lambda xp, rng: xp.nanpercentile(xp.asarray([[1.0, np.nan, 3.0], [4.0, 2.0, np.nan]]), 50),
    "nanpercentile-axis-q": lambda xp, rng: xp.nanpercentile(
        xp.asarray([[1.0, np.nan, 3.0], [4.0, 2.0, np.nan]]), xp.asarray([10.0, 90.0]), axis=1),
    "nanquantile-keepdims": lambda xp, rng: xp.nanquantile(
        xp.asarray([[1.0, np.nan], [np.nan, np.nan], [3.0, 5.0]]), 0.25, axis=0, keepdims=True),
    "unpackbits": lambda xp, rng: xp.unpackbits(xp.asarray([[2], [7], [23]], dtype=np.uint8)),
    "unpackbits-axis-little": lambda xp, rng: xp.unpackbits(xp.asarray([[2, 255], [7, 0]], dtype=np.uint8),
                                                            axis=1, bitorder="little"),
    "histogram2d": lambda xp, rng: xp.histogram2d(arr(xp, rng, (50,)), arr(xp, rng, (50,)), bins=4),
    "histogram2d-bins-pair-weights": lambda xp, rng: xp.histogram2d(
        arr(xp, rng, (30,)), arr(xp, rng, (30,)), bins=(3, 5), weights=arr(xp, rng, (30,))),
    "histogram2d-edges": lambda xp, rng: xp.histogram2d(
        arr(xp, rng, (40,)), arr(xp, rng, (40,)), bins=xp.linspace(-3.0, 3.0, 7)),
    "histogram-edges": lambda xp, rng: xp.histogram(arr(xp, rng, (40,)), bins=xp.asarray([-3.0, 0.0, 0.5, 3.0])),
    "ix_": lambda xp, rng: xp.ix_(xp.asarray([0, 2]), xp.asarray([1, 3, 4])),
    "ix_-bool-and-list": lambda xp, rng: xp.ix_(xp.asarray([True, False, True]), [0, 1]),
    "gradient-unprobed-2d": lambda xp, rng: xp.gradient(arr(xp, rng, (70, 70))),     # past meta.PROBE_ELEMENTS
    "polyfit-full": lambda xp, rng: xp.polyfit(xp.arange(8.0), arr(xp, rng, (8,)), 2, full=True),
    "polyfit-cov": lambda xp, rng: xp.polyfit(xp.arange(8.0), arr(xp, rng, (8,)), 1, cov=True),
    "average-returned-weights": lambda xp, rng: xp.average(arr(xp, rng, (2, 3)), axis=1,
                                                           weights=xp.asarray([1.0, 2.0, 3.0]), returned=True),
    "intersect1d-indices": lambda xp, rng: xp.intersect1d(xp.arange(5), xp.arange(3, 8), return_indices=True),
    "sliding_window_view": lambda xp, rng: xp.lib.stride_tricks.sliding_window_view(arr(xp, rng, (10,)), 3),
    "sliding_window_view-2d-mean": lambda xp, rng: xp.lib.stride_tricks.sliding_window_view(
        arr(xp, rng, (4, 5)), (2, 3)).mean(axis=(-1, -2)),
    "sliding_window_view-axis": lambda xp, rng: xp.lib.stride_tricks.sliding_window_view(
        arr(xp, rng, (4, 5)), 2, axis=0),
    "ix_-as-index": lambda xp, rng: arr(xp, rng, (3, 5))[xp.ix_(xp.asarray([0, 2]), xp.asarray([1, 4]))],
}


@pytest.mark.parametrize("body,kw", params(MORE_FUNCTIONS))
def test_more_functions(cp, body, kw):
    check(body, cp, **kw)


def test_stride_tricks_refusals(cp):
    check_raises(lambda xp, rng: xp.lib.stride_tricks.sliding_window_view(arr(xp, rng, (5,)), 6), cp, ValueError)
    check_raises(lambda xp, rng: xp.lib.stride_tricks.sliding_window_view(arr(xp, rng, (5,)), -1), cp, ValueError)
    with pytest.raises(NotImplementedError, match="could read the daemon's memory"):
        cp.lib.stride_tricks.as_strided(cp.arange(4.0), (8,), (8,))


def test_ufunc_method_errors(cp):
    check_raises(lambda xp, rng: xp.add.reduce(arr(xp, rng, (3, 4)), axis=3), cp, np.exceptions.AxisError)
    check_raises(_at("add", (3,), [5], 1.0), cp, IndexError)
    with pytest.raises(TypeError, match="writes into a device array, not numpy.ndarray"):
        cp.add.at(np.zeros(3), [0], 1.0)


def test_reduce_out(cp):
    def body(xp, rng):
        a = arr(xp, rng, (3, 4))
        o = xp.zeros((4,))
        r = xp.sum(a, axis=0, out=o)
        o2 = xp.zeros((3,), np.float32)
        xp.max(a, axis=1, out=o2)
        return r is o, o, o2
    check(body, cp)


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
@pytest.mark.parametrize("dtype", [F64, F32, I32, B], ids=str)
@pytest.mark.parametrize("name", ["cumsum", "cumprod"])
def test_accumulate(cp, name, dtype, axis):
    check(lambda xp, rng: getattr(xp, name)(arr(xp, rng, (3, 4), dtype, low=-2, high=2), axis=axis), cp)


def test_accumulate_dtype_and_nan(cp):
    def body(xp, rng):
        a = arr(xp, rng, (3, 4), I32)
        n = xp.asarray([1.0, np.nan, 2.0, 3.0])
        return xp.cumsum(a, axis=0, dtype=np.float32), xp.cumprod(a, dtype=np.int64), xp.nancumsum(n), \
            xp.nancumprod(n)
    check(body, cp)


def test_reduce_bad_axis_raises(cp):
    check_raises(lambda xp, rng: xp.sum(arr(xp, rng, (3, 4)), axis=2), cp, np.exceptions.AxisError)
    check_raises(lambda xp, rng: xp.cumsum(arr(xp, rng, (3, 4)), axis=-3), cp, np.exceptions.AxisError)


# ------------------------------------------------------------------------------------------
# linear algebra
# ------------------------------------------------------------------------------------------

LA = {"rtol": 1e-9, "atol": 1e-9}
LA32 = {"rtol": 2e-4, "atol": 2e-4}


def _qr_checks(xp, rng, mode="reduced", dtype=F64, shape=(5, 3)):
    a = arr(xp, rng, shape, dtype)
    q, r = xp.linalg.qr(a, mode=mode)
    eye = xp.eye(q.shape[1], dtype=dtype)
    return q.shape, r.shape, q.dtype.str, r.dtype.str, q @ r, xp.conj(q.T) @ q - eye, xp.abs(r)


def _svd_checks(xp, rng, full, dtype=F64, shape=(5, 3)):
    a = arr(xp, rng, shape, dtype)
    u, s, vh = xp.linalg.svd(a, full_matrices=full)
    k = s.shape[-1]
    return u.shape, vh.shape, s, (u[:, :k] * s) @ vh[:k], xp.linalg.svd(a, compute_uv=False)


def _eigh_checks(xp, rng, dtype=F64, uplo="L"):
    a = spd(xp, rng, 4, dtype)
    w, v = xp.linalg.eigh(a, UPLO=uplo)
    return w, (v * w) @ xp.conj(v.T), xp.abs(xp.conj(v.T) @ v), xp.linalg.eigvalsh(a)


LINALG = {
    "dot-1d-1d": lambda xp, rng: xp.dot(arr(xp, rng, (5,)), arr(xp, rng, (5,))),
    "dot-2d-1d": lambda xp, rng: xp.dot(arr(xp, rng, (3, 5)), arr(xp, rng, (5,))),
    "dot-2d-2d": lambda xp, rng: xp.dot(arr(xp, rng, (3, 5)), arr(xp, rng, (5, 2))),
    "dot-3d-2d": lambda xp, rng: xp.dot(arr(xp, rng, (2, 3, 5)), arr(xp, rng, (5, 4))),
    "dot-2d-3d": lambda xp, rng: xp.dot(arr(xp, rng, (3, 5)), arr(xp, rng, (2, 5, 4))),
    "dot-scalar": lambda xp, rng: xp.dot(arr(xp, rng, (3, 5)), 2.0),
    "dot-int": lambda xp, rng: xp.dot(arr(xp, rng, (3, 4), I32), arr(xp, rng, (4, 2), I32)),
    "dot-f32": tol(lambda xp, rng: xp.dot(arr(xp, rng, (3, 4), F32), arr(xp, rng, (4, 2), F32)), **LA32),
    "dot-complex": tol(lambda xp, rng: xp.dot(arr(xp, rng, (3, 4), C64), arr(xp, rng, (4,), C64)), **LA32),
    "dot-mixed": lambda xp, rng: xp.dot(arr(xp, rng, (3, 4), I32), arr(xp, rng, (4,), F32)),
    "matmul-2d": lambda xp, rng: xp.matmul(arr(xp, rng, (3, 4)), arr(xp, rng, (4, 5))),
    "matmul-batch": lambda xp, rng: xp.matmul(arr(xp, rng, (2, 3, 4)), arr(xp, rng, (4, 5))),
    "matmul-bcast": lambda xp, rng: xp.matmul(arr(xp, rng, (2, 1, 3, 4)), arr(xp, rng, (5, 4, 2))),
    "matmul-1d-2d": lambda xp, rng: xp.matmul(arr(xp, rng, (4,)), arr(xp, rng, (4, 5))),
    "matmul-2d-1d": lambda xp, rng: xp.matmul(arr(xp, rng, (3, 4)), arr(xp, rng, (4,))),
    "matmul-1d-1d": lambda xp, rng: xp.matmul(arr(xp, rng, (4,)), arr(xp, rng, (4,))),
    "matmul-int": lambda xp, rng: xp.matmul(arr(xp, rng, (3, 4), I64), arr(xp, rng, (4, 3), I32)),
    "matmul-bool": lambda xp, rng: xp.matmul(arr(xp, rng, (3, 4), B), arr(xp, rng, (4, 3), B)),
    "tensordot-1": lambda xp, rng: xp.tensordot(arr(xp, rng, (3, 4)), arr(xp, rng, (4, 5)), axes=1),
    "tensordot-2": lambda xp, rng: xp.tensordot(arr(xp, rng, (3, 4, 5)), arr(xp, rng, (4, 5, 2))),
    "tensordot-lists": lambda xp, rng: xp.tensordot(arr(xp, rng, (3, 4, 5)), arr(xp, rng, (5, 3)),
                                                    axes=([2, 0], [0, 1])),
    "tensordot-0": lambda xp, rng: xp.tensordot(arr(xp, rng, (2, 3)), arr(xp, rng, (3,)), axes=0),
    "einsum-matmul": lambda xp, rng: xp.einsum("ij,jk->ik", arr(xp, rng, (3, 4)), arr(xp, rng, (4, 2))),
    "einsum-diag": lambda xp, rng: xp.einsum("ii->i", arr(xp, rng, (4, 4))),
    "einsum-trace": lambda xp, rng: xp.einsum("ii", arr(xp, rng, (4, 4))),
    "einsum-transpose": lambda xp, rng: xp.einsum("ij->ji", arr(xp, rng, (3, 4))),
    "einsum-batch": lambda xp, rng: xp.einsum("bij,bjk->bik", arr(xp, rng, (2, 3, 4)), arr(xp, rng, (2, 4, 5))),
    "einsum-inner": lambda xp, rng: xp.einsum("i,i", arr(xp, rng, (6,)), arr(xp, rng, (6,))),
    "einsum-sum": lambda xp, rng: xp.einsum("ij->", arr(xp, rng, (3, 4), I32)),
    "einsum-ellipsis": lambda xp, rng: xp.einsum("...ij->...ji", arr(xp, rng, (2, 3, 4))),
    "einsum-outer": lambda xp, rng: xp.einsum("i,j->ij", arr(xp, rng, (3,)), arr(xp, rng, (2,))),
    "inner": lambda xp, rng: xp.inner(arr(xp, rng, (3, 4)), arr(xp, rng, (2, 4))),
    "outer": lambda xp, rng: xp.outer(arr(xp, rng, (3,)), arr(xp, rng, (4,), I32)),
    "vdot": lambda xp, rng: xp.vdot(arr(xp, rng, (3,), C64), arr(xp, rng, (3,), C64)),
    "kron": lambda xp, rng: xp.kron(arr(xp, rng, (2, 2)), arr(xp, rng, (2, 3))),
    "cross": lambda xp, rng: xp.cross(arr(xp, rng, (4, 3)), arr(xp, rng, (4, 3))),
    "inv": tol(lambda xp, rng: xp.linalg.inv(wellcond(xp, rng, 4)), **LA),
    "inv-f32": tol(lambda xp, rng: xp.linalg.inv(wellcond(xp, rng, 4, F32)), **LA32),
    "inv-c64": tol(lambda xp, rng: xp.linalg.inv(spd(xp, rng, 3, C64)), **LA32),
    "inv-batch": tol(lambda xp, rng: xp.linalg.inv(wellcond(xp, rng, 3, batch=(2,))), **LA),
    "solve-vector": tol(lambda xp, rng: xp.linalg.solve(wellcond(xp, rng, 4), arr(xp, rng, (4,))), **LA),
    "solve-matrix": tol(lambda xp, rng: xp.linalg.solve(wellcond(xp, rng, 4), arr(xp, rng, (4, 2))), **LA),
    "solve-f32": tol(lambda xp, rng: xp.linalg.solve(wellcond(xp, rng, 4, F32), arr(xp, rng, (4, 3), F32)), **LA32),
    "solve-batch": tol(lambda xp, rng: xp.linalg.solve(wellcond(xp, rng, 3, batch=(2,)), arr(xp, rng, (2, 3, 1))),
                       **LA),
    "norm": tol(lambda xp, rng: xp.linalg.norm(arr(xp, rng, (3, 4))), **LA),
    "norm-vector": tol(lambda xp, rng: xp.linalg.norm(arr(xp, rng, (6,), F32)), **LA32),
    "norm-fro": tol(lambda xp, rng: xp.linalg.norm(arr(xp, rng, (3, 4)), "fro"), **LA),
    "norm-ord1": tol(lambda xp, rng: xp.linalg.norm(arr(xp, rng, (3, 4)), 1), **LA),
    "norm-inf": tol(lambda xp, rng: xp.linalg.norm(arr(xp, rng, (3, 4)), np.inf), **LA),
    "norm-ord2": tol(lambda xp, rng: xp.linalg.norm(arr(xp, rng, (3, 4)), 2), **LA),
    "norm-axis": tol(lambda xp, rng: xp.linalg.norm(arr(xp, rng, (3, 4)), axis=1), **LA),
    "norm-axis-keepdims": tol(lambda xp, rng: xp.linalg.norm(arr(xp, rng, (3, 4)), ord=3, axis=0, keepdims=True),
                              **LA),
    "norm-complex": tol(lambda xp, rng: xp.linalg.norm(arr(xp, rng, (5,), C64)), **LA32),
    "norm-int": tol(lambda xp, rng: xp.linalg.norm(arr(xp, rng, (5,), I32)), **LA),
    "qr-reduced": tol(lambda xp, rng: _qr_checks(xp, rng), **LA),
    "qr-complete": tol(lambda xp, rng: _qr_checks(xp, rng, "complete"), **LA),
    "qr-f32": tol(lambda xp, rng: _qr_checks(xp, rng, dtype=F32), **LA32),
    "qr-wide": tol(lambda xp, rng: _qr_checks(xp, rng, shape=(3, 5)), **LA),
    "qr-r": tol(lambda xp, rng: xp.abs(xp.linalg.qr(arr(xp, rng, (5, 3)), mode="r")), **LA),
    "svd-reduced": tol(lambda xp, rng: _svd_checks(xp, rng, False), **LA),
    "svd-full": tol(lambda xp, rng: _svd_checks(xp, rng, True), **LA),
    "svd-wide-f32": tol(lambda xp, rng: _svd_checks(xp, rng, False, F32, (3, 6)), **LA32),
    "svd-values": tol(lambda xp, rng: xp.linalg.svd(arr(xp, rng, (2, 4, 3)), compute_uv=False), **LA),
    "eigh": tol(lambda xp, rng: _eigh_checks(xp, rng), **LA),
    "eigh-upper": tol(lambda xp, rng: _eigh_checks(xp, rng, uplo="U"), **LA),
    "eigh-f32": tol(lambda xp, rng: _eigh_checks(xp, rng, F32), **LA32),
    "eigh-c64": tol(lambda xp, rng: _eigh_checks(xp, rng, C64), **LA32),
    "det": tol(lambda xp, rng: xp.linalg.det(wellcond(xp, rng, 4)), rtol=1e-9, atol=0),
    "det-f32": tol(lambda xp, rng: xp.linalg.det(wellcond(xp, rng, 3, F32)), rtol=1e-4, atol=0),
    "det-batch": tol(lambda xp, rng: xp.linalg.det(wellcond(xp, rng, 3, batch=(4,))), rtol=1e-9, atol=0),
    "slogdet": tol(lambda xp, rng: xp.linalg.slogdet(arr(xp, rng, (4, 4))), **LA),
    "cholesky": tol(lambda xp, rng: xp.linalg.cholesky(spd(xp, rng, 4)), **LA),
    "cholesky-f32": tol(lambda xp, rng: xp.linalg.cholesky(spd(xp, rng, 3, F32)), **LA32),
    "cholesky-batch": tol(lambda xp, rng: xp.linalg.cholesky(spd(xp, rng, 3, batch=(2,))), **LA),
    "pinv": tol(lambda xp, rng: xp.linalg.pinv(arr(xp, rng, (5, 3))), **LA),
    "pinv-wide-f32": tol(lambda xp, rng: xp.linalg.pinv(arr(xp, rng, (2, 4), F32)), **LA32),
    "matrix_power-3": tol(lambda xp, rng: xp.linalg.matrix_power(arr(xp, rng, (3, 3), low=-1, high=1), 3), **LA),
    "matrix_power-0": lambda xp, rng: xp.linalg.matrix_power(arr(xp, rng, (3, 3), I32), 0),
    "matrix_power-neg": tol(lambda xp, rng: xp.linalg.matrix_power(wellcond(xp, rng, 3), -2), **LA),
    "matrix_rank": lambda xp, rng: xp.linalg.matrix_rank(arr(xp, rng, (4, 2)) @ arr(xp, rng, (2, 5))),
    "lstsq": tol(lambda xp, rng: xp.linalg.lstsq(arr(xp, rng, (6, 3)), arr(xp, rng, (6,)), rcond=None), **LA),
    "multi_dot": tol(lambda xp, rng: xp.linalg.multi_dot([arr(xp, rng, (3, 4)), arr(xp, rng, (4, 5)),
                                                          arr(xp, rng, (5, 2))]), **LA),
}


@pytest.mark.parametrize("body,kw", params(LINALG))
def test_linalg(cp, body, kw):
    check(body, cp, **kw)


def test_linalg_inverse_times_matrix_is_identity(cp):
    def body(xp, rng):
        a = wellcond(xp, rng, 5)
        return xp.linalg.inv(a) @ a, xp.linalg.solve(a, a)
    r = check(body, cp, **LA)
    np.testing.assert_allclose(r[0].get(), np.eye(5), atol=1e-12)


def test_linalg_errors(cp):
    check_raises(lambda xp, rng: xp.linalg.inv(xp.zeros((3, 3))), cp, np.linalg.LinAlgError)
    check_raises(lambda xp, rng: xp.linalg.cholesky(-spd(xp, rng, 3)), cp, np.linalg.LinAlgError)
    check_raises(lambda xp, rng: xp.matmul(arr(xp, rng, (3, 4)), arr(xp, rng, (3, 4))), cp, ValueError)
    check_raises(lambda xp, rng: xp.dot(arr(xp, rng, (3, 4)), arr(xp, rng, (3,))), cp, ValueError)


# ------------------------------------------------------------------------------------------
# shape manipulation
# ------------------------------------------------------------------------------------------

def _a(xp, rng, shape=(2, 3, 4), dtype=F64):
    return arr(xp, rng, shape, dtype)


SHAPE = {
    "reshape": lambda xp, rng: xp.reshape(_a(xp, rng), (4, 6)),
    "reshape-minus1": lambda xp, rng: xp.reshape(_a(xp, rng), (-1, 3)),
    "reshape-F": lambda xp, rng: xp.reshape(_a(xp, rng), (6, 4), order="F"),
    "reshape-0d": lambda xp, rng: xp.reshape(_a(xp, rng, (1,)), ()),
    "reshape-int": lambda xp, rng: xp.reshape(_a(xp, rng, (2, 3), I32), 6),
    "ravel": lambda xp, rng: xp.ravel(_a(xp, rng)),
    "ravel-transposed": lambda xp, rng: xp.ravel(_a(xp, rng).T),
    "transpose": lambda xp, rng: xp.transpose(_a(xp, rng)),
    "transpose-axes": lambda xp, rng: xp.transpose(_a(xp, rng), (1, 2, 0)),
    "transpose-neg-axes": lambda xp, rng: xp.transpose(_a(xp, rng), (-1, 0, -2)),
    "swapaxes": lambda xp, rng: xp.swapaxes(_a(xp, rng), 0, 2),
    "swapaxes-neg": lambda xp, rng: xp.swapaxes(_a(xp, rng, dtype=C64), -1, 1),
    "squeeze": lambda xp, rng: xp.squeeze(_a(xp, rng, (1, 3, 1, 2))),
    "squeeze-axis": lambda xp, rng: xp.squeeze(_a(xp, rng, (1, 3, 1, 2)), axis=2),
    "squeeze-axes": lambda xp, rng: xp.squeeze(_a(xp, rng, (1, 3, 1, 2)), axis=(0, -2)),
    "expand_dims": lambda xp, rng: xp.expand_dims(_a(xp, rng, (3, 4)), 1),
    "expand_dims-neg": lambda xp, rng: xp.expand_dims(_a(xp, rng, (3, 4)), -1),
    "expand_dims-tuple": lambda xp, rng: xp.expand_dims(_a(xp, rng, (3, 4)), (0, 3)),
    "concatenate-0": lambda xp, rng: xp.concatenate([_a(xp, rng, (2, 3)), _a(xp, rng, (4, 3))]),
    "concatenate-1": lambda xp, rng: xp.concatenate((_a(xp, rng, (2, 3)), _a(xp, rng, (2, 1), I32)), axis=1),
    "concatenate-none": lambda xp, rng: xp.concatenate([_a(xp, rng, (2, 3)), _a(xp, rng, (5,))], axis=None),
    "concatenate-neg": lambda xp, rng: xp.concatenate([_a(xp, rng, (2, 2, 1)), _a(xp, rng, (2, 2, 3))], axis=-1),
    "stack": lambda xp, rng: xp.stack([_a(xp, rng, (3, 4)), _a(xp, rng, (3, 4))]),
    "stack-axis": lambda xp, rng: xp.stack([_a(xp, rng, (3,)), _a(xp, rng, (3,)), _a(xp, rng, (3,))], axis=1),
    "stack-neg": lambda xp, rng: xp.stack((_a(xp, rng, (2, 3), I32), _a(xp, rng, (2, 3), I64)), axis=-1),
    "hstack": lambda xp, rng: xp.hstack([_a(xp, rng, (2, 3)), _a(xp, rng, (2, 2))]),
    "hstack-1d": lambda xp, rng: xp.hstack([_a(xp, rng, (3,)), _a(xp, rng, (2,))]),
    "vstack": lambda xp, rng: xp.vstack([_a(xp, rng, (2, 3)), _a(xp, rng, (3,))]),
    "dstack": lambda xp, rng: xp.dstack([_a(xp, rng, (2, 3)), _a(xp, rng, (2, 3))]),
    "column_stack": lambda xp, rng: xp.column_stack([_a(xp, rng, (3,)), _a(xp, rng, (3, 2))]),
    "split-int": lambda xp, rng: xp.split(_a(xp, rng, (6, 2)), 3),
    "split-indices": lambda xp, rng: xp.split(_a(xp, rng, (7,)), [2, 5]),
    "split-axis": lambda xp, rng: xp.split(_a(xp, rng, (2, 6)), 2, axis=1),
    "array_split": lambda xp, rng: xp.array_split(_a(xp, rng, (7,)), 3),
    "hsplit": lambda xp, rng: xp.hsplit(_a(xp, rng, (2, 4)), 2),
    "vsplit": lambda xp, rng: xp.vsplit(_a(xp, rng, (4, 2)), [1]),
    "tile": lambda xp, rng: xp.tile(_a(xp, rng, (2, 3)), 2),
    "tile-tuple": lambda xp, rng: xp.tile(_a(xp, rng, (2, 3)), (2, 1, 3)),
    "repeat": lambda xp, rng: xp.repeat(_a(xp, rng, (2, 3)), 2),
    "repeat-axis": lambda xp, rng: xp.repeat(_a(xp, rng, (2, 3)), 3, axis=1),
    "repeat-list": lambda xp, rng: xp.repeat(_a(xp, rng, (3, 2)), [1, 0, 2], axis=0),
    "repeat-host-array": lambda xp, rng: xp.repeat(_a(xp, rng, (3, 2)), np.array([1, 0, 2]), axis=0),
    "tile-host-array": lambda xp, rng: xp.tile(_a(xp, rng, (2, 3)), np.array([2, 1])),
    "split-host-array": lambda xp, rng: xp.split(_a(xp, rng, (7,)), np.array([2, 5])),
    "pad-host-array": lambda xp, rng: xp.pad(_a(xp, rng, (2, 3)), np.array([[1, 0], [2, 1]])),
    "flip": lambda xp, rng: xp.flip(_a(xp, rng)),
    "flip-axis": lambda xp, rng: xp.flip(_a(xp, rng), 1),
    "flip-axes": lambda xp, rng: xp.flip(_a(xp, rng), (0, -1)),
    "fliplr": lambda xp, rng: xp.fliplr(_a(xp, rng, (3, 4))),
    "flipud": lambda xp, rng: xp.flipud(_a(xp, rng, (3, 4))),
    "rot90": lambda xp, rng: xp.rot90(_a(xp, rng, (3, 4))),
    "rot90-k": lambda xp, rng: xp.rot90(_a(xp, rng, (2, 3, 4)), 3, axes=(1, 2)),
    "roll": lambda xp, rng: xp.roll(_a(xp, rng), 5),
    "roll-axis": lambda xp, rng: xp.roll(_a(xp, rng), -1, axis=1),
    "roll-axes": lambda xp, rng: xp.roll(_a(xp, rng), (1, 2), axis=(0, 2)),
    "moveaxis": lambda xp, rng: xp.moveaxis(_a(xp, rng), 0, -1),
    "moveaxis-multi": lambda xp, rng: xp.moveaxis(_a(xp, rng), [0, 1], [2, 0]),
    "broadcast_to": lambda xp, rng: xp.broadcast_to(_a(xp, rng, (3, 1)), (2, 3, 4)),
    "broadcast_to-0d": lambda xp, rng: xp.broadcast_to(_a(xp, rng, ()), (3,)),
    "broadcast_arrays": lambda xp, rng: xp.broadcast_arrays(_a(xp, rng, (3, 1)), _a(xp, rng, (4,))),
    "atleast_2d": lambda xp, rng: xp.atleast_2d(_a(xp, rng, (3,))),
    "atleast_3d-many": lambda xp, rng: xp.atleast_3d(_a(xp, rng, (3,)), _a(xp, rng, (2, 2))),
    "diagonal": lambda xp, rng: xp.diagonal(_a(xp, rng, (3, 4))),
    "diagonal-offset": lambda xp, rng: xp.diagonal(_a(xp, rng), 1, 1, 2),
    "diag": lambda xp, rng: xp.diag(_a(xp, rng, (4,))),
    "tril": lambda xp, rng: xp.tril(_a(xp, rng, (4, 4))),
    "triu-k": lambda xp, rng: xp.triu(_a(xp, rng, (4, 5)), 1),
    "pad": lambda xp, rng: xp.pad(_a(xp, rng, (2, 3)), 1),
    "diff": lambda xp, rng: xp.diff(_a(xp, rng, (3, 5)), axis=1),
    "meshgrid": lambda xp, rng: xp.meshgrid(_a(xp, rng, (3,)), _a(xp, rng, (2,))),
}


@pytest.mark.parametrize("body,kw", params(SHAPE))
def test_shape_manipulation(cp, body, kw):
    check(body, cp, **kw)


def test_shape_errors(cp):
    check_raises(lambda xp, rng: xp.reshape(_a(xp, rng), (5, 5)), cp, ValueError)
    check_raises(lambda xp, rng: xp.concatenate([_a(xp, rng, (2, 3)), _a(xp, rng, (2, 4))]), cp, ValueError)
    check_raises(lambda xp, rng: xp.squeeze(_a(xp, rng, (2, 3)), axis=0), cp, ValueError)
    check_raises(lambda xp, rng: xp.broadcast_to(_a(xp, rng, (3,)), (4,)), cp, ValueError)
    check_raises(lambda xp, rng: xp.split(_a(xp, rng, (7,)), 2), cp, ValueError)


# ------------------------------------------------------------------------------------------
# indexing: get
# ------------------------------------------------------------------------------------------

def _ix(xp, host_idx, on_device):
    return xp.asarray(host_idx) if on_device else host_idx


GETITEM = {
    "int": lambda xp, rng: _a(xp, rng)[1],
    "neg-int": lambda xp, rng: _a(xp, rng)[-1],
    "ints": lambda xp, rng: _a(xp, rng)[1, 2],
    "all-ints-scalar": lambda xp, rng: _a(xp, rng)[1, 2, 3],
    "all-ints-neg": lambda xp, rng: _a(xp, rng, (3, 4), I32)[-1, -2],
    "0d-empty-tuple": lambda xp, rng: _a(xp, rng, ())[()],
    "slice": lambda xp, rng: _a(xp, rng)[1:],
    "slice-step": lambda xp, rng: _a(xp, rng, (10,))[1:8:3],
    "slice-neg-step": lambda xp, rng: _a(xp, rng, (10,))[::-1],
    "slice-neg-step-bounds": lambda xp, rng: _a(xp, rng, (10,))[8:1:-2],
    "slice-out-of-range": lambda xp, rng: _a(xp, rng, (5,))[3:100],
    "slice-empty": lambda xp, rng: _a(xp, rng, (5,))[4:1],
    "slices-2d": lambda xp, rng: _a(xp, rng)[:, 1:3, ::-2],
    "slice-int": lambda xp, rng: _a(xp, rng)[:, 1],
    "none": lambda xp, rng: _a(xp, rng)[None],
    "none-middle": lambda xp, rng: _a(xp, rng)[:, None, 1],
    "ellipsis": lambda xp, rng: _a(xp, rng)[..., 0],
    "ellipsis-middle": lambda xp, rng: _a(xp, rng)[0, ..., 1:],
    "ellipsis-none": lambda xp, rng: _a(xp, rng)[..., None],
    "ellipsis-alone": lambda xp, rng: _a(xp, rng)[...],
    "int-array-host": lambda xp, rng: _a(xp, rng)[np.array([0, 1, 0])],
    "int-array-device": lambda xp, rng: _a(xp, rng)[_ix(xp, np.array([1, 0, -1]), True)],
    "int-list": lambda xp, rng: _a(xp, rng, (5,))[[4, 0, 2, 2]],
    "int-array-2d": lambda xp, rng: _a(xp, rng, (6,))[np.array([[0, 5], [3, 3]])],
    "int-array-2d-device": lambda xp, rng: _a(xp, rng, (6, 2))[_ix(xp, np.array([[0, 5], [3, 3]]), True)],
    "int-arrays-pair": lambda xp, rng: _a(xp, rng, (4, 5))[np.array([0, 3, 1]), np.array([4, 0, 2])],
    "int-arrays-pair-device": lambda xp, rng: _a(xp, rng, (4, 5))[_ix(xp, np.array([0, 3]), True),
                                                                  _ix(xp, np.array([[1], [2]]), True)],
    "slice-int-array": lambda xp, rng: _a(xp, rng)[:, np.array([2, 0])],
    "int-array-slice-int": lambda xp, rng: _a(xp, rng)[np.array([1, 0]), 1:, 2],
    "separated-int-arrays": lambda xp, rng: _a(xp, rng)[np.array([1, 0]), :, np.array([3, 2])],
    "ellipsis-int-list": lambda xp, rng: _a(xp, rng)[..., [1, 0]],
    "none-int-array": lambda xp, rng: _a(xp, rng)[None, np.array([1]), ::2],
    "neg-int-array-device": lambda xp, rng: _a(xp, rng, (5,), I64)[_ix(xp, np.array([-1, -5, 2]), True)],
    "bool-mask-host": lambda xp, rng: _a(xp, rng, (4, 5))[host(rng, (4, 5), B)],
    "bool-mask-device": lambda xp, rng: _a(xp, rng, (4, 5))[arr(xp, rng, (4, 5), B)],
    "bool-mask-computed": lambda xp, rng: (lambda a: a[a > 0])(_a(xp, rng, (4, 5))),
    "bool-mask-axis0-host": lambda xp, rng: _a(xp, rng)[np.array([True, False])],
    "bool-mask-axis0-device": lambda xp, rng: _a(xp, rng, (4, 3))[arr(xp, rng, (4,), B)],
    "bool-mask-slice": lambda xp, rng: _a(xp, rng, (4, 3))[host(rng, (4,), B), 1:],
    "slice-bool-mask": lambda xp, rng: _a(xp, rng, (4, 3))[:, arr(xp, rng, (3,), B)],
    "bool-mask-2d-of-3d": lambda xp, rng: _a(xp, rng)[arr(xp, rng, (2, 3), B)],
    "bool-mask-empty-result": lambda xp, rng: _a(xp, rng, (4,))[xp.asarray(np.zeros(4, bool))],
    "bool-scalar": lambda xp, rng: _a(xp, rng, (3,))[True],
    "int-array-then-int": lambda xp, rng: _a(xp, rng, (4, 5))[[0, 2]][1],
    "chained-views": lambda xp, rng: _a(xp, rng)[1:][:, ::-1][0],
    "complex": lambda xp, rng: _a(xp, rng, (3, 4), C64)[1:, np.array([0, 3])],
    "bool-dtype-array": lambda xp, rng: _a(xp, rng, (3, 4), B)[::2, 1],
    "np-integer-index": lambda xp, rng: _a(xp, rng, (5,))[np.int64(3)],
    "bool-list": lambda xp, rng: _a(xp, rng, (3, 2))[[True, False, True]],
    "0d-host-int-array": lambda xp, rng: _a(xp, rng, (5, 2))[np.array(4)],
    "slice-of-device-ints": lambda xp, rng: _a(xp, rng, (10,))[xp.asarray(2):xp.asarray(9):xp.asarray(3)],
    "0d-device-index": lambda xp, rng: _a(xp, rng, (5, 2))[xp.asarray(3)],
    "0d-ellipsis": lambda xp, rng: _a(xp, rng, (), I32)[...],
    "0d-none": lambda xp, rng: _a(xp, rng, ())[None],
    "0d-bool-true": lambda xp, rng: _a(xp, rng, ())[True],
    "0d-bool-false": lambda xp, rng: _a(xp, rng, ())[xp.asarray(False)],
}


@pytest.mark.parametrize("body,kw", params(GETITEM))
def test_getitem(cp, body, kw):
    check(body, cp)


def test_getitem_errors(cp):
    check_raises(lambda xp, rng: _a(xp, rng, (3,))[3], cp, IndexError)
    check_raises(lambda xp, rng: _a(xp, rng, (3,))[1, 0], cp, IndexError)
    check_raises(lambda xp, rng: _a(xp, rng, (3,))[np.array([0, 5])], cp, IndexError)
    check_raises(lambda xp, rng: _a(xp, rng, (3,))[np.array([True, False])], cp, IndexError)
    check_raises(lambda xp, rng: _a(xp, rng, (3,))[1.5], cp, IndexError)


def test_getitem_returns_views(cp):
    def body(xp, rng):
        a = _a(xp, rng, (4, 5))
        v = a[1:3, ::2]
        v[...] = 0
        row = a[2]
        row[1] = 99
        return a
    check(body, cp)


# ------------------------------------------------------------------------------------------
# indexing: set
# ------------------------------------------------------------------------------------------

def _set(key, value_fn):
    def body(xp, rng):
        a = _a(xp, rng, (4, 5))
        k = key(xp, rng) if callable(key) else key
        a[k] = value_fn(xp, rng)
        return a
    return body


SETITEM = {
    "int-scalar": _set(1, lambda xp, rng: 7.0),
    "ints-scalar": _set((1, 2), lambda xp, rng: -1),
    "neg-int-row": _set(-1, lambda xp, rng: arr(xp, rng, (5,))),
    "slice-scalar": _set(slice(1, 3), lambda xp, rng: 2.5),
    "slice-neg-step": _set((slice(None), slice(None, None, -2)), lambda xp, rng: arr(xp, rng, (4, 3))),
    "slice-broadcast-row": _set(slice(None), lambda xp, rng: arr(xp, rng, (5,))),
    "slice-broadcast-col": _set((slice(1, None), slice(0, 2)), lambda xp, rng: arr(xp, rng, (3, 1))),
    "ellipsis": _set(Ellipsis, lambda xp, rng: 0),
    "ellipsis-col": _set((Ellipsis, 0), lambda xp, rng: arr(xp, rng, (4,), I32)),
    "host-value": _set(slice(0, 2), lambda xp, rng: host(rng, (2, 5))),
    "host-list-value": _set(0, lambda xp, rng: [1, 2, 3, 4, 5]),
    "int-array-host": _set(np.array([0, 2]), lambda xp, rng: 5.0),
    "int-array-device": _set(lambda xp, rng: xp.asarray(np.array([3, 1])), lambda xp, rng: arr(xp, rng, (2, 5))),
    "int-arrays-pair": _set((np.array([0, 1, 3]), np.array([4, 4, 0])), lambda xp, rng: arr(xp, rng, (3,))),
    "int-list": _set([1, 3], lambda xp, rng: arr(xp, rng, (5,))),
    "slice-int-array": _set((slice(None), np.array([0, 4])), lambda xp, rng: -3),
    "bool-mask-host": _set(lambda xp, rng: host(rng, (4, 5), B), lambda xp, rng: 0.0),
    "bool-mask-device": _set(lambda xp, rng: arr(xp, rng, (4, 5), B), lambda xp, rng: 9),
    "bool-mask-rows": _set(lambda xp, rng: arr(xp, rng, (4,), B, nonzero=True), lambda xp, rng: arr(xp, rng, (5,))),
    "bool-mask-values": lambda xp, rng: (lambda a, m: (a.__setitem__(m, xp.asarray(np.arange(int(m.sum()),
                                                                                             dtype=float))), a)[1])(
        _a(xp, rng, (4, 5)), xp.asarray(np.eye(4, 5, dtype=bool))),
    "computed-mask": lambda xp, rng: (lambda a: (a.__setitem__(a < 0, 0), a)[1])(_a(xp, rng, (4, 5))),
    "cast-float-into-int": lambda xp, rng: (lambda a: (a.__setitem__(slice(None), 2.9), a)[1])(
        _a(xp, rng, (3,), I32)),
    "complex-into-complex": lambda xp, rng: (lambda a: (a.__setitem__(1, 1 - 2j), a)[1])(_a(xp, rng, (3,), C64)),
    "bool-into-bool": lambda xp, rng: (lambda a: (a.__setitem__(np.array([0, 2]), True), a)[1])(
        _a(xp, rng, (3,), B)),
    "device-0d-value": _set((2, 2), lambda xp, rng: arr(xp, rng, ())),
    "none-key": _set((None, 1), lambda xp, rng: 4),
    "overlapping-reverse": lambda xp, rng: (lambda a: (a.__setitem__(slice(None), a[::-1]), a)[1])(
        _a(xp, rng, (6,))),
    "overlapping-shift": lambda xp, rng: (lambda a: (a.__setitem__(slice(1, None), a[:-1]), a)[1])(
        _a(xp, rng, (6,), I32)),
}


@pytest.mark.parametrize("body,kw", params(SETITEM))
def test_setitem(cp, body, kw):
    check(body, cp)


def test_augmented_setitem(cp):
    def body(xp, rng):
        a = _a(xp, rng, (4, 5))
        a[1:3] += 5
        a[np.array([0, 3]), 1] *= -1
        a[a > 4] -= 1
        a[..., -1] /= 2
        return a
    check(body, cp)


def test_setitem_errors(cp):
    check_raises(lambda xp, rng: _a(xp, rng, (4, 5)).__setitem__(slice(None), arr(xp, rng, (4,))), cp, ValueError)
    check_raises(lambda xp, rng: _a(xp, rng, (4, 5)).__setitem__(4, 1.0), cp, IndexError)


# ------------------------------------------------------------------------------------------
# indexing helpers, sorting, searching, sets
# ------------------------------------------------------------------------------------------

def _distinct(xp, rng, shape, dtype=F64):
    n = int(np.prod(shape))
    return xp.asarray((rng.permutation(n) - n // 2).reshape(shape).astype(dtype))


HELPERS = {
    "take-flat": lambda xp, rng: xp.take(_a(xp, rng), np.array([0, 5, 23])),
    "take-axis": lambda xp, rng: xp.take(_a(xp, rng), [2, 0], axis=1),
    "take-neg": lambda xp, rng: xp.take(_a(xp, rng, (5,)), np.array([-1, -2])),
    "take-device-idx": lambda xp, rng: xp.take(_a(xp, rng, (5, 3)), xp.asarray(np.array([[4, 0], [1, 1]])), axis=0),
    "take_along_axis": lambda xp, rng: xp.take_along_axis(_a(xp, rng, (3, 4)),
                                                          xp.asarray(np.array([[0], [3], [1]])), axis=1),
    "where-3": lambda xp, rng: xp.where(arr(xp, rng, (3, 4), B), _a(xp, rng, (3, 4)), _a(xp, rng, (4,), I32)),
    "where-scalars": lambda xp, rng: xp.where(arr(xp, rng, (5,), B), 1, 0),
    "where-1": lambda xp, rng: xp.where(arr(xp, rng, (3, 4), B)),
    "where-1-float": lambda xp, rng: xp.where(arr(xp, rng, (6,), I32, low=-1, high=1)),
    "nonzero": lambda xp, rng: xp.nonzero(arr(xp, rng, (3, 4), I32, low=-1, high=1)),
    "nonzero-1d": lambda xp, rng: xp.nonzero(arr(xp, rng, (7,), B)),
    "nonzero-none": lambda xp, rng: xp.nonzero(xp.zeros((2, 3))),
    "flatnonzero": lambda xp, rng: xp.flatnonzero(arr(xp, rng, (3, 4), B)),
    "argwhere": lambda xp, rng: xp.argwhere(arr(xp, rng, (3, 4), B)),
    "compress": lambda xp, rng: xp.compress(host(rng, (3,), B), _a(xp, rng, (3, 4)), axis=0),
    "extract": lambda xp, rng: xp.extract(arr(xp, rng, (3, 4), B), _a(xp, rng, (3, 4))),
    "sort": lambda xp, rng: xp.sort(_a(xp, rng, (4, 5))),
    "sort-axis0": lambda xp, rng: xp.sort(_a(xp, rng, (4, 5)), axis=0),
    "sort-none": lambda xp, rng: xp.sort(_a(xp, rng, (4, 5)), axis=None),
    "sort-int": lambda xp, rng: xp.sort(arr(xp, rng, (20,), I32)),
    "sort-bool": lambda xp, rng: xp.sort(arr(xp, rng, (9,), B)),
    "sort-f32-nan": lambda xp, rng: xp.sort(arr(xp, rng, (8,), F32, special=True)),
    "argsort": lambda xp, rng: xp.argsort(_a(xp, rng, (4, 5))),
    "argsort-axis0": lambda xp, rng: xp.argsort(_a(xp, rng, (4, 5)), axis=0),
    "argsort-none": lambda xp, rng: xp.argsort(_a(xp, rng, (4, 5)), axis=None),
    "argsort-int-distinct": lambda xp, rng: xp.argsort(_distinct(xp, rng, (12,), I64)),
    "searchsorted": lambda xp, rng: xp.searchsorted(xp.sort(_a(xp, rng, (10,))), _a(xp, rng, (4,))),
    "searchsorted-right": lambda xp, rng: xp.searchsorted(xp.asarray([1, 2, 2, 3, 5]), xp.asarray([2, 0, 6, 3]),
                                                          side="right"),
    "searchsorted-left-ties": lambda xp, rng: xp.searchsorted(xp.asarray([1, 2, 2, 3, 5]), xp.asarray([2, 5])),
    "searchsorted-scalar": lambda xp, rng: xp.searchsorted(xp.asarray([1.0, 2.0, 4.0]), 3.0),
    "unique": lambda xp, rng: xp.unique(arr(xp, rng, (4, 5), I32)),
    "unique-float": lambda xp, rng: xp.unique(xp.round(_a(xp, rng, (20,)))),
    "unique-counts": lambda xp, rng: xp.unique(arr(xp, rng, (15,), I64), return_counts=True),
    "unique-index": lambda xp, rng: xp.unique(arr(xp, rng, (15,), I32), return_index=True),
    "unique-inverse": lambda xp, rng: xp.unique(arr(xp, rng, (15,), I32), return_inverse=True),
    "unique-all": lambda xp, rng: xp.unique(arr(xp, rng, (12,), I32), True, True, True),
    "unique-bool": lambda xp, rng: xp.unique(arr(xp, rng, (6,), B)),
    "unique-axis": lambda xp, rng: xp.unique(xp.asarray(np.array([[1, 2], [1, 2], [3, 4], [0, 9]])), axis=0),
    "isin": lambda xp, rng: xp.isin(arr(xp, rng, (3, 4), I32), xp.asarray([0, 2, 4])),
    "intersect1d": lambda xp, rng: xp.intersect1d(arr(xp, rng, (8,), I32), arr(xp, rng, (8,), I32)),
    "union1d": lambda xp, rng: xp.union1d(arr(xp, rng, (5,), I32), arr(xp, rng, (5,), I32)),
    "setdiff1d": lambda xp, rng: xp.setdiff1d(arr(xp, rng, (8,), I32), arr(xp, rng, (3,), I32)),
    "bincount": lambda xp, rng: xp.bincount(arr(xp, rng, (20,), I64, low=0, high=6)),
    "digitize": lambda xp, rng: xp.digitize(_a(xp, rng, (8,)), xp.asarray([-2.0, 0.0, 2.0])),
}


@pytest.mark.parametrize("body,kw", params(HELPERS))
def test_index_helpers_sort_search_sets(cp, body, kw):
    check(body, cp, **kw)


# ------------------------------------------------------------------------------------------
# fft
# ------------------------------------------------------------------------------------------

FFT = {
    "fft": lambda xp, rng: xp.fft.fft(_a(xp, rng, (8,))),
    "fft-c64": lambda xp, rng: xp.fft.fft(_a(xp, rng, (8,), C64)),
    "fft-f32": lambda xp, rng: xp.fft.fft(_a(xp, rng, (8,), F32)),
    "fft-int": lambda xp, rng: xp.fft.fft(_a(xp, rng, (8,), I32)),
    "fft-n-pad": lambda xp, rng: xp.fft.fft(_a(xp, rng, (6,)), n=10),
    "fft-n-crop": lambda xp, rng: xp.fft.fft(_a(xp, rng, (6,)), 4),
    "fft-axis": lambda xp, rng: xp.fft.fft(_a(xp, rng, (4, 6)), axis=0),
    "fft-ortho": lambda xp, rng: xp.fft.fft(_a(xp, rng, (3, 8)), norm="ortho"),
    "fft-forward": lambda xp, rng: xp.fft.fft(_a(xp, rng, (8,)), norm="forward"),
    "ifft": lambda xp, rng: xp.fft.ifft(_a(xp, rng, (3, 8), C64)),
    "ifft-n": lambda xp, rng: xp.fft.ifft(_a(xp, rng, (8,)), n=5),
    "roundtrip": lambda xp, rng: xp.fft.ifft(xp.fft.fft(_a(xp, rng, (16,)))).real,
    "rfft": lambda xp, rng: xp.fft.rfft(_a(xp, rng, (9,))),
    "rfft-f32": lambda xp, rng: xp.fft.rfft(_a(xp, rng, (2, 8), F32)),
    "rfft-n-axis": lambda xp, rng: xp.fft.rfft(_a(xp, rng, (6, 3)), n=8, axis=0),
    "irfft": lambda xp, rng: xp.fft.irfft(_a(xp, rng, (5,), C64)),
    "irfft-n": lambda xp, rng: xp.fft.irfft(xp.fft.rfft(_a(xp, rng, (9,))), n=9),
    "fft2": lambda xp, rng: xp.fft.fft2(_a(xp, rng, (4, 6))),
    "fft2-s": lambda xp, rng: xp.fft.fft2(_a(xp, rng, (2, 4, 6)), s=(3, 8)),
    "ifft2": lambda xp, rng: xp.fft.ifft2(_a(xp, rng, (4, 4), C64)),
    "fftn": lambda xp, rng: xp.fft.fftn(_a(xp, rng, (2, 3, 4))),
    "fftn-axes": lambda xp, rng: xp.fft.fftn(_a(xp, rng, (2, 3, 4)), axes=(0, 2)),
    "ifftn": lambda xp, rng: xp.fft.ifftn(_a(xp, rng, (2, 3, 4), C64)),
    "rfft2": lambda xp, rng: xp.fft.rfft2(_a(xp, rng, (4, 6))),
    "rfftn": lambda xp, rng: xp.fft.rfftn(_a(xp, rng, (3, 4, 4))),
    "irfftn": lambda xp, rng: xp.fft.irfftn(_a(xp, rng, (3, 4, 3), C64)),
    "hfft": lambda xp, rng: xp.fft.hfft(_a(xp, rng, (5,), C64)),
    "ihfft": lambda xp, rng: xp.fft.ihfft(_a(xp, rng, (8,))),
    "fftshift": lambda xp, rng: xp.fft.fftshift(_a(xp, rng, (5, 4))),
    "fftshift-axes": lambda xp, rng: xp.fft.fftshift(_a(xp, rng, (5, 4)), axes=1),
    "ifftshift": lambda xp, rng: xp.fft.ifftshift(_a(xp, rng, (7,))),
    "fftfreq": lambda xp, rng: xp.fft.fftfreq(8, 0.1),
    "rfftfreq": lambda xp, rng: xp.fft.rfftfreq(9),
}


@pytest.mark.parametrize("body,kw", params(FFT))
def test_fft(cp, body, kw):
    check(body, cp, **kw)


# ------------------------------------------------------------------------------------------
# more of the surface table
# ------------------------------------------------------------------------------------------

def _writes(fn):
    def body(xp, rng):
        a = _a(xp, rng, (4, 4))
        r = fn(xp, rng, a)
        return r, a
    return body


def _into(shape, fn, dtype=F64):
    """`fn` writes into a fresh `out` array; the call must return that very array."""
    def body(xp, rng):
        o = xp.zeros(shape, dtype)
        r = fn(xp, rng, o)
        return r is o, o
    return body


MORE = {  # the rest of the surface table: probes, in-place writers, out= forms, methods
    "gradient": lambda xp, rng: xp.gradient(_a(xp, rng, (5,))),
    "gradient-2d": lambda xp, rng: xp.gradient(_a(xp, rng, (4, 5))),
    "convolve": lambda xp, rng: xp.convolve(_a(xp, rng, (6,)), _a(xp, rng, (3,))),
    "convolve-same": lambda xp, rng: xp.convolve(_a(xp, rng, (6,)), _a(xp, rng, (3,)), mode="same"),
    "correlate": lambda xp, rng: xp.correlate(_a(xp, rng, (6,)), _a(xp, rng, (3,)), "full"),
    "lexsort": lambda xp, rng: xp.lexsort((arr(xp, rng, (8,), I32, low=0, high=3),
                                           arr(xp, rng, (8,), I32, low=0, high=3))),
    "partition": lambda xp, rng: xp.sort(xp.partition(_a(xp, rng, (9,)), 4)),
    "partition-kth": lambda xp, rng: xp.partition(_a(xp, rng, (9,)), 4)[4],
    "argpartition": lambda xp, rng: xp.argpartition(_a(xp, rng, (9,)), 4)[4],
    "choose": lambda xp, rng: xp.choose(arr(xp, rng, (5,), I32, low=0, high=2),
                                        [_a(xp, rng, (5,)), _a(xp, rng, (5,)), _a(xp, rng, (5,))]),
    "nanmedian": lambda xp, rng: xp.nanmedian(xp.asarray([[1.0, np.nan, 3.0], [2, 4, 5]]), axis=1),
    "quantile": lambda xp, rng: xp.quantile(_a(xp, rng, (11,)), 0.3),
    "quantile-arr": lambda xp, rng: xp.quantile(_a(xp, rng, (3, 11)), xp.asarray([0.1, 0.9]), axis=1),
    "cov": lambda xp, rng: xp.cov(_a(xp, rng, (3, 6))),
    "corrcoef": lambda xp, rng: xp.corrcoef(_a(xp, rng, (3, 6))),
    "histogram": lambda xp, rng: xp.histogram(_a(xp, rng, (30,)), bins=5),
    "histogram-bins": lambda xp, rng: xp.histogram(_a(xp, rng, (30,)), bins=xp.asarray([-5.0, 0.0, 1.0, 5.0])),
    "interp": lambda xp, rng: xp.interp(_a(xp, rng, (5,)), xp.asarray([-5.0, 0.0, 5.0]),
                                        xp.asarray([0.0, 1.0, 3.0])),
    "array_equiv": lambda xp, rng: bool(xp.array_equiv(_a(xp, rng, (3,)), _a(xp, rng, (3,)))),
    "indices": lambda xp, rng: xp.indices((2, 3)),
    "tri": lambda xp, rng: xp.tri(3, 4, 1),
    "polyval": lambda xp, rng: xp.polyval(_a(xp, rng, (3,)), _a(xp, rng, (4,))),
    "polyfit": lambda xp, rng: xp.polyfit(_a(xp, rng, (8,)), _a(xp, rng, (8,)), 2),
    "unwrap": lambda xp, rng: xp.unwrap(_a(xp, rng, (8,))),
    "cumulative_sum": lambda xp, rng: xp.cumulative_sum(arr(xp, rng, (3, 4), I32), axis=1, include_initial=True),
    "trim_zeros": lambda xp, rng: xp.trim_zeros(xp.asarray([0, 0, 1, 2, 0])),
    "setxor1d": lambda xp, rng: xp.setxor1d(arr(xp, rng, (5,), I32), arr(xp, rng, (5,), I32)),
    "diagflat": lambda xp, rng: xp.diagflat(_a(xp, rng, (2, 2)), 1),
    "rollaxis": lambda xp, rng: xp.rollaxis(_a(xp, rng, (2, 3, 4)), 2),
    "dsplit": lambda xp, rng: xp.dsplit(_a(xp, rng, (2, 2, 4)), 2),
    "copyto": _writes(lambda xp, rng, a: xp.copyto(a, 3.0)),
    "copyto-where": _writes(lambda xp, rng, a: xp.copyto(a, _a(xp, rng, (4,)), where=arr(xp, rng, (4, 4), B))),
    "put": _writes(lambda xp, rng, a: xp.put(a, [0, 5, 15], [1.0, 2.0, 3.0])),
    "place": _writes(lambda xp, rng, a: xp.place(a, a > 0, [7.0, 8.0])),
    "putmask": _writes(lambda xp, rng, a: xp.putmask(a, a < 0, _a(xp, rng, (4, 4)))),
    "fill_diagonal": _writes(lambda xp, rng, a: xp.fill_diagonal(a, 9.0)),
    "put-method": _writes(lambda xp, rng, a: a.put([1, 2], 0.0)),
    "take-clip": lambda xp, rng: xp.take(_a(xp, rng, (5,)), xp.asarray([0, 9]), mode="clip"),
    "atleast_1d": lambda xp, rng: xp.atleast_1d(_a(xp, rng, ())),
    "nancumsum": lambda xp, rng: xp.nancumsum(_a(xp, rng, (3, 3)), axis=0),
    "nanvar": lambda xp, rng: xp.nanvar(_a(xp, rng, (3, 3)), axis=0, ddof=1),
    "nanargmin": lambda xp, rng: xp.nanargmin(_a(xp, rng, (3, 3))),
    "nanprod": lambda xp, rng: xp.nanprod(_a(xp, rng, (3, 3)), keepdims=True),
    "in1d-isin": lambda xp, rng: xp.isin(arr(xp, rng, (6,), I32), [1, 2], invert=True),
    "slogdet-batch": lambda xp, rng: xp.linalg.slogdet(_a(xp, rng, (2, 3, 3))),
    "tensorinv": lambda xp, rng: xp.linalg.tensorinv(xp.asarray(np.eye(6).reshape(6, 2, 3)), ind=1),
    "tensorsolve": lambda xp, rng: xp.linalg.tensorsolve(xp.asarray(np.eye(6).reshape(2, 3, 6)),
                                                         _a(xp, rng, (2, 3))),
    "matrix_rank-tol": lambda xp, rng: xp.linalg.matrix_rank(_a(xp, rng, (4, 4)), tol=100.0),
    "norm-nuc": lambda xp, rng: xp.linalg.norm(_a(xp, rng, (3, 3)), "nuc"),
    "norm-axis-tuple": lambda xp, rng: xp.linalg.norm(_a(xp, rng, (2, 3, 3)), axis=(1, 2)),
    "eigvalsh": lambda xp, rng: xp.linalg.eigvalsh(xp.asarray(np.eye(3) * 2)),
    "ifftshift-axes": lambda xp, rng: xp.fft.ifftshift(_a(xp, rng, (3, 4)), axes=(0,)),
    "irfft2": lambda xp, rng: xp.fft.irfft2(arr(xp, rng, (4, 3), np.complex128)),
    "fftfreq-d": lambda xp, rng: xp.fft.fftfreq(5, d=0.5),
    "sum-where": lambda xp, rng: xp.sum(_a(xp, rng, (3, 4)), axis=1, where=arr(xp, rng, (3, 4), B)),
    "add-where": _into((3,), lambda xp, rng, o: xp.add(_a(xp, rng, (3,)), 1.0, out=o,
                                                       where=xp.asarray([True, False, True]))),
    "add-dtype": lambda xp, rng: xp.add(arr(xp, rng, (3,), I32), arr(xp, rng, (3,), I32), dtype=np.float32),
    "mean-out-method": _into((4,), lambda xp, rng, o: _a(xp, rng, (3, 4)).mean(axis=0, out=o)),
    "max-out-method-kw": _into((3,), lambda xp, rng, o: _a(xp, rng, (3, 4)).max(1, out=o)),
    "max-out-method-positional": lambda xp, rng: (lambda o: (_a(xp, rng, (3, 4)).max(1, o), o)[1])(xp.zeros(3)),
    "argmax-out": _into((3,), lambda xp, rng, o: xp.argmax(_a(xp, rng, (3, 4)), axis=1, out=o), I64),
    "cumsum-out": _into((3, 4), lambda xp, rng, o: xp.cumsum(_a(xp, rng, (3, 4)), axis=1, out=o)),
    "dot-out": _into((3, 2), lambda xp, rng, o: xp.dot(_a(xp, rng, (3, 4)), _a(xp, rng, (4, 2)), out=o)),
    "matmul-out": _into((3, 2), lambda xp, rng, o: xp.matmul(_a(xp, rng, (3, 4)), _a(xp, rng, (4, 2)), out=o)),
    "concatenate-out": _into((3, 2), lambda xp, rng, o: xp.concatenate([_a(xp, rng, (1, 2)), _a(xp, rng, (2, 2))],
                                                                         out=o)),
    "out-tuple": _into((3,), lambda xp, rng, o: xp.add(_a(xp, rng, (3,)), 1.0, out=(o,))),
    "out-positional": _into((3,), lambda xp, rng, o: xp.add(_a(xp, rng, (3,)), 1.0, o)),
    "out-positional-two": lambda xp, rng: (lambda o1, o2: (xp.divmod(_a(xp, rng, (3,)), 1.5, o1, o2)[1] is o2, o1, o2))(
        xp.zeros(3), xp.zeros(3)),
    "out-tuple-two": lambda xp, rng: (lambda o1, o2: (xp.modf(_a(xp, rng, (3,)), out=(o1, o2))[0] is o1, o1, o2))(
        xp.zeros(3), xp.zeros(3)),
    "out-view": lambda xp, rng: (lambda a: (xp.multiply(a[1:], 2, out=a[1:]), a)[1])(_a(xp, rng, (4,))),
    "iadd-view": lambda xp, rng: (lambda a: (operator.iadd(a[::2], 100), a)[1])(_a(xp, rng, (6,))),
    "arange-positional-dtype": lambda xp, rng: xp.arange(0, 5, 1, np.float32),
    "full-positional-dtype": lambda xp, rng: xp.full((2,), 3, np.int32),
    "eye-positional-dtype": lambda xp, rng: xp.eye(3, 3, 0, np.float32),
    "zeros-order-F": lambda xp, rng: xp.zeros((2, 3), order="F"),
    "empty_like-positional": lambda xp, rng: xp.empty_like(_a(xp, rng, (2, 2)), np.int32).shape,
    "reduce-np-int-axis": lambda xp, rng: xp.sum(_a(xp, rng, (2, 3)), axis=np.int64(1)),
    "transpose-list": lambda xp, rng: xp.transpose(_a(xp, rng, (2, 3, 4)), [2, 1, 0]),
    "idx-list-of-lists": lambda xp, rng: _a(xp, rng, (3, 4))[[0, 1], [1, 2]],
    "idx-tuple": lambda xp, rng: _a(xp, rng, (3, 4))[(0, 1)],
    "idx-newaxis-both": lambda xp, rng: _a(xp, rng, (3, 4))[np.newaxis, ..., np.newaxis],
    "idx-big-slice": lambda xp, rng: _a(xp, rng, (3, 4))[-100:100],
    "idx-empty-list": lambda xp, rng: _a(xp, rng, (3, 4))[[]],
    "idx-empty-array": lambda xp, rng: _a(xp, rng, (3, 4))[np.array([], dtype=np.int64)],
    "idx-uint-array": lambda xp, rng: _a(xp, rng, (3, 4))[np.array([2, 0], dtype=np.uint8)],
    "idx-int32-device": lambda xp, rng: _a(xp, rng, (3, 4))[xp.asarray(np.array([2, 0], dtype=np.int32))],
    "idx-device-0d-int-tuple": lambda xp, rng: _a(xp, rng, (3, 4))[xp.asarray(1), xp.asarray(2)],
    "set-list-of-lists": lambda xp, rng: (lambda a: (a.__setitem__(([0, 1], [1, 2]), [5.0, 6.0]), a)[1])(
        _a(xp, rng, (3, 4))),
    "set-device-mask-device-vals": lambda xp, rng: (lambda a, m: (a.__setitem__(m, a[m] * 10), a)[1])(
        _a(xp, rng, (3, 4)), arr(xp, rng, (3, 4), B)),
    "where-python-scalars-float": lambda xp, rng: xp.where(arr(xp, rng, (4,), B), 1.5, 2),
    "where-device-0d": lambda xp, rng: xp.where(arr(xp, rng, (4,), B), _a(xp, rng, (), F32), 2),
    "maximum-nan": lambda xp, rng: xp.maximum(xp.asarray([1.0, np.nan]), xp.asarray([np.nan, 0.0])),
    "sum-keepdims-positional": lambda xp, rng: xp.sum(_a(xp, rng, (2, 3)), 1, None, None, True),
    "argmin-keepdims-none": lambda xp, rng: xp.argmin(_a(xp, rng, (2, 3)), keepdims=True),
    "cumsum-0d": lambda xp, rng: xp.cumsum(_a(xp, rng, ())),
    "mean-bool": lambda xp, rng: xp.mean(arr(xp, rng, (5,), B)),
    "var-int-keepdims": lambda xp, rng: xp.var(arr(xp, rng, (3, 4), I32), axis=0, keepdims=True),
    "any-float-axis": lambda xp, rng: xp.any(_a(xp, rng, (3, 4)) > 4, axis=-1),
    "matmul-0-size": lambda xp, rng: _a(xp, rng, (3, 0)) @ _a(xp, rng, (0, 2)),
    "sum-0-size-keepdims": lambda xp, rng: xp.sum(_a(xp, rng, (0, 2)), axis=1, keepdims=True),
    "reshape-0-size": lambda xp, rng: _a(xp, rng, (0, 4)).reshape(-1, 2),
    "astype-uint8": lambda xp, rng: arr(xp, rng, (4,), low=0, high=200).astype(np.uint8),
    "uint8-add-int": lambda xp, rng: arr(xp, rng, (4,), np.uint8, low=0, high=200) + 100,
    "int8-ops": lambda xp, rng: _a(xp, rng, (4,), np.int8) * 3,
    "float16": lambda xp, rng: _a(xp, rng, (4,), np.float16) + 1,
    "complex128-abs": lambda xp, rng: xp.abs(_a(xp, rng, (4,), np.complex128)),
    "uint32-shift": lambda xp, rng: arr(xp, rng, (4,), np.uint32, low=0, high=9) << 3,
    "bool-sum-axis": lambda xp, rng: arr(xp, rng, (3, 4), B).sum(axis=0),
    "round-int-neg": lambda xp, rng: xp.round(arr(xp, rng, (5,), I32, low=-300, high=300), -2),
    "divmod-neg": lambda xp, rng: divmod(arr(xp, rng, (5,), I32, low=-9, high=9), -4),
    "concatenate-dtype": lambda xp, rng: xp.concatenate([_a(xp, rng, (1, 2)), _a(xp, rng, (2, 2))], dtype=np.float32),
    "stack-lists": lambda xp, rng: xp.stack([[1, 2], [3, 4]]),
    "squeeze-method-tuple": lambda xp, rng: _a(xp, rng, (1, 2, 1)).squeeze((0, 2)),
    "reshape-method-kw": lambda xp, rng: _a(xp, rng, (2, 3)).reshape((3, 2), order="C"),
    "diagonal-method-kw": lambda xp, rng: _a(xp, rng, (2, 3, 3)).diagonal(offset=1, axis1=1, axis2=2),
    "transpose-method-none": lambda xp, rng: _a(xp, rng, (2, 3)).transpose(None),
    "T-1d": lambda xp, rng: _a(xp, rng, (3,)).T,
    "real-method-int": lambda xp, rng: arr(xp, rng, (3,), I32).real,
    "trace-method-offset": lambda xp, rng: _a(xp, rng, (3, 4)).trace(1),
    "conjugate-method": lambda xp, rng: arr(xp, rng, (3,), np.complex64).conjugate(),
    "sort-kind": lambda xp, rng: xp.sort(_a(xp, rng, (6,)), kind="stable"),
    "searchsorted-sorter": lambda xp, rng: xp.searchsorted(xp.asarray([3.0, 1.0, 2.0]), 2.5,
                                                           sorter=xp.asarray([1, 2, 0])),
    "round-complex": lambda xp, rng: arr(xp, rng, (3,), np.complex128).round(1),
    "item-neg": lambda xp, rng: _a(xp, rng, (3, 2)).item(-1),
    "clip-arrays": lambda xp, rng: _a(xp, rng, (3, 4)).clip(_a(xp, rng, (4,)), 10.0),
    "repeat-method-axis-neg": lambda xp, rng: _a(xp, rng, (2, 3)).repeat(2, axis=-1),
    "take-method-out-of-order": lambda xp, rng: _a(xp, rng, (2, 3)).take([[0, 1], [2, 0]], axis=1),
    "nonzero-method-bool": lambda xp, rng: arr(xp, rng, (2, 3), B).nonzero(),
    "argsort-method-neg": lambda xp, rng: _a(xp, rng, (2, 3)).argsort(-2),
    "dot-method-scalar": lambda xp, rng: _a(xp, rng, (2, 3)).dot(2),
    "dot-0d": lambda xp, rng: xp.dot(_a(xp, rng, ()), _a(xp, rng, (3,))),
    "sum-bool-method": lambda xp, rng: arr(xp, rng, (5,), B).sum(),
    "mean-empty-axis": lambda xp, rng: _a(xp, rng, (3, 4)).mean(axis=()),
    "std-keepdims-tuple": lambda xp, rng: _a(xp, rng, (2, 3, 4)).std(axis=(0, 2), keepdims=True),
    "min-initial": lambda xp, rng: xp.min(_a(xp, rng, (3, 4)), axis=0, initial=-1.0),
    "sum-initial": lambda xp, rng: xp.sum(_a(xp, rng, (3, 4)), initial=10.0),
}


@pytest.mark.parametrize("body,kw", params(MORE))
def test_more_of_the_surface(cp, body, kw):
    check(body, cp, **kw)


# ------------------------------------------------------------------------------------------
# inputs past the client's probe limit (metadata fetched on demand) and past the inline limit
# (chunked transfers)
# ------------------------------------------------------------------------------------------

LARGE = {
    "sort-probe-limit": lambda xp, rng: xp.sort(_a(xp, rng, (70, 70)), axis=0),
    "concatenate-probe-limit": lambda xp, rng: xp.concatenate([_a(xp, rng, (70, 70)), _a(xp, rng, (1, 70))]),
    "tile-probe-limit": lambda xp, rng: xp.tile(_a(xp, rng, (65, 65), I32), (2, 1)),
    "fft-probe-limit": lambda xp, rng: xp.fft.rfft(_a(xp, rng, (5000,))),
    "inv-probe-limit": tol(lambda xp, rng: xp.linalg.inv(wellcond(xp, rng, 70)), rtol=1e-9, atol=1e-12),
    "einsum-probe-limit": tol(lambda xp, rng: xp.einsum("ij,kj->ik", _a(xp, rng, (70, 70)), _a(xp, rng, (70, 70))),
                              rtol=1e-9, atol=1e-9),
    "unique-large": lambda xp, rng: xp.unique(arr(xp, rng, (5000,), I32, low=-50, high=50), return_counts=True),
    "chunked-roundtrip": lambda xp, rng: _a(xp, rng, (300, 300)) * 2,        # 720 kB each way
    "chunked-fancy-index": lambda xp, rng: _a(xp, rng, (300, 300))[np.arange(0, 300, 7)][:, ::-3],
    "host-index-array-large": lambda xp, rng: _a(xp, rng, (20000,))[host(rng, (40000,), I64, low=0, high=19999)],
}


@pytest.mark.parametrize("body,kw", params(LARGE))
def test_large_inputs(cp, body, kw):
    check(body, cp, **kw)


# ------------------------------------------------------------------------------------------
# random (device only: the streams differ from NumPy's)
# ------------------------------------------------------------------------------------------

RANDOM = {  # name -> (draw, expected shape, expected dtype, (low, high) or None)
    "rand": (lambda r: r.rand(3, 4), (3, 4), F64, (0, 1)),
    "rand-f32": (lambda r: r.rand(5, dtype=np.float32), (5,), F32, (0, 1)),
    "rand-0d": (lambda r: r.rand(), (), F64, (0, 1)),
    "randn": (lambda r: r.randn(2, 5), (2, 5), F64, None),
    "random": (lambda r: r.random((4, 2)), (4, 2), F64, (0, 1)),
    "random_sample": (lambda r: r.random_sample(6), (6,), F64, (0, 1)),
    "randint": (lambda r: r.randint(0, 10, size=(4, 4)), (4, 4), I64, (0, 9)),
    "randint-high-only": (lambda r: r.randint(5, size=7), (7,), I64, (0, 4)),
    "randint-dtype": (lambda r: r.randint(-3, 3, size=(20,), dtype=np.int32), (20,), I32, (-3, 2)),
    "normal": (lambda r: r.normal(1.0, 2.0, size=(3, 3)), (3, 3), F64, None),
    "normal-kw": (lambda r: r.normal(loc=-1, scale=0.5, size=10), (10,), F64, None),
    "uniform": (lambda r: r.uniform(-2, 3, size=(50,)), (50,), F64, (-2, 3)),
    "uniform-kw": (lambda r: r.uniform(low=5, high=6, size=(2, 3)), (2, 3), F64, (5, 6)),
    "standard_normal": (lambda r: r.standard_normal((2, 2)), (2, 2), F64, None),
    "exponential": (lambda r: r.exponential(2.0, 8), (8,), F64, (0, np.inf)),
    "poisson": (lambda r: r.poisson(3.0, (10,)), (10,), I64, (0, np.inf)),
    "choice": (lambda r: r.choice(5, 3), (3,), I64, (0, 4)),
    "choice-list": (lambda r: r.choice([1.5, 2.5, 3.5], size=(2, 2)), (2, 2), F64, (1.5, 3.75)),
    "choice-device": (lambda r: r.choice(r.rand(6).astype(np.float32), 4), (4,), F32, (0, 1)),
    "normal-size-none": (lambda r: r.normal(), (), F64, None),
    "normal-array-loc-kw": (lambda r: r.normal(loc=r.rand(3), scale=0.1), (3,), F64, None),
    "normal-array-scale": (lambda r: r.normal(0.0, r.rand(2, 1) + 1), (2, 1), F64, None),
    "uniform-array-kw": (lambda r: r.uniform(low=r.rand(2, 3), high=2.0), (2, 3), F64, (0, 2)),
    "uniform-list-high": (lambda r: r.uniform(0.0, [1.0, 2.0, 3.0]), (3,), F64, (0, 3)),
    "randint-array-high-kw": (lambda r: r.randint(0, high=r.randint(5, 9, size=4)), (4,), I64, (0, 8)),
    "randint-positional-dtype": (lambda r: r.randint(0, 5, (30,), np.int32), (30,), I32, (0, 4)),
    "poisson-array-lam": (lambda r: r.poisson(lam=r.rand(5) + 1), (5,), I64, (0, np.inf)),
}


@pytest.mark.parametrize("name", list(RANDOM))
def test_random_shape_dtype_range_and_seed(cp, name):
    draw, shape, dtype, bounds = RANDOM[name]
    cp.random.seed(1234)
    a = draw(cp.random)
    b = draw(cp.random)
    assert a.shape == shape and a.dtype == dtype      # client-side metadata
    ha, hb = a.get(), b.get()
    assert ha.shape == shape and ha.dtype == dtype
    cp.random.seed(1234)
    a2, b2 = draw(cp.random), draw(cp.random)
    np.testing.assert_array_equal(a2.get(), ha)
    np.testing.assert_array_equal(b2.get(), hb)
    if bounds is not None:
        assert ha.min() >= bounds[0] and ha.max() <= bounds[1]
        if bounds[1] != np.inf and dtype.kind == "f":
            assert ha.max() < bounds[1]
    assert np.isfinite(ha).all()


@pytest.mark.parametrize("name", ["rand", "randn", "randint", "uniform", "normal", "random"])
def test_random_draws_differ_and_seeds_differ(cp, name):
    draw = RANDOM[name][0]
    cp.random.seed(7)
    a, b = draw(cp.random).get(), draw(cp.random).get()
    cp.random.seed(8)
    c = draw(cp.random).get()
    assert not np.array_equal(a, b)
    assert not np.array_equal(a, c)


def test_random_statistics(cp):
    cp.random.seed(3)
    n = cp.random.normal(2.0, 0.5, size=2000).get()
    u = cp.random.uniform(-1, 1, size=2000).get()
    k = cp.random.randint(0, 4, size=2000).get()
    assert abs(n.mean() - 2.0) < 0.1 and abs(n.std() - 0.5) < 0.1
    assert abs(u.mean()) < 0.1 and u.min() >= -1 and u.max() < 1
    assert set(np.unique(k).tolist()) == {0, 1, 2, 3}


def test_random_permutation_and_shuffle(cp):
    cp.random.seed(11)
    p = cp.random.permutation(10)
    assert sorted(p.get().tolist()) == list(range(10))
    x = cp.arange(10)
    cp.random.shuffle(x)
    assert sorted(x.get().tolist()) == list(range(10))
    cp.random.seed(11)
    np.testing.assert_array_equal(cp.random.permutation(10).get(), p.get())


# ------------------------------------------------------------------------------------------
# ndarray methods
# ------------------------------------------------------------------------------------------

def _m(xp, rng, shape=(3, 4), dtype=F64, **kw):
    return arr(xp, rng, shape, dtype, **kw)


METHODS = {
    "copy": lambda xp, rng: _m(xp, rng).copy(),
    "reshape-tuple": lambda xp, rng: _m(xp, rng).reshape((2, 6)),
    "reshape-varargs": lambda xp, rng: _m(xp, rng).reshape(6, -1),
    "reshape-order": lambda xp, rng: _m(xp, rng).reshape(4, 3, order="F"),
    "ravel": lambda xp, rng: _m(xp, rng).ravel(),
    "flatten": lambda xp, rng: _m(xp, rng, (2, 3, 2)).flatten(),
    "transpose": lambda xp, rng: _m(xp, rng, (2, 3, 4)).transpose(),
    "transpose-varargs": lambda xp, rng: _m(xp, rng, (2, 3, 4)).transpose(2, 0, 1),
    "transpose-tuple": lambda xp, rng: _m(xp, rng, (2, 3, 4)).transpose((1, 0, 2)),
    "T": lambda xp, rng: _m(xp, rng, (2, 3, 4)).T,
    "swapaxes": lambda xp, rng: _m(xp, rng, (2, 3, 4)).swapaxes(0, -1),
    "squeeze": lambda xp, rng: _m(xp, rng, (1, 3, 1)).squeeze(),
    "squeeze-axis": lambda xp, rng: _m(xp, rng, (1, 3, 1)).squeeze(0),
    "sum": lambda xp, rng: _m(xp, rng).sum(),
    "sum-axis": lambda xp, rng: _m(xp, rng).sum(axis=0),
    "sum-positional-keepdims": lambda xp, rng: _m(xp, rng).sum(1, keepdims=True),
    "sum-int-dtype": lambda xp, rng: _m(xp, rng, dtype=I32).sum(dtype=np.int32),
    "mean": lambda xp, rng: _m(xp, rng, dtype=I32).mean(axis=-1),
    "std": lambda xp, rng: _m(xp, rng).std(),
    "std-ddof": lambda xp, rng: _m(xp, rng, dtype=F32).std(axis=0, ddof=1),
    "var": lambda xp, rng: _m(xp, rng, dtype=C64).var(axis=1),
    "max": lambda xp, rng: _m(xp, rng).max(),
    "max-axis": lambda xp, rng: _m(xp, rng, dtype=I64).max(axis=1),
    "min-keepdims": lambda xp, rng: _m(xp, rng, dtype=F32).min(axis=0, keepdims=True),
    "argmax": lambda xp, rng: _m(xp, rng).argmax(),
    "argmax-axis": lambda xp, rng: _m(xp, rng).argmax(axis=1),
    "argmin": lambda xp, rng: _m(xp, rng, dtype=F32).argmin(),
    "argmin-axis": lambda xp, rng: _m(xp, rng).argmin(0),
    "prod": lambda xp, rng: _m(xp, rng, low=0.5, high=1.5).prod(axis=1),
    "prod-int": lambda xp, rng: _m(xp, rng, dtype=I32, low=-2, high=2).prod(),
    "cumsum": lambda xp, rng: _m(xp, rng).cumsum(),
    "cumsum-axis": lambda xp, rng: _m(xp, rng, dtype=I32).cumsum(axis=1),
    "cumprod": lambda xp, rng: _m(xp, rng, low=0.5, high=1.5).cumprod(axis=0),
    "dot": lambda xp, rng: _m(xp, rng).dot(_m(xp, rng, (4, 2))),
    "dot-vector": lambda xp, rng: _m(xp, rng).dot(_m(xp, rng, (4,))),
    "clip": lambda xp, rng: _m(xp, rng).clip(-1, 1),
    "clip-min-only": lambda xp, rng: _m(xp, rng, dtype=I32).clip(0),
    "clip-max-kw": lambda xp, rng: _m(xp, rng).clip(max=0.5),
    "any": lambda xp, rng: _m(xp, rng, dtype=B).any(),
    "any-axis": lambda xp, rng: _m(xp, rng, dtype=I32, low=0, high=1).any(axis=0),
    "all": lambda xp, rng: _m(xp, rng, dtype=B).all(axis=1),
    "all-true": lambda xp, rng: _m(xp, rng, dtype=B, nonzero=True).all(),
    "argsort": lambda xp, rng: _m(xp, rng).argsort(),
    "argsort-axis": lambda xp, rng: _m(xp, rng).argsort(axis=0),
    "nonzero": lambda xp, rng: _m(xp, rng, dtype=I32, low=-1, high=1).nonzero(),
    "take": lambda xp, rng: _m(xp, rng).take([0, 5, -1]),
    "take-axis": lambda xp, rng: _m(xp, rng).take(np.array([3, 0]), axis=1),
    "repeat": lambda xp, rng: _m(xp, rng).repeat(2),
    "repeat-axis": lambda xp, rng: _m(xp, rng).repeat([1, 2, 0], axis=0),
    "conj": lambda xp, rng: _m(xp, rng, dtype=C64).conj(),
    "real": lambda xp, rng: _m(xp, rng, dtype=C64).real,
    "imag": lambda xp, rng: _m(xp, rng, dtype=C64).imag,
    "imag-of-real": lambda xp, rng: _m(xp, rng, dtype=F32).imag,
    "round": lambda xp, rng: _m(xp, rng).round(2),
    "diagonal": lambda xp, rng: _m(xp, rng).diagonal(),
    "trace": lambda xp, rng: _m(xp, rng, (4, 4)).trace(),
    "searchsorted": lambda xp, rng: xp.asarray([0.0, 1.0, 2.0, 3.0]).searchsorted(_m(xp, rng, (5,), low=0, high=3)),
    "view": lambda xp, rng: _m(xp, rng, dtype=F32).view(np.int32),
    "ptp": lambda xp, rng: xp.ptp(_m(xp, rng), axis=1) if xp is numpy else _m(xp, rng).ptp(axis=1),
    "ptp-all": lambda xp, rng: xp.ptp(_m(xp, rng, dtype=I32)) if xp is numpy else _m(xp, rng, dtype=I32).ptp(),
    "astype-python-type": lambda xp, rng: _m(xp, rng).astype(int),
    "astype-str": lambda xp, rng: _m(xp, rng).astype("f4"),
    "astype-copy-false": lambda xp, rng: _m(xp, rng, dtype=F32).astype(np.float32, copy=False),
    "fill-cast": lambda xp, rng: (lambda a: (a.fill(2.7), a)[1])(_m(xp, rng, dtype=I32)),
    "item": lambda xp, rng: _m(xp, rng, ()).item(),
    "item-index": lambda xp, rng: _m(xp, rng).item(5),
    "item-tuple": lambda xp, rng: _m(xp, rng, dtype=I32).item((2, 1)),
    "item-bool": lambda xp, rng: _m(xp, rng, (1,), dtype=B).item(),
    "item-complex": lambda xp, rng: _m(xp, rng, (1, 1), dtype=C64).item(),
    "tolist": lambda xp, rng: _m(xp, rng, (2, 3), dtype=I32).tolist(),
    "tolist-0d": lambda xp, rng: _m(xp, rng, ()).tolist(),
    "tolist-float32": lambda xp, rng: _m(xp, rng, (3,), dtype=F32).tolist(),
    "shape-attrs": lambda xp, rng: (lambda a: (a.shape, a.ndim, a.size, a.nbytes, a.itemsize, a.dtype.str))(
        _m(xp, rng, (2, 3, 4), dtype=F32)),
}


@pytest.mark.parametrize("body,kw", params(METHODS))
def test_ndarray_methods(cp, body, kw):
    check(body, cp, **kw)


@pytest.mark.filterwarnings("ignore::numpy.exceptions.ComplexWarning")
@pytest.mark.parametrize("dst", DTYPES, ids=str)
@pytest.mark.parametrize("src", [F64, I32, B, C64], ids=str)
def test_astype(cp, src, dst):
    if src == C64 and dst.kind not in "cb":
        # NumPy warns (ComplexWarning) and drops the imaginary part; so does CuPy
        with pytest.warns(np.exceptions.ComplexWarning):
            np.ones(1, C64).astype(dst)
    check(lambda xp, rng: _m(xp, rng, dtype=src, low=-3, high=3).astype(dst), cp)


@pytest.mark.parametrize("axis", [-1, 0, None])
def test_sort_method_in_place(cp, axis):
    def body(xp, rng):
        a = _m(xp, rng, (4, 5))
        r = a.sort() if axis == -1 else a.sort(axis=axis) if axis is not None else None
        return r, a
    check(body, cp)


def test_fill_and_set_and_get(cp):
    def body(xp, rng):
        a = _m(xp, rng, (3, 4))
        b = a[1]
        r = a.fill(2.5)
        return r, a, b
    check(body, cp)
    x = cp.zeros((2, 3), dtype=np.float32)
    h = host(np.random.default_rng(5), (2, 3), F32)
    assert x.set(h) is None
    np.testing.assert_array_equal(x.get(), h)
    out = np.empty((2, 3), np.float32)
    assert x.get(out=out) is out
    np.testing.assert_array_equal(out, h)
    assert x.get(order="F").flags.f_contiguous
    with pytest.raises(ValueError):
        x.set(np.zeros((3, 2)))


def test_unsupported_dtypes_are_refused(cp):
    x = cp.ones(3)
    with pytest.raises(TypeError):
        x.astype("U3").get()
    with pytest.raises(TypeError):
        cp.asarray(np.array(["a", "b"]))
    with pytest.raises(TypeError):
        cp.asarray(np.array([object(), 1], dtype=object))


def test_item_errors(cp):
    check_raises(lambda xp, rng: _m(xp, rng).item(), cp, ValueError)
    check_raises(lambda xp, rng: _m(xp, rng).item(100), cp, IndexError)


# ------------------------------------------------------------------------------------------
# operators
# ------------------------------------------------------------------------------------------

ARITH = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "truediv": operator.truediv,
         "floordiv": operator.floordiv, "mod": operator.mod, "pow": operator.pow}
BITOPS = {"and": operator.and_, "or": operator.or_, "xor": operator.xor, "lshift": operator.lshift,
          "rshift": operator.rshift}
CMPOPS = {"eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le, "gt": operator.gt,
          "ge": operator.ge}
INPLACE = {"add": operator.iadd, "sub": operator.isub, "mul": operator.imul, "truediv": operator.itruediv,
           "floordiv": operator.ifloordiv, "mod": operator.imod, "pow": operator.ipow, "and": operator.iand,
           "or": operator.ior, "xor": operator.ixor, "lshift": operator.ilshift, "rshift": operator.irshift}


def _operands(xp, rng, name, dtype, form, shape=(3, 4)):
    dtype = np.dtype(dtype)
    a_kw, b_kw = {}, {}
    if name in ("truediv", "floordiv", "mod"):
        b_kw = {"nonzero": True}
    if name == "pow":
        a_kw = {"low": 0.5, "high": 2} if dtype.kind in "fc" else {"low": -3, "high": 3}
        b_kw = {"low": -2, "high": 2} if dtype.kind in "fc" else {"low": 0, "high": 3}
    if name in ("lshift", "rshift"):
        b_kw = {"low": 0, "high": 4}
    a = arr(xp, rng, shape, dtype, **a_kw)
    scalar = {"b": True, "i": 3, "f": 1.5, "c": 1.5}[dtype.kind] if name != "pow" else 2
    if form == "dd":
        return a, arr(xp, rng, shape, dtype, **b_kw)
    if form == "bcast":
        return a, arr(xp, rng, shape[-1:], dtype, **b_kw)
    if form == "ds":
        return a, scalar
    # "sd": the scalar on the left (reflected operator)
    return scalar, arr(xp, rng, shape, dtype, **b_kw)


def _op_params():
    out = []
    for name in ARITH:
        for dt in [F64, F32, I32, I64, C64]:
            if dt.kind == "c" and name in ("floordiv", "mod"):
                continue
            forms = ["dd", "ds", "sd"] if dt in (F64, I32) else ["dd"]
            for form in forms:
                out.append(pytest.param(ARITH[name], name, dt, form, id=f"{name}-{dt}-{form}"))
    for name in BITOPS:
        for dt in [I32, I64, B]:
            if dt == B and name in ("lshift", "rshift"):
                continue
            for form in (["dd", "ds", "sd", "bcast"] if dt == I32 else ["dd"]):
                out.append(pytest.param(BITOPS[name], name, dt, form, id=f"{name}-{dt}-{form}"))
    for name in CMPOPS:
        for dt in [F64, I32, B]:
            for form in (["dd", "ds", "sd", "bcast"] if dt == F64 else ["dd"]):
                out.append(pytest.param(CMPOPS[name], name, dt, form, id=f"{name}-{dt}-{form}"))
    return out


@pytest.mark.parametrize("fn,name,dtype,form", _op_params())
def test_operator(cp, fn, name, dtype, form):
    def body(xp, rng):
        a, b = _operands(xp, rng, name, dtype, form)
        if name in CMPOPS:  # make equal elements likely
            a, b = (xp.round(x) if not isinstance(x, (bool, int, float)) and dtype.kind == "f" else x for x in (a, b))
        return fn(a, b)
    check(body, cp)


def _inplace_params():
    out = []
    for name, fn in INPLACE.items():
        for dt in ([F64, F32, I32] if name in ARITH else [I32, I64, B]):
            if dt == B and name in ("lshift", "rshift"):
                continue
            if dt == I32 and name == "truediv":
                continue  # a casting error: tested below
            for form in (["dd", "ds"] if dt in (F64, I32) else ["dd"]):
                out.append(pytest.param(fn, name, dt, form, id=f"i{name}-{dt}-{form}"))
        out.append(pytest.param(fn, name, F64 if name in ARITH else I64, "bcast", id=f"i{name}-bcast"))
    return out


@pytest.mark.parametrize("fn,name,dtype,form", _inplace_params())
def test_inplace_operator(cp, fn, name, dtype, form):
    def body(xp, rng):
        a, b = _operands(xp, rng, name, dtype, form)
        alias = a
        r = fn(a, b)
        return r is alias, r, alias
    check(body, cp)


@pytest.mark.parametrize("fn", [operator.neg, operator.pos, abs, operator.invert], ids=lambda f: f.__name__)
@pytest.mark.parametrize("dtype", [F64, F32, I32, I64, B, C64], ids=str)
def test_unary_operator(cp, fn, dtype):
    if dtype == B and fn in (operator.neg, operator.pos):
        check_raises(lambda xp, rng: fn(_m(xp, rng, dtype=dtype)), cp, TypeError)
        return
    if dtype.kind in "fc" and fn is operator.invert:
        check_raises(lambda xp, rng: fn(_m(xp, rng, dtype=dtype)), cp, TypeError)
        return
    check(lambda xp, rng: fn(_m(xp, rng, dtype=dtype)), cp)


MATMUL_OPS = {
    "matmul": lambda xp, rng: _m(xp, rng, (3, 4)) @ _m(xp, rng, (4, 2)),
    "matmul-vec": lambda xp, rng: _m(xp, rng, (4,)) @ _m(xp, rng, (4, 2)),
    "matmul-batch-int": lambda xp, rng: _m(xp, rng, (2, 3, 4), I32) @ _m(xp, rng, (4, 3), I32),
    "imatmul": lambda xp, rng: (lambda a: (a.__imatmul__(_m(xp, rng, (4, 4))), a))(_m(xp, rng, (3, 4))),
    "divmod": lambda xp, rng: divmod(_m(xp, rng), 1.5),
    "divmod-int": lambda xp, rng: divmod(_m(xp, rng, dtype=I32), _m(xp, rng, dtype=I32, nonzero=True)),
    "rdivmod": lambda xp, rng: divmod(7, _m(xp, rng, dtype=I64, nonzero=True)),
    "rsub": lambda xp, rng: 2 - _m(xp, rng),
    "rtruediv": lambda xp, rng: 1 / _m(xp, rng, dtype=I32, nonzero=True),
    "rpow": lambda xp, rng: 2 ** _m(xp, rng, dtype=I32, low=0, high=5),
    "rpow-float": lambda xp, rng: 0.5 ** _m(xp, rng),
    "rmod": lambda xp, rng: 7.5 % _m(xp, rng, nonzero=True),
    "rfloordiv": lambda xp, rng: 7 // _m(xp, rng, dtype=I32, nonzero=True),
    "rlshift": lambda xp, rng: 1 << _m(xp, rng, dtype=I64, low=0, high=10),
    "rrshift": lambda xp, rng: 1024 >> _m(xp, rng, dtype=I32, low=0, high=10),
    "rand-bool": lambda xp, rng: True & _m(xp, rng, dtype=B),
    "ror-int": lambda xp, rng: 8 | _m(xp, rng, dtype=I32),
    "rxor": lambda xp, rng: 5 ^ _m(xp, rng, dtype=I64),
    "reflected-cmp": lambda xp, rng: 0.5 < _m(xp, rng),
    "chain": lambda xp, rng: (lambda a, b: (a + b) * (a - b) / (abs(b) + 1) - a ** 2 // 3)(_m(xp, rng), _m(xp, rng)),
    "mixed-device-kinds": lambda xp, rng: _m(xp, rng, dtype=I32) + _m(xp, rng, dtype=F32),
    "complex-times-int": lambda xp, rng: _m(xp, rng, dtype=C64) * _m(xp, rng, dtype=I64),
    "0d-plus-array": lambda xp, rng: _m(xp, rng, ()) + _m(xp, rng),
    "np-scalar-left": lambda xp, rng: np.float32(2) * _m(xp, rng, dtype=F32),
    "np-scalar-right": lambda xp, rng: _m(xp, rng, dtype=I32) - np.int64(4),
    "int-pow-float": lambda xp, rng: _m(xp, rng, dtype=I32, low=0, high=5) ** 0.5,
    "eq-none": lambda xp, rng: _m(xp, rng) == None,  # noqa: E711
    "ne-none": lambda xp, rng: _m(xp, rng, dtype=I32) != None,  # noqa: E711
    "matmul-list": lambda xp, rng: _m(xp, rng, (2, 3)) @ [1.0, 2.0, 3.0],
}


@pytest.mark.parametrize("body,kw", params(MATMUL_OPS))
def test_operator_misc(cp, body, kw):
    check(body, cp, **kw)


def test_operator_errors(cp):
    # in-place results must be castable to the left operand's dtype
    check_raises(lambda xp, rng: operator.itruediv(_m(xp, rng, dtype=I32), 2), cp, TypeError)
    check_raises(lambda xp, rng: operator.iadd(_m(xp, rng, dtype=I64), 1.5), cp, TypeError)
    check_raises(lambda xp, rng: operator.iadd(_m(xp, rng, (4,)), _m(xp, rng, (3, 4))), cp, ValueError)
    check_raises(lambda xp, rng: _m(xp, rng, (3,)) + _m(xp, rng, (4,)), cp, ValueError)
    check_raises(lambda xp, rng: _m(xp, rng, dtype=F64) & 1, cp, TypeError)
    check_raises(lambda xp, rng: _m(xp, rng, dtype=B) - _m(xp, rng, dtype=B), cp, TypeError)
    check_raises(lambda xp, rng: _m(xp, rng, dtype=I32) + 2 ** 40, cp, OverflowError)
    check_raises(lambda xp, rng: _m(xp, rng, (3, 4)) @ _m(xp, rng, (3, 4)), cp, ValueError)
    check_raises(lambda xp, rng: 2 @ _m(xp, rng, (3, 4)), cp, ValueError)
    check_raises(lambda xp, rng: _m(xp, rng, (3, 4)) @ 2, cp, ValueError)
    check_raises(lambda xp, rng: _m(xp, rng, dtype=I32) ** -1, cp, ValueError)
    check_raises(lambda xp, rng: _m(xp, rng, (3,)) == _m(xp, rng, (4,)), cp, ValueError)


# ------------------------------------------------------------------------------------------
# Python protocol
# ------------------------------------------------------------------------------------------

PROTOCOL = {
    "len": lambda xp, rng: len(_m(xp, rng, (4, 3))),
    "iter-1d": lambda xp, rng: list(_m(xp, rng, (3,))),
    "iter-2d": lambda xp, rng: list(_m(xp, rng, (3, 2), I32)),
    "iter-unpack": lambda xp, rng: (lambda a: tuple(x * 2 for x in a))(_m(xp, rng, (2, 2))),
    "bool-true": lambda xp, rng: bool(_m(xp, rng, (1,), nonzero=True)),
    "bool-false": lambda xp, rng: bool(xp.zeros(())),
    "bool-0d-int": lambda xp, rng: bool(_m(xp, rng, (), I32, nonzero=True)),
    "int": lambda xp, rng: int(_m(xp, rng, ())),
    "int-of-int": lambda xp, rng: int(_m(xp, rng, (), I64)),
    "int-1elem": lambda xp, rng: int(_m(xp, rng, (), I32, low=-100, high=100)),
    "float": lambda xp, rng: float(_m(xp, rng, (), F32)),
    "float-of-int": lambda xp, rng: float(_m(xp, rng, (), I32)),
    "complex": lambda xp, rng: complex(_m(xp, rng, (), C64)),
    "complex-of-float": lambda xp, rng: complex(_m(xp, rng, ())),
    "abs": lambda xp, rng: abs(_m(xp, rng, (3,), C64)),
    "repr": lambda xp, rng: repr(_m(xp, rng, (2, 3), F32)),
    "repr-int": lambda xp, rng: repr(_m(xp, rng, (4,), I64)),
    "str": lambda xp, rng: str(_m(xp, rng, (2, 2))),
    "format-0d": lambda xp, rng: format(_m(xp, rng, ()), ".3f"),
    "format-fstring": lambda xp, rng: f"{_m(xp, rng, (), I32):>5d}",
    "format-empty-spec": lambda xp, rng: format(_m(xp, rng, (3,), I32)),
    "index": lambda xp, rng: operator.index(xp.asarray(3)),
    "index-list": lambda xp, rng: [10, 20, 30, 40][xp.asarray(np.int64(2))],
    "range": lambda xp, rng: list(range(xp.asarray(4))),
    "in-membership": lambda xp, rng: (xp.asarray(2.0) in [1.0, 2.0], 5 in _m(xp, rng, (3,), I32, low=5, high=5)),
    "if": lambda xp, rng: "yes" if _m(xp, rng, (), nonzero=True, low=1, high=2) else "no",
    "min-builtin": lambda xp, rng: float(min(_m(xp, rng, (4,)))),
    "sum-builtin": lambda xp, rng: sum(_m(xp, rng, (4,), I32)),
    "int-0d": lambda xp, rng: int(_a(xp, rng, (), I32)),
    "bool-1elem": lambda xp, rng: bool(_a(xp, rng, (1,), I32)),
    "float-1elem-2d-bool": lambda xp, rng: bool(_a(xp, rng, (1, 1))),
    "complex-bool": lambda xp, rng: complex(_a(xp, rng, (), B)),
    "int-bool": lambda xp, rng: int(_a(xp, rng, (), B)),
    "float-uint": lambda xp, rng: float(xp.asarray(np.uint8(7))),
    "len-empty": lambda xp, rng: len(_a(xp, rng, (0, 3))),
}


@pytest.mark.parametrize("body,kw", params(PROTOCOL))
def test_python_protocol(cp, body, kw):
    check(body, cp, **kw)


def test_python_protocol_errors(cp):
    check_raises(lambda xp, rng: len(_m(xp, rng, ())), cp, TypeError)
    check_raises(lambda xp, rng: iter(_m(xp, rng, ())), cp, TypeError)
    check_raises(lambda xp, rng: bool(_m(xp, rng, (2,))), cp, ValueError)
    check_raises(lambda xp, rng: bool(_m(xp, rng, (0,))), cp, ValueError)
    check_raises(lambda xp, rng: int(_m(xp, rng, (2,))), cp, TypeError)
    check_raises(lambda xp, rng: float(_m(xp, rng, (2, 2))), cp, TypeError)
    check_raises(lambda xp, rng: operator.index(_m(xp, rng, ())), cp, TypeError)
    check_raises(lambda xp, rng: hash(_m(xp, rng, (2,))), cp, TypeError)


CONVERSION_ERRORS = {
    "int-1elem": (lambda xp, rng: int(_a(xp, rng, (1,))), TypeError),
    "float-complex": (lambda xp, rng: float(_a(xp, rng, (), C64)), TypeError),
    "int-complex": (lambda xp, rng: int(_a(xp, rng, (), C64)), TypeError),
    "index-bool": (lambda xp, rng: operator.index(_a(xp, rng, (), B)), TypeError),
    "index-1elem": (lambda xp, rng: operator.index(_a(xp, rng, (1,), I32)), TypeError),
    "float-1d": (lambda xp, rng: float(_a(xp, rng, (1,))), TypeError),
    "slice-step-zero": (lambda xp, rng: _a(xp, rng, (4,))[::0], ValueError),
    "idx-float-array": (lambda xp, rng: _a(xp, rng, (4,))[np.array([1.0])], IndexError),
    "idx-too-many": (lambda xp, rng: _a(xp, rng, (4,))[0, 0], IndexError),
    "two-ellipsis": (lambda xp, rng: _a(xp, rng, (4,))[..., ...], IndexError),
    "transpose-bad": (lambda xp, rng: _a(xp, rng, (2, 3)).transpose(0, 0), ValueError),
    "reshape-two-minus": (lambda xp, rng: _a(xp, rng, (2, 3)).reshape(-1, -1), ValueError),
}


@pytest.mark.parametrize("name", list(CONVERSION_ERRORS))
def test_conversion_errors(cp, name):
    body, exc = CONVERSION_ERRORS[name]
    check_raises(body, cp, exc)


# ------------------------------------------------------------------------------------------
# asnumpy, get_array_module, no implicit conversion
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_asnumpy(cp, dtype):
    h = host(np.random.default_rng(1), (3, 4), dtype)
    d = cp.asarray(h)
    out = cp.asnumpy(d)
    assert type(out) is np.ndarray and out.dtype == dtype and out.shape == (3, 4)
    np.testing.assert_array_equal(out, h)
    np.testing.assert_array_equal(cp.asnumpy(h), h)            # host arrays pass through
    np.testing.assert_array_equal(cp.asnumpy([1, 2]), np.array([1, 2]))
    buf = np.empty((3, 4), dtype)
    assert cp.asnumpy(d, out=buf) is buf
    np.testing.assert_array_equal(buf, h)
    np.testing.assert_array_equal(cp.asnumpy(d[1:, ::-1]), h[1:, ::-1])


def test_get_array_module(cp):
    h = np.ones(3)
    d = cp.asarray(h)
    assert cp.get_array_module(h) is np
    assert cp.get_array_module(1.0, [1, 2]) is np
    assert cp.get_array_module() is np
    assert cp.get_array_module(d) is cp
    assert cp.get_array_module(h, d) is cp
    assert cp.get_array_module(d + 1, 2) is cp
    xp = cp.get_array_module(d)
    np.testing.assert_array_equal(xp.sum(d * 2).get(), 6.0)


@pytest.mark.parametrize("convert", [np.asarray, np.array, np.ascontiguousarray, lambda x: np.add(np.ones(3), x),
                                     lambda x: np.insert(x, 1, 5.0), lambda x: np.float64(1.0) * np.asarray(x)],
                         ids=["asarray", "array", "ascontiguousarray", "ufunc", "not-forwarded", "mixed"])
def test_no_implicit_conversion_to_numpy(cp, convert):
    d = cp.arange(3, dtype=np.float64)
    with pytest.raises(TypeError):
        convert(d)


def test_metadata_cache_tells_equal_values_of_different_types_apart(cp):
    """The client caches derived metadata per call signature (gpuremote/cupy/_core.py): 1, 1.0,
    True, numpy.float32(1) and (2,) vs [2] must not share an entry where NumPy tells them apart."""
    for _ in range(2):          # the second round is served from the cache
        assert cp.full((2,), 1).dtype == numpy.full((2,), 1).dtype
        assert cp.full((2,), 1.0).dtype == numpy.float64
        assert cp.full((2,), True).dtype == numpy.bool_
        assert cp.full((2,), numpy.float32(1)).dtype == numpy.float32
        assert cp.full((2,), 1j).dtype == numpy.complex128
        a = cp.arange(6).reshape(2, 3)
        assert a.sum(axis=0).shape == (3,) and a.sum(axis=1).shape == (2,)
        assert a.sum(axis=(0, 1)).shape == () and a.sum(axis=0, keepdims=True).shape == (1, 3)
        assert a[0:1].shape == (1, 3) and a[0:1, 1:].shape == (1, 2) and a[None].shape == (1, 2, 3)
        assert cp.zeros([2, 3], dtype=numpy.float32).dtype == numpy.float32
        assert cp.zeros((2, 3), dtype="int8").dtype == numpy.int8


def test_in1d_which_numpy_2_4_removed(cp):
    """cupy.in1d exists (CuPy keeps it); on the emulated device it is isin on the flattened input."""
    a, b = numpy.arange(12).reshape(3, 4), numpy.array([1, 5, 7, 11])
    got = cp.in1d(cp.asarray(a), cp.asarray(b))
    numpy.testing.assert_array_equal(got.get(), numpy.isin(a.ravel(), b))
    numpy.testing.assert_array_equal(cp.in1d(cp.asarray(a), cp.asarray(b), invert=True).get(),
                                     numpy.isin(a.ravel(), b, invert=True))


def test_polyfit_prints_nothing(cp, capfd):
    # Probing polyfit's metadata on zero stand-ins made LAPACK print "On entry to DLASCL parameter
    # number 4 had an illegal value" on the user's terminal; its metadata is left to the daemon.
    fit = cp.polyfit(cp.arange(8.0), cp.arange(8.0) ** 2, 2)
    assert np.allclose(fit.get(), [1.0, 0.0, 0.0], atol=1e-8)
    out, err = capfd.readouterr()
    assert "DLASCL" not in out + err
