"""Faults: processes killed or frozen at the worst moment, a daemon restarted under its clients.

Every test runs real processes: `gpuremote daemon` subprocesses (conftest.DaemonProcess) and client
subprocesses running the script below (or a raw gRPC client). Each client reports what happened to
it as JSON lines on stdout; every wait here is bounded, and every process a test starts is stopped
at its end (SIGCONT first, so a frozen one can die).

- a client SIGKILLed in the middle of a large upload: the daemon frees all it held, its other
  sessions keep their arrays and their accounting;
- a daemon SIGKILLed while a client blocks in a sync point: the application gets DeviceLostError
  naming the daemon's address within seconds, never a hang; under `gpuremote run --daemon` the run
  exits non-zero with that message on stderr;
- a network cut (SIGSTOP on the daemon): the blocked client gets DeviceLostError within its
  keepalive time (shortened here by GPUREMOTE_KEEPALIVE_MS / GPUREMOTE_KEEPALIVE_TIMEOUT_MS), and
  the daemon, once resumed, frees the session;
- a daemon restarted on the same port: old sessions report DeviceLostError, a new connect works;
- (in-process) the pool of transfer buffers, taken by many session threads at once, never hands one
  buffer to two takers.

The client-side cases run once over the plain gRPC stream (GPUREMOTE_TRANSPORT=grpc) and once over
whatever the client picks by default (`auto`: the daemon's data plane when it offers one).
"""

from __future__ import annotations

import collections
import json
import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from gpuremote._config import PROTOCOL_VERSION

from conftest import DaemonProcess, backend_args

KEEPALIVE_MS, KEEPALIVE_TIMEOUT_MS = 500, 1000
# What the client and daemon processes of these tests run with: a cut is noticed within ~1.5 s.
FAST_KEEPALIVE = {"GPUREMOTE_KEEPALIVE_MS": str(KEEPALIVE_MS), "GPUREMOTE_KEEPALIVE_TIMEOUT_MS": str(KEEPALIVE_TIMEOUT_MS)}
# How long after the fault the client must have its DeviceLostError: keepalive time plus ample
# slack for a loaded 2-core machine, yet far below anything that would look like a hang.
LOST_WITHIN_S = (KEEPALIVE_MS + KEEPALIVE_TIMEOUT_MS) / 1000 + 6.0
TRANSPORTS = ["grpc", "auto"]

CLIENT = textwrap.dedent(r"""
    import json, os, sys, time
    import numpy as np
    import gpuremote, gpuremote.cupy as cp
    from gpuremote.errors import DeviceLostError

    def say(event, **fields):
        print(json.dumps(dict(event=event, t=time.time(), **fields)), flush=True)

    def lost(exc):
        say("error", type=type(exc).__name__, message=str(exc), lost=isinstance(exc, DeviceLostError))

    mode, address = sys.argv[1], sys.argv[2]
    session = gpuremote.connect(address)
    say("connected", transport=session.transport, session_id=session.session_id)

    if mode == "uploader":          # large uploads, one after another, until killed
        big = np.arange(12 * 2**20, dtype=np.float64)          # 96 MiB: 96 chunks on the gRPC stream
        for i in range(1000):
            say("uploading", i=i)
            x = cp.asarray(big)
            assert float(x[-1]) == big[-1]
            del x

    elif mode == "bystander":       # holds arrays; on each line of stdin checks them and computes more
        host = np.random.default_rng(7).standard_normal((512, 256))
        x = cp.asarray(host)
        y = x @ x.T
        big = cp.asarray(np.arange(3 * 2**20, dtype=np.float64))    # 24 MiB, chunked
        np.testing.assert_allclose(y.get(), host @ host.T, rtol=1e-10)
        say("ready")
        for line in sys.stdin:
            np.testing.assert_array_equal(x.get(), host)
            np.testing.assert_allclose(y.get(), host @ host.T, rtol=1e-10)
            assert float(big[-1]) == 3 * 2**20 - 1 and float(big.sum()) == float(np.arange(3 * 2**20).sum())
            z = cp.asarray(np.ones(2**20)) * 2                        # a new chunked upload works too
            assert float(z.sum()) == 2**21
            del z
            cp.cuda.Device().synchronize()    # the release of z leaves in this batch, after the sync op
            say("checked")

    elif mode == "blocker":         # long ops, each waited for (a sync point), until the daemon goes
        n = int(sys.argv[3])
        x = cp.ones((n, n))
        assert float(x.sum()) == n * n
        say("blocking")
        try:
            while True:
                float((x @ x).sum())
                say("op done")
        except Exception as exc:
            lost(exc)

    elif mode == "restart":         # holds an array; after the daemon restarts, old fails and new works
        x = cp.arange(10)
        assert int(x.sum()) == 45
        say("ready")
        sys.stdin.readline()
        try:
            int(x.sum())
            say("old session still works")
        except Exception as exc:
            lost(exc)
        try:
            x = cp.arange(10)
            say("new op on the lost session worked")
        except Exception as exc:
            say("lost again", type=type(exc).__name__)
        gpuremote.disconnect()
        session = gpuremote.connect(address)
        y = cp.arange(10) * 3
        say("reconnected", value=int(y.sum()), transport=session.transport)

    elif mode == "drain":           # holds an array through the daemon's shutdown, one op per stdin line
        x = cp.arange(10)
        assert int(x.sum()) == 45
        say("ready")
        for line in sys.stdin:
            try:
                say("op", value=int(x.sum()))
            except Exception as exc:
                lost(exc)
                break
""")

RUN_SCRIPT = textwrap.dedent(r"""
    import cupy as cp
    x = cp.ones((1500, 1500))
    print("blocking", flush=True)
    while True:
        float((x @ x).sum())
""")


# -- processes -------------------------------------------------------------------------------------

class Child:
    """A subprocess whose stdout lines are read by a thread; JSON lines are events."""

    def __init__(self, cmd: list[str], env: dict | None = None, stdin: bool = False):
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})))
        self.events: queue.Queue = queue.Queue()
        self.lines: collections.deque[str] = collections.deque(maxlen=400)
        self.errors: collections.deque[str] = collections.deque(maxlen=400)
        self._threads = [threading.Thread(target=self._read, args=(self.proc.stdout, self.lines, True), daemon=True),
                         threading.Thread(target=self._read, args=(self.proc.stderr, self.errors, False), daemon=True)]
        for t in self._threads:
            t.start()

    def _read(self, stream, keep, events) -> None:
        for line in stream:
            keep.append(line)
            if events:
                try:
                    self.events.put(json.loads(line))
                except ValueError:
                    self.events.put({"event": "line", "text": line.rstrip("\n")})
        if events:
            self.events.put({"event": "exit"})

    def output(self) -> str:
        return "".join(self.lines) + "\n--- stderr ---\n" + "".join(self.errors)

    def expect(self, event: str, timeout: float = 30.0) -> dict:
        """The next event named `event` (others before it are skipped), within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                got = self.events.get(timeout=max(left, 0.01))
            except queue.Empty:
                raise AssertionError(f"no {event!r} from the client within {timeout} s:\n{self.output()}") from None
            if got.get("event") == event:
                return got
            if got.get("event") == "exit":
                self.proc.wait(timeout=10)
                raise AssertionError(f"the client exited ({self.proc.returncode}) before {event!r}:\n{self.output()}")

    def send(self, line: str = "go") -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def wait(self, timeout: float = 30.0) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the client did not exit within {timeout} s:\n{self.output()}") from None

    def stop(self) -> None:
        if self.proc.poll() is None:
            _signal(self.proc, signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(timeout=10)
        for t in self._threads:
            t.join(timeout=10)
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if f:
                f.close()


def _signal(proc: subprocess.Popen, sig: int) -> None:
    try:
        proc.send_signal(sig)
    except ProcessLookupError:
        pass


class Daemon(DaemonProcess):
    """conftest's DaemonProcess, with its output drained (a blocked pipe must not stall it) and a
    stop that also ends a frozen (SIGSTOPped) daemon."""

    def __init__(self, *args: str, env: dict | None = None):
        super().__init__(*args, env=env)
        self.port = int(self.address.rpartition(":")[2])
        self.pid = self.proc.pid
        self.log: collections.deque[str] = collections.deque(maxlen=400)
        self._drain = threading.Thread(target=lambda: self.log.extend(self.proc.stdout), daemon=True)
        self._drain.start()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        _signal(self.proc, sig)
        if sig in (signal.SIGKILL, signal.SIGTERM):
            self.proc.wait(timeout=15)

    def stop(self) -> None:
        if self.proc.poll() is None:
            _signal(self.proc, signal.SIGCONT)
        super().stop()
        self._drain.join(timeout=10)


@pytest.fixture
def procs(tmp_path):
    """start_daemon(*args, env=) and start_client(mode, address, *args, transport=, env=); all stopped at the end."""
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    daemons: list[Daemon] = []
    clients: list[Child] = []

    def start_daemon(*args: str, env: dict | None = None, memory: str = "1GiB") -> Daemon:
        daemons.append(Daemon(*backend_args(devices=1, memory=memory), *args, env=dict(FAST_KEEPALIVE, **(env or {}))))
        return daemons[-1]

    def start_client(mode: str, address: str, *args: str, transport: str = "auto", stdin: bool = False) -> Child:
        env = dict(FAST_KEEPALIVE, GPUREMOTE_TRANSPORT=transport)
        clients.append(Child([sys.executable, str(script), mode, address, *args], env=env, stdin=stdin))
        return clients[-1]

    start_daemon.started = daemons
    yield start_daemon, start_client
    for c in clients:
        c.stop()
    for d in daemons:
        d.stop()


def held_now(d: Daemon, held: dict, timeout: float = 10.0) -> None:
    """Wait (bounded) until each session holds what `held` says: a release queued behind a sync op
    reaches the daemon just after the sync's reply."""
    deadline = time.monotonic() + timeout
    while True:
        now = {s.session_id: dict(s.memory_used) for s in d.info().sessions}
        if now == held:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"sessions hold {now}, expected {held}")
        time.sleep(0.05)


def settle(d: Daemon, baseline: list[int], keep: set[str] = frozenset(), timeout: float = 20.0):
    """Wait (bounded) until the daemon holds no session but those in `keep`, and its memory is `baseline`
    plus what those sessions hold."""
    deadline = time.monotonic() + timeout
    while True:
        info = d.info()
        others = [s.session_id for s in info.sessions if s.session_id not in keep]
        used = [dev.memory_used for dev in info.devices]
        expected = [b + sum(s.memory_used.get(i, 0) for s in info.sessions if s.session_id in keep)
                    for i, b in enumerate(baseline)]
        if not others and used == expected:
            return info
        if time.monotonic() > deadline:
            raise AssertionError(f"daemon did not settle: sessions {others}, memory_used {used}, expected {expected}; "
                                 f"log:\n{''.join(d.log)}")
        time.sleep(0.05)


def memory_used(d: Daemon) -> list[int]:
    return [dev.memory_used for dev in d.info().devices]


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def assert_lost(event: dict, address: str, since: float) -> None:
    assert event["type"] == "DeviceLostError" and event["lost"], event
    assert address in event["message"], event
    took = event["t"] - since
    assert took < LOST_WITHIN_S, f"DeviceLostError came {took:.1f} s after the fault (bound {LOST_WITHIN_S} s)"


# -- a client killed mid-transfer ---------------------------------------------------------------------

def _raw_half_upload(address: str, nbytes: int, chunk: int, sent_chunks: int):
    """A raw gRPC client that announces a chunked upload and sends only `sent_chunks` of its chunks,
    then waits forever (a process of its own, to be SIGKILLed)."""
    return textwrap.dedent(f"""
        import os, sys, time, queue
        import grpc
        from gpuremote.wire import pb
        q = queue.SimpleQueue()
        def requests():
            while True:
                yield q.get()
        channel = grpc.insecure_channel({address!r})
        responses = channel.stream_stream("/gpuremote.v1.Daemon/Session",
                                          request_serializer=pb.ClientMessage.SerializeToString,
                                          response_deserializer=pb.ServerMessage.FromString)(requests())
        m = pb.ClientMessage()
        m.open.protocol_version = {PROTOCOL_VERSION}
        m.open.client_name = "half-upload"
        m.open.client_pid = os.getpid()
        q.put(m)
        assert next(responses).WhichOneof("kind") == "opened"
        m = pb.ClientMessage()
        op = m.batch.ops.add(seq=1)
        op.upload.handle = 1
        op.upload.meta.dtype = "|u1"
        op.upload.meta.shape.append({nbytes})
        op.upload.chunks = {-(-nbytes // chunk)}
        q.put(m)
        for i in range({sent_chunks}):
            c = pb.ClientMessage()
            c.chunk.seq, c.chunk.offset, c.chunk.data = 1, i * {chunk}, bytes({chunk})
            q.put(c)
        time.sleep(0.5)          # let the chunks leave
        print("mid-upload", flush=True)
        time.sleep(600)
    """)


def test_client_killed_mid_chunked_upload_raw(procs, tmp_path):
    """Deterministic: the daemon is inside an upload (half its chunks read) when the client dies."""
    start_daemon, start_client = procs
    d = start_daemon()
    baseline = memory_used(d)
    bystander = start_client("bystander", d.address, transport="grpc", stdin=True)
    bystander.expect("ready")
    held = {s.session_id: dict(s.memory_used) for s in d.info().sessions}
    assert len(held) == 1
    nbytes, chunk = 256 * 2**20, 2**20
    script = tmp_path / "half.py"
    script.write_text(_raw_half_upload(d.address, nbytes, chunk, sent_chunks=128))
    rss_before = rss_kib(d.pid)
    victim = Child([sys.executable, str(script)])
    try:
        victim.expect("line", timeout=30)          # "mid-upload"
        info = d.info()
        mine = [s for s in info.sessions if s.client_pid == victim.proc.pid]
        assert len(mine) == 1, info
        os.kill(victim.proc.pid, signal.SIGKILL)
        victim.wait(timeout=10)
        settle(d, baseline, keep=set(held))
        held_now(d, held)
        bystander.send()
        bystander.expect("checked")
        # the half-received upload's host buffer does not stay with the daemon (at most its pool of reused
        # transfer buffers, GPUREMOTE_BUFFER_POOL_BYTES, may keep one)
        assert rss_kib(d.pid) - rss_before < (nbytes + 512 * 2**20) // 1024
    finally:
        victim.stop()
    bystander.proc.stdin.close()
    assert bystander.wait() == 0, bystander.output()
    settle(d, baseline)
    assert d.proc.poll() is None


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_client_killed_during_large_uploads(procs, transport):
    """A real client looping 96 MiB uploads is SIGKILLed at several points of its transfers."""
    start_daemon, start_client = procs
    d = start_daemon()
    baseline = memory_used(d)
    bystander = start_client("bystander", d.address, transport=transport, stdin=True)
    bystander.expect("ready")
    held = {s.session_id: dict(s.memory_used) for s in d.info().sessions}
    for delay in (0.0, 0.05, 0.15):
        victim = start_client("uploader", d.address, transport=transport)
        connected = victim.expect("connected")
        assert transport == "auto" or connected["transport"] == transport
        victim.expect("uploading")
        victim.expect("uploading")                 # one upload done: the next one is on its way
        time.sleep(delay)
        os.kill(victim.proc.pid, signal.SIGKILL)
        victim.wait(timeout=10)
        settle(d, baseline, keep=set(held))
        bystander.send()
        bystander.expect("checked")
    held_now(d, held)
    bystander.proc.stdin.close()
    assert bystander.wait() == 0, bystander.output()
    settle(d, baseline)


# -- a daemon killed while a client waits ------------------------------------------------------------

@pytest.mark.parametrize("transport", TRANSPORTS)
def test_daemon_killed_during_a_sync_point(procs, transport):
    start_daemon, start_client = procs
    d = start_daemon()
    client = start_client("blocker", d.address, "2000", transport=transport)
    client.expect("blocking")
    client.expect("op done")              # ops take long enough that the kill lands inside one
    time.sleep(0.2)
    killed_at = time.time()
    d.kill(signal.SIGKILL)
    assert_lost(client.expect("error", timeout=LOST_WITHIN_S + 10), d.address, killed_at)
    assert client.wait() == 0


def test_run_exits_nonzero_when_the_daemon_dies(procs, tmp_path):
    start_daemon, _ = procs
    d = start_daemon()
    script = tmp_path / "app.py"
    script.write_text(RUN_SCRIPT)
    run = Child([sys.executable, "-m", "gpuremote.cli", "run", "--daemon", d.address, "--", sys.executable, str(script)],
                env=FAST_KEEPALIVE)
    try:
        run.expect("line", timeout=60)            # "blocking"
        time.sleep(0.5)
        killed_at = time.monotonic()
        d.kill(signal.SIGKILL)
        status = run.wait(timeout=LOST_WITHIN_S + 10)
        assert time.monotonic() - killed_at < LOST_WITHIN_S
        assert status != 0
        stderr = "".join(run.errors)
        assert "DeviceLostError" in stderr and d.address in stderr, stderr
    finally:
        run.stop()


# -- a network cut -----------------------------------------------------------------------------------

@pytest.mark.parametrize("transport", TRANSPORTS)
def test_network_cut_noticed_by_keepalive(procs, transport):
    """SIGSTOP freezes the daemon with its connections open: nothing but keepalive can tell."""
    start_daemon, start_client = procs
    d = start_daemon()
    baseline = memory_used(d)
    client = start_client("blocker", d.address, "1200", transport=transport)
    client.expect("blocking")
    client.expect("op done")
    stopped_at = time.time()
    d.kill(signal.SIGSTOP)
    try:
        assert_lost(client.expect("error", timeout=LOST_WITHIN_S + 10), d.address, stopped_at)
        assert client.wait() == 0
    finally:
        d.kill(signal.SIGCONT)
    settle(d, baseline)                       # resumed, the daemon sees the client gone and frees it
    again = start_client("blocker", d.address, "200", transport=transport)
    again.expect("op done")
    again.stop()
    settle(d, baseline)


# -- a daemon restarted on its port ---------------------------------------------------------------------

@pytest.mark.parametrize("transport,sig", [(t, s) for t in TRANSPORTS for s in ("SIGKILL", "SIGTERM")])
def test_daemon_restarted_on_the_same_port(procs, transport, sig):
    start_daemon, start_client = procs
    first = start_daemon("--drain-timeout", "0")      # SIGTERM: end the open session at once
    client = start_client("restart", first.address, transport=transport, stdin=True)
    client.expect("ready")
    first.kill(getattr(signal, sig))
    second = start_daemon("--listen", f"127.0.0.1:{first.port}")
    assert second.address == first.address
    restarted_at = time.time()
    client.send()
    assert_lost(client.expect("error"), first.address, restarted_at)
    assert client.expect("lost again")["type"] == "DeviceLostError"
    again = client.expect("reconnected")
    assert again["value"] == 135
    assert client.wait() == 0
    settle(second, [0])


# -- graceful shutdown ----------------------------------------------------------------------------------

def wait_draining(d: Daemon, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while True:
        info = d.info()
        if info.draining:
            return info
        if time.monotonic() > deadline:
            raise AssertionError(f"the daemon did not start draining within {timeout} s")
        time.sleep(0.02)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_sigterm_drains_open_sessions_then_ends_them_with_a_reason(procs, transport):
    from gpuremote.client.session import Session
    from gpuremote.errors import DeviceLostError
    start_daemon, start_client = procs
    d = start_daemon("--drain-timeout", "4")
    client = start_client("drain", d.address, transport=transport, stdin=True)
    client.expect("ready")
    signalled = time.monotonic()
    _signal(d.proc, signal.SIGTERM)
    info = wait_draining(d)
    assert len(info.sessions) == 1 and 0 < info.drain_remaining_s <= 4
    with pytest.raises(DeviceLostError, match="shutting down and opens no new sessions"):
        Session(d.address, timeout=5)
    smi = subprocess.run([sys.executable, "-m", "gpuremote.cli", "smi", "--daemon", d.address, "--json"],
                         capture_output=True, text=True, timeout=30)
    assert smi.returncode == 0, smi.stderr
    assert 0 < json.loads(smi.stdout)["hosts"][0]["draining_s"] <= 4
    client.send()                                   # the open session still works, and is told
    assert client.expect("op")["value"] == 45
    deadline = time.monotonic() + 10
    while not any("is shutting down" in line for line in client.errors) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert any(f"daemon {d.address}" in line and "keeps working for at most" in line for line in client.errors), \
        client.output()
    assert d.proc.wait(timeout=20) == 0             # at the deadline it ends the session and exits
    assert time.monotonic() - signalled >= 3.5
    client.send()
    err = client.expect("error")
    assert err["lost"] and d.address in err["message"], err
    if transport != "grpc":     # the data-plane link carries the daemon's reason even to an idle client
        assert "shut down after a 4 s drain" in err["message"], err
    assert client.wait() == 0
    assert "ended 1 session(s) still open at the deadline" in "".join(d.log)


def test_sigterm_with_no_sessions_stops_at_once_and_a_second_signal_skips_the_drain(procs):
    start_daemon, start_client = procs
    idle = start_daemon("--drain-timeout", "60")
    signalled = time.monotonic()
    _signal(idle.proc, signal.SIGTERM)
    assert idle.proc.wait(timeout=15) == 0 and time.monotonic() - signalled < 10
    busy = start_daemon("--drain-timeout", "60")
    client = start_client("drain", busy.address, stdin=True)
    client.expect("ready")
    _signal(busy.proc, signal.SIGTERM)
    wait_draining(busy)
    signalled = time.monotonic()
    _signal(busy.proc, signal.SIGINT)                 # impatient operator: stop now
    assert busy.proc.wait(timeout=15) == 0 and time.monotonic() - signalled < 10
    client.send()
    err = client.expect("error")
    assert err["lost"] and "stopped at once" in err["message"], err


@pytest.mark.parametrize("drain", ["0", "60"])
def test_a_burst_of_signals_stops_the_daemon(procs, drain):
    # Signals that came while the handler of the last one was setting a threading.Event deadlocked
    # the daemon on the Event's own lock (found when a test's SIGKILLed parent left one running).
    start_daemon, start_client = procs
    d = start_daemon("--drain-timeout", drain)
    for i in range(300):
        _signal(d.proc, signal.SIGTERM if i % 2 else signal.SIGINT)
    assert d.proc.wait(timeout=15) == 0


# -- concurrency inside one process ----------------------------------------------------------------------

def test_buffer_pool_never_hands_one_segment_to_two_takers():
    """Session threads take receive buffers concurrently; two live arrays must never share bytes.
    (benchmarks/load.py found a corrupted download: a segment was free by its reference count until the
    taker made its array, after the pool's lock was released, so a second thread could get it too.)"""
    from gpuremote.transport.buffers import BufferPool
    pool = BufferPool(64 * 2**20)
    live: list = []
    lock = threading.Lock()
    clashes = []
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)          # thread switches everywhere, the race's window included

    def taker() -> None:
        for _ in range(10_000):
            a = pool.take(300_000)
            with lock:
                clashes.extend(b for b in live if np.shares_memory(a, b))
                live.append(a)
                if len(live) > 6:
                    live.pop(0)
    try:
        threads = [threading.Thread(target=taker) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    finally:
        sys.setswitchinterval(switch)
    assert not any(t.is_alive() for t in threads)
    assert not clashes, f"{len(clashes)} buffers were handed out while still in use"
