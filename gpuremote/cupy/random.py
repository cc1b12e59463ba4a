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
    "RandomState", "Generator", "default_rng", "get_random_state"]

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


def get_random_state() -> RandomState:
    """The current device's own generator, the one the module's functions and seed() use."""
    state = RandomState.__new__(RandomState)
    state._device, state._id = context.current_device_index(), 0
    return state


def __getattr__(attr):
    raise _namespace.unknown_attribute(__name__, attr)
