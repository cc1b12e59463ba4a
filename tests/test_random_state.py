"""cupy.random.RandomState and cupy.random.default_rng's Generator through a real daemon: a
generator of its own per object (same seed, same numbers; independent of the module's stream and of
each other, also when a loop replays their calls), on the device it was made on; and generator ids,
seeds and arguments a hostile client sends, refused (test_hostile's `target` checks the daemon
afterwards)."""

from __future__ import annotations

import numpy as np
import pytest

import gpuremote
from gpuremote._config import DEFAULTS
from gpuremote.errors import LimitExceededError
from gpuremote.meta import RANDOM_GENERATOR
from gpuremote.surface import GENERATOR_METHODS

from conftest import BACKEND, DaemonProcess, backend_args
from test_hostile import batch, call, connected, error_of, opening, raw_session, replies, target, victim  # noqa: F401


@pytest.fixture(scope="module")
def two_devices():
    d = DaemonProcess(*backend_args(devices=2, memory="64MiB"))
    yield d
    d.stop()


def test_same_seed_same_numbers_and_streams_apart(target):
    with connected(target.address) as (cp, _):
        a, b, c = cp.random.RandomState(5), cp.random.RandomState(5), cp.random.RandomState(6)
        x, y, z = (rs.normal(0, 1, 6).get() for rs in (a, b, c))
        np.testing.assert_array_equal(x, y)
        assert not np.allclose(x, z)
        if BACKEND == "emulated":       # NumPy's RandomState behind it
            np.testing.assert_array_equal(x, np.random.RandomState(5).normal(0, 1, 6))
        cp.random.seed(1)
        first = cp.random.rand(4).get()
        cp.random.seed(1)
        a.rand(10)                      # another generator's draws leave the module's stream alone
        np.testing.assert_array_equal(cp.random.rand(4).get(), first)
        state = cp.random.get_random_state()    # the device's own generator, the module's
        state.seed(1)
        np.testing.assert_array_equal(state.rand(4).get(), first)
        a.seed(5)                       # reseeding restarts the stream
        np.testing.assert_array_equal(a.normal(0, 1, 6).get(), x)


def test_methods_shapes_and_dtypes(target):
    with connected(target.address) as (cp, _):
        rs = cp.random.RandomState(0)
        cases = [(rs.rand(2, 3), (2, 3), np.float64), (rs.randint(0, 10, (4,)), (4,), np.int64),
                 (rs.standard_normal((2,), dtype=np.float32), (2,), np.float32),
                 (rs.uniform(-1, 1, size=5), (5,), np.float64), (rs.permutation(7), (7,), np.int64),
                 (rs.choice(5, 3), (3,), np.int64), (rs.poisson(2.0, 6), (6,), np.int64)]
        for got, shape, dtype in cases:
            assert (got.shape, got.dtype) == (shape, np.dtype(dtype))
            value = got.get()
            assert (value.shape, value.dtype) == (shape, np.dtype(dtype))
        assert sorted(rs.permutation(7).get().tolist()) == list(range(7))
        x = cp.arange(6)
        rs.shuffle(x)
        assert sorted(x.get().tolist()) == list(range(6))


def test_a_loop_over_generators_replays_each_its_own(target):
    with connected(target.address) as (cp, _):
        states = [cp.random.RandomState(7), cp.random.RandomState(7), cp.random.RandomState(8)]
        before = gpuremote.stats()["replayed"]
        draws = [[], [], []]
        for _ in range(5):
            for i, rs in enumerate(states):
                draws[i].append(rs.uniform(size=3))        # one site, three generators
        assert gpuremote.stats()["replayed"] > before
        values = [np.concatenate([d.get() for d in ds]) for ds in draws]
        np.testing.assert_array_equal(values[0], values[1])
        assert not np.allclose(values[0], values[2])
        if BACKEND == "emulated":
            np.testing.assert_array_equal(values[2], np.random.RandomState(8).uniform(size=15))


def test_a_random_state_stays_on_its_device(two_devices):
    with connected(two_devices.address) as (cp, _):
        with cp.cuda.Device(1):
            rs = cp.random.RandomState(3)
        x = rs.normal(size=4)               # device 0 is current here
        assert x.device == cp.cuda.Device(1)
        with cp.cuda.Device(1):
            np.testing.assert_array_equal(cp.random.RandomState(3).normal(size=4).get(), x.get())


def test_the_generator_keyword_is_not_an_argument(target):
    with connected(target.address) as (cp, _):
        with pytest.raises(TypeError, match="unexpected keyword argument"):
            cp.random.RandomState(1).normal(size=2, **{RANDOM_GENERATOR: 3})


def test_too_many_generators_are_refused_and_the_session_goes_on(target):
    with connected(target.address) as (cp, _):
        states = [cp.random.RandomState(i) for i in range(DEFAULTS.max_generators)]
        float(states[-1].rand(1).sum())
        extra = cp.random.RandomState(1)
        with pytest.raises(LimitExceededError, match="reuse one and reseed it"):
            float(extra.rand(1).sum())
        assert float(states[0].rand(1).sum()) >= 0.0        # the others still draw


def test_hostile_generator_ids(target):
    bad = ["x", -1, 2**40, 1.5, True]
    ops = [call(1 + i, "random.rand", (3,), kwargs={RANDOM_GENERATOR: g}, results=(10 + i,), reply=True)
           for i, g in enumerate(bad)]
    ops.append(call(9, "random.rand", (3,), kwargs={RANDOM_GENERATOR: 7}, results=(20,), reply=True))
    received, status = raw_session(target.address, [opening(), batch(*ops)])
    assert status is None
    r = replies(received)
    for i, g in enumerate(bad):
        assert "generator id is an int" in error_of(r[1 + i]).message, g
    assert r[9].WhichOneof("outcome") != "error", r[9]


# -- default_rng ---------------------------------------------------------------------------------

GENERATOR_CALLS = [("random", (3,), (3,), np.float64), ("random", ((2, 2), np.float32), (2, 2), np.float32),
                   ("standard_normal", ((2,), np.float32), (2,), np.float32),
                   ("standard_exponential", (4,), (4,), np.float64), ("integers", (0, 9, 4), (4,), np.int64),
                   ("integers", (9,), (), np.int64), ("integers", (5, 10, (3,), np.int32), (3,), np.int32),
                   ("beta", (2.0, 3.0, 3, np.float32), (3,), np.float32), ("standard_gamma", (2.0, 3), (3,), np.float64),
                   ("exponential", (2.0, 3), (3,), np.float64), ("gamma", (2.0, 1.0, (2, 2)), (2, 2), np.float64),
                   ("poisson", (4.0, 5), (5,), np.int64)]


def test_every_generator_method_is_exercised():
    assert {name for name, *_ in GENERATOR_CALLS} == set(GENERATOR_METHODS)


def test_generator_methods_shapes_and_dtypes(target):
    with connected(target.address) as (cp, _):
        for name, args, shape, dtype in GENERATOR_CALLS:
            got = getattr(cp.random.default_rng(3), name)(*args)
            assert (got.shape, got.dtype) == (shape, np.dtype(dtype)), name     # derived on the client
            value = got.get()
            assert (value.shape, value.dtype) == (shape, np.dtype(dtype)), name  # made on the daemon
            if BACKEND == "emulated":   # NumPy's Generator behind it, cast where NumPy takes no dtype
                native = name in ("random", "standard_normal", "standard_exponential", "standard_gamma", "integers")
                want = getattr(np.random.default_rng(3), name)(*[a for a in args if native or not isinstance(a, type)])
                np.testing.assert_allclose(value, np.asarray(want).astype(dtype), rtol=1e-6, err_msg=name)


def test_generators_same_seed_same_numbers_and_parameters_broadcast(target):
    with connected(target.address) as (cp, _):
        g, h, k = cp.random.default_rng(42), cp.random.default_rng(42), cp.random.default_rng(43)
        x, y, z = (r.random(5).get() for r in (g, h, k))
        np.testing.assert_array_equal(x, y)
        assert not np.allclose(x, z)
        assert cp.random.default_rng(g) is g
        lam = cp.asarray([1.0, 5.0, 50.0])
        assert g.poisson(lam).shape == (3,) and g.poisson(lam).get().shape == (3,)
        draws, pair = [[], []], (cp.random.default_rng(7), cp.random.default_rng(7))
        before = gpuremote.stats()["replayed"]
        for _ in range(4):
            for i, r in enumerate(pair):
                draws[i].append(r.standard_normal(3))       # one site, two generators
        assert gpuremote.stats()["replayed"] > before
        np.testing.assert_array_equal(*[np.concatenate([d.get() for d in ds]) for ds in draws])


@pytest.mark.parametrize("bad,error,message", [
    (lambda cp, g: cp.random.default_rng(1.5), TypeError, "non-negative int or None"),
    (lambda cp, g: cp.random.default_rng(-3), TypeError, "non-negative int or None"),
    (lambda cp, g: cp.random.default_rng([1, 2]), TypeError, "not list"),
    (lambda cp, g: g.random(3, out=None), TypeError, "out= is not supported"),
    (lambda cp, g: g.random(3, np.int32), TypeError, "returns floats, not int32"),
    (lambda cp, g: g.integers(0, 5, 3, np.float32), TypeError, "returns integers, not float32"),
    (lambda cp, g: g.exponential(1.0, 3, dtype=np.float32), TypeError, "unexpected keyword argument 'dtype'"),
    (lambda cp, g: g.normal(0, 1, 3), AttributeError, "normal"),
])
def test_bad_generator_calls_raise_at_the_call(target, bad, error, message):
    with connected(target.address) as (cp, _):
        g = cp.random.default_rng(0)
        with pytest.raises(error, match=message):
            bad(cp, g)
        assert g.random(2).get().shape == (2,)          # the generator and the session go on


def test_hostile_generator_calls(target):
    cases = [
        (call(1, "random.Generator.random", (3,), kwargs={RANDOM_GENERATOR: 99}, results=(5,), reply=True),
         "no Generator 99"),
        (call(2, "random.Generator.random", (3,), results=(6,), reply=True), "no Generator 0"),
        (call(3, "random.default_rng", ("seed",), kwargs={RANDOM_GENERATOR: 4}, reply=True), "non-negative int or None"),
        (call(4, "random.default_rng", (1, 2), kwargs={RANDOM_GENERATOR: 4}, reply=True), "one argument, the seed"),
        (call(5, "random.default_rng", (1,), kwargs={RANDOM_GENERATOR: 0}, reply=True), "Generator's id is an int"),
        (call(6, "random.default_rng", (1,), kwargs={RANDOM_GENERATOR: "x"}, reply=True), "Generator's id is an int"),
        (call(7, "random.Generator.random", (3,), kwargs={RANDOM_GENERATOR: 4, "out": 1}, results=(7,), reply=True),
         "out= is not supported"),
    ]
    received, status = raw_session(target.address, [opening(), batch(*[op for op, _ in cases])])
    assert status is None
    r = replies(received)
    for op, message in cases:
        assert message in error_of(r[op.seq]).message, (op.seq, message)


def test_too_many_generators_from_default_rng_are_refused(target):
    with connected(target.address) as (cp, _):
        gens = [cp.random.default_rng(i) for i in range(DEFAULTS.max_generators)]
        float(gens[-1].random(1).sum())
        with pytest.raises(LimitExceededError, match="reuse one"):
            float(cp.random.default_rng(1).random(1).sum())
        assert float(gens[0].random(1).sum()) >= 0.0
