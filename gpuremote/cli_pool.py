"""The `gpuremote pool` command: run the pool manager until SIGINT or SIGTERM.

Kept out of cli.py (which imports this module at its end), so this module must not import
gpuremote.cli: `python -m gpuremote.cli` would then import it a second time half-built.
"""

from __future__ import annotations

import logging
import sys

import click

from gpuremote import __version__
from gpuremote._config import DEFAULTS
from gpuremote.cli_common import lease_ttl_seconds, stop_on_signals
from gpuremote.cli_security import security_options
from gpuremote.pool.placement import POLICIES


def _listen(ctx, param, value):
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise click.BadParameter(f"{value!r} is not HOST:PORT (e.g. 127.0.0.1:7100, 0.0.0.0:7100, or port 0 "
                                 "for any free port)")
    if int(port) > 65535:
        raise click.BadParameter(f"port {int(port)} in {value!r} is out of range: use a port from 1 to 65535, "
                                 "or 0 for any free port")
    return value


@click.command()
@click.option("--listen", default="127.0.0.1:7100", show_default=True, callback=_listen,
              help="HOST:PORT to serve on; port 0 picks a free port (printed at start).")
@click.option("--state", "state_path", default="./gpuremote-pool.db", show_default=True,
              type=click.Path(dir_okay=False), metavar="FILE",
              help="SQLite file holding hosts, leases and the grant key; a restart from it keeps every lease.")
@click.option("--lease-ttl", type=float, default=DEFAULTS.pool_lease_ttl_s, show_default=True, callback=lease_ttl_seconds,
              metavar="SECONDS", help="Lease lifetime without renewal: a crashed client's devices return after it.")
@click.option("--policy", type=click.Choice(POLICIES), default="pack", show_default=True,
              help="pack fills the fullest device that fits (keeps whole devices free); spread uses the "
                   "emptiest (less interference).")
@click.option("--oversubscribe-compute", is_flag=True,
              help="Let compute shares on a device sum past 1 (memory is never oversubscribed).")
@click.option("-v", "--verbose", is_flag=True, help="Log registrations, leases, releases and expiries.")
@click.option("--metrics-port", type=click.IntRange(0, 65535), metavar="PORT",
              help="Serve Prometheus metrics at http://HOST:PORT/metrics (0 picks a free port, printed).")
@click.option("--daemon-token-file", metavar="FILE",
              help="Reserve Register, Heartbeat and Deregister (Register hands out the grant key) to daemons "
                   "presenting the secret in FILE (mode 600), so that tenants holding --token-file cannot register.")
@security_options("server")
def pool(listen, state_path, lease_ttl, policy, oversubscribe_compute, verbose, metrics_port, daemon_token_file,
         security):
    """Run the pool manager: daemons register their devices, clients lease devices or shares of them.

    Registering daemons receive the key grants are signed with: require a token and/or client
    certificates (SECURITY.md), and give daemons a token of their own with --daemon-token-file.
    Stops cleanly on SIGINT or SIGTERM; leases survive a restart from the same --state file.
    """
    from gpuremote.pool.server import DAEMON_METHODS, PoolServer
    from gpuremote.pool.store import StoreError
    from gpuremote.transport import auth

    if daemon_token_file:
        try:
            security = security.requiring(DAEMON_METHODS, auth.load_token(daemon_token_file, "--daemon-token-file"))
        except auth.AuthConfigError as exc:
            raise click.BadParameter(str(exc), param_hint=exc.option)

    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(message)s")
    try:
        server = PoolServer(listen, state_path, lease_ttl, policy, oversubscribe_compute, security=security).start()
    except StoreError as exc:
        raise click.ClickException(str(exc))
    except (OSError, RuntimeError) as exc:
        raise click.ClickException(f"cannot listen on {listen}: {exc}. Is the port already in use (another "
                                   "gpuremote pool?) or HOST not an address of this machine? Pick a free port "
                                   "(or port 0 for any) and a local address such as 127.0.0.1 or 0.0.0.0")
    oversub = ", compute oversubscribed" if oversubscribe_compute else ""
    stop = stop_on_signals()    # before the address is announced: a signal right after it stops us cleanly
    click.echo(f"gpuremote pool {__version__} listening on {server.address} (state {state_path}; "
               f"lease TTL {lease_ttl:g} s; policy {policy}{oversub}; {security.describe()})")
    metrics = None
    if metrics_port is not None:     # gpuremote/metrics.py
        from gpuremote.metrics import MetricsServer, PoolCollector
        try:
            metrics = MetricsServer(metrics_port, PoolCollector(server.pool), addr=listen.rpartition(":")[0])
        except OSError as exc:
            server.stop(grace=0)
            raise click.ClickException(f"cannot serve metrics on port {metrics_port}: {exc}; pick a free port, "
                                       "or 0 for any")
        click.echo(f"metrics on http://{listen.rpartition(':')[0]}:{metrics.port}/metrics")
    sys.stdout.flush()
    stop.wait()
    if metrics is not None:
        metrics.stop()
    server.stop(grace=2.0)
    click.echo("gpuremote pool stopped")
