"""`gpuremote smi` against a real standalone daemon: JSON document, table, --watch until Ctrl-C, bad flags.

(Against a pool it is tested with three daemons in test_pool_run.py.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from cluster import GPUREMOTE, Proc, free_port, smi_json


@pytest.fixture
def client(daemon):
    import gpuremote
    import gpuremote.cupy as cp
    gpuremote.disconnect()
    gpuremote.connect(daemon.address, client_name="smi-test-client")
    yield cp
    gpuremote.disconnect()


def test_daemon_json_lists_devices_and_sessions(daemon, client):
    x = client.ones(1024)
    assert float(x.sum()) == 1024
    doc = smi_json("--daemon", daemon.address)
    assert doc["leases"] == [] and doc["waiting"] == 0
    (host,) = doc["hosts"]
    assert (host["address"], host["backend"], host["stale"]) == (daemon.address, "emulated", False)
    info = daemon.info()
    assert [(d["index"], d["memory_total"], d["memory_used"]) for d in host["devices"]] == \
        [(d.index, d.memory_total, d.memory_used) for d in info.devices]
    sessions = [s for d in host["devices"] for s in d["sessions"]]
    mine = [s for s in sessions if s["client"] == "smi-test-client"]
    assert len(mine) == 1 and mine[0]["memory_used"] >= 8192 and mine[0]["lease_id"] == ""
    assert mine[0] in host["devices"][0]["sessions"]          # listed where it holds memory


def test_table_names_devices_and_clients(daemon, client):
    float(client.ones(8).sum())
    got = subprocess.run([*GPUREMOTE, "smi", "--daemon", daemon.address], capture_output=True, text=True,
                         timeout=60, env=dict(os.environ, COLUMNS="200"))
    assert got.returncode == 0, got.stderr
    assert daemon.address in got.stdout and "smi-test-client" in got.stdout and "no lease" in got.stdout
    assert "GiB" in got.stdout and "Util" in got.stdout


def test_watch_refreshes_until_ctrl_c(daemon):
    watch = Proc([*GPUREMOTE, "smi", "--daemon", daemon.address, "--json", "--watch", "0.2"],
                 start_new_session=True)
    try:
        watch.expect(r'\{"hosts"', timeout=30, count=3)       # three refreshes
    finally:
        os.killpg(watch.pid, signal.SIGINT) if watch.proc.poll() is None else None
        code = watch.wait(timeout=30)
    assert code == 0
    docs = [json.loads(line) for line in watch.output().splitlines() if line.startswith("{")]
    assert len(docs) >= 3 and all(d["hosts"][0]["address"] == daemon.address for d in docs)


@pytest.mark.parametrize("args,code,hint", [
    (["--pool", "127.0.0.1:7100", "--daemon", "127.0.0.1:7200"], 2, "not both"),
    (["--watch", "0"], 2, "refresh period"),
    (["--watch", "-1"], 2, "refresh period"),
    (["--daemon", "nohost"], 2, "HOST:PORT"),
    (["--pool", "127.0.0.1:99999"], 2, "HOST:PORT"),
    ([], 2, "nothing to show"),
])
def test_bad_flags(args, code, hint):
    env = {k: v for k, v in os.environ.items() if k not in ("GPUREMOTE_POOL", "GPUREMOTE_DAEMON")}
    if "--watch" in args:
        args = [*args, "--daemon", "127.0.0.1:7200"]
    got = subprocess.run([*GPUREMOTE, "smi", *args], capture_output=True, text=True, timeout=60, env=env)
    assert got.returncode == code and hint in got.stderr, got.stderr


def test_unreachable_source_fails_fast():
    port = free_port()
    for flag, what in (("--pool", "pool"), ("--daemon", "daemon")):
        got = subprocess.run([*GPUREMOTE, "smi", flag, f"127.0.0.1:{port}"], capture_output=True, text=True,
                             timeout=30)
        assert got.returncode == 1 and f"cannot reach the gpuremote {what} at 127.0.0.1:{port}" in got.stderr
