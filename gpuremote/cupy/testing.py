"""cupy.testing for gpuremote: the assertion helpers (device arrays are copied to the host and
compared with numpy.testing), shaped_arange/shaped_random, and the decorators most CuPy tests use
(numpy_cupy_allclose, numpy_cupy_array_equal, for_dtypes, for_all_dtypes, for_float_dtypes), so
tests written for CuPy run unchanged."""

from __future__ import annotations

import functools
import inspect

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


# ------------------------------------------------------------------------------------------
# decorators that run a test with NumPy and with this module (cupy.testing's, common cases)
# ------------------------------------------------------------------------------------------

def _hide(impl, *names):
    """functools.wraps(impl) whose signature no longer shows `names` (given by the decorator), so
    pytest does not look for fixtures of those names."""
    def decorate(wrapper):
        wrapper = functools.wraps(impl)(wrapper)
        wrapper.__signature__ = inspect.signature(functools.partial(impl, **{n: None for n in names}))
        return wrapper
    return decorate


def _run(impl, args, kw, name, module, scipy_name):
    """(result, error) of impl run with `module` as kw[name]. The device run ends with a sync
    point, so an error of an asynchronous op counts as that run's, as a raise would in CuPy."""
    kw = dict(kw, **{name: module})
    if scipy_name:
        kw[scipy_name] = _scipy_for(module)
    try:
        result = impl(*args, **kw)
        if module is not numpy:
            module.cuda.Device().synchronize()
        return result, None
    except Exception as e:      # a skip (pytest's Skipped is a BaseException) passes through
        return None, e


_ERROR_CLASSES = (AttributeError, IndexError, TypeError, ValueError, NotImplementedError, numpy.exceptions.AxisError,
                  numpy.linalg.LinAlgError)


def _check_errors(device_error, numpy_error, accept_error) -> None:
    """One run raised, or both: pass only when both did, with errors of the same public classes,
    each of a class accept_error names (True: any)."""
    accepted = Exception if accept_error is True else (accept_error or ())
    if device_error is None or numpy_error is None:
        only, error = ("numpy", numpy_error) if device_error is None else ("cupy", device_error)
        raise AssertionError(f"only the {only} run raised: {type(error).__name__}: {error}") from error
    if any(isinstance(device_error, c) != isinstance(numpy_error, c) for c in _ERROR_CLASSES):
        raise AssertionError(f"the runs raised errors of different classes\ncupy: {device_error!r}\nnumpy: {numpy_error!r}") \
            from device_error
    if not (isinstance(device_error, accepted) and isinstance(numpy_error, accepted)):
        raise AssertionError(f"both runs raised, and accept_error does not accept it\ncupy: {device_error!r}\n"
                             f"numpy: {numpy_error!r}") from device_error


def _pair(device_result, numpy_result):
    """(device side, host side) to compare, as cupy.testing pairs results: arrays with arrays or
    NumPy scalars, NumPy scalars with each other, Python scalars as 0-d arrays."""
    if type(device_result) is ndarray and isinstance(numpy_result, (numpy.ndarray, numpy.generic)):
        return device_result, numpy_result
    if isinstance(device_result, numpy.generic) and isinstance(numpy_result, numpy.generic):
        return device_result, numpy_result
    if numpy.isscalar(device_result) and numpy.isscalar(numpy_result):
        return numpy.asarray(device_result), numpy.asarray(numpy_result)
    raise AssertionError(f"the runs returned results of different kinds\ncupy: {type(device_result)}\n"
                         f"numpy: {type(numpy_result)}")


def _tolerance(tol, dtype):
    if not isinstance(tol, dict):
        return tol
    found = tol.get(dtype.type, tol.get("default"))
    if found is None:
        raise TypeError(f"no tolerance given for {dtype.type} (and no 'default')")
    return found


def _compare_results(device_result, numpy_result, check, type_check, layout_check) -> None:
    """Each result pair: the same dtype (type_check), shape and layout (layout_check), then check."""
    if not isinstance(device_result, (tuple, list)):
        device_result = (device_result,)
    if not isinstance(numpy_result, (tuple, list)):
        numpy_result = (numpy_result,)
    if len(device_result) != len(numpy_result):
        raise AssertionError(f"cupy returned {len(device_result)} results, numpy {len(numpy_result)}")
    for d, n in (_pair(d, n) for d, n in zip(device_result, numpy_result)):
        if type_check and d.dtype != n.dtype:
            raise AssertionError(f"the dtypes differ\ncupy: {d.dtype}\nnumpy: {n.dtype}")
        if d.shape != n.shape:
            raise AssertionError(f"the shapes differ\ncupy: {d.shape}\nnumpy: {n.shape}")
        if layout_check is not None and type(d) is ndarray and isinstance(n, numpy.ndarray):
            layout_check(d, n)
        check(d, n)


def _scipy_for(module):
    """The scipy a run gets as `scipy_name`: SciPy with NumPy, gpuremote.cupyx.scipy on the device."""
    if module is numpy:
        import scipy
        return scipy
    import gpuremote.cupyx.scipy as scipy_device
    return scipy_device


def _comparing(check, name, type_check, accept_error, scipy_name, layout_check):
    """The decorator numpy_cupy_allclose and numpy_cupy_array_equal make: run the test with this
    module, then with NumPy, and compare the results (or the errors) of the two runs."""
    import gpuremote.cupy as device_module

    def decorator(impl):
        @_hide(impl, *(n for n in (name, scipy_name) if n))
        def test_func(*args, **kw):
            device_result, device_error = _run(impl, args, kw, name, device_module, scipy_name)
            numpy_result, numpy_error = _run(impl, args, kw, name, numpy, scipy_name)
            if device_error is not None or numpy_error is not None:
                _check_errors(device_error, numpy_error, accept_error)
                return
            _compare_results(device_result, numpy_result, check, type_check, layout_check)
        return test_func
    return decorator


def _same_contiguity(d, n) -> None:
    for flag in ("c_contiguous", "f_contiguous"):
        if getattr(n.flags, flag) and not getattr(d.flags, flag):
            raise AssertionError(f"NumPy's result is {flag}, the device's is not")


def _same_strides(d, n) -> None:
    if d.strides != n.strides:
        raise AssertionError(f"the strides differ\ncupy: {d.strides}\nnumpy: {n.strides}")


def _no_sparse(sp_name) -> None:
    if sp_name is not None:
        raise NotImplementedError("sp_name: gpuremote has no cupyx.scipy.sparse")


def numpy_cupy_allclose(rtol=1e-7, atol=0, err_msg="", verbose=True, name="xp", type_check=True, accept_error=False,
                        sp_name=None, scipy_name=None, contiguous_check=True):
    """Decorator: the test runs with `name`=numpy and `name`=this module (gpuremote.cupy), and the
    results (an array, a scalar, or a tuple/list of them) must be close (assert_allclose with
    rtol/atol, each a float or a dict of dtype type -> tolerance with an optional 'default'), of
    the same dtypes (type_check) and shapes, and, with contiguous_check, C/F-contiguous wherever
    NumPy's are (the daemon is asked each array's layout).

    accept_error: True (any), an exception class or tuple of them; the test passes when both runs
    raise compatible errors of those classes. scipy_name passes scipy / gpuremote.cupyx.scipy.
    Not supported: sp_name (no sparse matrices: NotImplementedError), and CuPy's masking of
    negative values cast to unsigned dtypes.
    """
    _no_sparse(sp_name)
    if not type_check and (isinstance(rtol, dict) or isinstance(atol, dict)):
        raise TypeError("with type_check=False, rtol and atol must be numbers, not dicts per dtype")

    def check(d, n):
        dtype = d.dtype
        assert_allclose(d, n, _tolerance(rtol, dtype), _tolerance(atol, dtype), err_msg, verbose)
    return _comparing(check, name, type_check, accept_error, scipy_name,
                      _same_contiguity if contiguous_check else None)


def numpy_cupy_array_equal(err_msg="", verbose=True, name="xp", type_check=True, accept_error=False, sp_name=None,
                           scipy_name=None, strides_check=False):
    """Decorator: as numpy_cupy_allclose, the results compared with assert_array_equal (and their
    strides with strides_check). sp_name is not supported (NotImplementedError)."""
    _no_sparse(sp_name)
    return _comparing(lambda d, n: assert_array_equal(d, n, err_msg, verbose), name, type_check, accept_error,
                      scipy_name, _same_strides if strides_check else None)


def _skip_classes() -> tuple:
    import unittest
    classes: tuple = (unittest.SkipTest,)
    try:
        import _pytest.outcomes
        classes += (_pytest.outcomes.Skipped,)
    except ImportError:
        pass
    return classes


def for_dtypes(dtypes, name="dtype"):
    """Decorator: the test runs once per dtype in `dtypes`, given as the NumPy scalar type in the
    keyword `name`; a run that skips is reported and the next runs; a failure names its dtype."""
    def decorator(impl):
        @_hide(impl, name)
        def test_func(*args, **kw):
            skips = _skip_classes()
            for dtype in dtypes:
                kw[name] = numpy.dtype(dtype).type
                try:
                    impl(*args, **kw)
                except skips as e:
                    print(f"skipped: {name} = {dtype} ({e})")
                except Exception:
                    print(name, "is", dtype)
                    raise
        return test_func
    return decorator


_FLOAT = (numpy.float64, numpy.float32)
_INT = tuple(numpy.dtype(c).type for c in "bhilqBHILQ")


def for_all_dtypes(name="dtype", no_float16=False, no_bool=False, no_complex=False):
    """Decorator: for_dtypes over CuPy's list: float64, float32, float16 (unless no_float16), the
    signed and unsigned integers, bool (unless no_bool), complex64 and complex128 (unless no_complex)."""
    dtypes = _FLOAT + (() if no_float16 else (numpy.float16,)) + _INT + (() if no_bool else (numpy.bool_,))
    return for_dtypes(dtypes + (() if no_complex else (numpy.complex64, numpy.complex128)), name)


def for_float_dtypes(name="dtype", no_float16=False):
    """Decorator: for_dtypes over float64, float32 and (unless no_float16) float16."""
    return for_dtypes(_FLOAT + (() if no_float16 else (numpy.float16,)), name)
