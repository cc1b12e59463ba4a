from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PoolDevice(_message.Message):
    __slots__ = ("index", "name", "memory_total", "memory_used", "utilization", "compute_capability", "sessions")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    index: int
    name: str
    memory_total: int
    memory_used: int
    utilization: float
    compute_capability: str
    sessions: _containers.RepeatedCompositeFieldContainer[PoolSession]
    def __init__(self, index: _Optional[int] = ..., name: _Optional[str] = ..., memory_total: _Optional[int] = ..., memory_used: _Optional[int] = ..., utilization: _Optional[float] = ..., compute_capability: _Optional[str] = ..., sessions: _Optional[_Iterable[_Union[PoolSession, _Mapping]]] = ...) -> None: ...

class PoolSession(_message.Message):
    __slots__ = ("session_id", "lease_id", "client_name", "memory_used", "age_s")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_NAME_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_FIELD_NUMBER: _ClassVar[int]
    AGE_S_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    lease_id: str
    client_name: str
    memory_used: int
    age_s: float
    def __init__(self, session_id: _Optional[str] = ..., lease_id: _Optional[str] = ..., client_name: _Optional[str] = ..., memory_used: _Optional[int] = ..., age_s: _Optional[float] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("host_id", "address", "backend", "devices", "transports")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    TRANSPORTS_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    address: str
    backend: str
    devices: _containers.RepeatedCompositeFieldContainer[PoolDevice]
    transports: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, host_id: _Optional[str] = ..., address: _Optional[str] = ..., backend: _Optional[str] = ..., devices: _Optional[_Iterable[_Union[PoolDevice, _Mapping]]] = ..., transports: _Optional[_Iterable[str]] = ...) -> None: ...

class RegisterReply(_message.Message):
    __slots__ = ("grant_key", "heartbeat_s")
    GRANT_KEY_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_S_FIELD_NUMBER: _ClassVar[int]
    grant_key: bytes
    heartbeat_s: float
    def __init__(self, grant_key: _Optional[bytes] = ..., heartbeat_s: _Optional[float] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("host_id", "devices")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    devices: _containers.RepeatedCompositeFieldContainer[PoolDevice]
    def __init__(self, host_id: _Optional[str] = ..., devices: _Optional[_Iterable[_Union[PoolDevice, _Mapping]]] = ...) -> None: ...

class HeartbeatReply(_message.Message):
    __slots__ = ("known", "active_leases")
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_LEASES_FIELD_NUMBER: _ClassVar[int]
    known: bool
    active_leases: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, known: _Optional[bool] = ..., active_leases: _Optional[_Iterable[str]] = ...) -> None: ...

class AllocateRequest(_message.Message):
    __slots__ = ("count", "whole", "fraction", "memory", "filters", "wait_s", "client_name")
    COUNT_FIELD_NUMBER: _ClassVar[int]
    WHOLE_FIELD_NUMBER: _ClassVar[int]
    FRACTION_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    FILTERS_FIELD_NUMBER: _ClassVar[int]
    WAIT_S_FIELD_NUMBER: _ClassVar[int]
    CLIENT_NAME_FIELD_NUMBER: _ClassVar[int]
    count: int
    whole: bool
    fraction: float
    memory: int
    filters: _containers.RepeatedScalarFieldContainer[str]
    wait_s: float
    client_name: str
    def __init__(self, count: _Optional[int] = ..., whole: _Optional[bool] = ..., fraction: _Optional[float] = ..., memory: _Optional[int] = ..., filters: _Optional[_Iterable[str]] = ..., wait_s: _Optional[float] = ..., client_name: _Optional[str] = ...) -> None: ...

class Grant(_message.Message):
    __slots__ = ("lease_id", "host_id", "address", "device", "memory_limit", "compute_share", "expires_at", "nonce")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    MEMORY_LIMIT_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_SHARE_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    host_id: str
    address: str
    device: int
    memory_limit: int
    compute_share: float
    expires_at: float
    nonce: bytes
    def __init__(self, lease_id: _Optional[str] = ..., host_id: _Optional[str] = ..., address: _Optional[str] = ..., device: _Optional[int] = ..., memory_limit: _Optional[int] = ..., compute_share: _Optional[float] = ..., expires_at: _Optional[float] = ..., nonce: _Optional[bytes] = ...) -> None: ...

class SignedGrant(_message.Message):
    __slots__ = ("grant", "signature")
    GRANT_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    grant: bytes
    signature: bytes
    def __init__(self, grant: _Optional[bytes] = ..., signature: _Optional[bytes] = ...) -> None: ...

class AllocateReply(_message.Message):
    __slots__ = ("lease_id", "expires_at", "grants", "ttl_s", "lease_secret")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    GRANTS_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECRET_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    expires_at: float
    grants: _containers.RepeatedCompositeFieldContainer[SignedGrant]
    ttl_s: float
    lease_secret: bytes
    def __init__(self, lease_id: _Optional[str] = ..., expires_at: _Optional[float] = ..., grants: _Optional[_Iterable[_Union[SignedGrant, _Mapping]]] = ..., ttl_s: _Optional[float] = ..., lease_secret: _Optional[bytes] = ...) -> None: ...

class RenewRequest(_message.Message):
    __slots__ = ("lease_id", "lease_secret")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECRET_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    lease_secret: bytes
    def __init__(self, lease_id: _Optional[str] = ..., lease_secret: _Optional[bytes] = ...) -> None: ...

class RenewReply(_message.Message):
    __slots__ = ("expires_at", "grants")
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    GRANTS_FIELD_NUMBER: _ClassVar[int]
    expires_at: float
    grants: _containers.RepeatedCompositeFieldContainer[SignedGrant]
    def __init__(self, expires_at: _Optional[float] = ..., grants: _Optional[_Iterable[_Union[SignedGrant, _Mapping]]] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("lease_id", "lease_secret")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECRET_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    lease_secret: bytes
    def __init__(self, lease_id: _Optional[str] = ..., lease_secret: _Optional[bytes] = ...) -> None: ...

class ReleaseReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DeregisterRequest(_message.Message):
    __slots__ = ("host_id",)
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    def __init__(self, host_id: _Optional[str] = ...) -> None: ...

class DeregisterReply(_message.Message):
    __slots__ = ("known",)
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    known: bool
    def __init__(self, known: _Optional[bool] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PoolHost(_message.Message):
    __slots__ = ("host_id", "address", "backend", "last_seen_s", "devices", "transports", "stale")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_S_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    TRANSPORTS_FIELD_NUMBER: _ClassVar[int]
    STALE_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    address: str
    backend: str
    last_seen_s: float
    devices: _containers.RepeatedCompositeFieldContainer[PoolDevice]
    transports: _containers.RepeatedScalarFieldContainer[str]
    stale: bool
    def __init__(self, host_id: _Optional[str] = ..., address: _Optional[str] = ..., backend: _Optional[str] = ..., last_seen_s: _Optional[float] = ..., devices: _Optional[_Iterable[_Union[PoolDevice, _Mapping]]] = ..., transports: _Optional[_Iterable[str]] = ..., stale: _Optional[bool] = ...) -> None: ...

class PoolLease(_message.Message):
    __slots__ = ("lease_id", "client_name", "expires_in_s", "age_s", "grants")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_NAME_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_IN_S_FIELD_NUMBER: _ClassVar[int]
    AGE_S_FIELD_NUMBER: _ClassVar[int]
    GRANTS_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    client_name: str
    expires_in_s: float
    age_s: float
    grants: _containers.RepeatedCompositeFieldContainer[Grant]
    def __init__(self, lease_id: _Optional[str] = ..., client_name: _Optional[str] = ..., expires_in_s: _Optional[float] = ..., age_s: _Optional[float] = ..., grants: _Optional[_Iterable[_Union[Grant, _Mapping]]] = ...) -> None: ...

class StatusReply(_message.Message):
    __slots__ = ("hosts", "leases", "waiting")
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    LEASES_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    hosts: _containers.RepeatedCompositeFieldContainer[PoolHost]
    leases: _containers.RepeatedCompositeFieldContainer[PoolLease]
    waiting: int
    def __init__(self, hosts: _Optional[_Iterable[_Union[PoolHost, _Mapping]]] = ..., leases: _Optional[_Iterable[_Union[PoolLease, _Mapping]]] = ..., waiting: _Optional[int] = ...) -> None: ...
