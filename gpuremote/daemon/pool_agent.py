"""A daemon's membership in a pool: register, heartbeat, and close sessions whose lease ended.

`PoolAgent(service, pool, advertise, host_id).start()` runs one thread that

- registers the daemon's devices with the pool and hands the grant key it gets back to the
  daemon's Admission (which then admits sessions with valid grants only);
- every heartbeat_s (the pool says how often) reports each device's memory total/used, its
  utilisation (busy fraction measured by the device scheduler over its window) and the sessions
  on it (session id, lease id, client, memory used, age);
- closes every session whose lease is no longer among the heartbeat reply's active_leases
  (released or expired): its stream is cancelled, and the session's teardown frees its memory;
  the lease is remembered as ended, so its still-unexpired grants open no new session;
- on `leave()` (the daemon shuts down) stops heartbeating and deregisters, so the pool places
  nothing more here;
- registers again by itself when the pool answers known=false (it restarted without its state)
  and after any failed call or lost connection, once the pool answers again (it may have
  restarted: registering again is idempotent and refreshes the key, address and devices). The
  channel's connectivity is watched, so a pool restarted between two heartbeats is noticed too.

Every call to the pool is bounded (pool_rpc_timeout_s), every wait is on the stop event, so
`stop()` returns within about one call timeout.

Beware:
- A session is closed only if it opened before the heartbeat that omitted its lease was sent:
  a lease granted after the pool computed its reply would otherwise be cut off at once.
- While the pool is unreachable nothing is closed: an unreachable pool is not an expired lease.
  Sessions stay until the pool is back and says otherwise.
- The grant key arrives in plain gRPC (as in pool.proto): run pools and daemons on a trusted network.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

import grpc

from gpuremote._config import DEFAULTS
from gpuremote.transport import auth
from gpuremote.v1 import pool_pb2, pool_pb2_grpc

log = logging.getLogger("gpuremote.daemon.pool")


def shown_on(device: int, devices, lease_id: str, memory_used) -> bool:
    """Whether a session is listed under `device` (heartbeats, smi): a session under grants on each
    granted device; a grantless one (standalone daemon) where it holds memory, or on its first
    device while it holds none. `memory_used` maps device index -> bytes."""
    devices = list(devices)
    if device not in devices:
        return False
    if lease_id:
        return True
    held = [d for d in devices if memory_used.get(d, 0)]
    return device in held if held else device == devices[0]


class PoolAgent:
    """Keeps one daemon registered with one pool (see the module docstring)."""

    def __init__(self, service, pool: str, advertise: str, host_id: str | None = None,
                 transports: tuple[str, ...] = (), on_register: Callable[[str], None] | None = None,
                 security=None):
        # security: what the daemon presents to the pool (auth.ClientSecurity; None: from the environment).
        self.security = security
        self.service = service
        self.admission = service.admission
        self.pool = pool
        self.address = advertise
        self.host_id = host_id or advertise
        self.transports = tuple(transports)
        self.on_register = on_register
        self.heartbeat_s = DEFAULTS.pool_heartbeat_s
        self.registrations = 0
        self.last_error = ""
        self.registered = threading.Event()
        self._active: set[str] = set()
        self._stop = threading.Event()
        self._leaving = False                   # deregister on the way out (leave)
        self._wake = threading.Event()          # set by the stop and by a lost connection
        self._connected = False
        self._lost = False
        self._thread = threading.Thread(target=self._run, name="gpuremote-pool-agent", daemon=True)

    def start(self) -> "PoolAgent":
        self._thread.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(DEFAULTS.pool_rpc_timeout_s + 1 if timeout is None else timeout)

    def leave(self) -> None:
        """Stop, and tell the pool this daemon is leaving (one bounded call): no new placements here."""
        self._leaving = True
        self.stop(timeout=2 * DEFAULTS.pool_rpc_timeout_s + 1)   # a heartbeat in flight, then Deregister

    # -- the loop ------------------------------------------------------------------------------
    def _run(self) -> None:
        from gpuremote.pool.channel import channel_options   # reconnect backoff capped at pool_retry_s
        channel = auth.channel(self.pool, self.security, channel_options())
        channel.subscribe(self._connectivity)
        stub = pool_pb2_grpc.PoolStub(channel)
        register = True
        try:
            while not self._stop.is_set():
                wait = self.heartbeat_s
                try:
                    if self._lost:
                        self._lost, register = False, True
                    if register:
                        self._register(stub)
                        register = False
                    if not self._heartbeat(stub):
                        log.warning("the pool at %s does not know host %s (it restarted without its state): "
                                    "registering again", self.pool, self.host_id)
                        register, wait = True, 0.0
                except grpc.RpcError as exc:
                    self._failed(exc)
                    register, wait = True, DEFAULTS.pool_retry_s
                except Exception:     # a bug must not end the daemon's membership silently
                    log.exception("pool agent error")
                    register, wait = True, DEFAULTS.pool_retry_s
                self._wake.wait(wait)
                self._wake.clear()
        finally:
            if self._leaving and self.registrations:
                self._deregister(stub)
            channel.unsubscribe(self._connectivity)
            channel.close()

    def _deregister(self, stub) -> None:
        try:
            stub.Deregister(pool_pb2.DeregisterRequest(host_id=self.host_id), timeout=DEFAULTS.pool_rpc_timeout_s)
            log.info("left the pool at %s", self.pool)
        except grpc.RpcError as exc:     # unreachable: the host goes stale there, which stops placements too
            self._failed(exc)

    def _connectivity(self, state: grpc.ChannelConnectivity) -> None:
        """gRPC's connectivity callback: a connection that was up and went down means the pool may
        have restarted: register again as soon as it answers."""
        if state == grpc.ChannelConnectivity.READY:
            self._connected = True
        elif self._connected and state in (grpc.ChannelConnectivity.IDLE, grpc.ChannelConnectivity.TRANSIENT_FAILURE):
            self._connected = False
            self._lost = True
            self._wake.set()

    def _failed(self, exc: grpc.RpcError) -> None:
        code = exc.code() if hasattr(exc, "code") else None
        message = f"{getattr(code, 'name', 'error').lower()}: {exc.details() if hasattr(exc, 'details') else exc}"
        if message != self.last_error:   # once per distinct failure, not every retry
            log.warning("pool at %s: %s; retrying every %g s", self.pool, message, DEFAULTS.pool_retry_s)
        self.last_error = message

    def _register(self, stub) -> None:
        request = pool_pb2.RegisterRequest(host_id=self.host_id, address=self.address,
                                           backend=self.service.backend.kind, devices=self._devices(),
                                           transports=self.transports)
        reply = stub.Register(request, timeout=DEFAULTS.pool_rpc_timeout_s)
        self.admission.configure(reply.grant_key, self.host_id, self.address)
        self.heartbeat_s = min(max(reply.heartbeat_s or DEFAULTS.pool_heartbeat_s, 0.05), 60.0)
        self.registrations += 1
        self.last_error = ""
        self.registered.set()
        log.info("registered with the pool at %s as host %s (%s)", self.pool, self.host_id, self.address)
        if self.on_register is not None:
            self.on_register(f"registered with the pool at {self.pool} as host {self.host_id} ({self.address})")

    def _heartbeat(self, stub) -> bool:
        sent = time.monotonic()
        reply = stub.Heartbeat(pool_pb2.HeartbeatRequest(host_id=self.host_id, devices=self._devices()),
                               timeout=DEFAULTS.pool_rpc_timeout_s)
        if not reply.known:
            return False
        active = set(reply.active_leases)
        for lease_id in self._active - active:           # seen ending, with or without sessions here
            self.admission.revoke(lease_id)
        self._active = active
        for s in self.service.open_sessions():
            if s.lease_id and s.lease_id not in active and s.started < sent:
                self.admission.revoke(s.lease_id)
                log.info("closing session %s: its lease %s was released or expired", s.id, s.lease_id)
                s.cancel()
        return True

    def _devices(self) -> list[pool_pb2.PoolDevice]:
        """Each device's use and sessions, as the pool wants them."""
        backend = self.service.backend
        sessions = self.service.open_sessions()
        now = time.monotonic()
        out = []
        for p, mem, sched in zip(backend.props, backend.memory, backend.schedulers):
            d = pool_pb2.PoolDevice(index=p.index, name=p.name, memory_total=mem.capacity,
                                    memory_used=min(mem.used, mem.capacity), utilization=sched.utilization(),
                                    compute_capability=p.compute_capability)
            for s in sessions:
                used = dict(enumerate(s.memory_used))
                if shown_on(p.index, s.tenancy.devices, s.lease_id, used):
                    d.sessions.add(session_id=s.id, lease_id=s.lease_id, client_name=s.client.client_name[:200],
                                   memory_used=used.get(p.index, 0), age_s=now - s.started)
            out.append(d)
        return out
