"""Which daemons this process uses and which device and stream are current.

Devices are numbered for the application 0..N-1 across every connected session, so that
`cupy.cuda.Device(i)` reaches the i-th device wherever it lives. The current device and the
current stream are per thread, as in CuPy.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from dataclasses import dataclass

from gpuremote.client.session import Session


@dataclass(frozen=True)
class DeviceRef:
    session: Session
    remote_index: int


_lock = threading.Lock()
_sessions: list[Session] = []
_devices: list[DeviceRef] = []
_local = threading.local()


def connect(address: str, **kwargs) -> Session:
    """Open a session with the daemon at `address`; its devices join this process's device list."""
    session = Session(address, **kwargs)
    with _lock:
        _sessions.append(session)
        _devices.extend(DeviceRef(session, d.index) for d in session.devices)
    return session


def disconnect() -> None:
    with _lock:
        sessions = list(_sessions)
        _sessions.clear()
        _devices.clear()
    for s in sessions:
        s.close()


def devices() -> list[DeviceRef]:
    """The process's devices, connecting to GPUREMOTE_DAEMON (comma-separated list) at first use."""
    if not _devices:
        addresses = os.environ.get("GPUREMOTE_DAEMON", "")
        if not addresses:
            raise RuntimeError("gpuremote has no daemon to talk to: start one with `gpuremote daemon`, then set "
                               "GPUREMOTE_DAEMON=host:port or call gpuremote.connect('host:port')")
        for address in filter(None, (a.strip() for a in addresses.split(","))):
            connect(address)
    return _devices


def device(index: int) -> DeviceRef:
    devs = devices()
    if not 0 <= index < len(devs):
        raise ValueError(f"device {index} does not exist: this process has {len(devs)} device(s) (0..{len(devs) - 1})")
    return devs[index]


def current_device_index() -> int:
    return getattr(_local, "device", 0)


def set_current_device(index: int) -> None:
    device(index)
    _local.device = index


def current_stream_id(index: int) -> int:
    streams = getattr(_local, "streams", None)
    return streams.get(index, 0) if streams else 0


def set_current_stream(index: int, stream_id: int) -> None:
    if not hasattr(_local, "streams"):
        _local.streams = {}
    _local.streams[index] = stream_id


def index_of(ref: DeviceRef) -> int:
    for i, d in enumerate(_devices):
        if d == ref:
            return i
    raise ValueError("the device is no longer connected")


@atexit.register
def _close_at_exit() -> None:
    try:
        disconnect()
    except Exception as exc:  # never turn a clean exit into a traceback
        print(f"gpuremote: closing sessions at exit failed: {exc}", file=sys.stderr)
