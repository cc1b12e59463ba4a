"""cupy.lib.stride_tricks: sliding_window_view, forwarded (a view the daemon makes, whose windows
NumPy's or CuPy's own function checks against the array's shape); as_strided is refused."""

from gpuremote.cupy import _namespace

__all__ = _namespace.populate(globals(), "lib.stride_tricks.") + ["as_strided"]


def as_strided(x, shape=None, strides=None):
    """Refused (NotImplementedError): a view of arbitrary shape and strides can reach bytes outside
    `x`'s buffer, on a daemon that holds other sessions' arrays too, and nothing there can check
    it. sliding_window_view, reshape, indexing and broadcast_to make the usual strided views."""
    raise NotImplementedError("cupy.lib.stride_tricks.as_strided is not forwarded: a view of arbitrary strides "
                              "could read the daemon's memory outside the array; use sliding_window_view, "
                              "reshape, indexing or broadcast_to")


def __getattr__(attr):
    raise _namespace.unknown_attribute(__name__, attr)
