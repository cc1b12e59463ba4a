"""The verbs (RDMA) transport. Without pyverbs or an RDMA device (every machine this project has
so far), the tests check that it is neither advertised nor chosen, that asking for it falls back
cleanly, and the parameter exchange; with a device they move real bytes over it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from gpuremote.transport import host_id, plan, verbs
from gpuremote.transport.base import TransportError
from gpuremote.wire import pb

from conftest import DaemonProcess, backend_args
from transport_util import check_exact_bytes, settle

HAVE_VERBS, WHY = verbs.available()


@pytest.fixture(scope="module")
def daemon():
    d = DaemonProcess(*backend_args(devices=1, memory="512MiB"))
    yield d
    d.stop()


def _good(**changes) -> pb.VerbsEndpoint:
    fields = dict(qp_num=0x1234, lid=7, gid=bytes(range(16)), psn=0xABCDE, mtu=4096, ring_addr=0x7F0000001000,
                  ring_rkey=99, ring_bytes=4 << 22)
    fields.update(changes)
    return verbs.describe(**fields)


def test_parameter_exchange_round_trips_and_is_checked():
    sent = _good()
    got = pb.VerbsEndpoint.FromString(sent.SerializeToString())
    assert verbs.peer(got, 4 << 22) == sent
    for bad, fragment in ((dict(qp_num=0), "queue pair"), (dict(qp_num=1 << 24), "queue pair"),
                          (dict(gid=b"\0" * 8), "GID is 16 bytes"), (dict(psn=1 << 24), "sequence number"),
                          (dict(mtu=1500), "MTU 1500"), (dict(lid=1 << 16), "LID"),
                          (dict(ring_bytes=1 << 20), "bytes were agreed"), (dict(ring_rkey=0), "rkey")):
        with pytest.raises(TransportError, match=fragment):
            verbs.peer(_good(**bad), 4 << 22)


def test_availability_names_the_reason():
    ok, why = verbs.available()
    assert isinstance(ok, bool) and why
    if not ok:
        assert "pyverbs" in why or "RDMA device" in why


def test_plan_tries_verbs_first_for_a_remote_daemon_that_offers_it():
    dp = pb.DataPlane(tcp_port=5, attach_token=b"t" * 32, transports=["socket", "verbs"], host_id="other/h")
    assert plan("auto", dp) == ["verbs", "tcp"]
    assert plan("verbs", dp) == ["verbs", "tcp"]
    local = pb.DataPlane(tcp_port=5, unix_path="@x", attach_token=b"t" * 32, transports=["socket", "shm", "verbs"],
                         host_id=host_id())
    assert plan("auto", local)[0] == "shm"          # on one host, shared memory beats the NIC


@pytest.mark.skipif(HAVE_VERBS, reason="this host has an RDMA device: the fallback is not what happens here")
def test_without_a_device_verbs_is_not_advertised_and_asking_falls_back(daemon):
    code = textwrap.dedent("""
        import sys, warnings, numpy as np, gpuremote, gpuremote.cupy as cp
        warnings.simplefilter("always")
        with warnings.catch_warnings(record=True) as caught:
            s = gpuremote.connect(sys.argv[1])
        host = np.arange(2_000_000, dtype=np.float64)
        assert np.array_equal(cp.asarray(host).get(), host)
        print(s.transport)
        print(*[w.message for w in caught])
    """)
    out = subprocess.run([sys.executable, "-c", code, daemon.address], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, GPUREMOTE_TRANSPORT="verbs"))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] in ("shm", "socket")
    assert "transport 'verbs'" in lines[1] and f"using {lines[0]}" in lines[1]
    settle(daemon.info, None)


@pytest.mark.skipif(not HAVE_VERBS, reason=f"needs pyverbs and an RDMA device: {WHY}")
def test_exact_bytes_over_verbs():
    # Over loopback the client would take shm; a daemon with shm off makes verbs the choice to test.
    d = DaemonProcess(*backend_args(devices=1, memory="512MiB"), env={"GPUREMOTE_SHM": "0"})
    try:
        check_exact_bytes(d, "verbs", "verbs")
    finally:
        d.stop()
