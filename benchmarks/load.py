#!/usr/bin/env python
"""Load test: one daemon, N client processes, S seconds of mixed work; does everything come back?

    python benchmarks/load.py [--clients 32] [--seconds 60] [--warmup S] [--quick] [--transport auto|grpc|...]
                              [--json FILE]

Starts one `gpuremote daemon` (emulated backend) on 127.0.0.1 at a port picked at run time and N
client processes (`load.py --client`, loopback only). Each client does a random mix, checking
every result it reads back against NumPy:

  upload    an array of random size (1 KiB .. 4 MiB, float32; chunked above the inline size)
  compute   elementwise (x * 2 + 1, sin), matmul (64..256 square), reductions (sum, max, mean)
  download  a whole array back (get) and compare it with what was uploaded
  free      drop arrays (at most 6 live per client; the oldest go first)

The run is bounded in time and count: the parent decides when the clients start, pause and stop.
Each client first primes its transfer path (eight 4 MiB round trips, so every ring slot and the
largest buffers are touched), then runs the mix. After a warm-up (a third of the run, at most
20 s; --quick: 12 of its 20 s) every client frees its arrays and pauses: the daemon's device
memory (Info RPC) and its RSS (VmRSS in /proc/PID/status) are read while it is idle with all
sessions open; the clients resume, and at the end they free everything and pause again for the
second reading, then exit.

Why a warm-up that long: the daemon keeps bounded working memory that fills during the first
seconds of load and is not a leak: per-session shared-memory rings (shm transport; 32 MiB a
session, RssShmem), its pool of reusable transfer buffers (GPUREMOTE_BUFFER_POOL_BYTES) and
what glibc's malloc keeps after peaks. Measured here it levels off after 10-20 s; a leak keeps
growing with the work done, which the growth from the warm-up to the end reading shows (the
VmRSS curve over the run is printed too).

Prints a rich table: ops/s (client ops issued, all clients), blocking ops (get, float(...)) with
their p50/p99 latency, errors (exceptions and wrong results; target 0), device memory at the
start, at the warm-up pause, at the end and after every client has gone (target: all equal to
the start), and the daemon's RSS growth from the warm-up pause to the end pause (target < 5%).
Exits 1 when a target fails, 2 when the run itself could not be done.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

from gpuremote.launcher import stop_process

RSS_GROWTH_TARGET = 0.05
MAX_LIVE = 6
MAX_UPLOAD_BYTES = 4 * 2**20


# -- the client process (`load.py --client ADDRESS --seed N`) ------------------------------------------

def client_main(address: str, seed: int) -> int:
    """Connect, say ready, then do work between the parent's go/pause/resume/stop commands (stdin)."""
    import numpy as np

    import gpuremote
    import gpuremote.cupy as cp

    commands: queue.SimpleQueue = queue.SimpleQueue()

    def read_commands():
        for line in sys.stdin:
            commands.put(line.strip())
        commands.put("exit")
    threading.Thread(target=read_commands, daemon=True).start()

    def say(**fields):
        print(json.dumps(fields), flush=True)

    session = gpuremote.connect(address)
    say(event="ready", transport=session.transport)
    rng = np.random.default_rng(seed)
    live: list[tuple] = []            # (device array, host copy)
    latencies: list[float] = []
    errors: list[str] = []
    counts = {"upload": 0, "compute": 0, "download": 0, "free": 0}
    active_s = 0.0

    def blocking(fn):
        t = time.perf_counter()
        value = fn()
        latencies.append(time.perf_counter() - t)
        return value

    def check(ok: bool, what: str):
        if not ok:
            errors.append(f"wrong result: {what}")

    def free_all():
        live.clear()
        cp.cuda.Device().synchronize()        # the releases leave with this sync

    def step():
        action = rng.choice(["upload", "compute", "download", "free"], p=[0.3, 0.4, 0.2, 0.1])
        if action == "upload" or not live:
            n = int(np.exp(rng.uniform(np.log(256), np.log(MAX_UPLOAD_BYTES // 4))))
            host = rng.random(n, dtype=np.float32)
            live.append((cp.asarray(host), host))
            if len(live) > MAX_LIVE:
                live.pop(0)
            counts["upload"] += 1
        elif action == "compute":
            x, host = live[rng.integers(len(live))]
            kind = rng.integers(4)
            if kind == 0:                     # elementwise, then a reduction read back
                got = blocking(lambda: float((x * 2 + 1).sum()))
                want = float((host.astype(np.float64) * 2 + 1).sum())
                check(abs(got - want) <= 1e-3 * abs(want) + 1e-3, f"sum(x*2+1) {got} != {want}")
            elif kind == 1:
                got = blocking(lambda: float(cp.sin(x).max()))
                check(abs(got - float(np.sin(host).max())) <= 1e-5, "max(sin(x))")
            elif kind == 2:                   # matmul of a fresh square matrix
                k = int(rng.choice([64, 128, 256]))
                m = rng.random((k, k), dtype=np.float32)
                a = cp.asarray(m)
                got = blocking(lambda: (a @ a)[:4, :8].get())
                check(np.allclose(got, (m @ m)[:4, :8], rtol=1e-4, atol=1e-3), f"matmul {k}")
            else:
                got = blocking(lambda: float(x.mean()))
                check(abs(got - float(host.mean(dtype=np.float64))) <= 1e-4, "mean")
            counts["compute"] += 1
        elif action == "download":
            x, host = live[rng.integers(len(live))]
            got = blocking(x.get)
            check(got.shape == host.shape and np.array_equal(got, host), f"download of {host.size} floats")
            counts["download"] += 1
        else:
            for _ in range(int(rng.integers(1, 3))):
                if live:
                    live.pop(int(rng.integers(len(live))))
            counts["free"] += 1

    def prime():
        """Touch what a steady run touches (every slot of a transport's rings, both ways; the daemon's
        buffers for the largest transfers), so the warm-up reading sees the working set, not a cold one."""
        host = rng.random(MAX_UPLOAD_BYTES // 4, dtype=np.float32)
        for _ in range(8):
            x = cp.asarray(host)
            check(np.array_equal(x.get(), host), "priming round trip")
        del x
        cp.cuda.Device().synchronize()

    state = "waiting"
    start = 0.0
    while True:
        try:
            command = commands.get(block=state != "running")
        except queue.Empty:
            command = None
        if command == "go":
            try:
                prime()
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
        if command in ("go", "resume"):
            state, start = "running", time.perf_counter()
        elif command in ("pause", "stop"):
            if state == "running":
                active_s += time.perf_counter() - start
            state = "paused"
            try:
                free_all()
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
            if command == "pause":
                say(event="paused")
            else:
                say(event="result", ops=gpuremote.stats()["ops"], active_s=active_s, counts=counts,
                    latencies=[round(x, 6) for x in latencies], errors=errors[:20], error_count=len(errors),
                    transport=session.transport)
        elif command == "exit":
            gpuremote.disconnect()
            return 0
        if state == "running":
            try:
                step()
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
                if len(errors) > 1000:
                    state = "paused"


# -- the parent --------------------------------------------------------------------------------------------

class Proc:
    """A subprocess with its stdout lines read by a thread (JSON lines become events)."""

    def __init__(self, cmd: list[str], env: dict, stdin: bool = False):
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.events: queue.Queue = queue.Queue()
        self.tail: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            for line in self.proc.stdout:
                self.tail = (self.tail + [line.rstrip()])[-30:]
                try:
                    self.events.put(json.loads(line))
                except ValueError:
                    self.events.put({"event": "line", "text": line.rstrip()})
        except (OSError, ValueError):
            pass
        self.events.put({"event": "exit"})

    def expect(self, event: str, deadline: float) -> dict:
        while True:
            try:
                got = self.events.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(f"no {event!r} in time; output:\n  " + "\n  ".join(self.tail)) from None
            if got.get("event") == event:
                return got
            if got.get("event") == "exit":
                raise RuntimeError(f"exited before {event!r}; output:\n  " + "\n  ".join(self.tail))

    def send(self, line: str) -> None:
        try:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)       # a stopped process (SIGSTOP) must run to act on SIGTERM
        stop_process(self.proc, timeout)
        self._reader.join(timeout=timeout)


def memory_status(pid: int) -> dict:
    """VmRSS and its parts (RssAnon, RssFile, RssShmem) of a process, in bytes."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key = line.split(":")[0]
            if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
                out[key] = int(line.split()[1]) * 1024
    if "VmRSS" not in out:
        raise RuntimeError(f"no VmRSS for pid {pid}")
    return out


def rss_bytes(pid: int) -> int:
    return memory_status(pid)["VmRSS"]


class Sampler:
    """Samples a process's memory every `period` seconds in a thread (the RSS curve over the run)."""

    def __init__(self, pid: int, period: float = 1.0):
        self.pid, self.period, self.samples = pid, period, []
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self.samples.append({"t": round(time.monotonic() - self._t0, 1), **memory_status(self.pid)})
            except (OSError, RuntimeError):
                return

    def stop(self) -> list[dict]:
        self._stop.set()
        self._thread.join(timeout=5)
        return self.samples


def daemon_info(address: str):
    import grpc

    from gpuremote.v1 import daemon_pb2_grpc
    from gpuremote.wire import pb
    with grpc.insecure_channel(address) as channel:
        return daemon_pb2_grpc.DaemonStub(channel).Info(pb.InfoRequest(), timeout=10)


def memory_used(address: str) -> int:
    return sum(d.memory_used for d in daemon_info(address).devices)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


def _daemon_cmd() -> list[str]:
    cmd = [sys.executable, "-m", "gpuremote.cli", "daemon", "--listen", "127.0.0.1:0", "--backend", "emulated",
           "--emulate", "1"]
    helptext = subprocess.run(cmd[:4] + ["--help"], capture_output=True, text=True, timeout=60).stdout
    return cmd + (["--insecure"] if "--insecure" in helptext else [])   # servers require auth or --insecure


def run(clients: int, seconds: float, warmup: float, transport: str) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1", GPUREMOTE_TRANSPORT=transport)
    env.pop("GPUREMOTE_STRICT_META", None)        # a test-only check that costs the daemon time per op
    daemon = Proc(_daemon_cmd(), env)
    procs: list[Proc] = []
    try:
        line = daemon.expect("line", time.monotonic() + 60)
        while "listening on" not in line["text"]:
            line = daemon.expect("line", time.monotonic() + 60)
        address = re.search(r"listening on (\S+)", line["text"]).group(1)
        pid = daemon.proc.pid
        out = {"clients": clients, "seconds": seconds, "warmup_s": warmup, "address": address,
               "transport_asked": transport}
        out["memory_start"] = memory_used(address)
        out["rss_start"] = rss_bytes(pid)
        started = time.monotonic()
        for i in range(clients):
            procs.append(Proc([sys.executable, os.path.abspath(__file__), "--client", address, "--seed", str(i)],
                              env, stdin=True))
        deadline = time.monotonic() + 60 + 5 * clients          # imports on a small machine take a while
        transports = {p.expect("ready", deadline)["transport"] for p in procs}
        out["startup_s"] = time.monotonic() - started
        out["transports"] = sorted(transports)
        sampler = Sampler(pid)
        for p in procs:
            p.send("go")
        time.sleep(warmup)
        for p in procs:
            p.send("pause")
        deadline = time.monotonic() + 60
        for p in procs:
            p.expect("paused", deadline)
        out["memory_warm"] = memory_used(address)       # every client idle, all arrays freed, sessions open
        out["rss_warm"] = rss_bytes(pid)
        out["status_warm"] = memory_status(pid)
        for p in procs:
            p.send("resume")
        time.sleep(max(0.0, seconds - warmup))
        for p in procs:
            p.send("stop")
        deadline = time.monotonic() + 60
        results = []
        failed = 0
        for p in procs:
            try:
                results.append(p.expect("result", deadline))
            except RuntimeError as exc:
                failed += 1
                print(f"a client gave no result: {exc}", file=sys.stderr)
        out["memory_end"] = memory_used(address)
        out["rss_end"] = rss_bytes(pid)
        out["status_end"] = memory_status(pid)
        for p in procs:
            p.send("exit")
        deadline = time.monotonic() + 60
        for p in procs:
            try:
                p.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                failed += 1
        while daemon_info(address).sessions and time.monotonic() < deadline:
            time.sleep(0.05)
        info = daemon_info(address)
        out["sessions_after"] = len(info.sessions)
        out["memory_after"] = sum(d.memory_used for d in info.devices)
        out["rss_after"] = rss_bytes(pid)
        out["status_after"] = memory_status(pid)
        out["rss_samples"] = sampler.stop()
        out["daemon_alive"] = daemon.proc.poll() is None
        latencies = [x for r in results for x in r["latencies"]]
        out["ops"] = sum(r["ops"] for r in results)
        out["ops_per_s"] = sum(r["ops"] / r["active_s"] for r in results if r["active_s"] > 0)
        out["actions"] = {k: sum(r["counts"][k] for r in results) for k in ("upload", "compute", "download", "free")}
        out["blocking_ops"] = len(latencies)
        out["p50_ms"] = percentile(latencies, 50) * 1e3
        out["p99_ms"] = percentile(latencies, 99) * 1e3
        out["max_ms"] = max(latencies, default=float("nan")) * 1e3
        out["client_max_ms"] = [round(max(r["latencies"], default=0.0) * 1e3, 1) for r in results]
        out["errors"] = sum(r["error_count"] for r in results) + failed + sum(p.proc.returncode not in (0, None)
                                                                             for p in procs)
        out["error_samples"] = [e for r in results for e in r["errors"]][:10]
        out["transports"] = sorted({r["transport"] for r in results} | transports)
        return out
    finally:
        for p in procs:
            p.stop()
        daemon.stop()


def report(out: dict, elapsed: float) -> bool:
    from rich.console import Console
    from rich.table import Table

    growth = (out["rss_end"] - out["rss_warm"]) / out["rss_warm"]
    checks = {
        "errors": out["errors"] == 0,
        "memory": out["memory_warm"] == out["memory_end"] == out["memory_after"] == out["memory_start"]
        and out["sessions_after"] == 0,
        "rss": growth < RSS_GROWTH_TARGET,
        "alive": out["daemon_alive"],
    }
    verdict = {True: "[green]PASS[/green]", False: "[red]FAIL[/red]"}
    t = Table(title=f"gpuremote load: {out['clients']} clients x {out['seconds']:g} s ({out['warmup_s']:g} s warm-up), "
                    f"one emulated daemon (loopback; transport {', '.join(out['transports'])})")
    t.add_column("measure")
    t.add_column("value", justify="right")
    t.add_column("target")
    t.add_column("", justify="center")
    a = out["actions"]
    mib = 2**20
    t.add_row("ops issued", f"{out['ops']:,}", "", "")
    t.add_row("ops/s", f"{out['ops_per_s']:,.0f}", "", "")
    t.add_row("upload/compute/download/free", f"{a['upload']:,}/{a['compute']:,}/{a['download']:,}/{a['free']:,}",
              "", "")
    t.add_row("blocking ops", f"{out['blocking_ops']:,}", "", "")
    t.add_row("  latency p50", f"{out['p50_ms']:.2f} ms", "", "")
    t.add_row("  latency p99", f"{out['p99_ms']:.2f} ms", "", "")
    t.add_row("  latency max", f"{out['max_ms']:.1f} ms", "", "")
    t.add_row("errors", f"{out['errors']}", "0", verdict[checks["errors"]])
    t.add_row("device memory start", f"{out['memory_start']:,} B", "", "")
    t.add_row("  at warm-up pause", f"{out['memory_warm']:,} B", "= start", verdict[out["memory_warm"] == out["memory_start"]])
    t.add_row("  at end pause", f"{out['memory_end']:,} B", "= start", verdict[out["memory_end"] == out["memory_start"]])
    t.add_row("  after clients exit", f"{out['memory_after']:,} B", "= start",
              verdict[out["memory_after"] == out["memory_start"]])
    t.add_row("sessions after exit", f"{out['sessions_after']}", "0", verdict[out["sessions_after"] == 0])
    t.add_row("daemon RSS start", f"{out['rss_start'] / mib:.1f} MiB", "", "")
    t.add_row("  at warm-up pause", f"{out['rss_warm'] / mib:.1f} MiB", "", "")
    t.add_row("  at end pause", f"{out['rss_end'] / mib:.1f} MiB", "", "")
    t.add_row("  after clients exit", f"{out['rss_after'] / mib:.1f} MiB", "", "")
    def parts(st: dict) -> str:
        return f"{st.get('RssAnon', 0) / mib:.0f}/{st.get('RssFile', 0) / mib:.0f}/{st.get('RssShmem', 0) / mib:.0f}"
    t.add_row("  anon/file/shmem warm, end", f"{parts(out['status_warm'])}, {parts(out['status_end'])} MiB", "", "")
    t.add_row("RSS growth warm-up -> end", f"{growth * 100:+.2f}%", f"< {RSS_GROWTH_TARGET * 100:g}%",
              verdict[checks["rss"]])
    t.add_row("daemon alive", "yes" if out["daemon_alive"] else "NO", "yes", verdict[checks["alive"]])
    console = Console()
    console.print(t)
    for e in out["error_samples"]:
        console.print(f"  error: {e}", markup=False)
    samples = out.get("rss_samples") or []
    if samples:
        step = max(1, len(samples) // 12)
        curve = ", ".join(f"{x['t']:.0f}s {x['VmRSS'] / mib:.0f}" for x in samples[::step])
        console.print(f"daemon VmRSS (MiB) over the run, from the first 'go': {curve}", markup=False)
    console.print(f"clients started in {out['startup_s']:.1f} s; total run time {elapsed:.1f} s")
    return all(checks.values())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=None, help="client processes (default 32; --quick: 4)")
    ap.add_argument("--seconds", type=float, default=None, help="length of the run (default 60; --quick: 20)")
    ap.add_argument("--warmup", type=float, default=None,
                    help="seconds before the first reading (default a third of the run, at most 20; --quick: 12)")
    ap.add_argument("--quick", action="store_true", help="4 clients for 20 s, the first 12 s warm-up")
    ap.add_argument("--transport", default="auto", help="client transport (GPUREMOTE_TRANSPORT), default auto")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    ap.add_argument("--client", metavar="ADDRESS", help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.client:
        return client_main(args.client, args.seed)
    clients = args.clients if args.clients is not None else (4 if args.quick else 32)
    seconds = args.seconds if args.seconds is not None else (20.0 if args.quick else 60.0)
    warmup = args.warmup if args.warmup is not None else (12.0 if args.quick else min(20.0, seconds / 3))
    if not (1 <= clients <= 256) or not (1 <= seconds <= 3600) or not (0 < warmup < seconds):
        ap.error("use 1 to 256 clients, 1 to 3600 seconds and a warm-up shorter than the run")
    started = time.monotonic()
    try:
        out = run(clients, seconds, warmup, args.transport)
    except (RuntimeError, OSError) as exc:
        print(f"load: the run failed: {exc}", file=sys.stderr)
        return 2
    ok = report(out, time.monotonic() - started)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
