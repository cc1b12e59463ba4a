"""Where a request's devices go: pure placement logic, no I/O, no clock.

`place(hosts, allocations, request, policy, oversubscribe)` returns the allocations to grant,
None when the pool has no room now (the caller may queue the request), or raises
RequestError (the request itself is wrong) or Unsatisfiable (it could not be met even if every
lease were released: too much memory, too many devices, filters matching nothing).

Rules:
- whole: the device must carry no allocation, and nothing is placed on it afterwards.
- fraction p: p of the device's memory (rounded down) and p of its compute share.
- memory m: m bytes and a compute share of m / memory_total.
- Memory is never oversubscribed. Compute shares sum to at most 1 per device unless the pool
  runs with `oversubscribe` (then only memory limits what fits).
- One request uses a physical device at most once, and each requested device is one physical
  device (never split across devices or hosts). All devices on one host are preferred; only when
  no host can hold them all is the request spread over as few hosts as possible.
- Policy `pack` puts each device on the fullest device that fits (keeps whole devices free);
  `spread` on the emptiest (less interference between tenants).

Beware: callers pass only hosts that may receive work (the server leaves stale hosts out), and
allocations on devices not among `hosts` are ignored.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Sequence

from gpuremote._config import parse_size
from gpuremote.pool.model import Allocation, Device, Host

POLICIES = ("pack", "spread")
SIZES = ("whole", "fraction", "memory")
# Float slack when compute shares are summed (three shares of 1/3 must fit on one device).
_EPS = 1e-9
_FILTER_FORMS = "host=NAME, device.name=TEXT, device.memory>=SIZE (e.g. 8GiB) or transport=NAME (e.g. rdma)"


class RequestError(ValueError):
    """The request is malformed: bad size, count or filter."""


class Unsatisfiable(ValueError):
    """The request cannot be met by the pool's hosts even with every device free."""


@dataclasses.dataclass(frozen=True)
class Request:
    """`count` devices of `size` ("whole", "fraction" with amount p, "memory" with amount bytes)."""
    count: int
    size: str
    amount: float = 1.0
    filters: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Filter:
    key: str
    value: str
    min_memory: int = 0

    def matches(self, host: Host, device: Device) -> bool:
        if self.key == "host":
            return self.value in (host.host_id, host.address, host.address.rpartition(":")[0])
        if self.key == "device.name":
            return self.value.lower() in device.name.lower()
        if self.key == "device.memory":
            return device.memory_total >= self.min_memory
        return self.value.lower() in {t.lower() for t in host.transports} | {"grpc"}


def parse_filter(text: str) -> Filter:
    """'host=gpu1', 'device.name=A100', 'device.memory>=8GiB', 'transport=rdma' -> Filter."""
    m = re.fullmatch(r"\s*([A-Za-z_.]+)\s*(>=|=)\s*(.*?)\s*", text)
    key, op, value = m.groups() if m else ("", "", "")
    if (key, op) not in (("host", "="), ("device.name", "="), ("device.memory", ">="), ("transport", "=")) \
            or not value or value[0] in "=<>":
        raise RequestError(f"malformed filter {text!r}: use {_FILTER_FORMS}")
    if key != "device.memory":
        return Filter(key, value)
    try:
        return Filter(key, value, parse_size(value))
    except ValueError as exc:
        raise RequestError(f"malformed filter {text!r}: {exc}") from None


def _validate(request: Request) -> list[Filter]:
    if request.count < 1:
        raise RequestError("a request for 0 devices: ask for at least 1 device")
    if request.size not in SIZES:
        raise RequestError(f"no size given: ask for whole devices, a fraction in (0, 1] or an amount of memory "
                           f"(got {request.size!r})")
    if request.size == "fraction" and not (math.isfinite(request.amount) and 0 < request.amount <= 1):
        raise RequestError(f"fraction {request.amount} is not in (0, 1]: ask for a share such as 0.25 or 0.5, "
                           "or 1 for all of a device")
    if request.size == "memory" and request.amount < 1:
        raise RequestError("a request for 0 bytes per device: ask for an amount of memory such as 4GiB")
    return [parse_filter(f) for f in request.filters]


def demand(request: Request, device: Device) -> tuple[int, float]:
    """Bytes and compute share the request takes on `device`."""
    if request.size == "whole":
        return device.memory_total, 1.0
    if request.size == "fraction":
        return max(1, int(request.amount * device.memory_total)), request.amount
    return int(request.amount), min(1.0, request.amount / device.memory_total)


@dataclasses.dataclass
class _Load:
    memory: int = 0
    share: float = 0.0
    count: int = 0
    exclusive: bool = False


def _loads(allocations: Iterable[Allocation]) -> dict[tuple[str, int], _Load]:
    loads: dict[tuple[str, int], _Load] = {}
    for a in allocations:
        load = loads.setdefault((a.host_id, a.device), _Load())
        load.memory += a.memory
        load.share += a.share
        load.count += 1
        load.exclusive |= a.exclusive
    return loads


def _fits(request: Request, device: Device, load: _Load, oversubscribe: bool) -> bool:
    memory, share = demand(request, device)
    if load.exclusive or (request.size == "whole" and load.count):
        return False
    return load.memory + memory <= device.memory_total and (oversubscribe or load.share + share <= 1 + _EPS)


def _fullness(device: Device, load: _Load) -> float:
    return max(load.memory / device.memory_total, load.share)


def _device_order(request: Request, host: Host, devices: list[Device], loads, policy: str) -> list[Device]:
    sign = -1 if policy == "pack" else 1

    def key(d: Device):
        load = loads.get((host.host_id, d.index), _Load())
        leftover = d.memory_total - load.memory - demand(request, d)[0]
        return sign * _fullness(d, load), -sign * leftover, d.index
    return sorted(devices, key=key)


def _choose(request: Request, fitting: list[tuple[Host, list[Device]]], loads, policy: str):
    """[(host, devices)] for the request, or None when fewer than `count` devices fit."""
    n = request.count
    sign = -1 if policy == "pack" else 1

    def score(entry):
        host, devices = entry
        return sum(_fullness(d, loads.get((host.host_id, d.index), _Load())) for d in devices[:n]) * sign

    whole_hosts = [e for e in fitting if len(e[1]) >= n]
    if whole_hosts:
        host, devices = min(whole_hosts, key=lambda e: (score(e), e[0].host_id))
        return [(host, devices[:n])]
    chosen, left = [], n
    for host, devices in sorted(fitting, key=lambda e: (-len(e[1]), score(e), e[0].host_id)):
        chosen.append((host, devices[:left]))
        left -= len(chosen[-1][1])
        if left <= 0:
            return chosen
    return None


def _check_satisfiable(request: Request, hosts: Sequence[Host], matching, filters: list[Filter]) -> None:
    if not hosts:
        raise Unsatisfiable("the pool has no live hosts: no daemon has registered (or all stopped heartbeating); "
                            "start daemons registered with this pool, then ask again")
    if not matching:
        have = "; ".join(f"{h.host_id}: " + ", ".join(f"{d.name} ({d.memory_total / 2**30:.1f} GiB)"
                                                     for d in h.devices) for h in hosts)
        raise Unsatisfiable(f"no device matches the filters {', '.join(request.filters)}; the pool has {have}. "
                            "Loosen or correct the filters")
    where = " matching the filters" if filters else ""
    if request.size == "memory":
        largest = max(d.memory_total for _, d in matching)
        if request.amount > largest:
            raise Unsatisfiable(f"{int(request.amount):,} bytes per device is more than any device{where} has "
                                f"(the largest has {largest:,} bytes, {largest / 2**30:.2f} GiB): ask for at most "
                                "that much memory per device, or for a fraction of a device")
    able = [d for _, d in matching if demand(request, d)[0] <= d.memory_total]
    if request.count > len(able):
        raise Unsatisfiable(f"{request.count} devices asked for, but the pool has only {len(able)} device(s){where} "
                            f"that can hold the request: ask for at most {len(able)}")


def place(hosts: Sequence[Host], allocations: Iterable[Allocation], request: Request,
          policy: str = "pack", oversubscribe: bool = False) -> list[Allocation] | None:
    """The allocations for `request` (ordered by host, then device index), or None if no room now."""
    if policy not in POLICIES:
        raise ValueError(f"unknown placement policy {policy!r}: use one of {', '.join(POLICIES)}")
    filters = _validate(request)
    matching = [(h, d) for h in hosts for d in h.devices if all(f.matches(h, d) for f in filters)]
    _check_satisfiable(request, hosts, matching, filters)
    loads = _loads(allocations)
    by_host: dict[str, tuple[Host, list[Device]]] = {}
    for h, d in matching:
        if _fits(request, d, loads.get((h.host_id, d.index), _Load()), oversubscribe):
            by_host.setdefault(h.host_id, (h, []))[1].append(d)
    fitting = [(h, _device_order(request, h, devices, loads, policy)) for h, devices in by_host.values()]
    chosen = _choose(request, fitting, loads, policy)
    if chosen is None:
        return None
    return [Allocation(host.host_id, d.index, *demand(request, d), exclusive=request.size == "whole")
            for host, devices in chosen for d in sorted(devices, key=lambda d: d.index)]
