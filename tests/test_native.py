"""The compiled fast paths (native/) against the Python code whose common case they repeat.

Daemon (native/replay.c): two sessions in this process, one per loop, run the same messages: random
runs of replayed calls and releases, among them unknown, poisoned, reused, zero and 64-bit handles,
shapes that change, views, in-place calls, results that are not arrays and calls that fail.
Afterwards everything either session can show must be equal: its arrays, its poisoned handles, the
errors it will report (with their sequence numbers), the ops it counted, which arrays share a
buffer, and the memory ledger. Client (native/forward.c): a training loop with unusual calls mixed
in sends byte for byte the same messages, and sees the same results and errors, with and without it.
"""

from __future__ import annotations

import re
import shutil
import sysconfig

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuremote._config import DEFAULTS
from gpuremote.daemon import session as session_module
from gpuremote.daemon.backends.emulated import EmulatedBackend
from gpuremote.daemon.server import session_limits
from gpuremote.daemon.session import Session
from gpuremote.wire import pb

from gpuremote.cupy import _core
from test_hostile import H, batch, call, upload

needs_native = pytest.mark.skipif(session_module._compiled is None or not DEFAULTS.native,
                                  reason="gpuremote._replay is not built (no C compiler at install) or is off")
needs_forward = pytest.mark.skipif(_core._compiled is None,
                                   reason="gpuremote._forward is not built (no C compiler at install) or is off")

# Arrays uploaded first, as handles 1..7, and the templates defined on them: (id, name, args, kwargs).
ARRAYS = [np.arange(6.0), np.arange(4.0), np.ones((2, 3), np.float32), np.arange(6.0), np.array([0, 2, 1]),
          np.array([7.0, 8.0, 9.0]), np.array([1, 0])]
TEMPLATES = [
    (1, "add", (H(1), 1.0), {}),                         # a function, one slot, a constant after it
    (2, "ndarray.__mul__", (H(1), H(4)), {}),            # a method of two arrays (broadcasting can fail)
    (3, "ndarray.__isub__", (H(1), 0.5), {}),            # in place: no result
    (4, "ndarray.sum", (H(1),), {"axis": 0}),            # a NumPy scalar on the daemon: bound as 0-d
    (5, "ndarray.reshape", (H(1), -1), {}),              # a view: shares its owner's bytes
    (6, "maximum", (H(1), H(4)), {}),                    # a function of two arrays
    (7, "ndarray.__getitem__", (H(1), slice(1, None)), {}),   # indexing: a view
    (8, "ndarray.T", (H(1),), {}),                       # a property: a view
    (9, "ndarray.__getitem__", (H(1), (H(5),)), {}),     # a key of arrays, rebuilt from the slots
    (10, "ndarray.__getitem__", (H(1), 2), {}),          # a NumPy scalar, bound as a 0-d view
    (11, "ndarray.__setitem__", (H(1), (H(5),), H(6)), {}),   # item assignment from an array: no result
    (12, "ndarray.__setitem__", (H(1), (H(5),), 0.5), {}),    # ... and from a constant
    (13, "ndarray.__getitem__", (H(3), (H(7), 0)), {}),  # a key of an array and a constant: Python's
    (14, "arange", (5,), {"dtype": np.dtype("float32")}),   # a function of constants alone: no slots
    (15, "ndarray.mean", (H(1),), {}),                   # a NumPy scalar of every element: bound as 0-d
    (16, "ndarray.__getitem__", (H(1), H(5)), {}),       # a key that is one array (x[perm])
]

def handles_in(value) -> int:
    return 1 if isinstance(value, H) else sum(map(handles_in, value)) if isinstance(value, tuple) else 0


SLOTS = {tid: handles_in(args) for tid, _, args, _ in TEMPLATES}
RESULTS = {tid: 0 if name.endswith(("__isub__", "__setitem__")) else 1 for tid, name, _, _ in TEMPLATES}
HANDLES = st.sampled_from([1, 2, 3, 4, 5, 6, 7, 10, 11, 12, 13, 14, 15, 16, 17, 999, 2**64 - 1])


def start_ops() -> list[pb.Op]:
    ops = [upload(i + 1, i + 1, a) for i, a in enumerate(ARRAYS)]
    for k, (tid, name, args, kwargs) in enumerate(TEMPLATES):
        op = call(10 + k, name, args, kwargs, results=(100 + tid,) if RESULTS[tid] else ())
        op.call.define_template = tid
        ops.append(op)
    return ops


@st.composite
def runs(draw) -> list[pb.Op]:
    ops = []
    for r in range(draw(st.integers(1, 4))):
        calls: list[int] = []
        for _ in range(draw(st.integers(1, 30))):
            if draw(st.integers(0, 4)) == 0:
                calls += [0, draw(HANDLES)]
            else:
                tid = draw(st.sampled_from([t[0] for t in TEMPLATES] + [42, 2**64 - 1]))   # never defined
                slots = SLOTS.get(tid, 1)
                calls += [tid, *[draw(HANDLES) for _ in range(slots)]]
                calls += [draw(st.one_of(HANDLES, st.just(0)))] * RESULTS.get(tid, 1)
        if draw(st.integers(0, 9)) == 0:
            calls = calls[:-1]                           # ends inside a call or a release
        op = pb.Op(seq=100 * (r + 1))
        op.replay.calls.extend(calls)
        ops.append(op)
    return ops


def session(native: bool) -> Session:
    s = Session(EmulatedBackend(1, 1 << 20), pb.OpenSession(), session_limits())
    if not native:
        s._compiled = None
    return s


def run(s: Session, ops: list[pb.Op]) -> None:
    for _ in s.run_batch(batch(*ops).batch, lambda: None):
        pass


def state(s: Session) -> dict:
    def sharing(h):     # the handles whose arrays live in h's buffer
        return sorted(g for g, key in s._handle_owner.items() if key == s._handle_owner[h])
    return {
        "arrays": {h: (a.dtype.str, a.shape, a.tolist()) for h, a in sorted(s.handles.items())},
        "poisoned": {h: (e.type, e.message, e.seq) for h, e in sorted(s.poisoned.items())},
        "errors": [(e.seq, e.op, e.type, e.message) for e in s._deferred],
        "dropped": s._dropped,
        "ops": s.ops,
        "sharing": {h: sharing(h) for h in s.handles},
        "owner_bytes": sorted((rec[1], rec[2]) for rec in s._owners.values()),
        "memory_used": list(s.memory_used),
        "ledger": s.memory[0].used,
    }


def test_the_compiled_paths_are_built_where_a_c_compiler_is():
    # The build is optional (setup.py), so a broken replay.c would otherwise only show as skips here.
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        pytest.skip(f"no C compiler ({compiler}) here: client and daemon run the Python paths")
    if not DEFAULTS.native:
        pytest.skip("GPUREMOTE_NATIVE=0 turned the compiled paths off")
    assert session_module._compiled is not None, "gpuremote._replay did not build: see pip's output for replay.c"
    assert session_module.replay_loop(EmulatedBackend(1, 1 << 20)) == "compiled"
    assert _core._compiled is not None, "gpuremote._forward did not build: see pip's output for forward.c"


@needs_native
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs())
def test_the_compiled_loop_leaves_what_the_python_loop_leaves(ops):
    compiled, python = session(True), session(False)
    assert compiled._compiled is not None
    try:
        for s in (compiled, python):
            run(s, start_ops())
            run(s, ops)
        assert state(compiled) == state(python)
    finally:
        compiled.close(), python.close()
    assert compiled.backend.memory[0].used == python.backend.memory[0].used == 0


@needs_native
def test_a_long_run_is_taken_by_the_compiled_loop():
    # The compiled loop runs every call and release of a plain run, the first call's Hold.take included.
    s = session(True)
    run(s, start_ops())
    first = pb.Op(seq=400)
    first.replay.calls.extend([1, 1, 999, 0, 999])     # the template's first replay: Python bounds it
    run(s, [first])
    calls = []
    for i in range(50):
        calls += [1, 1, 1000 + i, 0, 1000 + i]          # y = x + 1; release y
    op = pb.Op(seq=500)
    op.replay.calls.extend(calls)
    seen, before = [], s.ops
    python_call = s._replay_call
    s._replay_call = lambda *a: (seen.append(a), python_call(*a))
    run(s, [op])
    assert seen == [] and s.ops - before == 50 and not s._deferred
    assert s.memory_used[0] == sum(rec[2] for rec in s._owners.values())
    s.close()


@needs_native
@pytest.mark.parametrize("args, message", [
    ((), "replay(session, state, op, calls, i, count, hold)"),
    ((None, (), None, [], 0, 0, None), "malformed session state or calls"),
    ((None, (None,) * 15, None, [], 0, 0, None), "malformed session state or calls"),
    ((None, "x" * 15, None, [], 0, 0, None), "malformed session state or calls"),
])
def test_the_compiled_loop_refuses_malformed_arguments(args, message):
    with pytest.raises(TypeError, match=re.escape(message)):
        session_module._compiled.replay(*args)


@needs_native
def test_the_compiled_loop_refuses_a_state_that_is_not_a_sessions():
    s = session(True)
    state = list(s._compiled_state)
    state[0] = list(state[0])                            # the handle table as a list
    with pytest.raises(TypeError, match="must be dicts"):
        session_module._compiled.replay(s, tuple(state), pb.Op(), [1, 1, 2], 0, 0, None)
    with pytest.raises(TypeError):
        session_module._compiled.replay(s, s._compiled_state, pb.Op(), [1, 1, 2], "0", 0, None)
    s.close()


# -- the client: native/forward.c -------------------------------------------------------------------

CLIENT_SCRIPT = '''
import json, sys
import numpy as np
import gpuremote
import gpuremote.cupy as cp
from gpuremote.client.session import Session

sent = []
send = Session._send
def record(self, msg):
    sent.append(msg.SerializeToString().hex())
    return send(self, msg)
Session._send = record

gpuremote.connect(sys.argv[1])
rng = np.random.default_rng(0)
w = cp.asarray(rng.standard_normal((8, 4)).astype(np.float32))
b = cp.zeros(4, dtype=np.float32)
xs = cp.asarray(rng.standard_normal((40, 8)).astype(np.float32))
ys = cp.asarray(rng.integers(0, 4, 40))
lr = np.float32(0.1)
losses, errors = [], []
for step in range(6):
    x, y = xs[step * 5:(step + 1) * 5], ys[step * 5:(step + 1) * 5]     # slices
    h = x @ w + b
    a = cp.maximum(h, 0)
    p = cp.exp(a - a.max(axis=1, keepdims=True))                       # keywords
    p = p / p.sum(axis=1, keepdims=True)
    rows = cp.arange(5)
    loss = -cp.log(p[rows, y] + np.float32(1e-9)).mean()               # an index of arrays, a NumPy scalar
    g = p.copy()
    g[rows, y] -= 1
    g /= np.float32(5)                                                  # in place
    w -= lr * (x.T @ g)
    b -= lr * g.sum(axis=0)
    z = h * 0.0 + h * -0.0 + (h > 1) * float("nan")                     # constants the Python path keys by text
    o = cp.add(h, 1.0, out=cp.empty_like(h))                            # an output argument
    t = (h + 1, 2.5 * h, h ** 2, (h,) and h.T, a.reshape(-1))
    losses.append(float(loss))
    try:
        h @ w                                                           # a shape error, raised at this line
    except ValueError as exc:
        errors.append(str(exc))
final = w.get().tolist()
gpuremote.disconnect()
from gpuremote.cupy import _core
json.dump({"sent": sent, "losses": losses, "errors": errors, "w": final, "compiled": _core._compiled is not None},
          open(sys.argv[2], "w"))
'''


def client_run(tmp_path, address, native: str) -> dict:
    import json
    import os
    import subprocess
    import sys
    script, out = tmp_path / "client.py", tmp_path / f"out{native}.json"
    script.write_text(CLIENT_SCRIPT)
    env = dict(os.environ, GPUREMOTE_NATIVE=native, GPUREMOTE_TRANSPORT="unix")
    done = subprocess.run([sys.executable, str(script), address, str(out)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text())


@needs_forward
def test_the_compiled_client_path_sends_what_the_python_path_sends(tmp_path, daemon):
    # Everything the client sends, byte for byte (handles, sequence numbers, Replay runs, releases,
    # sites), and everything the program sees, with native/forward.c and without it.
    compiled, python = client_run(tmp_path, daemon.address, "1"), client_run(tmp_path, daemon.address, "0")
    assert compiled["compiled"] and not python["compiled"]
    assert len(compiled["errors"]) == 6 and compiled["errors"] == python["errors"]
    assert compiled["losses"] == python["losses"] and compiled["w"] == python["w"]
    assert compiled["sent"] == python["sent"]


@needs_forward
@pytest.mark.parametrize("args", [(), ("x", (), {}, -1), (1, (), {}, -1, False), ("x", [], {}, -1, False),
                                  ("x", (), [], -1, False), ("x", (), {}, "many", False)])
def test_the_compiled_client_path_refuses_malformed_arguments(args):
    with pytest.raises(TypeError):
        _core._compiled.call(*args)


@needs_forward
def test_the_compiled_client_path_declines_what_it_does_not_know():
    # Nothing it does not recognise is an error of its own: it answers None and the Python path runs.
    call = _core._compiled.call
    for args in [(), (1, 2.0), (np.ones(3),), ({"a": 1},), (object(),), ((1,) * 40,), (slice(None),)]:
        assert call("add", args, {}, 2, False) is None
    assert call("ndarray.__iadd__", (1.0, 2.0), {}, -1, True) is None


@needs_forward
def test_the_compiled_finalizer_releases_as_the_python_one(cp, monkeypatch):
    # ndarray.__del__ is forward.c's where built: it queues the handle as Session.release does, does
    # nothing for a proxy never filled or of a closed session, and never raises.
    unraisable = []
    monkeypatch.setattr("sys.unraisablehook", unraisable.append)
    assert type(_core.ndarray.__dict__["__del__"]).__name__ == "method_descriptor"
    x = cp.arange(3.0)
    session, handle = x._gr_session, x._gr_handle
    del x
    assert session._releases[-1] == handle
    empty = _core.ndarray.__new__(_core.ndarray)
    del empty
    y = cp.arange(3.0)
    y._gr_session = object()        # no `closed`, no `_releases`: swallowed, as the Python one's AttributeError
    del y
    assert not unraisable
    _core.use_compiled_path(False)
    try:
        assert _core.ndarray.__del__ is _core._release_on_del
        z = cp.arange(3.0)
        handle = z._gr_handle
        del z
        assert session._releases[-1] == handle
    finally:
        _core.use_compiled_path(True)


@needs_forward
def test_the_compiled_client_path_wants_the_proxy_slots_for_its_finalizer(cp):
    # configure() reads where ndarray keeps its slots; a class without them gets no C finalizer
    # (new proxies then come from its _wrap), and bad tables are refused.
    session = cp.arange(1)._gr_session

    class Bare:
        @classmethod
        def _wrap(cls, *args):
            return cls()
    try:
        _core._compiled.configure(Bare, np.generic, {}, _core.Memo(8), _core.context, _core.STATS)
        with pytest.raises(RuntimeError, match="slots"):
            _core._compiled.finalizer()
        x = _core.ndarray.__new__(_core.ndarray)
        x._gr_session, x._gr_handle = session, 77
        del x       # ndarray.__del__ is still the C one: it finds the slots by name meanwhile
        assert session._releases[-1] == 77
        session._releases.pop()
        with pytest.raises(TypeError):
            _core._compiled.configure(Bare, np.generic, [], {}, None, None)
        with pytest.raises(AttributeError):
            _core._compiled.configure(int, np.generic, {}, _core.Memo(8), None, None)   # no _wrap
    finally:
        _core.use_compiled_path(True)
    assert type(_core.ndarray.__dict__["__del__"]).__name__ == "method_descriptor"
