"""`gpuremote bench memcpy`: cudaMemcpy-style latency and bandwidth, per transport, side by side.

Follows the conventions of CUDA's bandwidthTest and nvbandwidth: each measurement is one
blocking copy of SIZE bytes (H2D: host -> device, then a device sync; D2H: device -> host; D2D:
a device copy, then a sync), repeated; the latency is the median (and p99) wall time of one
copy, the bandwidth SIZE / median time in GB/s (10^9 bytes per second; D2D counts the bytes
once, as nvbandwidth does, not read + write as bandwidthTest does).

The `native` row is the same copy without gpuremote: NumPy copies between page-aligned buffers
when this machine has no GPU (what the emulated device does), CuPy copies on a local GPU when it
has one. Each remote transport gets its own session with the daemon, asked for by name;
a transport the daemon or this host cannot offer is reported as unavailable and skipped.
"""

from __future__ import annotations

import json
import os
import time

import click
import numpy

from gpuremote._config import parse_size

DIRECTIONS = ("h2d", "d2h", "d2d")
MEMORIES = ("pageable", "pinned")
REMOTE = ("auto", "grpc", "socket", "tcp", "unix", "shm", "verbs")
ALL = ("grpc", "socket", "shm", "verbs")
MAX_SIZE = 16 * 2**30
# Per-measurement budget of the automatic iteration count: short default runs, yet enough
# samples for a median (and a p99 that means something for small copies).
_MIN_ITERS, _MAX_ITERS, _BUDGET_S = 5, 200, 0.05


def _csv(allowed: tuple[str, ...], what: str):
    def convert(ctx, param, value):
        items = [v.strip().lower() for v in value.split(",") if v.strip()]
        bad = [v for v in items if v not in allowed]
        if bad or not items:
            raise click.BadParameter(f"{bad[0] if bad else value!r} is not a {what}: use a comma-separated list of "
                                     f"{', '.join(allowed)}")
        return list(dict.fromkeys(items))
    return convert


def parse_sizes(text: str, factor: int = 4) -> list[int]:
    """'4B:1GiB' -> 4, 4*factor, ... up to and including 1GiB; '4KiB,1MiB' -> those; '64KiB' -> one."""
    text = text.strip()
    if ":" in text:
        parts = text.split(":")
        if len(parts) != 2 or not all(p.strip() for p in parts):
            raise ValueError(f"{text!r} is not a size range: use LOW:HIGH, e.g. 4B:1GiB")
        low, high = parse_size(parts[0]), parse_size(parts[1])
        if low < 1:
            raise ValueError(f"the smallest size must be at least 1 byte, got {parts[0].strip()!r}")
        if high < low:
            raise ValueError(f"the range {text!r} ends below its start")
        sizes = []
        size = low
        while size < high:
            sizes.append(size)
            size *= factor
        sizes.append(high)
    else:
        sizes = [parse_size(p) for p in text.split(",") if p.strip()]
        if not sizes:
            raise ValueError("no sizes given")
        if min(sizes) < 1:
            raise ValueError("sizes must be at least 1 byte")
    if max(sizes) > MAX_SIZE:
        raise ValueError(f"sizes above {MAX_SIZE // 2**30} GiB are not supported")
    return sorted(set(sizes))


def human(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B" if n < 1024 else f"{n / 1024:.1f} KiB"


def summarize(samples_s: list[float], size: int) -> dict:
    us = numpy.asarray(samples_s) * 1e6
    median = float(numpy.median(us))
    return {"iterations": int(us.size), "latency_us_median": median,
            "latency_us_p99": float(numpy.percentile(us, 99)),
            "bandwidth_gbps": size / (median * 1e-6) / 1e9 if median > 0 else 0.0}


# -- what is measured ------------------------------------------------------------------------
class _Ref:
    """A remote array named by handle, as the client session encodes arguments."""

    __slots__ = ("_gr_session", "_gr_handle")

    def __init__(self, session, handle):
        self._gr_session, self._gr_handle = session, handle


def _pinned(nbytes: int) -> numpy.ndarray:
    from gpuremote.cupyx import empty_pinned
    return empty_pinned((nbytes,), numpy.uint8)


class Remote:
    """Copies through one gpuremote session."""

    def __init__(self, address: str, name: str):
        from gpuremote.client.session import Session
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")        # an unavailable transport is reported below instead
            self.session = Session(address, client_name="gpuremote bench",
                                   transport=None if name == "auto" else name)
        s = self.session
        via = getattr(s._link, "via", "")
        self.actual = s.transport + (f"/{via}" if s.transport == "socket" else "")
        wanted = {"socket": "socket", "tcp": "socket/tcp", "unix": "socket/unix"}.get(name, name)
        self.unavailable = "" if name == "auto" or self.actual.startswith(wanted) else \
            f"unavailable here (the session fell back to {self.actual})"
        self.label = f"auto ({self.actual})" if name == "auto" else name
        self.device = s.devices[0].index if s.devices else 0
        self.src = self.dst = None

    def _sync(self) -> None:
        self.session.sync(self.device, 0, False, "bench")

    def prepare(self, host: numpy.ndarray, need_src: bool = True) -> None:
        self.release()
        if not need_src:                  # H2D alone needs no source array on the device
            return
        s = self.session
        self.src = s.new_handle()
        s.upload(self.src, host, self.device, 0, "bench")
        self._sync()

    def release(self) -> None:
        if self.src is not None:
            self.session.release(self.src)
            self.src = None

    def h2d(self, host: numpy.ndarray, out: numpy.ndarray | None) -> None:
        s = self.session
        h = s.new_handle()
        s.upload(h, host, self.device, 0, "bench")
        self._sync()
        s.release(h)

    def d2h(self, host: numpy.ndarray, out: numpy.ndarray | None) -> None:
        # as ndarray.get(out=) does: a small array in a QUICK round trip, a large one received (or, pinned,
        # written by the daemon) in `out`
        result = self.session.fetch(self.src, self.device, 0, "bench", into=out, nbytes=host.nbytes)
        if out is not None and result is not out:
            numpy.copyto(out, result)

    def d2d(self, host: numpy.ndarray, out: numpy.ndarray | None) -> None:
        s = self.session
        h = s.new_handle()
        s.call("copy", (_Ref(s, self.src),), {}, [h], self.device, 0, "bench")
        self._sync()
        s.release(h)

    def close(self) -> None:
        self.release()
        self.session.close()


class Native:
    """The same copies without gpuremote: CuPy on a local GPU, else NumPy (the emulated device)."""

    label = "native"
    unavailable = ""

    def __init__(self):
        self.cupy = _local_cupy()
        self.actual = "cupy" if self.cupy is not None else "numpy"
        self.dev = self.dev2 = None

    def prepare(self, host: numpy.ndarray, need_src: bool = True) -> None:
        n = host.size
        if self.cupy is not None:
            self.dev = self.cupy.asarray(host)
            self.dev2 = self.cupy.empty_like(self.dev)
        else:
            from gpuremote.transport import buffers
            self.dev = buffers.Segment(buffers.size_class(n), False).array(n)
            self.dev2 = buffers.Segment(buffers.size_class(n), False).array(n)
            self.dev[:] = host
            self.dev2[:] = host

    def release(self) -> None:
        self.dev = self.dev2 = None

    def _sync(self) -> None:
        if self.cupy is not None:
            self.cupy.cuda.Device().synchronize()

    def h2d(self, host, out) -> None:
        if self.cupy is not None:
            self.dev.set(host)
        else:
            numpy.copyto(self.dev, host)
        self._sync()

    def d2h(self, host, out) -> None:
        target = out if out is not None else host
        if self.cupy is not None:
            self.dev.get(out=target)
        else:
            numpy.copyto(target, self.dev)

    def d2d(self, host, out) -> None:
        if self.cupy is not None:
            self.cupy.copyto(self.dev2, self.dev)
        else:
            numpy.copyto(self.dev2, self.dev)
        self._sync()

    def pinned(self, nbytes: int) -> numpy.ndarray:
        if self.cupy is not None:
            import cupyx
            return cupyx.empty_pinned((nbytes,), numpy.uint8)
        return _pinned(nbytes)

    def close(self) -> None:
        self.release()


def _local_cupy():
    """Real CuPy with a usable GPU, or None (gpuremote's own `cupy` alias does not count)."""
    try:
        import cupy
        if "gpuremote" in (getattr(cupy, "__file__", "") or "") or cupy.cuda.runtime.getDeviceCount() < 1:
            return None
        return cupy
    except Exception:
        return None


def measure(target, direction: str, host: numpy.ndarray, out, iterations: int | None) -> list[float]:
    op = getattr(target, direction)
    clock = time.perf_counter
    op(host, out)                                 # warm-up: first use of buffers and code paths
    samples = []
    deadline = clock() + _BUDGET_S
    limit = iterations or _MAX_ITERS
    while len(samples) < limit:
        t0 = clock()
        op(host, out)
        samples.append(clock() - t0)
        if iterations is None and len(samples) >= _MIN_ITERS and clock() > deadline:
            break
    return samples


# -- output ------------------------------------------------------------------------------------
def render(records: list[dict], labels: list[str], console) -> None:
    from rich.table import Table
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in records:
        groups.setdefault((r["memory"], r["direction"]), []).append(r)
    for (memory, direction), rows in groups.items():
        t = Table(title=f"{direction.upper()} memcpy, {memory} host memory",
                  caption="latency: median (p99) us of one blocking copy; GB/s = size / median, 10^9 B/s")
        t.add_column("size", justify="right")
        present = [lab for lab in labels if any(r["transport"] == lab for r in rows)]
        for lab in present:
            t.add_column(f"{lab}\nus", justify="right")
            t.add_column(f"{lab}\nGB/s", justify="right")
        by = {(r["transport"], r["size_bytes"]): r for r in rows}
        for size in sorted({r["size_bytes"] for r in rows}):
            cells = [human(size)]
            for lab in present:
                r = by.get((lab, size))
                if r is None:
                    cells += ["-", "-"]
                else:
                    cells += [f"{r['latency_us_median']:,.1f} ({r['latency_us_p99']:,.0f})",
                              f"{r['bandwidth_gbps']:.3g}"]
            t.add_row(*cells)
        console.print(t)


def plot(records: list[dict], path: str) -> str:
    """Log-log bandwidth and latency against size: a column per direction, two rows per memory kind;
    returns the file written (matplotlib adds ".png" to a path without an extension)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    directions = [d for d in DIRECTIONS if any(r["direction"] == d for r in records)]
    memories = [m for m in MEMORIES if any(r["memory"] == m for r in records)]
    fig, axes = plt.subplots(2 * len(memories), len(directions), squeeze=False,
                             figsize=(5 * len(directions), 3.6 * 2 * len(memories)))
    for m, memory in enumerate(memories):
        for col, direction in enumerate(directions):
            rows = [r for r in records if (r["memory"], r["direction"]) == (memory, direction)]
            for label in dict.fromkeys(r["transport"] for r in rows):
                mine = sorted((r for r in rows if r["transport"] == label), key=lambda r: r["size_bytes"])
                x = [r["size_bytes"] for r in mine]
                axes[2 * m][col].plot(x, [max(r["bandwidth_gbps"], 1e-6) for r in mine], marker="o", label=label)
                axes[2 * m + 1][col].plot(x, [r["latency_us_median"] for r in mine], marker="o", label=label)
            for row, ylabel in ((2 * m, "bandwidth (GB/s)"), (2 * m + 1, "latency, median (us)")):
                ax = axes[row][col]
                ax.set_xscale("log", base=2)
                ax.set_yscale("log")
                ax.set_xlabel("copy size (bytes)")
                ax.set_ylabel(ylabel)
                ax.set_title(f"{direction.upper()}, {memory} host memory")
                ax.grid(True, which="both", alpha=0.3)
                ax.legend(fontsize="small")
    fig.suptitle("gpuremote bench memcpy")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path if os.path.splitext(path)[1] else path + ".png"    # (matplotlib adds the default format's)
    plt.close(fig)


# -- the command -----------------------------------------------------------------------------------
@click.group()
def bench():
    """Measure gpuremote against the native baseline."""


@bench.command()
@click.option("--daemon", "daemon_address", metavar="HOST:PORT",
              help="Measure against this daemon (default: GPUREMOTE_DAEMON, else --local).")
@click.option("--local", is_flag=True, help="Start a daemon on this host for the run, as a child process (its "
              "GPU, else an emulated device), and stop it at the end.")
@click.option("--transport", "transports", default="all", show_default=True,
              callback=_csv(("all", "native") + REMOTE, "transport"),
              help="Comma-separated: all (every remote transport), auto, grpc, socket, tcp, unix, shm, verbs; the "
                   "native baseline is always measured.")
@click.option("--direction", "directions", default="h2d,d2h,d2d", show_default=True,
              callback=_csv(DIRECTIONS, "direction"), help="Comma-separated: h2d, d2h, d2d.")
@click.option("--memory", "memories", default="pageable", show_default=True,
              callback=_csv(MEMORIES, "host memory kind"),
              help="Comma-separated: pageable (numpy arrays), pinned (cupyx.empty_pinned).")
@click.option("--sizes", default="4B:16MiB", show_default=True, metavar="LOW:HIGH|S1,S2,..",
              help="Copy sizes: a range swept in powers of --factor (e.g. 4B:1GiB), or a list (4KiB,1MiB).")
@click.option("--factor", type=click.Choice(["2", "4"]), default="4", show_default=True,
              help="Step of a size range.")
@click.option("--iterations", type=click.IntRange(1, 100_000), default=None,
              help="Timed copies per size (default: as many as fit in ~50 ms, 5 to 200).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write the records as JSON to FILE.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False),
              help="Write a log-log plot to FILE.png (needs matplotlib: pip install 'gpuremote[plot]').")
def memcpy(daemon_address, local, transports, directions, memories, sizes, factor, iterations, json_path, plot_path):
    """cudaMemcpy-style latency and bandwidth: native vs each gpuremote transport."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    if daemon_address and local:
        raise click.UsageError("give --daemon HOST:PORT or --local, not both")
    try:
        size_list = parse_sizes(sizes, int(factor))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--sizes")
    if plot_path:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise click.ClickException("--plot needs matplotlib, which is not installed: pip install 'gpuremote[plot]'")
    for path, flag in ((json_path, "--json"), (plot_path, "--plot")):
        folder = os.path.dirname(os.path.abspath(path)) if path else ""
        if path and not os.path.isdir(folder):
            raise click.BadParameter(f"folder {folder} does not exist", param_hint=flag)
    names = [t for t in transports if t != "native"]
    if "all" in names:
        names = list(dict.fromkeys([n for n in names if n != "all"] + list(ALL)))

    console = Console()
    if not console.is_terminal:       # a file or pipe: no wrapping of the wide tables
        console = Console(width=max(100, 24 + 26 * (1 + len(names))))
    err = Console(stderr=True)
    address = daemon_address or (None if local else os.environ.get("GPUREMOTE_DAEMON", "").split(",")[0].strip())
    local_daemon = None
    targets: list = [Native()]
    try:
        if names and not address:
            from gpuremote.launcher import ChildDaemon
            memory = max(2 * 2**30, 4 * max(size_list))
            try:
                local_daemon = ChildDaemon(memory)
            except Exception as exc:
                raise click.ClickException(f"cannot start a local daemon: {exc}")
            address = local_daemon.address
        seen = set()
        for name in names:
            try:
                target = Remote(address, name)
            except Exception as exc:
                raise click.ClickException(f"cannot open a session with the daemon at {address}: {exc}")
            if target.unavailable or target.actual in seen and name != "auto":
                why = target.unavailable or f"same path as another row ({target.actual})"
                err.print(f"[yellow]transport {name}: {why}; skipped[/]")
                target.close()
                continue
            seen.add(target.actual)
            targets.append(target)
        _check_room(targets, size_list, memories)
        where = f"daemon {address}" + (f" (started here, pid {local_daemon.proc.pid})" if local_daemon else "")
        err.print(f"gpuremote bench memcpy: {where}; native = {targets[0].actual}; "
                  f"{len(size_list)} sizes {human(size_list[0])}..{human(size_list[-1])}")
        records = _run(targets, directions, memories, size_list, iterations, err, Progress, BarColumn,
                       MofNCompleteColumn, TextColumn, TimeElapsedColumn)
    finally:
        for t in targets:
            try:
                t.close()
            except Exception:
                pass
        if local_daemon is not None:
            local_daemon.stop()
    labels = [t.label for t in targets]
    render(records, labels, console)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(records, f, indent=1)
        err.print(f"wrote {len(records)} records to {json_path}")
    if plot_path:
        err.print(f"wrote the plot to {plot(records, plot_path)}")


def _check_room(targets, sizes: list[int], memories: list[str]) -> None:
    """Refuse, before measuring anything, sizes the run cannot hold: on the host a source and a
    destination buffer of the largest size, and as many again pinned; on each daemon's device a
    source and a destination array (a device-to-device copy needs both)."""
    biggest = max(sizes)
    host_need = biggest * (4 if "pinned" in memories else 2)
    host_total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if host_need > host_total * 0.8:
        raise click.ClickException(f"--sizes up to {human(biggest)} need about {human(host_need)} of host memory "
                                   f"for the copies' buffers; this host has {host_total / 2**30:.1f} GiB: give smaller sizes")
    for target in targets:
        if type(target) is Remote:
            capacity = target.session.capacity.get(target.device, 0)
            if 2 * biggest > capacity:
                raise click.ClickException(f"--sizes up to {human(biggest)} need {human(2 * biggest)} on the device "
                                           f"(a source and a destination), and the daemon's device {target.device} "
                                           f"has {human(capacity)} for this session: give smaller sizes")


def _run(targets, directions, memories, sizes, iterations, err, Progress, BarColumn, MofNCompleteColumn,
         TextColumn, TimeElapsedColumn) -> list[dict]:
    records = []
    total = len(targets) * len(directions) * len(memories) * len(sizes)
    biggest = max(sizes)
    pageable = numpy.ones(biggest, numpy.uint8)            # touched once, as an application's data is
    pageable_out = numpy.empty(biggest, numpy.uint8)
    pageable_out.fill(0)                                   # touched too (numpy.zeros maps untouched pages)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True) as progress:
        task = progress.add_task("measuring", total=total)
        for memory in memories:
            pinned = {}
            for size in sizes:
                for target in targets:
                    if memory == "pinned":
                        key = type(target) is Native
                        if key not in pinned:
                            maker = target.pinned if key else _pinned
                            pinned[key] = (maker(biggest), maker(biggest))
                            pinned[key][0][:] = 1
                            pinned[key][1][:] = 0
                        host, out = pinned[key][0][:size], pinned[key][1][:size]
                    else:
                        host, out = pageable[:size], None
                    target.prepare(host, need_src=any(d != "h2d" for d in directions))
                    for direction in directions:
                        progress.update(task, description=f"{target.label:>12} {direction} {memory} {human(size)}")
                        samples = measure(target, direction, host,
                                          out if out is not None else (pageable_out[:size] if type(target) is Native
                                                                       else None), iterations)
                        records.append({"transport": target.label, "direction": direction, "memory": memory,
                                        "size_bytes": size, **summarize(samples, size)})
                        progress.advance(task)
                    target.release()
    order = {t.label: i for i, t in enumerate(targets)}
    records.sort(key=lambda r: (MEMORIES.index(r["memory"]), DIRECTIONS.index(r["direction"]), r["size_bytes"],
                                order[r["transport"]]))
    return [{k: r[k] for k in ("transport", "direction", "memory", "size_bytes", "iterations", "latency_us_median",
                               "latency_us_p99", "bandwidth_gbps")} for r in records]
