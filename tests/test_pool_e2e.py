"""`gpuremote pool` end to end: a real pool process on a loopback port, raw gRPC clients playing daemons
and lease holders.

Every pool process is stopped (or killed) by its fixture; every wait is bounded by a deadline.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import threading
import time

import grpc
import pytest

from gpuremote.v1 import pool_pb2, pool_pb2_grpc
from gpuremote.wire import grants

GiB = 2**30
DEVICE_MEMORY = 8 * GiB


class PoolProcess:
    """A `gpuremote pool` subprocess on 127.0.0.1:0; `stub` talks to it."""

    def __init__(self, state, *args: str, env: dict | None = None, security: tuple[str, ...] = ("--insecure",)):
        cmd = [sys.executable, "-m", "gpuremote.cli", "pool", "--listen", "127.0.0.1:0", "--state", str(state),
               *security, *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})))
        self.lines: list[str] = []
        self._listening = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self._listening.wait(30):
            self.kill()
            raise RuntimeError(f"pool did not start: {self.output()!r}")
        self.address = re.search(r"listening on (\S+)", self.output()).group(1)
        self.channel = grpc.insecure_channel(self.address)
        self.stub = pool_pb2_grpc.PoolStub(self.channel)

    def _read(self) -> None:
        for line in self.proc.stdout:            # ends when the process exits
            self.lines.append(line)
            if "listening on" in line:
                self._listening.set()

    def output(self) -> str:
        return "".join(self.lines)

    def status(self) -> pool_pb2.StatusReply:
        return self.stub.Status(pool_pb2.StatusRequest(), timeout=10)

    def _end(self, how) -> int:
        if hasattr(self, "channel"):
            self.channel.close()
        if self.proc.poll() is None:
            how()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._reader.join(timeout=10)
        return self.proc.returncode

    def kill(self) -> int:
        return self._end(self.proc.kill)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        return self._end(lambda: self.proc.send_signal(sig))


@pytest.fixture
def pools(tmp_path):
    """start(*args, env=None, state=None) -> PoolProcess; all are stopped at the end of the test."""
    started: list[PoolProcess] = []

    def start(*args: str, env: dict | None = None, state=None) -> PoolProcess:
        started.append(PoolProcess(state or tmp_path / "pool.db", *args, env=env))
        return started[-1]
    yield start
    for p in started:
        p.stop()


def devices(n: int = 2, memory: int = DEVICE_MEMORY, **fields) -> list[pool_pb2.PoolDevice]:
    return [pool_pb2.PoolDevice(index=i, name=f"Emulated {i}", memory_total=memory, **fields) for i in range(n)]


def register(pool: PoolProcess, name: str, n: int = 2, port: int = 7200, **fields) -> pool_pb2.RegisterReply:
    request = pool_pb2.RegisterRequest(host_id=name, address=f"127.0.0.1:{port}", backend="emulated",
                                       devices=devices(n), **fields)
    return pool.stub.Register(request, timeout=10)


def three_hosts(pool: PoolProcess) -> bytes:
    """Register h0, h1, h2 (2 x 8 GiB each), heartbeat them; the grant key."""
    keys = {register(pool, f"h{i}", port=7200 + i).grant_key for i in range(3)}
    for i in range(3):
        assert pool.stub.Heartbeat(pool_pb2.HeartbeatRequest(host_id=f"h{i}", devices=devices(2)), timeout=10).known
    assert len(keys) == 1
    return keys.pop()


def allocate(pool: PoolProcess, count: int = 1, wait_s: float = 0.0, filters=(), **size) -> pool_pb2.AllocateReply:
    size = size or {"whole": True}
    return pool.stub.Allocate(pool_pb2.AllocateRequest(count=count, wait_s=wait_s, filters=filters,
                                                       client_name="test", **size), timeout=30)


def release(pool: PoolProcess, lease: pool_pb2.AllocateReply) -> None:
    pool.stub.Release(pool_pb2.ReleaseRequest(lease_id=lease.lease_id, lease_secret=lease.lease_secret), timeout=10)


def renew(pool: PoolProcess, lease: pool_pb2.AllocateReply) -> pool_pb2.RenewReply:
    return pool.stub.Renew(pool_pb2.RenewRequest(lease_id=lease.lease_id, lease_secret=lease.lease_secret),
                           timeout=10)


def refused(call, code: grpc.StatusCode, *hints: str) -> str:
    with pytest.raises(grpc.RpcError) as info:
        call()
    assert info.value.code() == code, info.value.details()
    for hint in hints:
        assert hint in info.value.details(), (hint, info.value.details())
    return info.value.details()


def wait_until(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def places(reply) -> list[tuple[str, int]]:
    return [(g.host_id, g.device) for g in (pool_pb2.Grant.FromString(s.grant) for s in reply.grants)]


# --- capacity under concurrency ---

class Ledger:
    """What clients hold right now, per device; fails on any grant past a device's capacity."""

    def __init__(self, key: bytes):
        self.key = key
        self.lock = threading.Lock()
        self.held: dict[tuple[str, int], list[tuple[int, float, bool]]] = {}
        self.errors: list[str] = []

    def take(self, reply, whole: bool) -> None:
        with self.lock:
            for signed in reply.grants:
                g = grants.verify(signed, self.key)
                holders = self.held.setdefault((g.host_id, g.device), [])
                holders.append((g.memory_limit, g.compute_share, whole))
                memory, share = sum(h[0] for h in holders), sum(h[1] for h in holders)
                if memory > DEVICE_MEMORY or share > 1 + 1e-9 or (len(holders) > 1 and any(h[2] for h in holders)):
                    self.errors.append(f"{g.host_id}/{g.device} over capacity: {holders}")

    def give_back(self, reply, whole: bool) -> None:
        with self.lock:
            for signed in reply.grants:
                g = pool_pb2.Grant.FromString(signed.grant)
                self.held[(g.host_id, g.device)].remove((g.memory_limit, g.compute_share, whole))


MIX = [dict(count=1, whole=True), dict(count=2, whole=True), dict(count=1, fraction=0.25),
       dict(count=2, fraction=0.5), dict(count=1, memory=3 * GiB), dict(count=3, fraction=0.125)]


def test_concurrent_allocations_never_exceed_a_device(pools):
    pool = pools()
    ledger = Ledger(three_hosts(pool))
    outcomes: list[str] = []

    def client(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(6):
            ask = dict(rng.choice(MIX))
            try:
                reply = allocate(pool, wait_s=10, **ask)
            except grpc.RpcError as exc:
                outcomes.append(exc.code().name)
                continue
            assert len(reply.grants) == ask["count"] and len(set(places(reply))) == ask["count"]
            ledger.take(reply, "whole" in ask)
            time.sleep(rng.uniform(0, 0.03))
            ledger.give_back(reply, "whole" in ask)
            release(pool, reply)
            outcomes.append("OK")

    threads = [threading.Thread(target=client, args=(seed,)) for seed in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert ledger.errors == []
    assert outcomes.count("OK") == 24 * 6, outcomes
    status = pool.status()
    assert (list(status.leases), status.waiting) == ([], 0)


# --- the queue ---

def test_waiting_requests_are_served_first_come_first_served(pools):
    pool = pools()
    three_hosts(pool)
    held = [allocate(pool) for _ in range(6)]                   # every device, whole
    first = pool.stub.Allocate.future(pool_pb2.AllocateRequest(count=2, whole=True, wait_s=20), timeout=30)
    wait_until(lambda: pool.status().waiting == 1)
    second = pool.stub.Allocate.future(pool_pb2.AllocateRequest(count=1, fraction=0.5, wait_s=20), timeout=30)
    wait_until(lambda: pool.status().waiting == 2)

    release(pool, held[0])                             # room for the second, not the first
    refused(lambda: allocate(pool, fraction=0.1), grpc.StatusCode.RESOURCE_EXHAUSTED,
            "requests that came first are waiting (2 request(s) waiting ahead)")
    time.sleep(0.5)
    assert not first.done() and not second.done() and pool.status().waiting == 2

    release(pool, held[1])                             # now the first fits: it goes first
    got_first = first.result(timeout=10)
    assert sorted(places(got_first)) == sorted(places(held[0]) + places(held[1]))
    time.sleep(0.3)
    assert not second.done() and pool.status().waiting == 1

    release(pool, held[2])
    got_second = second.result(timeout=10)
    assert places(got_second) == places(held[2])
    for lease in [got_first, got_second] + held[3:]:
        release(pool, lease)
    assert pool.status().waiting == 0


def test_a_wait_that_runs_out_says_so_and_leaves_the_queue(pools):
    pool = pools()
    three_hosts(pool)
    held = allocate(pool, count=6)
    refused(lambda: allocate(pool, fraction=0.5), grpc.StatusCode.RESOURCE_EXHAUSTED,
            "no capacity is free now", "after waiting 0 s", "release leases")
    started = time.monotonic()
    refused(lambda: allocate(pool, fraction=0.5, wait_s=0.5), grpc.StatusCode.RESOURCE_EXHAUSTED,
            "no capacity freed", "after waiting 0.5 s")
    assert 0.45 <= time.monotonic() - started < 3
    assert pool.status().waiting == 0
    release(pool, held)


# --- restart ---

def test_restart_after_sigkill_keeps_every_lease(pools, tmp_path):
    pool = pools()
    key = three_hosts(pool)
    leases = [allocate(pool, count=2), allocate(pool, fraction=0.5), allocate(pool, memory=3 * GiB, count=3),
              allocate(pool, fraction=0.25, filters=["host=h2"])]
    before = pool.status()
    assert pool.kill() == -signal.SIGKILL

    pool = pools()                                              # same state file
    after = pool.status()
    assert [lease.lease_id for lease in after.leases] == [lease.lease_id for lease in before.leases]
    assert [list(lease.grants) for lease in after.leases] == [list(lease.grants) for lease in before.leases]
    assert [h.host_id for h in after.hosts] == ["h0", "h1", "h2"]
    # Hosts are persisted: their daemons stay known without registering again; an unknown one is told to.
    reply = pool.stub.Heartbeat(pool_pb2.HeartbeatRequest(host_id="h2"), timeout=10)
    assert reply.known and set(reply.active_leases) == {leases[3].lease_id} | {
        lease.lease_id for lease in leases if "h2" in {h for h, _ in places(lease)}}
    assert not pool.stub.Heartbeat(pool_pb2.HeartbeatRequest(host_id="never-registered"), timeout=10).known
    # The grant key survived: old grants and renewed ones verify with it.
    assert register(pool, "h0").grant_key == key
    for lease in leases:
        grants.verify(lease.grants[0], key)
        renewed = renew(pool, lease)
        assert renewed.expires_at > lease.expires_at
        assert [grants.verify(s, key).expires_at for s in renewed.grants] == [renewed.expires_at] * len(lease.grants)
        assert places(renewed) == places(lease)
    # The restored leases still hold their capacity: 2 + 1 + 3 + 1 devices are in use.
    refused(lambda: allocate(pool, count=3), grpc.StatusCode.RESOURCE_EXHAUSTED, "no capacity is free now")
    # The lease key survived too: the secrets handed out before the kill still work, only they.
    other = pool_pb2.AllocateReply(lease_id=leases[0].lease_id, lease_secret=leases[1].lease_secret)
    refused(lambda: release(pool, other), grpc.StatusCode.PERMISSION_DENIED, "lease secret is missing or wrong")
    for lease in leases:
        release(pool, lease)
    assert not pool.status().leases


# --- lease secrets ---

def test_only_the_allocating_client_can_renew_or_release_its_lease(pools):
    from gpuremote.pool.server import lease_secret
    pool = pools()
    key = three_hosts(pool)
    mine, theirs = allocate(pool, fraction=0.5), allocate(pool, fraction=0.5)
    assert len(mine.lease_secret) == 32 and mine.lease_secret != theirs.lease_secret
    # Nothing public carries it: not Status, not the grants daemons see; the grant key cannot derive it.
    status = pool.status()
    assert mine.lease_secret not in status.SerializeToString()
    assert all(mine.lease_secret not in s.SerializeToString() for s in mine.grants)
    assert lease_secret(key, mine.lease_id) != mine.lease_secret
    # Another tenant reads the lease id from Status and tries it with every secret it could have.
    seen_id = next(lease.lease_id for lease in status.leases if lease.lease_id == mine.lease_id)
    for wrong in (b"", b"\0" * 32, os.urandom(32), os.urandom(5), theirs.lease_secret, mine.lease_secret[:31],
                  lease_secret(key, seen_id)):
        forged = pool_pb2.AllocateReply(lease_id=seen_id, lease_secret=wrong)
        for call in (renew, release):
            refused(lambda: call(pool, forged), grpc.StatusCode.PERMISSION_DENIED,
                    f"lease {seen_id}: the lease secret is missing or wrong",
                    "only the client that allocated the lease can renew or release it")
    # An oversized secret is refused before any work, whether or not the lease exists.
    for lease_id in (seen_id, "no-such-lease"):
        for size in (33, 1 << 20):
            huge = pool_pb2.AllocateReply(lease_id=lease_id, lease_secret=b"s" * size)
            for call in (renew, release):
                refused(lambda: call(pool, huge), grpc.StatusCode.INVALID_ARGUMENT, f"{size:,} bytes",
                        "AllocateReply.lease_secret")
    # Nothing changed: the lease is there, and its owner renews and releases it.
    assert [lease.lease_id for lease in pool.status().leases] == [mine.lease_id, theirs.lease_id]
    assert renew(pool, mine).expires_at > mine.expires_at
    release(pool, mine)
    refused(lambda: release(pool, mine), grpc.StatusCode.NOT_FOUND, "unknown")
    assert [lease.lease_id for lease in pool.status().leases] == [theirs.lease_id]
    release(pool, theirs)


# --- expiry ---

def test_an_unrenewed_lease_expires_and_frees_its_devices(pools):
    pool = pools("--lease-ttl", "1")
    three_hosts(pool)
    assert register(pool, "h0").heartbeat_s == pytest.approx(1 / 3)
    kept = allocate(pool, fraction=0.5)
    lapsed = allocate(pool, count=5)
    taken = time.monotonic()
    waiting = pool.stub.Allocate.future(pool_pb2.AllocateRequest(count=2, whole=True, wait_s=5), timeout=10)
    while not waiting.done():                                    # needs the lapsed lease's devices
        assert time.monotonic() - taken < 6
        renew(pool, kept)
        time.sleep(0.05)
    waited = waiting.result()
    freed_after = time.monotonic() - taken
    assert 0.8 <= freed_after <= 2.0, freed_after                # expiry frees capacity within 2 TTLs
    refused(lambda: renew(pool, lapsed),
            grpc.StatusCode.NOT_FOUND, lapsed.lease_id, "unknown or has expired", "allocate again")
    # The waiter's own lease and the renewed one live on.
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        for lease in (kept, waited):
            renew(pool, lease)
        time.sleep(0.25)
    assert {lease.lease_id for lease in pool.status().leases} == {kept.lease_id, waited.lease_id}


# --- hosts ---

def test_reregister_replaces_devices_and_keeps_leases(pools):
    pool = pools()
    three_hosts(pool)
    lease = allocate(pool, count=2, filters=["host=h1"])
    request = pool_pb2.RegisterRequest(host_id="h1", address="127.0.0.1:7301", backend="emulated",
                                       devices=devices(3, memory_used=GiB, utilization=0.5))
    pool.stub.Register(request, timeout=10)
    h1 = pool.status().hosts[1]
    assert (h1.host_id, h1.address, len(h1.devices)) == ("h1", "127.0.0.1:7301", 3)
    assert [lease.lease_id for lease in pool.status().leases] == [lease.lease_id]
    reply = pool.stub.Heartbeat(pool_pb2.HeartbeatRequest(host_id="h1"), timeout=10)
    assert list(reply.active_leases) == [lease.lease_id]
    # Heartbeat usage and sessions are shown as reported.
    report = pool_pb2.PoolDevice(index=0, memory_used=3 * GiB, utilization=0.75, sessions=[
        pool_pb2.PoolSession(session_id="s1", lease_id=lease.lease_id, client_name="train.py", memory_used=3 * GiB)])
    pool.stub.Heartbeat(pool_pb2.HeartbeatRequest(host_id="h1", devices=[report]), timeout=10)
    shown = pool.status().hosts[1].devices[0]
    assert (shown.memory_used, shown.utilization, shown.sessions[0].client_name) == (3 * GiB, 0.75, "train.py")
    assert shown.memory_total == DEVICE_MEMORY


def test_a_silent_host_is_stale_gets_no_new_work_and_keeps_its_leases(pools):
    pool = pools(env={"GPUREMOTE_POOL_STALE_AFTER_S": "1"})
    register(pool, "quiet")
    register(pool, "chatty", port=7201)
    lease = allocate(pool, filters=["host=quiet"])
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        pool.stub.Heartbeat(pool_pb2.HeartbeatRequest(host_id="chatty"), timeout=10)
        time.sleep(0.1)
    status = pool.status()
    assert {h.host_id: h.stale for h in status.hosts} == {"quiet": True, "chatty": False}
    assert [h.last_seen_s > 1 for h in status.hosts] == [False, True]
    assert [lease.lease_id for lease in status.leases] == [lease.lease_id]
    refused(lambda: allocate(pool, fraction=0.1, filters=["host=quiet"]), grpc.StatusCode.FAILED_PRECONDITION,
            "no device matches the filters host=quiet", "chatty")
    pool.stub.Heartbeat(pool_pb2.HeartbeatRequest(host_id="quiet"), timeout=10)
    assert places(allocate(pool, fraction=0.1, filters=["host=quiet"])) == [("quiet", 1)]


def deregister(pool: PoolProcess, host_id: str) -> bool:
    return pool.stub.Deregister(pool_pb2.DeregisterRequest(host_id=host_id), timeout=10).known


def test_a_deregistered_host_gets_no_new_work_keeps_its_leases_and_may_come_back(pools):
    pool = pools()
    register(pool, "leaving")
    register(pool, "staying", n=1, port=7201)
    kept = allocate(pool, count=2, filters=["host=leaving"])          # both of leaving's devices
    filler = allocate(pool, filters=["host=staying"])
    waiter = pool.stub.Allocate.future(pool_pb2.AllocateRequest(count=1, whole=True, filters=["host=leaving"],
                                                                wait_s=20), timeout=30)
    wait_until(lambda: pool.status().waiting == 1)
    started = time.monotonic()
    assert deregister(pool, "leaving")
    # The waiter only that host could serve is told at once, not at the end of its wait.
    with pytest.raises(grpc.RpcError) as info:
        waiter.result(timeout=10)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "no device matches the filters host=leaving" in info.value.details()
    assert time.monotonic() - started < 5
    status = pool.status()
    assert ([h.host_id for h in status.hosts], status.waiting) == (["staying"], 0)
    assert [lease.lease_id for lease in status.leases] == [kept.lease_id, filler.lease_id]
    assert not pool.stub.Heartbeat(pool_pb2.HeartbeatRequest(host_id="leaving"), timeout=10).known
    # Its leases stay renewable; new work goes elsewhere or waits.
    assert places(renew(pool, kept)) == places(kept)
    refused(lambda: allocate(pool, fraction=0.5), grpc.StatusCode.RESOURCE_EXHAUSTED, "no capacity is free now")
    release(pool, filler)
    assert places(allocate(pool, fraction=0.5)) == [("staying", 0)]
    # Idempotent, and checked like Register's host_id.
    assert not deregister(pool, "leaving") and not deregister(pool, "never-registered")
    refused(lambda: deregister(pool, ""), grpc.StatusCode.INVALID_ARGUMENT, "host_id is empty")
    refused(lambda: deregister(pool, "x" * 300), grpc.StatusCode.INVALID_ARGUMENT, "300 characters")
    # Forgotten on disk too: a restarted pool does not bring it back.
    pool.kill()
    pool = pools()
    assert [h.host_id for h in pool.status().hosts] == ["staying"]
    # Registering again brings it back, and the lease it still carries counts again.
    register(pool, "leaving")
    assert [h.host_id for h in pool.status().hosts] == ["leaving", "staying"]
    refused(lambda: allocate(pool, fraction=0.1, filters=["host=leaving"]), grpc.StatusCode.RESOURCE_EXHAUSTED,
            "no capacity is free now")
    release(pool, kept)
    assert places(allocate(pool, fraction=0.1, filters=["host=leaving"])) == [("leaving", 0)]


def test_policy_and_oversubscription_flags_reach_placement(pools, tmp_path):
    spread = pools("--policy", "spread", "--oversubscribe-compute", state=tmp_path / "spread.db")
    packed = pools(state=tmp_path / "pack.db")
    for pool in (spread, packed):
        register(pool, "h", n=1)
        register(pool, "g", n=1, port=7201)
    assert places(allocate(spread, fraction=0.25)) != places(allocate(spread, fraction=0.25))
    assert places(allocate(packed, fraction=0.25)) == places(allocate(packed, fraction=0.25))
    # h's device comes back with twice the memory: half its compute is leased, a quarter of its memory.
    for pool in (spread, packed):
        allocate(pool, fraction=0.5, filters=["host=h"])
        pool.stub.Register(pool_pb2.RegisterRequest(host_id="h", address="127.0.0.1:7200", backend="emulated",
                                                    devices=devices(1, memory=16 * GiB)), timeout=10)
    assert places(allocate(spread, memory=10 * GiB, filters=["host=h"])) == [("h", 0)]
    refused(lambda: allocate(packed, memory=10 * GiB, filters=["host=h"]), grpc.StatusCode.RESOURCE_EXHAUSTED,
            "no capacity is free now")


# --- bad input ---

def snapshot(pool: PoolProcess):
    """The Status facts a refused call must not change."""
    status = pool.status()
    return ([(h.host_id, h.address, h.backend, [(d.index, d.name, d.memory_total, d.memory_used) for d in h.devices])
             for h in status.hosts],
            [(lease.lease_id, list(lease.grants)) for lease in status.leases], status.waiting)


def bad_registrations():
    dev = pool_pb2.PoolDevice
    ok = dict(host_id="h0", address="127.0.0.1:7200", backend="emulated")
    return [
        (dict(ok, devices=[dev(index=0, memory_total=0)]), "memory_total of 0 bytes is not a real device's"),
        (dict(ok, devices=[dev(index=0, memory_total=2**64 - 1)]), "is not a real device's"),
        (dict(ok, devices=[dev(index=1, memory_total=GiB), dev(index=1, memory_total=GiB)]),
         "indices [1, 1]: each index must appear once"),
        (dict(ok, devices=[dev(index=0, memory_total=GiB, memory_used=2 * GiB)]), "more than its"),
        (dict(ok, devices=[dev(index=0, memory_total=GiB, utilization=-0.5)]), "utilization -0.5 is not in [0, 1]"),
        (dict(ok, devices=[dev(index=0, memory_total=GiB, utilization=float("nan"))]), "utilization nan"),
        (dict(ok, devices=[]), "registers 0 devices"),
        (dict(ok, devices=devices(65)), "registers 65 devices"),
        (dict(ok, address="nowhere", devices=devices(1)), "'nowhere' is not HOST:PORT"),
        (dict(ok, host_id="", address="", devices=devices(1)), "daemon address is empty"),
        (dict(ok, backend="", devices=devices(1)), "backend is empty"),
        (dict(ok, host_id="x" * 300, devices=devices(1)), "300 characters"),
    ]


def test_bad_input_is_refused_clearly_and_changes_nothing(pools):
    pool = pools()
    three_hosts(pool)
    lease = allocate(pool, fraction=0.5)
    before = snapshot(pool)
    invalid, exhausted = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION
    for lease_id in ("no-such-lease", ""):
        unknown = pool_pb2.AllocateReply(lease_id=lease_id, lease_secret=lease.lease_secret)
        refused(lambda: renew(pool, unknown), grpc.StatusCode.NOT_FOUND, "unknown or has expired")
        refused(lambda: release(pool, unknown), grpc.StatusCode.NOT_FOUND, "unknown", "never granted")
    for p in (0.0, -0.5, 1.5, float("nan")):
        refused(lambda: allocate(pool, fraction=p), invalid, "is not in (0, 1]", "such as 0.25")
    refused(lambda: allocate(pool, memory=9 * GiB), exhausted, "more than any device has", "8.00 GiB",
            "ask for at most")
    refused(lambda: allocate(pool, count=7), exhausted, "7 devices asked for", "only 6", "ask for at most 6")
    refused(lambda: allocate(pool, count=0), invalid, "ask for at least 1 device")
    refused(lambda: pool.stub.Allocate(pool_pb2.AllocateRequest(count=1), timeout=10), invalid, "no size given")
    refused(lambda: allocate(pool, whole=False), invalid, "whole=false is not a size")
    refused(lambda: allocate(pool, filters=["gpu=fast"]), invalid, "malformed filter 'gpu=fast'", "host=NAME")
    refused(lambda: allocate(pool, filters=["device.name=H100"]), exhausted, "no device matches", "Emulated 0")
    refused(lambda: allocate(pool, filters=["host=h0"] * 40), invalid, "40 filters given")
    refused(lambda: allocate(pool, wait_s=-1), invalid, "wait_s -1")
    for fields, hint in bad_registrations():
        refused(lambda: pool.stub.Register(pool_pb2.RegisterRequest(**fields), timeout=10), invalid, hint)
    refused(lambda: pool.stub.Heartbeat(pool_pb2.HeartbeatRequest(host_id="h0", devices=[
        pool_pb2.PoolDevice(index=0, memory_used=GiB), pool_pb2.PoolDevice(index=9)]), timeout=10),
        invalid, "device 9, which it did not register")
    refused(lambda: pool.stub.Heartbeat(pool_pb2.HeartbeatRequest(host_id="h0", devices=[
        pool_pb2.PoolDevice(index=0, memory_used=9 * GiB)]), timeout=10), invalid, "more than its")
    assert snapshot(pool) == before
    release(pool, lease)


# --- in-process server ---

def test_in_process_server_stops_promptly_and_tells_waiters():
    from gpuremote.pool.server import PoolServer
    server = PoolServer("127.0.0.1:0", ":memory:", lease_ttl=30).start()
    with grpc.insecure_channel(server.address) as channel:
        stub = pool_pb2_grpc.PoolStub(channel)
        stub.Register(pool_pb2.RegisterRequest(host_id="h", address="127.0.0.1:7200", backend="emulated",
                                               devices=devices(1)), timeout=10)
        stub.Allocate(pool_pb2.AllocateRequest(count=1, whole=True), timeout=10)
        waiter = stub.Allocate.future(pool_pb2.AllocateRequest(count=1, whole=True, wait_s=30), timeout=30)
        wait_until(lambda: stub.Status(pool_pb2.StatusRequest(), timeout=10).waiting == 1)
        started = time.monotonic()
        server.stop(grace=5)
        assert time.monotonic() - started < 3
        with pytest.raises(grpc.RpcError) as info:
            waiter.result(timeout=10)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "shutting down" in info.value.details()
