"""The `gpuremote run` command (options, validation, the statistics summary)."""

from __future__ import annotations

import json
import os
import sys

import click

from gpuremote._config import DEFAULTS, parse_size
from gpuremote.cli_common import seconds_not_nan
from gpuremote.cli_security import security_options


def _fraction(ctx, param, value):
    if value is not None and not 0 < value <= 1:
        raise click.BadParameter(f"{value} is not a fraction of a device: use a number in (0, 1], e.g. 0.5")
    return value


def _memory(ctx, param, value):
    if value is None:
        return None
    try:
        size = parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc))
    if size <= 0:
        raise click.BadParameter("must be more than 0 bytes, e.g. 4GiB")
    return size


def _filters(ctx, param, value):
    from gpuremote.pool.placement import RequestError, parse_filter
    for text in value:
        try:
            parse_filter(text)
        except RequestError as exc:
            raise click.BadParameter(str(exc))
    return list(value)


def _addresses(ctx, param, value):
    if value is None:
        return None
    out = [a.strip() for a in value.split(",") if a.strip()]
    for a in out:
        host, sep, port = a.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise click.BadParameter(f"{a!r} is not HOST:PORT")
    if not out:
        raise click.BadParameter("give at least one HOST:PORT")
    return out


@click.command(context_settings={"ignore_unknown_options": False, "allow_interspersed_args": False})
@click.option("-n", "--num-devices", "count", type=click.IntRange(min=1), default=1, show_default=True,
              help="Number of devices the command gets (cupy.cuda.Device(0..n-1)).")
@click.option("-p", "--partial", "fraction", type=float, callback=_fraction, metavar="FRACTION",
              help="Share of each device, in (0, 1]: that share of its memory (and, through a pool, of its compute time).")
@click.option("-m", "--memory", callback=_memory, metavar="SIZE",
              help="Memory of each device instead of a share, e.g. 4GiB.")
@click.option("--daemon", "daemons", callback=_addresses, metavar="ADDR[,ADDR...]",
              help="Use these daemons' devices (default: GPUREMOTE_DAEMON).")
@click.option("--pool", metavar="ADDR", callback=lambda ctx, param, v: v and _addresses(ctx, param, v)[0],
              help="Allocate through a pool (default: GPUREMOTE_POOL).")
@click.option("--local", is_flag=True, help="Start an embedded daemon for this command (the default when "
                                           "nothing is configured): the host's GPU, else an emulated device.")
@click.option("--wait", type=click.FloatRange(min=0, max=DEFAULTS.pool_max_wait_s), default=0, show_default=True,
              metavar="SECONDS", callback=seconds_not_nan,
              help=f"How long to wait in the pool's queue for free capacity (at most {DEFAULTS.pool_max_wait_s:g} s, "
                   "the pool's own limit).")
@click.option("--filter", "filters", multiple=True, callback=_filters, metavar="FILTER",
              help="Where the pool may place the devices (repeatable, all must hold): host=NAME, "
                   "device.name=TEXT, device.memory>=SIZE, transport=NAME (e.g. rdma).")
@click.option("--stats", "show_stats", is_flag=True,
              help="Print a summary at exit: ops, round trips, bytes each way, time blocked, peak device memory.")
@click.option("--stats-json", type=click.Path(dir_okay=False, writable=True), metavar="FILE",
              help="Write the summary as JSON.")
@security_options()
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run(count, fraction, memory, daemons, pool, local, wait, filters, show_stats, stats_json, command, security):
    """Run COMMAND with `import cupy` served by gpuremote devices.

    \b
      gpuremote run -- python train.py              embedded daemon (GPU or emulated)
      gpuremote run -n 2 --daemon gpu1:7200 -- python train.py
      gpuremote run -m 2GiB --stats -- python train.py
      gpuremote run --pool pool:7100 -n 2 -p 0.5 --filter device.memory>=16GiB -- python train.py

    The command's exit code, output and signals behave as if it ran directly; its devices are
    released when it exits, also when it crashes or is killed.
    """
    from gpuremote import launcher
    from gpuremote.transport import auth

    if fraction is not None and memory is not None:
        raise click.UsageError("give either -p/--partial or -m/--memory, not both")
    pool = pool or os.environ.get("GPUREMOTE_POOL")
    if daemons is None and not local and os.environ.get("GPUREMOTE_DAEMON") and not pool:
        daemons = _addresses(None, None, os.environ["GPUREMOTE_DAEMON"])
    if sum(bool(x) for x in (daemons, pool, local)) > 1:
        raise click.UsageError("choose one source of devices: --daemon, --pool or --local")
    if filters and not pool:
        raise click.UsageError("--filter places devices in a pool: give --pool ADDR (or set GPUREMOTE_POOL)")
    request = launcher.Request(count, fraction, memory)
    # The command (and this process's own channels) get the token file and TLS files as paths.
    auth.update_environ(security.env())
    embedded = lease = None
    extra_env = None
    try:
        if pool:        # the lease is renewed from this process while the command runs, released after it
            lease = launcher.lease_from_pool(pool, request, filters, wait, list(command), security)
            devices, extra_env = lease.devices, lease.env()
        elif daemons:
            devices = launcher.devices_from_daemons(daemons, request)
        else:
            embedded = launcher.EmbeddedDaemon(request)
            devices = embedded.devices
        status, stats = launcher.run_command(list(command), devices, extra_env)
    except launcher.LaunchError as exc:
        error = click.ClickException(str(exc))
        error.exit_code = exc.exit_code
        raise error
    finally:
        if embedded is not None:
            embedded.stop()
        if lease is not None:
            lease.release()
            lease.client.close()
    if stats_json:
        with open(stats_json, "w") as f:
            json.dump(stats, f, indent=2)
    if show_stats:
        _print_stats(stats)
    sys.exit(launcher.exit_like(status))


def _print_stats(stats: dict) -> None:
    from rich.console import Console
    from rich.table import Table
    table = Table(title="gpuremote statistics", show_header=False)
    rows = [("processes using devices", f"{stats.get('processes', 0)}"),
            ("ops issued", f"{stats.get('ops', 0):,}"),
            ("  of them replayed calls", f"{stats.get('replayed', 0):,}"),
            ("messages sent", f"{stats.get('messages', 0):,}"),
            ("blocking round trips", f"{stats.get('round_trips', 0):,}"),
            ("time blocked on the network", f"{stats.get('blocked_s', 0.0):.3f} s"),
            ("bytes host to device", f"{stats.get('bytes_h2d', 0):,}"),
            ("bytes device to host", f"{stats.get('bytes_d2h', 0):,}")]
    if "peak_memory" in stats:
        peak = stats["peak_memory"]
        rows.append(("peak device memory", f"{peak / 2**20:.1f} MiB ({peak:,} bytes)"))
    for k, v in rows:
        table.add_row(k, v)
    Console(stderr=True).print(table)
