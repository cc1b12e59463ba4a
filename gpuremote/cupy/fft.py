"""cupy.fft, forwarded: the functions listed under "fft." in the surface table."""

from gpuremote.cupy import _namespace

__all__ = _namespace.populate(globals(), "fft.")


def __getattr__(attr):
    raise _namespace.unknown_attribute(__name__, attr)
