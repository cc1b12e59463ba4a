"""Real pools, daemons and `gpuremote run --pool` wrappers as subprocesses on loopback, for the pool tests.

Ports are picked at run time. Every process is started through `Procs`, which stops (or kills)
all of them at the end; every wait is bounded by a deadline.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import grpc

GPUREMOTE = [sys.executable, "-m", "gpuremote.cli"]
GiB = 2**30


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(condition, timeout: float = 10.0, what: str = "condition", period: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout} s")
        time.sleep(period)


class Proc:
    """A subprocess whose merged output is collected by a thread; `expect` waits for a line."""

    def __init__(self, args: list[str], env: dict | None = None, **popen):
        self.args = args
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})), **popen)
        self.pid = self.proc.pid
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line)
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def output(self) -> str:
        with self._cond:
            return "".join(self.lines)

    def expect(self, pattern: str, timeout: float = 30.0, count: int = 1) -> re.Match:
        """The `count`-th match of `pattern` in the output, waiting up to `timeout` s for it."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = list(re.finditer(pattern, "".join(self.lines)))
                if len(found) >= count:
                    return found[count - 1]
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    raise AssertionError(f"{pattern!r} (x{count}) not in the output of {' '.join(self.args[2:5])} "
                                         f"within {timeout} s: {''.join(self.lines)[-3000:]!r}")
                self._cond.wait(min(left, 0.2))

    def wait(self, timeout: float = 60.0) -> int:
        self.proc.wait(timeout=timeout)
        self._reader.join(timeout=10)
        return self.proc.returncode

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(sig)
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._reader.join(timeout=10)
        return self.proc.returncode

    def kill(self) -> int | None:
        return self.stop(signal.SIGKILL)


class Procs:
    """Starts processes and stops every one of them at `stop_all` (fixtures call it)."""

    def __init__(self, tmp_path):
        self.tmp = tmp_path
        self.started: list[Proc] = []

    def start(self, args: list[str], env: dict | None = None, **popen) -> Proc:
        p = Proc(args, env, **popen)
        self.started.append(p)
        return p

    def pool(self, port: int, state, *args: str, env: dict | None = None) -> Proc:
        p = self.start([*GPUREMOTE, "pool", "--listen", f"127.0.0.1:{port}", "--state", str(state), "--insecure",
                        *args], env)
        p.address = f"127.0.0.1:{port}"
        return p

    def daemon(self, pool: str, host_id: str, *args: str, devices: int = 2, memory: str = "8GiB",
               env: dict | None = None) -> Proc:
        p = self.start([*GPUREMOTE, "daemon", "--listen", "127.0.0.1:0", "--insecure", "--backend", "emulated",
                        "--emulate", str(devices), "--emulate-memory", memory, "--pool", pool, "--host-id", host_id,
                        *args], env)
        p.host_id = host_id
        return p

    def run(self, pool: str, *options: str, command: list[str], env: dict | None = None, **popen) -> Proc:
        base = dict(env or {})
        return self.start([*GPUREMOTE, "run", "--pool", pool, *options, "--", *command],
                          {k: v for k, v in base.items()}, **popen)

    def stop_all(self) -> None:
        for p in reversed(self.started):
            p.stop()


def ready(daemon: Proc, timeout: float = 30.0) -> Proc:
    """Wait until the daemon listens and registered; sets .address."""
    daemon.address = daemon.expect(r"listening on (\S+)", timeout).group(1)
    daemon.expect(r"registered with the pool", timeout)
    return daemon


class Cluster:
    """A pool and `hosts` daemons (emulated, 2 x 8 GiB each), started in parallel."""

    def __init__(self, procs: Procs, hosts: int = 3, pool_args: tuple[str, ...] = (), daemon_args=(),
                 name: str = "pool"):
        self.procs = procs
        self.port = free_port()
        self.state = procs.tmp / f"{name}.db"
        self.pool = procs.pool(self.port, self.state, "-v", *pool_args)
        self.address = self.pool.address
        self.daemons = [procs.daemon(self.address, f"h{i}", *daemon_args) for i in range(hosts)]
        self.pool.expect("listening on")
        for d in self.daemons:
            ready(d)
        self.channel = grpc.insecure_channel(self.address)
        wait_until(lambda: len([h for h in self.status().hosts if not h.stale]) == hosts, 20, "hosts registered")

    @property
    def stub(self):
        from gpuremote.v1 import pool_pb2_grpc
        return pool_pb2_grpc.PoolStub(self.channel)

    def status(self):
        from gpuremote.v1 import pool_pb2
        return self.stub.Status(pool_pb2.StatusRequest(), timeout=10)

    def restart_pool(self, *args: str, kill: bool = True) -> Proc:
        self.pool.kill() if kill else self.pool.stop()
        self.channel.close()
        self.pool = self.procs.pool(self.port, self.state, "-v", *args)
        self.pool.expect("listening on")
        self.channel = grpc.insecure_channel(self.address)
        return self.pool

    def daemon(self, host_id: str) -> Proc:
        return next(d for d in self.daemons if d.host_id == host_id)

    def close(self) -> None:
        self.channel.close()


def info(address: str):
    from gpuremote.v1 import daemon_pb2_grpc
    from gpuremote.wire import pb
    with grpc.insecure_channel(address) as channel:
        return daemon_pb2_grpc.DaemonStub(channel).Info(pb.InfoRequest(), timeout=10)


def smi_json(*args: str, timeout: float = 60) -> dict:
    got = subprocess.run([*GPUREMOTE, "smi", "--json", *args], capture_output=True, text=True, timeout=timeout)
    assert got.returncode == 0, got.stderr
    return json.loads(got.stdout)


def grant_key(state) -> bytes:
    """The pool's grant key, read from its state file (tests mint their own grants with it)."""
    import sqlite3
    with sqlite3.connect(str(state)) as db:
        return db.execute("SELECT value FROM secrets WHERE name = 'grant_key'").fetchone()[0]
