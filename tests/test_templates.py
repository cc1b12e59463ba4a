"""Call templates (client/session.py, daemon/templates.py): a call repeated at one site is sent in
full, then defines a template, then is replayed by id. Replays must behave exactly as full calls:
same results, the same errors at the same sync point naming the same op and line, poisoning,
out-of-memory refusals; and a hostile client's malformed templates and replays get clear errors
while the daemon serves on (test_hostile's `target` checks that after each test).

tests/test_equivalence.py runs every one of its cases three times, so all of them pass through
the full call, the definition and the replay.
"""

from __future__ import annotations

import numpy as np
import pytest

import gpuremote
from gpuremote._config import DEFAULTS
from gpuremote.errors import OutOfMemoryError
from gpuremote.wire import pb

from gpuremote.wire.codec import array_from_wire

from conftest import BACKEND, DaemonProcess, backend_args
from gpuremote.daemon import session as session_module
from test_hostile import (H, assert_ok, batch, call, connected, error_of, fetch, opening,  # noqa: F401
                          raw_session, replies, sync, target, upload)


@pytest.fixture(scope="module", params=["compiled", "python"])
def victim(request):
    """test_hostile's daemon (`target` checks it afterwards), once per replay loop: the compiled one
    (native/replay.c) and the Python one (GPUREMOTE_NATIVE=0) must behave alike in every test here."""
    if request.param == "compiled" and session_module._compiled is None:
        pytest.skip("gpuremote._replay is not built (no C compiler at install): the daemon runs the Python loop")
    d = DaemonProcess(*backend_args(devices=1, memory="64MiB"),
                      env={"GPUREMOTE_NATIVE": "1" if request.param == "compiled" else "0"})
    assert f"replay loop {request.param}" in d.banner.lower() or BACKEND == "cupy", d.banner
    yield d
    d.stop()


def replay(seq: int, *calls: int) -> pb.Op:
    op = pb.Op(seq=seq)
    op.replay.calls.extend(calls)
    return op


def fetched(reply: pb.Reply) -> np.ndarray:
    assert reply.WhichOneof("outcome") == "value", reply
    return array_from_wire(reply.value.array)


def define(seq, tid, name, args=(), kwargs=None, results=(), reply=False) -> pb.Op:
    op = call(seq, name, args, kwargs, results, reply=reply)
    op.call.define_template = tid
    return op


# -- through the client --------------------------------------------------------------------------

def test_a_loop_is_replayed_with_numpys_results(target):
    rng = np.random.default_rng(1)
    w_host = rng.standard_normal((8, 4)).astype(np.float32)
    with connected(target.address) as (cp, session):
        w, w_np = cp.asarray(w_host), w_host.copy()
        before = gpuremote.stats()
        for step in range(6):
            x_host = rng.standard_normal((5, 8)).astype(np.float32)
            x = cp.asarray(x_host)
            y = cp.maximum(x @ w, 0).sum(axis=1, keepdims=True)     # function, matmul, reduction kwargs
            w -= np.float32(0.01) * (x.T @ (y * x[:, :4]))             # in place, a view, a NumPy scalar
            y_np = np.maximum(x_host @ w_np, 0).sum(axis=1, keepdims=True)
            w_np -= np.float32(0.01) * (x_host.T @ (y_np * x_host[:, :4]))
            np.testing.assert_allclose(y.get(), y_np, rtol=1e-5)
        np.testing.assert_allclose(w.get(), w_np, rtol=1e-5)
        after = gpuremote.stats()
        # steps 0 and 1 send the calls in full (the second defines them); 2..5 replay all 9
        assert after["replayed"] - before["replayed"] == 4 * 9
        assert len(session._templates) == 9


def test_the_sessions_peak_memory_counts_replayed_results(target):
    from gpuremote.cupy._core import service_call
    with connected(target.address) as (cp, _):
        def peak():
            return service_call("session.memory_peak", value=True)
        assert peak() == 0
        a = cp.zeros(256, dtype=cp.float32)             # 1 KiB
        kept = []
        for _ in range(6):
            kept.append(a + 1)          # full, defining, then 4 replays: the peak grows in the replays
        view = kept[-1][:10]            # a view takes no memory of its own
        assert peak() == 7 * 1024
        del view, kept
        b = cp.zeros(512, dtype=cp.float32)             # 2 KiB more, 3 KiB held
        assert peak() == 7 * 1024 and cp.get_default_memory_pool().used_bytes() == 3 * 1024
        assert gpuremote.stats()["replayed"] >= 4
        del a, b
    with connected(target.address) as (cp, _):       # a new session starts from nothing
        assert service_call("session.memory_peak", value=True) == 0


def test_a_replayed_call_fails_at_the_sync_point_with_its_line(target):
    with connected(target.address) as (cp, _):
        mats = [np.eye(3), 2 * np.eye(3), np.zeros((3, 3)), np.eye(3)]
        for i, m in enumerate(mats):
            a = cp.asarray(m)
            inv = cp.linalg.inv(a)            # the third is singular: a replayed call fails
            out = inv * 2                     # ... and poisons what uses its result
            if i < 2:
                np.testing.assert_allclose(out.get(), np.linalg.inv(m) * 2)
            elif i == 2:
                with pytest.raises(np.linalg.LinAlgError, match="[Ss]ingular") as info:
                    out.get()
                assert "linalg.inv issued at" in str(info.value) and "test_templates.py" in str(info.value)
            else:
                np.testing.assert_allclose(out.get(), np.linalg.inv(m) * 2)     # the session goes on
        assert gpuremote.stats()["replayed"] > 0


def test_a_replayed_call_that_would_not_fit_is_refused_and_nothing_leaks(target):
    cap = target.info().devices[0].memory_total
    n = cap // 8 // 6                        # each result takes a sixth of the device
    with connected(target.address) as (cp, _):
        x = cp.ones(n)
        kept = []
        with pytest.raises(OutOfMemoryError):
            for _ in range(8):
                kept.append(x * 2)           # the fourth and later are replays; one does not fit
                kept[-1][:1].get()
        del kept
        assert float((x * 3)[:2].sum()) == 6.0


def test_replayed_views_scalars_and_functions_keep_results_and_the_ledger_exact(target):
    # The daemon runs a replayed call whose arrays lead its arguments as one Python call (templates.direct):
    # a view must share its owner's bytes, a reduction to a NumPy scalar must come back as a 0-d array.
    host = np.arange(12, dtype=np.float32)
    with connected(target.address) as (cp, session):
        x = cp.asarray(host)
        before = gpuremote.stats()["replayed"]
        for _ in range(4):
            v = x.reshape(3, 4)                 # method, a view of x
            s = v.sum()                         # method, a scalar on the daemon
            m = cp.maximum(v, s)                # function of two arrays
            c = cp.clip(m, 2.0, 70.0)           # function, constants after the arrays
            k = v.max(axis=1, keepdims=True)    # method with keywords
        assert gpuremote.stats()["replayed"] - before == 2 * 5
        expect_s = host.sum()
        assert s.shape == () and float(s) == expect_s
        np.testing.assert_array_equal(c.get(), np.clip(np.maximum(host.reshape(3, 4), expect_s), 2.0, 70.0))
        np.testing.assert_array_equal(k.get(), host.reshape(3, 4).max(axis=1, keepdims=True))
        mine = [dict(t.memory_used) for t in target.info().sessions if t.session_id == session.session_id]
        # x (48 B; v shares it), s (4 B), m and c (48 B each), k (12 B)
        assert mine == [{0: 48 + 4 + 48 + 48 + 12}]


def test_minus_zero_and_zero_are_different_templates(target):
    with connected(target.address) as (cp, _):
        x = cp.asarray(np.array([1.0, -2.0]))
        for c in (0.0, 0.0, 0.0, -0.0, -0.0, 0.0):
            got = (x * c).get()
            np.testing.assert_array_equal(np.signbit(got), np.signbit(np.array([1.0, -2.0]) * c))
        for c in (np.float32(0.0), np.float32(0.0), np.float32(-0.0), np.float32(-0.0)):
            np.testing.assert_array_equal(np.signbit((x * c).get()), np.signbit(np.array([1.0, -2.0]) * c))


def test_template_ids_are_reused_past_the_limit(target):
    with connected(target.address) as (cp, session):
        session._max_templates = 3           # as if the daemon allowed 3 (SessionOpened.limits)
        x = cp.arange(4.0)
        for step in range(5):
            outs = [x + 1, x + 2, x + 3, x + 4, x + 5]      # five sites, three template ids
            for k, o in enumerate(outs, 1):
                np.testing.assert_array_equal(o.get(), np.arange(4.0) + k)
        assert max(session._templates.values()) <= 3


def test_arrays_of_two_daemons_in_a_replayed_call(target, fresh_daemon):
    with connected(target.address) as (cp, _):
        gpuremote.connect(fresh_daemon.address)
        a = cp.ones(3)
        with cp.cuda.Device(1):
            b = cp.ones(3)
        for _ in range(4):
            with pytest.raises(ValueError, match="mixes arrays from two daemons"):
                a + b
            np.testing.assert_array_equal((a + a).get(), 2 * np.ones(3))


def test_a_daemon_with_templates_off_gets_full_calls_only():
    d = DaemonProcess(*backend_args(devices=1, memory="64MiB"), env={"GPUREMOTE_MAX_TEMPLATES": "0"})
    try:
        with connected(d.address) as (cp, session):
            assert session.limits.max_templates == 0
            x = cp.arange(3.0)
            before = gpuremote.stats()["replayed"]
            for _ in range(4):
                np.testing.assert_array_equal((x * 2).get(), [0.0, 2.0, 4.0])
            assert gpuremote.stats()["replayed"] == before and not session._templates
        received, status = raw_session(d.address, [opening(), batch(
            upload(1, 1, np.ones(2)), define(2, 1, "negative", (H(1),), results=(2,)), sync(3))])
        assert status is None
        assert "past this session's limit of 0" in replies(received)[3].deferred_errors[0].message
    finally:
        d.stop()


# -- on the wire: malformed and hostile templates and replays -------------------------------------

def test_replays_run_in_order_with_results_and_errors(target):
    x = np.arange(6, dtype=np.float64)
    ops = [upload(1, 1, x),
           define(2, 1, "add", (H(1), 1.5), results=(2,)),
           replay(3, 1, 2, 3,   1, 3, 4),                  # handle 2 + 1.5 -> 3, then 3 + 1.5 -> 4
           define(5, 2, "ndarray.sum", (H(4),), {"axis": 0}, results=(5,)),
           replay(6, 2, 1, 6,   1, 999, 7,   1, 7, 8),     # unknown handle 999, then its poison
           fetch(9, 6),
           fetch(10, 4),
           sync(11)]
    received, status = raw_session(target.address, [opening(), batch(*ops)])
    assert status is None
    r = replies(received)
    assert fetched(r[9]) == x.sum()
    np.testing.assert_array_equal(fetched(r[10]), x + 4.5)
    errors = list(r[9].deferred_errors)
    assert len(errors) == 1 and "unknown handle 999" in errors[0].message
    assert errors[0].seq == 7 and errors[0].op == "add"      # the second call of the run op seq 6
    assert_ok(r[11])


def test_one_run_of_plain_and_unusual_calls_and_releases(target):
    # The compiled loop runs the plain calls and releases and hands every other item to the Python
    # loop mid-run (new shapes, an unknown or poisoned handle, a scalar result, a bad release); the
    # results, the errors with their sequence numbers and the memory ledger must not tell which ran.
    a, b = np.arange(6.0), np.arange(4.0)
    ops = [upload(1, 1, a), upload(2, 2, b),
           define(3, 1, "add", (H(1), 1.0), results=(3,)),
           define(4, 2, "ndarray.__isub__", (H(3), 0.5)),
           define(5, 3, "ndarray.sum", (H(3),), results=(5,)),
           replay(6, 1, 1, 10,        # call 0: a + 1
                  2, 10,              # call 1: in place, -= 0.5
                  1, 2, 11,           # call 2: new shapes, b + 1
                  1, 999, 12,         # call 3: unknown handle 999, 12 poisoned
                  1, 12, 13,          # call 4: poisoned input, 13 poisoned
                  0, 12,              # release of a poisoned handle
                  0, 555,             # release of an unknown handle: reported
                  3, 10, 14,          # call 5: a NumPy scalar on the daemon, bound as a 0-d array
                  0, 10,              # release
                  1, 11, 15,          # call 6: b + 2
                  0, 11, 0, 15),
           fetch(7, 14), fetch(8, 13), define(9, 4, "multiply", (H(14), 2.0), results=(16,)), fetch(10, 16),
           sync(11)]
    received, status = raw_session(target.address, [opening(), batch(*ops)])
    assert status is None
    r = replies(received)
    assert fetched(r[7]).shape == () and float(fetched(r[7])) == (a + 0.5).sum()
    errors = {e.seq: (e.op, e.message) for e in r[7].deferred_errors}
    assert errors.keys() == {9, 11}
    assert errors[9][0] == "add" and "unknown handle 999" in errors[9][1]
    assert errors[11][0] == "release" and "555" in errors[11][1]
    assert "unknown handle 999" in error_of(r[8]).message         # 13 carries the original error
    assert float(fetched(r[10])) == 2 * (a + 0.5).sum()
    assert_ok(r[11])


def test_malformed_replays_and_definitions(target):
    x = np.arange(4, dtype=np.float32)
    over = DEFAULTS.max_templates + 1
    ops = [upload(1, 1, x),
           replay(2, 7, 1, 2),                                          # never defined
           define(3, 1, "add", (H(1), 1), results=(3,)),
           replay(4, 1, 1),                                             # ends inside a call
           define(5, over, "add", (H(1), 1), results=(5,)),              # id past the limit
           define(6, 2, "cuda.runtime.getDeviceCount"),                 # a service
           define(7, 3, "add", (H(1), np.arange(3.0)), results=(7,)),    # a host array constant
           define(8, 4, "add", (H(1), 1), results=(8,), reply=True),      # wants a reply
           define(9, 5, "add", (H(1), "x" * 3000), results=(9,)),         # too large
           define(10, 6, "no_such_function", (H(1),), results=(10,)),
           define(11, 7, "ndarray.fill", (H(1), 1.0), results=(11,)),    # returns nothing
           replay(12, 3, 1, 12),   # template 3's definition was refused
           sync(13)]
    received, status = raw_session(target.address, [opening(), batch(*ops)])
    assert status is None
    r = replies(received)
    assert error_of(r[8]).type == "gpuremote.ProtocolError" and "asynchronous" in r[8].error.message
    messages = {e.seq: e.message for e in r[8].deferred_errors}
    assert "template 7, which this session has not defined" in messages[2]
    assert "ends inside call 0" in messages[4]
    assert "past this session's limit" in messages[5]
    assert "cannot be a call template" in messages[6]
    assert "not host arrays" in messages[7]
    messages = {e.seq: e.message for e in r[13].deferred_errors}
    assert "at most 2048 bytes" in messages[9]
    assert "not in gpuremote's API surface table" in messages[10]
    assert "returns no array" in messages[11]
    assert "template 3, which this session has not defined" in messages[12]


def test_a_redefined_template_replaces_the_old_one(target):
    ops = [upload(1, 1, np.ones(3)),
           define(2, 1, "add", (H(1), 1.0), results=(2,)),
           define(3, 1, "multiply", (H(1), 10.0), results=(3,)),
           replay(4, 1, 2, 4),
           fetch(5, 4)]
    received, status = raw_session(target.address, [opening(), batch(*ops)])
    assert status is None
    np.testing.assert_array_equal(fetched(replies(received)[5]), [20.0] * 3)   # (1 + 1) * 10


def test_a_replay_longer_than_the_batch_limit(target):
    n = DEFAULTS.max_ops_per_batch + 5
    calls = []
    for i in range(n):
        calls += [1, 1, 100 + i]
    ops = [upload(1, 1, np.ones(2)), define(2, 1, "negative", (H(1),), results=(3,)), replay(3, *calls),
           fetch(4, 100 + DEFAULTS.max_ops_per_batch - 1), fetch(5, 100 + DEFAULTS.max_ops_per_batch)]
    received, status = raw_session(target.address, [opening(), batch(*ops)])
    assert status is None
    r = replies(received)
    np.testing.assert_array_equal(fetched(r[4]), [-1.0, -1.0])
    assert any("more than" in e.message and e.type == "gpuremote.LimitExceededError" for e in r[4].deferred_errors)
    assert "unknown handle" in error_of(r[5]).message


def test_replayed_calls_may_not_bind_taken_handles_or_use_another_sessions(target):
    ops = [upload(1, 1, np.ones(2)), define(2, 1, "negative", (H(1),), results=(2,)),
           replay(3, 1, 1, 2,   1, 1, 0,   1, 77, 5), sync(4)]
    received, status = raw_session(target.address, [opening(), batch(*ops)])
    assert status is None
    messages = [e.message for e in replies(received)[4].deferred_errors]
    assert any("handle 2 is already in use" in m for m in messages)
    assert any("handle 0 is already in use or reserved" in m for m in messages)
    assert any("unknown handle 77" in m for m in messages)
