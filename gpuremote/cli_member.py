"""The daemon's pool and metrics flags (`gpuremote daemon --pool ... --metrics-port ...`).

`member_options` adds --pool, --advertise, --host-id, --pool-token-file and --metrics-port to a
command and hands it one validated `membership` argument (a Membership). `Membership.start`
runs after the daemon's server started: the pool agent (gpuremote/daemon/pool_agent.py) and the
metrics endpoint (gpuremote/metrics.py); `stop` ends both. `admission(backend)` must be given to
the daemon server *before* it starts, so that a pool daemon never admits a session without grants.

Kept out of cli.py (which imports this module); this module must not import gpuremote.cli.
"""

from __future__ import annotations

import dataclasses
import functools
import socket
import sys

import click

from gpuremote._config import DEFAULTS


def _host_port(value: str, what: str, port_optional: bool = False) -> tuple[str, str]:
    host, sep, port = value.rpartition(":")
    if port_optional and (not sep or not port.isdigit()):
        return value, ""
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise click.BadParameter(f"{value!r} is not {what} (e.g. gpu1.example.com:7200, a port from 1 to 65535)")
    return host, port


def _pool(ctx, param, value):
    if value is not None:
        _host_port(value, "HOST:PORT")
    return value


def _advertise(ctx, param, value):
    if value is not None:
        host, _ = _host_port(value, "HOST or HOST:PORT", port_optional=True)
        if not host or host in ("0.0.0.0", "::", "[::]"):
            raise click.BadParameter(f"{value!r} is not an address clients can reach: give this host's name or "
                                     "IP address, e.g. gpu1.example.com or 10.0.0.5:7200")
    return value


def _host_id(ctx, param, value):
    if value is not None and not (0 < len(value) <= DEFAULTS.pool_max_text_chars and value.isprintable()):
        raise click.BadParameter(f"a host id is 1 to {DEFAULTS.pool_max_text_chars} printable characters")
    return value


@dataclasses.dataclass
class Membership:
    pool: str | None = None
    advertise: str | None = None
    host_id: str | None = None
    pool_token_file: str | None = None
    metrics_port: int | None = None
    agent: object = None
    metrics: object = None

    def admission(self, backend):
        from gpuremote.daemon.admission import Admission
        return Admission(backend, self.pool)

    def advertised(self, server_address: str) -> str:
        """The address clients reach the daemon at: --advertise (its port defaults to the listening
        one), else the listening address, with this host's name for a wildcard host."""
        listen_host, _, port = server_address.rpartition(":")
        if self.advertise:
            host, _, given = self.advertise.rpartition(":") if ":" in self.advertise else (self.advertise, "", "")
            if given.isdigit():
                return self.advertise
            return f"{self.advertise}:{port}"
        if listen_host in ("0.0.0.0", "::", "[::]", ""):
            return f"{socket.gethostname()}:{port}"
        return server_address

    def start(self, server, listen: str, echo=None) -> None:
        """Join the pool and serve metrics, as the flags ask (after `server` started)."""
        echo = echo or (lambda line: (click.echo(line), sys.stdout.flush()))
        address = self.advertised(server.address)
        if self.pool:
            from gpuremote.daemon.pool_agent import PoolAgent
            from gpuremote.transport import auth
            try:
                security = auth.ClientSecurity.from_options(token_file=self.pool_token_file)
            except auth.AuthConfigError as exc:
                raise click.BadParameter(str(exc), param_hint="--pool-token-file")
            self.agent = PoolAgent(server.service, self.pool, address, self.host_id, security=security,
                                   on_register=echo).start()
        if self.metrics_port is not None:
            from gpuremote.metrics import DaemonCollector, MetricsServer
            host = self.agent.host_id if self.agent is not None else address
            try:
                self.metrics = MetricsServer(self.metrics_port, DaemonCollector(server.service, lambda: host),
                                             addr=listen.rpartition(":")[0].strip("[]") or "0.0.0.0")
            except OSError as exc:
                self.stop()
                raise click.ClickException(f"cannot serve metrics on port {self.metrics_port}: {exc}; pick a free "
                                           "port, or 0 for any")
            echo(f"metrics on http://{listen.rpartition(':')[0]}:{self.metrics.port}/metrics")

    def leave(self) -> None:
        """The daemon shuts down: stop heartbeating and tell the pool to place nothing more here."""
        if self.agent is not None:
            self.agent.leave()

    def stop(self) -> None:
        if self.agent is not None:
            self.agent.stop()
        if self.metrics is not None:
            self.metrics.stop()


def member_options(f):
    """Click decorator: the pool/metrics flags of `gpuremote daemon`, passed on as `membership`."""
    options = [
        click.option("--pool", callback=_pool, metavar="HOST:PORT",
                     help="Join the pool at HOST:PORT: register this daemon's devices, heartbeat their use, and "
                          "serve only sessions with the pool's grants."),
        click.option("--advertise", callback=_advertise, metavar="HOST[:PORT]",
                     help="Address clients reach this daemon at, told to the pool (default: the --listen address; "
                          "this host's name for 0.0.0.0; the port defaults to the listening one)."),
        click.option("--host-id", callback=_host_id, metavar="ID",
                     help="Stable name of this host in the pool (default: the advertised address); keep it across "
                          "restarts so the host's leases stay its own."),
        click.option("--pool-token-file", metavar="FILE",
                     help="Secret presented to the pool (its --daemon-token-file or --token-file); default: "
                          "GPUREMOTE_TOKEN_FILE."),
        click.option("--metrics-port", type=click.IntRange(0, 65535), metavar="PORT",
                     help="Serve Prometheus metrics at http://HOST:PORT/metrics (0 picks a free port, printed)."),
    ]

    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        m = Membership(*(kwargs.pop(k) for k in ("pool", "advertise", "host_id", "pool_token_file",
                                                 "metrics_port")))
        if not m.pool:
            given = [flag for flag, v in (("--advertise", m.advertise), ("--host-id", m.host_id),
                                          ("--pool-token-file", m.pool_token_file)) if v]
            if given:
                raise click.UsageError(f"{', '.join(given)} only apply with --pool ADDR")
        return f(*args, membership=m, **kwargs)

    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper
