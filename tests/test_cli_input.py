"""`gpuremote daemon` with bad input (flags, GPUREMOTE_<NAME> tunables): a non-zero exit and a
message that says what to do.

Every daemon here is a subprocess with a timeout; one that starts by mistake is stopped.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import grpc
import pytest

from gpuremote._config import PROTOCOL_VERSION
from gpuremote.v1 import daemon_pb2_grpc
from gpuremote.wire import pb

from conftest import DaemonProcess, backend_args


def run_daemon(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    """`python -m gpuremote.cli daemon ARGS`; a daemon that is still running at `timeout` fails the test."""
    cmd = [sys.executable, "-m", "gpuremote.cli", "daemon", "--insecure", *args]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:          # subprocess.run has killed it already
        pytest.fail(f"`{' '.join(args)}` started a daemon instead of refusing: {exc.stdout!r}")


@pytest.mark.parametrize("args,hints", [
    (["--listen", "nonsense"], ["--listen", "not HOST:PORT", "127.0.0.1:7200"]),
    (["--listen", "127.0.0.1:99999"], ["--listen", "99999", "out of range", "65535"]),
    (["--listen", "127.0.0.1:-5"], ["--listen", "not HOST:PORT"]),
    (["--listen", ":7200"], ["--listen", "not HOST:PORT", "0.0.0.0:7200"]),
    (["--emulate", "0"], ["--emulate", "0 is not in the range", "1<=x<=64"]),
    (["--emulate", "many"], ["--emulate", "not a valid integer"]),
    (["--emulate-memory", "12XB"], ["--emulate-memory", "12XB", "64KiB", "8GiB"]),
    (["--emulate-memory", "-1GiB"], ["--emulate-memory", "invalid size"]),
    (["--emulate-memory", "0", "--backend", "emulated"], ["--emulate-memory", "more than 0 bytes"]),
    (["--backend", "bogus"], ["--backend", "'bogus' is not one of", "'auto', 'cupy', 'emulated'"]),
    (["--devices", "a,b"], ["--devices", "'a,b' is not a comma-separated list", "e.g. 0,1"]),
    (["--devices", "-1"], ["--devices", "non-negative", "e.g. 0,1"]),
    (["--max-sessions", "0"], ["--max-sessions", "1<=x<=4096"]),
    (["--drain-timeout", "-1"], ["--drain-timeout", "0<=x<=86400"]),
    (["--drain-timeout", "soon"], ["--drain-timeout", "'soon' is not a valid float"]),
    (["--drain-timeout", "nan"], ["--drain-timeout", "nan is not a number of seconds"]),
    (["--no-such-flag"], ["No such option", "--no-such-flag"]),
])
def test_bad_flags(args, hints):
    result = run_daemon(*args, "--listen", "127.0.0.1:0") if "--listen" not in args else run_daemon(*args)
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "listening" not in result.stdout
    for hint in hints:
        assert hint in result.stderr, (hint, result.stderr)
    assert "Traceback" not in result.stderr
    assert "--help" in result.stderr                    # click points at the usage


def test_port_in_use():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        result = run_daemon("--backend", "emulated", "--listen", f"127.0.0.1:{port}")
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr
    assert "already in use" in result.stderr and "port 0" in result.stderr
    assert "Traceback" not in result.stderr


def test_second_daemon_on_the_same_port_is_refused():
    first = DaemonProcess(*backend_args(devices=1, memory="64MiB"))
    try:
        result = run_daemon("--backend", "emulated", "--listen", first.address, timeout=20)
        assert result.returncode == 1, (result.stdout, result.stderr)
        assert f"cannot listen on {first.address}" in result.stderr
        assert first.info().backend                       # the first one still serves
    finally:
        first.stop()


def test_address_not_of_this_machine():
    result = run_daemon("--backend", "emulated", "--listen", "192.0.2.1:7200",    # TEST-NET-1: never local
                        "--insecure-listen-anywhere")
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "cannot listen on 192.0.2.1:7200" in result.stderr and "local address" in result.stderr


def test_cupy_backend_without_a_gpu():
    from gpuremote.daemon.backends import cupy_available
    if cupy_available():
        pytest.skip("this machine has a usable GPU")
    result = run_daemon("--backend", "cupy", "--listen", "127.0.0.1:0")
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "cannot start the cupy backend" in result.stderr and "--backend emulated" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("name,value,hint", [
    ("GPUREMOTE_MAX_TEMPLATES", "many", "a whole number"),
    ("GPUREMOTE_MAX_TEMPLATES", "-1", "negative"),
    ("GPUREMOTE_MAX_MESSAGE_BYTES", "lots", "a size such as 64KiB"),
    ("GPUREMOTE_SCHEDULER_ANTICIPATE_S", "nan", "a number"),
    ("GPUREMOTE_SCHEDULER_ANTICIPATE_S", "-0.5", "negative"),
])
def test_bad_tunable_in_the_environment(name, value, hint):
    done = subprocess.run([sys.executable, "-c", "import gpuremote._config"], capture_output=True, text=True,
                          timeout=60, env=dict(os.environ, **{name: value}))
    assert done.returncode != 0
    assert f"{name}={value!r} is not valid" in done.stderr and hint in done.stderr and "unset it" in done.stderr


def test_a_tunable_past_the_wire_field_is_capped():
    d = DaemonProcess(*backend_args(devices=1, memory="64MiB"), env={"GPUREMOTE_MAX_TEMPLATES": str(2**40)})
    try:
        with grpc.insecure_channel(d.address) as channel:
            hello = pb.ClientMessage()
            hello.open.protocol_version = PROTOCOL_VERSION
            opened = next(iter(daemon_pb2_grpc.DaemonStub(channel).Session(iter([hello]), timeout=20)))
        assert opened.opened.limits.max_templates == 2**32 - 1
    finally:
        d.stop()
