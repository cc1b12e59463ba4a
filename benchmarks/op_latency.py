#!/usr/bin/env python
"""Per-op latency of gpuremote against a bare gRPC Python stream, measured side by side.

    python benchmarks/op_latency.py [--quick] [--json FILE] [--transport auto|grpc|socket|shm|...]

Starts two subprocesses on 127.0.0.1, ports picked at run time: a gpuremote daemon
(emulated backend) and a bare gRPC echo server (a generic stream-stream handler with bytes
in and bytes out, no protobuf). Then, in rounds that interleave all measurements so that
drift on a noisy machine hits each of them alike, it measures:

  1. asynchronous op: `y = x + 1` on a 16-element float32 array, many thousands of times,
     then one synchronize; client wall time per op without and with that final sync
     (and the client process's CPU time per op, all its threads);
  2. blocking round trip through gpuremote: `z.get()` of a 1-element array (one op that
     wants a reply) and, for reference, `float(x.sum())` (an async op plus a value op),
     over whichever op channel the client selected (gRPC stream, framed socket or shared
     memory: gpuremote/transport), which the report names;
  3. bare gRPC ping-pong: one small bytes message sent through a request iterator fed by
     a queue.SimpleQueue and `next()` on the response iterator, exactly as the gpuremote
     client does its round trips, with the same channel options;
  4. ratios against the targets: async op <= 15 us, gpuremote round trip <= 1.5x bare.

Prints a rich table with PASS/FAIL; --json FILE writes the numbers as a JSON object.
The exit status is 0 whenever the measurement ran, whatever PASS/FAIL says.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import queue
import signal
import sys
import time

from _child import Child

ASYNC_TARGET_US = 15.0
RTT_RATIO_TARGET = 1.5
ECHO_METHOD = "/bench.Echo/Ping"
PAYLOAD = b"\x5a" * 32   # about the size of gpuremote's 1-element fetch request and reply


# -- the bare echo server (runs in its own process: `op_latency.py --serve-echo`) -----------------
def serve_echo() -> None:
    from concurrent import futures

    import grpc

    from gpuremote.transport.grpc_channel import options

    def ping(request_iterator, context):
        for msg in request_iterator:
            yield msg

    handler = grpc.method_handlers_generic_handler(
        "bench.Echo", {"Ping": grpc.stream_stream_rpc_method_handler(ping)})  # no serializers: bytes
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=options(),
                         handlers=(handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    if port == 0:
        raise SystemExit("echo server: cannot bind 127.0.0.1:0")
    server.start()
    print(f"echo server listening on 127.0.0.1:{port}", flush=True)
    server.wait_for_termination()


# -- the bare gRPC client: the same round-trip mechanics as gpuremote.client.session ------------
class BareEcho:
    def __init__(self, address: str):
        import grpc

        from gpuremote.transport.grpc_channel import options
        self._grpc = grpc
        self.channel = grpc.insecure_channel(address, options=options())
        grpc.channel_ready_future(self.channel).result(timeout=10)
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()
        ping = self.channel.stream_stream(ECHO_METHOD)  # no (de)serializers: bytes in, bytes out
        self.responses = ping(self._requests())

    def _requests(self):
        while True:
            msg = self.outbox.get()
            if msg is None:
                return
            yield msg

    def ping(self, payload: bytes = PAYLOAD) -> bytes:
        self.outbox.put(payload)
        return next(self.responses)

    def close(self) -> None:
        self.outbox.put(None)
        try:
            for _ in self.responses:
                pass
        except self._grpc.RpcError:
            pass
        self.channel.close()


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of process `pid` (Linux /proc), or None where unavailable."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


# -- statistics -----------------------------------------------------------------------------------
def summary(samples_s: list[float]) -> dict:
    import numpy
    us = numpy.asarray(samples_s) * 1e6
    return {"median": float(numpy.median(us)), "p99": float(numpy.percentile(us, 99)),
            "mean": float(us.mean()), "min": float(us.min()), "n": int(us.size)}


# -- the measurement ------------------------------------------------------------------------------
def measure(daemon_address: str, daemon_pid: int, echo_address: str, quick: bool, transport: str | None = None) -> dict:
    import numpy

    import gpuremote
    import gpuremote.cupy as cp

    rounds = 4 if quick else 10
    async_ops = 2500 if quick else 8000        # per round
    rtt_iters = 1000 if quick else 5000        # in all, split over the rounds
    warmup = 200
    per_round = -(-rtt_iters // rounds)

    session = gpuremote.connect(daemon_address, transport=transport)
    via = getattr(session._link, "via", "")
    channel = session.transport + (f"/{via}" if session.transport == "socket" else "")   # the op channel the client selected
    bare = None
    try:
        bare = BareEcho(echo_address)
        dev = cp.cuda.Device(0)
        x = cp.asarray(numpy.zeros(16, numpy.float32))
        z = cp.asarray(numpy.zeros(1, numpy.float32))
        # Warm-up: every code path once, caches, gRPC connections and threads.
        for _ in range(warmup * 5):
            y = x + 1
        del y
        dev.synchronize()
        for _ in range(warmup):
            z.get()
            float(x.sum())
            bare.ping()
        if bare.ping() != PAYLOAD:
            raise RuntimeError("the echo server answered something else than it was sent")

        async_wall = async_sync = async_cpu = async_main_cpu = 0.0
        daemon_cpu: float | None = 0.0
        async_rounds = []
        get_s: list[float] = []
        sum_s: list[float] = []
        bare_s: list[float] = []
        clock = time.perf_counter
        for r in range(rounds):
            # (1) asynchronous ops, then one sync point
            dev.synchronize()
            gc.collect()
            d0 = process_cpu_s(daemon_pid)
            m0 = time.thread_time()
            c0 = time.process_time()
            t0 = clock()
            for _ in range(async_ops):
                y = x + 1
            t1 = clock()
            c1 = time.process_time()
            m1 = time.thread_time()
            dev.synchronize()
            t2 = clock()
            d1 = process_cpu_s(daemon_pid)
            del y
            async_wall += t1 - t0
            async_sync += t2 - t0
            async_cpu += c1 - c0
            async_main_cpu += m1 - m0
            daemon_cpu = None if daemon_cpu is None or d0 is None or d1 is None else daemon_cpu + d1 - d0
            async_rounds.append({"us_per_op": (t1 - t0) / async_ops * 1e6,
                                 "us_per_op_incl_sync": (t2 - t0) / async_ops * 1e6})
            # (2)+(3) blocking round trips, alternating one by one, the order flipped each time
            gc.collect()
            for i in range(per_round):
                order = (0, 1, 2) if (i + r) % 2 == 0 else (2, 1, 0)
                for which in order:
                    if which == 0:
                        t = clock()
                        z.get()
                        get_s.append(clock() - t)
                    elif which == 1:
                        t = clock()
                        bare.ping()
                        bare_s.append(clock() - t)
                    else:
                        t = clock()
                        float(x.sum())
                        sum_s.append(clock() - t)
        n_async = rounds * async_ops
    finally:
        if bare is not None:
            bare.close()
        gpuremote.disconnect()

    get, fsum, ping = summary(get_s), summary(sum_s), summary(bare_s)
    async_us = async_wall / n_async * 1e6
    ratio = get["median"] / ping["median"]
    return {
        "config": {"quick": quick, "rounds": rounds, "async_ops_per_round": async_ops,
                   "rtt_iterations": len(get_s), "warmup": warmup, "array": "16 x float32",
                   "python": platform.python_version(), "grpc": __import__("grpc").__version__,
                   "cpus": os.cpu_count(), "machine": platform.machine(), "backend": "emulated",
                   "channel": channel},
        "async_op": {
            "op": "y = x + 1",
            "ops": n_async,
            "us_per_op": async_us,
            "us_per_op_incl_sync": async_sync / n_async * 1e6,
            "client_cpu_us_per_op": async_cpu / n_async * 1e6,
            "client_main_thread_cpu_us_per_op": async_main_cpu / n_async * 1e6,
            "daemon_cpu_us_per_op": None if daemon_cpu is None else daemon_cpu / n_async * 1e6,
            "best_round_us_per_op": min(r["us_per_op"] for r in async_rounds),
            "rounds": async_rounds,
        },
        "gpuremote_rtt_get_us": get,
        "gpuremote_rtt_float_sum_us": fsum,
        "bare_grpc_rtt_us": ping,
        "ratios": {
            "async_op_vs_target": async_us / ASYNC_TARGET_US,
            "rtt_get_vs_bare_median": ratio,
            "rtt_get_vs_bare_p99": get["p99"] / ping["p99"],
            "rtt_float_sum_vs_bare_median": fsum["median"] / ping["median"],
            "rtt_float_sum_vs_bare_p99": fsum["p99"] / ping["p99"],
        },
        "targets": {"async_op_us": ASYNC_TARGET_US, "rtt_ratio": RTT_RATIO_TARGET},
        "pass": {"async_op": async_us <= ASYNC_TARGET_US, "rtt_ratio": ratio <= RTT_RATIO_TARGET},
    }


def report(res: dict, elapsed: float) -> None:
    from rich.console import Console
    from rich.table import Table

    def verdict(ok: bool) -> str:
        return "[bold green]PASS[/]" if ok else "[bold red]FAIL[/]"

    a, g, s, b, q = (res["async_op"], res["gpuremote_rtt_get_us"], res["gpuremote_rtt_float_sum_us"],
                     res["bare_grpc_rtt_us"], res["ratios"])
    c = res["config"]
    t = Table(title=f"gpuremote op latency vs bare gRPC (loopback; gpuremote ops over {c['channel']})",
              caption=f"async: total client time / {a['ops']:,} ops on 16 x float32; RTT: {g['n']} round trips "
                      "each, interleaved; "
                      f"daemon: emulated backend; bare: 32-byte echo; {c['cpus']} CPUs, "
                      f"Python {c['python']}, grpcio {c['grpc']}")
    t.add_column("measurement")
    t.add_column("value / median", justify="right")
    t.add_column("p99", justify="right")
    t.add_column("target", justify="right")
    t.add_column("result", justify="center")
    t.add_row("async op y = x + 1 (wall/op)", f"{a['us_per_op']:.1f} us", "",
              f"<= {ASYNC_TARGET_US:g} us", verdict(res["pass"]["async_op"]))
    t.add_row(f"  best of {len(a['rounds'])} rounds", f"{a['best_round_us_per_op']:.1f} us", "", "", "")
    t.add_row("  incl. final sync", f"{a['us_per_op_incl_sync']:.1f} us", "", "", "")
    t.add_row("  client CPU/op, all threads", f"{a['client_cpu_us_per_op']:.1f} us", "", "", "")
    t.add_row("  client CPU/op, main thread", f"{a['client_main_thread_cpu_us_per_op']:.1f} us", "", "", "")
    if a["daemon_cpu_us_per_op"] is not None:
        t.add_row("  daemon CPU/op", f"{a['daemon_cpu_us_per_op']:.1f} us", "", "", "")
    t.add_row(f"RTT gpuremote z.get() ({c['channel']})", f"{g['median']:.0f} us", f"{g['p99']:.0f} us", "", "")
    t.add_row(f"RTT gpuremote float(x.sum()) ({c['channel']})", f"{s['median']:.0f} us", f"{s['p99']:.0f} us", "", "")
    t.add_row("RTT bare gRPC ping-pong", f"{b['median']:.0f} us", f"{b['p99']:.0f} us", "", "")
    t.add_row("async op / target", f"{q['async_op_vs_target']:.2f}x", "", "<= 1x", "")
    t.add_row("RTT z.get() / bare", f"{q['rtt_get_vs_bare_median']:.2f}x", f"{q['rtt_get_vs_bare_p99']:.2f}x",
              f"<= {RTT_RATIO_TARGET:g}x", verdict(res["pass"]["rtt_ratio"]))
    t.add_row("RTT float(x.sum()) / bare", f"{q['rtt_float_sum_vs_bare_median']:.2f}x",
              f"{q['rtt_float_sum_vs_bare_p99']:.2f}x", "", "")
    console = Console()
    console.print(t)
    console.print(f"total run time {elapsed:.1f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations (about 5 s instead of 25 s on a 2-core machine)")
    parser.add_argument("--json", metavar="FILE", help="also write the numbers as a JSON object to FILE")
    parser.add_argument("--transport", default=None,
                        help="op channel for gpuremote: auto (default, or GPUREMOTE_TRANSPORT), grpc, socket, tcp, unix, "
                             "shm; the report names the one the client selected")
    parser.add_argument("--serve-echo", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_echo:
        serve_echo()
        return 0

    # SIGTERM (e.g. from `timeout`) unwinds like Ctrl-C, so the finally below stops the subprocesses.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.perf_counter()
    children: list[Child] = []
    try:
        children.append(Child("gpuremote daemon", [sys.executable, "-m", "gpuremote.cli", "daemon", "--listen",
                                                   "127.0.0.1:0", "--insecure", "--backend", "emulated", "--emulate", "1"]))
        children.append(Child("echo server", [sys.executable, os.path.abspath(__file__), "--serve-echo"]))
        res = measure(children[0].address, children[0].proc.pid, children[1].address, args.quick, args.transport)
    finally:
        for child in reversed(children):
            child.stop()
    elapsed = time.perf_counter() - started
    res["config"]["elapsed_s"] = elapsed
    report(res, elapsed)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
