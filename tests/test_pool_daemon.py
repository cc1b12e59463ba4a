"""Daemons in a pool: registration, heartbeats, grant enforcement, lease revocation, restarts, metrics.

A real pool (policy spread, lease TTL 10 s) and two real `gpuremote daemon --pool` processes on
loopback; clients are this process's own sessions (real gRPC) presenting grants the pool gave
or grants minted with the pool's key (read from its SQLite state file) for the refusal cases.
"""

from __future__ import annotations

import contextlib
import signal
import re
import subprocess
import time
import urllib.request

import grpc
import pytest

from cluster import GPUREMOTE, GiB, Cluster, Procs, grant_key, info, ready, wait_until
from gpuremote.client.session import Session
from gpuremote.errors import DeviceLostError, GrantError, OutOfMemoryError, ProtocolError
from gpuremote.v1 import pool_pb2
from gpuremote.wire import grants

TTL = 10.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    procs = Procs(tmp_path_factory.mktemp("pool_daemon"))
    try:
        c = Cluster(procs, hosts=2, pool_args=("--policy", "spread", "--lease-ttl", str(TTL), "--metrics-port", "0"),
                    daemon_args=("--metrics-port", "0"))
        yield c
        c.close()
    finally:
        procs.stop_all()


def allocate(cluster, count=1, filters=(), **size) -> pool_pb2.AllocateReply:
    size = size or {"whole": True}
    return cluster.stub.Allocate(pool_pb2.AllocateRequest(count=count, filters=list(filters), client_name="test",
                                                          **size), timeout=30)


def release(cluster, lease) -> None:
    cluster.stub.Release(pool_pb2.ReleaseRequest(lease_id=lease.lease_id, lease_secret=lease.lease_secret),
                         timeout=10)


def renew(cluster, lease) -> pool_pb2.RenewReply:
    return cluster.stub.Renew(pool_pb2.RenewRequest(lease_id=lease.lease_id, lease_secret=lease.lease_secret),
                              timeout=10)


def grant_of(signed) -> pool_pb2.Grant:
    return pool_pb2.Grant.FromString(signed.grant)


def session(address, signed=(), **kwargs) -> Session:
    return Session(address, client_name="pytest", grants=list(signed), **kwargs)


@contextlib.contextmanager
def granted(address, signed, sessions: int = 1):
    """gpuremote.cupy on `sessions` sessions of the daemon at `address` opened with `signed` grants
    (cupy.cuda.Device(i) is the i-th session's first granted device)."""
    import gpuremote
    import gpuremote.cupy as cp
    gpuremote.disconnect()
    try:
        for _ in range(sessions):
            gpuremote.connect(address, grants=list(signed))
        yield cp
    finally:
        gpuremote.disconnect()


def test_daemons_register_and_heartbeat_their_devices(cluster):
    status = cluster.status()
    assert [h.host_id for h in status.hosts] == ["h0", "h1"]
    for h, d in zip(status.hosts, cluster.daemons):
        assert h.address == d.address and h.backend == "emulated" and not h.stale
        assert [(x.index, x.memory_total) for x in h.devices] == [(0, 8 * GiB), (1, 8 * GiB)]
        assert h.last_seen_s < TTL / 3 + 1          # heartbeats every TTL/3


def test_spread_placement_uses_the_emptiest_devices(cluster):
    leases = [allocate(cluster, fraction=0.25) for _ in range(4)]
    places = [(grant_of(s).host_id, grant_of(s).device) for lease in leases for s in lease.grants]
    assert len(set(places)) == 4, places                    # spread: one per device while any is empty
    for lease in leases:
        release(cluster, lease)


def test_a_pool_daemon_refuses_sessions_without_valid_grants(cluster):
    h0, h1 = cluster.daemons
    with pytest.raises(ProtocolError, match="needs grants from it.*gpuremote run --pool"):
        session(h0.address)
    key = grant_key(cluster.state)
    now = time.time()

    def minted(**fields):
        g = dict(lease_id="f" * 32, host_id="h0", address=h0.address, device=0, memory_limit=GiB,
                 compute_share=0.5, expires_at=now + 60, nonce=b"n" * 16)
        g.update(fields)
        return grants.sign(pool_pb2.Grant(**g), key)

    forged = minted()
    forged.signature = bytes(32)
    with pytest.raises(GrantError, match="signature does not match"):
        session(h0.address, [forged])
    other_key = grants.sign(grant_of(minted()), b"k" * 32)
    with pytest.raises(GrantError, match="signature does not match"):
        session(h0.address, [other_key])
    with pytest.raises(GrantError, match="expired"):
        session(h0.address, [minted(expires_at=now - 5)])
    with pytest.raises(GrantError, match="is for host 'h1'.*present it to the daemon at"):
        session(h0.address, [minted(host_id="h1", address=h1.address)])
    with pytest.raises(GrantError, match="device 7, which this daemon does not have"):
        session(h0.address, [minted(device=7)])
    with pytest.raises(ProtocolError, match="two grants for device 0"):
        session(h0.address, [minted(), minted()])
    with pytest.raises(ProtocolError, match="different leases"):
        session(h0.address, [minted(), minted(device=1, lease_id="e" * 32)])
    # A grant minted with the real key is honoured: the daemon trusts the pool's signature alone.
    s = session(h0.address, [minted()])
    assert [d.index for d in s.devices] == [0] and s.devices[0].memory_total == GiB
    s.close()
    # Nothing was left behind by the refused sessions.
    assert not info(h0.address).sessions


def test_standalone_daemon_serves_without_grants_and_refuses_grants(daemon, cluster):
    s = session(daemon.address)           # the conftest daemon: no --pool
    assert len(s.devices) == 2
    s.close()
    lease = allocate(cluster, filters=["host=h0"], fraction=0.25)
    with pytest.raises(ProtocolError, match="not part of a pool and cannot check them"):
        session(daemon.address, lease.grants)
    release(cluster, lease)


def test_only_granted_devices_and_the_lease_memory_limit(cluster):
    lease = allocate(cluster, filters=["host=h1"], memory=GiB)
    g = grant_of(lease.grants[0])
    address, device, other = g.address, g.device, 1 - g.device
    # A raw session: an op on the device the grant does not cover is refused clearly.
    s = session(address, lease.grants)
    assert [d.index for d in s.devices] == [device]
    s.call("ones", (8,), {}, (1,), other, 0, "test.py:1")
    with pytest.raises(GrantError, match=f"device {other} is not granted to this session"):
        s.request(lambda op: op.sync.SetInParent(), other)
    s.close()
    # Asking for that device by index through the client API: refused before any op.
    import gpuremote
    from gpuremote.client import context
    with pytest.raises(GrantError, match=f"device {other} of the daemon at .* is not granted"):
        context.connect(address, [other], grants=list(lease.grants))
    gpuremote.disconnect()
    n = 300 * 2**20 // 8
    with granted(address, lease.grants, sessions=2) as cp:
        # 3 x 300 MiB fit in the 1 GiB grant; the 4th would pass it: OutOfMemoryError, nothing allocated.
        held = [cp.ones(n) for _ in range(3)]
        assert float(held[0].sum()) == n
        with pytest.raises(OutOfMemoryError, match="limit of lease"):
            float(cp.ones(n).sum())
        free, limit = cp.cuda.runtime.memGetInfo()
        assert limit == GiB and GiB - 3 * n * 8 - 1024 <= free <= GiB - 3 * n * 8
        # The second session of the same lease (as a child process would open) shares the limit.
        with cp.cuda.Device(1):
            with pytest.raises(OutOfMemoryError, match="limit of lease"):
                float(cp.ones(n).sum())
            assert float(cp.ones(n // 4).sum()) == n // 4
        assert float((held[1][:1000] * 2).sum()) == 2000     # the first session keeps working
        del held[2]                  # the client sends a release with its next batch: sync once first
        cp.cuda.Device().synchronize()
        assert float(cp.ones(n).sum()) == n                  # room again once an array is freed
    release(cluster, lease)
    wait_until(lambda: all(d.memory_used == 0 for d in info(address).devices), 10, "memory freed")


def test_a_released_lease_closes_its_sessions_and_refuses_its_grants(cluster):
    lease = allocate(cluster, filters=["host=h0"], fraction=0.5)
    address = grant_of(lease.grants[0]).address
    with granted(address, lease.grants) as cp:
        x = cp.ones(2**20)
        assert float(x.sum()) == 2**20
        assert [s.lease_id for s in info(address).sessions] == [lease.lease_id]
        release(cluster, lease)
        # Within a heartbeat (TTL/3) the daemon closes the session and frees its memory.
        wait_until(lambda: not info(address).sessions, TTL / 3 + 3, "session closed")
        assert all(d.memory_used == 0 for d in info(address).devices)
        with pytest.raises(DeviceLostError):
            float(x.sum())
    with pytest.raises(GrantError, match="released or has expired"):
        session(address, lease.grants)


def test_metrics_of_pool_and_daemons(cluster):
    lease = allocate(cluster, filters=["host=h1"], fraction=0.5)
    g = grant_of(lease.grants[0])
    with granted(g.address, lease.grants) as cp:
        x = cp.asarray([1.0, 2.0, 3.0]) * 2
        assert float(x.sum()) == 12.0
        daemon = cluster.daemon("h1")
        port = int(re.search(r"metrics on http://\S+:(\d+)/metrics", daemon.output()).group(1))
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()

        def value(name, labels):
            m = re.search(re.escape(name + "{" + labels + "}") + r" (\S+)", text)
            assert m, (name, labels, text)
            return float(m.group(1))
        dev = f'component="daemon",device="{g.device}",host="h1"'
        assert value("gpuremote_device_memory_total_bytes", dev) == 8 * GiB
        assert value("gpuremote_device_memory_used_bytes", dev) >= 24
        assert 0 <= value("gpuremote_device_utilization", dev) <= 1
        assert value("gpuremote_sessions", 'component="daemon",host="h1"') == 1
        assert value("gpuremote_ops_total", 'component="daemon",host="h1"') >= 3
        assert value("gpuremote_bytes_total", 'component="daemon",direction="h2d",host="h1"') >= 24
        assert value("gpuremote_bytes_total", 'component="daemon",direction="d2h",host="h1"') >= 8
    pool_port = int(re.search(r"metrics on http://\S+:(\d+)/metrics", cluster.pool.output()).group(1))
    text = urllib.request.urlopen(f"http://127.0.0.1:{pool_port}/metrics", timeout=10).read().decode()
    assert re.search(r'gpuremote_leases\{component="pool"\} [1-9]', text)
    assert 'gpuremote_pool_waiting_requests{component="pool"} 0.0' in text
    assert 'gpuremote_device_memory_total_bytes{component="pool",device="0",host="h0"} 8.589934592e+09' in text
    assert 'gpuremote_pool_hosts{component="pool",stale="false"} 2.0' in text
    release(cluster, lease)


def test_pool_sigkill_and_restart_keeps_leases_and_daemons_reregister(cluster):
    leases = [allocate(cluster, fraction=0.5, filters=["host=h0"]), allocate(cluster, count=2, memory=2 * GiB)]
    g = grant_of(leases[0].grants[0])
    with granted(g.address, leases[0].grants) as cp:      # a session open across the restart
        x = cp.arange(1000)
        assert int(x.sum()) == 499500
        before = {lease.lease_id: list(lease.grants) for lease in cluster.status().leases}
        registered = [len(re.findall("registered with the pool", d.output())) for d in cluster.daemons]
        cluster.restart_pool("--policy", "spread", "--lease-ttl", str(TTL))
        after = cluster.status()
        assert {lease.lease_id: list(lease.grants) for lease in after.leases} == before
        for lease in leases:
            renewed = renew(cluster, lease)
            assert renewed.expires_at > lease.expires_at
        # The daemons noticed the pool went away and registered again by themselves.
        for d, n in zip(cluster.daemons, registered):
            d.expect("registered with the pool", timeout=15, count=n + 1)
        wait_until(lambda: all(h.last_seen_s < 2 and not h.stale for h in cluster.status().hosts), 10,
                   "heartbeats")
        # The open session was not cut (its lease lives), and the renewed grants open new sessions.
        assert int(x.sum()) == 499500
        renewed = renew(cluster, leases[0])
        session(g.address, renewed.grants).close()
    for lease in leases:
        release(cluster, lease)


def test_a_restarted_daemon_reregisters(cluster):
    old = cluster.daemon("h1")
    lease = allocate(cluster, filters=["host=h1"], fraction=0.25)
    old.kill()
    new = cluster.procs.daemon(cluster.address, "h1", "--metrics-port", "0")
    cluster.daemons[cluster.daemons.index(old)] = new
    ready(new)
    wait_until(lambda: next(h for h in cluster.status().hosts if h.host_id == "h1").address == new.address,
               10, "new address registered")
    h1 = next(h for h in cluster.status().hosts if h.host_id == "h1")
    assert not h1.stale and [d.memory_used for d in h1.devices] == [0, 0]
    assert lease.lease_id in [x.lease_id for x in cluster.status().leases]   # the pool keeps the host's leases
    release(cluster, lease)


def test_a_pool_restarted_without_its_state_gets_its_daemons_back(cluster, tmp_path):
    lease = allocate(cluster, filters=["host=h0"], fraction=0.5)
    g = grant_of(lease.grants[0])
    with granted(g.address, lease.grants) as cp:
        x = cp.ones(1000)
        assert float(x.sum()) == 1000
        registered = [len(re.findall("registered with the pool", d.output())) for d in cluster.daemons]
        cluster.state = tmp_path / "fresh.db"          # a new pool: no hosts, no leases, a new grant key
        cluster.restart_pool("--policy", "spread", "--lease-ttl", str(TTL))
        for d, n in zip(cluster.daemons, registered):  # heartbeat answered known=false (or the connection broke)
            d.expect("registered with the pool", timeout=15, count=n + 1)
        wait_until(lambda: len(cluster.status().hosts) == 2, 10, "hosts back")
        # The old lease is unknown to the new pool: its session is closed and its memory freed.
        wait_until(lambda: not info(g.address).sessions, TTL / 3 + 3, "old session closed")
        with pytest.raises(DeviceLostError):
            float(x.sum())
    with pytest.raises(GrantError, match="signature does not match"):
        session(g.address, lease.grants)               # signed with the old key
    fresh = allocate(cluster, filters=["host=h0"], fraction=0.5)
    session(grant_of(fresh.grants[0]).address, fresh.grants).close()
    release(cluster, fresh)


@pytest.mark.parametrize("args,hint", [
    (["--advertise", "10.0.0.1:7200"], "only apply with --pool"),
    (["--host-id", "x"], "only apply with --pool"),
    (["--pool", "nonsense"], "is not HOST:PORT"),
    (["--pool", "127.0.0.1:1", "--advertise", "0.0.0.0"], "not an address clients can reach"),
    (["--pool", "127.0.0.1:1", "--host-id", ""], "1 to 256 printable characters"),
    (["--metrics-port", "70000"], "70000"),
])
def test_bad_daemon_flags(args, hint):
    got = subprocess.run([*GPUREMOTE, "daemon", "--insecure", "--listen", "127.0.0.1:0", "--backend", "emulated",
                          *args], capture_output=True, text=True, timeout=60)
    assert got.returncode == 2, (got.stdout, got.stderr)
    assert hint in got.stderr


def test_sigterm_leaves_the_pool_and_drains_the_granted_session(cluster):
    """A daemon shutting down deregisters at once (the pool places nothing more on it), lets the open
    session work until its --drain-timeout, then ends it; the lease itself stays the client's."""
    extra = cluster.procs.daemon(cluster.address, "h-draining", "--drain-timeout", "3", devices=1)
    ready(extra)
    wait_until(lambda: "h-draining" in [h.host_id for h in cluster.status().hosts], 20, "h-draining registered")
    lease = allocate(cluster, filters=["host=h-draining"])
    try:
        with granted(extra.address, lease.grants) as cp:
            x = cp.arange(10)
            assert int(x.sum()) == 45
            extra.proc.send_signal(signal.SIGTERM)
            wait_until(lambda: "h-draining" not in [h.host_id for h in cluster.status().hosts], 10,
                       "the draining host left the pool")
            assert info(extra.address).draining
            assert int(x.sum()) == 45                          # still served during the drain
            with pytest.raises(grpc.RpcError) as refused:
                allocate(cluster, filters=["host=h-draining"], whole=True, wait_s=0)
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION, refused.value
            assert extra.wait(timeout=20) == 0
            with pytest.raises(DeviceLostError, match="shut down after a 3 s drain|lost the connection"):
                int(x.sum())
        assert "ended 1 session(s) still open at the deadline" in extra.output()
        renew(cluster, lease)                                  # the lease outlives its daemon
    finally:
        release(cluster, lease)
