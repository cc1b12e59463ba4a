"""`gpuremote local`: a pool and one daemon of this host in one foreground process, for trying the pool.

The daemon (auto backend: this host's GPUs, else emulated devices) joins the pool in-process
through the same PoolAgent as `gpuremote daemon --pool`. Both servers require a random token
made for this run (a file in a private temporary folder, removed at exit); the printed commands
name it in GPUREMOTE_TOKEN_FILE. The pool's state is in memory unless --state names a file.
Stops cleanly on SIGINT or SIGTERM: the agent, then the daemon (freeing every session), then the pool.

Kept out of cli.py (which imports this module); this module must not import gpuremote.cli.
"""

from __future__ import annotations

import logging
import sys

import click

from gpuremote import __version__
from gpuremote._config import DEFAULTS, parse_size
from gpuremote.cli_common import lease_ttl_seconds, stop_on_signals
from gpuremote.pool.placement import POLICIES


def _listen(ctx, param, value):
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise click.BadParameter(f"{value!r} is not HOST:PORT with a port from 0 to 65535 (0 picks a free one)")
    return value


def _size(ctx, param, value):
    try:
        size = parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc))
    if size <= 0:
        raise click.BadParameter("must be more than 0 bytes, e.g. 8GiB")
    return size


@click.command()
@click.option("--pool-listen", default="127.0.0.1:7100", show_default=True, callback=_listen, metavar="HOST:PORT",
              help="Where the pool listens (port 0 picks a free one).")
@click.option("--daemon-listen", default="127.0.0.1:7200", show_default=True, callback=_listen, metavar="HOST:PORT",
              help="Where the daemon listens (port 0 picks a free one).")
@click.option("--backend", type=click.Choice(["auto", "cupy", "emulated"]), default="auto", show_default=True,
              help="auto takes this host's GPUs when CUDA works, else emulated devices.")
@click.option("--emulate", type=click.IntRange(1, 64), default=2, show_default=True,
              help="Number of emulated devices (emulated backend).")
@click.option("--emulate-memory", default="8GiB", show_default=True, callback=_size, metavar="SIZE",
              help="Memory of each emulated device.")
@click.option("--state", "state_path", default=":memory:", show_default=True, metavar="FILE",
              help="The pool's state file; in memory by default (leases end with the process).")
@click.option("--lease-ttl", type=float, default=DEFAULTS.pool_lease_ttl_s, show_default=True, callback=lease_ttl_seconds,
              metavar="SECONDS", help="Lease lifetime without renewal.")
@click.option("--policy", type=click.Choice(POLICIES), default="pack", show_default=True, help="Placement policy.")
@click.option("--metrics-port", type=click.IntRange(0, 65535), metavar="PORT",
              help="Serve the pool's and the daemon's Prometheus metrics on PORT (0 picks a free one).")
@click.option("-v", "--verbose", is_flag=True, help="Log leases, registrations and sessions.")
def local(pool_listen, daemon_listen, backend, emulate, emulate_memory, state_path, lease_ttl, policy,
          metrics_port, verbose):
    """Run a pool and a daemon of this host in the foreground, and print how to use them."""
    from gpuremote.daemon.admission import Admission
    from gpuremote.daemon.backends import create
    from gpuremote.daemon.pool_agent import PoolAgent
    from gpuremote.daemon.server import DaemonServer
    from gpuremote.pool.server import PoolServer
    from gpuremote.pool.store import StoreError
    from gpuremote.transport import auth

    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(message)s")
    try:
        dev = create(backend, None, emulate, emulate_memory)
    except Exception as exc:
        raise click.ClickException(f"cannot start the {backend} backend ({exc})")
    token = auth.EphemeralToken()
    started: list = []          # what to stop, in reverse order

    def stop_all() -> None:
        for stop in reversed(started):
            try:
                stop()
            except Exception as exc:   # stop the rest regardless
                click.echo(f"gpuremote local: stopping: {exc}", err=True)
        token.remove()

    try:
        try:
            pool = PoolServer(pool_listen, state_path, lease_ttl, policy, security=token.server_security()).start()
        except StoreError as exc:
            raise click.ClickException(str(exc))
        except (OSError, RuntimeError) as exc:
            raise click.ClickException(f"the pool cannot listen on {pool_listen}: {exc}; is the port in use? Pick "
                                       "another with --pool-listen (port 0 for any)")
        started.append(lambda: pool.stop(grace=1.0))
        try:
            daemon = DaemonServer(dev, daemon_listen, admission=Admission(dev, pool.address),
                                  security=token.server_security()).start()
        except (OSError, RuntimeError) as exc:
            raise click.ClickException(f"the daemon cannot listen on {daemon_listen}: {exc}; is the port in use? "
                                       "Pick another with --daemon-listen (port 0 for any)")
        started.append(lambda: daemon.stop(grace=1.0))
        agent = PoolAgent(daemon.service, pool.address, daemon.address, security=auth.ClientSecurity(token=token.token))
        agent.start()
        started.append(agent.stop)
        if not agent.registered.wait(DEFAULTS.pool_rpc_timeout_s * 2):
            raise click.ClickException(f"the daemon could not register with the pool: {agent.last_error}")
        if metrics_port is not None:
            from gpuremote.metrics import DaemonCollector, MetricsServer, PoolCollector
            try:
                metrics = MetricsServer(metrics_port, PoolCollector(pool.pool),
                                        DaemonCollector(daemon.service, lambda: agent.host_id),
                                        addr=pool_listen.rpartition(":")[0])
            except OSError as exc:
                raise click.ClickException(f"cannot serve metrics on port {metrics_port}: {exc}")
            started.append(metrics.stop)
    except BaseException:
        stop_all()
        raise
    names = ", ".join(f"{p.index}: {p.name} ({p.total_memory / 2**30:.1f} GiB)" for p in dev.props)
    env = f"GPUREMOTE_POOL={pool.address} GPUREMOTE_TOKEN_FILE={token.path}"
    lines = [f"gpuremote local {__version__}: pool listening on {pool.address}, daemon listening on {daemon.address} "
             f"(backend {dev.kind}; devices {names}; lease TTL {lease_ttl:g} s)"]
    if metrics_port is not None:
        lines.append(f"metrics on http://{pool_listen.rpartition(':')[0]}:{metrics.port}/metrics")
    lines += ["Use it from another shell:",
              f"  export {env}",
              "  gpuremote run -p 0.5 -- python train.py        # half a device, through the pool",
              "  gpuremote run -n 2 -- python train.py          # two whole devices",
              "  gpuremote smi                                  # hosts, devices, sessions, leases",
              f"(or name them: gpuremote run --pool {pool.address} ..., gpuremote smi --pool {pool.address})",
              "Stop with Ctrl-C."]
    stop = stop_on_signals()    # before the addresses are announced: a signal right after them stops us cleanly
    click.echo("\n".join(lines))
    sys.stdout.flush()
    stop.wait()
    stop_all()
    click.echo("gpuremote local stopped")
