"""What the long-running commands (daemon, pool, local) share."""

from __future__ import annotations

import signal
import threading

import click


def seconds_not_nan(ctx, param, value):
    """Click callback for a FloatRange of seconds: NaN passes every range comparison, so refuse it here."""
    if value is not None and value != value:
        raise click.BadParameter("nan is not a number of seconds: give a number, e.g. 30")
    return value


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
