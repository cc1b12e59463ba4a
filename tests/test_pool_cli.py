"""`gpuremote pool` as a command: bad flags and state files get clear errors; signals stop it cleanly."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys

import pytest

from test_pool_e2e import PoolProcess


def run_pool(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    """`python -m gpuremote.cli pool ARGS`; a pool still running at `timeout` fails the test."""
    try:
        return subprocess.run([sys.executable, "-m", "gpuremote.cli", "pool", "--insecure", *args],
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:            # subprocess.run has killed it already
        pytest.fail(f"`{' '.join(args)}` started a pool instead of refusing: {exc.stdout!r}")


@pytest.mark.parametrize("args,hints", [
    (["--listen", "nonsense"], ["--listen", "not HOST:PORT", "127.0.0.1:7100"]),
    (["--listen", "127.0.0.1:99999"], ["--listen", "out of range", "65535"]),
    (["--lease-ttl", "0"], ["--lease-ttl", "not a number of seconds from more than 0"]),
    (["--lease-ttl", "-5"], ["--lease-ttl", "not a number of seconds"]),
    (["--lease-ttl", "nan"], ["--lease-ttl", "not a number of seconds"]),
    (["--lease-ttl", "1e300"], ["--lease-ttl", "to 604800 (a week)"]),
    (["--lease-ttl", "soon"], ["--lease-ttl", "'soon' is not a valid float"]),
    (["--policy", "random"], ["--policy", "'random' is not one of", "'pack', 'spread'"]),
    (["--state", "."], ["--state", "is a directory"]),
    (["--oversubscribe-compute=yes"], ["--oversubscribe-compute", "does not take a value"]),
    (["--no-such-flag"], ["No such option", "--no-such-flag"]),
])
def test_bad_flags(args, hints, tmp_path):
    base = [] if "--listen" in args else ["--listen", "127.0.0.1:0"]
    base += [] if "--state" in args else ["--state", str(tmp_path / "pool.db")]
    result = run_pool(*args, *base)
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "listening" not in result.stdout and "Traceback" not in result.stderr
    for hint in hints:
        assert hint in result.stderr, (hint, result.stderr)


def test_unusable_state_files(tmp_path):
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not sqlite at all" * 64)
    for path, hint in ((junk, "file is not a database"), (tmp_path / "missing" / "pool.db", "unable to open")):
        result = run_pool("--listen", "127.0.0.1:0", "--state", str(path))
        assert result.returncode == 1, (result.stdout, result.stderr)
        assert f"cannot use '{path}' as the pool's state file" in result.stderr and hint in result.stderr
        assert "Traceback" not in result.stderr


def test_port_in_use(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        result = run_pool("--listen", f"127.0.0.1:{port}", "--state", str(tmp_path / "pool.db"))
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr and "port 0" in result.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_stop_it_cleanly(sig, tmp_path):
    pool = PoolProcess(tmp_path / "pool.db", "--policy", "spread", "--oversubscribe-compute", "--lease-ttl", "5")
    assert "policy spread, compute oversubscribed" in pool.output() and "lease TTL 5 s" in pool.output()
    assert pool.status().hosts == []
    assert pool.stop(sig) == 0
    assert pool.output().rstrip().endswith("gpuremote pool stopped")


def test_listed_in_the_main_help():
    result = subprocess.run([sys.executable, "-m", "gpuremote.cli", "--help"], capture_output=True, text=True,
                            timeout=30)
    assert "pool" in result.stdout and "run" in result.stdout and "daemon" in result.stdout
