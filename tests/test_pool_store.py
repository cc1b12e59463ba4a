"""The pool's SQLite store: what is written is there after close and reopen (and after a killed writer)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap

import pytest

from gpuremote.pool.model import Allocation, Device, Host, Lease
from gpuremote.pool.store import SCHEMA_VERSION, SQLiteStore, StoreError

GiB = 2**30
HOST = Host("gpu1", "gpu1:7200", "emulated", ("rdma",),
            (Device(0, "A100", 40 * GiB, "80"), Device(1, "A100", 40 * GiB)))
LEASE = Lease("lease-1", "alice", 100.0, 130.0, (Allocation("gpu1", 0, 10 * GiB, 0.25, False, b"signed-0"),
                                                 Allocation("gpu1", 1, 40 * GiB, 1.0, True, b"signed-1")))


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "pool.db")


def test_everything_written_is_there_after_reopen(path):
    store = SQLiteStore(path)
    key = store.secret("grant_key", b"k" * 32)
    lease_key = store.secret("lease_key", b"l" * 32)
    store.put_host(HOST)
    store.put_lease(LEASE)
    store.close()
    store = SQLiteStore(path)
    assert store.secret("grant_key", b"other" * 8) == key == b"k" * 32
    assert store.secret("lease_key", b"other" * 8) == lease_key == b"l" * 32
    assert store.hosts() == [HOST]
    assert store.leases() == [LEASE]
    store.close()


def test_a_killed_writer_loses_nothing_it_committed(path):
    code = textwrap.dedent(f"""
        import os, signal
        from gpuremote.pool.store import SQLiteStore
        from gpuremote.pool.model import Allocation, Lease
        store = SQLiteStore({path!r})
        store.secret("grant_key", b"k" * 32)
        for i in range(20):
            store.put_lease(Lease(f"lease-{{i}}", "c", float(i), 1e12, (Allocation("h", 0, 1, 0.1, False, b"s"),)))
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", code], timeout=30)
    assert proc.returncode == -9
    store = SQLiteStore(path)
    assert [lease.lease_id for lease in store.leases()] == [f"lease-{i}" for i in range(20)]
    assert store.secret("grant_key", b"x" * 32) == b"k" * 32
    store.close()


def test_file_is_wal_with_full_sync_and_a_schema_version(path):
    SQLiteStore(path).close()
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert db.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]
    db.close()
    store = SQLiteStore(path)
    assert store._db.execute("PRAGMA synchronous").fetchone() == (2,)     # 2 = FULL
    store.close()


def test_put_host_replaces_devices_and_keeps_leases():
    store = SQLiteStore(":memory:")
    store.put_host(HOST)
    store.put_lease(LEASE)
    smaller = Host("gpu1", "gpu1:7300", "cupy", (), (Device(3, "H100", 80 * GiB),))
    store.put_host(smaller)
    assert store.hosts() == [smaller]
    assert store.leases() == [LEASE]
    store.delete_host("gpu1")
    assert store.hosts() == []
    assert store.leases() == [LEASE]
    store.close()


def test_put_lease_replaces_and_delete_leases_removes_grants_too():
    store = SQLiteStore(":memory:")
    store.put_lease(LEASE)
    renewed = Lease("lease-1", "alice", 100.0, 160.0, (Allocation("gpu1", 0, 10 * GiB, 0.25, False, b"new"),))
    store.put_lease(renewed)
    assert store.leases() == [renewed]
    store.delete_leases(["lease-1", "never-existed"])
    assert store.leases() == []
    assert store._db.execute("SELECT COUNT(*) FROM grants").fetchone() == (0,)
    store.close()


def test_a_failed_write_changes_nothing():
    store = SQLiteStore(":memory:")
    store.put_lease(LEASE)
    broken = Lease("lease-2", "bob", 1.0, 2.0, (Allocation("gpu1", 0, 1, 0.1, False, b"ok"),
                                                Allocation("gpu1", 1, 1, 0.1, False, object())))
    with pytest.raises(StoreError, match="failed"):
        store.put_lease(broken)
    assert store.leases() == [LEASE]
    store.close()


def test_each_secret_is_created_once_under_its_own_name():
    store = SQLiteStore(":memory:")
    assert store.secret("grant_key", b"a" * 32) == b"a" * 32
    assert store.secret("grant_key", b"b" * 32) == b"a" * 32
    assert store.secret("lease_key", b"c" * 32) == b"c" * 32       # not the grant key
    assert store.secret("lease_key", b"d" * 32) == b"c" * 32
    store.close()


def test_a_file_that_is_not_a_database_is_refused(tmp_path):
    bad = tmp_path / "notes.txt"
    bad.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="cannot use .*notes.txt.* as the pool's state file.*not a database"):
        SQLiteStore(str(bad))


def test_an_unopenable_path_is_refused(tmp_path):
    with pytest.raises(StoreError, match="cannot use .*no-such-dir.*writable path"):
        SQLiteStore(str(tmp_path / "no-such-dir" / "pool.db"))


def test_another_schema_version_is_refused(path):
    SQLiteStore(path).close()
    db = sqlite3.connect(path)
    db.execute("UPDATE schema_version SET version = 99")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="schema version 99, this gpuremote reads version 1.*new --state file"):
        SQLiteStore(path)


def test_the_state_file_and_its_wal_are_readable_by_their_owner_alone(tmp_path):
    # It holds the pool's grant and lease keys (SECURITY.md): never world-readable, whatever the umask.
    import os
    path = tmp_path / "pool.db"
    old = os.umask(0o022)
    try:
        store = SQLiteStore(str(path))
        store.put_host(Host("h", "127.0.0.1:1", "emulated", ("grpc",), (Device(0, "d", 1 << 30),)))
        for f in tmp_path.iterdir():
            assert f.stat().st_mode & 0o077 == 0, f
        store.close()
        path.chmod(0o644)                               # an existing file made loose: tightened on open
        SQLiteStore(str(path)).close()
        assert path.stat().st_mode & 0o777 == 0o600
    finally:
        os.umask(old)
