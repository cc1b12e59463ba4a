"""`gpuremote run --pool` on a multi-host pool: placement, capacity, queueing, limits, shares, crashes, smi.

A real pool (policy pack, lease TTL 3 s) and three real daemons (emulated, 2 x 8 GiB each) on
loopback ports picked at run time; every command runs under a real `gpuremote run --pool`
wrapper. Every process is stopped at the end; every wait is bounded.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from cluster import GPUREMOTE, GiB, Cluster, Procs, free_port, info, smi_json, wait_until
from gpuremote.daemon.pool_agent import shown_on
from gpuremote.v1 import pool_pb2

TTL = 3.0
PY = sys.executable


@pytest.fixture(scope="module")
def procs(tmp_path_factory):
    p = Procs(tmp_path_factory.mktemp("pool_run"))
    yield p
    p.stop_all()


@pytest.fixture(scope="module")
def cluster(procs):
    c = Cluster(procs, hosts=3, pool_args=("--lease-ttl", str(TTL)))
    yield c
    c.close()


@pytest.fixture(scope="module")
def scripts(procs):
    """name -> path of the little programs the runs execute."""
    bodies = {
        # hold.py SECONDS MIB: MIB on each device, report devices and memory sizes, hold, exit.
        "hold": """
            import json, os, sys, time, cupy
            arrays, totals = [], []
            for i in range(cupy.cuda.runtime.getDeviceCount()):
                with cupy.cuda.Device(i):
                    arrays.append(cupy.ones(int(sys.argv[2]) * 2**20 // 8))
                    assert float(arrays[-1][:10].sum()) == 10
                    totals.append(cupy.cuda.runtime.memGetInfo()[1])
            print("READY " + json.dumps({"devices": os.environ["GPUREMOTE_DEVICES"].split(","), "totals": totals,
                                         "pid": os.getpid(), "t": time.time()}), flush=True)
            time.sleep(float(sys.argv[1]))
        """,
        # share.py GO_FILE SECONDS: when GO_FILE appears (it holds the start time), run matmuls until
        # start + SECONDS and print how many finished.
        "share": """
            import os, sys, time, cupy
            a = cupy.random.rand(160, 160)
            float((a @ a)[0, 0])
            print("READY", flush=True)
            deadline = time.monotonic() + 60
            while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
                time.sleep(0.005)
            start = float(open(sys.argv[1]).read())
            while time.time() < start:
                time.sleep(0.001)
            end, n = start + float(sys.argv[2]), 0
            while time.time() < end:
                float((a @ a)[0, 0])
                n += 1
            print("COUNT", n, os.environ["GPUREMOTE_DEVICES"], flush=True)
        """,
        # limit.py: 600 MiB here; a child process of the same lease gets no more than the rest of 1 GiB.
        "limit": """
            import subprocess, sys, cupy
            MiB = 2**20
            x = cupy.ones(600 * MiB // 8)
            assert float(x[:4].sum()) == 4
            child = '''
            import cupy
            try:
                float(cupy.ones(600 * 2**20 // 8).sum())
                print("CHILD no error")
            except cupy.cuda.memory.OutOfMemoryError as e:
                print("CHILD OOM", "limit of lease" in str(e))
            print("CHILD small", float(cupy.ones(300 * 2**20 // 8)[:3].sum()))
            '''
            r = subprocess.run([sys.executable, "-c", child.replace(chr(10) + "            ", chr(10))],
                               capture_output=True, text=True)
            print(r.stdout.strip(), r.stderr.strip()[-500:])
            import multiprocessing as mp        # a forked worker reconnects with the lease's grants too
            def work(q):
                q.put(float(cupy.ones(300 * MiB // 8)[:5].sum()))
            ctx = mp.get_context("fork")
            q = ctx.Queue()
            p = ctx.Process(target=work, args=(q,))
            p.start()
            print("FORK", q.get(timeout=60))
            p.join(30)
            try:
                y = cupy.ones(500 * MiB // 8)
                float(y[:1].sum())
                print("PARENT no error")
            except cupy.cuda.memory.OutOfMemoryError as e:
                print("PARENT OOM", "limit of lease" in str(e), "issued at" in str(e))
            print("PARENT keeps working", float((x[:1000] * 3).sum()), cupy.cuda.runtime.memGetInfo()[1])
        """,
        "crash": """
            import os, sys, cupy
            x = cupy.ones(1000)
            float(x.sum())
            if sys.argv[1] == "kill":
                os.kill(os.getpid(), 9)
            sys.exit(3)
        """,
    }
    paths = {}
    for name, body in bodies.items():
        path = procs.tmp / f"{name}.py"
        path.write_text(textwrap.dedent(body))
        paths[name] = str(path)
    return paths


def report(run) -> dict:
    return json.loads(run.expect(r"READY (.*)", timeout=60).group(1))


def assert_idle(cluster, timeout: float = 10.0) -> None:
    """No lease in the pool, no session or byte held on any daemon (bounded wait)."""
    def idle():
        if cluster.status().leases:
            return False
        return all(not (i := info(d.address)).sessions and all(x.memory_used == 0 for x in i.devices)
                   for d in cluster.daemons)
    wait_until(idle, timeout, "pool and daemons idle")


class CapacityWatch:
    """Polls the pool while runs go on; records any device granted past its capacity."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.errors: list[str] = []
        self.samples = 0
        self.most_leases = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(0.05):
            status = self.cluster.status()
            totals = {(h.host_id, d.index): d.memory_total for h in status.hosts for d in h.devices}
            use: dict = {}
            for lease in status.leases:
                for g in lease.grants:
                    u = use.setdefault((g.host_id, g.device), [0, 0.0, 0, False])
                    u[0] += g.memory_limit
                    u[1] += g.compute_share
                    u[2] += 1
                    u[3] |= g.memory_limit == totals[(g.host_id, g.device)] and g.compute_share == 1
            for key, (memory, share, count, whole) in use.items():
                if memory > totals[key] or share > 1 + 1e-9 or (whole and count > 1):
                    self.errors.append(f"{key}: {memory} bytes, share {share}, {count} grants, whole={whole}")
            self.samples += 1
            self.most_leases = max(self.most_leases, len(status.leases))

    def stop(self):
        self._stop.set()
        self._thread.join(10)


def test_concurrent_runs_never_exceed_capacity(cluster, procs, scripts):
    sizes = [["-n", "2"], ["-p", "0.5"], ["-n", "3"], ["-p", "0.25"], ["-m", "2GiB"], ["-n", "2", "-p", "0.5"],
             ["-m", "4GiB"], ["-p", "0.75"]]
    watch = CapacityWatch(cluster)
    try:
        runs = [procs.run(cluster.address, *size, "--wait", "60", command=[PY, scripts["hold"], "0.5", "64"])
                for size in sizes]
        codes = [r.wait(timeout=90) for r in runs]
    finally:
        watch.stop()
    assert codes == [0] * len(runs), [r.output()[-800:] for r, c in zip(runs, codes) if c]
    assert not watch.errors, watch.errors[:5]
    assert watch.samples > 10 and watch.most_leases >= 4      # they really overlapped
    for size, run in zip(sizes, runs):
        got = report(run)
        count = int(size[size.index("-n") + 1]) if "-n" in size else 1
        assert len(got["devices"]) == len(set(got["devices"])) == count
        if "-m" in size:
            want = int(size[size.index("-m") + 1].removesuffix("GiB")) * GiB
        elif "-p" in size:
            want = int(float(size[size.index("-p") + 1]) * 8 * GiB)
        else:
            want = 8 * GiB
        assert got["totals"] == [want] * count, (size, got)
    assert_idle(cluster)


def test_pack_places_shares_together_and_waiters_are_served_in_order(cluster, procs, scripts, tmp_path):
    from gpuremote.pool.client import Lease, PoolClient
    # pack: two halves share one device (h1's first), leaving whole devices free.
    a = procs.run(cluster.address, "-p", "0.5", "--filter", "host=h1", command=[PY, scripts["hold"], "2", "8"])
    first = report(a)["devices"]
    b = procs.run(cluster.address, "-p", "0.5", "--filter", "host=h1", command=[PY, scripts["hold"], "0", "8"])
    assert report(b)["devices"] == first and first[0].endswith("/0")
    assert a.wait(30) == 0 and b.wait(30) == 0
    # Every device taken by whole leases this process holds (renewed by their keepers).
    client = PoolClient(cluster.address)
    held = [Lease.allocate(client, pool_pb2.AllocateRequest(count=1, whole=True, client_name="filler"))
            for _ in range(6)]
    try:
        w1 = procs.run(cluster.address, "--wait", "30", command=[PY, scripts["hold"], "0.5", "1"])
        wait_until(lambda: cluster.status().waiting == 1, 30, "first waiter queued")
        w2 = procs.run(cluster.address, "--wait", "30", command=[PY, scripts["hold"], "0", "1"])
        wait_until(lambda: cluster.status().waiting == 2, 30, "second waiter queued")
        # A newcomer with --wait 0 is refused at once, clearly, and does not overtake the queue.
        refused = subprocess.run([*GPUREMOTE, "run", "--pool", cluster.address, "-p", "0.1", "--", "true"],
                                 capture_output=True, text=True, timeout=60)
        assert refused.returncode == 1
        assert "not enough free capacity" in refused.stderr and "waiting ahead" in refused.stderr
        held.pop().release()                      # one device frees: the first waiter gets it
        t1 = report(w1)["t"]
        assert cluster.status().waiting == 1
        assert w1.wait(30) == 0                   # ... and gives it back at its end, to the second
        t2 = report(w2)["t"]
        assert t1 < t2 and w2.wait(30) == 0
    finally:
        for lease in held:
            lease.release()
        client.close()
    assert_idle(cluster)


def test_a_lease_is_renewed_and_released_only_by_its_holder(cluster):
    from gpuremote.client import grants as grant_env
    from gpuremote.pool.client import Lease, PoolClient, PoolError
    client, other = PoolClient(cluster.address), PoolClient(cluster.address)
    lease = Lease.allocate(client, pool_pb2.AllocateRequest(count=1, fraction=0.25, client_name="holder"))
    try:
        # The secret stays in the holder: the command's grants (environment, file) do not carry it.
        shared = b"".join(s.SerializeToString() for s in grant_env.decode(lease.env()[grant_env.GRANTS_ENV]))
        with open(lease.grants_file) as f:
            shared += b"".join(s.SerializeToString() for s in grant_env.decode(f.read()))
        assert len(lease._secret) == 32 and lease._secret not in shared
        # Another client who read the lease id from Status cannot end or keep it.
        (seen,) = [x.lease_id for x in other.status().leases if x.client_name == "holder"]
        for call in (other.release, other.renew):
            with pytest.raises(PoolError, match="lease secret is missing or wrong") as info_:
                call(seen, b"")
            assert info_.value.code.name == "PERMISSION_DENIED"
        wait_until(lambda: lease.keeper.renewals >= 2, 3 * TTL, "renewals with the secret")
        assert lease.keeper.lost is None
    finally:
        lease.release()
        client.close()
        other.close()
    assert_idle(cluster)


def test_lease_memory_limit_holds_across_the_commands_processes(cluster, procs, scripts):
    run = procs.run(cluster.address, "-m", "1GiB", command=[PY, scripts["limit"]])
    assert run.wait(60) == 0, run.output()
    out = run.output()
    assert "CHILD OOM True" in out and "CHILD small 3.0" in out and "FORK 5.0" in out, out
    assert "PARENT OOM True True" in out, out
    assert f"PARENT keeps working 3000.0 {GiB}" in out, out
    assert_idle(cluster)


def test_two_half_shares_split_a_busy_device(cluster, procs, scripts, tmp_path):
    go = tmp_path / "go"
    runs = [procs.run(cluster.address, "-p", "0.5", "--filter", "host=h2", command=[PY, scripts["share"], str(go), "2.5"])
            for _ in range(2)]
    for r in runs:
        r.expect("READY", timeout=60)
    ready = tmp_path / "go.tmp"
    ready.write_text(str(time.time() + 0.3))
    ready.rename(go)            # at once: a script polling for the file never reads it half-written
    results = [r.expect(r"COUNT (\d+) (\S+)", timeout=60) for r in runs]
    assert [r.wait(30) for r in runs] == [0, 0]
    assert results[0].group(2) == results[1].group(2)          # pack put both on one device
    counts = [int(m.group(1)) for m in results]
    shares = [c / sum(counts) for c in counts]
    assert all(abs(s - 0.5) <= 0.2 for s in shares), (counts, shares)
    assert_idle(cluster)


def test_a_killed_wrapper_frees_its_lease_and_memory_within_two_ttls(cluster, procs, scripts):
    run = procs.run(cluster.address, "-p", "0.25", "--filter", "host=h0", command=[PY, scripts["hold"], "60", "256"])
    got = report(run)
    h0 = cluster.daemon("h0")
    lease_ids = [x.lease_id for x in info(h0.address).sessions]
    assert len(lease_ids) == 1 and any(x.lease_id == lease_ids[0] for x in cluster.status().leases)
    run.proc.kill()                              # SIGKILL: nothing renews or releases the lease now
    killed = time.monotonic()
    run.proc.wait(10)

    def freed():
        return (not any(x.lease_id == lease_ids[0] for x in cluster.status().leases)
                and not info(h0.address).sessions and all(d.memory_used == 0 for d in info(h0.address).devices))
    try:
        wait_until(freed, 4 * TTL, "lease and memory freed", period=0.05)
        assert time.monotonic() - killed <= 2 * TTL + 0.3
    finally:
        try:
            os.kill(got["pid"], signal.SIGKILL)   # the orphaned command (its session is gone already)
        except ProcessLookupError:
            pass
    assert_idle(cluster)


def test_a_crashing_or_killed_command_releases_its_lease_at_once(cluster, procs, scripts):
    for how, code in (("exit", 3), ("kill", -signal.SIGKILL)):
        run = procs.run(cluster.address, "-p", "0.5", command=[PY, scripts["crash"], how])
        assert run.wait(60) == code, run.output()
        assert not cluster.status().leases       # released by the wrapper, not left to expire
    assert_idle(cluster)


def test_smi_json_matches_what_the_daemons_report(cluster, procs, scripts):
    runs = [procs.run(cluster.address, *size, "--filter", "host=h0", command=[PY, scripts["hold"], "30", "32"])
            for size in (["-p", "0.5"], ["-m", "1GiB"])]
    for r in runs:
        report(r)
    expected = {h.host_id: h.address for h in cluster.status().hosts}

    def matches():
        doc = smi_json("--pool", cluster.address)
        for host in doc["hosts"]:
            i = info(host["address"])
            for d, x in zip(host["devices"], i.devices):
                want = sorted((s.session_id, s.lease_id, s.memory_used.get(x.index, 0)) for s in i.sessions
                              if shown_on(x.index, s.devices, s.lease_id, s.memory_used))
                got = sorted((s["session_id"], s["lease_id"], s["memory_used"]) for s in d["sessions"])
                if (d["index"], d["memory_total"], d["memory_used"], got) != \
                        (x.index, x.memory_total, x.memory_used, want):
                    return None
        return doc
    doc = wait_until(matches, 10, "smi matches the daemons' Info")
    assert {h["host_id"]: h["address"] for h in doc["hosts"]} == expected
    assert sum(len(d["sessions"]) for h in doc["hosts"] for d in h["devices"]) == 2
    assert len(doc["leases"]) == 2 and doc["waiting"] == 0
    assert set(doc["hosts"][0]) == {"host_id", "address", "backend", "stale", "draining_s", "devices"}
    assert doc["hosts"][0]["draining_s"] is None
    assert set(doc["hosts"][0]["devices"][0]) == {"index", "name", "memory_total", "memory_used", "utilization",
                                                  "sessions"}
    session = next(s for h in doc["hosts"] for d in h["devices"] for s in d["sessions"])
    assert set(session) == {"session_id", "lease_id", "client", "memory_used", "age_s"}
    assert session["client"] == "hold.py"
    # The same host through its daemon directly.
    h0 = cluster.daemon("h0")
    direct = smi_json("--daemon", h0.address)["hosts"][0]
    pooled = next(h for h in doc["hosts"] if h["host_id"] == "h0")
    strip = lambda devices: [(d["index"], d["memory_total"], d["memory_used"],
                              sorted((s["session_id"], s["lease_id"]) for s in d["sessions"])) for d in devices]
    assert strip(direct["devices"]) == strip(pooled["devices"])
    table = subprocess.run([*GPUREMOTE, "smi", "--pool", cluster.address], capture_output=True, text=True,
                           timeout=60, env=dict(os.environ, COLUMNS="200"))
    assert table.returncode == 0 and "h0" in table.stdout and "hold.py" in table.stdout and "(0.5)" in table.stdout
    for r in runs:
        r.stop()
    assert_idle(cluster)


@pytest.mark.parametrize("args,hint", [
    (["--filter", "gpu=fast"], "malformed filter 'gpu=fast'"),
    (["--filter", "device.memory>=lots"], "malformed filter"),
    (["--wait", "-1"], "--wait"),
    (["--pool", "nowhere"], "HOST:PORT"),
])
def test_bad_run_flags(args, hint):
    base = [] if "--pool" in args else ["--pool", "127.0.0.1:7100"]
    got = subprocess.run([*GPUREMOTE, "run", *base, *args, "--", "true"], capture_output=True, text=True, timeout=60)
    assert got.returncode == 2 and hint in got.stderr, got.stderr


def test_filter_needs_a_pool():
    env = {k: v for k, v in os.environ.items() if k != "GPUREMOTE_POOL"}
    got = subprocess.run([*GPUREMOTE, "run", "--filter", "host=h0", "--", "true"], capture_output=True, text=True,
                         timeout=60, env=env)
    assert got.returncode == 2 and "--filter places devices in a pool" in got.stderr


def test_unreachable_pool_fails_within_seconds():
    port = free_port()
    start = time.monotonic()
    got = subprocess.run([*GPUREMOTE, "run", "--pool", f"127.0.0.1:{port}", "--", "true"], capture_output=True,
                         text=True, timeout=60)
    assert got.returncode == 1 and f"cannot reach the gpuremote pool at 127.0.0.1:{port}" in got.stderr
    assert time.monotonic() - start < 10


@pytest.mark.parametrize("args,hint", [
    (["-n", "7"], ["7 devices asked for", "ask for at most 6"]),
    (["--filter", "device.name=H100"], ["no device matches the filters device.name=H100"]),
    (["-m", "9GiB"], ["more than any device"]),
])
def test_requests_the_pool_cannot_meet_are_refused_clearly(cluster, args, hint):
    got = subprocess.run([*GPUREMOTE, "run", "--pool", cluster.address, *args, "--", "true"], capture_output=True,
                         text=True, timeout=60)
    assert got.returncode == 1
    for h in hint:
        assert h in got.stderr, got.stderr
