"""cupy.cuda.Device over the process's gpuremote devices."""

from __future__ import annotations

from gpuremote.client import context
from gpuremote.cupy._core import service_call, sync_device


class Device:
    def __init__(self, device=None):
        if device is None:
            device = context.current_device_index()
        if isinstance(device, Device):
            device = device.id
        self.id = int(device)
        context.device(self.id)  # clear error for an index that does not exist
        self._previous: list[int] = []

    def use(self) -> None:
        context.set_current_device(self.id)

    def __enter__(self) -> "Device":
        self._previous.append(context.current_device_index())
        context.set_current_device(self.id)
        return self

    def __exit__(self, *exc) -> None:
        context.set_current_device(self._previous.pop())

    def synchronize(self) -> None:
        """Wait until every op issued to this device has run."""
        sync_device(self.id, None)

    @property
    def compute_capability(self) -> str:
        ref = context.device(self.id)
        return ref.session.devices[ref.remote_index].compute_capability

    @property
    def mem_info(self) -> tuple[int, int]:
        """(free, total) bytes."""
        return tuple(service_call("cuda.runtime.memGetInfo", (), self.id, value=True))

    def __int__(self) -> int:
        return self.id

    def __eq__(self, other) -> bool:
        return isinstance(other, Device) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def __repr__(self) -> str:
        return f"<CUDA Device {self.id}>"


def get_device_id() -> int:
    return context.current_device_index()
