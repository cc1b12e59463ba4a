#!/usr/bin/env python
"""Where a training step's time goes, per op, each side measured alone in this process.

    python benchmarks/hot_path.py [--steps 200] [--rounds 7] [--json FILE]

One SGD step of examples/train_mlp.py at its default sizes (batch 64, hidden 128: 39 ops, each a
few microseconds of NumPy), measured six ways, round after round so that drift on a noisy
machine hits all alike (best round of each is reported):

  numpy   the step on NumPy, one BLAS thread (as the emulated daemon runs its arrays);
  floor   the step on a do-nothing proxy whose every op returns a new object: the least a
          Python shim that forwards each call can cost (the example's own Python included);
  client  the step on gpuremote.cupy against a daemon subprocess (Unix socket link), with the
          link's sends dropped: the client's own CPU per op (main thread); once with the compiled
          path for replayed calls (native/forward.c), once with the Python path alone;
  daemon  the messages those steps sent, recorded, run again through the daemon's session code
          (Session.run_batch, emulated backend) in this process: the daemon's CPU per op; once
          with the compiled replay loop (native/replay.c), once with the Python loop alone.

Remote wall time per op is about max(client, daemon) when both keep up with each other on two
cores; train_overhead.py's target (remote <= 1.25x local) needs both near `numpy`. The ratios
are what to compare between runs and commits; absolute figures drift.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import pathlib
import sys
import time

import numpy

from _child import Child

ROOT = pathlib.Path(__file__).resolve().parents[1]


def load_example():
    spec = importlib.util.spec_from_file_location("train_mlp", ROOT / "examples" / "train_mlp.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Proxy:
    """An array stand-in that does nothing: every op returns a new one of the same shape."""

    __slots__ = ("shape",)

    def __init__(self, shape=()):
        self.shape = shape

    def _op(self, *args, **kwargs):
        return _Proxy(self.shape)

    __matmul__ = __add__ = __sub__ = __mul__ = __rmul__ = __truediv__ = __neg__ = __gt__ = __eq__ = _op
    __getitem__ = __isub__ = __itruediv__ = max = sum = copy = mean = argmax = _op
    T = property(_op)

    def __setitem__(self, key, value):
        pass


class _NullModule:
    """The few module functions the example calls, on _Proxy."""

    float32 = numpy.float32

    def asarray(self, a):
        return _Proxy(numpy.shape(a))

    def zeros(self, n, dtype=None):
        return _Proxy((n,))

    def arange(self, n):
        return _Proxy((n,))

    def maximum(self, a, b):
        return _Proxy(a.shape)

    exp = log = lambda self, a: _Proxy(a.shape)  # noqa: E731


def per_op(fn, ops: int) -> float:
    """Main-thread CPU microseconds per op of one call of `fn` doing `ops` ops."""
    t = time.thread_time()
    fn()
    return (time.thread_time() - t) / ops * 1e6


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="SGD steps per measurement (default 200)")
    parser.add_argument("--rounds", type=int, default=7, help="rounds of the six measurements (default 7)")
    parser.add_argument("--json", metavar="FILE", help="also write the numbers as JSON to FILE")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.rounds < 1:
        parser.error("--steps and --rounds must be at least 1")

    from threadpoolctl import threadpool_limits

    import gpuremote
    import gpuremote.cupy as cp
    from gpuremote._config import DEFAULTS
    from gpuremote.daemon.backends.emulated import EmulatedBackend
    from gpuremote.cupy._core import use_compiled_path
    from gpuremote.daemon.session import Session
    from gpuremote.wire import pb

    example = load_example()
    (xtr, ytr), _ = example.load_digits(0)
    batch, hidden = 64, 128
    x_host, y_host = xtr[:batch], ytr[:batch]
    threadpool_limits(limits=DEFAULTS.emulate_blas_threads, user_api="blas")

    local = example.MLP(numpy, x_host.shape[1], hidden, 10, 0.1)
    null = example.MLP(_NullModule(), x_host.shape[1], hidden, 10, 0.1)
    x_null, y_null = _Proxy(x_host.shape), _Proxy(y_host.shape)

    daemon = Child("gpuremote daemon", [sys.executable, "-m", "gpuremote.cli", "daemon", "--insecure", "--listen",
                                        "127.0.0.1:0", "--backend", "emulated", "--emulate", "1"])
    try:
        session = gpuremote.connect(daemon.address, transport="unix")
        link = session._link
        if link is None or not hasattr(link, "send"):
            raise SystemExit(f"the client did not attach a socket link to {daemon.address}: nothing to measure")
        recorded: list[bytes] = []
        send = link.send

        def record(msg):
            recorded.append(msg.SerializeToString())
            send(msg)
        link.send = record
        remote = example.MLP(cp, x_host.shape[1], hidden, 10, 0.1)
        x_dev, y_dev = cp.asarray(x_host), cp.asarray(y_host)
        before = gpuremote.stats()["ops"]
        for _ in range(args.steps):      # these steps define the call templates and are then replayed
            remote.step(x_dev, y_dev)
        cp.cuda.Device().synchronize()
        recorded_ops = gpuremote.stats()["ops"] - before
        ops_per_step = recorded_ops / args.steps
        link.send = lambda msg: None    # from here on the client's own work only
        messages = [pb.ClientMessage.FromString(b) for b in recorded]
        for m in messages:              # bulk uploads arrived as frames after their op: inline them
            for op in m.batch.ops:
                if op.WhichOneof("kind") == "upload" and op.upload.chunks:
                    up = op.upload
                    up.data = bytes(math.prod(up.meta.shape) * numpy.dtype(up.meta.dtype).itemsize)
                    up.chunks = 0
        backend = EmulatedBackend(1)
        limits = session.limits         # the ones the daemon gave this session (SessionOpened.limits)

        def steps(model, x, y):
            for _ in range(args.steps):
                model.step(x, y)

        def replay_daemon(compiled=True):
            s = Session(backend, pb.OpenSession(), limits)
            if not compiled:
                s._compiled = None      # the Python loop alone (as GPUREMOTE_NATIVE=0)
            try:
                for m in messages:
                    if m.WhichOneof("kind") == "batch":
                        for _ in s.run_batch(m.batch, lambda: None):
                            pass
                if s._deferred:
                    raise SystemExit(f"the recorded messages failed on the daemon: {s._deferred[0].message}")
                return s.ops
            finally:
                s.close()

        daemon_ops = replay_daemon()
        n = ops_per_step * args.steps
        best = dict.fromkeys(LABELS, math.inf)
        for _ in range(args.rounds):
            best["numpy"] = min(best["numpy"], per_op(lambda: steps(local, x_host, y_host), n))
            best["floor"] = min(best["floor"], per_op(lambda: steps(null, x_null, y_null), n))
            best["client"] = min(best["client"], per_op(lambda: steps(remote, x_dev, y_dev), n))
            use_compiled_path(False)
            best["client_python"] = min(best["client_python"], per_op(lambda: steps(remote, x_dev, y_dev), n))
            use_compiled_path(True)
            best["daemon"] = min(best["daemon"], per_op(replay_daemon, daemon_ops))
            best["daemon_python"] = min(best["daemon_python"], per_op(lambda: replay_daemon(False), daemon_ops))
        backend.close()
    finally:
        gpuremote.disconnect()
        daemon.stop()
    report(best, ops_per_step, args)
    return 0


LABELS = {"numpy": "NumPy in process (1 BLAS thread)", "floor": "do-nothing Python proxy",
          "client": "gpuremote client (sends dropped)", "client_python": "  the same, Python path alone",
          "daemon": "gpuremote daemon session (in process)", "daemon_python": "  the same, Python loop alone"}


def report(best: dict, ops_per_step: float, args) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"one SGD step of train_mlp.py (batch 64, hidden 128, {ops_per_step:.0f} ops), per op",
              caption=f"best of {args.rounds} rounds of {args.steps} steps; main-thread CPU time")
    for col in ("side", "us per op", "x numpy"):
        t.add_column(col, justify="left" if col == "side" else "right")
    for key, label in LABELS.items():
        t.add_row(label, f"{best[key]:.2f}", f"{best[key] / best['numpy']:.2f}x")
    Console().print(t)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"ops_per_step": ops_per_step, "us_per_op": best}, indent=2))


if __name__ == "__main__":
    sys.exit(main())
