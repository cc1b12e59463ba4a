"""The per-device compute scheduler (gpuremote/daemon/scheduler.py) on its own, with real threads.

Ops are stand-ins that hold the device for a known time (sleep releases the GIL, as a GPU
kernel or a NumPy op does), so shares can be measured in a second or two.
"""

from __future__ import annotations

import threading
import time

import pytest

from gpuremote.daemon.backends.emulated import EmulatedBackend


def scheduler(anticipate_s=None):
    from gpuremote.daemon.scheduler import DeviceScheduler
    return DeviceScheduler(0, EmulatedBackend(1), anticipate_s)


def busy(sched, key, share, seconds, op_s=0.001, gap_s=0.0002, out=None):
    flow = sched.flow(key, share)
    end = time.monotonic() + seconds
    waited = 0.0
    while time.monotonic() < end:
        t = time.perf_counter()
        mark = flow.enter()
        waited += time.perf_counter() - t
        time.sleep(op_s)
        flow.leave(mark)
        time.sleep(gap_s)
    if out is not None:
        out[key] = (flow.used_s, waited)
    flow.release()


@pytest.mark.parametrize("shares", [(0.5, 0.5), (0.25, 0.75)])
def test_busy_flows_get_their_shares(shares):
    sched = scheduler(anticipate_s=0.02)     # wider than the default 3 ms: thread wake-ups lag on a loaded CI box
    out: dict = {}
    threads = [threading.Thread(target=busy, args=(sched, f"f{i}", s, 1.5), kwargs={"out": out})
               for i, s in enumerate(shares)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    used = [out[f"f{i}"][0] for i in range(len(shares))]
    got = [u / sum(used) for u in used]
    assert all(abs(g - s) <= 0.1 for g, s in zip(got, shares)), (got, shares)
    assert sched.flows() == {}                         # released flows are forgotten
    assert 0.5 < sched.utilization() <= 1.0


def test_a_flow_alone_never_waits_and_gets_the_whole_device():
    sched = scheduler()
    out: dict = {}
    busy(sched, "alone", 0.1, 0.5, out=out)             # a small share: still all of an idle device
    used, waited = out["alone"]
    assert used > 0.3 and waited < 0.01, (used, waited)


def test_anticipation_gives_way_when_the_favoured_flow_stops():
    sched = scheduler(anticipate_s=0.05)
    fast = sched.flow("a", 0.9)
    slow = sched.flow("b", 0.1)
    mark = slow.enter()
    time.sleep(0.01)
    slow.leave(mark)                                   # b is far ahead now
    mark = fast.enter()
    got = []
    waiter = threading.Thread(target=lambda: (got.append(slow.enter()), slow.leave(got[-1])))
    waiter.start()
    time.sleep(0.01)
    fast.leave(mark)                                   # a is behind: the device is held for it ...
    started = time.monotonic()
    waiter.join(5)                                     # ... but a never comes back: b goes on
    assert got and time.monotonic() - started < 1.0
    fast.release()
    slow.release()


def test_overhead_per_op_is_small():
    sched = scheduler()
    flow = sched.flow("x", 1.0)
    n = 20000
    start = time.perf_counter()
    for _ in range(n):
        flow.leave(flow.enter())
    per_op = (time.perf_counter() - start) / n
    flow.release()
    assert per_op < 20e-6, per_op                     # ~1 us measured; loose for slow, busy CI machines


def test_a_bad_share_is_refused():
    with pytest.raises(ValueError, match="not in"):
        scheduler().flow("x", 0)


def test_a_held_stretch_is_one_turn_and_gives_way_to_a_waiter():
    from gpuremote.daemon.scheduler import Hold
    sched = scheduler(anticipate_s=0.0)
    a, b = sched.flow("a", 0.5), sched.flow("b", 0.5)
    hold = Hold(None)
    for _ in range(5):                  # five calls on one stream: the device is taken once
        hold.take(a, 0)
        time.sleep(0.002)
        hold.call_done()
    assert sched._running is a and a.used_s == 0.0     # still held, nothing charged yet
    entered = threading.Event()

    def other():
        mark = b.enter()
        entered.set()
        b.leave(mark)
    t = threading.Thread(target=other)
    t.start()
    deadline = time.monotonic() + 10
    while not sched._waiting and time.monotonic() < deadline:   # b queues behind the held device
        time.sleep(0.001)
    assert sched._waiting and not entered.is_set()
    hold.take(a, 0)                     # the call in progress finishes ...
    hold.call_done()                    # ... and the waiter gets the device
    assert entered.wait(10)
    t.join(10)
    assert a.used_s >= 0.01             # the stretch was charged as one op
    hold.take(a, 1)                     # another stream is another turn
    assert sched._running is a
    hold.drop()
    assert sched._running is None
    a.release()
    b.release()
