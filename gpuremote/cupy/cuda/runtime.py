"""cupy.cuda.runtime for gpuremote devices: the calls programs use to inspect devices, and
memcpy/memset over the addresses `ndarray.data` gives (cupy/cuda/memory.py)."""

from __future__ import annotations

import ctypes
import operator

from gpuremote.client import context
from gpuremote.cupy._core import service_call, sync_device
from gpuremote.cupy.cuda._stream import on_stream
from gpuremote import errors as _errors

CUDARuntimeError = _errors.CUDARuntimeError   # cupy.cuda.runtime.CUDARuntimeError


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


# cudaMemcpyKind
memcpyHostToHost, memcpyHostToDevice, memcpyDeviceToHost, memcpyDeviceToDevice, memcpyDefault = range(5)
_KINDS = ("memcpyHostToHost", "memcpyHostToDevice", "memcpyDeviceToHost", "memcpyDeviceToDevice")


def memcpy(dst, src, size: int, kind: int) -> None:
    """Copy `size` bytes from address `src` to `dst` (cudaMemcpy): device addresses are those of
    `ndarray.data` (MemoryPointer.ptr), host addresses this process's own (arr.ctypes.data);
    memcpyDefault tells them apart by their range. Returns once the bytes are in `dst` (D2H) or
    have left host memory (H2D: the device runs the copy in op order, as for any queued op)."""
    from gpuremote.cupy.cuda import memory
    dst, src = int(getattr(dst, "value", dst)), int(getattr(src, "value", src))
    size = operator.index(size)
    if size < 0:
        raise ValueError(f"memcpy size must not be negative, got {size}")
    if kind not in (memcpyHostToHost, memcpyHostToDevice, memcpyDeviceToHost, memcpyDeviceToDevice, memcpyDefault):
        raise ValueError(f"invalid memcpy kind {kind!r}: use cupy.cuda.runtime.memcpyHostToDevice, "
                         "memcpyDeviceToHost, memcpyDeviceToDevice, memcpyHostToHost or memcpyDefault")
    actual = 2 * memory.is_device(src) + memory.is_device(dst)      # 0 H2H, 1 H2D, 2 D2H, 3 D2D
    if kind != memcpyDefault and kind != actual:
        raise ValueError(f"memcpy kind {_KINDS[kind]} does not match the addresses: {src:#x} -> {dst:#x} is "
                         f"{_KINDS[actual]} (device addresses come from ndarray.data)")
    if size == 0:
        return
    if actual == memcpyHostToHost:
        ctypes.memmove(memory.host_address(dst), memory.host_address(src), size)
    elif actual == memcpyHostToDevice:
        flat, off = memory.device_span(dst, size)
        flat[off:off + size] = memory.host_bytes(src, size)
    elif actual == memcpyDeviceToHost:
        flat, off = memory.device_span(src, size)
        out = memory.host_bytes(dst, size)
        flat[off:off + size].get(out=out)
    else:
        dflat, doff = memory.device_span(dst, size)
        sflat, soff = memory.device_span(src, size)
        part = sflat[soff:soff + size]
        dflat[doff:doff + size] = part if part._gr_session is dflat._gr_session else part.get()


def memcpyAsync(dst, src, size: int, kind: int, stream=0) -> None:
    """cudaMemcpyAsync on `stream` (a Stream or its ptr; 0: the null stream): as memcpy, its host
    side done when it returns, its device side ordered with the stream's ops."""
    with on_stream(stream):
        memcpy(dst, src, size, kind)


def memset(ptr, value: int, size: int) -> None:
    """Set `size` device bytes at `ptr` to `value` (its low byte, as cudaMemset)."""
    from gpuremote.cupy.cuda import memory
    ptr, size = int(getattr(ptr, "value", ptr)), operator.index(size)
    if size < 0:
        raise ValueError(f"memset size must not be negative, got {size}")
    if not memory.is_device(ptr):
        raise ValueError(f"{ptr:#x} is not a device address (device addresses come from ndarray.data)")
    if size:
        flat, off = memory.device_span(ptr, size)
        flat[off:off + size] = operator.index(value) & 0xFF


def memsetAsync(ptr, value: int, size: int, stream=0) -> None:
    with on_stream(stream):
        memset(ptr, value, size)
