"""A server subprocess the benchmarks start: it prints `listening on ...` once it serves; its
later output is drained (kept: the last lines, for the error when it fails to start)."""

from __future__ import annotations

import os
import re
import subprocess
import threading


class Child:
    """`address`: the first word after `listening on`; `line`: that whole line."""

    def __init__(self, name: str, cmd: list[str], timeout: float = 30.0):
        self.name = name
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env.pop("GPUREMOTE_STRICT_META", None)  # a test-only check that costs the daemon time per op
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.tail: list[str] = []
        self.line = self._wait_listening(timeout)
        self.address = re.search(r"listening on (\S+)", self.line).group(1)
        threading.Thread(target=self._drain, daemon=True).start()

    def _wait_listening(self, timeout: float) -> str:
        found: list[str] = []

        def read():
            for line in self.proc.stdout:
                self.tail = (self.tail + [line.rstrip()])[-20:]
                if "listening on" in line:
                    found.append(line)
                    return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(timeout)
        if not found:
            self.stop()
            raise RuntimeError(f"{self.name} did not start within {timeout:g} s; its output:\n  "
                               + "\n  ".join(self.tail or ["(none)"]))
        return found[0]

    def _drain(self) -> None:
        try:
            for line in self.proc.stdout:
                self.tail = (self.tail + [line.rstrip()])[-20:]
        except (ValueError, OSError):
            pass

    def stop(self) -> None:
        stop(self.proc)


def stop(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """End `proc` (SIGTERM, then SIGKILL after `timeout` s) and reap it."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)
