"""cupyx.scipy.special, forwarded: the names listed under "scipy.special." in the surface table.
The emulated backend computes them with SciPy (install scipy on the daemon host)."""

from gpuremote.cupy import _namespace

__all__ = _namespace.populate(globals(), "scipy.special.")


def __getattr__(attr):
    raise _namespace.unknown_attribute(__name__, attr)
