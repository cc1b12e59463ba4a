"""cupy.testing for gpuremote, so tests written for CuPy (13/14) collect and run unchanged:

- assertions (device arrays are copied to the host and compared with numpy.testing);
- array makers: shaped_arange, shaped_reverse_arange, shaped_random, shaped_linspace, generate_matrix;
- NumPy-vs-device decorators: numpy_cupy_allclose, numpy_cupy_array_equal, numpy_cupy_array_almost_equal,
  numpy_cupy_array_almost_equal_nulp, numpy_cupy_array_max_ulp, numpy_cupy_array_less,
  numpy_cupy_array_list_equal, numpy_cupy_equal, numpy_cupy_raises;
- loops: for_dtypes, for_all_dtypes, for_float/int/signed/unsigned/complex_dtypes, the *_combination
  forms, for_orders, for_CF_orders, for_contiguous_axes;
- class parameterization: parameterize, product, product_dict;
- marks and conditions: gpu, slow, multi_gpu, with_requires, installed, numpy_satisfies;
- fix_random, generate_seed, assert_warns.

Not available: anything over sparse matrices (sp_name=, shaped_sparse_random: NotImplementedError).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import itertools
import os
import random as _pyrandom
import sys
import types
import unittest
import warnings

import numpy
import numpy.testing as _npt

from gpuremote.cupy._core import ndarray


def _host(x):
    return x.get() if type(x) is ndarray else x


def _default_xp(xp):
    if xp is None:
        import gpuremote.cupy as xp
    return xp


# ------------------------------------------------------------------------------------------
# assertions
# ------------------------------------------------------------------------------------------

def assert_allclose(actual, desired, rtol=1e-7, atol=0, err_msg="", verbose=True):
    """numpy.testing.assert_allclose over host copies of device or host arrays."""
    _npt.assert_allclose(_host(actual), _host(desired), rtol=rtol, atol=atol, err_msg=err_msg, verbose=verbose)


def assert_array_almost_equal(x, y, decimal=6, err_msg="", verbose=True):
    """numpy.testing.assert_array_almost_equal over host copies."""
    _npt.assert_array_almost_equal(_host(x), _host(y), decimal=decimal, err_msg=err_msg, verbose=verbose)


def assert_array_almost_equal_nulp(x, y, nulp=1):
    """numpy.testing.assert_array_almost_equal_nulp over host copies."""
    _npt.assert_array_almost_equal_nulp(_host(x), _host(y), nulp=nulp)


def assert_array_max_ulp(a, b, maxulp=1, dtype=None):
    """numpy.testing.assert_array_max_ulp over host copies."""
    _npt.assert_array_max_ulp(_host(a), _host(b), maxulp=maxulp, dtype=dtype)


def assert_array_equal(x, y, err_msg="", verbose=True, strict=False, strides_check=False):
    """numpy.testing.assert_array_equal over host copies; with strides_check the two arrays'
    strides (the device array's as the daemon reports them) must be equal too."""
    _npt.assert_array_equal(_host(x), _host(y), err_msg=err_msg, verbose=verbose, strict=strict)
    if strides_check and x.strides != y.strides:
        detail = f"\n x: {x.strides}\n y: {y.strides}" if verbose else ""
        raise AssertionError(f"the strides differ{' ' + err_msg if err_msg else ''}{detail}")


def assert_array_less(x, y, err_msg="", verbose=True):
    """numpy.testing.assert_array_less over host copies: every x must be below y."""
    _npt.assert_array_less(_host(x), _host(y), err_msg=err_msg, verbose=verbose)


def assert_array_list_equal(xlist, ylist, err_msg="", verbose=True, strict=False):
    """Two lists (or two tuples) of arrays, of the same container type and length, equal pair by
    pair (assert_array_equal)."""
    if type(xlist) is not type(ylist):
        raise AssertionError(f"expected two lists or two tuples, got {type(xlist).__name__} and "
                             f"{type(ylist).__name__}")
    if not isinstance(xlist, (list, tuple)):
        raise AssertionError(f"expected a list or a tuple, got {type(xlist).__name__}")
    if len(xlist) != len(ylist):
        raise AssertionError(f"lists differ in length: {len(xlist)} != {len(ylist)}")
    for x, y in zip(xlist, ylist):
        assert_array_equal(x, y, err_msg, verbose, strict)


@contextlib.contextmanager
def assert_warns(expected):
    """Context manager: the block must emit a warning of class `expected` (every warning is
    recorded, whatever the filters; the block's own warnings are not shown)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    if not any(isinstance(w.message, expected) for w in caught):
        raise AssertionError(f"{getattr(expected, '__name__', expected)} was not emitted "
                             f"(got: {[type(w.message).__name__ for w in caught] or 'no warnings'})")


# ------------------------------------------------------------------------------------------
# arrays to test with
# ------------------------------------------------------------------------------------------

def _sized(values, dtype):
    """values as dtype the way cupy.testing fills arrays: bool is True at even values, complex
    gets the same imaginary part as its real part."""
    dtype = numpy.dtype(dtype)
    if dtype.kind == "b":
        values = values % 2 == 0
    elif dtype.kind == "c":
        values = values + values * 1j
    return values.astype(dtype)


def _upper(order):
    return order.upper() if isinstance(order, str) else order


def shaped_arange(shape, xp=None, dtype=numpy.float32, order="C"):
    """1..N laid out in `shape` with `order` ('C', 'F', either case), on `xp` (gpuremote.cupy by
    default), as cupy.testing.shaped_arange: bool is True at even values, complex is k + kj."""
    a = _sized(numpy.arange(1, int(numpy.prod(shape)) + 1), dtype).reshape(shape)
    return _default_xp(xp).array(a, order=_upper(order))


def shaped_reverse_arange(shape, xp=None, dtype=numpy.float32):
    """N..1 laid out in `shape` (C order), as cupy.testing.shaped_reverse_arange: bool is True at
    even values, complex is k + kj."""
    a = _sized(numpy.arange(int(numpy.prod(shape)), 0, -1), dtype).reshape(shape)
    return _default_xp(xp).array(a)


def shaped_random(shape, xp=None, dtype=numpy.float32, scale=10, seed=0, order="C"):
    """Uniform draws in [0, scale) of `shape`, the same for the same seed (a RandomState of its own:
    NumPy's global generator is not touched); bool is a fair coin, complex has a random imaginary
    part as well."""
    rng = numpy.random.RandomState(seed)
    dtype = numpy.dtype(dtype)
    a = numpy.asarray(rng.rand(*shape)) * scale
    if dtype.kind == "b":
        a = a > scale / 2
    elif dtype.kind == "c":
        a = a + 1j * scale * numpy.asarray(rng.rand(*shape))
    return _default_xp(xp).asarray(a.astype(dtype), order=_upper(order))


def shaped_linspace(start, stop, shape, xp=None, dtype=numpy.float32):
    """numpy.linspace(start, stop, size of `shape`) laid out in `shape`, as dtype (for bool the
    range is clipped to [0, 1], for unsigned types start is at least 0)."""
    dtype = numpy.dtype(dtype)
    if dtype.kind == "b":
        start, stop = max(start, 0), min(stop, 1)
    elif dtype.kind == "u":
        start = max(start, 0)
    a = numpy.linspace(start, stop, int(numpy.prod(shape)))
    return _default_xp(xp).array(a.astype(dtype).reshape(shape))


def generate_matrix(shape, xp=None, dtype=numpy.float32, *, singular_values=None):
    """A random matrix, or stack of matrices, of `shape` (..., M, N) whose singular values are
    `singular_values` (broadcast to (..., min(M, N))); dtype a float or complex type. Drawn on the
    host from NumPy's global generator (so fix_random makes it reproducible), then put on `xp`."""
    if len(shape) <= 1:
        raise ValueError(f"generate_matrix: shape {shape} has too few axes for a matrix")
    if singular_values is None:
        raise TypeError("generate_matrix: singular_values must be given")
    dtype = numpy.dtype(dtype)
    if dtype.kind not in "fc":
        raise TypeError(f"generate_matrix: dtype {dtype} is not supported (a float or complex type is)")
    values = numpy.asarray(_host(singular_values))
    if not numpy.isrealobj(values):
        raise TypeError("generate_matrix: singular_values must be real")
    if (values < 0).any():
        raise ValueError("generate_matrix: a singular value is negative")
    a = numpy.random.randn(*shape)
    if dtype.kind == "c":
        a = a + 1j * numpy.random.randn(*shape)
    u, s, vh = numpy.linalg.svd(a, full_matrices=False)
    a = numpy.einsum("...ik,...k,...kj->...ij", u, numpy.broadcast_to(values, s.shape), vh)
    return _default_xp(xp).asarray(a.astype(dtype))


def shaped_sparse_random(*args, **kwargs):
    """Not supported: gpuremote has no cupyx.scipy.sparse (NotImplementedError)."""
    raise NotImplementedError("shaped_sparse_random: gpuremote has no cupyx.scipy.sparse")


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
    if device_error is None and numpy_error is None:
        raise AssertionError("both the cupy and the numpy run were expected to raise; neither did")
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


def _check_tolerance_keys(*tols) -> None:
    for tol in tols:
        if isinstance(tol, dict):
            for key in tol:
                if not (isinstance(key, type) or key == "default"):
                    raise TypeError(f"a tolerance dict's keys are dtype types (numpy.float32) or 'default', not {key!r}")


def _as_tuple(result) -> tuple:
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


def _compare_results(device_result, numpy_result, check, type_check, layout_check, masks_for=None) -> None:
    """Each result pair: the same dtype (type_check), shape and layout (layout_check), then check,
    over the elements masks_for(pairs) keeps where it gives a mask (None: all of them)."""
    device_result, numpy_result = _as_tuple(device_result), _as_tuple(numpy_result)
    if len(device_result) != len(numpy_result):
        raise AssertionError(f"cupy returned {len(device_result)} results, numpy {len(numpy_result)}")
    pairs = [_pair(d, n) for d, n in zip(device_result, numpy_result)]
    for d, n in pairs:
        if type_check and d.dtype != n.dtype:
            raise AssertionError(f"the dtypes differ\ncupy: {d.dtype}\nnumpy: {n.dtype}")
        if d.shape != n.shape:
            raise AssertionError(f"the shapes differ\ncupy: {d.shape}\nnumpy: {n.shape}")
        if layout_check is not None and type(d) is ndarray and isinstance(n, numpy.ndarray):
            layout_check(d, n)
    masks = masks_for(pairs) if masks_for is not None else [None] * len(pairs)
    for (d, n), mask in zip(pairs, masks):
        if mask is not None:
            if mask.ndim == 0:
                if not mask:
                    continue
            else:
                d, n = numpy.asarray(_host(d))[mask], numpy.asarray(n)[mask]
        check(d, n)


def _scipy_for(module):
    """The scipy a run gets as `scipy_name`: SciPy with NumPy, gpuremote.cupyx.scipy on the device."""
    if module is numpy:
        import scipy
        return scipy
    import gpuremote.cupyx.scipy as scipy_device
    return scipy_device


def _dtype_type(value):
    """The NumPy scalar type a keyword value names (a type or a dtype), else None."""
    if isinstance(value, numpy.dtype) or (isinstance(value, type) and issubclass(value, numpy.generic)):
        return numpy.dtype(value).type
    return None


def _mixes_signs(kw) -> bool:
    named = {_dtype_type(v) for v in kw.values()}
    return bool(named & set(_UNSIGNED)) and bool(named & set(_SIGNED + _FLOAT + (numpy.float16,)))


def _positive_masks(impl, args, kw, name, scipy_name, device_module):
    """masks_for of a run whose keywords mix unsigned with signed or float dtypes (as CuPy does: a
    negative value cast to an unsigned type is undefined, and GPUs and CPUs differ): the test is
    run again on the device with each unsigned dtype's signed counterpart, and an unsigned result
    is compared only where that run's result is >= 0. If that run fails, nothing is masked."""
    def masks_for(pairs):
        unmasked = [None] * len(pairs)
        if not any(d.dtype.type in _UNSIGNED for d, _ in pairs):
            return unmasked
        signed_kw = {k: numpy.dtype(numpy.dtype(v).char.lower()).type if _dtype_type(v) in _UNSIGNED else v
                     for k, v in kw.items()}
        result, error = _run(impl, args, signed_kw, name, device_module, scipy_name)
        results = _as_tuple(result)
        if error is not None or len(results) != len(pairs):
            return unmasked
        masks = []
        for (d, _), r in zip(pairs, results):
            mask = numpy.asarray(_host(r)) >= 0 if d.dtype.type in _UNSIGNED else None
            masks.append(mask if mask is not None and mask.shape == d.shape else None)
        return masks
    return masks_for


def _both_runs(impl, args, kw, name, scipy_name) -> tuple:
    """(device result, device error, NumPy result, NumPy error): the test run with this module as
    `name`, then with NumPy."""
    import gpuremote.cupy as device_module
    return (*_run(impl, args, kw, name, device_module, scipy_name), *_run(impl, args, kw, name, numpy, scipy_name))


def _comparing(check, name, type_check, accept_error, scipy_name, layout_check):
    """The decorator the numpy_cupy_* comparisons make: run the test with this module, then with
    NumPy, and compare the results (or the errors) of the two runs."""
    import gpuremote.cupy as device_module

    def decorator(impl):
        @_hide(impl, *(n for n in (name, scipy_name) if n))
        def test_func(*args, **kw):
            device_result, device_error, numpy_result, numpy_error = _both_runs(impl, args, kw, name, scipy_name)
            if device_error is not None or numpy_error is not None:
                _check_errors(device_error, numpy_error, accept_error)
                return
            masks_for = _positive_masks(impl, args, kw, name, scipy_name, device_module) if _mixes_signs(kw) else None
            _compare_results(device_result, numpy_result, check, type_check, layout_check, masks_for)
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
    When the keywords mix unsigned with signed or float dtypes (for_dtypes_combination), unsigned
    results are compared only where the run with signed types gives values >= 0, as in CuPy.
    Not supported: sp_name (no sparse matrices: NotImplementedError).
    """
    _no_sparse(sp_name)
    _check_tolerance_keys(rtol, atol)
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


def numpy_cupy_array_almost_equal(decimal=6, err_msg="", verbose=True, name="xp", type_check=True,
                                  accept_error=False, sp_name=None, scipy_name=None):
    """Decorator: as numpy_cupy_allclose, the results compared with assert_array_almost_equal to
    `decimal` places (no contiguity check). sp_name is not supported (NotImplementedError)."""
    _no_sparse(sp_name)
    return _comparing(lambda d, n: assert_array_almost_equal(d, n, decimal, err_msg, verbose), name, type_check,
                      accept_error, scipy_name, None)


def numpy_cupy_array_almost_equal_nulp(nulp=1, name="xp", type_check=True, accept_error=False, sp_name=None,
                                       scipy_name=None):
    """Decorator: as numpy_cupy_allclose, the results compared with assert_array_almost_equal_nulp
    (within `nulp` units of the last place, relative to their spacing). sp_name is not supported."""
    _no_sparse(sp_name)
    return _comparing(lambda d, n: assert_array_almost_equal_nulp(d, n, nulp), name, type_check, accept_error,
                      scipy_name, None)


def numpy_cupy_array_max_ulp(maxulp=1, dtype=None, name="xp", type_check=True, accept_error=False, sp_name=None,
                             scipy_name=None):
    """Decorator: as numpy_cupy_allclose, the results compared with assert_array_max_ulp (at most
    `maxulp` units in the last place apart, as `dtype` when given). sp_name is not supported."""
    _no_sparse(sp_name)
    return _comparing(lambda d, n: assert_array_max_ulp(d, n, maxulp, dtype), name, type_check, accept_error,
                      scipy_name, None)


def numpy_cupy_array_less(err_msg="", verbose=True, name="xp", type_check=True, accept_error=False, sp_name=None,
                          scipy_name=None):
    """Decorator: as numpy_cupy_allclose, but the device run's results must be strictly less than
    NumPy's, element by element (assert_array_less). sp_name is not supported."""
    _no_sparse(sp_name)
    return _comparing(lambda d, n: assert_array_less(d, n, err_msg, verbose), name, type_check, accept_error,
                      scipy_name, None)


def numpy_cupy_array_list_equal(err_msg="", verbose=True, name="xp", sp_name=None, scipy_name=None):
    """Deprecated in CuPy (use numpy_cupy_array_equal, which compares lists of arrays too): warns
    DeprecationWarning, then compares as numpy_cupy_array_equal without the dtype check."""
    warnings.warn("numpy_cupy_array_list_equal is deprecated: use numpy_cupy_array_equal", DeprecationWarning,
                  stacklevel=2)
    _no_sparse(sp_name)
    return _comparing(lambda d, n: assert_array_equal(d, n, err_msg, verbose), name, False, False, scipy_name, None)


def _plain(value):
    """A run's result for numpy_cupy_equal: device arrays (also inside tuples and lists) on the host."""
    if isinstance(value, (tuple, list)):
        return type(value)(_plain(v) for v in value)
    return _host(value)


def numpy_cupy_equal(name="xp", sp_name=None, scipy_name=None):
    """Decorator: the test runs with NumPy and with this module and must return equal plain values
    (==): shapes, dtypes, flags, Python scalars, tuples of them; a device 0-d array is compared as
    its host copy. Both runs raising compatible errors fails (no error is accepted), as in CuPy.
    For arrays of several elements use numpy_cupy_array_equal (TypeError here). sp_name is not
    supported."""
    _no_sparse(sp_name)

    def decorator(impl):
        @_hide(impl, *(n for n in (name, scipy_name) if n))
        def test_func(*args, **kw):
            device_result, device_error, numpy_result, numpy_error = _both_runs(impl, args, kw, name, scipy_name)
            if device_error is not None or numpy_error is not None:
                _check_errors(device_error, numpy_error, False)
                return
            device_value, numpy_value = _plain(device_result), _plain(numpy_result)
            try:
                equal = bool(device_value == numpy_value)
            except ValueError as e:     # NumPy's "truth value of an array ... is ambiguous"
                raise TypeError("numpy_cupy_equal compares plain values; for arrays of several elements use "
                                "numpy_cupy_array_equal") from e
            if not equal:
                raise AssertionError(f"the results differ\ncupy: {device_value!r}\nnumpy: {numpy_value!r}")
        return test_func
    return decorator


def numpy_cupy_raises(name="xp", sp_name=None, scipy_name=None, accept_error=Exception):
    """Deprecated in CuPy (use pytest.raises in each run): warns DeprecationWarning; the decorated
    test must raise in both runs, errors of compatible public classes that accept_error (by default
    any Exception) accepts, as numpy_cupy_allclose's error comparison. sp_name is not supported."""
    warnings.warn("cupy.testing.numpy_cupy_raises is deprecated", DeprecationWarning, stacklevel=2)
    _no_sparse(sp_name)

    def decorator(impl):
        @_hide(impl, *(n for n in (name, scipy_name) if n))
        def test_func(*args, **kw):
            _, device_error, _, numpy_error = _both_runs(impl, args, kw, name, scipy_name)
            _check_errors(device_error, numpy_error, accept_error)
        return test_func
    return decorator


# ------------------------------------------------------------------------------------------
# loops over dtypes and orders
# ------------------------------------------------------------------------------------------

def _skip_classes() -> tuple:
    classes: tuple = (unittest.SkipTest,)
    try:
        import _pytest.outcomes
        classes += (_pytest.outcomes.Skipped,)
    except ImportError:
        pass
    return classes


def _looping(name_values, names):
    """A decorator running the test once per dict of keyword values in name_values; a run that
    skips is reported and the next one runs; a failure prints its values before propagating."""
    def decorator(impl):
        @_hide(impl, *names)
        def test_func(*args, **kw):
            skips = _skip_classes()
            for values in name_values:
                shown = ", ".join(f"{k} = {getattr(v, '__name__', v)}" for k, v in values.items())
                try:
                    impl(*args, **dict(kw, **values))
                except skips as e:
                    print(f"skipped: {shown} ({e})")
                except Exception:
                    print(shown)
                    raise
        return test_func
    return decorator


def for_dtypes(dtypes, name="dtype"):
    """Decorator: the test runs once per dtype in `dtypes`, given as the NumPy scalar type in the
    keyword `name`; a run that skips is reported and the next runs; a failure names its dtype."""
    return _looping([{name: numpy.dtype(d).type} for d in dtypes], (name,))


_FLOAT = (numpy.float64, numpy.float32)
_SIGNED = tuple(numpy.dtype(c).type for c in "bhilq")
_UNSIGNED = tuple(numpy.dtype(c).type for c in "BHILQ")
_INT = _SIGNED + _UNSIGNED
_COMPLEX = (numpy.complex64, numpy.complex128)


def _all_dtypes(no_float16=False, no_bool=False, no_complex=False) -> tuple:
    return (_FLOAT + (() if no_float16 else (numpy.float16,)) + _INT + (() if no_bool else (numpy.bool_,))
            + (() if no_complex else _COMPLEX))


def for_all_dtypes(name="dtype", no_float16=False, no_bool=False, no_complex=False):
    """Decorator: for_dtypes over CuPy's list: float64, float32, float16 (unless no_float16), the
    signed and unsigned integers, bool (unless no_bool), complex64 and complex128 (unless no_complex)."""
    return for_dtypes(_all_dtypes(no_float16, no_bool, no_complex), name)


def for_float_dtypes(name="dtype", no_float16=False):
    """Decorator: for_dtypes over float64, float32 and (unless no_float16) float16."""
    return for_dtypes(_FLOAT + (() if no_float16 else (numpy.float16,)), name)


def for_signed_dtypes(name="dtype"):
    """Decorator: for_dtypes over the signed integer types int8, int16, int32, long and longlong
    (NumPy's 'bhilq')."""
    return for_dtypes(_SIGNED, name)


def for_unsigned_dtypes(name="dtype"):
    """Decorator: for_dtypes over the unsigned integer types (NumPy's 'BHILQ')."""
    return for_dtypes(_UNSIGNED, name)


def for_int_dtypes(name="dtype", no_bool=False):
    """Decorator: for_dtypes over the signed and unsigned integer types and (unless no_bool) bool."""
    return for_dtypes(_INT + (() if no_bool else (numpy.bool_,)), name)


def for_complex_dtypes(name="dtype"):
    """Decorator: for_dtypes over complex64 and complex128."""
    return for_dtypes(_COMPLEX, name)


def for_dtypes_combination(types, names=("dtype",), full=None):
    """Decorator: the test runs with combinations of `types` given as the keywords `names`. With
    full (or, when full is None, with the environment variable CUPY_TEST_FULL_COMBINATION=1) every
    combination runs; otherwise a sample does, chosen with Python's `random` when decorating:
    each list of types zipped with shuffled copies of it (every type appears for every name, in
    len(types) * 2 combinations at most, duplicates dropped). With a single type this is for_dtypes."""
    types = list(types)
    names = tuple(names)
    if len(types) == 1:
        if len(names) != 1:
            raise ValueError("for_dtypes_combination: a single type goes with a single name")
        return for_dtypes(types, names[0])
    if full is None:
        full = int(os.environ.get("CUPY_TEST_FULL_COMBINATION", "0")) != 0
    if full:
        combos = [dict(zip(names, c)) for c in itertools.product(types, repeat=len(names))]
    else:
        columns = []
        for _ in names:
            shuffled = types[:]
            _pyrandom.shuffle(shuffled)
            columns.append(types + shuffled)
        combos, seen = [], set()
        for row in zip(*columns):
            if row not in seen:
                seen.add(row)
                combos.append(dict(zip(names, row)))
    return _looping([{k: numpy.dtype(v).type for k, v in c.items()} for c in combos], names)


def for_all_dtypes_combination(names=("dtyes",), no_float16=False, no_bool=False, full=None, no_complex=False):
    """Decorator: for_dtypes_combination over for_all_dtypes's list. (CuPy's default name is
    'dtyes', misspelt; it is kept so tests written for CuPy behave the same: pass `names`.)"""
    return for_dtypes_combination(_all_dtypes(no_float16, no_bool, no_complex), names, full)


def for_signed_dtypes_combination(names=("dtype",), full=None):
    """Decorator: for_dtypes_combination over the signed integer types."""
    return for_dtypes_combination(_SIGNED, names, full)


def for_unsigned_dtypes_combination(names=("dtype",), full=None):
    """Decorator: for_dtypes_combination over the unsigned integer types."""
    return for_dtypes_combination(_UNSIGNED, names, full)


def for_int_dtypes_combination(names=("dtype",), no_bool=False, full=None):
    """Decorator: for_dtypes_combination over the integer types and (unless no_bool) bool."""
    return for_dtypes_combination(_INT + (() if no_bool else (numpy.bool_,)), names, full)


def for_orders(orders, name="order"):
    """Decorator: the test runs once per order in `orders`, given as the keyword `name`."""
    return _looping([{name: o} for o in orders], (name,))


def for_CF_orders(name="order"):
    """Decorator: for_orders over None, 'C', 'F', 'c' and 'f'."""
    return for_orders([None, "C", "F", "c", "f"], name)


def for_contiguous_axes(name="axis"):
    """Decorator for a method of a parameterized class with `shape` and `order` attributes: it
    runs once per tuple of axes that is contiguous in memory, growing from the fastest axis: for
    shape (1, 2, 3), (2,), (1, 2), (0, 1, 2) in C order and (0,), (0, 1), (0, 1, 2) in F order."""
    def decorator(impl):
        @_hide(impl, name)
        def test_func(self, *args, **kw):
            shape, order = getattr(self, "shape", None), getattr(self, "order", None)
            if shape is None or order not in ("C", "c", "F", "f"):
                raise ValueError(f"for_contiguous_axes needs self.shape and self.order 'C' or 'F' (got {shape!r}, "
                                 f"{order!r})")
            ndim = len(shape)
            for i in range(ndim):
                axes = tuple(range(ndim - 1 - i, ndim)) if order in ("C", "c") else tuple(range(i + 1))
                try:
                    impl(self, *args, **dict(kw, **{name: axes}))
                except Exception:
                    print(f"{name} = {axes}, shape = {shape}, order = {order}")
                    raise
        return test_func
    return decorator


# ------------------------------------------------------------------------------------------
# parameterized test classes
# ------------------------------------------------------------------------------------------

def product(parameter):
    """Every combination of a dict of lists, as a list of dicts (keys in sorted order):
    product({'a': [1, 2], 'b': [3]}) == [{'a': 1, 'b': 3}, {'a': 2, 'b': 3}]."""
    if not isinstance(parameter, dict):
        raise TypeError(f"product takes a dict of lists (for lists of dicts use product_dict), not "
                        f"{type(parameter).__name__}")
    keys = sorted(parameter)
    return [dict(zip(keys, values)) for values in itertools.product(*(parameter[k] for k in keys))]


def product_dict(*parameters):
    """Every way of taking one dict from each list, merged (later lists win on a shared key):
    product_dict([{'a': 1}, {'a': 2}], [{'b': 3}]) == [{'a': 1, 'b': 3}, {'a': 2, 'b': 3}]."""
    return [{k: v for d in dicts for k, v in d.items()} for dicts in itertools.product(*parameters)]


def _param_text(value) -> str:
    text = value.__name__ if isinstance(getattr(value, "__name__", None), str) else repr(value)
    return text if len(text) <= 100 else text[:48] + "..." + text[-49:]


def _param_id(i, param) -> str:
    return f"_param_{i}_{{{', '.join(f'{k}={_param_text(v)}' for k, v in sorted(param.items()))}}}"


class _ParameterizedCases:
    """What parameterize leaves in place of a unittest.TestCase class: the classes it made are in
    the class's module, named <class>_param_<i>_{...}; this object is not a class, so pytest and
    unittest collect only those."""

    def __init__(self, base, params, names):
        self.base, self.params, self.names = base, params, names

    def __repr__(self) -> str:
        return f"<{self.base.__name__} parameterized {len(self.params)} ways: {', '.join(self.names)}>"


def _unittest_cases(base, params, ids, module_name):
    module = sys.modules[module_name]
    names = []
    for i, param in enumerate(params):
        members = {k: staticmethod(v) if isinstance(v, types.FunctionType) else v for k, v in param.items()}
        name = base.__name__ + (_param_id(i, param) if ids else f"_param_{i}")
        members.update(__module__=module_name, __qualname__=name,
                       __repr__=lambda self, _p=param: f"<{type(self).__name__}  parameter: {_p}>")
        setattr(module, name, type(name, (base,), members))
        names.append(name)
    return _ParameterizedCases(base, params, names)


def _pytest_class(base, params, ids):
    import pytest

    @pytest.fixture(autouse=True)
    def _gpuremote_parameterize(self, _gpuremote_param):
        self.__dict__.update(_gpuremote_param)

    def __repr__(self):
        return f"<{type(self).__name__}  parameter: {self.__dict__}>"

    cls = type(base.__name__, (base,), {"_gpuremote_parameterize": _gpuremote_parameterize, "__repr__": __repr__,
                                        "__module__": base.__module__, "__qualname__": base.__qualname__,
                                        "_gpuremote_params": (base, params)})
    marked = [pytest.param(p, id=_param_id(i, p) if ids else str(i)) for i, p in enumerate(params)]
    return pytest.mark.parametrize("_gpuremote_param", marked)(cls)


def parameterize(*params, _ids=True):
    """Class decorator: the test class runs once per dict in `params`, each dict's items set as
    attributes (self.shape, self.dtype, ...) before each test.

    A plain (pytest-style) class becomes a class parametrized over a hidden fixture, its test ids
    ending [_param_<i>_{key=value, ...}] (just [<i>] with _ids=False). A unittest.TestCase class
    is replaced by one generated subclass per dict, added to its module as
    <class>_param_<i>_{...} (functions given as values become static methods). Stacked
    parameterize decorators combine: every dict of one with every dict of the other.
    """
    def decorate(cls):
        if isinstance(cls, _ParameterizedCases):        # stacked on a TestCase's parameterize
            module = sys.modules[cls.base.__module__]
            for name in cls.names:
                delattr(module, name)
            return _unittest_cases(cls.base, product_dict(cls.params, params), _ids, cls.base.__module__)
        if not isinstance(cls, type):
            raise TypeError(f"parameterize decorates test classes, not {type(cls).__name__} (for a function use "
                            "pytest.mark.parametrize)")
        if issubclass(cls, unittest.TestCase):
            return _unittest_cases(cls, list(params), _ids, cls.__module__)
        stacked = cls.__dict__.get("_gpuremote_params")
        if stacked is not None:
            base, earlier = stacked
            return _pytest_class(base, product_dict(earlier, params), _ids)
        return _pytest_class(cls, list(params), _ids)
    return decorate


# ------------------------------------------------------------------------------------------
# marks, requirements, devices
# ------------------------------------------------------------------------------------------

def _mark(name, *args, **kwargs):
    """pytest.mark.<name>(*args, **kwargs), without pytest's unknown-mark warning for the marks
    cupy.testing uses (register them, e.g. `slow`, in your markers for --strict-markers)."""
    try:
        import pytest
    except ImportError as e:
        raise RuntimeError(f"cupy.testing.{name} needs pytest: {e}") from e
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pytest.PytestUnknownMarkWarning)
        return getattr(pytest.mark, name)(*args, **kwargs)


def gpu(*args, **kwargs):
    """pytest.mark.gpu (as @testing.gpu or @testing.gpu()). Under this repository's tests, a test
    marked gpu is skipped unless GPUREMOTE_TEST_BACKEND=cupy."""
    return _mark("gpu", *args, **kwargs)


def slow(*args, **kwargs):
    """pytest.mark.slow (as @testing.slow or @testing.slow()), for `-m "not slow"`."""
    return _mark("slow", *args, **kwargs)


def _skip(reason):
    try:
        import pytest
    except ImportError:
        raise unittest.SkipTest(reason) from None
    pytest.skip(reason)


def _device_count() -> int:
    from gpuremote.cupy.cuda import runtime
    try:
        return runtime.getDeviceCount()
    except RuntimeError:        # no daemon to ask: no devices
        return 0


def multi_gpu(gpu_num):
    """Decorator for a test function, method or class: it runs only when this process has at least
    gpu_num devices (gpuremote.cupy.cuda.runtime.getDeviceCount(), asked when the test runs; no
    daemon counts as none) and CUPY_TEST_GPU_LIMIT, when set >= 0, allows that many; otherwise it
    skips. The test is also marked pytest.mark.multi_gpu. gpu_num must be at least 2, as in CuPy."""
    if not isinstance(gpu_num, int) or gpu_num < 2:
        raise ValueError(f"multi_gpu(gpu_num): gpu_num must be an int >= 2, not {gpu_num!r}")

    def guard(impl):
        @functools.wraps(impl)
        def test_func(*args, **kw):
            limit = int(os.environ.get("CUPY_TEST_GPU_LIMIT", "-1"))
            if 0 <= limit < gpu_num:
                _skip(f"{gpu_num} GPUs required (CUPY_TEST_GPU_LIMIT={limit})")
            count = _device_count()
            if count < gpu_num:
                _skip(f"{gpu_num} GPUs required; this process has {count}")
            return impl(*args, **kw)
        return test_func

    def decorate(target):
        if isinstance(target, type):
            for attr in dir(target):
                member = inspect.getattr_static(target, attr)
                if attr.startswith("test") and isinstance(member, types.FunctionType):
                    setattr(target, attr, guard(member))
            return _mark("multi_gpu")(target)
        if not callable(target):
            raise TypeError(f"multi_gpu decorates test functions and classes, not {type(target).__name__}")
        return _mark("multi_gpu")(guard(target))
    return decorate


def installed(*specifiers) -> bool:
    """Whether every requirement string ('numpy>=1.26', 'scipy') is met by an installed
    distribution (importlib.metadata; the specifiers are read with `packaging` when it is
    installed, else simple comparisons of numeric versions are understood)."""
    import importlib.metadata
    for spec in specifiers:
        name, check = _requirement(spec)
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return False
        if not check(version):
            return False
    return True


def _requirement(spec):
    """(distribution name, version -> bool) of a requirement string."""
    try:
        from packaging.requirements import Requirement
    except ImportError:
        return _simple_requirement(spec)
    req = Requirement(spec)
    return req.name, lambda v: not req.specifier or req.specifier.contains(v, prereleases=True)


def _simple_requirement(spec):
    import operator
    import re
    m = re.fullmatch(r"\s*([A-Za-z0-9_.\-]+)\s*(.*?)\s*", spec)
    if not m:
        raise ValueError(f"cannot read the requirement {spec!r}")
    ops = {">=": operator.ge, "<=": operator.le, "==": operator.eq, "!=": operator.ne, ">": operator.gt,
           "<": operator.lt}
    clauses = []
    for clause in filter(None, (c.strip() for c in m.group(2).split(","))):
        c = re.fullmatch(r"(>=|<=|==|!=|>|<)\s*(\d+(?:\.\d+)*)", clause)
        if not c:
            raise ValueError(f"cannot read {clause!r} in {spec!r} without the `packaging` package")
        clauses.append((ops[c.group(1)], tuple(int(p) for p in c.group(2).split("."))))

    def check(version):
        parts = tuple(int(p) for p in re.match(r"\d+(?:\.\d+)*", version).group().split("."))
        return all(op(parts[:len(want)] + (0,) * (len(want) - len(parts)), want) for op, want in clauses)
    return m.group(1), check


def numpy_satisfies(version_range) -> bool:
    """Whether the installed NumPy's version is in version_range ('>=1.26', '>=1.26,<3')."""
    return installed(f"numpy{version_range}")


def with_requires(*requirements):
    """Decorator: skip the test (or class) unless installed(*requirements), e.g.
    @with_requires('numpy>=2.0', 'scipy')."""
    reason = f"requires: {','.join(requirements)}"
    try:
        import pytest
    except ImportError:
        return unittest.skipIf(not installed(*requirements), reason)
    return pytest.mark.skipif(not installed(*requirements), reason=reason)


# ------------------------------------------------------------------------------------------
# reproducible random numbers
# ------------------------------------------------------------------------------------------

_random_depth = 0
_saved_random_states = None


def _setup_random() -> None:
    """Seed Python's random (99), NumPy's global generator (100) and the current device's
    generator (101), or all three from fresh entropy with CUPY_TEST_RANDOM_NONDETERMINISTIC=1;
    nested set-ups do this only at the outermost."""
    global _random_depth, _saved_random_states
    if _random_depth == 0:
        _saved_random_states = (_pyrandom.getstate(), numpy.random.get_state())
        deterministic = not int(os.environ.get("CUPY_TEST_RANDOM_NONDETERMINISTIC", "0"))
        _pyrandom.seed(99 if deterministic else None)
        numpy.random.seed(100 if deterministic else None)
        import gpuremote.cupy
        gpuremote.cupy.random.seed(101 if deterministic else None)
    _random_depth += 1


def _teardown_random() -> None:
    """Undo the outermost _setup_random: Python's and NumPy's states are restored; the device's
    generator is reseeded from fresh entropy (the daemon cannot hand back its earlier state)."""
    global _random_depth, _saved_random_states
    if _random_depth <= 0:
        raise RuntimeError("fix_random: tear-down without set-up")
    _random_depth -= 1
    if _random_depth == 0:
        python_state, numpy_state = _saved_random_states
        _saved_random_states = None
        _pyrandom.setstate(python_state)
        numpy.random.set_state(numpy_state)
        import gpuremote.cupy
        gpuremote.cupy.random.seed(None)


def generate_seed() -> int:
    """A seed drawn from NumPy's (fixed) global generator, inside a fix_random test."""
    if _random_depth <= 0:
        raise RuntimeError("generate_seed is for tests under fix_random")
    return int(numpy.random.randint(0x7FFFFFFF))


def fix_random():
    """Decorator for a test function, a unittest.TestCase class (around setUp/tearDown) or a plain
    pytest class (an autouse fixture): Python's random, NumPy's global generator and the current
    device's generator are seeded before each test (see _setup_random), and Python's and NumPy's
    states put back after it. Needs a connected gpuremote session when the test runs."""
    def decorate(target):
        if isinstance(target, types.FunctionType):
            @functools.wraps(target)
            def test_func(*args, **kw):
                _setup_random()
                try:
                    return target(*args, **kw)
                finally:
                    _teardown_random()
            return test_func
        if isinstance(target, type) and issubclass(target, unittest.TestCase):
            set_up, tear_down = target.setUp, target.tearDown

            def setUp(self):
                _setup_random()
                set_up(self)

            def tearDown(self):
                try:
                    tear_down(self)
                finally:
                    _teardown_random()
            target.setUp, target.tearDown = setUp, tearDown
            return target
        if isinstance(target, type):
            import pytest

            @pytest.fixture(autouse=True)
            def _gpuremote_fix_random(self):
                _setup_random()
                try:
                    yield
                finally:
                    _teardown_random()
            target._gpuremote_fix_random = _gpuremote_fix_random
            return target
        raise ValueError(f"fix_random applies to a test function or class, not {target!r}")
    return decorate
