from gpuremote.v1 import pool_pb2 as _pool_pb2
from gpuremote.v1 import value_pb2 as _value_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ClientMessage(_message.Message):
    __slots__ = ("open", "batch", "chunk")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    open: OpenSession
    batch: OpBatch
    chunk: Chunk
    def __init__(self, open: _Optional[_Union[OpenSession, _Mapping]] = ..., batch: _Optional[_Union[OpBatch, _Mapping]] = ..., chunk: _Optional[_Union[Chunk, _Mapping]] = ...) -> None: ...

class ServerMessage(_message.Message):
    __slots__ = ("opened", "reply", "chunk")
    OPENED_FIELD_NUMBER: _ClassVar[int]
    REPLY_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    opened: SessionOpened
    reply: Reply
    chunk: Chunk
    def __init__(self, opened: _Optional[_Union[SessionOpened, _Mapping]] = ..., reply: _Optional[_Union[Reply, _Mapping]] = ..., chunk: _Optional[_Union[Chunk, _Mapping]] = ...) -> None: ...

class OpenSession(_message.Message):
    __slots__ = ("protocol_version", "client_name", "client_pid", "client_host", "grants", "client_host_id")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    CLIENT_NAME_FIELD_NUMBER: _ClassVar[int]
    CLIENT_PID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_HOST_FIELD_NUMBER: _ClassVar[int]
    GRANTS_FIELD_NUMBER: _ClassVar[int]
    CLIENT_HOST_ID_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    client_name: str
    client_pid: int
    client_host: str
    grants: _containers.RepeatedCompositeFieldContainer[_pool_pb2.SignedGrant]
    client_host_id: str
    def __init__(self, protocol_version: _Optional[int] = ..., client_name: _Optional[str] = ..., client_pid: _Optional[int] = ..., client_host: _Optional[str] = ..., grants: _Optional[_Iterable[_Union[_pool_pb2.SignedGrant, _Mapping]]] = ..., client_host_id: _Optional[str] = ...) -> None: ...

class SessionOpened(_message.Message):
    __slots__ = ("protocol_version", "session_id", "backend", "devices", "limits", "data_plane")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    DATA_PLANE_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    session_id: str
    backend: str
    devices: _containers.RepeatedCompositeFieldContainer[DeviceInfo]
    limits: Limits
    data_plane: DataPlane
    def __init__(self, protocol_version: _Optional[int] = ..., session_id: _Optional[str] = ..., backend: _Optional[str] = ..., devices: _Optional[_Iterable[_Union[DeviceInfo, _Mapping]]] = ..., limits: _Optional[_Union[Limits, _Mapping]] = ..., data_plane: _Optional[_Union[DataPlane, _Mapping]] = ...) -> None: ...

class DataPlane(_message.Message):
    __slots__ = ("tcp_port", "unix_path", "attach_token", "transports", "host_id")
    TCP_PORT_FIELD_NUMBER: _ClassVar[int]
    UNIX_PATH_FIELD_NUMBER: _ClassVar[int]
    ATTACH_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TRANSPORTS_FIELD_NUMBER: _ClassVar[int]
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    tcp_port: int
    unix_path: str
    attach_token: bytes
    transports: _containers.RepeatedScalarFieldContainer[str]
    host_id: str
    def __init__(self, tcp_port: _Optional[int] = ..., unix_path: _Optional[str] = ..., attach_token: _Optional[bytes] = ..., transports: _Optional[_Iterable[str]] = ..., host_id: _Optional[str] = ...) -> None: ...

class Attach(_message.Message):
    __slots__ = ("session_id", "attach_token", "transport", "ring_slots", "ring_slot_bytes", "verbs")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    ATTACH_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    RING_SLOTS_FIELD_NUMBER: _ClassVar[int]
    RING_SLOT_BYTES_FIELD_NUMBER: _ClassVar[int]
    VERBS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    attach_token: bytes
    transport: str
    ring_slots: int
    ring_slot_bytes: int
    verbs: VerbsEndpoint
    def __init__(self, session_id: _Optional[str] = ..., attach_token: _Optional[bytes] = ..., transport: _Optional[str] = ..., ring_slots: _Optional[int] = ..., ring_slot_bytes: _Optional[int] = ..., verbs: _Optional[_Union[VerbsEndpoint, _Mapping]] = ...) -> None: ...

class Attached(_message.Message):
    __slots__ = ("error", "transport", "inline_bytes", "verbs")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    INLINE_BYTES_FIELD_NUMBER: _ClassVar[int]
    VERBS_FIELD_NUMBER: _ClassVar[int]
    error: str
    transport: str
    inline_bytes: int
    verbs: VerbsEndpoint
    def __init__(self, error: _Optional[str] = ..., transport: _Optional[str] = ..., inline_bytes: _Optional[int] = ..., verbs: _Optional[_Union[VerbsEndpoint, _Mapping]] = ...) -> None: ...

class VerbsEndpoint(_message.Message):
    __slots__ = ("qp_num", "lid", "gid", "psn", "mtu", "ring_addr", "ring_rkey", "ring_bytes")
    QP_NUM_FIELD_NUMBER: _ClassVar[int]
    LID_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    PSN_FIELD_NUMBER: _ClassVar[int]
    MTU_FIELD_NUMBER: _ClassVar[int]
    RING_ADDR_FIELD_NUMBER: _ClassVar[int]
    RING_RKEY_FIELD_NUMBER: _ClassVar[int]
    RING_BYTES_FIELD_NUMBER: _ClassVar[int]
    qp_num: int
    lid: int
    gid: bytes
    psn: int
    mtu: int
    ring_addr: int
    ring_rkey: int
    ring_bytes: int
    def __init__(self, qp_num: _Optional[int] = ..., lid: _Optional[int] = ..., gid: _Optional[bytes] = ..., psn: _Optional[int] = ..., mtu: _Optional[int] = ..., ring_addr: _Optional[int] = ..., ring_rkey: _Optional[int] = ..., ring_bytes: _Optional[int] = ...) -> None: ...

class Limits(_message.Message):
    __slots__ = ("max_message_bytes", "max_ops_per_batch", "max_handles", "chunk_bytes", "max_rank", "max_templates")
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_OPS_PER_BATCH_FIELD_NUMBER: _ClassVar[int]
    MAX_HANDLES_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_RANK_FIELD_NUMBER: _ClassVar[int]
    MAX_TEMPLATES_FIELD_NUMBER: _ClassVar[int]
    max_message_bytes: int
    max_ops_per_batch: int
    max_handles: int
    chunk_bytes: int
    max_rank: int
    max_templates: int
    def __init__(self, max_message_bytes: _Optional[int] = ..., max_ops_per_batch: _Optional[int] = ..., max_handles: _Optional[int] = ..., chunk_bytes: _Optional[int] = ..., max_rank: _Optional[int] = ..., max_templates: _Optional[int] = ...) -> None: ...

class OpBatch(_message.Message):
    __slots__ = ("ops",)
    OPS_FIELD_NUMBER: _ClassVar[int]
    ops: _containers.RepeatedCompositeFieldContainer[Op]
    def __init__(self, ops: _Optional[_Iterable[_Union[Op, _Mapping]]] = ...) -> None: ...

class Op(_message.Message):
    __slots__ = ("seq", "device", "stream", "reply", "site", "call", "release", "upload", "fetch", "describe", "sync", "replay")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    REPLY_FIELD_NUMBER: _ClassVar[int]
    SITE_FIELD_NUMBER: _ClassVar[int]
    CALL_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    UPLOAD_FIELD_NUMBER: _ClassVar[int]
    FETCH_FIELD_NUMBER: _ClassVar[int]
    DESCRIBE_FIELD_NUMBER: _ClassVar[int]
    SYNC_FIELD_NUMBER: _ClassVar[int]
    REPLAY_FIELD_NUMBER: _ClassVar[int]
    seq: int
    device: int
    stream: int
    reply: bool
    site: str
    call: Call
    release: Release
    upload: Upload
    fetch: Fetch
    describe: Describe
    sync: Sync
    replay: Replay
    def __init__(self, seq: _Optional[int] = ..., device: _Optional[int] = ..., stream: _Optional[int] = ..., reply: _Optional[bool] = ..., site: _Optional[str] = ..., call: _Optional[_Union[Call, _Mapping]] = ..., release: _Optional[_Union[Release, _Mapping]] = ..., upload: _Optional[_Union[Upload, _Mapping]] = ..., fetch: _Optional[_Union[Fetch, _Mapping]] = ..., describe: _Optional[_Union[Describe, _Mapping]] = ..., sync: _Optional[_Union[Sync, _Mapping]] = ..., replay: _Optional[_Union[Replay, _Mapping]] = ...) -> None: ...

class Call(_message.Message):
    __slots__ = ("name", "args", "kwarg_names", "kwarg_values", "results", "define_template")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    KWARG_NAMES_FIELD_NUMBER: _ClassVar[int]
    KWARG_VALUES_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    DEFINE_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    name: str
    args: _containers.RepeatedCompositeFieldContainer[_value_pb2.Value]
    kwarg_names: _containers.RepeatedScalarFieldContainer[str]
    kwarg_values: _containers.RepeatedCompositeFieldContainer[_value_pb2.Value]
    results: _containers.RepeatedScalarFieldContainer[int]
    define_template: int
    def __init__(self, name: _Optional[str] = ..., args: _Optional[_Iterable[_Union[_value_pb2.Value, _Mapping]]] = ..., kwarg_names: _Optional[_Iterable[str]] = ..., kwarg_values: _Optional[_Iterable[_Union[_value_pb2.Value, _Mapping]]] = ..., results: _Optional[_Iterable[int]] = ..., define_template: _Optional[int] = ...) -> None: ...

class Replay(_message.Message):
    __slots__ = ("calls",)
    CALLS_FIELD_NUMBER: _ClassVar[int]
    calls: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, calls: _Optional[_Iterable[int]] = ...) -> None: ...

class Release(_message.Message):
    __slots__ = ("handles",)
    HANDLES_FIELD_NUMBER: _ClassVar[int]
    handles: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, handles: _Optional[_Iterable[int]] = ...) -> None: ...

class Upload(_message.Message):
    __slots__ = ("handle", "meta", "data", "chunks")
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    META_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    handle: int
    meta: _value_pb2.ArrayMeta
    data: bytes
    chunks: int
    def __init__(self, handle: _Optional[int] = ..., meta: _Optional[_Union[_value_pb2.ArrayMeta, _Mapping]] = ..., data: _Optional[bytes] = ..., chunks: _Optional[int] = ...) -> None: ...

class Fetch(_message.Message):
    __slots__ = ("handle", "land_segment", "land_offset")
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    LAND_SEGMENT_FIELD_NUMBER: _ClassVar[int]
    LAND_OFFSET_FIELD_NUMBER: _ClassVar[int]
    handle: int
    land_segment: int
    land_offset: int
    def __init__(self, handle: _Optional[int] = ..., land_segment: _Optional[int] = ..., land_offset: _Optional[int] = ...) -> None: ...

class Describe(_message.Message):
    __slots__ = ("handle",)
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    handle: int
    def __init__(self, handle: _Optional[int] = ...) -> None: ...

class Sync(_message.Message):
    __slots__ = ("all_streams",)
    ALL_STREAMS_FIELD_NUMBER: _ClassVar[int]
    all_streams: bool
    def __init__(self, all_streams: _Optional[bool] = ...) -> None: ...

class Chunk(_message.Message):
    __slots__ = ("seq", "offset", "data")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    seq: int
    offset: int
    data: bytes
    def __init__(self, seq: _Optional[int] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class Reply(_message.Message):
    __slots__ = ("seq", "value", "meta", "chunked", "error", "deferred_errors", "dropped_errors", "notice")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    META_FIELD_NUMBER: _ClassVar[int]
    CHUNKED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    DEFERRED_ERRORS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_ERRORS_FIELD_NUMBER: _ClassVar[int]
    NOTICE_FIELD_NUMBER: _ClassVar[int]
    seq: int
    value: _value_pb2.Value
    meta: _value_pb2.ArrayMeta
    chunked: ChunkedArray
    error: Error
    deferred_errors: _containers.RepeatedCompositeFieldContainer[Error]
    dropped_errors: int
    notice: str
    def __init__(self, seq: _Optional[int] = ..., value: _Optional[_Union[_value_pb2.Value, _Mapping]] = ..., meta: _Optional[_Union[_value_pb2.ArrayMeta, _Mapping]] = ..., chunked: _Optional[_Union[ChunkedArray, _Mapping]] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., deferred_errors: _Optional[_Iterable[_Union[Error, _Mapping]]] = ..., dropped_errors: _Optional[int] = ..., notice: _Optional[str] = ...) -> None: ...

class ChunkedArray(_message.Message):
    __slots__ = ("meta", "chunks")
    META_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    meta: _value_pb2.ArrayMeta
    chunks: int
    def __init__(self, meta: _Optional[_Union[_value_pb2.ArrayMeta, _Mapping]] = ..., chunks: _Optional[int] = ...) -> None: ...

class Error(_message.Message):
    __slots__ = ("type", "message", "seq", "op", "site", "traceback")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    SITE_FIELD_NUMBER: _ClassVar[int]
    TRACEBACK_FIELD_NUMBER: _ClassVar[int]
    type: str
    message: str
    seq: int
    op: str
    site: str
    traceback: str
    def __init__(self, type: _Optional[str] = ..., message: _Optional[str] = ..., seq: _Optional[int] = ..., op: _Optional[str] = ..., site: _Optional[str] = ..., traceback: _Optional[str] = ...) -> None: ...

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InfoReply(_message.Message):
    __slots__ = ("version", "protocol_version", "backend", "devices", "sessions", "draining", "drain_remaining_s")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    DRAIN_REMAINING_S_FIELD_NUMBER: _ClassVar[int]
    version: str
    protocol_version: int
    backend: str
    devices: _containers.RepeatedCompositeFieldContainer[DeviceInfo]
    sessions: _containers.RepeatedCompositeFieldContainer[SessionInfo]
    draining: bool
    drain_remaining_s: float
    def __init__(self, version: _Optional[str] = ..., protocol_version: _Optional[int] = ..., backend: _Optional[str] = ..., devices: _Optional[_Iterable[_Union[DeviceInfo, _Mapping]]] = ..., sessions: _Optional[_Iterable[_Union[SessionInfo, _Mapping]]] = ..., draining: _Optional[bool] = ..., drain_remaining_s: _Optional[float] = ...) -> None: ...

class DeviceInfo(_message.Message):
    __slots__ = ("index", "name", "memory_total", "memory_used", "compute_capability", "multiprocessor_count", "utilization")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    MULTIPROCESSOR_COUNT_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    index: int
    name: str
    memory_total: int
    memory_used: int
    compute_capability: str
    multiprocessor_count: int
    utilization: float
    def __init__(self, index: _Optional[int] = ..., name: _Optional[str] = ..., memory_total: _Optional[int] = ..., memory_used: _Optional[int] = ..., compute_capability: _Optional[str] = ..., multiprocessor_count: _Optional[int] = ..., utilization: _Optional[float] = ...) -> None: ...

class SessionInfo(_message.Message):
    __slots__ = ("session_id", "client_name", "client_pid", "client_host", "memory_used", "handles", "ops", "age_s", "transport", "lease_id", "devices")
    class MemoryUsedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_NAME_FIELD_NUMBER: _ClassVar[int]
    CLIENT_PID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_HOST_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_FIELD_NUMBER: _ClassVar[int]
    HANDLES_FIELD_NUMBER: _ClassVar[int]
    OPS_FIELD_NUMBER: _ClassVar[int]
    AGE_S_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    client_name: str
    client_pid: int
    client_host: str
    memory_used: _containers.ScalarMap[int, int]
    handles: int
    ops: int
    age_s: float
    transport: str
    lease_id: str
    devices: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, session_id: _Optional[str] = ..., client_name: _Optional[str] = ..., client_pid: _Optional[int] = ..., client_host: _Optional[str] = ..., memory_used: _Optional[_Mapping[int, int]] = ..., handles: _Optional[int] = ..., ops: _Optional[int] = ..., age_s: _Optional[float] = ..., transport: _Optional[str] = ..., lease_id: _Optional[str] = ..., devices: _Optional[_Iterable[int]] = ...) -> None: ...
