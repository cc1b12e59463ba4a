"""Exceptions of gpuremote and how they cross the wire.

An exception raised on the daemon travels as data (type name, message, op, source line,
traceback) and is re-created on the client only for the known types below; any other type
becomes RemoteError. Transport failures are a distinct type, DeviceLostError.
"""

from __future__ import annotations

import numpy


class GpuremoteError(Exception):
    """Base of the errors gpuremote itself raises."""


class RemoteError(GpuremoteError):
    """The daemon raised an exception of a type the client does not re-create."""

    def __init__(self, message: str, remote_type: str = "", remote_traceback: str = ""):
        super().__init__(message)
        self.remote_type = remote_type
        self.remote_traceback = remote_traceback


class DeviceLostError(GpuremoteError, RuntimeError):
    """The connection to the daemon that owns a device broke: the device and its arrays are gone."""


class ProtocolError(GpuremoteError):
    """A peer sent a message this side cannot accept (version mismatch, malformed message)."""


class UnsupportedOperationError(GpuremoteError, NotImplementedError):
    """A name outside the surface table, or an argument the wire cannot carry."""


class CUDADeviceRequiredError(GpuremoteError, RuntimeError):
    """A CUDA kernel was called on a device that cannot run CUDA code (the emulated backend)."""


class CUDARuntimeError(GpuremoteError, RuntimeError, ValueError):
    """cupy.cuda.runtime.CUDARuntimeError: a device call CUDA would refuse, with CUDA's status code
    (`status`); raised for a device index this process does not have (also a ValueError: a bad
    argument)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


INVALID_DEVICE = 101    # cudaErrorInvalidDevice


class LimitExceededError(GpuremoteError, ValueError):
    """A request went past one of the documented limits (handles, rank, message size, ...)."""


class GrantError(GpuremoteError, PermissionError):
    """A pool grant was refused: bad signature, malformed, or expired."""


class AuthenticationError(GpuremoteError, PermissionError):
    """A daemon or pool refused this client's credentials (token or certificate)."""


class OutOfMemoryError(MemoryError):
    """Device memory would be exceeded; the same role as cupy.cuda.memory.OutOfMemoryError."""


# Exception types re-created on the client, by the name used on the wire.
KNOWN_TYPES: dict[str, type[BaseException]] = {
    t.__name__: t
    for t in (ValueError, TypeError, IndexError, KeyError, ZeroDivisionError, OverflowError,
              ArithmeticError, FloatingPointError, NotImplementedError, RuntimeError, AttributeError)
}
KNOWN_TYPES.update({
    "numpy.linalg.LinAlgError": numpy.linalg.LinAlgError,
    "numpy.exceptions.AxisError": numpy.exceptions.AxisError,
    "numpy.exceptions.ComplexWarning": numpy.exceptions.ComplexWarning,
    "cupy.cuda.memory.OutOfMemoryError": OutOfMemoryError,
})
for _t in (RemoteError, DeviceLostError, ProtocolError, UnsupportedOperationError,
           CUDADeviceRequiredError, LimitExceededError, GrantError):
    KNOWN_TYPES["gpuremote." + _t.__name__] = _t
_NAME_OF = {t: name for name, t in KNOWN_TYPES.items()}


def wire_type_name(exc: BaseException) -> str:
    """The most specific known type in exc's MRO, so subclasses (NumPy's private ones) map sensibly."""
    if isinstance(exc, MemoryError):
        return "cupy.cuda.memory.OutOfMemoryError"
    for t in type(exc).__mro__:
        if t in _NAME_OF:
            return _NAME_OF[t]
    return f"{type(exc).__module__}.{type(exc).__qualname__}"


def rebuild(type_name: str, message: str, remote_traceback: str = "") -> BaseException:
    """Re-create an exception from its wire form."""
    cls = KNOWN_TYPES.get(type_name)
    if cls is None:
        return RemoteError(f"{type_name}: {message}", type_name, remote_traceback)
    if cls is RemoteError:
        return RemoteError(message, type_name, remote_traceback)
    try:
        return cls(message)
    except Exception:  # a type whose constructor wants other arguments
        return RemoteError(f"{type_name}: {message}", type_name, remote_traceback)
