"""cupy.random, forwarded. Each session has one generator per device on the daemon:
`seed(s)` makes what follows reproducible within a backend (streams differ between the
emulated and the cupy backend, as they do between NumPy and CuPy)."""

from gpuremote.cupy import _namespace

__all__ = _namespace.populate(globals(), "random.")


def __getattr__(attr):
    raise _namespace.unknown_attribute(__name__, attr)
