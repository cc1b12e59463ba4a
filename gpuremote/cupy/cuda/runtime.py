"""cupy.cuda.runtime for gpuremote devices (the calls programs use to inspect devices)."""

from __future__ import annotations

from gpuremote.client import context
from gpuremote.cupy._core import service_call, sync_device


def getDeviceCount() -> int:
    """The number of devices this process has, over every connected daemon."""
    return len(context.devices())


def getDevice() -> int:
    return context.current_device_index()


def setDevice(device: int) -> None:
    context.set_current_device(int(device))


def getDeviceProperties(device: int) -> dict:
    """A dict with CUDA's property names: name (bytes), totalGlobalMem, major, minor, multiProcessorCount."""
    ref = context.device(int(device))
    props = ref.session.call_value("cuda.runtime.getDeviceProperties", (ref.remote_index,), {},
                                   ref.remote_index, 0, "")
    if isinstance(props.get("name"), str):
        props["name"] = props["name"].encode()
    return props


def memGetInfo() -> tuple[int, int]:
    """(free, total) bytes of the current device."""
    return tuple(service_call("cuda.runtime.memGetInfo", (), value=True))


def deviceSynchronize() -> None:
    sync_device(context.current_device_index(), None)
