"""The training example locally (NumPy as CuPy, computed in the process) and under
`gpuremote run` (emulated device, embedded daemon over loopback), side by side in one run.

    python benchmarks/train_overhead.py [--repeats 3] [--epochs 20] [--sizes 64x128,256x1024]
                                        [--without-templates] [--without-compiled] [--json FILE]

Both sides run examples/train_mlp.py as a subprocess and report the time of its train() call
(the example prints it; start-up and loading the dataset are excluded on both sides); runs
alternate so that drift on a noisy machine hits both alike. Target: remote / local <= 1.25 at
the example's defaults (batch 64, hidden 128). `--sizes BATCHxHIDDEN,...` adds larger models,
to show how the ratio falls as each op does more work: gpuremote adds a roughly fixed cost per
op, NumPy's own cost per op grows with the arrays. `--without-templates` adds a third run of each
size with call templates turned off (GPUREMOTE_MAX_TEMPLATES=0), to show what replaying saves;
`--without-compiled` one on the Python paths alone (GPUREMOTE_NATIVE=0), to show what the compiled
ones (native/forward.c on the client, native/replay.c in the daemon) save.
"""

from __future__ import annotations

import argparse
import json
import os
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
DEFAULT_SIZE = (64, 128)
# Remote runs a flag adds beside the default one: (what the column says, the environment it runs with).
VARIANTS = {
    "without_templates": ("no templates", {"GPUREMOTE_MAX_TEMPLATES": "0"}),
    "without_compiled": ("Python paths", {"GPUREMOTE_NATIVE": "0"}),
}


def timed(cmd: list[str], env: dict | None = None) -> tuple[float, str]:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr}")
    m = re.search(r"^time ([0-9.]+) s$", done.stderr, re.M)
    if not m:
        raise SystemExit(f"no time reported by {' '.join(cmd)}:\n{done.stderr}")
    return float(m.group(1)), done.stdout


def sizes(text: str) -> list[tuple[int, int]]:
    try:
        out = [tuple(int(v) for v in part.lower().split("x")) for part in text.split(",") if part.strip()]
    except ValueError:
        out = []
    if not out or any(len(s) != 2 or min(s) < 1 for s in out):
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of BATCHxHIDDEN sizes, e.g. 64x128,256x1024")
    return out


def measure(size: tuple[int, int], args, stats_file: str) -> dict:
    batch, hidden = size
    extra = ["--epochs", str(args.epochs), "--batch", str(batch), "--hidden", str(hidden)]
    remote_cmd = [sys.executable, "-m", "gpuremote.cli", "run", "--stats-json", stats_file, "--",
                  sys.executable, EXAMPLE, *extra]
    local, remote = [], []
    variants = {key: [] for key in VARIANTS if getattr(args, key)}
    for _ in range(args.repeats):
        t, out_local = timed([sys.executable, EXAMPLE, "--numpy", *extra])
        local.append(t)
        for key, times in variants.items():
            t, out_variant = timed(remote_cmd, dict(os.environ, **VARIANTS[key][1]))
            times.append(t)
            if out_local != out_variant:
                raise SystemExit(f"at batch {batch}, hidden {hidden} the run with {VARIANTS[key][0]} printed "
                                 "different results")
        t, out_remote = timed(remote_cmd)
        remote.append(t)
        if out_local != out_remote:
            raise SystemExit(f"at batch {batch}, hidden {hidden} the remote run printed different results")
    stats = json.loads(pathlib.Path(stats_file).read_text())
    ratio = statistics.median(remote) / statistics.median(local)
    out = {"batch": batch, "hidden": hidden, "local_s": local, "remote_s": remote, "ratio": ratio,
           "ops": stats["ops"], "stats": stats}
    for key, times in variants.items():
        out[f"remote_{key}_s"] = times
        out[f"ratio_{key}"] = statistics.median(times) / statistics.median(local)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs of each side, alternated (default 3)")
    parser.add_argument("--epochs", type=int, default=20, help="training epochs per run (default 20)")
    parser.add_argument("--sizes", type=sizes, default=[DEFAULT_SIZE],
                        help="BATCHxHIDDEN,... (default: the example's 64x128)")
    parser.add_argument("--without-templates", action="store_true",
                        help="also run the remote side with call templates off, side by side")
    parser.add_argument("--without-compiled", action="store_true",
                        help="also run the remote side on the Python paths alone (GPUREMOTE_NATIVE=0: no "
                             "gpuremote._forward on the client, no gpuremote._replay in the daemon), side by side")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    if args.repeats < 1 or args.epochs < 1:
        parser.error("--repeats and --epochs must be at least 1")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            results.append(measure(size, args, f"{tmp}/stats.json"))
    table = Table(title="train_mlp.py train(): local NumPy vs gpuremote run (emulated, loopback); "
                        "medians; size is batch x hidden")
    shown = [key for key in VARIANTS if getattr(args, key)]
    for col in ("size", "local s", "remote s", "ratio", "local us/op", "remote us/op", "target"):
        table.add_column(col, justify="right")
        if col == "ratio":
            for key in shown:
                table.add_column(f"ratio, {VARIANTS[key][0]}", justify="right")
    for r in results:
        local, remote = statistics.median(r["local_s"]), statistics.median(r["remote_s"])
        default = (r["batch"], r["hidden"]) == DEFAULT_SIZE
        verdict = (f"<={TARGET}x {'PASS' if r['ratio'] <= TARGET else 'FAIL'}") if default else "-"
        cells = [f"{r['batch']}x{r['hidden']}", f"{local:.3f}", f"{remote:.3f}", f"{r['ratio']:.2f}x"]
        cells += [f"{r[f'ratio_{key}']:.2f}x" for key in shown]
        table.add_row(*cells, f"{local / r['ops'] * 1e6:.1f}", f"{remote / r['ops'] * 1e6:.1f}", verdict)
    console = Console(width=None if sys.stdout.isatty() else 132)   # a log file gets whole columns
    console.print(table)
    console.print("statistics of the last remote run: " + ", ".join(
        f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v:,}" for k, v in results[-1]["stats"].items()))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"target": TARGET, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
