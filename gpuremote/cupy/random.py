"""cupy.random, forwarded. Each session has a generator per device on the daemon, which the
module's functions draw from: `seed(s)` makes what follows reproducible within a backend (streams
differ between the emulated and the cupy backend, as they do between NumPy and CuPy).

A RandomState, or a Generator from default_rng(), is a generator of its own on the daemon, on the
device current when it was made (as in CuPy): its calls carry its id (meta.RANDOM_GENERATOR), and
it lives as long as the session.
"""

import itertools

import numpy

from gpuremote.client import context
from gpuremote.cupy import _namespace
from gpuremote.cupy._core import forward
from gpuremote.meta import RANDOM_GENERATOR
from gpuremote.surface import GENERATOR_METHODS, SURFACE, module_names

__all__ = _namespace.populate(globals(), "random.", skip=frozenset({"default_rng"})) + [
    "RandomState", "Generator", "default_rng", "get_random_state", "multivariate_normal"]

_generator_ids = itertools.count(1)     # 0 is each device's own generator


class _OnDevice:
    """A generator of the daemon's, on the device current when it was made (as in CuPy)."""

    def __init__(self):
        self._device = context.current_device_index()
        self._id = next(_generator_ids)

    def _call(self, name: str, args: tuple, kwargs: dict):
        if RANDOM_GENERATOR in kwargs:
            raise TypeError(f"{name.rpartition('.')[2]}() got an unexpected keyword argument {RANDOM_GENERATOR!r}")
        previous = context.current_device_index()
        context.set_current_device(self._device)
        try:
            return forward(name, args, {**kwargs, RANDOM_GENERATOR: self._id}, SURFACE[name])
        finally:
            context.set_current_device(previous)

    def __repr__(self) -> str:
        return f"<gpuremote {type(self).__name__} {self._id} on device {self._device}>"


class RandomState(_OnDevice):
    """cupy.random.RandomState: an independent generator; `RandomState(s)` twice draws the same numbers."""

    def __init__(self, seed=None):
        super().__init__()
        self.seed(seed)


class Generator(_OnDevice):
    """cupy.random.Generator, made by default_rng(seed): the methods of surface.GENERATOR_METHODS."""

    def __init__(self, seed=None):
        if seed is not None and not (isinstance(seed, (int, numpy.integer)) and seed >= 0):
            raise TypeError("default_rng(seed): a non-negative int or None through gpuremote (SeedSequence, "
                            f"BitGenerator and arrays of ints are not forwarded), not {type(seed).__name__}")
        super().__init__()
        self._call("random.default_rng", () if seed is None else (int(seed),), {})


def default_rng(seed=None) -> Generator:
    """cupy.random.default_rng: a new Generator (a Generator passed in is returned as it is)."""
    return seed if isinstance(seed, Generator) else Generator(seed)


def _method(prefix: str, name: str):
    def method(self, *args, **kwargs):
        return self._call(prefix + name, args, kwargs)
    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"{name}, drawn from this generator on the daemon."
    return method


for _name in module_names("random."):
    if _name != "default_rng":
        setattr(RandomState, _name, _method("random.", _name))
for _name in GENERATOR_METHODS:
    setattr(Generator, _name, _method("random.Generator.", _name))


def _multivariate_normal(standard_normal, mean, cov, size=None, check_valid="ignore", tol=1e-8, method="cholesky",
                         dtype=float):
    """Draws of N(mean, cov): standard normal draws times a factor F of cov (cov = F @ F.T: its
    Cholesky factor, or from its SVD or eigendecomposition), plus mean, all on the device.
    check_valid "warn" or "raise" first asks whether cov is positive semi-definite within `tol`
    (its smallest eigenvalue: a sync point)."""
    from gpuremote import cupy as cp
    if method not in ("cholesky", "svd", "eigh"):
        raise ValueError(f"multivariate_normal: method must be 'cholesky', 'svd' or 'eigh', not {method!r}")
    if check_valid not in ("ignore", "warn", "raise"):
        raise ValueError(f"multivariate_normal: check_valid must be 'ignore', 'warn' or 'raise', not {check_valid!r}")
    dtype = numpy.dtype(dtype)
    if dtype.kind != "f":
        raise TypeError(f"multivariate_normal: dtype must be a float type, not {dtype}")
    mean, cov = cp.asarray(mean, dtype=dtype), cp.asarray(cov, dtype=dtype)
    if mean.ndim != 1 or cov.shape != (mean.shape[0], mean.shape[0]):
        raise ValueError(f"multivariate_normal: mean must be 1-D and cov square of its length; got mean {mean.shape}, "
                         f"cov {cov.shape}")
    if check_valid != "ignore" and float(cp.linalg.eigvalsh(cov).min()) < -tol:
        if check_valid == "raise":
            raise ValueError("multivariate_normal: covariance is not symmetric positive-semidefinite.")
        import warnings
        warnings.warn("multivariate_normal: covariance is not symmetric positive-semidefinite.", RuntimeWarning,
                      stacklevel=3)
    if method == "cholesky":
        factor = cp.linalg.cholesky(cov)
    elif method == "svd":
        u, s, _ = cp.linalg.svd(cov)
        factor = u * cp.sqrt(s)
    else:
        w, v = cp.linalg.eigh(cov)
        factor = v * cp.sqrt(cp.maximum(w, 0))
    shape = (() if size is None else (size,) if isinstance(size, (int, numpy.integer)) else tuple(size))
    z = standard_normal(size=shape + mean.shape, dtype=dtype)
    return z @ factor.T + mean


def multivariate_normal(mean, cov, size=None, check_valid="ignore", tol=1e-8, method="cholesky", dtype=float):
    """cupy.random.multivariate_normal, from the current device's generator (see _multivariate_normal)."""
    return _multivariate_normal(standard_normal, mean, cov, size, check_valid, tol, method, dtype)  # noqa: F821


def _state_multivariate_normal(self, mean, cov, size=None, check_valid="ignore", tol=1e-8, method="cholesky",
                               dtype=float):
    """multivariate_normal, drawn from this generator."""
    return _multivariate_normal(self.standard_normal, mean, cov, size, check_valid, tol, method, dtype)


RandomState.multivariate_normal = _state_multivariate_normal


def get_random_state() -> RandomState:
    """The current device's own generator, the one the module's functions and seed() use."""
    state = RandomState.__new__(RandomState)
    state._device, state._id = context.current_device_index(), 0
    return state


def __getattr__(attr):
    raise _namespace.unknown_attribute(__name__, attr)
