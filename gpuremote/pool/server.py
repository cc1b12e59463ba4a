"""The pool manager's gRPC service: registration, heartbeats, leases, a first-come-first-served queue.

`Pool` holds the state and the rules; `PoolService` maps it onto the gRPC methods; `PoolServer`
runs both plus the expiry thread (`PoolServer("127.0.0.1:0", "pool.db").start()`, then `.port`).

State: hosts, devices and leases (with their signed grants) live in memory and in the Store;
every change is written to the store first and applied in memory only when the write
succeeded, so a refused or failed call leaves the state unchanged, and a pool restarted from
its state file (even after SIGKILL) has every lease it ever confirmed. Hosts are persisted, so
their heartbeats stay `known` across a restart; heartbeat usage and last-seen times are not
(a restored host counts as seen at the restart, and its usage is empty until it reports).

Queue: Allocate requests that do not fit wait in strict arrival order: only the oldest waiter
may be placed, and a newcomer never overtakes a waiter even when it would fit. Whenever
capacity may have freed (release, expiry, registration, a host heartbeating again) every
waiter wakes and the head tries again.

Beware:
- One lock guards everything, including the store's fsync: simple, and enough for the rate of
  lease operations a pool sees; heartbeats do not touch the disk.
- Expiry uses the wall clock (it must survive restarts); a clock jumping forward expires leases.
- Whoever may call Register receives the grant key: every RPC requires the pool's token and/or
  client certificate (auth.py); with --daemon-token-file, Register, Heartbeat and Deregister
  require the daemons' own token instead, so tenants cannot register. An --insecure pool listens
  on loopback only unless told otherwise (SECURITY.md).
- A lease id is a public name (Status, daemons' Info show it). Renew and Release require the lease
  secret, HMAC-SHA256(lease key, lease id), handed only to the allocating client: derived, so it
  needs no storage and survives restarts with the lease key; that key never leaves the pool
  (daemons get the grant key, which cannot derive lease secrets).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import hmac
import logging
import math
import secrets
import threading
import time
from concurrent import futures
from typing import Callable

import grpc

from gpuremote._config import DEFAULTS
from gpuremote.pool import placement
from gpuremote.pool.model import Allocation, Device, Host, Lease
from gpuremote.pool.store import SQLiteStore, Store, StoreError
from gpuremote.transport import auth
from gpuremote.transport.grpc_channel import options as grpc_options
from gpuremote.v1 import pool_pb2, pool_pb2_grpc
from gpuremote.wire import grants

log = logging.getLogger("gpuremote.pool")


class Refused(Exception):
    """A call the pool answers with a gRPC error status."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def _invalid(message: str) -> Refused:
    return Refused(grpc.StatusCode.INVALID_ARGUMENT, message)


def _check_text(value: str, what: str, required: bool = True) -> str:
    if required and not value:
        raise _invalid(f"{what} is empty")
    if len(value) > DEFAULTS.pool_max_text_chars:
        raise _invalid(f"{what} has {len(value)} characters, more than the limit of {DEFAULTS.pool_max_text_chars}")
    return value


def _check_items(items, what: str) -> list[str]:
    if len(items) > DEFAULTS.pool_max_items:
        raise _invalid(f"{len(items)} {what} given, more than the limit of {DEFAULTS.pool_max_items}")
    return [_check_text(v, f"a {what[:-1]}") for v in items]


def _check_address(address: str) -> str:
    host, sep, port = _check_text(address, "the daemon address").rpartition(":")
    if not (sep and host and port.isdigit() and 0 < int(port) <= 65535):
        raise _invalid(f"daemon address {address!r} is not HOST:PORT with a port from 1 to 65535")
    return address


def _check_usage(d: pool_pb2.PoolDevice, memory_total: int, where: str) -> None:
    if d.memory_used > memory_total:
        raise _invalid(f"{where}: {d.memory_used:,} bytes used is more than its {memory_total:,} bytes of memory")
    if not (math.isfinite(d.utilization) and 0 <= d.utilization <= 1):
        raise _invalid(f"{where}: utilization {d.utilization} is not in [0, 1]")


def _check_device(d: pool_pb2.PoolDevice, host_id: str) -> Device:
    where = f"host {host_id!r} device {d.index}"
    if not 0 < d.memory_total <= DEFAULTS.pool_max_device_bytes:
        raise _invalid(f"{where}: memory_total of {d.memory_total:,} bytes is not a real device's (allowed: 1 byte "
                       f"to {DEFAULTS.pool_max_device_bytes:,} bytes); fix the daemon's device report")
    _check_usage(d, d.memory_total, where)
    return Device(d.index, _check_text(d.name, f"{where} name", required=False), d.memory_total,
                  _check_text(d.compute_capability, f"{where} compute capability", required=False))


def host_from_request(request: pool_pb2.RegisterRequest) -> Host:
    """The Host a registration describes, or Refused(INVALID_ARGUMENT) saying what is wrong."""
    address = _check_address(request.address)
    host_id = _check_text(request.host_id or address, "host_id")
    if not 0 < len(request.devices) <= DEFAULTS.pool_max_devices:
        raise _invalid(f"host {host_id!r} registers {len(request.devices)} devices: a host has 1 to "
                       f"{DEFAULTS.pool_max_devices}")
    indices = [d.index for d in request.devices]
    if len(set(indices)) != len(indices):
        raise _invalid(f"host {host_id!r} registers device indices {indices}: each index must appear once")
    devices = tuple(sorted((_check_device(d, host_id) for d in request.devices), key=lambda d: d.index))
    return Host(host_id, address, _check_text(request.backend, "backend"),
                tuple(_check_items(request.transports, "transports")), devices)


def request_from_proto(request: pool_pb2.AllocateRequest) -> placement.Request:
    size = request.WhichOneof("size")
    if size == "whole" and not request.whole:
        raise _invalid("whole=false is not a size: ask for whole=true, a fraction in (0, 1] or an amount of memory")
    amount = {"whole": 1.0, "fraction": request.fraction, "memory": request.memory}.get(size, 0.0)
    return placement.Request(request.count, size or "", amount, tuple(_check_items(request.filters, "filters")))


def _grant_of(signed: bytes) -> pool_pb2.Grant:
    return pool_pb2.Grant.FromString(pool_pb2.SignedGrant.FromString(signed).grant)


# A lease secret is an HMAC-SHA256; its domain label keeps it apart from any other use of the key.
LEASE_SECRET_BYTES = 32
_LEASE_SECRET_LABEL = b"gpuremote lease secret\0"


def lease_secret(lease_key: bytes, lease_id: str) -> bytes:
    return hmac.new(lease_key, _LEASE_SECRET_LABEL + lease_id.encode(), hashlib.sha256).digest()


def _check_secret_size(secret: bytes) -> None:
    # Bounded before any work; shorter ones (an empty one included) are simply wrong: PERMISSION_DENIED.
    if len(secret) > LEASE_SECRET_BYTES:
        raise _invalid(f"lease_secret has {len(secret):,} bytes; a lease secret has {LEASE_SECRET_BYTES}: "
                       "pass AllocateReply.lease_secret as it came")


class Pool:
    """The pool's state and rules, independent of gRPC (errors are Refused)."""

    def __init__(self, store: Store, lease_ttl: float, policy: str = "pack", oversubscribe: bool = False):
        if not (math.isfinite(lease_ttl) and lease_ttl > 0):
            raise ValueError(f"lease TTL {lease_ttl} s: give a positive number of seconds")
        if policy not in placement.POLICIES:
            raise ValueError(f"unknown placement policy {policy!r}: use one of {', '.join(placement.POLICIES)}")
        self.store, self.ttl, self.policy, self.oversubscribe = store, lease_ttl, policy, oversubscribe
        self.key = store.secret("grant_key", secrets.token_bytes(32))
        # Derives lease secrets; unlike the grant key it is never sent anywhere.
        self.lease_key = store.secret("lease_key", secrets.token_bytes(32))
        self.hosts = {h.host_id: h for h in store.hosts()}
        self.leases = {lease.lease_id: lease for lease in store.leases()}
        started = time.monotonic()
        self.seen = {host_id: started for host_id in self.hosts}
        self.usage: dict[str, dict[int, pool_pb2.PoolDevice]] = {}
        self.queue: collections.deque[object] = collections.deque()
        self.cond = threading.Condition()
        self.closing = False

    # --- daemons ---

    def register(self, request: pool_pb2.RegisterRequest) -> pool_pb2.RegisterReply:
        host = host_from_request(request)
        with self.cond:
            self._persist(self.store.put_host, host)
            self.hosts[host.host_id] = host
            self.seen[host.host_id] = time.monotonic()
            self.usage[host.host_id] = {d.index: d for d in request.devices}
            self.cond.notify_all()
        log.info("host %s registered at %s with %d devices", host.host_id, host.address, len(host.devices))
        # At most a third of the TTL: a daemon learns within that that a lease ended (active_leases).
        return pool_pb2.RegisterReply(grant_key=self.key, heartbeat_s=min(DEFAULTS.pool_heartbeat_s, self.ttl / 3))

    def heartbeat(self, request: pool_pb2.HeartbeatRequest) -> pool_pb2.HeartbeatReply:
        with self.cond:
            host = self.hosts.get(request.host_id)
            if host is None:
                return pool_pb2.HeartbeatReply(known=False)
            for d in request.devices:
                device = host.device(d.index)
                if device is None:
                    raise _invalid(f"host {host.host_id!r} reports device {d.index}, which it did not register: "
                                   "register again with all its devices")
                _check_usage(d, device.memory_total, f"host {host.host_id!r} device {d.index}")
            was_stale = self._stale(host.host_id)
            self.seen[host.host_id] = time.monotonic()
            self.usage.setdefault(host.host_id, {}).update({d.index: d for d in request.devices})
            if was_stale:
                self.cond.notify_all()
            now = time.time()
            active = [lease.lease_id for lease in self.leases.values()
                      if lease.expires_at > now and lease.on_host(host.host_id)]
        return pool_pb2.HeartbeatReply(known=True, active_leases=active)

    def deregister(self, request: pool_pb2.DeregisterRequest) -> pool_pb2.DeregisterReply:
        host_id = _check_text(request.host_id, "host_id")
        with self.cond:
            if host_id not in self.hosts:
                return pool_pb2.DeregisterReply(known=False)    # idempotent: a retried call is no error
            # As if never registered: no placements; its leases stay (they end by release or expiry)
            # and count again if it comes back. Heartbeats now answer known=false.
            self._persist(self.store.delete_host, host_id)
            del self.hosts[host_id]
            self.seen.pop(host_id, None)
            self.usage.pop(host_id, None)
            self.cond.notify_all()      # a waiter that only this host could serve now fails at once
        log.info("host %s deregistered", host_id)
        return pool_pb2.DeregisterReply(known=True)

    # --- clients ---

    def allocate(self, request: pool_pb2.AllocateRequest, is_active: Callable[[], bool],
                 time_left: float | None = None) -> pool_pb2.AllocateReply:
        wanted = request_from_proto(request)
        client = _check_text(request.client_name, "client_name", required=False)
        if not (math.isfinite(request.wait_s) and request.wait_s >= 0):
            raise _invalid(f"wait_s {request.wait_s} is not a number of seconds >= 0")
        wait = min(request.wait_s, DEFAULTS.pool_max_wait_s, math.inf if time_left is None else time_left)
        with self.cond:
            chosen = self._place(wanted)
            if chosen is not None and not self.queue:
                return self._grant(client, chosen)
            if wait <= 0:
                why = "no capacity is free now" if chosen is None else "requests that came first are waiting"
                raise self._busy(wanted, why, request.wait_s)
            if len(self.queue) >= DEFAULTS.pool_max_waiting:
                raise Refused(grpc.StatusCode.RESOURCE_EXHAUSTED,
                              f"{len(self.queue)} requests are already waiting (the limit): try again later")
            return self._wait(wanted, client, wait, is_active)

    def renew(self, lease_id: str, secret: bytes) -> pool_pb2.RenewReply:
        _check_secret_size(secret)
        with self.cond:
            lease = self.leases.get(lease_id)
            now = time.time()
            if lease is None or lease.expires_at <= now:
                raise Refused(grpc.StatusCode.NOT_FOUND,
                              f"lease {lease_id[:64]!r} is unknown or has expired (a lease lasts {self.ttl:g} s unless "
                              "renewed well within that): its devices may have gone to others; allocate again")
            self._check_secret(lease_id, secret)
            expires = now + self.ttl
            renewed = dataclasses.replace(lease, expires_at=expires, grants=tuple(
                dataclasses.replace(g, signed=self._resign(g.signed, expires)) for g in lease.grants))
            self._persist(self.store.put_lease, renewed)
            self.leases[lease_id] = renewed
        return pool_pb2.RenewReply(expires_at=expires,
                                   grants=[pool_pb2.SignedGrant.FromString(g.signed) for g in renewed.grants])

    def release(self, lease_id: str, secret: bytes) -> pool_pb2.ReleaseReply:
        _check_secret_size(secret)
        with self.cond:
            if lease_id not in self.leases:
                raise Refused(grpc.StatusCode.NOT_FOUND, f"lease {lease_id[:64]!r} is unknown: it was released already, "
                                                         "expired, or never granted by this pool")
            self._check_secret(lease_id, secret)
            self._persist(self.store.delete_leases, [lease_id])
            del self.leases[lease_id]
            self.cond.notify_all()
        log.info("lease %s released", lease_id)
        return pool_pb2.ReleaseReply()

    def status(self) -> pool_pb2.StatusReply:
        with self.cond:
            mono, now = time.monotonic(), time.time()
            reply = pool_pb2.StatusReply(waiting=len(self.queue))
            for host in sorted(self.hosts.values(), key=lambda h: h.host_id):
                reply.hosts.append(self._host_status(host, mono))
            for lease in sorted(self.leases.values(), key=lambda lease: lease.created_at):
                reply.leases.add(lease_id=lease.lease_id, client_name=lease.client_name,
                                 expires_in_s=lease.expires_at - now, age_s=now - lease.created_at,
                                 grants=[_grant_of(g.signed) for g in lease.grants])
        return reply

    # --- housekeeping ---

    def expire(self) -> None:
        """Drop leases past their expiry and wake the queue."""
        with self.cond:
            now = time.time()
            gone = [i for i, lease in self.leases.items() if lease.expires_at <= now]
            if gone:
                self.store.delete_leases(gone)
                for i in gone:
                    del self.leases[i]
                self.cond.notify_all()
        for i in gone:
            log.info("lease %s expired", i)

    def wake(self) -> None:
        with self.cond:
            self.cond.notify_all()

    def close(self) -> None:
        with self.cond:
            self.closing = True
            self.cond.notify_all()

    # --- internals (called with self.cond held) ---

    def _persist(self, write, *args) -> None:
        try:
            write(*args)
        except StoreError as exc:
            raise Refused(grpc.StatusCode.UNAVAILABLE, f"the pool cannot save its state, nothing changed: {exc}")

    def _check_secret(self, lease_id: str, secret: bytes) -> None:
        if not hmac.compare_digest(secret, lease_secret(self.lease_key, lease_id)):
            raise Refused(grpc.StatusCode.PERMISSION_DENIED,
                          f"lease {lease_id}: the lease secret is missing or wrong; only the client that allocated "
                          "the lease can renew or release it")

    def _stale(self, host_id: str) -> bool:
        return time.monotonic() - self.seen.get(host_id, -math.inf) > DEFAULTS.pool_stale_after_s

    def _place(self, wanted: placement.Request) -> list[Allocation] | None:
        live = [h for h in self.hosts.values() if not self._stale(h.host_id)]
        allocations = [g for lease in self.leases.values() for g in lease.grants]
        try:
            return placement.place(live, allocations, wanted, self.policy, self.oversubscribe)
        except placement.RequestError as exc:
            raise _invalid(str(exc)) from None
        except placement.Unsatisfiable as exc:
            raise Refused(grpc.StatusCode.FAILED_PRECONDITION, str(exc)) from None

    def _busy(self, wanted: placement.Request, why: str, wait_s: float) -> Refused:
        size = {"whole": "whole", "fraction": f"{wanted.amount:g} of a", "memory": f"{int(wanted.amount):,} bytes of a"}
        ahead = f" ({len(self.queue)} request(s) waiting ahead)" if self.queue else ""
        return Refused(grpc.StatusCode.RESOURCE_EXHAUSTED,
                       f"{wanted.count} x {size[wanted.size]} device: {why}{ahead} after waiting {wait_s:g} s; "
                       "wait longer (wait_s / --wait), ask for less, or release leases you hold")

    def _wait(self, wanted, client: str, wait: float, is_active) -> pool_pb2.AllocateReply:
        ticket = object()
        self.queue.append(ticket)
        deadline = time.monotonic() + wait
        try:
            while True:
                if self.closing:
                    raise Refused(grpc.StatusCode.UNAVAILABLE, "the pool is shutting down: ask again when it is back")
                if self.queue[0] is ticket:
                    chosen = self._place(wanted)
                    if chosen is not None:
                        return self._grant(client, chosen)
                left = deadline - time.monotonic()
                if left <= 0 or not is_active():
                    raise self._busy(wanted, "no capacity freed", wait)
                # Bounded, so a vanished client or a missed wake-up costs at most a second.
                self.cond.wait(min(left, 1.0))
        finally:
            self.queue.remove(ticket)
            self.cond.notify_all()

    def _grant(self, client: str, chosen: list[Allocation]) -> pool_pb2.AllocateReply:
        now = time.time()
        lease_id = secrets.token_hex(16)
        expires = now + self.ttl
        signed = []
        for a in chosen:
            grant = pool_pb2.Grant(lease_id=lease_id, host_id=a.host_id, address=self.hosts[a.host_id].address,
                                   device=a.device, memory_limit=a.memory, compute_share=a.share,
                                   expires_at=expires, nonce=secrets.token_bytes(16))
            signed.append(dataclasses.replace(a, signed=grants.sign(grant, self.key).SerializeToString()))
        lease = Lease(lease_id, client, now, expires, tuple(signed))
        self._persist(self.store.put_lease, lease)
        self.leases[lease_id] = lease
        log.info("lease %s for %r: %s", lease_id, client,
                 ", ".join(f"{a.host_id}/{a.device} ({a.memory:,} B, share {a.share:g})" for a in chosen))
        return pool_pb2.AllocateReply(lease_id=lease_id, expires_at=expires, ttl_s=self.ttl,
                                      lease_secret=lease_secret(self.lease_key, lease_id),
                                      grants=[pool_pb2.SignedGrant.FromString(g.signed) for g in signed])

    def _resign(self, signed: bytes, expires: float) -> bytes:
        grant = _grant_of(signed)
        grant.expires_at = expires
        grant.nonce = secrets.token_bytes(16)
        return grants.sign(grant, self.key).SerializeToString()

    def _host_status(self, host: Host, mono: float) -> pool_pb2.PoolHost:
        usage = self.usage.get(host.host_id, {})
        out = pool_pb2.PoolHost(host_id=host.host_id, address=host.address, backend=host.backend,
                                last_seen_s=mono - self.seen[host.host_id], transports=host.transports,
                                stale=self._stale(host.host_id))
        for d in host.devices:
            report = usage.get(d.index, pool_pb2.PoolDevice())
            out.devices.add(index=d.index, name=d.name, memory_total=d.memory_total,
                            compute_capability=d.compute_capability, memory_used=report.memory_used,
                            utilization=report.utilization, sessions=report.sessions)
        return out


class PoolService(pool_pb2_grpc.PoolServicer):
    """gRPC face of a Pool: Refused becomes the call's status."""

    def __init__(self, pool: Pool):
        self.pool = pool

    @staticmethod
    def _answer(context, call, *args):
        try:
            return call(*args)
        except Refused as exc:
            context.abort(exc.code, exc.message)

    def Register(self, request, context):
        return self._answer(context, self.pool.register, request)

    def Heartbeat(self, request, context):
        return self._answer(context, self.pool.heartbeat, request)

    def Allocate(self, request, context):
        context.add_callback(self.pool.wake)   # a cancelled waiter leaves the queue at once
        return self._answer(context, self.pool.allocate, request, context.is_active, context.time_remaining())

    def Deregister(self, request, context):
        return self._answer(context, self.pool.deregister, request)

    def Renew(self, request, context):
        return self._answer(context, self.pool.renew, request.lease_id, request.lease_secret)

    def Release(self, request, context):
        return self._answer(context, self.pool.release, request.lease_id, request.lease_secret)

    def Status(self, request, context):
        return self._answer(context, self.pool.status)


# The RPCs only daemons make; `gpuremote pool --daemon-token-file` reserves them to a token tenants lack.
DAEMON_METHODS = ("/gpuremote.v1.Pool/Register", "/gpuremote.v1.Pool/Heartbeat", "/gpuremote.v1.Pool/Deregister")


class PoolServer:
    """A running pool: `PoolServer("127.0.0.1:0", "pool.db").start()`, then `.port` / `.address`."""

    def __init__(self, listen: str = "127.0.0.1:0", state_path: str = ":memory:",
                 lease_ttl: float = DEFAULTS.pool_lease_ttl_s, policy: str = "pack", oversubscribe: bool = False,
                 security: auth.ServerSecurity | None = None):
        # security: token and/or TLS for every RPC, daemons' Register/Heartbeat/Deregister included
        # (gpuremote/transport/auth.py); None serves unauthenticated, loopback only.
        self.store = SQLiteStore(state_path)
        try:
            self.pool = Pool(self.store, lease_ttl, policy, oversubscribe)
            # Waiters each hold a thread; the extra threads keep Release, Renew and heartbeats
            # served while the queue is full.
            self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=DEFAULTS.pool_max_waiting + 16,
                                                                 thread_name_prefix="gpuremote-pool"),
                                      # No SO_REUSEPORT: a second pool on a port in use must fail to start.
                                      options=grpc_options(DEFAULTS.max_message_bytes) + [("grpc.so_reuseport", 0)],
                                      interceptors=auth.server_interceptors(security))
            pool_pb2_grpc.add_PoolServicer_to_server(PoolService(self.pool), self.server)
            self.port = auth.add_port(self.server, listen, security)
        except BaseException:
            self.store.close()
            raise
        if self.port == 0:
            self.store.close()
            raise OSError(f"cannot listen on {listen}: the address is in use or not local")
        self.address = f"{listen.rpartition(':')[0]}:{self.port}"
        self._stop = threading.Event()
        self._sweeper = threading.Thread(target=self._sweep, name="gpuremote-pool-expiry", daemon=True)

    def start(self) -> "PoolServer":
        self.server.start()
        self._sweeper.start()
        return self

    def _sweep(self) -> None:
        while not self._stop.wait(DEFAULTS.pool_sweep_s):
            try:
                self.pool.expire()
            except StoreError as exc:       # the disk may come back; the next sweep tries again
                log.error("cannot expire leases: %s", exc)

    def stop(self, grace: float | None = 2.0) -> None:
        self._stop.set()
        self.pool.close()
        self.server.stop(grace).wait()
        if self._sweeper.is_alive():
            self._sweeper.join()
        self.store.close()
