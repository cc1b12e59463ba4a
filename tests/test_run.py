"""`gpuremote run`: unmodified scripts on gpuremote devices behave as if run directly.

Direct runs use a stand-in `cupy` package that is NumPy (written to a temporary folder), so
output and exit codes can be compared line for line. After every run through a test daemon,
the daemon itself is asked whether any session or byte of device memory is still held.
"""

import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
GPUREMOTE = [sys.executable, "-m", "gpuremote.cli"]


@pytest.fixture(scope="module")
def numpy_as_cupy(tmp_path_factory):
    """A folder with a `cupy` that is NumPy, for the direct runs."""
    root = tmp_path_factory.mktemp("numpy_cupy")
    pkg = root / "cupy"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent("""
        from numpy import *
        from numpy import linalg, fft, random
        def asnumpy(a, stream=None, out=None):
            return asarray(a)
    """))
    return str(root)


def direct(args, numpy_as_cupy, **kw):
    env = dict(os.environ, PYTHONPATH=numpy_as_cupy)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=120, **kw)


def wrapped(args, *options, **kw):
    env = dict(os.environ)
    env.pop("GPUREMOTE_DAEMON", None)
    return subprocess.run([*GPUREMOTE, "run", *options, "--", *args], capture_output=True, text=True,
                          env=env, timeout=120, **kw)


def assert_daemon_clean(daemon, timeout=15.0):
    """No session and no device memory left on the daemon (bounded wait for stream teardown)."""
    deadline = time.monotonic() + timeout
    while True:
        info = daemon.info()
        if not info.sessions and all(d.memory_used == 0 for d in info.devices):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"daemon still holds sessions {list(info.sessions)} / memory "
                                 f"{[d.memory_used for d in info.devices]}")
        time.sleep(0.1)


def script(tmp_path, body: str) -> str:
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


@pytest.mark.parametrize("example,extra", [("train_mlp.py", ["--epochs", "2"]),
                                           ("conjugate_gradient.py", ["-n", "32"])])
def test_examples_match_a_direct_run(example, extra, daemon, numpy_as_cupy):
    path = str(ROOT / "examples" / example)
    ref = direct([path, *extra], numpy_as_cupy)
    got = wrapped([sys.executable, path, *extra], "--daemon", daemon.address)
    assert got.returncode == ref.returncode == 0, got.stderr
    assert got.stdout == ref.stdout
    assert_daemon_clean(daemon)


def test_embedded_daemon_is_the_default(tmp_path):
    path = script(tmp_path, """
        import cupy, cupy.cuda
        from cupy.cuda import Device
        import cupy.linalg, cupy.fft, cupy.random, cupy.testing, cupyx, cupyx.scipy.special
        from cupyx.scipy.special import erf
        x = cupy.arange(10)
        cupy.testing.assert_array_equal(x * 2, cupy.asarray(list(range(0, 20, 2))))
        print(type(x).__module__, cupy.cuda.runtime.getDeviceCount(), int(x.sum()), Device(0).id,
              round(float(erf(x[1:2]).sum()), 4), cupyx.scipy.special.expit(x).dtype)
    """)
    got = wrapped([sys.executable, path])
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == ["gpuremote.cupy._core", "1", "45", "0", "0.8427", "float64"]


def test_two_devices_reach_the_granted_devices(tmp_path, daemon):
    path = script(tmp_path, """
        import cupy
        print(cupy.cuda.runtime.getDeviceCount())
        for i in range(2):
            with cupy.cuda.Device(i):
                print(int((cupy.ones(4) * (i + 1)).sum()), cupy.cuda.Device().id)
    """)
    got = wrapped([sys.executable, path], "-n", "2", "--daemon", daemon.address)
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == ["2", "4", "0", "8", "1"]
    assert_daemon_clean(daemon)


def test_exit_code_and_crash_match_a_direct_run(tmp_path, daemon, numpy_as_cupy):
    exits = script(tmp_path, """
        import sys, cupy
        x = cupy.ones(1000)
        print("before exit", float(x.sum()))
        sys.exit(3)
    """)
    ref, got = direct([exits], numpy_as_cupy), wrapped([sys.executable, exits], "--daemon", daemon.address)
    assert (got.returncode, got.stdout) == (ref.returncode, ref.stdout) == (3, "before exit 1000.0\n")
    assert_daemon_clean(daemon)

    raises = tmp_path / "raises.py"
    raises.write_text("import cupy\nx = cupy.zeros((100, 100))\nraise RuntimeError('boom from the script')\n")
    ref, got = direct([str(raises)], numpy_as_cupy), wrapped([sys.executable, str(raises)], "--daemon", daemon.address)
    assert got.returncode == ref.returncode == 1
    assert "RuntimeError: boom from the script" in got.stderr
    assert_daemon_clean(daemon)


@pytest.mark.parametrize("sig,to_group", [(signal.SIGINT, True), (signal.SIGTERM, False)], ids=["SIGINT", "SIGTERM"])
def test_a_signal_ends_the_command_like_a_direct_run(tmp_path, daemon, sig, to_group):
    # SIGINT as Ctrl-C sends it, to the whole foreground group; SIGTERM as a process manager does
    # (kill PID), to the wrapper alone, which passes it on.
    path = script(tmp_path, """
        import time, cupy
        x = cupy.ones((256, 256))
        print("ready", float(x.sum()), flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([*GPUREMOTE, "run", "--daemon", daemon.address, "--", sys.executable, path],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout.readline().split() == ["ready", "65536.0"]
        if to_group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == -sig
    if sig == signal.SIGINT:
        assert "KeyboardInterrupt" in proc.stderr.read()
    proc.stdout.close()
    proc.stderr.close()
    assert_daemon_clean(daemon)


def test_the_environments_own_sitecustomize_still_runs(tmp_path, daemon):
    # gpuremote run's start-up hook shadows sitecustomize; it chains to the one that was there.
    own = tmp_path / "site"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import os\nos.environ['OWN_SITECUSTOMIZE'] = 'ran'\n")
    path = script(tmp_path, """
        import os, cupy
        print(os.environ.get("OWN_SITECUSTOMIZE"), type(cupy.ones(2)).__module__)
    """)
    env = dict(os.environ, PYTHONPATH=str(own))
    env.pop("GPUREMOTE_DAEMON", None)
    got = subprocess.run([*GPUREMOTE, "run", "--daemon", daemon.address, "--", sys.executable, path],
                         capture_output=True, text=True, env=env, timeout=120)
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == ["ran", "gpuremote.cupy._core"]
    assert_daemon_clean(daemon)


def test_inf_and_nan_come_without_warnings_from_the_daemon(tmp_path):
    # As on a GPU: exp(1000) is inf and log(-1) NaN, and the embedded daemon (in the wrapper's
    # process, sharing its terminal) prints no NumPy RuntimeWarning naming its own lines.
    path = script(tmp_path, """
        import cupy
        print(float(cupy.exp(cupy.asarray([1000.0]))[0]), float(cupy.log(cupy.asarray([-1.0]))[0]),
              float(cupy.mean(cupy.zeros(0))), float(cupy.std(cupy.ones(1), ddof=1)))
    """)
    got = wrapped([sys.executable, path])
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == ["inf", "nan", "nan", "nan"]
    assert "Warning" not in got.stderr, got.stderr


def test_multiprocessing_worker_uses_cupy(tmp_path, daemon):
    path = script(tmp_path, """
        import multiprocessing as mp
        import cupy

        def work(q):
            q.put(float((cupy.arange(5) * 3).sum()))

        if __name__ == "__main__":
            a = cupy.ones(3)
            q = mp.Queue()
            p = mp.Process(target=work, args=(q,))
            p.start()
            print(q.get(timeout=30))
            p.join(30)
            print(p.exitcode, float(a.sum()))
    """)
    got = wrapped([sys.executable, path], "--daemon", daemon.address)
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == ["30.0", "0", "3.0"]
    assert_daemon_clean(daemon)


def test_python_subprocess_gets_the_hook(tmp_path, daemon):
    path = script(tmp_path, """
        import subprocess, sys
        r = subprocess.run([sys.executable, "-c", "import cupy; print(int(cupy.arange(4).sum()))"],
                           capture_output=True, text=True)
        print(r.stdout.strip(), r.returncode)
    """)
    got = wrapped([sys.executable, path], "--daemon", daemon.address)
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == ["6", "0"]
    assert_daemon_clean(daemon)


def test_non_python_command_runs_untouched():
    got = wrapped(["sh", "-c", "echo out; echo err >&2; exit 4"])
    assert (got.returncode, got.stdout, got.stderr) == (4, "out\n", "err\n")


def test_stats_summary_and_json(tmp_path, daemon):
    path = script(tmp_path, """
        import cupy
        x = cupy.asarray([1.0, 2.0, 3.0])
        for _ in range(10):
            x = x * 1.5
        print(float(x.sum()))
    """)
    out = tmp_path / "stats.json"
    got = wrapped([sys.executable, path], "--daemon", daemon.address, "--stats", "--stats-json", str(out))
    assert got.returncode == 0, got.stderr
    import json
    stats = json.loads(out.read_text())
    assert stats["processes"] == 1 and stats["round_trips"] == 1 and stats["ops"] >= 12
    assert stats["bytes_h2d"] == 24 and stats["bytes_d2h"] > 0
    # asked of the daemon at exit: at `x = x * 1.5` the old and the new x (24 bytes each) were held
    assert stats["peak_memory"] == 48
    assert "blocking round trips" in got.stderr and "peak device memory" in got.stderr


@pytest.mark.parametrize("options,message", [
    (["--bogus"], "No such option"),
    (["-n", "0"], "-n"),
    (["-p", "1.5"], "fraction"),
    (["-p", "0"], "fraction"),
    (["-m", "lots"], "invalid size"),
    (["-p", "0.5", "-m", "1GiB"], "not both"),
    (["--daemon", "nohost"], "HOST:PORT"),
    (["--wait", "nan"], "nan is not a number of seconds"),
    (["--wait", "-1"], "--wait"),
    (["--wait", "1e12"], "0<=x<=3600"), (["--wait", "inf"], "0<=x<=3600"),     # the pool's own limit
])
def test_bad_flags_are_refused(options, message):
    got = subprocess.run([*GPUREMOTE, "run", *options, "--", "true"], capture_output=True, text=True, timeout=60)
    assert got.returncode != 0
    assert message in got.stderr


def test_missing_command_is_refused():
    got = subprocess.run([*GPUREMOTE, "run"], capture_output=True, text=True, timeout=60)
    assert got.returncode != 0 and "COMMAND" in got.stderr


def test_unreachable_daemon_fails_fast():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once the socket closes
    start = time.monotonic()
    got = subprocess.run([*GPUREMOTE, "run", "--daemon", f"127.0.0.1:{port}", "--", "true"],
                         capture_output=True, text=True, timeout=60)
    assert got.returncode != 0
    assert "cannot reach" in got.stderr and f"127.0.0.1:{port}" in got.stderr
    assert time.monotonic() - start < 30


def test_missing_or_unexecutable_command_exits_as_a_shell_would(tmp_path):
    got = subprocess.run([*GPUREMOTE, "run", "--", "no-such-program-gpuremote"], capture_output=True, text=True,
                         timeout=60)
    assert got.returncode == 127 and "command not found" in got.stderr
    plain = tmp_path / "not-executable"
    plain.write_text("echo hi\n")
    got = subprocess.run([*GPUREMOTE, "run", "--", str(plain)], capture_output=True, text=True, timeout=60)
    assert got.returncode == 126 and "not executable" in got.stderr


def test_ctrl_c_caught_during_a_sync_point_leaves_the_session_working(tmp_path):
    # The interrupt waits for the reply being read (as a CUDA call finishes before Python sees a
    # signal); raised in the middle, it left that reply unread and the session out of step.
    path = script(tmp_path, """
        import os, signal, threading, time
        import cupy as cp
        a = cp.ones((300, 300))
        threading.Thread(target=lambda: (time.sleep(0.5), os.kill(os.getpid(), signal.SIGINT)), daemon=True).start()
        try:
            for _ in range(100000):         # bounded: the interrupt comes after 0.5 s
                a = a @ a.T / 300
                float(a[0, 0])
            print("never interrupted")
        except KeyboardInterrupt:
            print("interrupted")
        print(float(cp.arange(10.0).sum()), float(a.sum()) > 0)
    """)
    got = wrapped([sys.executable, path])
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == ["interrupted", "45.0", "True"], got.stdout + got.stderr
