"""A server subprocess the benchmarks start (gpuremote.launcher.ListeningProcess): it prints
`listening on ...` once it serves; its output is drained, the last lines kept for errors."""

from __future__ import annotations

import os

from gpuremote.launcher import ListeningProcess


class Child(ListeningProcess):
    """`address`: the first word after `listening on`; `line`: that whole line."""

    def __init__(self, name: str, cmd: list[str], timeout: float = 30.0):
        env = dict(os.environ)
        env.pop("GPUREMOTE_STRICT_META", None)  # a test-only check that costs the daemon time per op
        super().__init__(name, cmd, timeout, env)
