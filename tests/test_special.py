"""cupyx.scipy.special through a real daemon: each function's values against SciPy's, the one
dtype rule on client and daemon (float32 stays float32, everything else is float64), broadcasting,
replayed calls, the functions composed on the client (softmax, log_softmax, logsumexp, polygamma)
against SciPy's with inf and nan inputs and axis tuples, and arguments the functions do not take,
refused at the caller's line, on the wire, and by the daemon's size bounds before anything exists."""

from __future__ import annotations

import numpy as np
import pytest

import gpuremote
from gpuremote.errors import OutOfMemoryError
from gpuremote.surface import SPECIAL_INPUTS
from gpuremote.meta import special_dtype

from conftest import DaemonProcess, backend_args
from test_hostile import (H, batch, call, connected, error_of, memory_used, opening, raw_session, replies,
                          settle, upload)

scipy_special = pytest.importorskip("scipy.special")
F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
NAMES = sorted(SPECIAL_INPUTS)


# Where (0, 1) is outside a function's domain or says little of it: each argument mapped from there.
DOMAIN = {
    "zeta": lambda x, q: (x + 1.5, q),                      # x > 1
    "expn": lambda n, x: (np.floor(n * 4), x * 3),          # orders 0..3; x on both sides of 1
    "binom": lambda n, k: (n * 10, k * 3),
    "exprel": lambda x: (x * 20 - 10,),
    "sindg": lambda x: (x * 360 - 180,), "cosdg": lambda x: (x * 360 - 180,),
    "tandg": lambda x: (x * 360 - 180,), "cotdg": lambda x: (x * 360 - 180,),
    "round": lambda x: (x * 10,),                           # 0.5 and 9.5: halves go to even
    "radian": lambda d, m, s: (d * 360, m * 60, s * 60),
}


def inputs(name: str, dtype) -> list[np.ndarray]:
    """Arguments inside the function's domain (erfinv, logit, ndtri: (0, 1); boxcox: x > 0; DOMAIN)."""
    x = np.linspace(0.05, 0.95, 12).reshape(3, 4)
    args = [x, x[::-1] * 0.5 + 0.25, x * 0.3 + 0.1][:SPECIAL_INPUTS[name]]
    if name in DOMAIN:
        args = DOMAIN[name](*args)
    return [a.astype(dtype) for a in args]


# Two 64 MiB daemons: csp holds a session open on one all along; the tests of what a daemon is left
# with after a refusal need the other idle.
@pytest.fixture(scope="module")
def shared():
    d = DaemonProcess(*backend_args(devices=1, memory="64MiB"))
    yield d
    d.stop()


@pytest.fixture(scope="module")
def bounded():
    d = DaemonProcess(*backend_args(devices=1, memory="64MiB"))
    yield d
    d.stop()


@pytest.fixture
def target(bounded):
    """The bounded daemon; afterwards alive, with no session and its memory as before (nothing left behind)."""
    settle(bounded, None)
    baseline = memory_used(bounded)
    yield bounded
    assert bounded.proc.poll() is None, "the daemon died"
    settle(bounded, baseline)


@pytest.fixture(scope="module")
def csp(shared):
    with connected(shared.address) as (cp, _):
        import gpuremote.cupyx.scipy.special as special
        yield cp, special


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [F32, F64])
def test_values_match_scipy(csp, name, dtype):
    cp, special = csp
    host = inputs(name, dtype)
    got = getattr(special, name)(*[cp.asarray(h) for h in host])
    assert (got.shape, got.dtype) == ((3, 4), dtype)                # derived on the client
    value = got.get()
    assert value.dtype == dtype                                      # made on the daemon
    fn = getattr(scipy_special, name)
    want = fn(*host, dtype=dtype) if isinstance(fn, np.ufunc) else fn(*host)     # (SciPy's zeta takes no dtype)
    assert np.isfinite(want).all()                                   # the inputs are inside the domain
    np.testing.assert_allclose(value, want, rtol=2e-5 if dtype == F32 else 1e-10, atol=1e-30, equal_nan=True)


@pytest.mark.parametrize("dtypes,want", [
    ((F32,), F32), ((F64,), F64), ((np.dtype(np.int64),), F64), ((np.dtype(np.bool_),), F64),
    ((np.dtype(np.float16),), F64), ((np.dtype(np.int8),), F64), ((F32, F64), F64), ((F32, F32), F32), ((), F64),
])
def test_one_dtype_rule(dtypes, want):
    assert special_dtype([np.dtype(d) for d in dtypes]) == want


def test_dtypes_broadcasting_and_scalars_on_the_device(csp):
    cp, special = csp
    x32 = cp.asarray(np.linspace(0.1, 0.9, 4, dtype=np.float32))
    col64 = cp.asarray(np.full((3, 1), 0.5))
    cases = [
        (special.xlogy(x32, 2.0), (4,), F32),                  # a Python scalar does not widen
        (special.xlogy(2, x32), (4,), F32),
        (special.beta(x32, col64), (3, 4), F64),              # float32 with float64 broadcast
        (special.erf(cp.arange(4)), (4,), F64),                # integers compute in float64
        (special.expit(cp.asarray([True, False])), (2,), F64),
        (special.gamma(x32[0]), (), F32),                      # 0-d
    ]
    for got, shape, dtype in cases:
        assert (got.shape, got.dtype) == (shape, dtype)
        value = got.get()
        assert (value.shape, value.dtype) == (shape, dtype)
    np.testing.assert_allclose(special.beta(x32, col64).get(),
                               scipy_special.beta(x32.get().astype(F64), np.full((3, 1), 0.5)))


def test_a_loop_replays_special_calls(csp):
    cp, special = csp
    x = cp.asarray(np.linspace(0.1, 0.9, 8, dtype=np.float32))
    before = gpuremote.stats()["replayed"]
    acc = cp.zeros(8, dtype=cp.float32)
    for k in range(6):
        acc += special.expit(x * np.float32(k)) + special.xlogy(x, np.float32(k + 1))
    assert gpuremote.stats()["replayed"] > before
    host = x.get()
    want = sum(scipy_special.expit(host * np.float32(k)) + scipy_special.xlogy(host, np.float32(k + 1))
               for k in range(6))
    np.testing.assert_allclose(acc.get(), want, rtol=1e-5)


@pytest.mark.parametrize("bad,message", [
    (lambda cp, s: s.erf(cp.ones(3, dtype=cp.complex64)), "take real arrays"),
    (lambda cp, s: s.erf(cp.ones(3), cp.ones(3)), "takes 1 argument (2 given)"),
    (lambda cp, s: s.xlogy(cp.ones(3)), "takes 2 arguments (1 given)"),
    (lambda cp, s: s.erf(), "takes 1 argument (0 given)"),
    (lambda cp, s: s.erf([0.5, 0.2]), "convert it with cupy.asarray"),
    (lambda cp, s: s.erf("0.5"), "not str"),
    (lambda cp, s: s.xlogy(cp.ones(3), 1j), "not complex"),
    (lambda cp, s: s.erf(cp.ones(3), out=cp.ones(3)), "no keyword arguments"),
    (lambda cp, s: s.beta(cp.ones(3), cp.ones(4)), "broadcast"),
    (lambda cp, s: s.radian(cp.ones(3), cp.ones(3)), "takes 3 arguments (2 given)"),
    (lambda cp, s: s.zeta(cp.full(3, 2.0)), "takes 2 arguments (1 given)"),     # SciPy's Riemann zeta(x): not CuPy's
    (lambda cp, s: s.gammainc(cp.ones(3), cp.ones(3), dtype=cp.float32), "no keyword arguments"),
    (lambda cp, s: s.expn(cp.ones(3, dtype=cp.complex128), cp.ones(3)), "take real arrays"),
    (lambda cp, s: s.softmax(cp.ones(3, dtype=cp.complex64)), "take real arrays"),
    (lambda cp, s: s.log_softmax(np.ones(3)), "convert it with cupy.asarray"),
    (lambda cp, s: s.softmax([1.0, 2.0]), "convert it with cupy.asarray"),
    (lambda cp, s: s.softmax(cp.ones(3), axis=1), "out of bounds"),
    (lambda cp, s: s.softmax(cp.ones((0, 3))), "zero-size array"),
    (lambda cp, s: s.softmax(cp.ones(3), 0, 1), "takes from 1 to 2 positional arguments"),
    (lambda cp, s: s.log_softmax(cp.ones(3), out=cp.ones(3)), "unexpected keyword argument 'out'"),
    (lambda cp, s: s.logsumexp(cp.ones(3), b=cp.ones(3, dtype=cp.complex128)), "take real arrays"),
    (lambda cp, s: s.logsumexp(cp.ones(3), b=1j), "not complex"),
    (lambda cp, s: s.logsumexp(cp.ones(3), b=[1, 2, 3]), "convert it with cupy.asarray"),
    (lambda cp, s: s.logsumexp(cp.ones(3), b=cp.ones(4)), "broadcast"),
    (lambda cp, s: s.logsumexp(cp.ones((2, 3)), axis=(0, 0)), "duplicate value in .axis."),
    (lambda cp, s: s.logsumexp(cp.ones(3), dtype=cp.float32), "unexpected keyword argument 'dtype'"),
    (lambda cp, s: s.polygamma(cp.ones(3)), "missing 1 required positional argument"),
    (lambda cp, s: s.polygamma("1", cp.ones(3)), "not str"),
    (lambda cp, s: s.polygamma(cp.ones(3, dtype=cp.complex64), 1.0), "take real arrays"),
])
def test_bad_arguments_raise_at_the_call(csp, bad, message):
    cp, special = csp
    with pytest.raises((TypeError, ValueError), match=message.replace("(", r"\(").replace(")", r"\)")):
        bad(cp, special)
    assert float(cp.ones(2).sum()) == 2.0                       # the session goes on


def test_unknown_special_names_are_refused(csp):
    _, special = csp
    with pytest.raises(AttributeError, match="surface table"):
        special.wrightomega


def test_orders_and_scalars_follow_the_one_rule(csp):
    cp, special = csp
    n, x = np.arange(4), np.linspace(0.5, 2.5, 4)
    x32 = x.astype(F32)
    cases = [   # (got, SciPy's value, the rule's dtype): an int array widens, an int scalar does not, nor
        # a float64 one (SciPy's zeta would widen for it)
        (special.expn(cp.asarray(n), cp.asarray(x)), scipy_special.expn(n, x), F64),
        (special.expn(cp.asarray(n), cp.asarray(x32)), scipy_special.expn(n, x32.astype(F64)), F64),
        (special.expn(2, cp.asarray(x32)), scipy_special.expn(2, x32), F32),
        (special.zeta(cp.asarray(x32 + 1), np.float64(0.5)), scipy_special.zeta(x32 + 1, np.float32(0.5)), F32),
        (special.radian(cp.asarray(x32), 30, 0.5), scipy_special.radian(x32, 30, 0.5), F32),
        (special.round(cp.arange(-3, 4) * 0.5), scipy_special.round(np.arange(-3, 4) * 0.5), F64),
        (special.gammaincinv(cp.asarray(x), 0.25), scipy_special.gammaincinv(x, 0.25), F64),
    ]
    for got, want, dtype in cases:
        value = got.get()
        assert got.dtype == value.dtype == dtype
        np.testing.assert_allclose(value, want, rtol=2e-6 if dtype == F32 else 1e-13)


# -- softmax, log_softmax, logsumexp, polygamma: composed on the client --------------------------

AXES = [None, 0, -1, (0, 2), (2, 1), (0, 1, 2)]


def with_edges(dtype) -> np.ndarray:
    """Values of every magnitude, an axis all -inf, an inf, a -inf and a nan."""
    x = np.random.default_rng(7).standard_normal((3, 4, 5)) * 30
    x[0, 0, :] = -np.inf
    x[1, 1, 1] = np.inf
    x[2, 2, 2] = -np.inf
    x[2, 3, 4] = np.nan
    return x.astype(dtype)


def close(got, want, dtype) -> None:
    value = got.get()
    assert got.shape == value.shape == np.shape(want)
    assert got.dtype == value.dtype == dtype
    np.testing.assert_allclose(value, want, rtol=1e-6 if dtype == F32 else 1e-13, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", [F32, F64])
def test_softmax_and_log_softmax_match_scipy(csp, dtype):
    cp, special = csp
    host = with_edges(dtype)
    x = cp.asarray(host)
    with np.errstate(all="ignore"):
        for axis in AXES:
            close(special.softmax(x, axis=axis), scipy_special.softmax(host, axis=axis), dtype)
            close(special.log_softmax(x, axis), scipy_special.log_softmax(host, axis), dtype)
        close(special.softmax(cp.arange(5)), scipy_special.softmax(np.arange(5)), F64)      # integers: float64
        close(special.log_softmax(x[0, 1, 2]), scipy_special.log_softmax(host[0, 1, 2]), dtype)  # 0-d


@pytest.mark.parametrize("dtype", [F32, F64])
def test_logsumexp_matches_scipy(csp, dtype):
    cp, special = csp
    host = with_edges(dtype)
    weights = np.random.default_rng(8).uniform(-1, 2, host.shape).astype(dtype)
    weights[0, 1, :2] = 0                   # a zero weight drops even an inf term
    weights[1, 1, 1] = 0
    x, b = cp.asarray(host), cp.asarray(weights)
    cases = [(None, None), (b, weights), (2.0, 2.0), (b[0, 0], weights[0, 0])]    # (b[0, 0]: broadcast)
    with np.errstate(all="ignore"):
        for axis in AXES:
            for (got_b, want_b), keepdims in zip(cases, (False, True, False, True)):
                close(special.logsumexp(x, axis, got_b, keepdims),
                      scipy_special.logsumexp(host, axis, want_b, keepdims), dtype)
            for got, want in zip(special.logsumexp(x, axis=axis, b=b, return_sign=True),
                                 scipy_special.logsumexp(host, axis=axis, b=weights, return_sign=True)):
                close(got, want, dtype)


def test_logsumexp_keeps_precision_and_shapes(csp):
    cp, special = csp
    tiny = np.array([0.0, -40.0, -45.0])                    # log1p of the rest: not lost against 1
    close(special.logsumexp(cp.asarray(tiny)), scipy_special.logsumexp(tiny), F64)
    assert special.logsumexp(cp.asarray(tiny)).get() > 0
    cancel = (cp.asarray([1.0, 1.0]), np.array([1.0, 1.0]))
    for got, want in zip(special.logsumexp(cancel[0], b=cp.asarray([1.0, -1.0]), return_sign=True),
                         scipy_special.logsumexp(cancel[1], b=[1.0, -1.0], return_sign=True)):
        close(got, want, F64)                              # log 0 = -inf, sign 0
    close(special.logsumexp(cp.arange(6)), scipy_special.logsumexp(np.arange(6)), F64)
    close(special.logsumexp(cp.asarray(1.5), keepdims=True), scipy_special.logsumexp(1.5, keepdims=True), F64)
    out, sign = special.logsumexp(cp.zeros((0, 3)), axis=0, return_sign=True)     # empty: -inf, sign 0
    np.testing.assert_array_equal(out.get(), np.full(3, -np.inf))
    np.testing.assert_array_equal(sign.get(), np.zeros(3))


def test_polygamma_matches_scipy(csp):
    cp, special = csp
    n, x = np.arange(4), np.linspace(0.3, 4.0, 12).reshape(3, 4)
    close(special.polygamma(cp.asarray(n), cp.asarray(x)), scipy_special.polygamma(n, x), F64)
    close(special.polygamma(cp.asarray(n), 2.5), scipy_special.polygamma(n, 2.5), F64)
    x32 = x.astype(F32)
    for order in (0, 1, 3):
        close(special.polygamma(order, cp.asarray(x32)), scipy_special.polygamma(order, x32).astype(F32), F32)


HUGE = {   # 32 MiB results of small arguments: each fits the session's 64 MiB, not what 40 MiB held leave
    "gammainc": lambda cp, s: s.gammainc(cp.ones((2048, 1)), cp.ones((1, 2048))),
    "radian": lambda cp, s: s.radian(cp.ones((128, 1, 1)), cp.ones((1, 128, 1)), cp.ones((1, 1, 256))),
    "polygamma": lambda cp, s: s.polygamma(cp.ones((2048, 1)), cp.ones((1, 2048))),
    "logsumexp": lambda cp, s: s.logsumexp(cp.ones((2048, 1)), b=cp.ones((1, 2048)), axis=0),
    "softmax": lambda cp, s: s.softmax(cp.broadcast_to(cp.ones(1), (2048, 2048))),
}


def test_huge_broadcasts_are_refused_before_they_exist(target):
    """The client lets each through (the session could hold it); the daemon's bound refuses it before
    its op runs, for the whole broadcast result. Past the session's whole capacity, the client refuses
    at the call. Nothing is left behind (target). One session for all: connecting is the slow part."""
    with connected(target.address) as (cp, _):
        import gpuremote.cupyx.scipy.special as special
        held = cp.ones(5 * 2**20)                                   # 40 MiB
        for name, make in HUGE.items():
            with pytest.raises(OutOfMemoryError, match="allocated so far"):      # (the daemon's ledger)
                make(cp, special).get()
                pytest.fail(f"{name}: not refused")
            assert float(cp.ones(3).sum()) == 3.0                   # the session goes on
        del held
        with pytest.raises(OutOfMemoryError, match="refused before the op was sent"):     # 128 MiB
            special.gammainc(cp.ones((4096, 1)), cp.ones((1, 4096)))


def test_the_daemon_refuses_bad_new_special_calls_on_the_wire(target):
    ops = [upload(1, 5, np.ones((4096, 1))), upload(2, 6, np.ones((1, 4096))),
           call(3, "scipy.special.gammainc", (H(5), H(6)), results=(7,), reply=True),
           call(4, "scipy.special.radian", (np.ones(3), np.ones(3)), results=(8,), reply=True),
           call(5, "scipy.special.zeta", (np.full(3, 2.0),), results=(9,), reply=True),
           call(6, "scipy.special.expn", (np.ones(3, dtype=np.complex128), np.ones(3)), results=(10,), reply=True),
           call(7, "scipy.special.logsumexp", (np.ones(3),), results=(11,), reply=True),
           call(8, "scipy.special.zeta", (np.full(3, 2.0, dtype=np.float32), np.float64(0.5)), results=(12,),
                reply=True)]
    received, status = raw_session(target.address, [opening(), batch(*ops)])
    assert status is None
    r = replies(received)
    assert "OutOfMemoryError" in error_of(r[3]).type
    assert "takes 3 arguments (2 given)" in error_of(r[4]).message
    assert "takes 2 arguments (1 given)" in error_of(r[5]).message
    assert "take real arrays" in error_of(r[6]).message
    assert "logsumexp" in error_of(r[7]).message                    # composed on the client: no surface name
    assert r[8].WhichOneof("outcome") != "error", r[8]
