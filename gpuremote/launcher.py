"""`gpuremote run`: run an unmodified command on remote or emulated GPUs.

The command runs as a child process with the cupy import hook on its PYTHONPATH and its
devices named in GPUREMOTE_DEVICES ("host:port/index,..."); Python processes it starts
inherit both. Devices come from explicit daemons (--daemon) or from a daemon embedded in
this process (--local, the default when nothing is configured), which is stopped at exit.
The child's exit status is passed on unchanged, a death by signal included.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import tempfile
import threading

import grpc

from gpuremote._config import DEFAULTS
from gpuremote.transport import auth

HOOK_DIR = str(pathlib.Path(__file__).resolve().parent / "hook" / "site")
_FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


class LaunchError(Exception):
    """Devices could not be obtained, or the command not started; the message says why and what to
    do. `exit_code` is what `gpuremote run` exits with: 1, or a shell's 127 (command not found) and
    126 (not executable)."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


@dataclasses.dataclass
class Request:
    count: int = 1
    fraction: float | None = None
    memory: int | None = None


def daemon_devices(address: str, timeout: float = 5.0):
    """The InfoReply of the daemon at `address`, or LaunchError within `timeout` seconds."""
    from gpuremote.v1 import daemon_pb2_grpc
    from gpuremote.wire import pb
    try:
        with auth.channel(address) as channel:      # token and TLS from the environment
            return daemon_pb2_grpc.DaemonStub(channel).Info(pb.InfoRequest(), timeout=timeout)
    except auth.AuthConfigError as exc:
        raise LaunchError(str(exc)) from None
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
            raise LaunchError(f"the gpuremote daemon at {address} refused this client: {exc.details()}") from None
        raise LaunchError(f"cannot reach a gpuremote daemon at {address} ({exc.code().name.lower()}): check that "
                          "`gpuremote daemon` runs there and that the address is right") from None


def devices_from_daemons(addresses: list[str], request: Request) -> list[str]:
    """The first `count` devices offered by the daemons, as 'address/index' entries."""
    if request.fraction is not None or request.memory is not None:
        raise LaunchError("-p/-m ask for a fraction of a device, which only a pool can grant on a shared daemon; "
                          "use --pool, or --local for an embedded device of that size")
    found = []
    for address in addresses:
        info = daemon_devices(address)
        found.extend(f"{address}/{d.index}" for d in info.devices)
    if len(found) < request.count:
        raise LaunchError(f"asked for {request.count} device(s), but the daemon(s) at {', '.join(addresses)} offer "
                          f"{len(found)} in all")
    return found[:request.count]


def client_name(command: list[str]) -> str:
    """Who holds a lease, for operators (`gpuremote smi`): user@host and the command line."""
    import getpass
    import shlex
    import socket
    try:
        user = getpass.getuser()
    except Exception:        # no user name in a bare container
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}: {shlex.join(command)}"[:200]


def lease_from_pool(address: str, request: Request, filters: list[str], wait: float, command: list[str],
                    security=None):
    """A pool lease for `request` (gpuremote.pool.client.Lease, renewed until released), or LaunchError
    with the pool's reason: unreachable, not enough capacity, bad filters."""
    from gpuremote.pool.client import Lease, PoolClient, PoolError
    from gpuremote.v1 import pool_pb2
    if request.fraction is not None:
        size = {"fraction": request.fraction}
    elif request.memory is not None:
        size = {"memory": request.memory}
    else:
        size = {"whole": True}
    ask = pool_pb2.AllocateRequest(count=request.count, filters=filters, wait_s=wait,
                                   client_name=client_name(command), **size)
    try:
        client = PoolClient(address, security)
    except PoolError as exc:
        raise LaunchError(str(exc)) from None
    try:
        return Lease.allocate(client, ask)
    except PoolError as exc:
        client.close()
        raise LaunchError(str(exc)) from None
    except BaseException:
        client.close()
        raise


class EmbeddedDaemon:
    """A daemon in this process on a free loopback port, for --local."""

    def __init__(self, request: Request, backend: str = "auto"):
        from gpuremote.daemon.backends import create
        from gpuremote.daemon.server import DaemonServer
        memory = DEFAULTS.emulate_memory
        if request.memory is not None:
            memory = request.memory
        elif request.fraction is not None:
            memory = int(memory * request.fraction)
        self.backend = create(backend, None, request.count, memory)
        if len(self.backend.props) < request.count:
            raise LaunchError(f"asked for {request.count} device(s), this host has {len(self.backend.props)}")
        # It requires a random token of this run, which this process and the command read from
        # GPUREMOTE_TOKEN_FILE (a file in a private temporary folder); stop() restores the environment.
        self._token = auth.EphemeralToken()
        try:
            self.server = DaemonServer(self.backend, "127.0.0.1:0", security=self._token.server_security()).start()
        except BaseException:
            self._token.remove()
            raise
        self._saved_env = auth.update_environ(self._token.client_env())
        self.devices = [f"{self.server.address}/{i}" for i in range(request.count)]

    def stop(self) -> None:
        self.server.stop(grace=1.0)
        auth.update_environ(self._saved_env)
        self._token.remove()


class ListeningProcess:
    """A server subprocess that prints `listening on ADDRESS` once it serves (`address`; `line`: that
    whole line). Its output is read to the end, the last lines kept for errors, so that it never
    blocks on a full pipe. With `die_with_parent` it is ended when this process dies (Linux)."""

    def __init__(self, name: str, cmd: list[str], timeout_s: float = 60.0, env: dict | None = None,
                 die_with_parent: bool = False):
        self.name = name
        self.tail: list[str] = []
        self.line = self.address = ""
        self._listening = threading.Event()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=dict(os.environ if env is None else env, PYTHONUNBUFFERED="1"),
                                     preexec_fn=_die_with_parent if die_with_parent else None)
        threading.Thread(target=self._read, daemon=True, name=f"{name} output").start()
        if not self._listening.wait(timeout_s) or not self.address:
            try:
                code = self.proc.wait(timeout=2) if self._listening.is_set() else None    # its output ended
            except subprocess.TimeoutExpired:
                code = None
            self.stop()
            why = f"exited with status {code}" if code is not None else f"did not start within {timeout_s:g} s"
            raise LaunchError(f"{name} {why}; its last output:\n  " + "\n  ".join(self.tail[-5:] or ["(none)"]))

    def _read(self) -> None:
        try:
            for line in self.proc.stdout:
                self.tail = (self.tail + [line.rstrip()])[-20:]
                if not self.address:
                    found = re.search(r"listening on (\S+)", line)
                    if found:
                        self.line, self.address = line, found.group(1)
                        self._listening.set()
        except (ValueError, OSError):      # the pipe closed under us: the process is being stopped
            pass
        self._listening.set()              # the output ended: nobody waits in vain

    def stop(self) -> None:
        stop_process(self.proc)


class ChildDaemon(ListeningProcess):
    """`gpuremote daemon` as a child process on a free loopback port (one emulated device without a
    GPU), for `bench memcpy --local`: an application and its daemon are two processes everywhere
    else, and two threads of one process would measure their contention for one GIL instead (a
    64 B copy took ~5x as long that way). Token and environment as EmbeddedDaemon's; the daemon
    ends with this process, SIGKILL included (Linux)."""

    def __init__(self, memory: int, timeout_s: float = 60.0):
        self._token = auth.EphemeralToken()
        self._saved_env = None
        super().__init__("the local daemon", [sys.executable, "-m", "gpuremote.cli", "daemon", "--listen", "127.0.0.1:0",
                                              "--token-file", self._token.path, "--emulate-memory", str(memory)],
                         timeout_s, die_with_parent=True)
        self._saved_env = auth.update_environ(self._token.client_env())

    def stop(self) -> None:
        super().stop()
        if self._saved_env is not None:
            auth.update_environ(self._saved_env)
            self._saved_env = None
        self._token.remove()


def stop_process(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """End `proc` (SIGTERM, then SIGKILL after `timeout` s) and reap it."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)


def _die_with_parent() -> None:
    """In a child before exec (Linux): SIGTERM it when this process dies, SIGKILL included, so that
    no daemon outlives the run that started it. Elsewhere stop() is the only way it ends."""
    if sys.platform.startswith("linux"):
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)     # PR_SET_PDEATHSIG


def _child_env(devices: list[str], stats_dir: str, extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = HOOK_DIR + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["GPUREMOTE_DEVICES"] = ",".join(devices)
    env.pop("GPUREMOTE_DAEMON", None)
    for name in ("GPUREMOTE_GRANTS", "GPUREMOTE_GRANTS_FILE"):   # only a --pool run's own grants
        env.pop(name, None)
    env.update(extra or {})
    env["GPUREMOTE_STATS_DIR"] = stats_dir
    env.setdefault("GRPC_ENABLE_FORK_SUPPORT", "1")
    return env


def collect_stats(stats_dir: str) -> dict:
    """Sum the statistics every Python process of the command wrote at exit."""
    total: dict = {"processes": 0}
    for path in pathlib.Path(stats_dir).glob("stats-*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        total["processes"] += 1
        for key, value in data.items():
            if key == "peak_memory":
                total[key] = max(total.get(key, 0), value)
            elif isinstance(value, (int, float)):
                total[key] = total.get(key, 0) + value
    return total


def run_command(command: list[str], devices: list[str], extra_env: dict | None = None) -> tuple[int, dict]:
    """Run `command` on `devices`; returns (exit status as subprocess gives it, statistics)."""
    with tempfile.TemporaryDirectory(prefix="gpuremote-stats-") as stats_dir:
        try:
            child = subprocess.Popen(command, env=_child_env(devices, stats_dir, extra_env))
        except FileNotFoundError:
            raise LaunchError(f"command not found: {command[0]}", exit_code=127) from None
        except PermissionError:
            raise LaunchError(f"command is not executable: {command[0]}", exit_code=126) from None
        previous = {}

        def forward(signum, frame):
            try:
                child.send_signal(signum)
            except ProcessLookupError:
                pass
        # Ctrl-C reaches the child from the terminal (same process group): the wrapper must not
        # die first, or the devices could be released under a child still cleaning up.
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.SIG_IGN)
        for sig in _FORWARDED:
            previous[sig] = signal.signal(sig, forward)
        try:
            status = child.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return status, collect_stats(stats_dir)


def exit_like(status: int) -> int:
    """Leave the way the child left: by the same signal, or with the same exit code."""
    if status < 0:
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            signal.signal(-status, signal.SIG_DFL)
        except (OSError, ValueError):   # SIGKILL and SIGSTOP have no handler to reset
            pass
        os.kill(os.getpid(), -status)
        return 128 - status  # not reached for fatal signals
    return status
