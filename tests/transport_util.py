"""Helpers shared by the transport tests: a client connected over a chosen transport, the
dtypes and sizes every transport must move exactly, and waiting for a daemon to be clean."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np

import gpuremote
import gpuremote.cupy
from gpuremote._config import DEFAULTS
from gpuremote.client import context

DTYPES = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
          np.float16, np.float32, np.float64, np.complex64, np.complex128]


def byte_sizes() -> list[int]:
    """0 B, 1 B, odd, page-sized, each transport's thresholds +/- 1 (inline, gRPC chunk, ring slot)."""
    sizes = {0, 1, 4099, 4096}
    for edge in (DEFAULTS.socket_inline_bytes, DEFAULTS.inline_bytes, DEFAULTS.chunk_bytes, DEFAULTS.ring_slot_bytes):
        sizes.update((edge - 1, edge, edge + 1))
    sizes.add(3 * DEFAULTS.ring_slot_bytes + 7)       # wraps around the ring with a partial slot
    return sorted(sizes)


def random_array(nbytes: int, dtype, rng) -> np.ndarray:
    """An array of `dtype` of about `nbytes` (whole elements) with random bit patterns (NaNs included)."""
    dt = np.dtype(dtype)
    n = nbytes // dt.itemsize if nbytes else 0
    if nbytes and n == 0:
        n = 1
    raw = rng.integers(0, 256, n * dt.itemsize, dtype=np.uint8)
    if dt.kind == "b":
        raw &= 1
    return raw.view(dt)


def same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and \
        np.array_equal(np.ascontiguousarray(a).reshape(-1).view(np.uint8),
                       np.ascontiguousarray(b).reshape(-1).view(np.uint8))


@contextlib.contextmanager
def connected(address: str, transport: str | None = None):
    """gpuremote.cupy connected to `address` alone over `transport`; the process's other
    connections are set aside meanwhile and restored afterwards."""
    saved = (list(context._sessions), list(context._devices), list(context._addresses), dict(vars(context._local)))
    with context._lock:
        context._sessions.clear()
        context._devices.clear()
        context._addresses.clear()
    vars(context._local).clear()
    try:
        session = gpuremote.connect(address, transport=transport)
        yield gpuremote.cupy, session
    finally:
        gpuremote.disconnect()
        with context._lock:
            context._sessions[:] = saved[0]
            context._devices[:] = saved[1]
            context._addresses[:] = saved[2]
        vars(context._local).clear()
        vars(context._local).update(saved[3])


def settle(info, baseline: list[int] | None, timeout: float = 15.0):
    """Wait (bounded) until `info()` shows no session and memory_used equals `baseline`."""
    deadline = time.monotonic() + timeout
    while True:
        reply = info()
        used = [d.memory_used for d in reply.devices]
        if not reply.sessions and (baseline is None or used == baseline):
            return reply
        if time.monotonic() > deadline:
            raise AssertionError(f"daemon did not settle: sessions {[(s.session_id, s.transport) for s in reply.sessions]}, "
                                 f"memory_used {used}, expected {baseline}")
        time.sleep(0.05)


def check_exact_bytes(daemon, transport: str, expect: str) -> None:
    """Every dtype at the sizes that matter, shapes, a view and >= 64 MiB: the bytes come back exactly."""
    rng = np.random.default_rng(7)
    small = [0, 1, 4099, 4096, DEFAULTS.socket_inline_bytes - 1, DEFAULTS.socket_inline_bytes + 1]
    with connected(daemon.address, transport) as (cp, session):
        assert session.transport == expect
        if transport in ("tcp", "unix"):
            assert session._link.via == transport
        mine = [s for s in daemon.info().sessions if s.session_id == session.session_id]
        assert mine and mine[0].transport == expect
        if session._link is not None:      # the channel's own round trip, around the session
            assert session._link.ping(b"\x00ping" * 9) == b"\x00ping" * 9
        for dtype in DTYPES:
            for nbytes in (byte_sizes() if dtype in (np.uint8, np.float64) else small):
                host = random_array(nbytes, dtype, rng)
                back = cp.asarray(host).get()
                assert same_bytes(back, host), (dtype, nbytes)
        for host in (np.array(3.5, np.float32), np.arange(60_000, dtype=np.int32).reshape(200, 300),
                     np.asfortranarray(rng.random((300, 200)))):
            assert same_bytes(cp.asarray(host).get(), np.array(host, order="C"))
        x = cp.asarray(np.arange(100_000, dtype=np.float64))
        np.testing.assert_array_equal(x[::3].get(), np.arange(100_000, dtype=np.float64)[::3])
        host = random_array(64 * 2**20 + 3, np.uint8, rng)                 # >= 64 MiB, odd
        assert same_bytes(cp.asarray(host).get(), host)


_VICTIM = textwrap.dedent("""
    import sys, numpy as np, gpuremote, gpuremote.cupy as cp, gpuremote.cupyx as cx
    s = gpuremote.connect(sys.argv[1], transport=sys.argv[2])
    assert s.transport != "grpc", s.transport
    keep = cp.ones(2**21)                                   # 16 MiB held
    pinned = sys.argv[3].startswith("pinned")
    big = cx.empty_pinned(48 * 2**20, np.uint8) if pinned else np.ones(48 * 2**20, np.uint8)
    big[:] = 1
    src = cp.asarray(big)
    print("ready", flush=True)
    for _ in range(10**6):                                  # until killed
        if sys.argv[3] == "fetch":
            src.get()
        elif sys.argv[3] == "pinned_fetch":                 # shm: the daemon writes into `big` itself
            src.get(out=big)
        else:
            y = cp.asarray(big)
            del y
""")


def kill_mid_transfer(daemon, transport: str, direction: str, expect: str) -> None:
    """A client looping over large transfers is SIGKILLed: the daemon closes its session, frees its memory."""
    settle(daemon.info, None)
    baseline = [d.memory_used for d in daemon.info().devices]
    proc = subprocess.Popen([sys.executable, "-c", _VICTIM, daemon.address, transport, direction],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        line = proc.stdout.readline() if ready else ""
        assert line.strip() == "ready", line + (proc.stdout.read() if proc.poll() is not None else "")
        info = daemon.info()
        mine = [s for s in info.sessions if s.client_pid == proc.pid]
        assert len(mine) == 1 and mine[0].transport == expect and mine[0].memory_used[0] >= 2**24
        time.sleep(0.3)                                   # several transfers in, one under way
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        settle(daemon.info, baseline)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        proc.stdout.close()
