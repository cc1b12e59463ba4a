"""Channels to a pool, for its daemons (PoolAgent), lease holders (`run --pool`) and `smi`.

`channel_options()` caps gRPC's reconnect backoff, so a daemon or a lease holder is back within
about a second of a restarted pool; `connect(channel, timeout)` reports a refused connection at
once instead of at the deadline. No imports of the client or daemon layers: both use this.
"""

from __future__ import annotations

import threading

import grpc

from gpuremote._config import DEFAULTS


def channel_options() -> list:
    """gRPC options for channels to a pool: after the pool went away, gRPC's reconnect backoff (up
    to 120 s by default) would keep a daemon or a lease holder away from a restarted pool for
    longer than a lease lives; cap it at pool_retry_s so they are back within about a second."""
    from gpuremote.transport.grpc_channel import options
    retry_ms = max(100, int(DEFAULTS.pool_retry_s * 1000))
    return options() + [("grpc.initial_reconnect_backoff_ms", min(200, retry_ms)),
                        ("grpc.min_reconnect_backoff_ms", min(200, retry_ms)),
                        ("grpc.max_reconnect_backoff_ms", retry_ms)]


def connect(channel, timeout: float) -> str | None:
    """Wait until `channel` is connected: None, or why not ("connection failed", "no answer within N s").

    A refused connection (nothing listens there) is reported at once, not after `timeout`:
    gRPC itself would keep retrying quietly until the deadline."""
    done = threading.Event()
    outcome: list[str | None] = []

    def watch(state):
        if state == grpc.ChannelConnectivity.READY:
            outcome.append(None)
            done.set()
        elif state == grpc.ChannelConnectivity.TRANSIENT_FAILURE:
            outcome.append("connection failed")
            done.set()
    channel.subscribe(watch, try_to_connect=True)
    try:
        if not done.wait(timeout):
            return f"no answer within {timeout:g} s"
        return outcome[0]
    finally:
        channel.unsubscribe(watch)
