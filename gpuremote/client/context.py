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
from gpuremote.client.stats import STATS, will_write
from gpuremote.errors import INVALID_DEVICE, CUDARuntimeError


@dataclass(frozen=True)
class DeviceRef:
    session: Session
    remote_index: int


_lock = threading.Lock()
_sessions: list[Session] = []
_devices: list[DeviceRef] = []
_addresses: list[str] = []      # what connect() was given, so a forked child can reconnect
_local = threading.local()


def _after_fork_in_child() -> None:
    """A forked child cannot use its parent's gRPC streams: forget them (without closing what
    the parent still uses) and reconnect to the same daemons at first use."""
    global _lock, _local
    _lock = threading.Lock()
    _local = threading.local()
    for s in _sessions:
        s.forked()
    _sessions.clear()
    _devices.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def connect(address: str, indices: list[int] | None = None, **kwargs) -> Session:
    """Open a session with the daemon at `address`; its devices (all, or `indices` in that
    order) join this process's device list."""
    session = Session(address, **kwargs)
    offered = [d.index for d in session.devices]
    chosen = offered if indices is None else list(indices)
    missing = [i for i in chosen if i not in offered]
    if missing:
        session.close()
        if session.grants:    # a pool daemon offers only the devices the grants name
            from gpuremote.errors import GrantError
            raise GrantError(f"device {missing[0]} of the daemon at {address} is not granted to this process: its "
                             f"grants cover device(s) {offered} there. Use the devices `gpuremote run --pool` "
                             "gave the program (GPUREMOTE_DEVICES), or allocate a lease for this device")
        raise ValueError(f"the daemon at {address} has no device {missing[0]} (it has {offered})")
    with _lock:
        if address not in _addresses:
            _addresses.append(address)
        _sessions.append(session)
        _devices.extend(DeviceRef(session, i) for i in chosen)
    return session


def _parse_devices(spec: str) -> list[tuple[str, list[int]]]:
    """'h:p/0,h:p/1,g:q/0' -> [('h:p', [0, 1]), ('g:q', [0])], keeping first-seen order."""
    grouped: dict[str, list[int]] = {}
    for entry in filter(None, (e.strip() for e in spec.split(","))):
        address, sep, index = entry.rpartition("/")
        if not sep or not index.isdigit() or ":" not in address:
            raise ValueError(f"GPUREMOTE_DEVICES entry {entry!r} is not host:port/index")
        grouped.setdefault(address, []).append(int(index))
    return list(grouped.items())


def disconnect() -> None:
    with _lock:
        sessions = list(_sessions)
        _sessions.clear()
        _devices.clear()
        _addresses.clear()
    for s in sessions:
        s.close()


def devices() -> list[DeviceRef]:
    """The process's devices, connecting at first use to GPUREMOTE_DEVICES (host:port/index list,
    set by `gpuremote run`) or else to every device of GPUREMOTE_DAEMON (host:port list)."""
    if not _devices and not _addresses and os.environ.get("GPUREMOTE_DEVICES"):
        from gpuremote.client import grants   # pool grants, when `gpuremote run --pool` set them
        granted = grants.from_environ()
        for address, indices in _parse_devices(os.environ["GPUREMOTE_DEVICES"]):
            connect(address, indices, grants=granted.get(address, ()))
    if not _devices:
        addresses = ",".join(_addresses) or os.environ.get("GPUREMOTE_DAEMON", "")
        if not addresses:
            raise RuntimeError("gpuremote has no daemon to talk to: start one with `gpuremote daemon`, then set "
                               "GPUREMOTE_DAEMON=host:port or call gpuremote.connect('host:port')")
        from gpuremote.client import grants   # a forked child of a --pool run presents the current grants
        granted = grants.from_environ()
        for address in filter(None, (a.strip() for a in addresses.split(","))):
            connect(address, grants=granted.get(address, ()))
    return _devices


def device(index: int) -> DeviceRef:
    devs = devices()
    if not 0 <= index < len(devs):
        raise CUDARuntimeError(INVALID_DEVICE, f"cudaErrorInvalidDevice: invalid device ordinal: device {index} does "
                               f"not exist; this process has {len(devs)} device(s) (0..{len(devs) - 1})")
    return devs[index]


def current_device_index() -> int:
    return getattr(_local, "device", 0)


def set_current_device(index: int) -> None:
    device(index)
    _local.device = index


# Whether any thread ever chose a stream: until then every op is on the null stream, and the
# hot path skips the thread-local lookup.
_streams_used = False


def current_stream_id(index: int) -> int:
    if not _streams_used:
        return 0
    streams = getattr(_local, "streams", None)
    return streams.get(index, 0) if streams else 0


def set_current_stream(index: int, stream_id: int) -> None:
    global _streams_used
    _streams_used = True
    if not hasattr(_local, "streams"):
        _local.streams = {}
    _local.streams[index] = stream_id


def index_of(ref: DeviceRef) -> int:
    for i, d in enumerate(_devices):
        if d == ref:
            return i
    raise ValueError("the device is no longer connected")


def _record_peak_memory() -> None:
    """STATS.peak_memory, for the statistics written at exit: each device's high-water mark of this
    process's arrays, asked of its daemon (a round trip per device, not counted in the statistics)."""
    counted = STATS.as_dict()
    peak = 0
    for ref in list(_devices):
        for _ in range(2):  # the first reply may raise the program's own unreported failures instead
            s = ref.session
            if s.closed or s.lost is not None:
                break
            try:
                peak = max(peak, int(s.call_value("session.memory_peak", (), {}, ref.remote_index, 0, "")))
                break
            except Exception:
                continue
    for name, value in counted.items():
        setattr(STATS, name, value)
    STATS.peak_memory = max(STATS.peak_memory, peak)


@atexit.register
def _close_at_exit() -> None:
    try:
        if STATS.ops and will_write():
            _record_peak_memory()
        disconnect()
    except Exception as exc:  # never turn a clean exit into a traceback
        print(f"gpuremote: closing sessions at exit failed: {exc}", file=sys.stderr)
