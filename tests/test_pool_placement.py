"""Placement rules, without gRPC: sizes, pack vs spread, host affinity, exclusivity, filters, bad requests."""

from __future__ import annotations

import pytest

from gpuremote.pool.model import Allocation, Device, Host
from gpuremote.pool.placement import Request, RequestError, Unsatisfiable, parse_filter, place

GiB = 2**30


def host(name: str, n: int = 2, memory: int = 8 * GiB, gpu: str = "Emulated", transports=()) -> Host:
    return Host(name, f"{name}:7200", "emulated", tuple(transports),
                tuple(Device(i, f"{gpu} {i}", memory) for i in range(n)))


def frac(host_id: str, device: int, p: float, total: int = 8 * GiB) -> Allocation:
    return Allocation(host_id, device, int(p * total), p, False)


def whole(host_id: str, device: int, total: int = 8 * GiB) -> Allocation:
    return Allocation(host_id, device, total, 1.0, True)


def where(allocations) -> list[tuple[str, int]]:
    return [(a.host_id, a.device) for a in allocations]


def fill(hosts, request, times, policy="pack", oversubscribe=False) -> list[Allocation]:
    """Place `request` `times` times, each seeing the previous ones."""
    held: list[Allocation] = []
    for _ in range(times):
        got = place(hosts, held, request, policy, oversubscribe)
        assert got is not None, f"no room for request {len(held) + 1}"
        held += got
    return held


# --- sizes ---

def test_sizes_give_memory_and_compute_share():
    hosts = [host("a", 1)]
    [w] = place(hosts, [], Request(1, "whole"))
    assert (w.memory, w.share, w.exclusive) == (8 * GiB, 1.0, True)
    [f] = place(hosts, [], Request(1, "fraction", 0.25))
    assert (f.memory, f.share, f.exclusive) == (2 * GiB, 0.25, False)
    [m] = place(hosts, [], Request(1, "memory", 2 * GiB))
    assert (m.memory, m.share, m.exclusive) == (2 * GiB, 0.25, False)


def test_three_thirds_fill_a_device_and_a_fourth_does_not_fit():
    hosts = [host("a", 1)]
    held = fill(hosts, Request(1, "fraction", 1 / 3), 3)
    assert sum(a.memory for a in held) <= 8 * GiB
    assert place(hosts, held, Request(1, "fraction", 0.01)) is None


def test_memory_is_never_oversubscribed():
    hosts = [host("a", 1)]
    held = [frac("a", 0, 0.75)]
    assert place(hosts, held, Request(1, "memory", 2 * GiB + 1), oversubscribe=True) is None
    assert place(hosts, held, Request(1, "memory", 2 * GiB), oversubscribe=True) is not None


# --- policies ---

def test_pack_fills_one_device_before_the_next():
    held = fill([host("a"), host("b")], Request(1, "fraction", 0.25), 5, "pack")
    assert where(held) == [("a", 0)] * 4 + [("a", 1)]


def test_spread_uses_the_emptiest_devices_first():
    held = fill([host("a"), host("b")], Request(1, "fraction", 0.25), 5, "spread")
    assert sorted(where(held[:4])) == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    assert len(set(where(held))) == 4


def test_pack_is_best_fit_and_spread_emptiest():
    hosts = [host("a"), host("b")]
    held = [frac("a", 0, 0.5), frac("b", 1, 0.25)]
    assert where(place(hosts, held, Request(1, "fraction", 0.25), "pack")) == [("a", 0)]
    assert where(place(hosts, held, Request(1, "fraction", 0.25), "spread")) in ([("a", 1)], [("b", 0)])
    # The fullest device that fits, not the fullest device: a/0 has no room for 0.75.
    assert where(place(hosts, held, Request(1, "fraction", 0.75), "pack")) == [("b", 1)]


def test_unknown_policy_is_an_error():
    with pytest.raises(ValueError, match="unknown placement policy 'random'.*pack, spread"):
        place([host("a")], [], Request(1, "whole"), "random")


# --- hosts and devices ---

@pytest.mark.parametrize("policy", ["pack", "spread"])
def test_devices_of_one_request_stay_on_one_host_when_possible(policy):
    hosts = [host("a", 2), host("b", 4)]
    got = place(hosts, [whole("a", 0)], Request(2, "fraction", 0.5), policy)
    assert {a.host_id for a in got} == {"b"} and len(set(where(got))) == 2
    got = place(hosts, [], Request(3, "whole"), policy)
    assert {a.host_id for a in got} == {"b"}


def test_split_over_hosts_uses_as_few_hosts_as_possible():
    hosts = [host("a", 1), host("b", 3), host("c", 2)]
    got = place(hosts, [], Request(5, "whole"))
    assert where(got) == [("b", 0), ("b", 1), ("b", 2), ("c", 0), ("c", 1)]


def test_one_request_uses_a_physical_device_once():
    hosts = [host("a", 1)]
    with pytest.raises(Unsatisfiable, match="2 devices asked for.*only 1 device.*at most 1"):
        place(hosts, [], Request(2, "fraction", 0.1))


def test_a_requested_device_is_never_split_over_devices():
    hosts = [host("a", 2)]
    held = [frac("a", 0, 0.5), frac("a", 1, 0.5)]          # 8 GiB free in all, 4 GiB on each device
    assert place(hosts, held, Request(1, "memory", 6 * GiB)) is None


def test_allocations_are_ordered_by_host_then_device_index():
    hosts = [host("a", 4)]
    held = [frac("a", 0, 0.5), frac("a", 3, 0.5)]
    got = place(hosts, held, Request(3, "fraction", 0.25))
    assert where(got) == sorted(where(got))


# --- whole devices ---

@pytest.mark.parametrize("oversubscribe", [False, True])
def test_whole_device_is_exclusive_both_ways(oversubscribe):
    hosts = [host("a", 1)]
    assert place(hosts, [frac("a", 0, 0.01)], Request(1, "whole"), oversubscribe=oversubscribe) is None
    assert place(hosts, [whole("a", 0)], Request(1, "memory", 1), oversubscribe=oversubscribe) is None
    assert place(hosts, [whole("a", 0)], Request(1, "whole"), oversubscribe=oversubscribe) is None
    assert place(hosts, [], Request(1, "whole"), oversubscribe=oversubscribe) is not None


def test_whole_devices_go_where_nothing_is_allocated():
    hosts = [host("a", 2)]
    assert where(place(hosts, [frac("a", 0, 0.1)], Request(1, "whole"))) == [("a", 1)]


# --- compute oversubscription ---

def test_compute_share_is_capped_unless_oversubscription_is_on():
    # The device was re-registered with twice the memory: half its compute is leased, a quarter of its memory.
    hosts = [host("a", 1, memory=16 * GiB)]
    held = [Allocation("a", 0, 4 * GiB, 0.5, False)]
    request = Request(1, "memory", 10 * GiB)                 # 10/16 of the compute time
    assert place(hosts, held, request) is None
    [got] = place(hosts, held, request, oversubscribe=True)
    assert got.share == pytest.approx(10 / 16)


def test_rounded_down_memory_does_not_let_shares_pass_one():
    hosts = [Host("a", "a:1", "emulated", (), (Device(0, "tiny", 10),))]
    held = fill(hosts, Request(1, "fraction", 0.15), 6)      # 6 x 1 byte, shares sum to 0.9
    assert place(hosts, held, Request(1, "fraction", 0.15)) is None
    assert place(hosts, held, Request(1, "fraction", 0.15), oversubscribe=True) is not None


# --- filters ---

def test_filters_select_hosts_and_devices():
    hosts = [host("a", gpu="NVIDIA A100", memory=40 * GiB), host("b", gpu="NVIDIA H100", memory=80 * GiB,
                                                                   transports=("rdma", "shm"))]
    assert {a.host_id for a in place(hosts, [], Request(1, "whole", filters=("host=b",)))} == {"b"}
    assert {a.host_id for a in place(hosts, [], Request(1, "whole", filters=("host=a:7200",)))} == {"a"}
    assert {a.host_id for a in place(hosts, [], Request(2, "whole", filters=("device.name=h100",)))} == {"b"}
    assert {a.host_id for a in place(hosts, [], Request(1, "whole", filters=("device.memory>=64GiB",)))} == {"b"}
    assert {a.host_id for a in place(hosts, [], Request(1, "whole", filters=("transport=RDMA",)))} == {"b"}
    assert place(hosts, [], Request(4, "whole", filters=("transport=grpc",))) is not None
    both = ("device.name=NVIDIA", " device.memory >= 40GiB ")
    assert len(place(hosts, [], Request(4, "whole", filters=both))) == 4


def test_filters_that_match_nothing_say_what_the_pool_has():
    hosts = [host("a", gpu="NVIDIA A100")]
    with pytest.raises(Unsatisfiable, match=r"no device matches the filters host=zz.*a: NVIDIA A100 0 \(8.0 GiB\)"):
        place(hosts, [], Request(1, "whole", filters=("host=zz",)))
    with pytest.raises(Unsatisfiable, match="no device matches the filters transport=rdma"):
        place(hosts, [], Request(1, "whole", filters=("transport=rdma",)))
    with pytest.raises(Unsatisfiable, match="2 devices asked for.*only 1 device.*matching the filters"):
        place(hosts + [host("b", gpu="H100")], [], Request(2, "whole", filters=("device.name=A100 1",)))


@pytest.mark.parametrize("text", ["cuda", "host", "host=", "host==a", "color=red", "device.memory=8GiB",
                                  "device.memory>=", "device.name>=A100", "transport<=rdma"])
def test_malformed_filter_is_an_error_that_lists_the_forms(text):
    with pytest.raises(RequestError, match=r"malformed filter .*host=NAME, device.name=TEXT, device.memory>=SIZE"):
        place([host("a")], [], Request(1, "whole", filters=(text,)))


def test_filter_with_a_bad_size_says_how_to_write_one():
    with pytest.raises(RequestError, match="malformed filter 'device.memory>=lots'.*8GiB"):
        parse_filter("device.memory>=lots")
    assert parse_filter("device.memory>=8GiB").min_memory == 8 * GiB


# --- bad requests ---

@pytest.mark.parametrize("p", [0.0, -0.5, 1.0000001, 2.0, float("nan"), float("inf")])
def test_fraction_outside_zero_one_is_an_error(p):
    with pytest.raises(RequestError, match=r"fraction .* is not in \(0, 1\]: ask for a share such as 0.25"):
        place([host("a")], [], Request(1, "fraction", p))


def test_fraction_one_is_a_whole_device_share():
    [a] = place([host("a", 1)], [], Request(1, "fraction", 1.0))
    assert (a.memory, a.share, a.exclusive) == (8 * GiB, 1.0, False)


def test_zero_devices_zero_bytes_and_no_size_are_errors():
    with pytest.raises(RequestError, match="0 devices: ask for at least 1"):
        place([host("a")], [], Request(0, "whole"))
    with pytest.raises(RequestError, match="0 bytes per device"):
        place([host("a")], [], Request(1, "memory", 0))
    with pytest.raises(RequestError, match="no size given"):
        place([host("a")], [], Request(1, ""))


def test_memory_larger_than_any_device_says_the_largest():
    hosts = [host("a", memory=8 * GiB), host("b", memory=16 * GiB)]
    with pytest.raises(Unsatisfiable, match=r"17,179,869,185 bytes per device is more than any device has "
                                            r"\(the largest has 17,179,869,184 bytes, 16.00 GiB\)"):
        place(hosts, [], Request(1, "memory", 16 * GiB + 1))
    with pytest.raises(Unsatisfiable, match="3 devices asked for.*only 2 device.*can hold"):
        place(hosts, [], Request(3, "memory", 16 * GiB))


def test_more_devices_than_the_pool_says_how_many_there_are():
    with pytest.raises(Unsatisfiable, match="7 devices asked for, but the pool has only 6 device.*at most 6"):
        place([host("a"), host("b"), host("c")], [], Request(7, "whole"))


def test_empty_pool_says_no_daemon_registered():
    with pytest.raises(Unsatisfiable, match="no live hosts: no daemon has registered"):
        place([], [], Request(1, "whole"))


def test_full_pool_is_none_not_an_error():
    hosts = [host("a")]
    assert place(hosts, [whole("a", 0), whole("a", 1)], Request(1, "fraction", 0.1)) is None
