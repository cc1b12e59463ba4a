"""cupy.linalg, forwarded: the functions listed under "linalg." in the surface table."""

from numpy.linalg import LinAlgError  # noqa: F401  (CuPy raises NumPy's LinAlgError too)

from gpuremote.cupy import _namespace

__all__ = _namespace.populate(globals(), "linalg.")


def __getattr__(attr):
    raise _namespace.unknown_attribute(__name__, attr)
