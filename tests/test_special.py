"""cupyx.scipy.special through a real daemon: each function's values against SciPy's, the one
dtype rule on client and daemon (float32 stays float32, everything else is float64), broadcasting,
replayed calls, and arguments the functions do not take, refused at the caller's line (and on the
wire: test_hostile.py)."""

from __future__ import annotations

import numpy as np
import pytest

import gpuremote
from gpuremote.surface import SPECIAL_INPUTS
from gpuremote.meta import special_dtype

from test_hostile import connected, victim  # noqa: F401

scipy_special = pytest.importorskip("scipy.special")
F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
NAMES = sorted(SPECIAL_INPUTS)


def inputs(n: int, dtype) -> list[np.ndarray]:
    """Arguments inside every listed function's domain (erfinv, logit, ndtri: (0, 1); boxcox: x > 0)."""
    x = np.linspace(0.05, 0.95, 12).reshape(3, 4).astype(dtype)
    return [x, (x[::-1] * 0.5 + 0.25).astype(dtype)][:n]


@pytest.fixture(scope="module")
def csp(victim):
    with connected(victim.address) as (cp, _):
        import gpuremote.cupyx.scipy.special as special
        yield cp, special


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [F32, F64])
def test_values_match_scipy(csp, name, dtype):
    cp, special = csp
    host = inputs(SPECIAL_INPUTS[name], dtype)
    got = getattr(special, name)(*[cp.asarray(h) for h in host])
    assert (got.shape, got.dtype) == ((3, 4), dtype)                # derived on the client
    value = got.get()
    assert value.dtype == dtype                                      # made on the daemon
    want = getattr(scipy_special, name)(*host, dtype=dtype)
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
