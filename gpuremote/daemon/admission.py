"""Which sessions a daemon admits, and what each may use: pool grants, lease memory, compute flows.

A standalone daemon (no --pool) admits every session to all its devices, whole: memory up to
each device's capacity and a compute flow of its own with share 1. It refuses grants, which it
has no key to check. A daemon in pool mode (gpuremote/daemon/pool_agent.py sets it up) admits
only a session that presents valid grants, and only to the devices they name:

- each grant is verified with the pool's key (signature, expiry: gpuremote/wire/grants.py), must
  name this daemon (host id and advertised address) and one of its devices, once;
- all grants of one session belong to one lease, and that lease has not been seen ending
  (released or expired leases are remembered, so their unexpired grants are refused);
- the session may allocate on a granted device up to the grant's memory_limit, and its ops run
  in the device scheduler's flow for the lease with the grant's compute_share.

Replayed grants: a grant may be presented by several sessions of its lease — a program and its
multiprocessing children each open a session with the same grants, and that is allowed. The
memory limit and compute share belong to the lease on the device, not to a session: every
session of the lease charges one LeaseMemory and runs in one scheduler flow, so N sessions
together hold at most memory_limit bytes and get compute_share of the device, not N times that.

Beware: the grant key is a shared secret (see gpuremote/wire/grants.py). A grant's expiry gates
only the opening of sessions; an open session lasts until the pool reports its lease gone
(PoolAgent closes it then) or its stream ends.
"""

from __future__ import annotations

import collections
import threading
from typing import Any

import grpc

from gpuremote._config import DEFAULTS
from gpuremote.daemon.ledger import MemoryLedger
from gpuremote.errors import GrantError
from gpuremote.v1 import pool_pb2
from gpuremote.wire import grants as grant_codec


class Refusal(Exception):
    """A session the daemon will not open: the stream is aborted with `code` and `message`."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


class LeaseMemory(MemoryLedger):
    """One lease's bytes on one device, shared by all its sessions: a ledger whose parent is the
    device's, so a charge takes from both or neither, and a refusal names whichever ran out
    (gpuremote/daemon/ledger.py). A session uses it as it uses a DeviceMemory.
    """

    def __init__(self, device_memory, limit: int, lease_id: str):
        super().__init__(limit, device_memory)      # parent: the device's DeviceMemory
        self.lease_id = lease_id
        self.limit = f"limit of lease {lease_id} on this device"
        self.refs = 0


class NotGranted:
    """Stands in for the ledger of a device the session has no grant for: every use is refused."""

    capacity = 0
    used = 0

    def __init__(self, index: int, granted: list[int]):
        self.index = index
        self.granted = granted

    def error(self) -> GrantError:
        return GrantError(f"device {self.index} is not granted to this session: its grants cover device(s) "
                          f"{self.granted} of this daemon. Use the devices your lease gave you (cupy.cuda.Device(i) "
                          "counts them from 0), or allocate a lease that includes this device")

    def charge(self, nbytes: int) -> None:
        raise self.error()

    check = charge

    def credit(self, nbytes: int) -> None:
        pass


class Tenancy:
    """What one session may use: per device index, a memory ledger and a scheduler flow (None
    for a device it has no grant for), plus its lease (empty on a standalone daemon)."""

    def __init__(self, lease_id: str, memory: list, flows: list, grants: dict[int, pool_pb2.Grant],
                 release=None):
        self.lease_id = lease_id
        self.memory = memory
        self.flows = flows
        self.grants = grants
        self.devices = [i for i, f in enumerate(flows) if f is not None]
        self._release = release
        self._closed = False

    @classmethod
    def whole(cls, backend, key: str) -> "Tenancy":
        """Every device, whole: the standalone daemon's sessions."""
        return cls("", list(backend.memory), [s.flow(key, 1.0) for s in backend.schedulers], {})

    def not_granted(self, device: int) -> GrantError:
        return NotGranted(device, self.devices).error()

    def close(self) -> None:
        """Give back the flows and lease ledgers (the session has credited its memory already)."""
        if self._closed:
            return
        self._closed = True
        for f in self.flows:
            if f is not None:
                f.release()
        if self._release is not None:
            self._release()


class Admission:
    """The daemon's door: `admit(opened)` gives a session's Tenancy or raises Refusal."""

    def __init__(self, backend, pool: str | None = None):
        self.backend = backend
        self.pool = pool                   # the pool's address in pool mode, else None
        self.key: bytes | None = None      # set when the daemon has registered
        self.host_id = ""
        self.address = ""
        self._lock = threading.Lock()
        self._leases: dict[tuple[str, int], LeaseMemory] = {}
        self._revoked: collections.OrderedDict[str, None] = collections.OrderedDict()

    # -- set by the pool agent ---------------------------------------------------------------
    def configure(self, key: bytes, host_id: str, address: str) -> None:
        with self._lock:
            self.key, self.host_id, self.address = key, host_id, address

    def revoke(self, lease_id: str) -> None:
        """Remember that `lease_id` ended: its grants open no more sessions."""
        with self._lock:
            self._revoked[lease_id] = None
            while len(self._revoked) > DEFAULTS.pool_revoked_leases:
                self._revoked.popitem(last=False)

    def lease_memory(self) -> dict[tuple[str, int], int]:
        """{(lease id, device): bytes held} for every lease with a session here."""
        with self._lock:
            return {k: m.used for k, m in self._leases.items()}

    # -- admission -----------------------------------------------------------------------------
    def admit(self, opened) -> Tenancy | None:
        """The session's Tenancy under its grants, None for whole devices (standalone), or Refusal."""
        signed = list(opened.grants)
        if self.pool is None:
            if signed:
                raise Refusal(grpc.StatusCode.FAILED_PRECONDITION,
                              f"the session presents {len(signed)} pool grant(s), but this daemon is not part of a "
                              "pool and cannot check them: connect without grants (GPUREMOTE_DAEMON=HOST:PORT or "
                              "gpuremote run --daemon), or start the daemon with --pool ADDR")
            return None
        if not signed:
            raise Refusal(grpc.StatusCode.FAILED_PRECONDITION,
                          f"this daemon serves the gpuremote pool at {self.pool}: a session needs grants from it. "
                          f"Run the program with `gpuremote run --pool {self.pool} -- COMMAND` (or set "
                          "GPUREMOTE_POOL), which allocates a lease and passes its grants on")
        with self._lock:
            key, host_id, address = self.key, self.host_id, self.address
        if key is None:
            raise Refusal(grpc.StatusCode.UNAVAILABLE,
                          f"this daemon has not registered with its pool at {self.pool} yet (is the pool up?), so "
                          "it cannot check grants: try again in a few seconds")
        count = len(self.backend.props)
        verified: dict[int, pool_pb2.Grant] = {}
        for n, s in enumerate(signed):
            try:
                g = grant_codec.verify(s, key)
            except GrantError as exc:
                raise Refusal(grpc.StatusCode.PERMISSION_DENIED, f"grant {n} refused: {exc}") from None
            if g.host_id != host_id or g.address != address:
                raise Refusal(grpc.StatusCode.PERMISSION_DENIED,
                              f"grant {n} (lease {g.lease_id}) is for host {g.host_id!r} at {g.address}, not this "
                              f"daemon (host {host_id!r} at {address}): present it to the daemon at {g.address}")
            if g.device >= count:
                raise Refusal(grpc.StatusCode.PERMISSION_DENIED,
                              f"grant {n} (lease {g.lease_id}) is for device {g.device}, which this daemon does not "
                              f"have (it has {count}): the daemon changed since the lease was granted; allocate again")
            if g.device in verified:
                raise Refusal(grpc.StatusCode.INVALID_ARGUMENT,
                              f"two grants for device {g.device}: present each device's grant once")
            if verified and g.lease_id != next(iter(verified.values())).lease_id:
                raise Refusal(grpc.StatusCode.INVALID_ARGUMENT,
                              "the grants belong to different leases: a session uses the grants of one lease "
                              "(open one session per lease)")
            verified[g.device] = g
        lease_id = next(iter(verified.values())).lease_id
        return self._tenancy(lease_id, verified, count)

    def _tenancy(self, lease_id: str, verified: dict[int, pool_pb2.Grant], count: int) -> Tenancy:
        granted = sorted(verified)
        memory: list[Any] = [NotGranted(i, granted) for i in range(count)]
        with self._lock:
            if lease_id in self._revoked:
                raise Refusal(grpc.StatusCode.PERMISSION_DENIED,
                              f"lease {lease_id} was released or has expired: its grants open no new sessions; "
                              "allocate a new lease (gpuremote run --pool ...)")
            for i, g in verified.items():
                ledger = self._leases.get((lease_id, i))
                if ledger is None:
                    ledger = self._leases[(lease_id, i)] = LeaseMemory(self.backend.memory[i], g.memory_limit,
                                                                       lease_id)
                ledger.refs += 1
                memory[i] = ledger
        flows: list[Any] = [None] * count
        for i, g in verified.items():
            flows[i] = self.backend.schedulers[i].flow(lease_id, g.compute_share)

        def release() -> None:
            with self._lock:
                for i in verified:
                    ledger = self._leases.get((lease_id, i))
                    if ledger is not None:
                        ledger.refs -= 1
                        if ledger.refs <= 0:
                            del self._leases[(lease_id, i)]
        return Tenancy(lease_id, memory, flows, verified, release)
