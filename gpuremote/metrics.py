"""Prometheus metrics of a daemon and of a pool (`--metrics-port PORT`), with prometheus_client.

The collectors read live state when Prometheus scrapes; nothing is counted on the op hot path
for them (sessions count their ops and bytes in plain fields they keep anyway, and the daemon
adds those of closed sessions when they close).

Metrics (every one carries `component`, "daemon" or "pool", so that `gpuremote local`, which
serves both from one endpoint, exposes no duplicate series):

    gpuremote_device_memory_total_bytes{host,device}   gauge
    gpuremote_device_memory_used_bytes{host,device}    gauge
    gpuremote_device_utilization{host,device}          gauge, busy fraction over the last window
    gpuremote_sessions{host}                           gauge, sessions open
    gpuremote_ops_total{host}                          counter, daemon only
    gpuremote_bytes_total{host,direction}              counter, daemon only: h2d and d2h
    gpuremote_leases                                   gauge, pool only
    gpuremote_pool_waiting_requests                    gauge, pool only
    gpuremote_pool_hosts{stale}                        gauge, pool only

Beware: the pool's device figures are what its daemons last reported (at most a heartbeat old);
the daemon's are live. `serve(port=0)` picks a free port: read it from the return value.
"""

from __future__ import annotations

from typing import Callable

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

_DEVICE = ["component", "host", "device"]


def _device_families():
    return (GaugeMetricFamily("gpuremote_device_memory_total_bytes", "Memory of the device, bytes", labels=_DEVICE),
            GaugeMetricFamily("gpuremote_device_memory_used_bytes", "Device memory held by sessions, bytes",
                              labels=_DEVICE),
            GaugeMetricFamily("gpuremote_device_utilization", "Busy fraction of the device over the last window",
                              labels=_DEVICE))


class DaemonCollector:
    """A daemon's devices, sessions, ops and bytes; `host` names it (its pool host id or address)."""

    def __init__(self, service, host: Callable[[], str]):
        self.service = service
        self.host = host

    def collect(self):
        host = self.host()
        backend = self.service.backend
        total, used, util = _device_families()
        for p, mem, sched in zip(backend.props, backend.memory, backend.schedulers):
            labels = ["daemon", host, str(p.index)]
            total.add_metric(labels, mem.capacity)
            used.add_metric(labels, mem.used)
            util.add_metric(labels, sched.utilization())
        sessions = self.service.open_sessions()
        count = GaugeMetricFamily("gpuremote_sessions", "Sessions open", labels=["component", "host"])
        count.add_metric(["daemon", host], len(sessions))
        closed = dict(self.service.closed_totals)
        ops = CounterMetricFamily("gpuremote_ops", "Ops run by sessions", labels=["component", "host"])
        ops.add_metric(["daemon", host], closed["ops"] + sum(s.ops for s in sessions))
        moved = CounterMetricFamily("gpuremote_bytes", "Array bytes moved between clients and devices",
                                    labels=["component", "host", "direction"])
        moved.add_metric(["daemon", host, "h2d"], closed["bytes_h2d"] + sum(s.bytes_h2d for s in sessions))
        moved.add_metric(["daemon", host, "d2h"], closed["bytes_d2h"] + sum(s.bytes_d2h for s in sessions))
        yield from (total, used, util, count, ops, moved)


class PoolCollector:
    """The pool's hosts, devices (as last reported), sessions, leases and waiting requests."""

    def __init__(self, pool):
        self.pool = pool

    def collect(self):
        status = self.pool.status()
        total, used, util = _device_families()
        count = GaugeMetricFamily("gpuremote_sessions", "Sessions open, as daemons last reported",
                                  labels=["component", "host"])
        hosts = GaugeMetricFamily("gpuremote_pool_hosts", "Registered hosts", labels=["component", "stale"])
        stale = {"true": 0, "false": 0}
        for h in status.hosts:
            stale["true" if h.stale else "false"] += 1
            sessions = set()
            for d in h.devices:
                labels = ["pool", h.host_id, str(d.index)]
                total.add_metric(labels, d.memory_total)
                used.add_metric(labels, d.memory_used)
                util.add_metric(labels, d.utilization)
                sessions.update(s.session_id for s in d.sessions)
            count.add_metric(["pool", h.host_id], len(sessions))
        for k, v in stale.items():
            hosts.add_metric(["pool", k], v)
        leases = GaugeMetricFamily("gpuremote_leases", "Leases held", labels=["component"])
        leases.add_metric(["pool"], len(status.leases))
        waiting = GaugeMetricFamily("gpuremote_pool_waiting_requests", "Allocate requests waiting for capacity",
                                    labels=["component"])
        waiting.add_metric(["pool"], status.waiting)
        yield from (total, used, util, count, hosts, leases, waiting)


class MetricsServer:
    """An HTTP endpoint serving `collectors` at /metrics; port 0 picks a free port (`.port`)."""

    def __init__(self, port: int, *collectors, addr: str = "0.0.0.0"):
        registry = CollectorRegistry(auto_describe=False)
        for c in collectors:
            registry.register(c)
        self._server, self._thread = start_http_server(port, addr=addr, registry=registry)
        self.port = self._server.server_port
        self.address = f"{addr}:{self.port}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
