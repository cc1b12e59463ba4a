"""Compute shares on one busy device: how much device time each `gpuremote run --pool -p SHARE` gets.

Starts a pool and a daemon (emulated backend, one device) in this process, joined as
`gpuremote daemon --pool` joins (PoolAgent), then for each scenario runs one command per share
under real `gpuremote run --pool` wrappers. Each command runs 384x384 matmuls with a sync after
each, as fast as it can, for the same window. Printed per command: its share of the device time
the daemon's scheduler charged it over the window (the measure the scheduler enforces), and its
share of the iterations it completed. Also prints the scheduler's cost per op (enter + leave,
uncontended), for comparison with the daemon's whole per-op cost in op_latency.py.

Run: python benchmarks/compute_share.py [--seconds 3] [--json FILE]   (about 30 s)
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import textwrap
import time

SCENARIOS = [(0.5, 0.5), (0.25, 0.75), (0.5,), (0.2, 0.3, 0.5)]

CLIENT = """
import os, sys, time, cupy
a = cupy.random.rand(384, 384)
float((a @ a)[0, 0])
print("READY", flush=True)
deadline = time.monotonic() + 60
while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
    time.sleep(0.002)
start = float(open(sys.argv[1]).read())
while time.time() < start:
    time.sleep(0.0005)
end, n = start + float(sys.argv[2]), 0
while time.time() < end:
    float((a @ a)[0, 0])
    n += 1
print("COUNT", n, flush=True)
"""


def scheduler_overhead(n: int = 200_000) -> float:
    """Seconds per op of Flow.enter + Flow.leave on an idle device (the hot path's added cost)."""
    from gpuremote.daemon.backends.emulated import EmulatedBackend
    flow = EmulatedBackend(1).schedulers[0].flow("bench", 0.5)
    loop = time.perf_counter()
    for _ in range(n):
        pass
    loop = time.perf_counter() - loop
    start = time.perf_counter()
    for _ in range(n):
        flow.leave(flow.enter())
    return (time.perf_counter() - start - loop) / n


def scenario(pool: str, backend, shares, seconds: float, tmp: pathlib.Path) -> list[dict]:
    script = tmp / "client.py"
    script.write_text(textwrap.dedent(CLIENT))
    go = tmp / f"go-{time.monotonic_ns()}"
    env = {k: v for k, v in os.environ.items() if k not in ("GPUREMOTE_DAEMON", "GPUREMOTE_POOL")}
    procs = [subprocess.Popen([sys.executable, "-m", "gpuremote.cli", "run", "--pool", pool, "-p", str(s), "--wait",
                               "30", "--", sys.executable, str(script), str(go), str(seconds)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) for s in shares]
    try:
        for p in procs:
            line = p.stdout.readline()
            if "READY" not in line:
                raise RuntimeError(f"client did not start: {line!r} {p.stdout.read()[-2000:]}")
        sched = backend.schedulers[0]
        start = time.time() + 0.3
        go.write_text(str(start))
        while time.time() < start:
            time.sleep(0.001)
        before = sched.flows()
        busy0 = sched.busy_s
        time.sleep(seconds)
        after = sched.flows()
        busy1 = sched.busy_s
        counts = []
        for p in procs:
            out = p.communicate(timeout=60)[0]
            found = [line.split()[1] for line in out.splitlines() if line.startswith("COUNT")]
            if not found:
                raise RuntimeError(f"client failed: {out[-3000:]}")
            counts.append(int(found[0]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    # Flows are keyed by lease; match them to the commands by their shares (distinct or equal).
    used = sorted(((after[k][0], after[k][1] - before.get(k, (0, 0))[1]) for k in after), key=lambda x: x[0])
    total_used = sum(u for _, u in used) or 1.0
    rows = []
    for (share, u), count in zip(used, sorted(counts, key=lambda c: c) if len(set(shares)) > 1 else counts):
        rows.append({"share": share, "device_time_share": u / total_used, "device_s": u})
    order = sorted(range(len(shares)), key=lambda i: shares[i])
    for row, i in zip(rows, order):
        row["iterations"] = counts[i]
        row["iteration_share"] = counts[i] / sum(counts)
    busy = (busy1 - busy0) / seconds
    return [dict(r, utilization=busy) for r in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="measuring window per scenario")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = parser.parse_args()

    from gpuremote.daemon.admission import Admission
    from gpuremote.daemon.backends import create
    from gpuremote.daemon.pool_agent import PoolAgent
    from gpuremote.daemon.server import DaemonServer
    from gpuremote.pool.server import PoolServer

    overhead = scheduler_overhead()
    pool = PoolServer("127.0.0.1:0", ":memory:", lease_ttl=30).start()
    backend = create("emulated", None, 1, 8 * 2**30)
    daemon = DaemonServer(backend, "127.0.0.1:0", admission=Admission(backend, pool.address)).start()
    agent = PoolAgent(daemon.service, pool.address, daemon.address).start()
    results = {"scheduler_overhead_us_per_op": overhead * 1e6, "seconds": args.seconds, "scenarios": []}
    try:
        if not agent.registered.wait(10):
            raise SystemExit(f"the daemon did not register: {agent.last_error}")
        print(f"scheduler cost per op (enter + leave, idle device): {overhead * 1e6:.2f} us")
        with tempfile.TemporaryDirectory() as tmp:
            for shares in SCENARIOS:
                rows = scenario(pool.address, backend, shares, args.seconds, pathlib.Path(tmp))
                results["scenarios"].append({"shares": list(shares), "commands": rows})
                print(f"\n-p {' + '.join(f'{s:g}' for s in shares)} on one device "
                      f"(device busy {rows[0]['utilization'] * 100:.0f}% of {args.seconds:g} s):")
                for r in rows:
                    print(f"  granted {r['share']:<5g} device time {r['device_time_share'] * 100:5.1f}%  "
                          f"({r['device_s']:.2f} s)   iterations {r['iterations']:6d} "
                          f"({r['iteration_share'] * 100:5.1f}%)")
    finally:
        agent.stop()
        daemon.stop(grace=1)
        pool.stop(grace=1)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
