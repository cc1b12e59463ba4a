"""The training example locally (NumPy as CuPy, computed in the process) and under
`gpuremote run` (emulated device, embedded daemon over loopback), side by side in one run.

    python benchmarks/train_overhead.py [--repeats 3] [--epochs 20] [--json FILE]

Both sides run examples/train_mlp.py as a subprocess and report the time of its train()
call (the example prints it), so start-up is excluded on both; runs alternate so that drift
on a noisy machine hits both alike. Target: remote / local <= 1.25 at the example's defaults.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile

from rich.console import Console
from rich.table import Table

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLE = str(ROOT / "examples" / "train_mlp.py")
TARGET = 1.25


def timed(cmd: list[str]) -> tuple[float, str]:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr}")
    m = re.search(r"^time ([0-9.]+) s$", done.stderr, re.M)
    if not m:
        raise SystemExit(f"no time reported by {' '.join(cmd)}:\n{done.stderr}")
    return float(m.group(1)), done.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    extra = ["--epochs", str(args.epochs)]
    local, remote, stats = [], [], {}
    with tempfile.TemporaryDirectory() as tmp:
        stats_file = f"{tmp}/stats.json"
        for i in range(args.repeats):
            t, out_local = timed([sys.executable, EXAMPLE, "--numpy", *extra])
            local.append(t)
            t, out_remote = timed([sys.executable, "-m", "gpuremote.cli", "run", "--stats-json", stats_file, "--",
                                   sys.executable, EXAMPLE, *extra])
            remote.append(t)
            if out_local != out_remote:
                raise SystemExit("the remote run printed different results from the local run")
            stats = json.loads(pathlib.Path(stats_file).read_text())
    ratio = statistics.median(remote) / statistics.median(local)
    table = Table(title="training example: local NumPy vs gpuremote run (emulated, loopback)")
    for col in ("", "median s", "all runs s"):
        table.add_column(col)
    table.add_row("local (NumPy in process)", f"{statistics.median(local):.3f}", " ".join(f"{t:.3f}" for t in local))
    table.add_row("gpuremote run", f"{statistics.median(remote):.3f}", " ".join(f"{t:.3f}" for t in remote))
    table.add_row("remote / local", f"{ratio:.2f}x", f"target <= {TARGET}x: {'PASS' if ratio <= TARGET else 'FAIL'}")
    console = Console()
    console.print(table)
    console.print("statistics of the last remote run: " + ", ".join(
        f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v:,}" for k, v in stats.items()))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(
            {"local_s": local, "remote_s": remote, "ratio": ratio, "target": TARGET, "stats": stats}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
