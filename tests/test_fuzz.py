"""Fuzzing the daemon and the pool with malformed, truncated and hostile messages (hypothesis).

Everything runs against real processes: a `gpuremote daemon` (conftest.DaemonProcess) and a
`gpuremote pool` (test_pool_e2e.PoolProcess), talked to over loopback gRPC by raw clients:

- structured: arbitrary ClientMessage / Op / Call / Value messages (surface names and hostile ones,
  forged handles, nested values up to past protobuf's depth limit, huge shapes, bad dtypes, random
  kwargs, uploads whose sizes lie, chunks out of place) on raw Session streams;
- raw bytes at the gRPC layer: truncated serialized messages, random bytes and valid messages
  with flipped bytes, on the Session stream and on every unary method of both services;
- the pool's RPCs with arbitrary field values (Allocate, Register, Heartbeat, Renew, Release).

Each hostile call must end, within its deadline, in an answer or a clean refusal: a status the
service gives on purpose (never UNKNOWN, which is an exception the service did not expect, nor
INTERNAL except for bytes gRPC itself cannot decode). Meanwhile a well-behaved client in another
thread keeps computing and checking results; at the end each service is alive and clean (no
session left over, device memory back to its starting value; no lease or waiter left in the pool).

Reproducing: the examples are derandomized (the same on every run). GPUREMOTE_FUZZ_SEED=N runs a
different, random-but-reproducible set; GPUREMOTE_FUZZ_SCALE=10 runs ten times as many examples.
"""

from __future__ import annotations

import collections
import math
import os
import re
import threading
import time
import traceback

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, seed, settings
from hypothesis import strategies as st

from gpuremote._config import PROTOCOL_VERSION
from gpuremote.surface import SURFACE
from gpuremote.v1 import pool_pb2
from gpuremote.v1 import value_pb2 as vpb
from gpuremote.wire import grants, pb

from conftest import DaemonProcess, backend_args
from test_hostile import connected, too_deep_batch
from test_hostile import opening as hostile_opening
from test_pool_e2e import PoolProcess

SESSION_METHOD = "/gpuremote.v1.Daemon/Session"
CALL_TIMEOUT = 15.0        # seconds; a hostile call that takes longer counts as a hang
# Statuses the daemon ends a session stream with on purpose (None: the stream ended normally).
SESSION_CODES = {None, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION,
                 grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.PERMISSION_DENIED}
POOL_CODES = {None, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION,
              grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.NOT_FOUND}

_SEED = os.environ.get("GPUREMOTE_FUZZ_SEED")
_SCALE = float(os.environ.get("GPUREMOTE_FUZZ_SCALE", "1"))


def fuzz(examples: int):
    """@given's settings: derandomized (or seeded from GPUREMOTE_FUZZ_SEED), no deadline, no database."""
    def decorate(f):
        f = settings(max_examples=max(1, int(examples * _SCALE)), deadline=None, derandomize=_SEED is None,
                     database=None, print_blob=True, suppress_health_check=list(HealthCheck))(f)
        return seed(int(_SEED))(f) if _SEED is not None else f
    return decorate


# -- what the fuzzing saw (printed at the end of the module: a summary, not a verdict) --------------

SEEN: collections.Counter = collections.Counter()
SAMPLES: dict[str, str] = {}           # the first refusal message of each kind
STRICT_META: list[str] = []


def seen(key: str, status) -> None:
    SEEN[key] += 1
    if status is not None:
        SAMPLES.setdefault(key, str(status[1])[:160])


@pytest.fixture(scope="module", autouse=True)
def _summary():
    yield
    if SEEN:
        print("\nfuzz outcomes:", dict(SEEN.most_common()))
        for key, details in sorted(SAMPLES.items()):
            print(f"  {key}: {details}")
    for m in STRICT_META[:10]:
        print("strict-meta mismatch:", m)


# -- the services and the well-behaved clients ----------------------------------------------------------

class GoodClient:
    """gpuremote.cupy in a thread of its own, computing and checking results until stopped."""

    def __init__(self, address: str):
        self.address = address
        self.iterations = 0
        self.errors: list[str] = []
        self.slowest = 0.0
        self.session_id = None
        self.lock = threading.Lock()        # held for each iteration: hold it to see the daemon between them
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fuzz-good-client", daemon=True)
        self._thread.start()
        assert self._ready.wait(30) and self.session_id, self.errors

    def _run(self) -> None:
        try:
            with connected(self.address) as (cp, session):
                self.session_id = session.session_id
                self._ready.set()
                i = 0
                while not self._stop.is_set():
                    start = time.monotonic()
                    with self.lock:
                        self._iteration(cp, i)
                    self.slowest = max(self.slowest, time.monotonic() - start)
                    self.iterations += 1
                    i += 1
                    time.sleep(0.01)         # steady traffic, not a busy loop competing with the fuzzer
        except BaseException:
            self.errors.append(traceback.format_exc())
        finally:
            self._ready.set()

    @staticmethod
    def _iteration(cp, i: int) -> None:
        rng = np.random.default_rng(i)
        host = rng.standard_normal((64, 48)).astype(np.float32)
        x = cp.asarray(host)
        np.testing.assert_allclose((x * 2 + 1).sum(axis=0).get(), (host * 2 + 1).sum(axis=0), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose((x.T @ x).get(), host.T @ host, rtol=1e-4, atol=1e-3)
        assert int(cp.arange(10).sum()) == 45
        if i % 4 == 0:                                  # a chunked upload and a chunked fetch
            big = np.arange(300_000, dtype=np.float64) + i
            np.testing.assert_array_equal((cp.asarray(big) - 1).get(), big - 1)

    def check(self, since: int, timeout: float = 60.0) -> None:
        """No error so far, and at least one iteration completed after `since` did (bounded wait)."""
        deadline = time.monotonic() + timeout
        while self.iterations <= since and not self.errors and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not self.errors, self.errors[0]
        assert self.iterations > since, f"the well-behaved client made no progress in {timeout} s"

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        assert not self._thread.is_alive(), "the well-behaved client hangs"
        assert not self.errors, self.errors[0]


class Victim(DaemonProcess):
    """The daemon under attack; its output is drained so that a full pipe can never stall it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.log: collections.deque[str] = collections.deque(maxlen=200)
        self._drain = threading.Thread(target=lambda: self.log.extend(self.proc.stdout), daemon=True)
        self._drain.start()

    def stop(self) -> None:
        super().stop()
        self._drain.join(timeout=10)


def _settle(d: Victim, keep: set, baseline: list[int] | None, timeout: float = 15.0):
    """Wait (bounded) until only the sessions in `keep` are open and (when given) the device memory is
    `baseline` plus what those sessions hold."""
    deadline = time.monotonic() + timeout
    while True:
        info = d.info()
        others = [s.session_id for s in info.sessions if s.session_id not in keep]
        used = [dev.memory_used for dev in info.devices]
        expected = None if baseline is None else [
            b + sum(s.memory_used.get(i, 0) for s in info.sessions if s.session_id in keep)
            for i, b in enumerate(baseline)]
        if not others and (expected is None or used == expected):
            return info
        if time.monotonic() > deadline:
            raise AssertionError(f"daemon did not settle: sessions {others}, memory_used {used}, expected "
                                 f"{expected}; log:\n{''.join(d.log)}")
        time.sleep(0.05)


def _log_entries(lines) -> list[str]:
    """Log lines grouped into entries (an entry starts with a timestamp; tracebacks continue it)."""
    entries: list[str] = []
    for line in lines:
        if re.match(r"\d{4}-\d\d-\d\d ", line) or not entries:
            entries.append(line)
        else:
            entries[-1] += line
    return entries


def _grpc_refusal(entry: str) -> bool:
    """gRPC's own log of a request it could not decode (it answers INTERNAL): expected under fuzzing."""
    return "Exception deserializing message!" in entry and "DecodeError" in entry


@pytest.fixture(scope="module")
def victim():
    d = Victim(*backend_args(devices=2, memory="256MiB"))
    baseline = [dev.memory_used for dev in d.info().devices]
    good = GoodClient(d.address)
    d.good, d.baseline = good, baseline
    yield d
    try:
        good.stop()
        assert d.proc.poll() is None, "the daemon died"
        _settle(d, set(), baseline)          # nothing left: no session, memory back to its start
        unexpected = [e for e in _log_entries(d.log) if "Traceback" in e and not _grpc_refusal(e)]
        assert not unexpected, "the daemon logged unexpected exceptions:\n" + "\n".join(unexpected[:5])
    finally:
        d.stop()


@pytest.fixture
def daemon_guard(victim):
    """After each fuzz test: the daemon lives, only the good client's session is open, memory adds up,
    and the good client made progress with right answers."""
    since = victim.good.iterations
    yield victim
    assert victim.proc.poll() is None, f"the daemon died:\n{''.join(victim.log)}"
    victim.good.check(since)
    with victim.good.lock:
        _settle(victim, {victim.good.session_id}, victim.baseline)


@pytest.fixture(scope="module")
def wire(victim):
    channel = grpc.insecure_channel(victim.address, options=[("grpc.max_receive_message_length", 64 * 2**20),
                                                             ("grpc.max_send_message_length", 64 * 2**20)])
    yield channel
    channel.close()


# -- raw sessions ----------------------------------------------------------------------------------------------

def run_session(channel: grpc.Channel, messages: list[bytes]):
    """Send serialized messages on one Session stream, half-close; (responses as bytes, status or None)."""
    rpc = channel.stream_stream(SESSION_METHOD, request_serializer=lambda b: b, response_deserializer=lambda b: b)
    received = []
    start = time.monotonic()
    try:
        for msg in rpc(iter(messages), timeout=CALL_TIMEOUT):
            received.append(msg)
    except grpc.RpcError as exc:
        status = (exc.code(), exc.details())
    else:
        status = None
    assert time.monotonic() - start < CALL_TIMEOUT + 5
    return received, status


def check_session_outcome(received: list[bytes], status, reply_ops: int | None) -> list[pb.ServerMessage]:
    code = status[0] if status else None
    seen(f"session:{code.name if code else 'OK'}", status)
    assert code in SESSION_CODES, f"the daemon failed the stream with {status}"
    if code is not None:
        assert status[1], "a refusal must say why"
    messages = [pb.ServerMessage.FromString(m) for m in received]    # the daemon never sends garbage
    if messages:
        assert messages[0].WhichOneof("kind") == "opened"
    replies = [m.reply for m in messages if m.WhichOneof("kind") == "reply"]
    if status is None and reply_ops is not None:
        assert len(replies) == reply_ops, f"{reply_ops} ops wanted a reply, {len(replies)} replies came"
    for r in replies:
        for err in list(r.deferred_errors) + ([r.error] if r.WhichOneof("outcome") == "error" else []):
            SEEN[f"error:{err.type}"] += 1
            SAMPLES.setdefault(f"error:{err.type}", f"{err.op}: {err.message[:160]}")
            assert len(err.message) <= 4096 and len(err.op) <= 128 and len(err.site) <= 512
            if err.type in ("AssertionError", "builtins.AssertionError") and "metadata rule" in err.message:
                STRICT_META.append(err.message[:300])
    return messages


def opening() -> pb.ClientMessage:
    return hostile_opening(name="fuzz")


SETUP_HANDLES = (1, 2, 3, 4)


def setup_batch() -> pb.ClientMessage:
    """Real arrays for the fuzzed ops to find: handles 1-4 (float64, int32, bool, complex64)."""
    m = pb.ClientMessage()
    for h, arr in zip(SETUP_HANDLES, (np.arange(12.0).reshape(3, 4), np.arange(5, dtype=np.int32),
                                      np.array([[True, False], [False, True]]), np.ones(3, np.complex64))):
        op = m.batch.ops.add(seq=h)
        op.upload.handle = h
        op.upload.meta.dtype = arr.dtype.str
        op.upload.meta.shape.extend(arr.shape)
        op.upload.data = arr.tobytes()
    return m


# -- strategies: values ---------------------------------------------------------------------------------------------

U64 = st.integers(0, 2**64 - 1)
U32 = st.integers(0, 2**32 - 1)
# Small ints make real computations; huge ones must be refused, never allocated (2**44 bytes and up
# cannot be allocated on any host, so an attempt fails at once instead of thrashing the test machine).
INTS = st.one_of(st.integers(-4, 16), st.sampled_from([2**44, -(2**44), 2**62, 2**63 - 1, -(2**63), 2**53 + 1]))
DTYPES_OK = ["<f8", "<f4", "<f2", "<i8", "<i4", "<i2", "|i1", "<u8", "<u4", "|u1", "|b1", "<c8", "<c16", ">f8", "=f4",
             "float32", "int64", "bool", "complex"]
DTYPES_BAD = ["|O", "O", "<U3", "|S3", "|V8", "<M8[s]", "<m8[s]", "garbage", "<f8" * 20, "", "<f3", "i0", "(2,)f8",
              "[('a','<i4')]", "f8,i4", "V", "U", "\x00", "<f8\x00"]
DTYPE_TEXT = st.one_of(st.sampled_from(DTYPES_OK + DTYPES_BAD), st.text(max_size=20))
STRINGS = st.one_of(st.sampled_from(["C", "F", "A", "K", "fro", "nuc", "ij,jk->ik", "ii", "i,i", "...->", "same",
                                     "valid", "full", "left", "right", "raise", "wrap", "clip", "unsafe", "same_kind",
                                     "linear", "mean", "reflect", "ortho", "xy", "ij", "little"]),
                    st.text(max_size=24))
HANDLES = st.one_of(st.sampled_from(SETUP_HANDLES), st.integers(5, 12), U64)
SHAPES = st.one_of(st.lists(st.integers(0, 6), max_size=4),
                   st.lists(st.one_of(st.integers(0, 8), st.sampled_from([2**31, 2**40, 2**63, 2**64 - 1])),
                            max_size=40))


def _nbytes(dtype: str, shape) -> int | None:
    try:
        itemsize = np.dtype(dtype).itemsize
    except Exception:
        return None
    n = math.prod(shape) * itemsize
    return n if n <= 4096 else None


@st.composite
def host_arrays(draw) -> vpb.HostArray:
    dtype = draw(DTYPE_TEXT)
    shape = draw(SHAPES)
    n = _nbytes(dtype, shape)
    data = draw(st.binary(min_size=n, max_size=n) if n is not None and draw(st.booleans()) else st.binary(max_size=64))
    return vpb.HostArray(dtype=dtype, shape=shape, data=data, scalar=draw(st.booleans()))


def _deep(depth: int) -> vpb.Value:
    root = v = vpb.Value()
    for _ in range(depth):
        v = v.tuple.items.add()
    v.int_value = 1
    return root


def _slice(start, stop, step) -> vpb.Value:
    v = vpb.Value()
    v.slice.SetInParent()
    for name, part in (("start", start), ("stop", stop), ("step", step)):
        if part is not None:
            getattr(v.slice, name).CopyFrom(part)
    return v


LEAVES = st.one_of(
    HANDLES.map(lambda h: vpb.Value(handle=h)),
    st.booleans().map(lambda b: vpb.Value(bool_value=b)),
    INTS.map(lambda i: vpb.Value(int_value=i)),
    st.floats().map(lambda f: vpb.Value(float_value=f)),
    st.tuples(st.floats(), st.floats()).map(lambda c: vpb.Value(complex_value=vpb.Complex(real=c[0], imag=c[1]))),
    STRINGS.map(lambda s: vpb.Value(str_value=s)),
    st.just(0).map(lambda _: vpb.Value(none=vpb.Empty())),
    st.just(0).map(lambda _: vpb.Value(ellipsis=vpb.Empty())),
    DTYPE_TEXT.map(lambda d: vpb.Value(dtype=d)),
    host_arrays().map(lambda a: vpb.Value(array=a)),
    st.just(0).map(lambda _: vpb.Value()),                        # no kind set at all
)


def _containers(children):
    small = st.lists(children, max_size=4)
    return st.one_of(
        small.map(lambda xs: vpb.Value(tuple=vpb.Sequence(items=xs))),
        small.map(lambda xs: vpb.Value(list=vpb.Sequence(items=xs))),
        st.builds(lambda ks, vs: vpb.Value(dict=vpb.Mapping(keys=ks, values=vs)),   # lengths may differ, keys repeat
                  st.lists(st.sampled_from(["axis", "dtype", "a", "a", ""]) | STRINGS, max_size=4), small),
        st.builds(_slice, st.none() | children, st.none() | children, st.none() | children),
    )


VALUES = st.one_of(st.recursive(LEAVES, _containers, max_leaves=10), st.integers(1, 48).map(_deep))   # deeper: test_raw_bytes_*
# Arguments a real program could send: arrays of the session, small numbers, axes, None.
PLAUSIBLE = st.one_of(
    st.sampled_from(SETUP_HANDLES).map(lambda h: vpb.Value(handle=h)),
    st.integers(-3, 4).map(lambda i: vpb.Value(int_value=i)),
    st.sampled_from([0.0, 0.5, -1.5, 2.0, float("nan")]).map(lambda f: vpb.Value(float_value=f)),
    st.just(0).map(lambda _: vpb.Value(none=vpb.Empty())),
    st.lists(st.integers(-2, 3), min_size=1, max_size=3).map(
        lambda xs: vpb.Value(tuple=vpb.Sequence(items=[vpb.Value(int_value=x) for x in xs]))),
    st.sampled_from(DTYPES_OK[:13]).map(lambda d: vpb.Value(dtype=d)),
)
KWARG_NAMES = st.one_of(st.sampled_from(["axis", "dtype", "out", "keepdims", "order", "casting", "where", "size",
                                         "shape", "k", "n", "ord", "full_matrices", "kind", "mode", "__class__",
                                         "self", ""]), st.text(max_size=12))

SURFACE_NAMES = sorted(SURFACE)
HOSTILE_NAMES = ["os.system", "__import__", "eval", "ndarray.__reduce__", "ndarray.__reduce_ex__", "ndarray.__class__",
                 "ndarray.__init__", "ndarray.__dict__", "ndarray.tofile", "ndarray.dump", "ndarray.__setstate__",
                 "linalg.__builtins__", "random.__getattr__", "cuda.runtime.cudaDeviceReset", "kernel.", "session.",
                 "ndarray.", "ndarray", "cuda.", "load", "save", "fromfile", "ctypeslib.as_array", "lib.format",
                 "", "x" * 10_000, "add\x00", "add.__call__", ".add", "add."]
NAMES = st.one_of(st.sampled_from(SURFACE_NAMES), st.sampled_from(HOSTILE_NAMES), st.text(max_size=30))


# -- strategies: ops and sessions ----------------------------------------------------------------------------------

@st.composite
def calls(draw, op: pb.Op) -> None:
    """Fill op.call: any name, values (plausible or arbitrary), kwargs that may not pair up, result handles."""
    c = op.call
    c.name = draw(NAMES)
    plausible = draw(st.booleans())
    c.args.extend(draw(st.lists(PLAUSIBLE if plausible else VALUES, max_size=4)))
    names = draw(st.lists(KWARG_NAMES, max_size=3))
    c.kwarg_names.extend(names)
    values = draw(st.lists(PLAUSIBLE if plausible else VALUES, min_size=len(names), max_size=len(names)))
    if draw(st.integers(0, 7)) == 0:                              # names and values that do not pair up
        values = values[:-1] if values else [vpb.Value(int_value=1)]
    c.kwarg_values.extend(values)
    c.results.extend(draw(st.lists(st.one_of(st.integers(5, 12), st.sampled_from(SETUP_HANDLES), U64), max_size=3)))
    if draw(st.integers(0, 2)) == 0:                              # also defines a call template
        c.define_template = draw(TEMPLATE_IDS)
    if not (c.args or c.kwarg_names or c.kwarg_values or c.results):
        c.SetInParent()


TEMPLATE_IDS = st.one_of(st.integers(1, 4), st.sampled_from([0, 1024, 1025, 2**32 - 1]))


@st.composite
def replays(draw, op: pb.Op) -> None:
    """Fill op.replay: template ids (defined or not, 0 = release), handles, results, cut anywhere."""
    calls = []
    for _ in range(draw(st.integers(0, 6))):
        calls.append(draw(TEMPLATE_IDS))
        calls.extend(draw(st.lists(HANDLES, max_size=3)))
    op.replay.calls.extend(calls)
    op.replay.SetInParent()


CHUNK_PLANS = ["exact", "exact", "none", "short", "long", "wrong seq", "wrong offset", "extra", "batch between"]


@st.composite
def uploads(draw, op: pb.Op) -> list[pb.ClientMessage]:
    """Fill op.upload; the chunk messages to send after its batch (which may lie)."""
    up = op.upload
    up.handle = draw(st.one_of(st.integers(5, 12), st.sampled_from(SETUP_HANDLES), U64))
    up.meta.dtype = draw(DTYPE_TEXT)
    shape = draw(SHAPES)
    up.meta.shape.extend(shape)
    n = _nbytes(up.meta.dtype, shape)
    up.chunks = draw(st.sampled_from([0, 0, 1, 2, 3, 2**32 - 1]))
    if up.chunks == 0:
        exact = n is not None and draw(st.booleans())
        up.data = draw(st.binary(min_size=n, max_size=n) if exact else st.binary(max_size=80))
        return []
    plan = draw(st.sampled_from(CHUNK_PLANS))
    total = n if n is not None else draw(st.integers(0, 64))
    count = min(up.chunks, 3)
    sizes = [total // count] * (count - 1) + [total - (total // count) * (count - 1)]
    seq, offset, out = op.seq, 0, []
    for i, size in enumerate(sizes):
        m = pb.ClientMessage()
        m.chunk.seq, m.chunk.offset, m.chunk.data = seq, offset, bytes(size)
        offset += size
        out.append(m)
    if plan == "none":
        return []
    if plan == "short":
        out[-1].chunk.data = out[-1].chunk.data[: len(out[-1].chunk.data) // 2]
    elif plan == "long":
        out[-1].chunk.data += b"\1" * draw(st.integers(1, 64))
    elif plan == "wrong seq":
        out[0].chunk.seq = draw(U64)
    elif plan == "wrong offset":
        out[-1].chunk.offset = draw(U64)
    elif plan == "extra":
        out.append(pb.ClientMessage.FromString(out[-1].SerializeToString()))
    elif plan == "batch between":
        between = pb.ClientMessage()
        between.batch.ops.add(seq=(seq + 1) % 2**64, reply=True).sync.SetInParent()
        out.insert(len(out) // 2, between)
    return out


OP_KINDS = ["call", "call", "call", "call", "replay", "replay", "release", "upload", "upload", "fetch", "describe",
            "sync", "none"]


@st.composite
def batches(draw, first_seq: int) -> list[pb.ClientMessage]:
    """One OpBatch message plus the chunk messages (truthful or not) that follow it."""
    m = pb.ClientMessage()
    m.batch.SetInParent()
    after: list[pb.ClientMessage] = []
    for i in range(draw(st.integers(0, 8))):
        op = m.batch.ops.add()
        op.seq = first_seq + i if draw(st.integers(0, 9)) else draw(U64)
        op.device = draw(st.sampled_from([0, 0, 0, 0, 1, 1, 2, 2**32 - 1]))
        op.stream = draw(st.sampled_from([0, 0, 0, 1, 7, 2**32 - 1]))
        op.reply = draw(st.booleans())
        op.site = draw(st.one_of(st.just(""), st.text(max_size=30), st.just("s" * 5000)))
        kind = draw(st.sampled_from(OP_KINDS))
        if kind == "call":
            draw(calls(op))
        elif kind == "replay":
            draw(replays(op))
        elif kind == "release":
            op.release.handles.extend(draw(st.lists(HANDLES, max_size=4)))
        elif kind == "upload":
            after.extend(draw(uploads(op)))
        elif kind == "fetch":
            op.fetch.handle = draw(HANDLES)
            if not draw(st.integers(0, 3)):       # asks to land in client memory the daemon cannot map
                op.fetch.land_segment = draw(st.sampled_from([1, 7, 2**32 - 1]))
                op.fetch.land_offset = draw(st.sampled_from([0, 4096, 2**63, 2**64 - 1]))
        elif kind == "describe":
            op.describe.handle = draw(HANDLES)
        elif kind == "sync":
            op.sync.all_streams = draw(st.booleans())
    return [m, *after]


@st.composite
def stray_messages(draw) -> pb.ClientMessage:
    """Something that does not belong in an open session."""
    kind = draw(st.sampled_from(["chunk", "open", "empty"]))
    m = pb.ClientMessage()
    if kind == "chunk":
        m.chunk.seq, m.chunk.offset, m.chunk.data = draw(U64), draw(U64), draw(st.binary(max_size=32))
    elif kind == "open":
        m.open.protocol_version = PROTOCOL_VERSION
    return m


@st.composite
def fuzzed_open(draw) -> pb.ClientMessage:
    m = pb.ClientMessage()
    o = m.open
    o.protocol_version = draw(st.one_of(st.just(PROTOCOL_VERSION), U32))
    o.client_name = draw(st.one_of(st.text(max_size=40), st.just("n" * 100_000)))
    o.client_pid = draw(U32)
    o.client_host = draw(st.text(max_size=40))
    for _ in range(draw(st.integers(0, 2))):
        o.grants.add(grant=draw(st.binary(max_size=64)), signature=draw(st.binary(max_size=40)))
    return m


@st.composite
def sessions(draw) -> tuple[list[pb.ClientMessage], bool]:
    """(the messages of one session stream, whether its opening is a valid one)."""
    valid_open = draw(st.integers(0, 7)) != 0
    msgs = [opening() if valid_open else draw(fuzzed_open()), setup_batch()]
    seq = 100
    for _ in range(draw(st.integers(0, 5))):
        if draw(st.integers(0, 5)):
            msgs.extend(draw(batches(seq)))
            seq += 10
        else:
            msgs.append(draw(stray_messages()))
    return msgs, valid_open


def _reply_ops(msgs: list[pb.ClientMessage]) -> int:
    return sum(op.reply for m in msgs if m.WhichOneof("kind") == "batch" for op in m.batch.ops)


# -- (a) structured fuzzing of the session stream --------------------------------------------------------------

@fuzz(examples=260)
@given(case=sessions())
def test_structured_sessions(daemon_guard, wire, case):
    msgs, valid_open = case
    received, status = run_session(wire, [m.SerializeToString() for m in msgs])
    check_session_outcome(received, status, _reply_ops(msgs))
    if valid_open:
        assert received, f"a valid OpenSession got no answer: {status}"


@fuzz(examples=40)
@given(ops=st.lists(st.tuples(st.sampled_from(SURFACE_NAMES), st.lists(PLAUSIBLE, min_size=1, max_size=3)),
                    min_size=1, max_size=12))
def test_every_surface_name_with_plausible_arguments(daemon_guard, wire, ops):
    """Surface names called on the session's real arrays: whatever they do, the session goes on."""
    m = pb.ClientMessage()
    for i, (name, args) in enumerate(ops):
        op = m.batch.ops.add(seq=100 + i, reply=True)
        op.call.name = name
        op.call.args.extend(args)
        if SURFACE[name].rule not in ("none", "self", "value"):
            op.call.results.append(20 + i)
    tail = pb.ClientMessage()
    tail.batch.ops.add(seq=999, reply=True).sync.SetInParent()
    msgs = [opening(), setup_batch(), m, tail]
    received, status = run_session(wire, [x.SerializeToString() for x in msgs])
    assert status is None, status
    check_session_outcome(received, status, _reply_ops(msgs))


# -- (b) raw bytes on the session stream ----------------------------------------------------------------------------

def _valid_messages() -> list[bytes]:
    a = np.arange(300_000, dtype=np.float64)
    chunked = pb.ClientMessage()
    op = chunked.batch.ops.add(seq=50, reply=True)
    op.upload.handle, op.upload.chunks = 9, 3
    op.upload.meta.dtype = a.dtype.str
    op.upload.meta.shape.append(a.size)
    data = a.tobytes()
    chunks = []
    for i, off in enumerate(range(0, len(data), 2**20)):
        c = pb.ClientMessage()
        c.chunk.seq, c.chunk.offset, c.chunk.data = 50, off, data[off:off + 2**20]
        chunks.append(c.SerializeToString())
    work = pb.ClientMessage()
    add = work.batch.ops.add(seq=60)
    add.call.name = "add"
    add.call.args.add().handle = 1
    add.call.args.add().float_value = 1.5
    add.call.results.append(10)
    work.batch.ops.add(seq=61, reply=True).fetch.handle = 10
    work.batch.ops.add(seq=62, reply=True).describe.handle = 9
    work.batch.ops.add(seq=63).release.handles.extend([9, 10])
    work.batch.ops.add(seq=64, reply=True).sync.all_streams = True
    return [setup_batch().SerializeToString(), chunked.SerializeToString(), *chunks, work.SerializeToString()]


VALID_OPEN = opening().SerializeToString()
VALID = _valid_messages()


@st.composite
def mutated(draw) -> bytes:
    base = draw(st.sampled_from([VALID_OPEN, *VALID]))
    how = draw(st.sampled_from(["truncate", "flip", "flip", "random", "valid", "deep", "empty", "append"]))
    if how == "truncate":
        return base[:draw(st.integers(0, max(0, len(base) - 1)))]
    if how == "flip":
        b = bytearray(base)
        for _ in range(draw(st.integers(1, 4))):
            b[draw(st.integers(0, len(b) - 1))] = draw(st.integers(0, 255))
        return bytes(b)
    if how == "random":
        return draw(st.binary(max_size=300))
    if how == "deep":
        return too_deep_batch(draw(st.integers(40, 400)))
    if how == "empty":
        return b""
    if how == "append":
        return base + draw(st.binary(min_size=1, max_size=16))
    return base


@fuzz(examples=150)
@given(first=st.one_of(st.just(VALID_OPEN), mutated()), rest=st.lists(mutated(), max_size=5))
def test_raw_bytes_on_the_session_stream(daemon_guard, wire, first, rest):
    received, status = run_session(wire, [first, *rest])
    check_session_outcome(received, status, None)


# -- the pool ----------------------------------------------------------------------------------------------------

GOOD_HOST = "good-host"
POOL_METHODS = {"Register": pool_pb2.RegisterRequest, "Heartbeat": pool_pb2.HeartbeatRequest,
                "Allocate": pool_pb2.AllocateRequest, "Renew": pool_pb2.RenewRequest,
                "Release": pool_pb2.ReleaseRequest, "Status": pool_pb2.StatusRequest,
                "Deregister": pool_pb2.DeregisterRequest}
POOL_REPLIES = {"Register": pool_pb2.RegisterReply, "Heartbeat": pool_pb2.HeartbeatReply,
                "Allocate": pool_pb2.AllocateReply, "Renew": pool_pb2.RenewReply,
                "Release": pool_pb2.ReleaseReply, "Status": pool_pb2.StatusReply,
                "Deregister": pool_pb2.DeregisterReply}


class GoodPoolUser:
    """A daemon-and-client pair that behaves: heartbeats its host, allocates, renews, releases, in a thread."""

    def __init__(self, pool: PoolProcess):
        self.pool = pool
        self.iterations = 0
        self.errors: list[str] = []
        devices = [pool_pb2.PoolDevice(index=i, name=f"Good {i}", memory_total=8 * 2**30) for i in range(2)]
        self.devices = devices
        reply = pool.stub.Register(pool_pb2.RegisterRequest(host_id=GOOD_HOST, address="127.0.0.1:7999",
                                                            backend="emulated", devices=devices), timeout=10)
        self.key = reply.grant_key
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fuzz-good-pool-user", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        stub = self.pool.stub
        try:
            while not self._stop.is_set():
                assert stub.Heartbeat(pool_pb2.HeartbeatRequest(host_id=GOOD_HOST, devices=self.devices),
                                      timeout=10).known
                # waits behind fuzzed requests at most until their deadlines (FIFO queue)
                lease = stub.Allocate(pool_pb2.AllocateRequest(count=1, fraction=0.5, filters=[f"host={GOOD_HOST}"],
                                                               wait_s=20, client_name="good"), timeout=30)
                for s in lease.grants:
                    g = grants.verify(s, self.key)
                    assert g.host_id == GOOD_HOST and g.lease_id == lease.lease_id
                renewed = stub.Renew(pool_pb2.RenewRequest(lease_id=lease.lease_id, lease_secret=lease.lease_secret),
                                     timeout=10)
                assert renewed.expires_at >= lease.expires_at and len(renewed.grants) == len(lease.grants)
                assert any(le.lease_id == lease.lease_id for le in stub.Status(pool_pb2.StatusRequest(), timeout=10).leases)
                stub.Release(pool_pb2.ReleaseRequest(lease_id=lease.lease_id, lease_secret=lease.lease_secret),
                             timeout=10)
                self.iterations += 1
                time.sleep(0.02)
        except BaseException:
            self.errors.append(traceback.format_exc())

    check = GoodClient.check
    stop = GoodClient.stop


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    p = PoolProcess(tmp_path_factory.mktemp("fuzz-pool") / "pool.db")
    good = GoodPoolUser(p)
    p.good, p.leases, p.hosts = good, [], set()
    yield p
    try:
        good.stop()
        assert p.proc.poll() is None, "the pool died"
        for lease in p.leases:              # granted to fuzzed requests and not released yet (none expected)
            p.stub.Release(pool_pb2.ReleaseRequest(lease_id=lease.lease_id, lease_secret=lease.lease_secret),
                           timeout=10)
        status = p.status()
        assert status.waiting == 0 and not status.leases, status
        unexpected = [e for e in _log_entries(p.lines) if "Traceback" in e and not _grpc_refusal(e)]
        assert not unexpected, "the pool logged unexpected exceptions:\n" + "\n".join(unexpected[:5])
    finally:
        p.stop()


@pytest.fixture
def pool_guard(pool):
    since = pool.good.iterations
    yield pool
    assert pool.proc.poll() is None, f"the pool died:\n{pool.output()}"
    pool.good.check(since)
    status = pool.status()
    assert status.waiting == 0, status
    assert len(status.leases) <= 1 and all(le.client_name == "good" for le in status.leases), status.leases
    assert GOOD_HOST in {h.host_id for h in status.hosts}


def pool_call(p: PoolProcess, method: str, request, timeout: float = 3.0):
    """(reply or None, status or None); bounded by `timeout` plus slack."""
    start = time.monotonic()
    try:
        reply = getattr(p.stub, method)(request, timeout=timeout)
        status = None
    except grpc.RpcError as exc:
        reply, status = None, (exc.code(), exc.details())
    assert time.monotonic() - start < timeout + 5, f"{method} took {time.monotonic() - start:.1f} s"
    seen(f"pool.{method}:{status[0].name if status else 'OK'}", status)
    return reply, status


def check_pool_status(method: str, status, may_wait: bool = False) -> None:
    code = status[0] if status else None
    allowed = POOL_CODES | ({grpc.StatusCode.DEADLINE_EXCEEDED} if may_wait else set())
    assert code in allowed, f"{method} failed with {status}"
    if code is not None and code != grpc.StatusCode.DEADLINE_EXCEEDED:
        assert status[1], "a refusal must say why"


FLOATS = st.one_of(st.sampled_from([0.0, -0.0, 1.0, 0.5, 1e-300, -1.0, 2.0, float("nan"), float("inf"), -float("inf"),
                                    1e308, 5e-324]), st.floats())
BIG_U64 = st.one_of(st.integers(0, 2**20), st.sampled_from([2**30, 2**33, 2**44, 2**63, 2**64 - 1]), U64)
FILTERS = st.one_of(
    st.sampled_from(["host=fz-0", "host=fz-1", "device.memory>=16TiB", "host=good-host", "host=", "=", "host==x", "device.name=Good", "device.memory>=1GiB",
                     "device.memory>=0", "device.memory>=garbage", "device.memory>=1.5TiB", "device.memory>=" + "9" * 400,
                     "device.memory>=1" + "0" * 30 + "EiB", "transport=rdma", "transport=", "memory>=1", "host=x" * 100,
                     "device.memory<=1GiB", " host = good-host "]),
    st.text(max_size=40))
TEXTS = st.one_of(st.text(max_size=30), st.just("h" * 300), st.just(""), st.sampled_from(["127.0.0.1:7200", "host:0",
                                                                                           "host:99999", ":80", "a:b"]))


@st.composite
def allocate_requests(draw) -> pool_pb2.AllocateRequest:
    r = pool_pb2.AllocateRequest(count=draw(st.one_of(st.integers(0, 4), U32)),
                                 filters=draw(st.lists(FILTERS, max_size=4) | st.just(["x"] * 40)),
                                 wait_s=draw(st.one_of(st.just(0.0), st.floats(0.01, 0.3), FLOATS)),
                                 client_name=draw(TEXTS))
    size = draw(st.sampled_from(["whole", "unset-whole", "fraction", "memory", "none"]))
    if size == "whole":
        r.whole = True
    elif size == "unset-whole":
        r.whole = False
    elif size == "fraction":
        r.fraction = draw(FLOATS)
    elif size == "memory":
        r.memory = draw(BIG_U64)
    return r


@st.composite
def pool_devices(draw, max_size: int = 4) -> list[pool_pb2.PoolDevice]:
    out = []
    for _ in range(draw(st.integers(0, max_size))):
        d = pool_pb2.PoolDevice(index=draw(st.one_of(st.integers(0, 3), U32)), name=draw(TEXTS),
                                memory_total=draw(BIG_U64), memory_used=draw(BIG_U64), utilization=draw(FLOATS),
                                compute_capability=draw(TEXTS))
        for _ in range(draw(st.integers(0, 2))):
            d.sessions.add(session_id=draw(TEXTS), lease_id=draw(TEXTS), client_name=draw(TEXTS),
                           memory_used=draw(BIG_U64), age_s=draw(FLOATS))
        out.append(d)
    return out


@st.composite
def register_requests(draw) -> pool_pb2.RegisterRequest:
    devices = draw(st.one_of(pool_devices(), st.just(0).map(
        lambda _: [pool_pb2.PoolDevice(index=i, memory_total=2**30) for i in range(70)])))
    return pool_pb2.RegisterRequest(host_id=draw(TEXTS.filter(lambda t: t != GOOD_HOST)), address=draw(TEXTS),
                                    backend=draw(TEXTS), devices=devices,
                                    transports=draw(st.lists(TEXTS, max_size=3) | st.just(["t"] * 40)))


FUZZ_HOSTS = [f"fz-{i}" for i in range(4)]


@st.composite
def plausible_registers(draw) -> pool_pb2.RegisterRequest:
    """Registrations the pool may accept (so later heartbeats and allocations meet known hosts), with
    odd but legal values: tiny and huge devices, sparse indices, many transports."""
    host = draw(st.sampled_from(FUZZ_HOSTS))
    indices = draw(st.lists(st.one_of(st.integers(0, 7), U32), min_size=1, max_size=4, unique=True))
    devices = [pool_pb2.PoolDevice(index=i, name=draw(st.text(max_size=10)),
                                   memory_total=draw(st.sampled_from([1, 2**20, 2**30, 80 * 2**30, 16 * 2**40])),
                                   compute_capability=draw(st.sampled_from(["", "90", "x"])))
               for i in indices]
    return pool_pb2.RegisterRequest(host_id=host, address=f"127.0.0.1:{draw(st.integers(1, 65535))}",
                                    backend=draw(st.sampled_from(["emulated", "cupy", "?"])), devices=devices,
                                    transports=draw(st.lists(st.sampled_from(["rdma", "shm", "socket"]), max_size=3)))


@st.composite
def plausible_allocates(draw) -> pool_pb2.AllocateRequest:
    """Requests that may well be granted (on the fuzzed hosts), so grants, queueing and release get exercised."""
    r = pool_pb2.AllocateRequest(count=draw(st.integers(1, 3)), client_name="fuzz",
                                 filters=draw(st.lists(st.sampled_from([f"host={h}" for h in FUZZ_HOSTS]
                                                                       + ["device.memory>=1GiB"]), max_size=1)),
                                 wait_s=draw(st.sampled_from([0.0, 0.0, 0.05, 0.2])))
    size = draw(st.sampled_from(["whole", "fraction", "memory"]))
    if size == "whole":
        r.whole = True
    elif size == "fraction":
        r.fraction = draw(st.sampled_from([1.0, 0.5, 0.25, 1 / 3, 1e-9]))
    else:
        r.memory = draw(st.sampled_from([1, 2**20, 2**30, 2**40]))
    return r


LEASE_IDS = st.one_of(st.text(max_size=40), st.text("0123456789abcdef", min_size=32, max_size=32), st.just("x" * 10_000))
LEASE_SECRETS = st.one_of(st.just(b""), st.binary(min_size=32, max_size=32), st.binary(max_size=40),
                          st.just(b"s" * 100_000))


@st.composite
def pool_requests(draw):
    method = draw(st.sampled_from(["Allocate", "Allocate", "Register", "Register", "Heartbeat", "Renew", "Release",
                                   "Status", "Deregister"]))
    if method == "Allocate":
        return method, draw(st.one_of(allocate_requests(), plausible_allocates()))
    if method == "Register":
        return method, draw(st.one_of(register_requests(), plausible_registers()))
    if method == "Heartbeat":
        return method, pool_pb2.HeartbeatRequest(
            host_id=draw(st.one_of(st.sampled_from(FUZZ_HOSTS), TEXTS.filter(lambda t: t != GOOD_HOST))),
            devices=draw(pool_devices()))
    if method in ("Renew", "Release"):
        return method, POOL_METHODS[method](lease_id=draw(LEASE_IDS), lease_secret=draw(LEASE_SECRETS))
    if method == "Deregister":      # never the good user's host: it must stay placeable
        return method, pool_pb2.DeregisterRequest(
            host_id=draw(st.one_of(st.sampled_from(FUZZ_HOSTS), TEXTS.filter(lambda t: t != GOOD_HOST))))
    return method, pool_pb2.StatusRequest()


def _handle_pool_reply(p: PoolProcess, method: str, request, reply) -> None:
    """Keep the pool clean: release what a fuzzed Allocate was granted; remember registered hosts."""
    if reply is None:
        return
    if method == "Allocate":
        assert reply.lease_id and len(reply.lease_secret) == 32 and len(reply.grants) == request.count, reply
        p.leases.append(reply)
        # Its public id alone (or with a wrong secret) renews and releases nothing.
        for call, cls in (("Renew", pool_pb2.RenewRequest), ("Release", pool_pb2.ReleaseRequest)):
            _, status = pool_call(p, call, cls(lease_id=reply.lease_id, lease_secret=reply.lease_secret[::-1]))
            assert status and status[0] == grpc.StatusCode.PERMISSION_DENIED, status
        renewed, status = pool_call(p, "Renew", pool_pb2.RenewRequest(lease_id=reply.lease_id,
                                                                      lease_secret=reply.lease_secret))
        assert status is None and len(renewed.grants) == request.count, status
        _, status = pool_call(p, "Release", pool_pb2.ReleaseRequest(lease_id=reply.lease_id,
                                                                    lease_secret=reply.lease_secret))
        assert status is None, status
        p.leases.remove(reply)
    elif method == "Register":
        p.hosts.add(request.host_id or request.address)


@fuzz(examples=300)
@given(requests=st.lists(pool_requests(), min_size=1, max_size=4))
def test_pool_rpcs_with_arbitrary_fields(pool_guard, requests):
    for method, request in requests:
        may_wait = method == "Allocate" and not (math.isfinite(request.wait_s) and request.wait_s <= 0)
        reply, status = pool_call(pool_guard, method, request)
        check_pool_status(method, status, may_wait)
        _handle_pool_reply(pool_guard, method, request, reply)


def _pool_valid_bytes() -> list[tuple[str, bytes]]:
    return [("Allocate", pool_pb2.AllocateRequest(count=1, fraction=0.25, filters=["host=good-host"],
                                                  client_name="x").SerializeToString()),
            ("Register", pool_pb2.RegisterRequest(host_id="raw", address="127.0.0.1:7300", backend="emulated",
                                                  devices=[pool_pb2.PoolDevice(index=0, memory_total=2**30)])
             .SerializeToString()),
            ("Heartbeat", pool_pb2.HeartbeatRequest(host_id="raw", devices=[pool_pb2.PoolDevice(index=0)])
             .SerializeToString()),
            ("Renew", pool_pb2.RenewRequest(lease_id="0" * 32).SerializeToString()),
            ("Release", pool_pb2.ReleaseRequest(lease_id="0" * 32).SerializeToString()),
            ("Renew", pool_pb2.RenewRequest(lease_id="0" * 32, lease_secret=b"\1" * 32).SerializeToString()),
            ("Deregister", pool_pb2.DeregisterRequest(host_id="raw").SerializeToString()),
            ("Status", b"")]


POOL_VALID = _pool_valid_bytes()


@st.composite
def raw_pool_calls(draw) -> tuple[str, bytes]:
    method, base = draw(st.sampled_from(POOL_VALID))
    method = draw(st.one_of(st.just(method), st.sampled_from(sorted(POOL_METHODS))))
    how = draw(st.sampled_from(["truncate", "flip", "flip", "random", "valid", "append"]))
    if how == "truncate":
        return method, base[:draw(st.integers(0, max(0, len(base) - 1)))]
    if how == "flip" and base:
        b = bytearray(base)
        for _ in range(draw(st.integers(1, 4))):
            b[draw(st.integers(0, len(b) - 1))] = draw(st.integers(0, 255))
        return method, bytes(b)
    if how == "random":
        return method, draw(st.binary(max_size=200))
    if how == "append":
        return method, base + draw(st.binary(min_size=1, max_size=16))
    return method, base


def _decodes(cls, data: bytes):
    try:
        return cls.FromString(data)
    except Exception:
        return None


@fuzz(examples=150)
@given(call=raw_pool_calls())
def test_raw_bytes_on_pool_methods(pool_guard, call):
    method, data = call
    rpc = pool_guard.channel.unary_unary(f"/gpuremote.v1.Pool/{method}", request_serializer=lambda b: b,
                                         response_deserializer=lambda b: b)
    request = _decodes(POOL_METHODS[method], data)
    assume(not (method == "Deregister" and request is not None and request.host_id == GOOD_HOST))
    start = time.monotonic()
    try:
        reply, status = rpc(data, timeout=3.0), None
    except grpc.RpcError as exc:
        reply, status = None, (exc.code(), exc.details())
    assert time.monotonic() - start < 8
    seen(f"raw pool.{method}:{status[0].name if status else 'OK'}", status)
    if request is None:         # gRPC cannot decode it: its own refusal, INTERNAL, is the answer
        assert status is not None and status[0] in (grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT), status
        return
    may_wait = method == "Allocate" and not (math.isfinite(request.wait_s) and request.wait_s <= 0)
    check_pool_status(method, status, may_wait)
    if reply is not None:
        _handle_pool_reply(pool_guard, method, request, POOL_REPLIES[method].FromString(reply))


@fuzz(examples=40)
@given(data=st.one_of(st.binary(max_size=100), st.just(b""), st.just(b"\x08\x01")))
def test_raw_bytes_on_daemon_info(daemon_guard, wire, data):
    rpc = wire.unary_unary("/gpuremote.v1.Daemon/Info", request_serializer=lambda b: b,
                           response_deserializer=lambda b: b)
    request = _decodes(pb.InfoRequest, data)
    try:
        reply, status = rpc(data, timeout=5.0), None
    except grpc.RpcError as exc:
        reply, status = None, (exc.code(), exc.details())
    if request is None:
        assert status is not None and status[0] in (grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT), status
    else:
        assert status is None, status
        info = pb.InfoReply.FromString(reply)
        assert info.protocol_version == PROTOCOL_VERSION and len(info.devices) == 2
