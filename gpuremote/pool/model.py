"""The pool's records: hosts and their devices, allocations, leases.

Plain frozen dataclasses shared by placement (which reads them), the store (which persists
them) and the server (which builds them from and into protobuf messages). Times are Unix
seconds (time.time()), because they outlive the process in the state file.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Device:
    index: int
    name: str
    memory_total: int
    compute_capability: str = ""


@dataclasses.dataclass(frozen=True)
class Host:
    host_id: str
    address: str
    backend: str
    transports: tuple[str, ...]
    devices: tuple[Device, ...]

    def device(self, index: int) -> Device | None:
        return next((d for d in self.devices if d.index == index), None)


@dataclasses.dataclass(frozen=True)
class Allocation:
    """A share of one device. `exclusive` marks a whole device: nothing else may share it."""
    host_id: str
    device: int
    memory: int
    share: float
    exclusive: bool
    # The serialized SignedGrant handed out for it (empty until signed).
    signed: bytes = b""


@dataclasses.dataclass(frozen=True)
class Lease:
    lease_id: str
    client_name: str
    created_at: float
    expires_at: float
    grants: tuple[Allocation, ...]

    def on_host(self, host_id: str) -> bool:
        return any(g.host_id == host_id for g in self.grants)
