"""gpuremote.cupy.testing used as CuPy's own test suite uses cupy.testing: decorated test functions
and parameterized test classes that pytest collects and runs (each run of a numpy_cupy_* test goes
through the module's connected session), and deliberately wrong tests that must fail."""

from __future__ import annotations

import inspect
import random
import unittest
import warnings

import numpy
import pytest

from gpuremote.cupy import testing


@pytest.fixture(autouse=True)
def _connected(cp):
    """Every test here calls gpuremote.cupy (through the decorators): give it the module's session."""


# ------------------------------------------------------------------------------------------
# decorated test functions, as in CuPy's tests
# ------------------------------------------------------------------------------------------

@testing.for_all_dtypes(no_complex=True)
@testing.numpy_cupy_allclose(rtol={numpy.float16: 1e-3, "default": 1e-6})
def test_sum_all_dtypes(xp, dtype):
    return testing.shaped_arange((2, 3), xp, dtype).sum(axis=1)


@testing.for_int_dtypes()
@testing.numpy_cupy_array_equal()
def test_reverse_arange_int_dtypes(xp, dtype):
    return testing.shaped_reverse_arange((2, 3), xp, dtype)[::-1]


@testing.for_complex_dtypes()
@testing.numpy_cupy_allclose(rtol=1e-6)
def test_complex_arange(xp, dtype):
    a = testing.shaped_arange((3,), xp, dtype)
    return a * a


@testing.for_all_dtypes_combination(names=("x_type", "y_type"), no_bool=True, no_complex=True)
@testing.numpy_cupy_allclose(rtol=1e-3, type_check=False)
def test_add_dtype_combination(xp, x_type, y_type):
    return testing.shaped_arange((4,), xp, x_type) + testing.shaped_reverse_arange((4,), xp, y_type)


@testing.for_CF_orders()
@testing.numpy_cupy_allclose()
def test_arange_orders(xp, order):
    return testing.shaped_arange((2, 3), xp, numpy.float64, order=order) * 2


@testing.for_orders(["C", "F"])
@testing.numpy_cupy_array_equal(strides_check=True)
def test_strides_match(xp, order):
    return xp.array(numpy.arange(6, dtype=numpy.int32).reshape(2, 3), order=order)


@testing.for_float_dtypes(no_float16=True)
@testing.numpy_cupy_array_almost_equal(decimal=4)
def test_sqrt_almost_equal(xp, dtype):
    return xp.sqrt(testing.shaped_arange((5,), xp, dtype))


@testing.numpy_cupy_array_almost_equal_nulp(nulp=4)
def test_exp_nulp(xp):
    return xp.exp(testing.shaped_linspace(-2, 2, (7,), xp, numpy.float64))


@testing.numpy_cupy_array_max_ulp(maxulp=4)
def test_exp_max_ulp(xp):
    return xp.exp(testing.shaped_linspace(-2, 2, (7,), xp, numpy.float32))


@testing.numpy_cupy_array_less()
def test_device_result_is_less(xp):
    a = testing.shaped_arange((2, 2), xp, numpy.float32)
    return a - 0.5 if xp is not numpy else a


@testing.numpy_cupy_equal()
def test_plain_values_equal(xp):
    a = testing.shaped_arange((2, 3), xp, numpy.int16)
    return a.shape, a.dtype, a.ndim, a.T.flags.f_contiguous, a.sum()


@testing.numpy_cupy_allclose(accept_error=ValueError)
def test_both_raise_accepted(xp):
    return xp.zeros(3).reshape(4)


with pytest.warns(DeprecationWarning):
    @testing.numpy_cupy_raises()
    def test_numpy_cupy_raises(xp):
        xp.zeros((2, 3)).reshape(7)


@testing.for_dtypes([numpy.uint8, numpy.uint32], name="dst")
@testing.for_dtypes([numpy.float32], name="src")
@testing.numpy_cupy_array_equal()
def test_negative_cast_to_unsigned_is_masked(xp, src, dst):
    # a signed (float) and an unsigned dtype in the keywords: where the signed run is negative, the
    # unsigned cast is undefined and not compared (stand in for a GPU's own answer there)
    v = numpy.array([-3.0, 4.0, -1.0, 2.0], dtype=src)
    if xp is not numpy and numpy.dtype(dst).kind == "u":
        v = numpy.where(v < 0, 0, v)
    return xp.asarray(v).astype(dst)


@testing.slow
@testing.with_requires("numpy>=1.20", "pytest")
def test_slow_and_requirements_met():
    assert testing.installed("numpy>=1.20", "pytest") and testing.numpy_satisfies(">=1.20")


def test_requirements_without_packaging():
    name, check = testing._simple_requirement("numpy >= 1.20, <99")
    assert name == "numpy" and check("2.4.1") and not check("1.19.5") and not check("99.0")
    assert not testing.installed("gpuremote-no-such-distribution")
    with pytest.raises(ValueError):
        testing._simple_requirement("numpy~=1.2")


@testing.with_requires("numpy<1.0")
def test_requirement_unmet_is_skipped():
    raise AssertionError("with_requires should have skipped this")


@testing.multi_gpu(2)
def test_two_devices(cp):
    with cp.cuda.Device(1):
        a = cp.arange(4)
    assert a.device.id == 1 and a.sum().get() == 6


@testing.fix_random()
def test_fix_random_seeds_everything(cp):
    assert random.random() == random.Random(99).random()
    assert numpy.random.rand() == numpy.random.RandomState(100).rand()
    first = cp.random.rand(3).get()
    cp.random.seed(101)
    numpy.testing.assert_array_equal(cp.random.rand(3).get(), first)


# ------------------------------------------------------------------------------------------
# parameterized classes
# ------------------------------------------------------------------------------------------

@testing.parameterize(*testing.product({"shape": [(2, 3), (2, 3, 4)], "order": ["C", "F"]}))
class TestParameterized:

    @testing.for_float_dtypes(no_float16=True)
    @testing.numpy_cupy_allclose(rtol=1e-6)
    def test_sum_last_axis(self, xp, dtype):
        return testing.shaped_arange(self.shape, xp, dtype, order=self.order).sum(axis=-1)

    @testing.for_contiguous_axes()
    @testing.numpy_cupy_allclose()
    def test_sum_contiguous_axes(self, xp, axis):
        assert axis[-1 if self.order == "C" else 0] == (len(self.shape) - 1 if self.order == "C" else 0)
        return testing.shaped_arange(self.shape, xp, numpy.float64, order=self.order).sum(axis=axis)

    def test_attributes_and_fixture(self, cp):
        assert self.shape in [(2, 3), (2, 3, 4)] and self.order in ("C", "F")
        assert cp.zeros(self.shape, order=self.order).flags.f_contiguous == (self.order == "F")


@testing.parameterize(*testing.product_dict([{"n": 1}, {"n": 3}], [{"fn": numpy.ones}, {"fn": numpy.zeros}]))
@testing.fix_random()
class TestUnittestStyle(unittest.TestCase):

    def test_function_attribute_is_not_bound(self):
        assert self.fn(self.n).shape == (self.n,)

    @testing.numpy_cupy_array_equal()
    def test_arange(self, xp):
        return testing.shaped_arange((self.n, 2), xp, numpy.int64)

    def test_random_fixed(self):
        assert numpy.random.rand() == numpy.random.RandomState(100).rand()


@testing.parameterize({"a": 1}, {"a": 2})
@testing.parameterize({"b": 10}, {"b": 20}, {"b": 30})
class TestStacked:

    def test_both_set(self):
        assert self.a in (1, 2) and self.b in (10, 20, 30)


def test_parameterize_made_the_classes():
    made = sorted(n for n in globals() if n.startswith("TestUnittestStyle_param_"))
    assert len(made) == 4 and all(issubclass(globals()[n], unittest.TestCase) for n in made)
    assert made[0] == "TestUnittestStyle_param_0_{fn=ones, n=1}"
    assert not isinstance(TestUnittestStyle, type)          # the template itself is not collected
    (mark,) = [m for m in TestStacked.pytestmark if m.name == "parametrize"]
    assert len(mark.args[1]) == 6
    assert {(p.values[0]["a"], p.values[0]["b"]) for p in mark.args[1]} == {(a, b) for a in (1, 2)
                                                                          for b in (10, 20, 30)}


def test_product_and_product_dict():
    assert testing.product({"b": [3], "a": [1, 2]}) == [{"a": 1, "b": 3}, {"a": 2, "b": 3}]
    assert testing.product_dict([{"a": 1}, {"a": 2}], [{"b": 3, "a": 0}]) == [{"a": 0, "b": 3}, {"a": 0, "b": 3}]
    with pytest.raises(TypeError):
        testing.product([{"a": 1}])


# ------------------------------------------------------------------------------------------
# the helpers themselves
# ------------------------------------------------------------------------------------------

def test_signatures_hide_the_decorator_arguments():
    for fn in (test_sum_all_dtypes, test_add_dtype_combination, test_arange_orders, test_numpy_cupy_raises):
        assert all(p.default is None for p in inspect.signature(fn).parameters.values())
    assert list(inspect.signature(test_two_devices).parameters) == ["cp"]
    assert list(inspect.signature(TestParameterized.test_sum_contiguous_axes).parameters) == ["self", "xp", "axis"]


def test_dtype_loops_cover_cupys_lists():
    seen = {}

    def collect(key):
        def body(dtype):
            seen.setdefault(key, []).append(dtype)
        return body
    testing.for_signed_dtypes()(collect("s"))()
    testing.for_unsigned_dtypes()(collect("u"))()
    testing.for_int_dtypes(no_bool=True)(collect("i"))()
    testing.for_complex_dtypes()(collect("c"))()
    testing.for_all_dtypes()(collect("a"))()
    assert [numpy.dtype(t).char for t in seen["s"]] == list("bhilq")
    assert [numpy.dtype(t).char for t in seen["u"]] == list("BHILQ")
    assert seen["i"] == seen["s"] + seen["u"]
    assert seen["c"] == [numpy.complex64, numpy.complex128]
    assert len(seen["a"]) == 16 and numpy.bool_ in seen["a"] and numpy.float16 in seen["a"]


def test_dtype_combinations():
    pairs = []
    testing.for_dtypes_combination([numpy.int8, numpy.float32, numpy.uint16], names=("a", "b"), full=True)(
        lambda a, b: pairs.append((a, b)))()
    assert len(pairs) == 9 == len(set(pairs))
    sampled = []
    testing.for_int_dtypes_combination(names=("a", "b"), full=False)(lambda a, b: sampled.append((a, b)))()
    assert len(set(sampled)) == len(sampled) <= 2 * 11
    assert {a for a, _ in sampled} == {b for _, b in sampled} == set(testing._INT + (numpy.bool_,))
    names = []
    testing.for_all_dtypes_combination(full=False)(lambda dtyes: names.append(dtyes))()   # CuPy's default name
    assert set(names) == set(testing._all_dtypes())
    single = []
    testing.for_signed_dtypes_combination(names=("x",), full=True)(lambda x: single.append(x))()
    testing.for_unsigned_dtypes_combination(names=("x",), full=True)(lambda x: single.append(x))()
    assert len(single) == 10


def test_skips_inside_a_loop_are_reported_and_the_loop_goes_on(capsys):
    ran = []

    @testing.for_float_dtypes()
    def body(dtype):
        if dtype == numpy.float16:
            pytest.skip("no half here")
        ran.append(dtype)
    body()
    assert ran == [numpy.float64, numpy.float32] and "skipped: dtype = float16 (no half here)" in capsys.readouterr().out


def test_array_makers(cp):
    numpy.testing.assert_array_equal(testing.shaped_reverse_arange((2, 2), numpy, numpy.int8), [[4, 3], [2, 1]])
    numpy.testing.assert_array_equal(testing.shaped_reverse_arange((4,), numpy, numpy.bool_), [True, False, True, False])
    numpy.testing.assert_array_equal(testing.shaped_arange((2,), numpy, numpy.complex64), [1 + 1j, 2 + 2j])
    numpy.testing.assert_allclose(testing.shaped_linspace(-1, 1, (3,), numpy, numpy.float64), [-1, 0, 1])
    numpy.testing.assert_array_equal(testing.shaped_linspace(-4, 4, (3,), numpy, numpy.uint8), [0, 2, 4])
    device = testing.shaped_arange((2, 3), dtype=numpy.float32, order="F")
    assert isinstance(device, cp.ndarray) and device.flags.f_contiguous
    assert testing.shaped_random((2, 2), numpy, numpy.complex128).imag.any()
    testing.assert_array_equal(testing.shaped_random((3,), cp, seed=4), testing.shaped_random((3,), numpy, seed=4))


def test_generate_matrix(cp):
    a = testing.generate_matrix((2, 4, 3), cp, numpy.float64, singular_values=[3.0, 2.0, 0.5])
    assert isinstance(a, cp.ndarray) and a.shape == (2, 4, 3)
    numpy.testing.assert_allclose(numpy.linalg.svd(a.get(), compute_uv=False), [[3, 2, 0.5]] * 2)
    c = testing.generate_matrix((3, 3), numpy, numpy.complex64, singular_values=1.0)
    assert c.dtype == numpy.complex64 and numpy.iscomplexobj(c)
    for kwargs, error in [({"shape": (3,), "singular_values": 1}, ValueError), ({"shape": (2, 2)}, TypeError),
                          ({"shape": (2, 2), "dtype": numpy.int32, "singular_values": 1}, TypeError),
                          ({"shape": (2, 2), "singular_values": [1, -1]}, ValueError),
                          ({"shape": (2, 2), "singular_values": [1j, 1]}, TypeError)]:
        with pytest.raises(error):
            testing.generate_matrix(xp=numpy, **kwargs)


def test_marks():
    def target():
        pass
    assert [m.name for m in testing.gpu(target).pytestmark] == ["gpu"]
    assert "slow" in [m.name for m in test_slow_and_requirements_met.pytestmark]
    (skip,) = [m for m in test_requirement_unmet_is_skipped.pytestmark if m.name == "skipif"]
    assert skip.args == (True,) and "numpy<1.0" in skip.kwargs["reason"]
    assert "multi_gpu" in [m.name for m in test_two_devices.pytestmark]


def test_multi_gpu_skips_beyond_the_device_count(cp, monkeypatch):
    assert cp.cuda.runtime.getDeviceCount() == 2
    ran = []

    @testing.multi_gpu(3)
    def needs_three():
        ran.append(3)
    with pytest.raises(pytest.skip.Exception, match="3 GPUs required; this process has 2"):
        needs_three()

    @testing.multi_gpu(2)
    class TestTwo:
        def test_a(self):
            ran.append(2)
    TestTwo().test_a()
    monkeypatch.setenv("CUPY_TEST_GPU_LIMIT", "1")
    with pytest.raises(pytest.skip.Exception, match="CUPY_TEST_GPU_LIMIT"):
        TestTwo().test_a()
    assert ran == [2]


def test_fix_random_restores_host_states(cp):
    numpy.random.seed(7)
    random.seed(7)
    expected_numpy, expected_python = numpy.random.RandomState(7).rand(), random.Random(7).random()
    draws = []

    @testing.fix_random()
    def draw():
        draws.append((numpy.random.rand(), testing.generate_seed(), cp.random.rand(2).get()))
    draw()
    draw()
    assert draws[0][:2] == draws[1][:2]
    numpy.testing.assert_array_equal(draws[0][2], draws[1][2])
    assert numpy.random.rand() == expected_numpy and random.random() == expected_python
    with pytest.raises(RuntimeError):
        testing.generate_seed()


def test_assert_warns():
    with testing.assert_warns(UserWarning):
        warnings.warn("w", UserWarning)
    with pytest.raises(AssertionError, match="DeprecationWarning was not emitted"):
        with testing.assert_warns(DeprecationWarning):
            warnings.warn("w", UserWarning)


def test_assertions_on_device_arrays(cp):
    a = cp.arange(4)
    testing.assert_array_equal(a, numpy.arange(4), strides_check=True)
    testing.assert_array_less(a, a + 1)
    testing.assert_array_list_equal([a, a], [numpy.arange(4), numpy.arange(4)])
    with pytest.raises(AssertionError):
        testing.assert_array_list_equal([a], (numpy.arange(4),))
    with pytest.raises(AssertionError, match="strides"):
        testing.assert_array_equal(cp.zeros((2, 2)), numpy.zeros((2, 2), dtype=numpy.float32), strides_check=True)


# ------------------------------------------------------------------------------------------
# deliberately wrong tests fail
# ------------------------------------------------------------------------------------------

def _differ(xp, by):
    return testing.shaped_arange((3,), xp, numpy.float64) + (by if xp is not numpy else 0)


WRONG = {
    "allclose": lambda: testing.numpy_cupy_allclose(rtol=1e-9)(lambda xp: _differ(xp, 1e-6)),
    "almost_equal": lambda: testing.numpy_cupy_array_almost_equal(decimal=8)(lambda xp: _differ(xp, 1e-6)),
    "nulp": lambda: testing.numpy_cupy_array_almost_equal_nulp(nulp=2)(lambda xp: _differ(xp, 1e-9)),
    "max_ulp": lambda: testing.numpy_cupy_array_max_ulp(maxulp=2)(lambda xp: _differ(xp, 1e-9)),
    "less": lambda: testing.numpy_cupy_array_less()(lambda xp: _differ(xp, 0)),
    "equal": lambda: testing.numpy_cupy_equal()(lambda xp: xp.zeros((2, 3) if xp is numpy else (3, 2)).shape),
    "equal-one-raises": lambda: testing.numpy_cupy_equal()(lambda xp: xp.zeros(3).reshape(4 if xp is numpy else 3).ndim),
    "equal-both-raise": lambda: testing.numpy_cupy_equal()(lambda xp: xp.zeros(3).reshape(4)),
    "unsigned-unmasked": lambda: testing.for_dtypes([numpy.uint8], name="dst")(
        testing.numpy_cupy_array_equal()(lambda xp, dst: xp.asarray([0 if xp is not numpy else -3, 1]).astype(dst))),
    "dtype-loop": lambda: testing.for_all_dtypes(no_bool=True)(
        testing.numpy_cupy_array_equal()(lambda xp, dtype: _differ(xp, dtype == numpy.int32).astype(dtype))),
    "order-loop": lambda: testing.for_CF_orders()(
        testing.numpy_cupy_allclose()(lambda xp, order: xp.asarray(numpy.ones((2, 2)), order="F" if
                                                                  xp is numpy else "C"))),
}


@pytest.mark.parametrize("case", sorted(WRONG))
def test_a_wrong_test_fails(case):
    with pytest.raises(AssertionError):
        WRONG[case]()()


@pytest.mark.parametrize("case", ["neither", "only-numpy", "not-accepted"])
def test_numpy_cupy_raises_fails(case):
    with pytest.warns(DeprecationWarning):
        decorate = testing.numpy_cupy_raises(accept_error=TypeError if case == "not-accepted" else Exception)

    @decorate
    def body(xp):
        if case == "neither":
            return xp.zeros(3)
        return xp.zeros(3).reshape(4 if case == "not-accepted" or xp is numpy else 3)
    with pytest.raises(AssertionError):
        body()


def test_unsupported_is_refused_clearly():
    for decorator in (testing.numpy_cupy_array_almost_equal, testing.numpy_cupy_array_almost_equal_nulp,
                      testing.numpy_cupy_array_max_ulp, testing.numpy_cupy_array_less, testing.numpy_cupy_equal):
        with pytest.raises(NotImplementedError, match="sparse"):
            decorator(sp_name="sp")
    with pytest.raises(NotImplementedError, match="sparse"):
        testing.shaped_sparse_random((2, 2))
    with pytest.raises(TypeError, match="test classes"):
        testing.parameterize({"a": 1})(lambda: None)
    with pytest.raises(ValueError):
        testing.multi_gpu(1)
    with pytest.raises(TypeError, match="keys"):
        testing.numpy_cupy_allclose(rtol={"float32": 1e-3})
    with pytest.raises(TypeError, match="numpy_cupy_array_equal"):
        testing.numpy_cupy_equal()(lambda xp: xp.arange(3))()
    with pytest.raises(ValueError, match="shape and self.order"):
        testing.for_contiguous_axes()(lambda self, axis: None)(object())
