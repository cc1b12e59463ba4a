"""The emulated device: NumPy arrays behind the same daemon, for machines without a GPU.

N pretend devices, each with a memory capacity accounted exactly by the daemon's ledger.
Streams run in issue order (execution is serial), events record the host clock at execution,
and CUDA kernels cannot run: calling one raises CUDADeviceRequiredError. BLAS is limited to
DEFAULTS.emulate_blas_threads threads in the daemon's process (see _config for why).
"""

from __future__ import annotations

import time
import warnings

import numpy

from gpuremote.daemon.backends.base import Backend, DeviceProps, special_function
from gpuremote.errors import CUDADeviceRequiredError
from gpuremote.meta import RANDOM_DTYPES, numpy_callable
from gpuremote.surface import GENERATOR_METHODS
from gpuremote._config import DEFAULTS


class EmulatedRandom:
    """CuPy's RandomState API over NumPy's, including the `dtype` arguments NumPy lacks."""

    def __init__(self, seed):
        self._rs = numpy.random.RandomState(seed)

    def seed(self, seed=None):
        self._rs.seed(seed)

    def __getattr__(self, name):
        fn = getattr(self._rs, name)
        default = RANDOM_DTYPES.get(name, numpy.dtype(numpy.float64))

        def call(*args, dtype=None, **kwargs):
            if name in ("random", "random_sample", "ranf", "sample", "standard_normal") and len(args) > 1:
                args, dtype = args[:1], args[1]
            if name in ("randint",) and dtype is not None:
                return numpy.asarray(fn(*args, dtype=dtype, **kwargs))
            out = numpy.asarray(fn(*args, **kwargs))
            if name in ("choice", "permutation", "shuffle"):
                return out
            return out.astype(dtype if dtype is not None else default, copy=False)

        return call

    def rand(self, *dims, dtype=None):
        return self.random_sample(dims or None, dtype=dtype)

    def randn(self, *dims, dtype=None):
        return self.standard_normal(dims or None, dtype=dtype)

    def shuffle(self, x):
        self._rs.shuffle(x)


class EmulatedGenerator:
    """cupy.random.Generator's methods over NumPy's Generator (PCG64 rather than CuPy's XORWOW),
    with the `dtype` arguments some NumPy methods lack (the result is cast)."""

    _NUMPY_TAKES_DTYPE = frozenset({"random", "standard_normal", "standard_exponential", "standard_gamma",
                                    "integers"})

    def __init__(self, seed):
        self._g = numpy.random.default_rng(seed)

    def __getattr__(self, name):
        if name not in GENERATOR_METHODS:
            raise AttributeError(f"cupy.random.Generator has no method {name!r} through gpuremote")
        fn, (_, dtype_pos, default) = getattr(self._g, name), GENERATOR_METHODS[name]
        if name in self._NUMPY_TAKES_DTYPE:
            return lambda *args, **kwargs: numpy.asarray(fn(*args, **kwargs))

        def call(*args, dtype=None, **kwargs):
            if dtype_pos is not None and len(args) > dtype_pos:
                args, dtype = args[:dtype_pos], args[dtype_pos]
            return numpy.asarray(fn(*args, **kwargs)).astype(dtype or default, copy=False)
        return call


def _in1d(ar1, ar2, assume_unique=False, invert=False, *, kind=None):
    """cupy.in1d: isin on the flattened first argument."""
    return numpy.isin(numpy.ravel(ar1), ar2, assume_unique=assume_unique, invert=invert, kind=kind)


class EmulatedBackend(Backend):
    kind = "emulated"
    xp = numpy

    def __init__(self, count: int = 1, memory: int | None = None):
        if count < 1:
            raise ValueError("--emulate needs at least one device")
        memory = DEFAULTS.emulate_memory if memory is None else memory
        props = [DeviceProps(i, "gpuremote emulated device", memory, "00", 1) for i in range(count)]
        super().__init__(props)
        from threadpoolctl import threadpool_limits
        self._blas_limit = threadpool_limits(limits=DEFAULTS.emulate_blas_threads, user_api="blas")
        # A GPU computes inf and NaN without a word; NumPy warns (exp(1000) overflows, the mean of an
        # empty array), and the warning would name the daemon's or NumPy's own line in its log or
        # `gpuremote run`'s terminal.
        warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"(gpuremote\.daemon|numpy|scipy)\.")

    def close(self):
        self._blas_limit.restore_original_limits()

    def is_array(self, obj):
        return isinstance(obj, numpy.ndarray)

    owner_by_base = True

    def owner(self, arr):
        base = arr
        while True:
            step = base.base
            if not isinstance(step, numpy.ndarray):     # NumPy's as_strided views (sliding_window_view)
                step = getattr(step, "base", None)      # hold their array through a DummyArray
                if not isinstance(step, numpy.ndarray):
                    return base, base.nbytes
            base = step

    def from_host(self, arr, device, owned=False):
        return arr if owned else numpy.array(arr, copy=True, order="C")

    def to_host(self, arr, out=None):
        if out is None:
            return arr
        numpy.copyto(out, arr)
        return out

    def empty(self, shape, dtype, device):
        return numpy.empty(shape, dtype)

    def resolve(self, name):
        if name == "in1d" and not hasattr(numpy, "in1d"):      # CuPy keeps it; NumPy 2.4 removed it
            return _in1d
        if name.startswith("scipy.special."):
            try:
                import scipy.special
            except ImportError:
                raise ImportError(f"cupyx.{name} needs SciPy on the daemon's host: the emulated device computes "
                                  "cupyx.scipy.special with it (pip install scipy there)") from None
            return special_function(getattr(scipy.special, name.rpartition(".")[2]), self.is_array)
        return numpy_callable(name)

    def record_event(self, device, stream, streams):
        return time.perf_counter()

    def elapsed_ms(self, start, end):
        return (end - start) * 1e3

    def random_state(self, seed):
        return EmulatedRandom(seed)

    def generator(self, seed):
        return EmulatedGenerator(seed)

    def kernel(self, kind, spec):
        raise CUDADeviceRequiredError(
            f"{spec.get('name', 'this kernel')}: CUDA kernels need a CUDA device, and this daemon runs the "
            "emulated backend. Run the daemon on a GPU host (gpuremote daemon --backend cupy).")
