"""Fixtures: real daemon processes on loopback ports picked at run time, and a connected client.

The daemon runs with GPUREMOTE_STRICT_META=1, so every op whose metadata the client derived is
checked against what the op really produced: a wrong rule fails the test that used it.
Set GPUREMOTE_TEST_BACKEND=cupy on a GPU machine to run everything against real GPUs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

BACKEND = os.environ.get("GPUREMOTE_TEST_BACKEND", "emulated")


class DaemonProcess:
    """A `gpuremote daemon` subprocess; `address` is where it listens (unauthenticated unless
    `security` gives other flags, e.g. ("--token-file", path))."""

    def __init__(self, *args: str, env: dict | None = None, security: tuple[str, ...] = ("--insecure",)):
        cmd = [sys.executable, "-m", "gpuremote.cli", "daemon", "--listen", "127.0.0.1:0", *security, *args]
        full_env = dict(os.environ, GPUREMOTE_STRICT_META="1", PYTHONUNBUFFERED="1", **(env or {}))
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=full_env)
        deadline = time.monotonic() + 30
        line = ""
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            m = re.search(r"listening on (\S+)", line)
            if m:
                self.address = m.group(1)
                self.banner = line      # the start-up line: backend, devices, replay loop, security
                return
            if not line and self.proc.poll() is not None:
                break
        self.stop()
        raise RuntimeError(f"daemon did not start: {line!r}")

    def info(self):
        import grpc

        from gpuremote.v1 import daemon_pb2_grpc
        from gpuremote.wire import pb
        with grpc.insecure_channel(self.address) as channel:
            return daemon_pb2_grpc.DaemonStub(channel).Info(pb.InfoRequest(), timeout=10)

    def stop(self) -> None:
        from gpuremote.launcher import stop_process
        stop_process(self.proc)
        if self.proc.stdout:
            self.proc.stdout.close()


def backend_args(devices: int = 2, memory: str = "2GiB") -> list[str]:
    if BACKEND == "cupy":
        return ["--backend", "cupy"]
    return ["--backend", "emulated", "--emulate", str(devices), "--emulate-memory", memory]


@pytest.fixture(scope="session")
def daemon():
    d = DaemonProcess(*backend_args())
    yield d
    d.stop()


@pytest.fixture(scope="module")
def cp(daemon):
    """gpuremote.cupy connected to the session's daemon. Each test module gets its own client session
    and closes it at its end, so the shared daemon holds nothing between modules (test_run checks
    that the daemon is left clean after each of its runs)."""
    import gpuremote
    import gpuremote.cupy
    gpuremote.disconnect()
    gpuremote.connect(daemon.address)
    yield gpuremote.cupy
    gpuremote.disconnect()


@pytest.fixture
def fresh_daemon():
    """A daemon of its own for tests that change or break daemon state."""
    d = DaemonProcess(*backend_args(devices=1, memory="256MiB"))
    yield d
    d.stop()


def pytest_collection_modifyitems(config, items):
    if BACKEND == "cupy":
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: set GPUREMOTE_TEST_BACKEND=cupy on a GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
