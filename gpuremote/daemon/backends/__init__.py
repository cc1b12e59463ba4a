"""Device backends behind one interface (base.Backend): `cupy` for real GPUs, `emulated` for NumPy.

`create(kind)` picks one; "auto" takes cupy when a CUDA device is usable, else emulated.
Only this package imports cupy, and only inside cupy_backend.
"""

from __future__ import annotations

from gpuremote.daemon.backends.base import Backend, DeviceProps


def cupy_available() -> bool:
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def create(kind: str = "auto", devices: list[int] | None = None, emulate: int = 1,
           emulate_memory: int | None = None) -> Backend:
    if kind == "auto":
        kind = "cupy" if cupy_available() else "emulated"
    if kind == "cupy":
        from gpuremote.daemon.backends.cupy_backend import CupyBackend
        return CupyBackend(devices)
    if kind == "emulated":
        from gpuremote.daemon.backends.emulated import EmulatedBackend
        return EmulatedBackend(emulate, emulate_memory)
    raise ValueError(f"unknown backend {kind!r}: use auto, cupy or emulated")


__all__ = ["Backend", "DeviceProps", "create", "cupy_available"]
