"""`gpuremote bench memcpy`: bad input gives clear click errors; a short local run measures every
transport and direction and writes the JSON records (and the plot, when matplotlib is there)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from gpuremote.cli import main
from gpuremote.cli_bench import parse_sizes
from conftest import DaemonProcess, backend_args

KEYS = {"transport", "direction", "memory", "size_bytes", "iterations", "latency_us_median", "latency_us_p99",
        "bandwidth_gbps"}


def run(*args):
    return CliRunner().invoke(main, ["bench", "memcpy", *args], catch_exceptions=False)


@pytest.mark.parametrize("args,fragment", [
    (["--sizes", "1GiB:4B"], "ends below its start"),
    (["--sizes", "4 parsecs"], "invalid size"),
    (["--sizes", "0:4KiB"], "at least 1 byte"),
    (["--sizes", "4B:1KiB:9"], "not a size range"),
    (["--sizes", "4B:32GiB"], "above 16 GiB"),
    (["--transport", "pigeon"], "'pigeon' is not a transport"),
    (["--transport", ""], "is not a transport"),
    (["--direction", "h2d,sideways"], "'sideways' is not a direction"),
    (["--memory", "shiny"], "'shiny' is not a host memory kind"),
    (["--iterations", "0"], "0 is not in the range"),
    (["--factor", "3"], "'3' is not one of"),
    (["--daemon", "127.0.0.1:1", "--local"], "not both"),
    (["--json", "/nonexistent-folder/x.json"], "does not exist"),
])
def test_bad_input(args, fragment):
    result = run(*args)
    assert result.exit_code == 2, result.output
    assert fragment in result.output, result.output


def test_size_sweep():
    assert parse_sizes("4B:1KiB") == [4, 16, 64, 256, 1024]
    assert parse_sizes("4B:1KiB", 2) == [4, 8, 16, 32, 64, 128, 256, 512, 1024]
    assert parse_sizes("1KiB:5000") == [1024, 4096, 5000]          # the upper bound is always measured
    assert parse_sizes("64KiB") == [65536]
    assert parse_sizes("1MiB,4KiB,4KiB") == [4096, 2**20]


def test_unreachable_daemon_is_a_clean_error():
    out = subprocess.run([sys.executable, "-m", "gpuremote.cli", "bench", "memcpy", "--daemon", "127.0.0.1:1",
                          "--sizes", "4B"], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, GPUREMOTE_CONNECT_TIMEOUT_S="1"))
    assert out.returncode == 1
    assert "cannot open a session with the daemon at 127.0.0.1:1" in out.stderr
    assert "Traceback" not in out.stderr


def test_local_run_writes_records(tmp_path):
    path = tmp_path / "bench.json"
    plot = tmp_path / "bench.png"
    args = ["--local", "--sizes", "4B:64KiB", "--iterations", "3", "--json", str(path),
            "--memory", "pageable,pinned"]
    has_plot = importlib.util.find_spec("matplotlib") is not None
    if has_plot:
        args += ["--plot", str(plot)]
    result = run(*args)
    assert result.exit_code == 0, result.output
    records = json.loads(path.read_text())
    assert records and all(set(r) == KEYS for r in records)
    transports = {r["transport"] for r in records}
    assert {"native", "grpc", "socket"} <= transports
    assert {r["direction"] for r in records} == {"h2d", "d2h", "d2d"}
    assert {r["memory"] for r in records} == {"pageable", "pinned"}
    assert sorted({r["size_bytes"] for r in records}) == [4, 16, 64, 256, 1024, 4096, 16384, 65536]
    for r in records:
        assert r["iterations"] == 3
        assert 0 < r["latency_us_median"] <= r["latency_us_p99"]
        assert r["bandwidth_gbps"] == pytest.approx(r["size_bytes"] / r["latency_us_median"] / 1e3)
    assert "H2D memcpy" in result.output and "native" in result.output
    if has_plot:
        assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_names_the_extra(tmp_path):
    # A child where `import matplotlib` fails, as on a machine without the extra.
    code = ("import sys; sys.modules['matplotlib'] = None; from gpuremote.cli import main; "
            "main(['bench', 'memcpy', '--local', '--sizes', '4B', '--plot', sys.argv[1]])")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "x.png")], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 1
    assert "pip install 'gpuremote[plot]'" in out.stderr


def test_one_direction_one_transport():
    result = run("--local", "--direction", "h2d", "--transport", "grpc", "--sizes", "4B:16B", "--iterations", "2")
    assert result.exit_code == 0, result.output
    assert "H2D memcpy" in result.output and "D2H" not in result.output
    assert "grpc" in result.output and "socket" not in result.output


def _gone(pid: int, timeout: float = 15.0) -> bool:
    import time
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        with open(f"/proc/{pid}/stat") as f:             # a zombie waits for its reaper: it is gone too
            if f.read().split(")")[-1].split()[0] == "Z":
                return True
        time.sleep(0.05)
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
@pytest.mark.parametrize("how", ["finishes", "killed"])
def test_local_daemon_is_a_child_that_ends_with_the_run(how):
    """--local runs the daemon as a child process (application and daemon are two processes, as
    anywhere else); it ends with the run, also when the run is SIGKILLed."""
    import re
    import signal
    sizes = "4B" if how == "finishes" else "4B:1GiB"
    bench = subprocess.Popen([sys.executable, "-m", "gpuremote.cli", "bench", "memcpy", "--local", "--transport", "unix",
                              "--sizes", sizes, "--iterations", "50"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True)
    try:
        pid = None
        for line in bench.stderr:                     # bounded: the run prints this line, or exits
            found = re.search(r"started here, pid (\d+)", line)
            if found:
                pid = int(found.group(1))
                break
        assert pid is not None and pid != bench.pid
        if how == "killed":
            bench.kill()
        assert bench.wait(timeout=120) == (-signal.SIGKILL if how == "killed" else 0)
        assert _gone(pid), f"daemon {pid} outlived the bench run ({how})"
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
        bench.stderr.close()


def test_sizes_the_host_or_device_cannot_hold_are_refused_before_measuring():
    # (a traceback after the smaller sizes had run, or the kernel's OOM killer, before)
    result = run("--local", "--transport", "shm", "--memory", "pinned", "--sizes", "16GiB")
    assert result.exit_code != 0 and "of host memory" in result.output and "give smaller sizes" in result.output
    daemon = DaemonProcess(*backend_args(devices=1, memory="64MiB"))
    try:
        result = run("--daemon", daemon.address, "--transport", "grpc", "--sizes", "1MiB,48MiB")
        assert result.exit_code != 0 and "on the device" in result.output and "64 MiB" in result.output
    finally:
        daemon.stop()
