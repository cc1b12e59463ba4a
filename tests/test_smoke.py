"""End-to-end basics through a real daemon process."""

import numpy as np
import pytest


def test_roundtrip_values(cp):
    host = np.arange(12, dtype=np.float32).reshape(3, 4)
    x = cp.asarray(host)
    assert x.shape == (3, 4) and x.dtype == np.float32
    np.testing.assert_array_equal(x.get(), host)
    np.testing.assert_array_equal(((x * 2) + 1).get(), host * 2 + 1)


def test_zero_d_stays_zero_d(cp):
    s = cp.arange(5).sum()
    assert s.shape == ()
    assert s.get().shape == ()
    assert int(s) == 10


def test_error_names_op_and_line(cp):
    bad = cp.linalg.inv(cp.zeros((3, 3)))
    with pytest.raises(np.linalg.LinAlgError) as info:
        bad.get()
    assert "linalg.inv" in str(info.value) and "test_smoke.py" in str(info.value)


def test_errors_name_the_line_of_code_made_at_run_time(cp):
    # The source-line memo is keyed by a code object's identity (cupy/_core._CODES): code objects
    # made and dropped one after another, often at the same address, each name their own line.
    for k in range(12):
        src = "\n" * k + "def f(cp, x):\n    for _ in range(4):\n        x = x + 1\n    return cp.linalg.inv(x)\n"
        scope: dict = {}
        exec(compile(src, f"generated_{k}.py", "exec"), scope)
        bad = scope["f"](cp, cp.zeros((3, 3)))
        with pytest.raises(np.linalg.LinAlgError, match=f"generated_{k}.py:{k + 4}"):
            bad.get()
        del scope, bad


def test_shape_error_raises_at_the_line(cp):
    with pytest.raises(ValueError):
        cp.ones(3) + cp.ones(4)


def test_sequences_are_not_arrays(cp):
    # As in CuPy: a list or tuple where an array is expected is refused at the call.
    with pytest.raises(TypeError, match="Unsupported type"):
        cp.cos((1.0, 2.0))
    with pytest.raises(TypeError, match="Unsupported type"):
        cp.add([1, 2], 1)
    np.testing.assert_array_equal(cp.cos(cp.asarray([0.0])).get(), [1.0])


def test_the_first_batches_after_a_sync_point_are_small(cp):
    # After a sync point the daemon has nothing queued: the next batch leaves after 8 ops, and each
    # one after it may hold twice as many, up to batch_flush_ops (client/session.py).
    import gpuremote
    from gpuremote._config import DEFAULTS
    y = cp.ones(4)
    for _ in range(3 * DEFAULTS.batch_flush_ops):      # full-size batches, templates defined
        y = y + 1
    expected = float(y.sum().get())                        # a sync point
    sizes, size = [], 8
    while size < DEFAULTS.batch_flush_ops:
        sizes.append(size)
        size *= 2
    sizes += [DEFAULTS.batch_flush_ops] * 2
    for size in sizes:
        before = gpuremote.stats()["messages"]
        for _ in range(size - 1):
            y = y + 1
        assert gpuremote.stats()["messages"] == before, size
        y = y + 1
        assert gpuremote.stats()["messages"] == before + 1, size
        expected += 4 * size
    assert float(y.sum().get()) == expected


def test_fuse_runs_the_function_unfused(cp):
    x, y = cp.arange(6.0), cp.full(6, 2.0)

    def body(a, b):
        return cp.sqrt(a * b) + 1

    for fused in (cp.fuse(body), cp.fuse()(body), cp.fuse(kernel_name="k")(body)):
        assert fused.__name__ == "body"
        np.testing.assert_allclose(fused(x, y).get(), np.sqrt(np.arange(6.0) * 2) + 1)
    with pytest.raises(TypeError, match="keyword arguments only"):
        cp.fuse("k")


def test_pinned_pool_and_allocators(cp):
    import gpuremote.cupyx as cupyx
    pool = cp.get_default_pinned_memory_pool()
    buffers = [cupyx.empty_pinned((1000,), dtype=np.float32) for _ in range(3)]
    del buffers
    assert pool.n_free_blocks() >= 1
    pool.free_all_blocks()
    assert pool.n_free_blocks() == 0
    kept = cupyx.zeros_pinned((10,))                 # the pool still hands out buffers
    assert kept.sum() == 0
    cp.cuda.set_allocator(None)                      # no pool: what the daemon does anyway
    cp.cuda.set_pinned_memory_allocator(None)
    with pytest.raises(NotImplementedError, match="daemon"):
        cp.cuda.set_allocator(lambda size: None)
    with pytest.raises(NotImplementedError, match="shared-memory segments"):
        cp.cuda.set_pinned_memory_allocator(lambda size: None)


def test_cupyx_scatter_functions(cp):
    import gpuremote.cupyx as cupyx
    a, b, c = cp.zeros(4), cp.full(4, 5.0), cp.full(4, 5.0)
    index = cp.asarray([1, 1, 3])
    cupyx.scatter_add(a, index, 2.0)
    cupyx.scatter_max(b, index, cp.asarray([1.0, 9.0, 7.0]))
    cupyx.scatter_min(c, index, cp.asarray([1.0, 9.0, 7.0]))
    assert (a.get().tolist(), b.get().tolist(), c.get().tolist()) == \
        ([0.0, 4.0, 0.0, 2.0], [5.0, 9.0, 5.0, 7.0], [5.0, 1.0, 5.0, 5.0])


def test_module_facts_and_memory_sharing(cp, capsys):
    assert cp.__version__.startswith("14.") and "+gpuremote." in cp.__version__
    assert cp.is_available() is True
    cp.show_config()
    assert "device 0:" in capsys.readouterr().out
    x = cp.arange(6.0)
    assert cp.shares_memory(x, x[2:]) is True and cp.may_share_memory(x, x[::2]) is True
    assert cp.shares_memory(x, cp.arange(6.0)) is False


def test_numpy_ufuncs_on_device_arrays_run_on_the_device(cp):
    x = cp.arange(4.0)
    for got, want in [(np.exp(x), np.exp(np.arange(4.0))), (np.add(x, 1), np.arange(4.0) + 1),
                      (np.float32(2) * x, np.arange(4.0) * 2),
                      (np.add.reduce(x), np.float64(6.0)), (np.matmul(x, x), np.float64(14.0))]:
        assert type(got) is cp.ndarray
        np.testing.assert_allclose(got.get(), want)
    q, r = np.divmod(x, 3)
    assert (q.get().tolist(), r.get().tolist()) == ([0, 0, 0, 1], [0, 1, 2, 0])
    np.maximum.at(x, cp.asarray([0]), 9.0)
    assert x.get().tolist() == [9.0, 1.0, 2.0, 3.0]
    with pytest.raises(TypeError, match="NotImplemented"):
        np.logaddexp.reduce(x)              # a ufunc method gpuremote does not forward
    with pytest.raises(TypeError, match="Unsupported type"):
        np.ones(4) + x                      # a host array beside it: refused, as by CuPy


def test_numpy_functions_on_device_arrays_run_on_the_device(cp):
    x, host = cp.arange(4.0), np.arange(4.0)
    for got, want in [(np.concatenate([x, x]), np.concatenate([host, host])), (np.where(x > 1, x, 0), np.where(host > 1, host, 0)),
                      (np.linalg.norm(x), np.linalg.norm(host)), (np.fft.fft(x), np.fft.fft(host)),
                      (np.stack([x, x], axis=1), np.stack([host, host], axis=1))]:
        assert type(got) is cp.ndarray
        np.testing.assert_allclose(got.get(), want)
    with pytest.raises(TypeError, match="no implementation found for 'numpy.insert'"):
        np.insert(x, 1, 5.0)                # a function gpuremote does not forward: NumPy's TypeError


@pytest.mark.parametrize("call", [
    lambda cp, x, h: x + h, lambda cp, x, h: h * x, lambda cp, x, h: x.__radd__(h), lambda cp, x, h: cp.add(x, h),
    lambda cp, x, h: cp.add(x, h, dtype=cp.float32), lambda cp, x, h: cp.where(x > 1, x, h),
    lambda cp, x, h: x - np.array(2.0),
])
def test_elementwise_ops_refuse_host_arrays_as_cupy_does(cp, call):
    x = cp.arange(4.0)
    for _ in range(3):                      # the first call, and again once it is a call template
        with pytest.raises(TypeError, match="Unsupported type <class 'numpy.ndarray'>.*cupy.asarray"):
            call(cp, x, np.ones(4))
    assert (x + np.float32(1)).get().tolist() == [1.0, 2.0, 3.0, 4.0]     # NumPy scalars are scalars


def test_astype_without_copy_and_bad_devices_as_in_cupy(cp):
    x = cp.ones(3)
    assert x.astype(x.dtype, copy=False) is x and x.astype("float64", copy=False) is x
    assert x.astype(x.dtype) is not x and x.astype(cp.float32, copy=False).dtype == np.float32
    with pytest.raises(cp.cuda.runtime.CUDARuntimeError, match="cudaErrorInvalidDevice") as err:
        with cp.cuda.Device(99):
            pass
    assert err.value.status == 101 and isinstance(err.value, ValueError)


@pytest.mark.parametrize("call", [
    lambda cp, x, o: cp.exp(x, out=o), lambda cp, x, o: cp.add(x, 1, out=(o,)), lambda cp, x, o: cp.add(x, 1, o),
    lambda cp, x, o: x.sum(out=o), lambda cp, x, o: np.exp(x, out=o), lambda cp, x, o: cp.matmul(x, x, out=o),
])
def test_a_host_out_array_is_refused_not_left_unwritten(cp, call):
    x, host = cp.arange(3.0), np.zeros(3)
    with pytest.raises(TypeError, match="out must be a device array|Unsupported type"):
        call(cp, x, host)
    assert host.tolist() == [0.0, 0.0, 0.0]
    device = cp.empty(3)
    cp.exp(x, out=device)
    np.testing.assert_allclose(device.get(), np.exp(np.arange(3.0)))


def test_copies_land_on_the_current_device_in_the_order_asked(cp):
    # CuPy moves an array between devices by copying it under the other one (array, asarray, copy).
    host = np.arange(6.0).reshape(2, 3)
    x0 = cp.asarray(host)
    assert cp.asarray(x0) is x0                                 # already here: itself
    with cp.cuda.Device(1):
        moved = [cp.array(x0), cp.asarray(x0), cp.copy(x0), x0.copy(), cp.asarray(x0, dtype=cp.float32),
                 cp.array(x0, order="F"), cp.asfortranarray(x0).copy(order="K")]
        assert [m.device.id for m in moved] == [1] * len(moved)
        assert [m.flags.f_contiguous for m in moved] == [False] * 5 + [True, True]
        for m in moved:
            np.testing.assert_array_equal(m.get(), host)
        assert float((moved[0] + 1).sum()) == 21.0              # and usable there
    assert x0.copy().device.id == 0
    for made in (cp.array(host, order="F"), cp.asarray(host, order="f"), cp.array(np.asfortranarray(host))):
        assert made.flags.f_contiguous and not made.flags.c_contiguous
        np.testing.assert_array_equal(made.get(), host)
    assert cp.array(host).flags.c_contiguous and cp.array(host.T, order="C").flags.c_contiguous


def _assign(xp, shape, key, value):
    z = xp.zeros(shape)
    z[key] = value
    return z


EARLY_ERRORS = {     # calls NumPy refuses from the shapes and scalars alone: refused at the call, as by CuPy
    "setitem-broadcast": lambda xp: _assign(xp, (3, 3), 0, xp.ones(4)),
    "setitem-column": lambda xp: _assign(xp, (3, 3), (slice(None), 1), xp.ones((2, 1))),
    "mask-length": lambda xp: xp.ones(3)[xp.asarray([True, False])],
    "mask-second-axis": lambda xp: xp.ones((3, 4))[:, xp.ones(3, dtype=bool)],
    "mask-assign": lambda xp: _assign(xp, (3,), xp.asarray([True, False]), 1.0),
    "max-of-nothing": lambda xp: xp.zeros(0).max(),
    "argmax-of-nothing": lambda xp: xp.zeros((0, 3)).argmax(axis=0),
    "inv-not-square": lambda xp: xp.linalg.inv(xp.ones((2, 3))),
    "det-of-vector": lambda xp: xp.linalg.det(xp.ones(3)),
    "solve-not-square": lambda xp: xp.linalg.solve(xp.ones((2, 3)), xp.ones(2)),
    "randint-empty-range": lambda xp: xp.random.randint(5, 5),
    "randint-nothing-below": lambda xp: xp.random.randint(0),
    "choice-too-many": lambda xp: xp.random.choice(3, 5, replace=False),
    "choice-array-too-many": lambda xp: xp.random.choice(xp.arange(4), (2, 3), replace=False),
}


@pytest.mark.parametrize("case", list(EARLY_ERRORS))
def test_shape_errors_are_raised_at_the_call(cp, case):
    with pytest.raises(Exception) as want:
        EARLY_ERRORS[case](np)
    with pytest.raises(type(want.value)):
        EARLY_ERRORS[case](cp)              # no sync point: raised by the call itself
    cp.cuda.Device().synchronize()          # and nothing was queued that fails later


def test_what_numpy_accepts_is_not_refused_early(cp):
    z = _assign(cp, (3, 3), (slice(None), 1), cp.ones((1, 3)))
    z[...] = cp.ones((1, 1, 3))
    z[cp.asarray([0, 2])] = cp.ones(3)
    z[z > 0] = 5.0
    assert z.get().tolist() == [[5.0] * 3] * 3
    assert cp.ones((3, 4))[cp.ones(3, dtype=bool), 1:].shape == (3, 3)
    assert cp.zeros((0, 3)).max(axis=1).shape == (0,) and float(cp.zeros(0).sum()) == 0.0
    assert cp.random.choice(5, 5, replace=False).shape == (5,) and cp.random.randint(4, 5, 3).get().tolist() == [4] * 3


def test_ndarray_methods_and_setters_cupy_has(cp, tmp_path):
    import pickle
    host = np.array([3.0, 1.0, 2.0, 5.0, 4.0])
    x = cp.asarray(host)
    y = x.copy()
    y.partition(2)
    assert float(y[2]) == 3.0 and int(x.argpartition(2)[2]) == int(np.argpartition(host, 2)[2])
    mask = [True, False, True, False, True]
    assert x.compress(cp.asarray(mask)).get().tolist() == host.compress(mask).tolist()
    assert cp.asarray([0, 1, 0]).choose([cp.arange(3), cp.arange(3) * 10]).get().tolist() == [0, 10, 2]
    assert x.tobytes() == host.tobytes()
    back = pickle.loads(pickle.dumps(x))                # as CuPy: pickled by value, loaded onto the device
    assert type(back) is cp.ndarray and back.get().tolist() == host.tolist()
    x.dump(tmp_path / "x.pkl")
    assert pickle.loads((tmp_path / "x.pkl").read_bytes()).get().tolist() == host.tolist()
    x.tofile(tmp_path / "x.bin")
    assert np.fromfile(tmp_path / "x.bin").tolist() == host.tolist()
    z = cp.arange(6.0)
    z.shape = (2, 3)
    assert z.shape == (2, 3) and z.get().tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    with pytest.raises(AttributeError, match="Incompatible shape"):
        z.T.shape = (6,)                                # NumPy's rule: no copy in place
    c = cp.zeros(3, dtype=complex)
    c.real, c.imag = cp.ones(3), 2
    assert c.get().tolist() == [1 + 2j] * 3
    r = cp.zeros(2)
    r.real = 4
    assert r.get().tolist() == [4.0, 4.0]
    with pytest.raises(TypeError, match="imaginary part"):
        r.imag = 1


def test_ufunc_facts_asnumpy_and_multivariate_normal(cp):
    assert (cp.add.nin, cp.add.nout, cp.add.identity, cp.divmod.nout) == (2, 1, 0, 2)
    assert cp.exp.types == np.exp.types and cp.maximum.identity is None
    x = cp.arange(3.0)
    assert cp.asnumpy(x, blocking=False).tolist() == [0.0, 1.0, 2.0]
    mean, cov = np.array([1.0, -2.0]), np.array([[2.0, 0.6], [0.6, 1.0]])
    for method in ("cholesky", "svd", "eigh"):
        draws = cp.random.multivariate_normal(mean, cov, size=20000, method=method).get()
        assert draws.shape == (20000, 2)
        np.testing.assert_allclose(draws.mean(axis=0), mean, atol=0.05)
        np.testing.assert_allclose(np.cov(draws.T), cov, atol=0.08)
    state = cp.random.RandomState(3)
    assert state.multivariate_normal(cp.zeros(3), cp.eye(3), (4, 5), dtype=cp.float32).dtype == np.float32
    with pytest.raises(ValueError, match="positive-semidefinite"):
        cp.random.multivariate_normal(mean, -np.eye(2), check_valid="raise")
    with pytest.raises(ValueError, match="square of its length"):
        cp.random.multivariate_normal(mean, np.eye(3))
    with pytest.raises(ValueError, match="method"):
        cp.random.multivariate_normal(mean, cov, method="qr")


def test_the_cupy_backend_refuses_a_cupy_that_promotes_otherwise():
    # Clients derive dtypes with NumPy 2's promotion, which CuPy follows from 14 on (13 went by value).
    from gpuremote.daemon.backends.cupy_backend import check_cupy_version
    for fine in ("14.0.0", "14.2.0", "15.0.0rc1", "14.0.0a1"):
        check_cupy_version(fine)
    for old in ("13.6.0", "12.3.0", "13.0.0+cuda12x"):
        with pytest.raises(RuntimeError, match="needs CuPy 14 or newer .*pip install -U"):
            check_cupy_version(old)


@pytest.mark.parametrize("make", [
    lambda cp: cp.zeros((2**20, 2**20)), lambda cp: cp.ones((1, 2**18)) + cp.ones((2**18, 1)),
    lambda cp: cp.random.rand(2**18, 2**18), lambda cp: cp.asarray(np.broadcast_to(np.ones(1, np.uint8), (2**40,))),
])
def test_more_than_the_device_holds_is_refused_at_the_call(cp, make):
    with pytest.raises(cp.cuda.memory.OutOfMemoryError, match="refused before the op was sent"):
        make(cp)                            # no sync point: as CuPy raises it
    assert cp.broadcast_to(cp.ones(1), (2**20, 2**20)).shape == (2**20, 2**20)    # a view costs nothing
    assert float(cp.ones(4).sum()) == 4.0


def test_uploads_of_big_endian_data_are_native(cp):
    host = np.arange(4.0).astype(">f8")
    x = cp.asarray(host)
    assert x.dtype == np.float64 and x.dtype.isnative and x.get().tolist() == [0.0, 1.0, 2.0, 3.0]
    assert cp.array(np.array([1, 2], dtype=">i4")).dtype == np.int32


def test_an_item_assignment_is_checked_once_per_signature(cp, monkeypatch):
    # The shape check of x[key] = v runs NumPy on stand-ins: a loop's assignments must not pay it each time.
    from gpuremote.cupy import _core
    calls = []
    derive = _core.derive
    monkeypatch.setattr(_core, "derive", lambda entry, *a: (calls.append(entry.name), derive(entry, *a))[1])
    g, rows, cols = cp.zeros((4, 3)), cp.arange(4), cp.asarray([0, 2, 1, 0])
    for _ in range(5):
        g[rows, cols] = 1.0
    assert calls.count("ndarray.__setitem__") == 1 and float(g.sum()) == 4.0


def test_an_int_out_of_the_arrays_range_raises_at_the_call_after_one_in_range(cp):
    # The hot path's dtype cache is keyed by the scalar's type: an int's range must count too.
    i8, u8 = cp.asarray(np.array([1, 2], np.int8)), cp.asarray(np.array([1, 2], np.uint8))
    assert (i8 + 1).dtype == np.int8 and (u8 + 1).dtype == np.uint8
    for array, value in ((i8, 300), (i8, 200), (u8, -1), (i8, 2**40)):
        with pytest.raises(OverflowError):
            array + value                   # no sync point: as NumPy 2 and CuPy 14 raise it
    assert (i8 + 100).get().tolist() == [101, 102] and (u8 + 200).dtype == np.uint8
    cp.cuda.Device().synchronize()


def test_a_sliding_window_view_costs_no_memory(cp):
    # Its logical size (here 8 GB, past the device) is not memory: the daemon's ledger finds the
    # array it views through NumPy's as_strided wrapper (both replay loops).
    x = cp.arange(10**6, dtype=cp.float64)
    before = cp.get_default_memory_pool().used_bytes()
    for _ in range(3):
        w = cp.lib.stride_tricks.sliding_window_view(x, 1000)
        assert w.shape == (10**6 - 999, 1000) and float(w[5].sum()) == float(sum(range(5, 1005)))
    assert cp.get_default_memory_pool().used_bytes() - before < 2**20
