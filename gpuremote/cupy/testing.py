"""cupy.testing assertion helpers: device arrays are copied to the host and compared with
numpy.testing, so tests written for CuPy run unchanged."""

from __future__ import annotations

import numpy
import numpy.testing as _npt

from gpuremote.cupy._core import ndarray


def _host(x):
    return x.get() if type(x) is ndarray else x


def assert_allclose(actual, desired, rtol=1e-7, atol=0, err_msg="", verbose=True):
    _npt.assert_allclose(_host(actual), _host(desired), rtol=rtol, atol=atol, err_msg=err_msg, verbose=verbose)


def assert_array_almost_equal(x, y, decimal=6, err_msg="", verbose=True):
    _npt.assert_array_almost_equal(_host(x), _host(y), decimal=decimal, err_msg=err_msg, verbose=verbose)


def assert_array_almost_equal_nulp(x, y, nulp=1):
    _npt.assert_array_almost_equal_nulp(_host(x), _host(y), nulp=nulp)


def assert_array_max_ulp(a, b, maxulp=1, dtype=None):
    _npt.assert_array_max_ulp(_host(a), _host(b), maxulp=maxulp, dtype=dtype)


def assert_array_equal(x, y, err_msg="", verbose=True, strict=False):
    _npt.assert_array_equal(_host(x), _host(y), err_msg=err_msg, verbose=verbose, strict=strict)


def assert_array_less(x, y, err_msg="", verbose=True):
    _npt.assert_array_less(_host(x), _host(y), err_msg=err_msg, verbose=verbose)


def assert_array_list_equal(xlist, ylist, err_msg="", verbose=True):
    if len(xlist) != len(ylist):
        raise AssertionError(f"lists differ in length: {len(xlist)} != {len(ylist)}")
    for x, y in zip(xlist, ylist):
        assert_array_equal(x, y, err_msg, verbose)


def shaped_arange(shape, xp=None, dtype=numpy.float32, order="C"):
    """1..N laid out in `shape`, as cupy.testing.shaped_arange (on `xp`, gpuremote.cupy by default)."""
    if xp is None:
        import gpuremote.cupy as xp
    a = numpy.arange(1, int(numpy.prod(shape)) + 1).reshape(shape)
    if numpy.dtype(dtype).kind == "b":
        a = a % 2 == 0
    return xp.asarray(a.astype(dtype))


def shaped_random(shape, xp=None, dtype=numpy.float32, scale=10, seed=0):
    if xp is None:
        import gpuremote.cupy as xp
    rng = numpy.random.RandomState(seed)
    a = rng.rand(*shape) * scale
    if numpy.dtype(dtype).kind == "b":
        a = a > scale / 2
    return xp.asarray(a.astype(dtype))
