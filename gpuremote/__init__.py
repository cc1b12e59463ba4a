"""gpuremote: remote and fractional GPUs for CuPy programs.

`import gpuremote.cupy as cp` is a drop-in for `import cupy`; its arrays live on a device owned
by a `gpuremote daemon`. `gpuremote.connect("host:port")` picks the daemon explicitly;
otherwise GPUREMOTE_DAEMON=host:port is read at first use.
"""

import os as _os

# gRPC keeps working in a child forked by multiprocessing only with fork support on, and it
# must be on before grpc is first imported.
_os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "1")

__version__ = "0.1.0"


def connect(address: str, **kwargs):
    """Connect to the daemon at `address` ("host:port") and make its devices current; returns the session."""
    from gpuremote.client import context
    return context.connect(address, **kwargs)


def disconnect() -> None:
    """Close every session of this process (its remote arrays are freed)."""
    from gpuremote.client import context
    context.disconnect()


def stats() -> dict:
    """Client statistics: ops, replayed, messages, round_trips, bytes_h2d, bytes_d2h, blocked_s, and
    peak_memory (filled in at exit when statistics are written: GPUREMOTE_STATS_JSON)."""
    from gpuremote.client.stats import STATS
    return STATS.as_dict()
