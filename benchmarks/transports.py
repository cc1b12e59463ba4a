#!/usr/bin/env python
"""Each gpuremote transport's bulk bandwidth and small round trip, beside the raw baselines.

    python benchmarks/transports.py [--quick] [--size 256MiB] [--json FILE]

Measured in one run, on this machine, between two processes each time:

  baselines  raw Python TCP and Unix stream sockets (sendall -> recv_into a reused, page-aligned
             buffer; 64 B ping-pong), a memfd shared-memory handoff (write + notify + read, whole
             buffer, and as a pipelined 4 x 4 MiB ring), single-thread memcpy (numpy.copyto
             between reused page-aligned buffers, in this process), and a bare gRPC bidirectional
             stream of raw bytes (generic handlers, no protobuf; 1 MiB messages from one reused bytes
             object, one stream each way kept open), the ceiling gRPC Python itself has here;
  transports every transport the daemon (a subprocess, emulated backend) offers this client:
             grpc, socket over TCP, socket over the Unix socket, shm (and verbs with a device):
             H2D of SIZE (cupy.asarray(host) + synchronize), D2H of SIZE (x.get()), and three 64 B
             blocking round trips: the channel's own (PING/PONG frames answered by the daemon's
             connection thread), Device.synchronize() and z.get() of a 64-byte array (through the
             client's and the daemon's session code; on a data plane as QUICK/QUIET frames, on
             gRPC as an op batch and its reply).

Prints the table with the ratios against the targets: socket >= 0.8x raw TCP socket bandwidth,
shm >= 0.8x the shm write+read baseline and >= 0.5x memcpy, grpc >= 1.0 GB/s and >= 0.8x the bare
gRPC stream, and the small round trip through the fast op channel <= 2x the raw socket round trip
(the same kind of socket; judged on each of the three round trips above). The exit status is 0
whenever the measurement ran, whatever PASS/FAIL says.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import platform
import queue
import re
import signal
import socket
import struct
import sys
import threading
import time

import numpy

from _child import Child

RTT_BYTES = 64
RING_SLOTS, RING_SLOT = 4, 4 * 2**20
GRPC_MSG = 2**20                      # gpuremote's chunk size (DEFAULTS.chunk_bytes)
GRPC_OPTIONS = [("grpc.max_receive_message_length", 16 * 2**20), ("grpc.max_send_message_length", 16 * 2**20)]
TARGETS = {"socket_vs_raw": 0.8, "shm_vs_handoff": 0.8, "shm_vs_memcpy": 0.5, "grpc_gbps": 1.0, "grpc_vs_raw": 0.8,
           "rtt_vs_raw": 2.0}


def aligned(nbytes: int) -> numpy.ndarray:
    """A page-aligned buffer, touched once (first touch is what makes fresh memory slow)."""
    buf = numpy.frombuffer(mmap.mmap(-1, max(nbytes, mmap.PAGESIZE)), numpy.uint8, count=nbytes)
    buf.fill(1)
    return buf


def recv_exact(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            raise EOFError("peer closed")
        got += n


# -- the baseline peer (runs as `transports.py --serve-raw SIZE`) -------------------------------------
def serve_raw(size: int) -> None:
    tcp = socket.create_server(("127.0.0.1", 0))
    path = f"\0gpuremote-bench-{os.getpid()}"
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind(path)
    unix.listen(4)
    buf = aligned(size)
    grpc_server, grpc_port = serve_grpc(size)   # kept referenced: it serves as long as this process runs
    print(f"listening on 127.0.0.1:{tcp.getsockname()[1]} unix:@{path[1:]} grpc:127.0.0.1:{grpc_port}", flush=True)

    def handle(conn: socket.socket) -> None:
        if conn.family == socket.AF_INET:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        view = memoryview(buf)
        small = bytearray(RTT_BYTES)
        try:
            while True:
                cmd = conn.recv(1)
                if not cmd:
                    return
                if cmd == b"P":                                     # ping-pong until 'E'
                    while True:
                        recv_exact(conn, memoryview(small))
                        if small[0] == ord("E"):
                            break
                        conn.sendall(small)
                elif cmd == b"U":                                   # client -> us
                    n = struct.unpack("<Q", conn.recv(8))[0]
                    recv_exact(conn, view[:n])
                    conn.sendall(b"k")
                elif cmd == b"D":                                   # us -> client
                    n = struct.unpack("<Q", conn.recv(8))[0]
                    conn.sendall(view[:n])
                elif cmd == b"S":                                   # shm handoff; the memfd rides along
                    shm_peer(conn)
        finally:
            conn.close()

    def accept(listener):
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, args=(tcp,), daemon=True).start()
    accept(unix)


def serve_grpc(size: int):
    """Bare gRPC, bytes in and out (no serializers): "Up" acknowledges every SIZE bytes received with
    one small message; "Down" answers each request (a size) with that many bytes in GRPC_MSG messages."""
    from concurrent import futures

    import grpc
    chunk = bytes(GRPC_MSG)              # one object sent again and again: no per-message allocation of ours

    def up(requests, context):
        got = 0
        for msg in requests:
            got += len(msg)
            if got >= size:
                got -= size
                yield b"k"

    def down(requests, context):
        for req in requests:
            left = struct.unpack("<Q", req)[0]
            while left:
                n = min(left, GRPC_MSG)
                yield chunk if n == GRPC_MSG else chunk[:n]
                left -= n

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=GRPC_OPTIONS)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bench.Raw", {
        "Up": grpc.stream_stream_rpc_method_handler(up), "Down": grpc.stream_stream_rpc_method_handler(down)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


def shm_peer(conn: socket.socket) -> None:
    """Reader/writer side of the shared-memory baselines."""
    msg, fds, _, _ = socket.recv_fds(conn, 64, 1)
    size, mode = struct.unpack("<QB", msg[:9])
    region = mmap.mmap(fds[0], os.fstat(fds[0]).st_size)
    os.close(fds[0])
    shared = numpy.frombuffer(region, numpy.uint8)
    mine = aligned(size)
    note = bytearray(12)
    rounds = struct.unpack("<I", conn.recv(4))[0]
    for _ in range(rounds):
        if mode == 0:            # whole buffer: the writer filled it, we read it, then say so
            recv_exact(conn, memoryview(note)[:1])
            numpy.copyto(mine, shared[:size])
            conn.sendall(b"k")
        else:                    # ring: read slot after slot as announced, acknowledge each
            done = 0
            while done < size:
                recv_exact(conn, memoryview(note))
                slot, n = struct.unpack("<IQ", note)
                numpy.copyto(mine[done:done + n], shared[slot * RING_SLOT:slot * RING_SLOT + n])
                done += n
                conn.sendall(struct.pack("<I", slot))
    del shared


# -- baselines, client side -------------------------------------------------------------------------
def connect(addresses: dict, kind: str) -> socket.socket:
    if kind == "tcp":
        host, port = addresses["tcp"].rsplit(":", 1)
        s = socket.create_connection((host, int(port)))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    else:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect("\0" + addresses["unix"][1:])
    return s


def raw_rtt(addresses: dict, kind: str, iters: int) -> list[float]:
    s = connect(addresses, kind)
    msg = bytearray(b"p" * RTT_BYTES)
    back = memoryview(bytearray(RTT_BYTES))
    s.sendall(b"P")
    out = []
    for i in range(iters + 200):
        t = time.perf_counter()
        s.sendall(msg)
        recv_exact(s, back)
        if i >= 200:
            out.append(time.perf_counter() - t)
    s.sendall(b"E" * RTT_BYTES)
    s.close()
    return out


def raw_bandwidth(addresses: dict, kind: str, size: int, reps: int) -> tuple[list[float], list[float]]:
    s = connect(addresses, kind)
    buf = aligned(size)
    view = memoryview(buf)
    up, down = [], []
    for i in range(reps + 1):
        t = time.perf_counter()
        s.sendall(b"U" + struct.pack("<Q", size))
        s.sendall(view)
        recv_exact(s, memoryview(bytearray(1)))
        t1 = time.perf_counter()
        s.sendall(b"D" + struct.pack("<Q", size))
        recv_exact(s, view)
        t2 = time.perf_counter()
        if i:
            up.append(t1 - t)
            down.append(t2 - t1)
    s.close()
    return up, down


def shm_handoff(addresses: dict, size: int, reps: int, ring: bool) -> list[float]:
    """Write SIZE bytes into shared memory, notify, the peer reads them out (whole, or a pipelined ring)."""
    region_bytes = RING_SLOTS * RING_SLOT if ring else size
    fd = os.memfd_create("gpuremote-bench")
    os.ftruncate(fd, region_bytes)
    region = mmap.mmap(fd, region_bytes)
    shared = numpy.frombuffer(region, numpy.uint8)
    shared.fill(0)
    src = aligned(size)
    s = connect(addresses, "unix")
    s.sendall(b"S")
    socket.send_fds(s, [struct.pack("<QB", size, 1 if ring else 0)], [fd])
    os.close(fd)
    s.sendall(struct.pack("<I", reps + 1))
    ack = memoryview(bytearray(4))
    out = []
    for i in range(reps + 1):
        t = time.perf_counter()
        if not ring:
            numpy.copyto(shared[:size], src)
            s.sendall(b"n")
            recv_exact(s, ack[:1])
        else:
            pending = 0
            for k, off in enumerate(range(0, size, RING_SLOT)):
                slot = k % RING_SLOTS
                if k >= RING_SLOTS:
                    recv_exact(s, ack)
                    pending -= 1
                n = min(RING_SLOT, size - off)
                numpy.copyto(shared[slot * RING_SLOT:slot * RING_SLOT + n], src[off:off + n])
                s.sendall(struct.pack("<IQ", slot, n))
                pending += 1
            for _ in range(pending):
                recv_exact(s, ack)
        if i:
            out.append(time.perf_counter() - t)
    s.close()
    del shared
    return out


def grpc_bandwidth(address: str, size: int, reps: int) -> tuple[list[float], list[float]]:
    """SIZE bytes up and down a bare gRPC stream in GRPC_MSG messages; one stream each way stays open
    across the repetitions, as gpuremote's session stream does."""
    import grpc
    chunk = bytes(GRPC_MSG)
    msgs = [chunk] * (size // GRPC_MSG) + ([chunk[:size % GRPC_MSG]] if size % GRPC_MSG else [])
    feeds = queue.Queue(), queue.Queue()

    def feed(q):                         # each queue item is a list of messages; None ends the stream
        for batch in iter(q.get, None):
            yield from batch
    channel = grpc.insecure_channel(address, options=GRPC_OPTIONS)
    # The deadline bounds every wait below should the server stall or die; even at 10 MB/s it is not reached.
    deadline = 60 + 2 * (reps + 1) * size / 10e6
    try:
        ups = channel.stream_stream("/bench.Raw/Up")(feed(feeds[0]), timeout=deadline)
        downs = channel.stream_stream("/bench.Raw/Down")(feed(feeds[1]), timeout=deadline)
        up, down = [], []
        for i in range(reps + 1):
            t = time.perf_counter()
            feeds[0].put(msgs)
            next(ups)                    # the ack: all SIZE bytes arrived
            t1 = time.perf_counter()
            feeds[1].put([struct.pack("<Q", size)])
            got = 0
            while got < size:
                got += len(next(downs))
            t2 = time.perf_counter()
            if i:
                up.append(t1 - t)
                down.append(t2 - t1)
        return up, down
    finally:
        for q in feeds:                  # ends the request generators, whose gRPC threads wait on them
            q.put(None)
        channel.close()


def memcpy(size: int, reps: int) -> list[float]:
    a, b = aligned(size), aligned(size)
    out = []
    for i in range(reps + 1):
        t = time.perf_counter()
        numpy.copyto(b, a)
        if i:
            out.append(time.perf_counter() - t)
    return out


# -- gpuremote transports -------------------------------------------------------------------------------
def transport_run(address: str, name: str, size: int, reps: int, rtt_iters: int, raw_addresses: dict) -> dict | None:
    import warnings

    import gpuremote
    from gpuremote.client import context

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        session = gpuremote.connect(address, transport=name)
    try:
        via = getattr(session._link, "via", "")
        actual = session.transport + (f"/{via}" if session.transport == "socket" else "")
        want = {"tcp": "socket/tcp", "unix": "socket/unix"}.get(name, name)
        if actual != want:
            return {"transport": name, "unavailable": f"fell back to {actual}"}
        import gpuremote.cupy as cp
        dev = cp.cuda.Device(len(context.devices()) - 1)
        dev.use()
        host = aligned(size)                # the application's data (touched)
        x = cp.asarray(host)
        dev.synchronize()
        h2d, d2h = [], []
        for i in range(reps + 2):          # two warm-ups: the daemon's buffers come from its pool after that
            t = time.perf_counter()
            y = cp.asarray(host)
            dev.synchronize()
            t1 = time.perf_counter()
            r = x.get()
            t2 = time.perf_counter()
            del y, r
            if i >= 2:
                h2d.append(t1 - t)
                d2h.append(t2 - t1)
        pinned, pinned_d2h = [], []
        if name == "shm":   # to and from cupyx.empty_pinned: the daemon reads and writes it in place (one copy)
            import gpuremote.cupyx as cx
            ph = cx.empty_pinned(size, numpy.uint8)
            ph[:] = 1
            back = cx.empty_pinned(size, numpy.uint8)
            back[:] = 0
            for i in range(reps + 2):
                t = time.perf_counter()
                y = cp.asarray(ph)
                dev.synchronize()
                t1 = time.perf_counter()
                x.get(out=back)
                if i >= 2:
                    pinned.append(t1 - t)
                    pinned_d2h.append(time.perf_counter() - t1)
                del y
        # Round trips, interleaved one by one (the order rotating) with a raw ping-pong over the same kind of
        # socket, so that drift and the CPUs' idle states hit each measurement alike.
        z = cp.asarray(numpy.arange(RTT_BYTES, dtype=numpy.uint8))
        link = session._link
        payload = bytes(RTT_BYTES)
        kind = "tcp" if name in ("tcp", "verbs", "grpc") else "unix"
        raw = connect(raw_addresses, kind)
        raw.sendall(b"P")
        msg, back = bytearray(b"p" * RTT_BYTES), memoryview(bytearray(RTT_BYTES))

        def raw_ping():
            raw.sendall(msg)
            recv_exact(raw, back)
        probes = [("raw", raw_ping), ("sync", dev.synchronize), ("get", z.get)]
        if link is not None:                 # PING/PONG: the channel and the daemon's connection thread only
            probes.append(("channel", lambda: link.ping(payload)))
        times = {label: [] for label, _ in probes}
        clock = time.perf_counter
        for i in range(rtt_iters + 300):
            for k in range(len(probes)):
                label, probe = probes[(i + k) % len(probes)]
                t = clock()
                probe()
                if i >= 300:
                    times[label].append(clock() - t)
        raw.sendall(b"E" * RTT_BYTES)
        raw.close()
        rtt, sync, channel, raw_rtt = times["get"], times["sync"], times.get("channel", []), times["raw"]
        assert numpy.array_equal(x.get()[:1 << 20], host[:1 << 20])
        return {"transport": name, "path": actual, "h2d_s": h2d, "d2h_s": d2h, "rtt_s": rtt, "sync_s": sync,
                "channel_s": channel, "h2d_pinned_s": pinned, "d2h_pinned_s": pinned_d2h, "raw_rtt_s": raw_rtt,
                "raw_kind": kind}
    finally:
        gpuremote.disconnect()


def gbps(samples: list[float], size: int) -> float:
    return size / float(numpy.median(samples)) / 1e9


def us(samples: list[float]) -> float:
    return float(numpy.median(samples)) * 1e6


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (about 15 s instead of 40 s)")
    parser.add_argument("--size", default="256MiB", help="bulk transfer size (default 256MiB)")
    parser.add_argument("--json", metavar="FILE", help="also write the numbers as JSON to FILE")
    parser.add_argument("--serve-raw", metavar="SIZE", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    from gpuremote._config import parse_size
    try:
        size = parse_size(args.size)
    except ValueError as exc:
        parser.error(str(exc))
    if not 1 <= size <= 4 * 2**30:      # the run holds several buffers of this size at once
        parser.error(f"--size must be between 1 byte and 4GiB, not {args.size}")
    if args.serve_raw:
        serve_raw(int(args.serve_raw))
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    reps = 3 if args.quick else 8
    rtt_iters = 1000 if args.quick else 4000
    started = time.perf_counter()
    children = []
    try:
        raw = Child("raw socket server", [sys.executable, os.path.abspath(__file__), "--serve-raw", str(size)])
        children.append(raw)
        m = re.search(r"listening on (\S+) unix:(\S+) grpc:(\S+)", raw.line)
        addresses = {"tcp": m.group(1), "unix": m.group(2)}
        base = {}
        for kind in ("tcp", "unix"):
            up, down = raw_bandwidth(addresses, kind, size, reps)
            base[kind] = {"h2d_gbps": gbps(up, size), "d2h_gbps": gbps(down, size),
                          "rtt_us": us(raw_rtt(addresses, kind, rtt_iters))}
        base["shm_handoff"] = {"gbps": gbps(shm_handoff(addresses, size, reps, ring=False), size)}
        base["shm_ring"] = {"gbps": gbps(shm_handoff(addresses, size, reps, ring=True), size)}
        base["memcpy"] = {"gbps": gbps(memcpy(size, reps), size)}
        up, down = grpc_bandwidth(m.group(3), size, max(2, reps // 2))   # as many as the grpc transport gets
        base["grpc_bare"] = {"h2d_gbps": gbps(up, size), "d2h_gbps": gbps(down, size)}
        memory = str(max(2 * 2**30, 6 * size))
        daemon = Child("gpuremote daemon", [sys.executable, "-m", "gpuremote.cli", "daemon", "--insecure", "--listen",
                                            "127.0.0.1:0", "--backend", "emulated", "--emulate", "1",
                                            "--emulate-memory", memory])
        children.append(daemon)
        address = daemon.address
        results = []
        for name in ("grpc", "tcp", "unix", "shm", "verbs"):
            r = transport_run(address, name, size, reps if name != "grpc" else max(2, reps // 2),
                              rtt_iters if name != "grpc" else rtt_iters // 4, addresses)
            results.append(r)
    finally:
        for c in reversed(children):
            c.stop()
    elapsed = time.perf_counter() - started
    res = report(base, results, size, elapsed)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0


def report(base: dict, results: list, size: int, elapsed: float) -> dict:
    from rich.console import Console
    from rich.table import Table

    def verdict(ok):
        return "[bold green]PASS[/]" if ok else "[bold red]FAIL[/]"

    t = Table(title=f"gpuremote transports vs raw baselines (loopback, {size / 2**20:g} MiB transfers, "
                    f"{RTT_BYTES} B round trips)",
              caption=f"medians; {os.cpu_count()} CPUs, Python {platform.python_version()}; run took {elapsed:.0f} s")
    for col in ("path", "H2D GB/s", "D2H GB/s", "channel RTT us", "sync RTT us", "get RTT us", "target", "ratio",
                "result"):
        t.add_column(col, justify="right" if col not in ("path", "target") else "left")
    for kind in ("tcp", "unix"):
        b = base[kind]
        t.add_row(f"raw {kind.upper()} socket", f"{b['h2d_gbps']:.2f}", f"{b['d2h_gbps']:.2f}", f"{b['rtt_us']:.1f}",
                  "", "", "", "", "")
    t.add_row("raw shm write+notify+read", f"{base['shm_handoff']['gbps']:.2f}", "", "", "", "", "", "", "")
    t.add_row(f"raw shm ring {RING_SLOTS} x {RING_SLOT >> 20} MiB", f"{base['shm_ring']['gbps']:.2f}", "", "", "",
              "", "", "", "")
    t.add_row("memcpy (1 thread)", f"{base['memcpy']['gbps']:.2f}", "", "", "", "", "", "", "")
    bare = base["grpc_bare"]
    t.add_row("raw gRPC bidi stream (bytes)", f"{bare['h2d_gbps']:.2f}", f"{bare['d2h_gbps']:.2f}", "", "", "", "", "",
              "")
    out = {"size": size, "baselines": base, "transports": {}, "pass": {}}
    for r in results:
        name = r["transport"]
        if "unavailable" in r:
            t.add_row(f"{name}", "-", "-", "-", "-", "-", "", "", f"unavailable ({r['unavailable']})")
            out["transports"][name] = {"unavailable": r["unavailable"]}
            continue
        h2d, d2h, rtt, sync = gbps(r["h2d_s"], size), gbps(r["d2h_s"], size), us(r["rtt_s"]), us(r["sync_s"])
        chan = us(r["channel_s"]) if r["channel_s"] else None
        pinned = gbps(r["h2d_pinned_s"], size) if r["h2d_pinned_s"] else None
        pinned_d2h = gbps(r["d2h_pinned_s"], size) if r["d2h_pinned_s"] else None
        out["transports"][name] = {"path": r["path"], "h2d_gbps": h2d, "d2h_gbps": d2h, "rtt_us": rtt,
                                   "sync_rtt_us": sync, "channel_rtt_us": chan, "h2d_pinned_gbps": pinned,
                                   "d2h_pinned_gbps": pinned_d2h}
        checks = []
        if name == "grpc":
            checks.append(("bandwidth", f">= {TARGETS['grpc_gbps']} GB/s", min(h2d, d2h), min(h2d, d2h) >= TARGETS["grpc_gbps"]))
            ratio = min(h2d / bare["h2d_gbps"], d2h / bare["d2h_gbps"])
            checks.append(("bandwidth", f">= {TARGETS['grpc_vs_raw']}x raw gRPC", ratio, ratio >= TARGETS["grpc_vs_raw"]))
        elif name in ("tcp", "unix"):
            ref = base[name]
            ratio = min(h2d / ref["h2d_gbps"], d2h / ref["d2h_gbps"])
            checks.append(("bandwidth", f">= {TARGETS['socket_vs_raw']}x raw {name}", ratio, ratio >= TARGETS["socket_vs_raw"]))
        elif name == "shm":
            ratio = min(h2d, d2h) / base["shm_handoff"]["gbps"]
            checks.append(("bandwidth", f">= {TARGETS['shm_vs_handoff']}x shm handoff", ratio,
                           ratio >= TARGETS["shm_vs_handoff"]))
            ratio = min(h2d, d2h) / base["memcpy"]["gbps"]
            checks.append(("bandwidth", f">= {TARGETS['shm_vs_memcpy']}x memcpy", ratio, ratio >= TARGETS["shm_vs_memcpy"]))
            for label, value in (("pinned H2D", pinned), ("pinned D2H", pinned_d2h)):
                ratio = value / base["memcpy"]["gbps"]
                checks.append((f"{label} {value:.2f} GB/s", f">= {TARGETS['shm_vs_memcpy']}x memcpy", ratio,
                               ratio >= TARGETS["shm_vs_memcpy"]))
        raw_rtt_us = us(r["raw_rtt_s"])
        out["transports"][name]["raw_rtt_us_interleaved"] = raw_rtt_us
        if name != "grpc":
            for label, value in (("channel RTT", chan), ("sync RTT", sync), ("RTT z.get()", rtt)):
                ratio = value / raw_rtt_us
                checks.append((label, f"<= {TARGETS['rtt_vs_raw']}x raw {r['raw_kind']} {raw_rtt_us:.0f} us",
                               ratio, ratio <= TARGETS["rtt_vs_raw"]))
        first = True
        for label, target, ratio, ok in checks:
            t.add_row(f"gpuremote {name} ({r['path']})" if first else "",
                      f"{h2d:.2f}" if first else "", f"{d2h:.2f}" if first else "",
                      (f"{chan:.1f}" if chan else "-") if first else "", f"{sync:.1f}" if first else "",
                      f"{rtt:.1f}" if first else "",
                      f"{label} {target}", f"{ratio:.2f}" + ("" if target.endswith("GB/s") else "x"),
                      verdict(ok))
            out["pass"][f"{name}: {label} {target}"] = bool(ok)
            first = False
    Console(width=220).print(t)
    return out


if __name__ == "__main__":
    sys.exit(main())
