"""Bad, hostile and oversized input: every case gets a clear error, and the daemon keeps serving.

Each attack runs against a real daemon process. Wire-level attacks use a raw client that builds
gpuremote.v1 messages by hand (or raw bytes at the gRPC layer). After every test that uses
`target`, a well-behaved client (gpuremote.connect plus a small computation) must still get right
answers, no session may be left over and the daemon's memory_used must be back where it was.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import textwrap
import time

import grpc
import numpy as np
import pytest

import gpuremote
import gpuremote.cupy
from gpuremote._config import DEFAULTS, PROTOCOL_VERSION
from gpuremote.client import context
from gpuremote.client.session import Session as ClientSession
from gpuremote.errors import LimitExceededError, OutOfMemoryError, ProtocolError
from gpuremote.v1 import daemon_pb2_grpc
from gpuremote.v1 import value_pb2 as vpb
from gpuremote.wire import pb
from gpuremote.wire.codec import array_from_wire, encode

from conftest import DaemonProcess, backend_args

SESSION_METHOD = "/gpuremote.v1.Daemon/Session"
OOM = "cupy.cuda.memory.OutOfMemoryError"


# -- daemons ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def victim():
    d = DaemonProcess(*backend_args(devices=1, memory="64MiB"))
    yield d
    d.stop()


@pytest.fixture(scope="module")
def limited():
    """A daemon with lowered limits: 8 handles per session, 16 ops per batch, 2 sessions."""
    d = DaemonProcess(*backend_args(devices=1, memory="64MiB"), "--max-sessions", "2",
                      env={"GPUREMOTE_MAX_HANDLES": "8", "GPUREMOTE_MAX_OPS_PER_BATCH": "16"})
    yield d
    d.stop()


def memory_used(d: DaemonProcess) -> list[int]:
    return [dev.memory_used for dev in d.info().devices]


def settle(d: DaemonProcess, baseline: list[int] | None, timeout: float = 10.0):
    """Wait (bounded) until no session is open and memory_used equals `baseline`; return Info."""
    deadline = time.monotonic() + timeout
    while True:
        info = d.info()
        used = [dev.memory_used for dev in info.devices]
        if not info.sessions and (baseline is None or used == baseline):
            return info
        if time.monotonic() > deadline:
            raise AssertionError(f"daemon did not settle: sessions {[s.session_id for s in info.sessions]}, "
                                 f"memory_used {used}, expected {baseline}")
        time.sleep(0.05)


@contextlib.contextmanager
def connected(address: str):
    """gpuremote.cupy connected to `address` alone; the process's other connections are set aside
    meanwhile and restored afterwards (other test modules share the global client context)."""
    saved = (list(context._sessions), list(context._devices), list(getattr(context, "_addresses", [])),
             dict(vars(context._local)))
    with context._lock:
        context._sessions.clear()
        context._devices.clear()
        getattr(context, "_addresses", []).clear()
    vars(context._local).clear()
    try:
        session = gpuremote.connect(address)
        yield gpuremote.cupy, session
    finally:
        gpuremote.disconnect()
        with context._lock:
            context._sessions[:] = saved[0]
            context._devices[:] = saved[1]
            if hasattr(context, "_addresses"):
                context._addresses[:] = saved[2]
        vars(context._local).clear()
        vars(context._local).update(saved[3])


def check_well_behaved(address: str) -> None:
    with connected(address) as (cp, _):
        host = np.arange(12, dtype=np.float32).reshape(3, 4)
        x = cp.asarray(host)
        np.testing.assert_array_equal(((x * 2 + 1).sum(axis=0)).get(), (host * 2 + 1).sum(axis=0))
        big = np.arange(300_000, dtype=np.float64)          # chunked upload and chunked fetch
        y = cp.asarray(big)
        np.testing.assert_array_equal((y + 1).get(), big + 1)
        assert int(cp.arange(10).sum()) == 45


@pytest.fixture
def target(victim):
    """The victim daemon; afterwards it must be alive, clean and still serving well-behaved clients."""
    settle(victim, None)
    baseline = memory_used(victim)
    yield victim
    assert victim.proc.poll() is None, "the daemon died"
    settle(victim, baseline)
    check_well_behaved(victim.address)
    settle(victim, baseline)


# -- a raw client -------------------------------------------------------------------------

class H(int):
    """Marks an int as a handle when encoding raw call arguments."""


def raw_session(address: str, messages, timeout: float = 20, options=None):
    """Send `messages` (ClientMessage objects or raw bytes) on one Session stream, then half-close.

    Returns (server messages received, (status code, details) or None when the stream ended OK).
    """
    messages = list(messages)
    with grpc.insecure_channel(address, options=options or []) as channel:
        if any(isinstance(m, bytes) for m in messages):
            rpc = channel.stream_stream(SESSION_METHOD, request_serializer=lambda b: b,
                                        response_deserializer=pb.ServerMessage.FromString)
            messages = [m if isinstance(m, bytes) else m.SerializeToString() for m in messages]
        else:
            rpc = daemon_pb2_grpc.DaemonStub(channel).Session
        received = []
        try:
            for msg in rpc(iter(messages), timeout=timeout):
                received.append(msg)
        except grpc.RpcError as exc:
            return received, (exc.code(), exc.details())
        return received, None


def replies(received) -> dict[int, pb.Reply]:
    return {m.reply.seq: m.reply for m in received if m.WhichOneof("kind") == "reply"}


def opening(version: int = PROTOCOL_VERSION, name: str = "hostile-test") -> pb.ClientMessage:
    m = pb.ClientMessage()
    m.open.protocol_version = version
    m.open.client_name = name
    m.open.client_pid = os.getpid()
    return m


def batch(*ops: pb.Op) -> pb.ClientMessage:
    m = pb.ClientMessage()
    m.batch.ops.extend(ops)
    return m


def chunk(seq: int, offset: int, data: bytes) -> pb.ClientMessage:
    m = pb.ClientMessage()
    m.chunk.seq, m.chunk.offset, m.chunk.data = seq, offset, data
    return m


def upload(seq, handle, arr=None, *, dtype=None, shape=None, data=None, chunks=0, reply=False, device=0):
    op = pb.Op(seq=seq, reply=reply, device=device)
    op.upload.handle = handle
    op.upload.meta.dtype = dtype if dtype is not None else arr.dtype.str
    op.upload.meta.shape.extend(shape if shape is not None else arr.shape)
    op.upload.chunks = chunks
    if not chunks:
        op.upload.data = data if data is not None else arr.tobytes()
    return op


def call(seq, name, args=(), kwargs=None, results=(), reply=False, device=0) -> pb.Op:
    op = pb.Op(seq=seq, reply=reply, device=device)
    op.call.name = name
    op.call.SetInParent()

    def handle_of(obj):
        return int(obj) if isinstance(obj, H) else None
    for a in args:
        encode(a, op.call.args.add(), handle_of)
    for k, v in (kwargs or {}).items():
        op.call.kwarg_names.append(k)
        encode(v, op.call.kwarg_values.add(), handle_of)
    op.call.results.extend(results)
    return op


def sync(seq) -> pb.Op:
    op = pb.Op(seq=seq, reply=True)
    op.sync.SetInParent()
    return op


def fetch(seq, handle) -> pb.Op:
    op = pb.Op(seq=seq, reply=True)
    op.fetch.handle = handle
    return op


def describe(seq, handle) -> pb.Op:
    op = pb.Op(seq=seq, reply=True)
    op.describe.handle = handle
    return op


def release(seq, *handles, reply=False) -> pb.Op:
    op = pb.Op(seq=seq, reply=reply)
    op.release.handles.extend(handles)
    return op


def error_of(reply: pb.Reply) -> pb.Error:
    assert reply.WhichOneof("outcome") == "error", f"expected an error, got {reply}"
    return reply.error


def assert_ok(reply: pb.Reply) -> None:
    assert reply.WhichOneof("outcome") != "error", f"unexpected error: {reply.error.type}: {reply.error.message}"
    assert not reply.deferred_errors, [e.message for e in reply.deferred_errors]


def assert_refused(status, code: grpc.StatusCode, *fragments: str) -> None:
    assert status is not None, "the daemon accepted what it should have refused"
    assert status[0] == code, status
    for f in fragments:
        assert f in status[1], status


# -- names outside the surface table ---------------------------------------------------------

@pytest.mark.parametrize("name", ["os.system", "__import__", "ndarray.__reduce__", "ndarray.__class__",
                                  "linalg.__builtins__", "", "x" * 10_000])
def test_name_outside_surface_table_raw(target, name):
    received, status = raw_session(target.address, [opening(), batch(call(1, name, (1,), reply=True), sync(2))])
    assert status is None
    r = replies(received)
    err = error_of(r[1])
    assert err.type == "gpuremote.UnsupportedOperationError"
    assert "surface table" in err.message and len(err.message) < 400 and len(err.op) <= 128
    assert_ok(r[2])  # the session goes on


def test_name_outside_surface_table_attribute(target):
    with connected(target.address) as (cp, _):
        for module, attr in ((cp, "system"), (cp, "__loader_x"), (cp.linalg, "eval"), (cp.fft, "nope"),
                             (cp.random, "os"), (cp.cuda.runtime, "cudaDeviceReset")):
            with pytest.raises(AttributeError) as info:
                getattr(module, attr)
            assert attr in str(info.value)
        x = cp.ones(3)
        with pytest.raises(AttributeError):
            x.no_such_method()
        assert float(x.sum()) == 3.0


# -- handles ----------------------------------------------------------------------------------

def test_forged_handles(target):
    a = np.arange(6, dtype=np.float64)
    ops = [upload(1, 5, a), fetch(2, 6), describe(3, 2**64 - 1), call(4, "add", (H(999), 1), results=(7,), reply=True),
           release(5, 12345, reply=True), fetch(6, 5), fetch(7, 7)]
    received, status = raw_session(target.address, [opening(), batch(*ops)])
    assert status is None
    r = replies(received)
    for seq, handle in ((2, 6), (3, 2**64 - 1), (4, 999), (5, 12345)):
        err = error_of(r[seq])
        assert err.type == "KeyError" and f"unknown handle {handle}" in err.message
    np.testing.assert_array_equal(array_from_wire(r[6].value.array), a)   # the real array is intact
    assert "unknown handle 999" in error_of(r[7]).message                    # poisoned with the cause


def test_another_sessions_handle(target):
    with connected(target.address) as (cp, session_a):
        host = np.arange(1000, dtype=np.float32)
        x = cp.asarray(host)
        y = x * 3
        assert y.shape == (1000,) and float(y[1]) == 3.0
        before = target.info()
        held = {s.session_id: dict(s.memory_used) for s in before.sessions}
        h = x._gr_handle
        ops = [fetch(1, h), describe(2, h), call(3, "multiply", (H(h), 2), results=(h + 100,)),
               fetch(4, h + 100), release(5, h, y._gr_handle, reply=True),
               call(6, "ndarray.fill", (H(h), 0.0), reply=True), sync(7)]
        received, status = raw_session(target.address, [opening(name="intruder"), batch(*ops)])
        assert status is None
        r = replies(received)
        for seq in (1, 2, 4, 5, 6):
            err = error_of(r[seq])
            assert err.type == "KeyError" and "unknown handle" in err.message, err
        assert "in this session" in r[1].error.message
        assert_ok(r[7])
        # A's arrays and memory are untouched.
        np.testing.assert_array_equal(x.get(), host)
        np.testing.assert_array_equal(y.get(), host * 3)
        after = target.info()
        assert {s.session_id: dict(s.memory_used) for s in after.sessions} == held


# -- dtypes -----------------------------------------------------------------------------------

def test_object_and_string_dtypes_client(target):
    with connected(target.address) as (cp, session):
        sent = gpuremote.stats()
        for bad in (np.array([1, None], dtype=object), np.array(["abc"]), np.array([b"ab"]),
                    np.zeros(2, dtype=[("a", "i4"), ("b", "f4")]), np.zeros(2, dtype="M8[s]")):
            with pytest.raises(TypeError, match="not supported"):
                cp.asarray(bad)
        with pytest.raises(TypeError, match="object"):
            cp.zeros(3, dtype=object)
        now = gpuremote.stats()
        assert (now["ops"], now["messages"]) == (sent["ops"], sent["messages"])   # nothing queued or sent
        assert not len(session._ops)
        x = cp.ones(3)
        with pytest.raises(TypeError):
            cp.add(x, np.array(["a", "b", "c"]))
        with pytest.raises(TypeError, match="not supported"):
            x.astype("U3")
        s = cp.zeros(3, dtype="U3")         # a dtype by name reaches the daemon, which refuses it
        with pytest.raises(TypeError, match="U3"):
            s.get()
        assert float(x.sum()) == 3.0


@pytest.mark.parametrize("dtype,itemsize", [("|O", 8), ("<U3", 12), ("|S3", 3), ("|V8", 8), ("<M8[s]", 8),
                                            ("<m8[s]", 8), ("garbage", 1), ("<f8" * 20, 8)])
def test_object_and_string_dtypes_raw(target, dtype, itemsize):
    arg = vpb.Value()
    arg.array.dtype, arg.array.data = dtype, b"\0" * itemsize
    arg.array.shape.append(1)
    op2 = call(2, "add", (1,), results=(2,), reply=True)
    op2.call.args.insert(0, arg)
    op3 = call(3, "zeros", (3,), results=(3,), reply=True)
    op3.call.kwarg_names.append("dtype")
    op3.call.kwarg_values.add().dtype = dtype
    ops = [upload(1, 1, dtype=dtype, shape=[1], data=b"\0" * itemsize, reply=True), op2, op3, sync(4)]
    received, status = raw_session(target.address, [opening(), batch(*ops)])
    assert status is None
    r = replies(received)
    for seq in (1, 2, 3):
        err = error_of(r[seq])
        assert err.type == "TypeError", err
        assert "dtype" in err.message
    assert_ok(r[4])


def test_dtype_by_name_is_refused_by_the_daemon(target):
    ops = [call(1, "zeros", (3,), {"dtype": "U3"}, results=(1,)), call(2, "full", (2, "ab"), results=(2,)),
           fetch(3, 1), fetch(4, 2), sync(5)]
    received, status = raw_session(target.address, [opening(), batch(*ops)])
    assert status is None
    r = replies(received)
    for seq in (3, 4):
        err = error_of(r[seq])
        assert err.type in ("TypeError", "ValueError") and "U" in err.message, err


# -- shapes, sizes and ranks -------------------------------------------------------------------

def test_huge_shape_client(target):
    with connected(target.address) as (cp, _):
        for shape in ((2**40, 2**40), (2**63,), (2**64,)):
            with pytest.raises(ValueError) as mine:
                cp.zeros(shape)
            with pytest.raises(ValueError) as numpys:
                np.zeros(shape)
            assert type(mine.value) is type(numpys.value)
        with pytest.raises(ValueError, match="too big"):    # empty, yet too big for NumPy: refused too
            cp.zeros((0, 2**40, 2**40)).get()
        with pytest.raises(ValueError, match="negative"):
            cp.ones((-1, 3))
        assert float(cp.ones(4).sum()) == 4.0


@pytest.mark.parametrize("shape", [[2**40, 2**40], [2**64 - 1], [0, 2**64 - 1], [2**63, 2], [0, 2**40, 2**40]])
def test_huge_shape_raw_upload(target, shape):
    received, status = raw_session(target.address, [
        opening(),
        batch(upload(1, 1, dtype="<f8", shape=shape, data=b"", reply=True)),
        batch(upload(2, 2, dtype="<f8", shape=shape, chunks=2)),   # refused before its chunks: they are skipped
        chunk(2, 0, b"\0" * 8), chunk(2, 8, b"\0" * 8),
        batch(fetch(3, 2), describe(4, 1), sync(5)),
    ])
    assert status is None, status
    r = replies(received)
    for seq in (1, 3):
        err = error_of(r[seq])
        assert err.type == "ValueError" and "array is too big" in err.message, err
    assert error_of(r[4]).message == r[1].error.message          # handle 1 is poisoned with the cause
    assert r[5].WhichOneof("outcome") == "value"


def test_huge_shape_raw_argument(target):
    arg = vpb.Value()
    arg.array.dtype = "<f8"
    arg.array.shape.extend([2**40, 2**40])
    op = call(1, "negative", (), results=(1,), reply=True)
    op.call.args.append(arg)
    ops = [op, call(2, "zeros", ((2**40, 2**40),), results=(2,), reply=True),
           call(3, "zeros", ((2**62,),), {"dtype": np.dtype(np.int8)}, results=(3,), reply=True), sync(4)]
    received, status = raw_session(target.address, [opening(), batch(*ops)])
    assert status is None
    r = replies(received)
    assert error_of(r[1]).type == "ValueError" and "too big" in r[1].error.message
    assert error_of(r[2]).type == "ValueError"
    assert error_of(r[3]).type == OOM
    assert_ok(r[4])


def test_upload_byte_count_mismatch(target):
    a = np.arange(3, dtype=np.float64)
    short_arg = vpb.Value()
    short_arg.array.dtype = "<f8"
    short_arg.array.shape.append(3)
    short_arg.array.data = b"\0" * 5
    op5 = call(5, "negative", (), results=(5,), reply=True)
    op5.call.args.append(short_arg)
    received, status = raw_session(target.address, [
        opening(),
        batch(upload(1, 1, dtype="<f8", shape=[3], data=b"\0" * 5, reply=True),
              upload(2, 2, dtype="<f8", shape=[3], data=b"\0" * 32, reply=True),
              upload(3, 3, dtype="<f8", shape=[3], chunks=2, reply=True)),
        chunk(3, 0, b"\0" * 8), chunk(3, 8, b"\0" * 8),             # 16 of 24 bytes
        batch(upload(4, 4, a, chunks=2)), chunk(4, 0, a.tobytes()[:8]), chunk(4, 8, a.tobytes()[8:]),
        batch(op5, fetch(6, 4)),
    ])
    assert status is None, status
    r = replies(received)
    assert "upload of 5 bytes for shape (3,)" in error_of(r[1]).message
    assert "upload of 32 bytes" in error_of(r[2]).message
    assert "delivered 16 of 24 bytes" in error_of(r[3]).message
    assert "array payload is 5 bytes" in error_of(r[5]).message
    np.testing.assert_array_equal(array_from_wire(r[6].value.array), a)


def test_upload_chunk_past_the_end_ends_the_session(target):
    received, status = raw_session(target.address, [
        opening(), batch(upload(1, 1, dtype="<f8", shape=[3], chunks=1)), chunk(1, 0, b"\0" * 40),
        batch(sync(2))])
    assert_refused(status, grpc.StatusCode.INVALID_ARGUMENT, "upload for op 1", "out of step")


def test_rank_limit(target):
    with connected(target.address) as (cp, _):
        assert cp.zeros((1,) * DEFAULTS.max_rank).get().ndim == DEFAULTS.max_rank
        with pytest.raises(LimitExceededError, match=f"rank {DEFAULTS.max_rank + 1} exceeds the limit"):
            cp.zeros((1,) * (DEFAULTS.max_rank + 1)).get()
        with pytest.raises(LimitExceededError, match="exceeds the limit"):
            cp.ones(1).reshape((1,) * (DEFAULTS.max_rank + 1)).get()
        with pytest.raises(ValueError, match="exceeds the limit"):      # LimitExceededError is a ValueError
            cp.ones(1).reshape((1,) * (DEFAULTS.max_rank + 1)).sum().get()
    deep = [1] * (DEFAULTS.max_rank + 1)
    arg = vpb.Value()
    arg.array.dtype, arg.array.data = "<f8", b"\0" * 8
    arg.array.shape.extend(deep)
    op3 = call(3, "negative", (), results=(3,), reply=True)
    op3.call.args.append(arg)
    received, status = raw_session(target.address, [opening(), batch(
        upload(1, 1, dtype="<f8", shape=deep, data=b"\0" * 8, reply=True),
        upload(2, 2, dtype="<f8", shape=deep[1:], data=b"\0" * 8, reply=True), op3)])
    assert status is None
    r = replies(received)
    for seq in (1, 3):
        err = error_of(r[seq])
        assert err.type == "gpuremote.LimitExceededError" and "exceeds the limit of" in err.message
    assert_ok(r[2])


# -- device memory ------------------------------------------------------------------------------

def test_out_of_memory(target):
    cap = target.info().devices[0].memory_total
    OutOfMemory = gpuremote.cupy.cuda.memory.OutOfMemoryError
    assert OutOfMemory is OutOfMemoryError and issubclass(OutOfMemory, MemoryError)
    with connected(target.address) as (cp, _):
        base = memory_used(target)
        with pytest.raises(OutOfMemory, match="Out of memory allocating"):
            cp.zeros(cap // 8 + 1).get()
        assert memory_used(target) == base                        # nothing allocated
        hold = cp.ones(min(cap // 2, 32 * 2**20) // 8)
        assert float(hold[:4].sum()) == 4.0
        held = memory_used(target)[0] - base[0]
        assert held >= hold.nbytes
        with pytest.raises(OutOfMemory):
            cp.empty((cap - held) // 8 + 8).get()             # would fit alone, not beside `hold`
        with pytest.raises(OutOfMemory):
            cp.broadcast_to(cp.ones(1), (cap // 8 + 1,)).get()   # fetch copies a view to a buffer first
        assert abs(memory_used(target)[0] - base[0] - held) < 1024  # small temporaries at most
        # another session asking for more than is left is refused too; this one is untouched
        received, status = raw_session(target.address, [opening(), batch(
            upload(1, 1, dtype="|u1", shape=[cap - held + 1], data=b"", reply=True))])
        assert status is None and error_of(replies(received)[1]).type == OOM
        if cap <= 2**30:                                           # a chunked upload past capacity
            with pytest.raises(OutOfMemory):
                cp.asarray(np.zeros((cap - hold.nbytes) // 8 + 1)).get()     # (temporaries are freed by now)
        assert float(hold.sum()) == hold.size                     # the session keeps working
        del hold
        assert int(cp.arange(5).sum()) == 10


# -- malformed streams ---------------------------------------------------------------------------

@pytest.mark.parametrize("first", ["batch", "chunk", "empty", "nothing", "empty bytes"])
def test_first_message_not_open(target, first):
    msgs = {"batch": [batch(sync(1))], "chunk": [chunk(1, 0, b"x")], "empty": [pb.ClientMessage()],
            "nothing": [], "empty bytes": [b""]}[first]
    received, status = raw_session(target.address, msgs)
    assert not received
    assert_refused(status, grpc.StatusCode.INVALID_ARGUMENT, "first message of a session must be OpenSession")


def test_second_open(target):
    received, status = raw_session(target.address, [opening(), batch(sync(1)), opening()])
    assert [m.WhichOneof("kind") for m in received] == ["opened", "reply"]
    assert_refused(status, grpc.StatusCode.INVALID_ARGUMENT, "unexpected open message")


def test_empty_op_and_malformed_calls(target):
    names_only = call(2, "add", (1, 2), reply=True)
    names_only.call.kwarg_names.append("out")
    values_only = call(3, "add", (1, 2), reply=True)
    values_only.call.kwarg_values.add().int_value = 1
    repeated = call(4, "add", (1, 2), reply=True)
    repeated.call.kwarg_names.extend(["casting", "casting"])
    repeated.call.kwarg_values.add().str_value = "unsafe"
    repeated.call.kwarg_values.add().str_value = "unsafe"
    bad_dict = call(5, "add", (1, 2), reply=True)
    v = bad_dict.call.kwarg_values.add()
    bad_dict.call.kwarg_names.append("x")
    v.dict.keys.extend(["a", "a"])
    v.dict.values.add().int_value = 1
    empty_value = call(6, "add", (1,), reply=True)
    empty_value.call.args.add()
    ops = [pb.Op(seq=1, reply=True), names_only, values_only, repeated, bad_dict, empty_value,
           call(7, "ones", (3,), results=(0,), reply=True),                 # handle 0 is reserved
           call(8, "divmod", (np.arange(3.0), 2.0), results=(9, 9), reply=True),   # one handle twice
           call(9, "copyto", (1, 2), results=(10,), reply=True),             # returns nothing
           call(10, "ndarray.sum", (5,), results=(11,), reply=True),        # not an array
           call(11, "ones", (3,), results=(12,), device=99, reply=True),
           call(12, "cuda.runtime.getDeviceProperties", (99,), reply=True),
           call(14, "session.memory_peak", (np.arange(1 << 12),), reply=True),
           call(15, "session.memory_peak", device=99, reply=True),
           sync(13)]
    received, status = raw_session(target.address, [opening(), batch(*ops)])
    assert status is None
    r = replies(received)
    expect = {1: "op names no operation", 2: "kwarg_names and kwarg_values differ in length",
              3: "kwarg_names and kwarg_values differ in length", 4: "keyword argument is repeated",
              5: "malformed dict value", 6: "empty value", 7: "handle 0 is already in use or reserved",
              8: "handle 9 is already in use", 9: "returns no array",
              11: "device 99 does not exist", 12: "device 99 does not exist",
              14: "session.memory_peak takes no arguments", 15: "device 99 does not exist"}
    for seq, fragment in expect.items():
        assert fragment in error_of(r[seq]).message, (seq, r[seq].error)
    assert error_of(r[10]).type in ("TypeError", "AttributeError") and "int" in r[10].error.message
    assert_ok(r[13])


@pytest.mark.parametrize("make", [lambda cp: cp.tril_indices(10**6), lambda cp: cp.diag_indices(10**9, 3),
                                  lambda cp: cp.resize(cp.ones(3), (10**5, 10**5)),
                                  lambda cp: cp.vander(cp.ones(10**4), 10**6),
                                  lambda cp: cp.add.outer(cp.ones(10**5), cp.ones(10**5))])
def test_huge_results_of_value_arguments_are_refused_before_they_exist(target, make):
    with connected(target.address) as (cp, _):
        with pytest.raises(OutOfMemoryError):
            result = make(cp)
            for r in (result if isinstance(result, tuple) else (result,)):
                r.get()
        assert float(cp.ones(3).sum()) == 3.0                       # the session goes on


def test_diag_indices_of_more_dimensions_than_an_array_has_is_refused(target):
    with connected(target.address) as (cp, _):
        with pytest.raises(ValueError, match="more dimensions than an array can have"):
            cp.diag_indices(2, 10**6)
    ops = [call(1, "diag_indices", (2, 10**6), results=(5,), reply=True)]       # a client that asks anyway
    received, status = raw_session(target.address, [opening(), batch(*ops)])
    assert status is None
    assert "more dimensions than an array can have" in error_of(replies(received)[1]).message


def test_the_daemon_refuses_bad_special_calls_on_the_wire(target):
    ops = [call(1, "scipy.special.erf", (np.ones(3, dtype=np.complex128),), results=(5,), reply=True),
           call(2, "scipy.special.erf", (np.ones(3), np.ones(3)), results=(6,), reply=True),
           call(3, "scipy.special.xlogy", (np.ones(3),), kwargs={"out": np.ones(3)}, results=(7,), reply=True),
           call(4, "scipy.special.wrightomega", (np.ones(3),), results=(8,), reply=True),
           call(5, "scipy.special.gamma", (np.full(4, 0.5),), results=(9,), reply=True)]
    received, status = raw_session(target.address, [opening(), batch(*ops)])
    assert status is None
    r = replies(received)
    assert "take real arrays" in error_of(r[1]).message
    assert "takes 1 argument (2 given)" in error_of(r[2]).message
    assert "no keyword arguments" in error_of(r[3]).message
    assert "wrightomega" in error_of(r[4]).message
    assert r[5].WhichOneof("outcome") != "error", r[5]


def _nested(depth: int) -> vpb.Value:
    root = v = vpb.Value()
    for _ in range(depth):
        v = v.tuple.items.add()
    v.int_value = 1
    return root


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field, encoded by hand."""
    def varint(n: int) -> bytes:
        out = b""
        while True:
            out += bytes([(n & 0x7F) | (0x80 if n > 0x7F else 0)])
            n >>= 7
            if not n:
                return out
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def too_deep_batch(depth: int) -> bytes:
    """ClientMessage{batch{ops{call{add, args: ((((...1...))))}}}} nested past protobuf's decoder limit
    (built by hand: the protobuf library itself refuses to hold such a message)."""
    value = vpb.Value(int_value=1).SerializeToString()
    for _ in range(depth):
        value = _field(11, _field(1, value))               # Value.tuple -> Sequence.items
    call_bytes = pb.Call(name="add").SerializeToString() + _field(2, value)
    op = pb.Op(seq=1, reply=True).SerializeToString() + _field(10, call_bytes)
    return _field(2, _field(1, op))                          # ClientMessage.batch -> OpBatch.ops


def test_value_nested_deeper_than_the_limit(target):
    op = call(1, "add", (1,), reply=True)
    op.call.args.append(_nested(DEFAULTS.max_value_depth + 8))
    received, status = raw_session(target.address, [opening(), batch(op, sync(2))])
    assert status is None
    r = replies(received)
    err = error_of(r[1])
    assert err.type == "gpuremote.LimitExceededError" and "nested deeper than" in err.message
    assert_ok(r[2])
    # Deeper than protobuf's own recursion limit: the message cannot even be decoded.
    with pytest.raises(Exception):
        pb.ClientMessage.FromString(too_deep_batch(150))
    received, status = raw_session(target.address, [opening(), too_deep_batch(150)])
    assert_refused(status, grpc.StatusCode.INVALID_ARGUMENT, "not a valid gpuremote.v1.ClientMessage")
    # The client refuses to build such a value in the first place.
    with pytest.raises(LimitExceededError, match="nested deeper"):
        nested: list = [1]
        for _ in range(DEFAULTS.max_value_depth + 2):
            nested = [nested]
        encode(nested, vpb.Value(), lambda obj: None)


@pytest.mark.parametrize("where", ["first", "after open", "after a batch"])
def test_garbage_bytes(target, where):
    garbage = b"\xff\xff\xff\xff\x0f not a protobuf \x00\x01"
    msgs = {"first": [garbage], "after open": [opening(), garbage],
            "after a batch": [opening(), batch(upload(1, 1, np.ones(4))), garbage]}[where]
    _, status = raw_session(target.address, msgs)
    assert_refused(status, grpc.StatusCode.INVALID_ARGUMENT, "not a valid gpuremote.v1.ClientMessage",
                   "same gpuremote release")


def test_chunk_without_upload(target):
    received, status = raw_session(target.address, [opening(), batch(sync(1)), chunk(7, 0, b"abc")])
    assert len(replies(received)) == 1
    assert_refused(status, grpc.StatusCode.INVALID_ARGUMENT, "unexpected chunk", "Upload op")


@pytest.mark.parametrize("case", ["offset", "seq", "batch instead", "stream ends"])
def test_chunks_out_of_order(target, case):
    a = np.arange(10, dtype=np.float64)
    data = a.tobytes()
    head = [opening(), batch(upload(1, 1, a, chunks=2))]
    tail = {"offset": [chunk(1, 40, data[40:]), chunk(1, 0, data[:40]), batch(sync(3))],
            "seq": [chunk(2, 0, data[:40]), chunk(2, 40, data[40:]), batch(sync(3))],
            "batch instead": [chunk(1, 0, data[:40]), batch(sync(2))],
            "stream ends": [chunk(1, 0, data[:40])]}[case]
    _, status = raw_session(target.address, head + tail)
    assert_refused(status, grpc.StatusCode.INVALID_ARGUMENT, "upload for op 1", "out of step")


def test_upload_to_missing_device_skips_its_chunks(target):
    a = np.arange(4, dtype=np.float64)
    received, status = raw_session(target.address, [
        opening(), batch(upload(1, 1, a, chunks=2, device=7, reply=True)),
        chunk(1, 0, a.tobytes()[:16]), chunk(1, 16, a.tobytes()[16:]), batch(sync(2))])
    assert status is None, status
    r = replies(received)
    assert "device 7 does not exist" in error_of(r[1]).message
    assert_ok(r[2])


# -- message size and batch limits -----------------------------------------------------------------

def test_oversized_message_raw(target):
    n = DEFAULTS.max_message_bytes + 2**20
    received, status = raw_session(
        target.address, [opening(), batch(upload(1, 1, dtype="|u1", shape=[n], data=b"\0" * n, reply=True))],
        options=[("grpc.max_send_message_length", 2 * n)])
    assert_refused(status, grpc.StatusCode.RESOURCE_EXHAUSTED, "larger than max")


def test_oversized_message_client(target):
    with connected(target.address) as (cp, session):
        x = cp.ones(3)
        assert float(x.sum()) == 3.0
        n = DEFAULTS.max_message_bytes + 2**20

        def fill(op):
            op.upload.handle = session.new_handle()
            op.upload.meta.dtype = "|u1"
            op.upload.meta.shape.append(n)
            op.upload.data = b"\0" * n
        with pytest.raises(LimitExceededError, match="message size limit") as info:
            session.request(fill)
        assert "cupy.asarray" in str(info.value)
        with pytest.raises(LimitExceededError):       # the session is gone; it says so again
            cp.ones(3).get()


def test_many_inline_uploads_stay_under_the_message_limit(target):
    per = DEFAULTS.inline_bytes // 8
    count = DEFAULTS.max_message_bytes // DEFAULTS.inline_bytes + 8   # more than one message holds
    with connected(target.address) as (cp, _):
        xs = [cp.asarray(np.full(per, i, dtype=np.float64)) for i in range(count)]
        total = xs[0]
        for x in xs[1:]:
            total = total + x
        assert float(total[0]) == sum(range(count))


def test_mass_release_is_split(target):
    with connected(target.address) as (cp, session):
        x = cp.ones(3)
        # ~18 MB of release handles (unknown to the daemon): must not become one oversized message
        session._releases.extend(range(2**40, 2**40 + 3_000_000))
        with pytest.raises(KeyError, match="release of unknown handle"):
            cp.cuda.Device().synchronize()     # the releases go before the next op
        cp.cuda.Device().synchronize()
        assert float(x.sum()) == 3.0


def test_batch_over_the_op_limit(target):
    n = DEFAULTS.max_ops_per_batch + 1
    ops = [upload(1, 1, np.ones(2))] + [sync(i) for i in range(2, n + 1)]
    received, status = raw_session(target.address, [opening(), batch(*ops), batch(fetch(n + 1, 1), sync(n + 2))])
    assert status is None
    r = replies(received)
    assert set(r) == set(range(2, n + 3))                          # every reply op is answered
    err = error_of(r[n])
    assert err.type == "gpuremote.LimitExceededError"
    assert f"batch of {n} ops exceeds the limit of {DEFAULTS.max_ops_per_batch}" in err.message
    assert "none of it was run" in error_of(r[n + 1]).message       # the upload never happened
    assert_ok(r[n + 2])


def test_lowered_limits(limited):
    settle(limited, None)
    baseline = memory_used(limited)
    # ops per batch: a raw batch over the limit is refused as a whole...
    received, status = raw_session(limited.address, [opening(), batch(*[sync(i) for i in range(1, 18)]),
                                                     batch(*[sync(i) for i in range(18, 34)])])
    assert status is None
    r = replies(received)
    assert "exceeds the limit of 16" in error_of(r[1]).message
    assert all(r[i].WhichOneof("outcome") == "value" for i in range(18, 34))
    # ...handles per session: the 9th array is refused, the rest are fine
    received, status = raw_session(limited.address, [opening(), batch(
        *[upload(i, i, np.full(2, float(i))) for i in range(1, 11)], fetch(11, 8), fetch(12, 9), sync(13))])
    assert status is None
    r = replies(received)
    assert array_from_wire(r[11].value.array)[0] == 8.0
    assert [e.seq for e in r[11].deferred_errors] == [9, 10]
    assert "the limit is 8" in r[11].deferred_errors[1].message
    assert "the limit is 8" in error_of(r[12]).message and "free arrays" in r[12].error.message
    assert_ok(r[13])
    settle(limited, baseline)
    # ...and the client keeps to both, and frees arrays to get under the handle limit.
    with connected(limited.address) as (cp, _):
        x = cp.zeros(4)
        for _ in range(100):                                     # 100 queued ops, 16 per batch at most
            x += 1
        assert float(x[0]) == 100.0
        keep = [cp.ones(2) for _ in range(8)]
        with pytest.raises(LimitExceededError, match="the limit is 8"):
            keep[-1].get()
        del keep
        cp.cuda.Device().synchronize()                            # the releases leave with this batch
        assert int(cp.arange(4).sum()) == 6
    settle(limited, baseline)
    check_well_behaved(limited.address)
    settle(limited, baseline)


def test_session_limit(limited):
    settle(limited, None)
    baseline = memory_used(limited)
    sessions = []
    try:
        sessions = [ClientSession(limited.address) for _ in range(2)]
        with pytest.raises(LimitExceededError, match="already serves 2 sessions"):
            ClientSession(limited.address)
        sessions.pop().close()
        sessions.append(ClientSession(limited.address))       # a slot is free again
    finally:
        for s in sessions:
            s.close()
    settle(limited, baseline)


# -- protocol versions -------------------------------------------------------------------------------

def test_protocol_version_mismatch_raw(target):
    received, status = raw_session(target.address, [opening(version=PROTOCOL_VERSION + 41), batch(sync(1))])
    assert not received
    assert_refused(status, grpc.StatusCode.FAILED_PRECONDITION, f"client speaks version {PROTOCOL_VERSION + 41}",
                   f"speaks version {PROTOCOL_VERSION}", "same gpuremote release")


def test_protocol_version_mismatch_client(target, monkeypatch):
    import gpuremote.client.session as client_session
    monkeypatch.setattr(client_session, "PROTOCOL_VERSION", PROTOCOL_VERSION + 1)
    with pytest.raises(ProtocolError) as info:
        ClientSession(target.address)
    message = str(info.value)
    assert f"version {PROTOCOL_VERSION + 1}" in message and f"version {PROTOCOL_VERSION}" in message


# -- a client that dies ----------------------------------------------------------------------------

_HOLDER = textwrap.dedent("""
    import sys, time
    import numpy as np
    import gpuremote, gpuremote.cupy as cp
    gpuremote.connect(sys.argv[1])
    x = cp.ones(2**20)                        # 8 MiB
    y = cp.asarray(np.arange(300_000.0))      # chunked upload
    assert float(x.sum()) == 2**20 and float(y[-1]) == 299_999.0
    print("holding", flush=True)
    time.sleep(60)
""")


def test_client_killed_while_holding_memory(target):
    baseline = memory_used(target)
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, target.address], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        line = proc.stdout.readline() if ready else ""
        assert line.strip() == "holding", line + (proc.stdout.read() if proc.poll() is not None else "")
        info = target.info()
        mine = [s for s in info.sessions if s.client_pid == proc.pid]
        assert len(mine) == 1 and mine[0].memory_used[0] >= 2**23
        assert info.devices[0].memory_used >= baseline[0] + 2**23
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        info = settle(target, baseline, timeout=20)
        assert not any(s.client_pid == proc.pid for s in info.sessions)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        proc.stdout.close()
