"""gRPC channel and server options shared by both ends, and the mapping of gRPC failures.

Keepalive pings make a vanished peer visible within keepalive_ms + keepalive_timeout_ms even
when no op is in flight; message limits match the daemon's so neither side sends what the
other would refuse.
"""

from __future__ import annotations

import grpc

from gpuremote._config import DEFAULTS
from gpuremote.errors import AuthenticationError, DeviceLostError, LimitExceededError, ProtocolError
from gpuremote.transport import auth


def options(max_message: int = DEFAULTS.max_message_bytes) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", max_message),
        ("grpc.max_send_message_length", max_message),
        ("grpc.keepalive_time_ms", DEFAULTS.keepalive_ms),
        ("grpc.keepalive_timeout_ms", DEFAULTS.keepalive_timeout_ms),
        # Any unanswered ping (gRPC's own BDP probes too, whose default timeout is 60 s and which the
        # keepalive ping then waits behind) ends the connection after keepalive_timeout_ms: a peer that
        # froze or a cut network is noticed within keepalive_ms + keepalive_timeout_ms (tests/test_faults.py).
        ("grpc.http2.ping_timeout_ms", DEFAULTS.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", 1000),
        ("grpc.http2.max_pings_without_data", 0),
    ]


def open_channel(address: str, timeout: float = DEFAULTS.connect_timeout_s) -> grpc.Channel:
    """A connected channel to `address`, or DeviceLostError naming the address within `timeout` s.

    Token and TLS come from the environment (GPUREMOTE_TOKEN_FILE, GPUREMOTE_TLS_*: transport/auth.py)."""
    security = auth.ClientSecurity.from_env()
    channel = auth.channel(address, security, options())
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout)
    except grpc.FutureTimeoutError:
        channel.close()
        raise DeviceLostError(f"cannot reach a gpuremote daemon at {address} within {timeout:g} s: check that "
                              "`gpuremote daemon` runs there and that the address and port are right"
                              + ("; with TLS, that it serves TLS with a certificate GPUREMOTE_TLS_CA trusts (and "
                                 "accepts this client's GPUREMOTE_TLS_CERT)" if security.tls else
                                 "; if it serves TLS, set GPUREMOTE_TLS_CA")) from None
    return channel


def translate(exc: grpc.RpcError, address: str) -> Exception:
    """The gpuremote error a failed stream stands for."""
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return AuthenticationError(f"the server at {address} refused this client: {details}")
    if code == grpc.StatusCode.PERMISSION_DENIED:     # a pool grant refused (gpuremote/daemon/admission.py)
        from gpuremote.errors import GrantError
        return GrantError(f"the daemon at {address} refused the session: {details}")
    if code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT):
        return ProtocolError(f"the daemon at {address} refused the session: {details}")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        if "larger than max" in (details or ""):
            return LimitExceededError(
                f"a message between this process and the daemon at {address} exceeded the message size limit "
                f"({details}); the session is closed and its arrays are gone. Send large data with "
                "cupy.asarray (it is chunked) rather than inside a call's arguments, or raise "
                "GPUREMOTE_MAX_MESSAGE_BYTES on both sides")
        return LimitExceededError(f"the daemon at {address} refused: {details}")
    return DeviceLostError(f"lost the connection to the gpuremote daemon at {address} ({details}); the devices "
                           "it serves and the arrays on them are gone")
