"""The one small interface every op channel implements, and the facts transports share.

A *link* is the client's end of a session's fast op channel (the daemon's end is an
*endpoint*, served by gpuremote/daemon/dataplane.py). Both carry the same protobuf messages as
the gRPC stream, in order, over one connection; they differ only in how the bulk bytes of an
upload or fetch travel: raw frames on a socket (sockets.py), slots of a shared-memory ring
(shm.py) or RDMA writes into a registered ring (verbs.py). Which link a session uses is
decided at run time (gpuremote/transport/__init__.py: attach).
"""

from __future__ import annotations

import functools
import socket

import numpy

from gpuremote.errors import DeviceLostError, LimitExceededError, ProtocolError
from gpuremote.wire import pb

# Transport names, best first for `auto` (verbs only where a device and pyverbs exist).
NAMES = ("verbs", "shm", "socket", "tcp", "unix", "grpc")


class TransportError(ProtocolError):
    """The data plane's stream is out of step or was refused (the session cannot go on over it)."""


class PeerEnded(TransportError):
    """The daemon ended the session and said why (an ERROR frame): its reason beats any other symptom."""

    def __init__(self, reason: str):
        super().__init__(f"the daemon ended the session: {reason}")
        self.reason = reason


class Unavailable(Exception):
    """A transport cannot be used here (missing module, device, peer on another host, ...)."""


@functools.lru_cache(maxsize=1)
def host_id() -> str:
    """'<kernel boot id>/<host name>': equal on both ends exactly when they share a kernel and name."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{boot}/{socket.gethostname()}" if boot else ""


class Link:
    """Client end of a session's op channel (used under the client session's lock)."""

    name = ""
    # Arrays up to this size travel inside the op message (an Upload's data, a fetch Reply's value).
    inline_bytes = 0

    def send(self, msg: pb.ClientMessage) -> None:
        """Send one message (an op batch)."""
        raise NotImplementedError

    def recv(self) -> pb.ServerMessage:
        """The next message from the daemon (a Reply)."""
        raise NotImplementedError

    def upload_chunks(self, flat: numpy.ndarray) -> int:
        """How many bulk frames sending `flat` (uint8, contiguous) takes: the Upload op's `chunks`."""
        raise NotImplementedError

    def send_upload(self, flat: numpy.ndarray) -> None:
        """Send the bytes of the Upload op just flushed."""
        raise NotImplementedError

    def receive_fetch(self, chunks: int, out: numpy.ndarray) -> None:
        """Receive the `chunks` bulk frames of a fetch Reply into `out` (uint8, exactly its size)."""
        raise NotImplementedError

    def landing(self, into: numpy.ndarray) -> tuple[int, int] | None:
        """(segment, offset) the daemon may write a fetch into `into` at directly (Fetch.land_*),
        or None: only a link that shares memory with the daemon (shm) has any."""
        return None

    def close(self) -> None:
        """End the channel cleanly (the daemon sees an orderly end)."""

    def abandon(self) -> None:
        """Drop the channel without a goodbye (after a failure, or in a forked child)."""
        self.close()


class MessageTooLarge(LimitExceededError):
    """A message larger than the daemon accepts (the link refuses to send it)."""


def lost(exc: BaseException, address: str, name: str) -> Exception:
    """The client-side error a failed link stands for."""
    if isinstance(exc, MessageTooLarge):
        return LimitExceededError(
            f"a message between this process and the daemon at {address} exceeded the message size limit ({exc}); "
            "the session is closed and its arrays are gone. Send large data with cupy.asarray (it is chunked) "
            "rather than inside a call's arguments, or raise GPUREMOTE_MAX_MESSAGE_BYTES on both sides")
    if isinstance(exc, PeerEnded):
        return DeviceLostError(f"the gpuremote daemon at {address} ended the session: {exc.reason}")
    if isinstance(exc, ProtocolError):
        return exc
    return DeviceLostError(f"lost the {name} connection to the gpuremote daemon at {address} ({exc or type(exc).__name__}); "
                           "the devices it serves and the arrays on them are gone")
