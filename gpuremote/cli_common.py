"""What the long-running commands (daemon, pool, local) share."""

from __future__ import annotations

import signal
import threading


def stop_on_signals() -> threading.Event:
    """An event set by SIGINT or SIGTERM, so a foreground service can shut down cleanly."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop
