"""cupy.cuda names ordinary CuPy scripts use: MemoryPool.malloc / alloc (fresh device allocations as
MemoryPointers), the allocator settings (what is accepted, what is refused and why), the pool's limit,
malloc_managed's refusal, Stream.wait_event, Device.attributes and mem_info. Bad and hostile sizes
are refused before anything is allocated."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import gpuremote


def _used(cp) -> int:
    return cp.get_default_memory_pool().used_bytes()


def test_pool_malloc_gives_a_fresh_allocation_of_that_many_bytes(cp):
    before = _used(cp)
    pool = cp.cuda.MemoryPool()
    p = pool.malloc(1000)
    assert isinstance(p, cp.cuda.MemoryPointer) and p.device_id == 0 and p.offset == 0
    assert _used(cp) == before + 1000                  # exactly the bytes asked, held by this session
    host = np.arange(1000, dtype=np.uint8) % 251
    p.copy_from_host(host.ctypes.data, 1000)
    (p + 10).memset(7, 5)
    back = np.zeros(1000, np.uint8)
    p.copy_to_host(back.ctypes.data, 1000)
    want = host.copy()
    want[10:15] = 7
    np.testing.assert_array_equal(back, want)
    with pytest.raises(ValueError, match="no gpuremote array holds"):
        p.copy_to_host(back.ctypes.data, 1001)         # past the allocation: refused, as it has 1000
    del p
    gc.collect()
    assert _used(cp) == before                         # dropping the pointer frees it
    q = cp.cuda.alloc(64)                              # the current allocator: the raw one
    r = cp.get_default_memory_pool().malloc(0)
    assert isinstance(q, cp.cuda.MemoryPointer) and isinstance(r, cp.cuda.MemoryPointer) and q.ptr != r.ptr
    last = cp.cuda.runtime.getDeviceCount() - 1
    with cp.cuda.Device(last):                         # on the current device
        assert cp.cuda.alloc(8).device_id == last


def test_malloc_refuses_bad_and_hostile_sizes_allocating_nothing(cp):
    pool = cp.get_default_memory_pool()
    held = cp.zeros(4096, dtype=cp.uint8)
    before = _used(cp)
    with pytest.raises(ValueError, match="negative"):
        pool.malloc(-1)
    for bad in (1.5, "8", None):
        with pytest.raises(TypeError):
            pool.malloc(bad)
    for huge in (2**62, 2**63, 2**64, 2**62 + 1):      # past the device: refused before any op is sent
        with pytest.raises(cp.cuda.OutOfMemoryError, match="bytes in all"):
            cp.cuda.alloc(huge)
    free, total = cp.cuda.Device().mem_info
    assert free < total
    with pytest.raises(cp.cuda.OutOfMemoryError):      # fits the device, not its free memory: the daemon's
        pool.malloc(free + 1)                          # ledger refuses, raised here (not at a later sync)
    assert _used(cp) == before                         # nothing was allocated
    assert int(held.sum()) == 0                        # the session goes on


def test_allocator_settings_accept_pools_and_refuse_other_callables(cp):
    memory = cp.cuda.memory
    try:
        assert cp.cuda.get_allocator() is memory._malloc
        pool = cp.cuda.MemoryPool()
        cp.cuda.set_allocator(pool.malloc)             # the common lines: the daemon still allocates
        assert cp.cuda.get_allocator() == pool.malloc
        assert cp.cuda.alloc(32).device_id == 0
        cp.cuda.set_allocator(cp.get_default_memory_pool().malloc)
        with cp.cuda.using_allocator():                # None: the raw allocator, in this block only
            assert cp.cuda.get_allocator() is memory._malloc
            with pytest.raises(ValueError, match="using_allocator"):
                cp.cuda.set_allocator(None)
            with cp.cuda.using_allocator(pool.malloc):
                assert cp.cuda.get_allocator() == pool.malloc
            assert cp.cuda.get_allocator() is memory._malloc
        assert cp.cuda.get_allocator() == cp.get_default_memory_pool().malloc

        class Custom(cp.cuda.MemoryPool):
            def malloc(self, size):
                return None
        for other in (lambda size: None, Custom().malloc, cp.empty, print):
            with pytest.raises(NotImplementedError, match="daemon allocates"):
                cp.cuda.set_allocator(other)
            with pytest.raises(NotImplementedError, match="daemon allocates"):
                with cp.cuda.using_allocator(other):
                    pass
            with pytest.raises(NotImplementedError, match="daemon allocates"):
                cp.cuda.MemoryPool(other)
        for managed in (lambda: cp.cuda.malloc_managed(1024), lambda: cp.cuda.set_allocator(cp.cuda.malloc_managed),
                        lambda: cp.cuda.MemoryPool(memory.malloc_managed)):
            with pytest.raises(NotImplementedError, match="unified"):
                managed()
        assert cp.cuda.get_allocator() == cp.get_default_memory_pool().malloc   # refusals changed nothing
    finally:
        cp.cuda.set_allocator(None)
    assert cp.cuda.get_allocator() is memory._malloc


def test_pool_limit_caps_the_session_on_the_daemon(cp):
    pool = cp.get_default_memory_pool()
    assert pool.get_limit() == 0                        # none set, as in CuPy
    keep = cp.ones(1000, dtype=cp.uint8)                # held before the cap: it counts
    try:
        pool.set_limit(size=8000)
        assert pool.get_limit() == 8000
        fits = cp.ones(6000, dtype=cp.uint8)
        assert int(fits.sum()) == 6000
        with pytest.raises(cp.cuda.memory.OutOfMemoryError, match="limit this session set"):
            cp.ones(2000, dtype=cp.uint8).get()         # 1000 + 6000 + 2000 > 8000: refused by the daemon
        del fits
        gc.collect()
        assert int(cp.ones(6500, dtype=cp.uint8).sum()) == 6500     # freed bytes are room again
        for _ in range(3):                              # and through replayed calls too
            with pytest.raises(cp.cuda.memory.OutOfMemoryError, match="limit this session set"):
                (keep.astype(cp.float64) * 2).get()
        pool.set_limit(fraction=0.5)
        assert pool.get_limit() == cp.cuda.Device().mem_info[1] // 2
        pool.set_limit(size=7000)
        pool.set_limit()                                # no cap
        assert pool.get_limit() == 0 and int(cp.ones(20000, dtype=cp.uint8).sum()) == 20000
        for bad, error in (({"size": 1, "fraction": 0.5}, ValueError), ({"fraction": 1.5}, ValueError),
                           ({"fraction": -0.1}, ValueError), ({"size": -1}, ValueError), ({"size": 2**64}, ValueError),
                           ({"size": float("nan")}, ValueError), ({"fraction": float("nan")}, ValueError),
                           ({"size": "1GiB"}, TypeError), ({"fraction": True}, TypeError)):
            with pytest.raises(error):
                pool.set_limit(**bad)
        assert pool.get_limit() == 0
        from gpuremote.cupy._core import service_call
        for wire in ((-5,), ("8000",), (8000, 1), (), (2.5,), (True,)):     # the daemon checks the wire too
            with pytest.raises(ValueError, match="one number of bytes"):
                service_call("cuda.MemoryPool.set_limit", wire, value=True)
        with pytest.raises(TypeError, match="takes no arguments"):
            service_call("cuda.MemoryPool.get_limit", (8000,), value=True)
    finally:
        pool.set_limit()
    assert int(keep.sum()) == 1000


def test_wait_event_orders_a_stream_after_another_streams_event(cp):
    s1, s2 = cp.cuda.Stream(), cp.cuda.Stream()
    with s1:
        x = cp.arange(100_000, dtype=cp.float64)
        y = x * 2.0
    done = s1.record()
    trips = gpuremote.stats()["round_trips"]
    s2.wait_event(done)                                # a sync point: the event's stream has run to it
    assert gpuremote.stats()["round_trips"] > trips and done.done
    with s2:
        assert cp.cuda.get_current_stream() == s2
        z = y + 1.0
    np.testing.assert_array_equal(z.get(), np.arange(100_000) * 2.0 + 1.0)
    trips = gpuremote.stats()["round_trips"]
    s2.wait_event(s2.record())                         # its own stream: already in order
    s2.wait_event(cp.cuda.Event())                     # never recorded: nothing to wait for, as in CUDA
    cp.cuda.Stream.null.wait_event(cp.cuda.Event())
    assert gpuremote.stats()["round_trips"] == trips
    with pytest.raises(TypeError, match="cupy.cuda.Event"):
        s2.wait_event(s1)


def test_device_attributes_and_mem_info(cp):
    last = cp.cuda.runtime.getDeviceCount() - 1
    props = cp.cuda.runtime.getDeviceProperties(last)
    attributes = cp.cuda.Device(last).attributes
    assert attributes["ComputeCapabilityMajor"] == props["major"]
    assert attributes["ComputeCapabilityMinor"] == props["minor"]
    assert attributes["MultiProcessorCount"] == props["multiProcessorCount"]
    assert "name" not in attributes and "totalGlobalMem" not in attributes   # properties, not attributes
    assert cp.cuda.Device(last).compute_capability == f"{props['major']}{props['minor']}"
    free, total = cp.cuda.Device(last).mem_info
    assert 0 <= free <= total == props["totalGlobalMem"]


def test_ndarray_over_a_memory_pointer_is_a_view_of_its_bytes(cp):
    p = cp.cuda.alloc(64)
    a = cp.ndarray((2, 4), dtype=cp.float64, memptr=p)
    a[...] = cp.arange(8.0).reshape(2, 4)
    assert cp.ndarray((4,), cp.float64, memptr=p + 32).get().tolist() == [4.0, 5.0, 6.0, 7.0]
    x = cp.arange(6, dtype=cp.int32)
    assert cp.ndarray((3,), cp.int32, memptr=x.data + 12).get().tolist() == [3, 4, 5]
    assert cp.ndarray((2, 2), cp.int32, memptr=x.data, strides=(8, 4)).get().tolist() == [[0, 1], [2, 3]]
    assert cp.ndarray((2, 3), order="F").flags.f_contiguous
    with pytest.raises(ValueError, match="no gpuremote array holds the 800 bytes"):
        cp.ndarray((100,), cp.float64, memptr=p)            # past the allocation's end
    with pytest.raises(NotImplementedError, match="contiguous strides"):
        cp.ndarray((2, 2), cp.int32, memptr=x.data, strides=(4, 8))
    with pytest.raises(TypeError, match="MemoryPointer"):
        cp.ndarray((2,), cp.int32, memptr=12345)
