"""`gpuremote local`: a pool and a daemon in one process; the printed commands work; signals stop it cleanly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from cluster import GPUREMOTE, Proc


def test_local_serves_runs_through_its_pool_and_stops_cleanly(tmp_path):
    local = Proc([*GPUREMOTE, "local", "--pool-listen", "127.0.0.1:0", "--daemon-listen", "127.0.0.1:0",
                  "--backend", "emulated", "--emulate", "2", "--emulate-memory", "1GiB", "--lease-ttl", "5"])
    try:
        env_line = local.expect(r"export (GPUREMOTE_POOL=(\S+) GPUREMOTE_TOKEN_FILE=(\S+))", timeout=60)
        assert "gpuremote run -p 0.5" in local.expect(r"Stop with Ctrl-C", timeout=10).string
        pool, token = env_line.group(2), env_line.group(3)
        env = dict(os.environ, GPUREMOTE_POOL=pool, GPUREMOTE_TOKEN_FILE=token)
        env.pop("GPUREMOTE_DAEMON", None)
        script = tmp_path / "s.py"
        script.write_text("import cupy\nprint(cupy.cuda.runtime.getDeviceCount(), "
                          "cupy.cuda.runtime.memGetInfo()[1], int(cupy.arange(5).sum()))\n")
        got = subprocess.run([*GPUREMOTE, "run", "-p", "0.5", "--", sys.executable, str(script)], env=env,
                             capture_output=True, text=True, timeout=120)
        assert got.returncode == 0, got.stderr
        assert got.stdout.split() == ["1", str(2**29), "10"]
        shown = subprocess.run([*GPUREMOTE, "smi", "--json"], env=env, capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0, shown.stderr
        assert '"backend": "emulated"' in shown.stdout and '"leases": []' in shown.stdout
        # Without the token the servers refuse.
        bare = {k: v for k, v in env.items() if k != "GPUREMOTE_TOKEN_FILE"}
        refused = subprocess.run([*GPUREMOTE, "smi", "--pool", pool], env=bare, capture_output=True, text=True,
                                 timeout=60)
        assert refused.returncode == 1 and "unauthenticated" in refused.stderr
    finally:
        code = local.stop(signal.SIGTERM)
    assert code == 0 and "gpuremote local stopped" in local.output()
    assert not os.path.exists(token)                      # the run's token is removed at exit


@pytest.mark.parametrize("args,hint", [
    (["--pool-listen", "nowhere"], "HOST:PORT"),
    (["--daemon-listen", "127.0.0.1:70000"], "HOST:PORT"),
    (["--emulate-memory", "0"], "more than 0 bytes"),
    (["--lease-ttl", "0"], "not a number of seconds from more than 0"),
    (["--policy", "random"], "'random' is not one of"),
    (["--metrics-port", "-1"], "--metrics-port"),
])
def test_bad_flags(args, hint):
    got = subprocess.run([*GPUREMOTE, "local", *args], capture_output=True, text=True, timeout=60)
    assert got.returncode == 2 and hint in got.stderr, got.stderr
