"""User kernels: created anywhere, compiled and run on a CUDA daemon, refused clearly elsewhere.

The gpu-marked tests run only with GPUREMOTE_TEST_BACKEND=cupy on a GPU machine (conftest).
"""

import numpy as np
import pytest

from gpuremote.errors import CUDADeviceRequiredError

ADD_SOURCE = r'''
extern "C" __global__ void add_one(const float* x, float* y, int n) {
    int i = blockDim.x * blockIdx.x + threadIdx.x;
    if (i < n) y[i] = x[i] + 1.0f;
}
'''


def make_kernels(cp):
    raw = cp.RawKernel(ADD_SOURCE, "add_one")
    module = cp.RawModule(code=ADD_SOURCE)
    ew = cp.ElementwiseKernel("float32 x, float32 y", "float32 z", "z = x * y + 1", "mul_add_one")
    red = cp.ReductionKernel("float32 x", "float32 y", "x * x", "a + b", "y = sqrt(a)", "0", "l2norm")
    return raw, module, ew, red


def test_kernels_can_be_created_on_any_backend(cp):
    raw, module, ew, red = make_kernels(cp)
    assert raw.name == "add_one" and module.get_function("add_one").name == "add_one"
    assert (ew.nin, ew.nout) == (2, 1)


def test_calling_a_kernel_on_the_emulated_backend_is_a_clear_error(cp, daemon):
    from conftest import BACKEND
    if BACKEND == "cupy":
        pytest.skip("the cupy backend runs kernels")
    raw, _, ew, red = make_kernels(cp)
    x = cp.arange(8, dtype=cp.float32)
    y = cp.zeros(8, dtype=cp.float32)
    for call in (lambda: raw((1,), (8,), (x, y, np.int32(8))), lambda: ew(x, x), lambda: red(x)):
        with pytest.raises(CUDADeviceRequiredError, match="needs a CUDA device"):
            call()
    np.testing.assert_array_equal((x + 1).get(), np.arange(8, dtype=np.float32) + 1)  # session still fine


@pytest.mark.gpu
def test_raw_kernel_runs(cp):
    raw, module, _, _ = make_kernels(cp)
    x = cp.arange(1000, dtype=cp.float32)
    y = cp.zeros(1000, dtype=cp.float32)
    raw((4,), (256,), (x, y, np.int32(1000)))
    np.testing.assert_allclose(y.get(), np.arange(1000, dtype=np.float32) + 1)
    y2 = cp.zeros(1000, dtype=cp.float32)
    module.get_function("add_one")((4,), (256,), (x, y2, np.int32(1000)))
    np.testing.assert_allclose(y2.get(), y.get())


@pytest.mark.gpu
def test_elementwise_and_reduction_kernels_run(cp):
    _, _, ew, red = make_kernels(cp)
    a = np.random.default_rng(0).random(257, dtype=np.float32)
    x = cp.asarray(a)
    np.testing.assert_allclose(ew(x, x).get(), a * a + 1, rtol=1e-6)
    out = cp.empty(257, dtype=cp.float32)
    assert ew(x, x, out) is out
    np.testing.assert_allclose(out.get(), a * a + 1, rtol=1e-6)
    np.testing.assert_allclose(float(red(x)), np.sqrt((a * a).sum()), rtol=1e-5)


@pytest.mark.gpu
def test_device_properties_are_the_gpus(cp):
    props = cp.cuda.runtime.getDeviceProperties(0)
    assert props["totalGlobalMem"] > 2**30 and props["major"] >= 3
    free, total = cp.cuda.Device(0).mem_info
    assert 0 < free <= total == props["totalGlobalMem"]
