"""Byte paths between client and daemon, one small module per transport, chosen at run time.

- grpc_channel.py: the gRPC stream. Always there: it opens and closes every session, carries
  everything for TLS deployments and is the fallback when nothing faster can be reached.
- sockets.py: framed TCP or Unix socket (frames.py), bulk bytes as raw frames.
- shm.py: the Unix socket plus shared-memory rings and segments (same host).
- verbs.py: a TCP socket for ops plus RDMA writes for bulk bytes (pyverbs and a device).

`attach` is called by the client session right after the gRPC OpenSession: it tries the
transports the daemon advertised (SessionOpened.data_plane), best first, and returns the first
link that attaches, or None (stay on gRPC). GPUREMOTE_TRANSPORT (or the `transport` argument)
asks for one; if that one cannot be had, the session warns and takes what `auto` would.
"""

from __future__ import annotations

import logging
import warnings

from gpuremote._config import DEFAULTS
from gpuremote.transport.base import NAMES, Link, TransportError, Unavailable, host_id

log = logging.getLogger("gpuremote.transport")

__all__ = ["attach", "plan", "Link", "NAMES", "host_id"]


def _check(preference: str) -> str:
    preference = (preference or "auto").strip().lower()
    if preference != "auto" and preference not in NAMES:
        raise ValueError(f"unknown transport {preference!r} (GPUREMOTE_TRANSPORT): use auto or one of "
                         f"{', '.join(NAMES)}")
    return preference


def plan(preference: str, data_plane) -> list[str]:
    """The transports to try, in order, for `preference` and what the daemon advertised."""
    preference = _check(preference)
    if preference == "grpc" or not data_plane.attach_token:
        return []
    same_host = bool(data_plane.unix_path) and data_plane.host_id == host_id() != ""
    offered = set(data_plane.transports)
    auto = []
    if "verbs" in offered and not same_host:
        auto.append("verbs")
    if same_host:
        if "shm" in offered:
            auto.append("shm")
        auto.append("unix")
    if data_plane.tcp_port:
        auto.append("tcp")
    if preference == "auto":
        return auto
    if preference == "socket":
        first = ["unix", "tcp"] if same_host else ["tcp"]
    else:
        first = [preference]
    return first + [t for t in auto if t not in first]


def attach(address: str, session_id: str, data_plane, preference: str | None = None) -> Link | None:
    """Attach a faster op channel to the session, or None to stay on the gRPC stream."""
    preference = _check(preference or DEFAULTS.transport)
    failures = []
    for name in plan(preference, data_plane):
        try:
            link = _open(name, address, session_id, data_plane)
        except (OSError, EOFError, Unavailable, TransportError, ImportError) as exc:
            failures.append(f"{name}: {exc}")
            log.debug("transport %s to %s unavailable: %s", name, address, exc)
            continue
        if failures and preference != "auto" and not _is(name, preference):
            warnings.warn(f"gpuremote: transport {preference!r} to {address} is unavailable ({'; '.join(failures)}); "
                          f"using {link.name}", RuntimeWarning, stacklevel=4)
        return link
    if preference not in ("auto", "grpc"):
        why = "; ".join(failures) or "the daemon offers no data plane"
        warnings.warn(f"gpuremote: transport {preference!r} to {address} is unavailable ({why}); using grpc",
                      RuntimeWarning, stacklevel=4)
    return None


def _is(name: str, preference: str) -> bool:
    return name == preference or (preference == "socket" and name in ("unix", "tcp"))


def _open(name: str, address: str, session_id: str, data_plane) -> Link:
    from gpuremote.wire import pb
    request = pb.Attach(session_id=session_id, attach_token=data_plane.attach_token)
    if name == "shm":
        from gpuremote.transport import shm
        return shm.open_link(address, data_plane, request)
    if name == "verbs":
        from gpuremote.transport import verbs
        return verbs.open_link(address, data_plane, request)
    from gpuremote.transport import sockets
    from gpuremote.transport.frames import FrameSocket
    via = "unix" if name == "unix" else "tcp"
    sock = sockets.connect(via, address, data_plane.unix_path, data_plane.tcp_port, DEFAULTS.attach_timeout_s)
    fs = FrameSocket(sock, DEFAULTS.socket_read_bytes)
    try:
        request.transport = "socket"
        attached = sockets.handshake(fs, request)
        sock.settimeout(None)
    except BaseException:
        fs.close()
        raise
    return sockets.SocketLink(fs, attached, via)
