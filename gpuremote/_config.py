"""Every tunable of gpuremote in one place, each overridable by an environment variable.

A value is read once, at import. `GPUREMOTE_<NAME>` overrides `<name>` (sizes accept
suffixes such as 64KiB, 16MiB, 8GiB). The comment beside each default says why it is that number.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re

PROTOCOL_VERSION = 1

_UNITS = {"": 1, "B": 1, "K": 10**3, "KB": 10**3, "KIB": 2**10, "M": 10**6, "MB": 10**6,
          "MIB": 2**20, "G": 10**9, "GB": 10**9, "GIB": 2**30, "T": 10**12, "TB": 10**12, "TIB": 2**40}


def parse_size(text: str | int) -> int:
    """Parse '8GiB', '512MiB', '4096', '1.5GB' into bytes; ValueError with a clear message otherwise."""
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"size must not be negative, got {text}")
        return text
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", str(text))
    if not m or m.group(2).upper() not in _UNITS:
        raise ValueError(f"invalid size {text!r}: use a number of bytes with an optional unit such as 64KiB, 16MiB or 8GiB")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


@dataclasses.dataclass(frozen=True)
class Defaults:
    # gRPC's own default is 4 MiB; 16 MiB leaves room for a 1 MiB chunk or a full op batch
    # while keeping a hostile client from making the daemon buffer huge messages.
    max_message_bytes: int = 16 * 2**20
    # Bulk bytes move in chunks of this size: 1-4 MiB chunks measured fastest over gRPC here.
    chunk_bytes: int = 1 * 2**20
    # Upload chunks queued for the gRPC stream at once: gRPC sends one at a time anyway, and a short
    # queue keeps the chunk buffers in reused memory instead of copying a whole array up front.
    grpc_chunks_in_flight: int = 4
    # Arrays up to this size ride inside the op batch instead of a chunked transfer.
    inline_bytes: int = 256 * 2**10
    # Largest batch the daemon accepts; the client flushes well before (batch_flush_ops).
    max_ops_per_batch: int = 4096
    # The client sends its queued ops once this many are waiting (amortises per-message cost,
    # keeps the daemon busy rather than idle until the next sync point).
    batch_flush_ops: int = 64
    # Live arrays per session: far above any real program, low enough to bound the table.
    max_handles: int = 1 << 20
    # Call templates one session may hold (a loop's distinct call sites: tens to a few hundred),
    # and the largest encoded call one may be made of: together they bound what a session keeps.
    max_templates: int = 1024
    max_template_bytes: int = 2048
    # cupy.random.RandomState objects one session may draw from on one device (each holds a
    # generator on the daemon for the session's life): far above what a program makes.
    max_generators: int = 256
    # NumPy allows 64 dimensions; nothing real needs more than 32, and it bounds probe cost.
    max_rank: int = 32
    # Nesting of tuples/lists/dicts in one value; protobuf's own recursion limit is 100.
    max_value_depth: int = 32
    # Concurrent sessions one daemon serves.
    max_sessions: int = 256
    # Deferred errors kept per session between sync points; later ones are counted only.
    max_deferred_errors: int = 16
    # Memory of one emulated device when --emulate-memory is not given.
    emulate_memory: int = 8 * 2**30
    # BLAS threads of the emulated backend. One: sessions already run in parallel threads, and
    # multi-threaded BLAS beside a busy client on a small host spins and thrashes (measured
    # here: 64x64 @ 64x128 float32 went from ~5 us to ~90-480 us under load with the default).
    emulate_blas_threads: int = 1
    # gRPC keepalive: a vanished client is noticed within about ping + timeout.
    keepalive_ms: int = 10_000
    keepalive_timeout_ms: int = 5_000
    # Seconds a client waits for a daemon to answer at connect before reporting it unreachable.
    connect_timeout_s: float = 10.0
    # Largest kernel source accepted.
    max_kernel_source_bytes: int = 1 * 2**20
    # On SIGTERM the daemon opens no new sessions and lets open ones work this long before ending them.
    drain_timeout_s: float = 30.0
    # --- data plane (gpuremote/transport/, gpuremote/daemon/dataplane.py) ---
    # The client's op channel: auto takes shm when client and daemon share a host, else the framed
    # socket (Unix socket on one host, TCP otherwise), else gRPC; grpc, socket, tcp, unix, shm and
    # verbs ask for one (an unavailable one falls back, with a warning, to what auto would take).
    transport: str = "auto"
    # Whether the daemon opens its framed-socket listener (TCP on the gRPC host, plus a Unix socket):
    # 0 where only the gRPC port may be reached or TLS must cover every byte.
    dataplane: int = 1
    # Arrays up to this size ride inside the op message on a socket channel; above it a raw frame
    # beats copying the bytes through protobuf on both ends (measured: equal at about 8-16 KiB).
    socket_inline_bytes: int = 16 * 2**10
    # Frame reader buffer: one recv takes a whole reply or op batch (most are < 4 KiB).
    socket_read_bytes: int = 256 * 2**10
    # A data-plane reader polls an empty socket up to this long before it blocks (0: block at
    # once; the poll adapts to the waits it sees, transport/frames.py): waking a thread whose vCPU
    # went idle costs ~100 us on a small VM, and the sender pays for much of it too. Measured
    # here: a sync op's round trip 184-254 us -> 57-73 us.
    spin_us: int = 150
    # Whether the compiled fast paths run where they were built (native/: the client's path for a
    # call it already replays, the daemon's replay loop); 0 runs all of it in Python (same results,
    # slower: benchmarks/RESULTS.md, seventh session).
    native: int = 1
    # Idle page-aligned transfer buffers each process keeps for reuse: touching fresh memory runs at
    # ~1.1 GB/s against ~18 GB/s for reused memory; 512 MiB holds two 256 MiB transfers in flight.
    buffer_pool_bytes: int = 512 * 2**20
    # The daemon's pool of upload buffers (on the emulated backend they become the device arrays, and
    # are kept once freed as CuPy's memory pool keeps blocks): a loop of 256 MiB uploads holds three at
    # once (the array in use, the one arriving, the one whose release follows it), plus headroom.
    daemon_pool_bytes: int = 2 * 2**30
    # Whether the daemon offers shared memory to clients on its host: 0 where /dev/shm-backed
    # memory is scarce or a sandbox refuses memfds (clients then use the Unix socket).
    shm: int = 1
    # Shared-memory (and verbs) ring per direction: slots x slot size. A 4 MiB ring stays in the
    # caches both ends' copies go through: 256 MiB pageable transfers over 4 x 1 MiB measured a median
    # 0.64x memcpy against 0.48x over 4 x 4 MiB, eight alternated runs (benchmarks/RESULTS.md, run G).
    ring_slots: int = 4
    ring_slot_bytes: int = 1 * 2**20
    # verbs: GID table index of port 1 (0: the port's default GID; RoCE v2 over IPv4 is often 1 or 3).
    verbs_gid_index: int = 0
    # Shared segments (pinned host buffers) one session may map in the daemon, and their total size:
    # bounds what a client can make the daemon map.
    shm_max_segments: int = 1024
    shm_max_segment_bytes: int = 64 * 2**30
    # Seconds a new data-plane connection has to present its attach token; also bounds the
    # client's wait for the daemon to answer it.
    attach_timeout_s: float = 5.0
    # --- pool manager (`gpuremote pool`) ---
    # Lease lifetime without renewal: a crashed client's devices come back within this long.
    # Clients renew every third of it, so 30 s survives two lost renewals in a row.
    pool_lease_ttl_s: float = 30.0
    # Heartbeat period the pool asks of its daemons: the usage `smi` shows is at most this old.
    pool_heartbeat_s: float = 5.0
    # A host silent this long (6 missed heartbeats) is shown stale and gets no new placements:
    # a daemon restart or a network blip keeps its host, a dead daemon stops receiving work.
    pool_stale_after_s: float = 30.0
    # Period of the expiry sweep: a lease's capacity is free at most this long after it expires.
    pool_sweep_s: float = 0.25
    # Allocate requests waiting in the queue at once; each holds one server thread while it waits.
    pool_max_waiting: int = 256
    # Longest wait_s honoured; a client that wants to wait longer asks again.
    pool_max_wait_s: float = 3600.0
    # Largest device memory a daemon may report: today's largest GPUs have ~192 GB, so 16 TiB
    # leaves ample headroom yet refuses garbage such as 2**64-1 from a broken daemon.
    pool_max_device_bytes: int = 16 * 2**40
    # Devices one host may register: real servers have 8-16; 64 matches `daemon --emulate`.
    pool_max_devices: int = 64
    # Longest host id, address, name, filter or transport text, and most filters or transports
    # in one message: far above real use, small enough that one message cannot bloat the state.
    pool_max_text_chars: int = 256
    pool_max_items: int = 32
    # --- joining a pool (daemon agent, `gpuremote run --pool`, smi) ---
    # Every call to the pool (register, heartbeat, renew, release, status) gives up after this:
    # a pool that does not answer in 5 s on a LAN is down, and callers must never hang on it.
    pool_rpc_timeout_s: float = 5.0
    # A client reports an unreachable pool after this long ("within seconds"), instead of
    # gRPC's default of waiting for the connection indefinitely.
    pool_connect_timeout_s: float = 5.0
    # Period of a daemon's re-register attempts while its pool is unreachable: short enough that
    # a restarted pool sees its daemons again within a second or two, long enough to be no load.
    pool_retry_s: float = 1.0
    # Released or expired leases a daemon remembers, to refuse their still-unexpired grants;
    # older ones are refused anyway once their grants expire (within one lease TTL).
    pool_revoked_leases: int = 4096
    # --- compute sharing (gpuremote/daemon/scheduler.py) ---
    # How long a device is held for a flow that is behind its share, waiting for its next op:
    # a session's next op arrives within ~0.1-1 ms on loopback (a client round trip), so 3 ms
    # catches it; a longer hold idles the device when that flow has no more work.
    scheduler_anticipate_s: float = 0.003
    # Unfinished device-time measurements one flow may have (cupy: CUDA events not yet passed);
    # past it the flow's next op waits for its oldest, so it cannot queue unbounded GPU work
    # ahead of its charges.
    scheduler_max_pending: int = 256
    # Utilisation (busy fraction) reported in Info, heartbeats and metrics is over this window.
    scheduler_window_s: float = 5.0


def _from_env(base: Defaults) -> Defaults:
    changes = {}
    for field in dataclasses.fields(base):
        name = "GPUREMOTE_" + field.name.upper()
        raw = os.environ.get(name)
        if raw is None:
            continue
        if field.type == "str":
            changes[field.name] = raw.strip().lower()
            continue
        try:
            if field.type == "float":
                value = float(raw)
                if not math.isfinite(value):
                    raise ValueError("not a finite number")
            elif field.name.endswith("bytes") or field.name == "emulate_memory":
                value = parse_size(raw)
            else:
                value = int(raw)
            if value < 0:
                raise ValueError("negative")
        except ValueError as exc:
            kind = "a size such as 64KiB" if field.name.endswith("bytes") or field.name == "emulate_memory" \
                else "a number" if field.type == "float" else "a whole number"
            raise ValueError(f"environment variable {name}={raw!r} is not valid ({exc}): give {kind}, 0 or more, "
                             f"or unset it (default {getattr(base, field.name)!r}; see gpuremote/_config.py)") from None
        changes[field.name] = value
    return dataclasses.replace(base, **changes)


DEFAULTS = _from_env(Defaults())
