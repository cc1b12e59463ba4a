"""The pool's durable state: hosts with their devices, leases with their grants, the pool's keys.

`Store` is the interface the pool uses; `SQLiteStore(path)` keeps it in one SQLite file
(":memory:" for tests of the logic). Every method is one transaction: a lease and its grants
are written together or not at all.

Durability: the file runs in WAL mode with synchronous=FULL, so a lease is on disk (fsynced)
before the pool replies with its grants. NORMAL would survive a killed pool but could lose the
last commits on power loss or an OS crash, and a lost lease means the pool hands the same
capacity out twice. Lease writes are rare (allocate, renew every TTL/3, release), so one fsync
each costs little; heartbeats, which are frequent, are deliberately not persisted (usage and
last-seen times live in the pool's memory).

Beware: one SQLiteStore is one connection shared by the pool's threads behind a lock; do not
open the same file from two running pools (SQLite would serialize them, but each would hand
out capacity the other does not know about).
"""

from __future__ import annotations

import abc
import contextlib
import json
import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator

from gpuremote.pool.model import Allocation, Device, Host, Lease

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS secrets (name TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS hosts (
    host_id TEXT PRIMARY KEY, address TEXT NOT NULL, backend TEXT NOT NULL, transports TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS devices (
    host_id TEXT NOT NULL REFERENCES hosts(host_id) ON DELETE CASCADE, idx INTEGER NOT NULL,
    name TEXT NOT NULL, memory_total INTEGER NOT NULL, compute_capability TEXT NOT NULL,
    PRIMARY KEY (host_id, idx));
CREATE TABLE IF NOT EXISTS leases (
    lease_id TEXT PRIMARY KEY, client_name TEXT NOT NULL, created_at REAL NOT NULL, expires_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS grants (
    lease_id TEXT NOT NULL REFERENCES leases(lease_id) ON DELETE CASCADE, position INTEGER NOT NULL,
    host_id TEXT NOT NULL, device INTEGER NOT NULL, memory INTEGER NOT NULL, share REAL NOT NULL,
    exclusive INTEGER NOT NULL, signed BLOB NOT NULL, PRIMARY KEY (lease_id, position));
"""


class StoreError(RuntimeError):
    """The state file cannot be used (not a database, another schema version, unwritable)."""


class Store(abc.ABC):
    """What the pool persists. Each method is atomic."""

    @abc.abstractmethod
    def secret(self, name: str, create: bytes) -> bytes:
        """The stored secret `name` (e.g. "grant_key", "lease_key"); stores `create` first if there is none yet."""

    @abc.abstractmethod
    def hosts(self) -> list[Host]:
        """Every host with its devices."""

    @abc.abstractmethod
    def put_host(self, host: Host) -> None:
        """Insert or replace a host and all its devices (leases on it are untouched)."""

    @abc.abstractmethod
    def delete_host(self, host_id: str) -> None:
        """Forget a host and its devices (leases on it are untouched)."""

    @abc.abstractmethod
    def leases(self) -> list[Lease]:
        """Every lease with its grants in order."""

    @abc.abstractmethod
    def put_lease(self, lease: Lease) -> None:
        """Insert or replace a lease and its grants."""

    @abc.abstractmethod
    def delete_leases(self, lease_ids: Iterable[str]) -> None:
        """Remove leases and their grants; unknown ids are ignored."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the underlying resources."""


def _private(path: str) -> None:
    """The state file holds the pool's grant and lease keys: create it readable by its owner alone,
    and make an existing one so (SQLite gives its -wal and -shm files the database file's mode)."""
    if path == ":memory:":
        return
    try:
        os.close(os.open(path, os.O_CREAT | os.O_RDWR, 0o600))
        if os.stat(path).st_mode & 0o077:
            os.chmod(path, 0o600)
    except OSError as exc:
        raise sqlite3.OperationalError(f"unable to open {path}: {exc.strerror}") from None


class SQLiteStore(Store):
    def __init__(self, path: str):
        self.path = path
        self._lock = threading.Lock()
        try:
            _private(path)
            # Autocommit mode (isolation_level=None): transactions are the explicit BEGIN/COMMIT below.
            self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise self._unusable(exc) from None
        try:
            self._setup()
        except StoreError:
            self._db.close()
            raise
        except sqlite3.Error as exc:
            self._db.close()
            raise self._unusable(exc) from None

    def _unusable(self, exc: Exception) -> StoreError:
        return StoreError(f"cannot use {self.path!r} as the pool's state file ({exc}): give a writable path to a "
                          "new file or to a state file written by `gpuremote pool`")

    def _setup(self) -> None:
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA foreign_keys=ON")
        with self._transaction() as db:
            for statement in filter(str.strip, _SCHEMA.split(";")):
                db.execute(statement)
            rows = db.execute("SELECT version FROM schema_version").fetchall()
            if not rows:
                db.execute("INSERT INTO schema_version VALUES (?)", (SCHEMA_VERSION,))
            elif rows != [(SCHEMA_VERSION,)]:
                raise StoreError(f"the state file {self.path!r} has schema version {rows[0][0]}, this gpuremote "
                                 f"reads version {SCHEMA_VERSION}: run the gpuremote release that wrote it, or "
                                 "start the pool with a new --state file")

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    yield self._db
                    self._db.execute("COMMIT")
                except BaseException:
                    if self._db.in_transaction:
                        self._db.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                raise StoreError(f"the pool's state file {self.path!r} failed ({exc}): check the disk "
                                 "(space, permissions) it lives on") from None

    def secret(self, name: str, create: bytes) -> bytes:
        with self._transaction() as db:
            db.execute("INSERT OR IGNORE INTO secrets VALUES (?, ?)", (name, create))
            return bytes(db.execute("SELECT value FROM secrets WHERE name = ?", (name,)).fetchone()[0])

    def hosts(self) -> list[Host]:
        with self._transaction() as db:
            devices: dict[str, list[Device]] = {}
            for host_id, *fields in db.execute("SELECT host_id, idx, name, memory_total, compute_capability "
                                               "FROM devices ORDER BY host_id, idx"):
                devices.setdefault(host_id, []).append(Device(*fields))
            return [Host(host_id, address, backend, tuple(json.loads(transports)), tuple(devices.get(host_id, ())))
                    for host_id, address, backend, transports in
                    db.execute("SELECT host_id, address, backend, transports FROM hosts ORDER BY host_id")]

    def put_host(self, host: Host) -> None:
        with self._transaction() as db:
            db.execute("INSERT INTO hosts VALUES (?, ?, ?, ?) ON CONFLICT(host_id) DO UPDATE SET "
                       "address = excluded.address, backend = excluded.backend, transports = excluded.transports",
                       (host.host_id, host.address, host.backend, json.dumps(list(host.transports))))
            db.execute("DELETE FROM devices WHERE host_id = ?", (host.host_id,))
            db.executemany("INSERT INTO devices VALUES (?, ?, ?, ?, ?)",
                           [(host.host_id, d.index, d.name, d.memory_total, d.compute_capability)
                            for d in host.devices])

    def delete_host(self, host_id: str) -> None:
        with self._transaction() as db:
            db.execute("DELETE FROM hosts WHERE host_id = ?", (host_id,))

    def leases(self) -> list[Lease]:
        with self._transaction() as db:
            grants: dict[str, list[Allocation]] = {}
            for lease_id, host_id, device, memory, share, exclusive, signed in db.execute(
                    "SELECT lease_id, host_id, device, memory, share, exclusive, signed FROM grants "
                    "ORDER BY lease_id, position"):
                grants.setdefault(lease_id, []).append(
                    Allocation(host_id, device, memory, share, bool(exclusive), bytes(signed)))
            return [Lease(lease_id, client, created, expires, tuple(grants.get(lease_id, ())))
                    for lease_id, client, created, expires in
                    db.execute("SELECT lease_id, client_name, created_at, expires_at FROM leases ORDER BY created_at")]

    def put_lease(self, lease: Lease) -> None:
        with self._transaction() as db:
            db.execute("INSERT INTO leases VALUES (?, ?, ?, ?) ON CONFLICT(lease_id) DO UPDATE SET "
                       "client_name = excluded.client_name, expires_at = excluded.expires_at",
                       (lease.lease_id, lease.client_name, lease.created_at, lease.expires_at))
            db.execute("DELETE FROM grants WHERE lease_id = ?", (lease.lease_id,))
            db.executemany("INSERT INTO grants VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                           [(lease.lease_id, i, g.host_id, g.device, g.memory, g.share, int(g.exclusive), g.signed)
                            for i, g in enumerate(lease.grants)])

    def delete_leases(self, lease_ids: Iterable[str]) -> None:
        with self._transaction() as db:
            db.executemany("DELETE FROM leases WHERE lease_id = ?", [(i,) for i in lease_ids])

    def close(self) -> None:
        with self._lock:
            self._db.close()
