"""The `gpuremote` command line."""

from __future__ import annotations

import logging
import sys

import click

from gpuremote import __version__
from gpuremote._config import DEFAULTS, parse_size
from gpuremote.cli_common import seconds_not_nan, stop_on_signals
from gpuremote.cli_member import member_options
from gpuremote.cli_security import security_options


class _Size(click.ParamType):
    name = "size"

    def convert(self, value, param, ctx):
        try:
            return parse_size(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def _device_list(ctx, param, value):
    if value is None:
        return None
    try:
        devices = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of device indices, e.g. 0,1")
    if not devices or any(d < 0 for d in devices):
        raise click.BadParameter("device indices are non-negative integers, e.g. 0,1")
    return devices


def _listen(ctx, param, value):
    host, sep, port = value.rpartition(":")
    if sep and host and port.isdigit() and int(port) > 65535:
        raise click.BadParameter(f"port {int(port)} in {value!r} is out of range: use a port from 1 to 65535, "
                                 "or 0 for any free port")
    if not sep or not host or not port.isdigit():
        raise click.BadParameter(f"{value!r} is not HOST:PORT (e.g. 127.0.0.1:7200, 0.0.0.0:7200, or port 0 "
                                 "for any free port)")
    return value


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpuremote")
def main():
    """gpuremote: use GPUs in other machines, or slices of one, from unmodified CuPy programs."""


@main.command()
@click.option("--listen", default="127.0.0.1:7200", show_default=True, callback=_listen,
              help="HOST:PORT to serve on; port 0 picks a free port (printed at start).")
@click.option("--backend", type=click.Choice(["auto", "cupy", "emulated"]), default="auto", show_default=True,
              help="cupy runs on real GPUs; emulated keeps arrays in host memory with NumPy; auto takes "
                   "cupy when a CUDA device is usable.")
@click.option("--devices", callback=_device_list, metavar="0,1",
              help="GPU indices to serve (cupy backend); default all.")
@click.option("--emulate", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Number of emulated devices.")
@click.option("--emulate-memory", type=_Size(), default=str(DEFAULTS.emulate_memory), show_default="8GiB",
              help="Memory of each emulated device, e.g. 512MiB or 16GiB.")
@click.option("--max-sessions", type=click.IntRange(1, 4096), default=DEFAULTS.max_sessions, show_default=True,
              help="Most sessions served at once.")
@click.option("--drain-timeout", type=click.FloatRange(0, 24 * 3600), default=DEFAULTS.drain_timeout_s,
              show_default=True, metavar="SECONDS", callback=seconds_not_nan,
              help="On SIGTERM or SIGINT, how long open sessions may keep working (no new ones are opened) "
                   "before they are ended.")
@click.option("-v", "--verbose", is_flag=True, help="Log sessions opening and closing.")
@member_options
@security_options("server")
def daemon(listen, backend, devices, emulate, emulate_memory, max_sessions, drain_timeout, verbose, security,
           membership):
    """Serve this host's GPUs (or emulated devices) to gpuremote clients.

    Clients connect with GPUREMOTE_DAEMON=HOST:PORT or gpuremote.connect("HOST:PORT"); with --pool,
    through the pool (gpuremote run --pool ADDR), presenting its grants.

    SIGTERM or SIGINT shuts down gracefully: the daemon leaves its pool, opens no new sessions,
    lets the open ones work up to --drain-timeout seconds (their clients are told), then ends them
    and frees everything. A second signal ends them at once.
    """
    from gpuremote.daemon.backends import create
    from gpuremote.daemon.server import DaemonServer
    from gpuremote.daemon.session import replay_loop

    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(message)s")
    if emulate_memory <= 0:
        raise click.BadParameter("must be more than 0 bytes", param_hint="--emulate-memory")
    try:
        dev = create(backend, devices, emulate, emulate_memory)
    except Exception as exc:
        hint = (": install CuPy for this machine's CUDA (pip install 'gpuremote[gpu]') and check that "
                "nvidia-smi sees the GPUs, or serve emulated devices with --backend emulated"
                if backend == "cupy" and not isinstance(exc, ValueError) else "")
        raise click.ClickException(f"cannot start the {backend} backend ({exc}){hint}")
    try:
        server = DaemonServer(dev, listen, max_sessions, admission=membership.admission(dev),
                              security=security).start()
    except (OSError, RuntimeError) as exc:
        raise click.ClickException(f"cannot listen on {listen}: {exc}. Is the port already in use (another "
                                   "gpuremote daemon?) or HOST not an address of this machine? Pick a free port "
                                   "(or port 0 for any) and a local address such as 127.0.0.1 or 0.0.0.0")
    names = ", ".join(f"{p.index}: {p.name} ({p.total_memory / 2**30:.1f} GiB)" for p in dev.props)
    stop = stop_on_signals()    # before the address is announced: a signal right after it stops us cleanly
    click.echo(f"gpuremote daemon {__version__} listening on {server.address} "
               f"(backend {dev.kind}; devices {names}; replay loop {replay_loop(dev)}; {security.describe()})",
               err=False)
    sys.stdout.flush()
    try:
        membership.start(server, listen)    # --pool: join it; --metrics-port: serve metrics
    except BaseException:
        server.stop(grace=0)
        raise
    stop.wait()
    server.service.start_drain(drain_timeout)   # no new sessions from here on
    membership.leave()                          # and the pool places nothing more here
    server.drain(drain_timeout, stop.again, say=lambda line: (click.echo(f"gpuremote daemon: {line}"),
                                                             sys.stdout.flush()))
    membership.stop()
    server.stop(grace=1.0)
    click.echo("gpuremote daemon stopped")


from gpuremote.cli_pool import pool  # noqa: E402
from gpuremote.cli_run import run  # noqa: E402
from gpuremote.cli_bench import bench  # noqa: E402
from gpuremote.cli_smi import smi  # noqa: E402
from gpuremote.cli_local import local  # noqa: E402

main.add_command(run)
main.add_command(bench)
main.add_command(pool)
main.add_command(smi)
main.add_command(local)

if __name__ == "__main__":
    main()
