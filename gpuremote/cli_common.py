"""What the long-running commands (daemon, pool, local) share."""

from __future__ import annotations

import math
import signal
import time

import click


MAX_LEASE_TTL_S = 7 * 86400.0     # a lease renewed less than weekly is not one; and its times stay in range


def lease_ttl_seconds(ctx, param, value):
    """Click callback for --lease-ttl: a finite number of seconds, more than 0 and at most a week."""
    if not (math.isfinite(value) and 0 < value <= MAX_LEASE_TTL_S):
        raise click.BadParameter(f"{value} is not a number of seconds from more than 0 to {MAX_LEASE_TTL_S:g} "
                                 "(a week), e.g. 30")
    return value


def seconds_not_nan(ctx, param, value):
    """Click callback for a FloatRange of seconds: NaN passes every range comparison, so refuse it here."""
    if value is not None and value != value:
        raise click.BadParameter("nan is not a number of seconds: give a number, e.g. 30")
    return value


class SignalFlag:
    """Set once SIGINT or SIGTERM has come `level` times; is_set() and wait(timeout) as an Event's.

    The handler only counts: it runs in the main thread between two bytecodes, where the main thread
    may hold any lock, an Event's own included (setting an Event from it deadlocked a daemon that
    got two signals while it was waiting), so waiting polls the count instead of sleeping on a lock."""

    _POLL_S = 0.05

    def __init__(self, signals: list, level: int):
        self._signals, self._level = signals, level

    def is_set(self) -> bool:
        return len(self._signals) >= self._level

    def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.is_set():
            left = self._POLL_S if deadline is None else min(self._POLL_S, deadline - time.monotonic())
            if left <= 0:
                break
            time.sleep(left)
        return self.is_set()


def stop_on_signals() -> SignalFlag:
    """A flag set by SIGINT or SIGTERM, so a foreground service can shut down cleanly; its `again`
    flag is set by a second signal (stop now, skip what a graceful shutdown waits for)."""
    received: list = []
    stop = SignalFlag(received, 1)
    stop.again = SignalFlag(received, 2)

    def handler(signum, _frame):
        received.append(signum)         # list.append: atomic, takes no lock a handler could wait on

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, handler)
    return stop
