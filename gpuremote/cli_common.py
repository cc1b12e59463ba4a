"""What the long-running commands (daemon, pool, local) share."""

from __future__ import annotations

import signal
import threading


def stop_on_signals() -> threading.Event:
    """An event set by SIGINT or SIGTERM, so a foreground service can shut down cleanly; its
    `again` event is set by a second signal (stop now, skip what a graceful shutdown waits for)."""
    stop = threading.Event()
    stop.again = threading.Event()

    def handler(*_):
        (stop.again if stop.is_set() else stop).set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, handler)
    return stop
