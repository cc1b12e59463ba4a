"""The memory ledger's counters (gpuremote/daemon/ledger.py): the compiled Ledger (native/replay.c)
and PyLedger take the same bytes, refuse the same charges and keep a lease's ledger and its
device's in step; DeviceMemory and LeaseMemory on top say why a charge was refused."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings, strategies as st

from gpuremote.daemon import ledger as ledger_module, native
from gpuremote.daemon.admission import LeaseMemory
from gpuremote.daemon.backends.base import DeviceMemory
from gpuremote.errors import OutOfMemoryError

KINDS = [ledger_module.PyLedger] + ([native.replay.Ledger] if native.replay is not None else [])
needs_compiled = pytest.mark.skipif(native.replay is None, reason="gpuremote._replay was not built here")


@pytest.fixture(params=KINDS, ids=lambda k: k.__module__)
def kind(request):
    return request.param


def chain(kind, capacities):
    """Ledgers each the parent of the next: [device, lease] for capacities [device, lease]."""
    out = []
    for cap in capacities:
        out.append(kind(cap, out[-1] if out else None))
    return out


STEPS = st.lists(st.tuples(st.sampled_from(["take", "give"]), st.integers(0, 2), st.integers(0, 2**20)),
                 max_size=60)


@needs_compiled
@settings(max_examples=200, deadline=None)
@given(capacities=st.lists(st.integers(0, 2**21), min_size=1, max_size=3), steps=STEPS)
def test_the_compiled_counters_do_what_the_python_ones_do(capacities, steps):
    runs = []
    for kind in KINDS:
        ledgers, seen = chain(kind, capacities), []
        for what, at, nbytes in steps:
            target = ledgers[min(at, len(ledgers) - 1)]
            if what == "take":
                seen.append(target._take(nbytes))
            else:
                try:
                    target._give(nbytes)
                except AssertionError:      # more than was taken, somewhere in the chain
                    seen.append("negative")
            seen.append([(led.used, led.capacity) for led in ledgers])
        runs.append(seen)
    assert runs[0] == runs[1]


def test_a_charge_takes_from_the_whole_chain_or_nothing(kind):
    device, lease = chain(kind, [100, 60])
    assert lease._take(50) == 0 and (device.used, lease.used) == (50, 50)
    assert lease._take(20) == 1 and (device.used, lease.used) == (50, 50)      # the lease is full
    assert device._take(45) == 0
    assert lease._take(10) == 2 and (device.used, lease.used) == (95, 50)      # the device is full
    lease._give(50)
    assert (device.used, lease.used) == (45, 0) and lease.parent is device and device.parent is None


def test_more_bytes_than_any_ledger_holds_are_refused_not_wrapped(kind):
    (led,) = chain(kind, [2**62])
    assert led._take(2**200) == 1 and led._take(2**63 - 1) == 1 and led.used == 0
    assert led._take(2**62) == 0 and led._take(2**62) == 1 and led.used == 2**62


def test_giving_back_more_than_was_taken_is_an_assertion(kind):
    (led,) = chain(kind, [10])
    led._take(4)
    with pytest.raises(AssertionError, match="went negative"):
        led._give(5)


@pytest.mark.parametrize("args", [("10",), (1.5,), (None,), (10, "parent"), (10, object())])
def test_bad_construction_is_a_type_error(kind, args):
    with pytest.raises(TypeError):
        kind(*args)


@needs_compiled
@pytest.mark.parametrize("value", ["3", 1.0, None, b"1"])
def test_the_compiled_primitives_want_int_byte_counts(value):
    led = native.replay.Ledger(10)
    with pytest.raises(TypeError):
        led._take(value)
    with pytest.raises(TypeError):
        led._give(value)
    with pytest.raises(OverflowError):
        led._give(2**70)
    assert led.used == 0


@needs_compiled
def test_the_counters_cannot_be_set_from_python():
    led = native.replay.Ledger(10)
    for name in ("used", "capacity", "parent"):
        with pytest.raises(AttributeError):
            setattr(led, name, 0)


def test_threads_taking_and_giving_never_pass_the_capacity():
    # Four threads race for a device of 10 units of 100 bytes: each unit taken is given back; the
    # counters end at zero and no thread ever saw more taken than the capacity allows.
    device = DeviceMemory(1000)
    worst, errors = [0], []

    def work():
        try:
            for _ in range(5000):
                if device._take(100) == 0:
                    worst[0] = max(worst[0], device.used)
                    device._give(100)
        except BaseException as exc:    # noqa: BLE001 -- reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors and device.used == 0 and worst[0] <= 1000


def test_device_and_lease_messages_say_which_ran_out():
    device = DeviceMemory(1000)
    lease = LeaseMemory(device, 600, "L7")
    lease.charge(500)
    with pytest.raises(OutOfMemoryError, match="limit of lease L7 on this device: 600 bytes"):
        lease.charge(200)
    device.charge(450)
    with pytest.raises(OutOfMemoryError, match="allocated so far: 950 bytes, device capacity: 1,000 bytes"):
        lease.charge(60)
    with pytest.raises(OutOfMemoryError, match="device capacity"):
        lease.check(60)
    assert (device.used, lease.used) == (950, 500)
    lease.credit(500)
    device.credit(450)
    assert (device.used, lease.used) == (0, 0)
