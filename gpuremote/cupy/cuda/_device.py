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

    @property
    def attributes(self) -> dict:
        """{attribute: value} with CUDA's device attribute names (cudaDevAttr... without the prefix,
        as CuPy's keys), for the properties the daemon reports (runtime.getDeviceProperties): fewer
        than CuPy's full set, so read optional ones with .get()."""
        from gpuremote.cupy.cuda.runtime import getDeviceProperties
        attributes = {}
        for prop, value in getDeviceProperties(self.id).items():
            name = _ATTRIBUTE_OF.get(prop)
            if isinstance(name, tuple):         # a property holding (x, y, z): one attribute each
                attributes.update(zip(name, value))
            elif name is not None:
                attributes[name] = value
        return attributes

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


# cudaDeviceProp field -> its cudaDeviceAttr name (prefix cudaDevAttr dropped), for the fields that
# have one; properties the daemon reports beyond these have no attribute name and are left out.
_ATTRIBUTE_OF = {
    "major": "ComputeCapabilityMajor", "minor": "ComputeCapabilityMinor",
    "multiProcessorCount": "MultiProcessorCount", "maxThreadsPerBlock": "MaxThreadsPerBlock",
    "maxThreadsDim": ("MaxBlockDimX", "MaxBlockDimY", "MaxBlockDimZ"),
    "maxGridSize": ("MaxGridDimX", "MaxGridDimY", "MaxGridDimZ"),
    "sharedMemPerBlock": "MaxSharedMemoryPerBlock", "totalConstMem": "TotalConstantMemory",
    "warpSize": "WarpSize", "regsPerBlock": "MaxRegistersPerBlock", "clockRate": "ClockRate",
    "memoryClockRate": "MemoryClockRate", "memoryBusWidth": "GlobalMemoryBusWidth", "l2CacheSize": "L2CacheSize",
    "maxThreadsPerMultiProcessor": "MaxThreadsPerMultiProcessor", "integrated": "Integrated",
    "concurrentKernels": "ConcurrentKernels", "ECCEnabled": "EccEnabled", "pciBusID": "PciBusId",
    "pciDeviceID": "PciDeviceId", "asyncEngineCount": "AsyncEngineCount", "unifiedAddressing": "UnifiedAddressing",
    "managedMemory": "ManagedMemory",
}
