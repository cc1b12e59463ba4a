"""Client statistics, read with gpuremote.stats(); written as JSON at exit when
GPUREMOTE_STATS_JSON=FILE is set (and into GPUREMOTE_STATS_DIR, one file per process, which
`gpuremote run` uses to sum the statistics of every Python process of a command)."""

from __future__ import annotations

import atexit
import json
import os
import sys


class Stats:
    __slots__ = ("ops", "replayed", "messages", "round_trips", "bytes_h2d", "bytes_d2h", "blocked_s", "peak_memory")

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.ops = 0            # ops issued (calls, uploads, fetches, syncs)
        self.replayed = 0       # of those, calls sent as replays of a call template (a few integers)
        self.messages = 0       # stream messages sent to daemons
        self.round_trips = 0    # times the application blocked waiting for a daemon
        self.bytes_h2d = 0
        self.bytes_d2h = 0
        self.blocked_s = 0.0    # wall time spent blocked on those round trips
        # The most bytes this process's arrays held at once on one device, asked of the daemons as
        # the process exits when statistics are written (client/context.py); 0 until then.
        self.peak_memory = 0

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.__slots__}


STATS = Stats()


def will_write() -> bool:
    """Whether statistics are written at exit (GPUREMOTE_STATS_JSON or GPUREMOTE_STATS_DIR is set)."""
    return bool(os.environ.get("GPUREMOTE_STATS_JSON") or os.environ.get("GPUREMOTE_STATS_DIR"))


def _write_at_exit() -> None:
    paths = [os.environ.get("GPUREMOTE_STATS_JSON")]
    if os.environ.get("GPUREMOTE_STATS_DIR"):
        paths.append(os.path.join(os.environ["GPUREMOTE_STATS_DIR"], f"stats-{os.getpid()}.json"))
    if STATS.ops == 0 and os.environ.get("GPUREMOTE_STATS_DIR") and not os.environ.get("GPUREMOTE_STATS_JSON"):
        return
    for path in filter(None, paths):
        try:
            with open(path, "w") as f:
                json.dump(STATS.as_dict(), f, indent=2)
        except OSError as exc:
            print(f"gpuremote: cannot write statistics to {path}: {exc}", file=sys.stderr)


atexit.register(_write_at_exit)
