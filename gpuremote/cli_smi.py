"""`gpuremote smi`: every host and device of a pool (or one daemon), its memory, utilisation and sessions.

The picture comes from the pool's Status (what each daemon last reported in its heartbeat, at
most a heartbeat old, plus the pool's leases) or from one daemon's Info (live). `--json` prints
a stable document (keys below; new keys may be added, none renamed or removed):

    {"hosts": [{"host_id", "address", "backend", "stale", "draining_s" (seconds left of a shutdown, or null),
                "devices": [{"index", "name", "memory_total", "memory_used", "utilization",
                             "sessions": [{"session_id", "lease_id", "client", "memory_used", "age_s"}]}]}],
     "leases": [{"lease_id", "client", "age_s", "expires_in_s",
                 "grants": [{"host_id", "address", "device", "memory_limit", "compute_share"}]}],
     "waiting": N}

`--watch S` prints it again every S seconds until Ctrl-C (one JSON document per line with --json).
Kept out of cli.py (which imports this module); this module must not import gpuremote.cli.
"""

from __future__ import annotations

import json
import os
import sys
import time

import click
import grpc

from gpuremote._config import DEFAULTS
from gpuremote.cli_security import security_options


def _address(ctx, param, value):
    if value is None:
        return None
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise click.BadParameter(f"{value!r} is not HOST:PORT (e.g. 127.0.0.1:7100)")
    return value


def _period(ctx, param, value):
    if value is not None and not (0.05 <= value <= 3600):
        raise click.BadParameter(f"{value} is not a refresh period: give seconds from 0.05 to 3600, e.g. 2")
    return value


class SmiError(Exception):
    pass


def _device_doc(d, sessions) -> dict:
    return {"index": d.index, "name": d.name, "memory_total": d.memory_total, "memory_used": d.memory_used,
            "utilization": round(d.utilization, 4), "sessions": sessions}


def pool_document(status) -> dict:
    """The smi document of a pool's StatusReply."""
    hosts = []
    for h in status.hosts:
        devices = [_device_doc(d, [{"session_id": s.session_id, "lease_id": s.lease_id, "client": s.client_name,
                                    "memory_used": s.memory_used, "age_s": round(s.age_s, 1)} for s in d.sessions])
                   for d in h.devices]
        hosts.append({"host_id": h.host_id, "address": h.address, "backend": h.backend, "stale": h.stale,
                      "draining_s": None, "devices": devices})     # a draining daemon has left its pool
    leases = [{"lease_id": lease.lease_id, "client": lease.client_name, "age_s": round(lease.age_s, 1),
               "expires_in_s": round(lease.expires_in_s, 1),
               "grants": [{"host_id": g.host_id, "address": g.address, "device": g.device,
                           "memory_limit": g.memory_limit, "compute_share": g.compute_share} for g in lease.grants]}
              for lease in status.leases]
    return {"hosts": hosts, "leases": leases, "waiting": status.waiting}


def daemon_document(address: str, info) -> dict:
    """The smi document of one daemon's InfoReply (sessions listed as the daemon's heartbeats list them)."""
    from gpuremote.daemon.pool_agent import shown_on
    devices = []
    for d in info.devices:
        sessions = [{"session_id": s.session_id, "lease_id": s.lease_id, "client": s.client_name,
                     "memory_used": s.memory_used.get(d.index, 0), "age_s": round(s.age_s, 1)}
                    for s in info.sessions
                    if shown_on(d.index, s.devices or [x.index for x in info.devices], s.lease_id, s.memory_used)]
        devices.append(_device_doc(d, sessions))
    draining = round(info.drain_remaining_s, 1) if info.draining else None
    return {"hosts": [{"host_id": address, "address": address, "backend": info.backend, "stale": False,
                       "draining_s": draining, "devices": devices}], "leases": [], "waiting": 0}


class Source:
    """Where the picture comes from: a pool (Status) or one daemon (Info); connects once."""

    def __init__(self, pool: str | None, daemon: str | None, security):
        self.pool, self.daemon = pool, daemon
        from gpuremote.transport import auth
        from gpuremote.pool.channel import channel_options
        self.channel = auth.channel(pool or daemon, security, channel_options())
        what = "pool" if pool else "daemon"
        from gpuremote.pool.channel import connect
        why = connect(self.channel, DEFAULTS.pool_connect_timeout_s)
        if why is not None:
            self.channel.close()
            raise SmiError(f"cannot reach the gpuremote {what} at {pool or daemon} ({why}): check that "
                           f"`gpuremote {what}` runs there and that the address and port are right")

    def document(self) -> dict:
        from gpuremote.v1 import daemon_pb2_grpc, pool_pb2, pool_pb2_grpc
        from gpuremote.wire import pb
        try:
            if self.pool:
                status = pool_pb2_grpc.PoolStub(self.channel).Status(pool_pb2.StatusRequest(),
                                                                     timeout=DEFAULTS.pool_rpc_timeout_s)
                return pool_document(status)
            info = daemon_pb2_grpc.DaemonStub(self.channel).Info(pb.InfoRequest(), timeout=DEFAULTS.pool_rpc_timeout_s)
            return daemon_document(self.daemon, info)
        except grpc.RpcError as exc:
            raise SmiError(f"the {'pool' if self.pool else 'daemon'} at {self.pool or self.daemon} did not answer "
                           f"({exc.code().name.lower()}: {exc.details()})") from None

    def close(self) -> None:
        self.channel.close()


def _size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**28 else f"{n / 2**20:.1f} MiB"


def _age(s: float) -> str:
    return f"{s:.0f}s" if s < 120 else f"{s / 60:.0f}m" if s < 7200 else f"{s / 3600:.1f}h"


def render(doc: dict, title: str):
    """Rich tables for a document: devices with their sessions, then leases."""
    from rich.console import Group
    from rich.table import Table
    shares = {(lease["lease_id"], g["host_id"], g["device"]): g["compute_share"]
              for lease in doc["leases"] for g in lease["grants"]}
    devices = Table(title=title, title_justify="left")
    for col, justify in (("Host", "left"), ("Dev", "right"), ("Name", "left"), ("Memory used / total", "right"),
                         ("Util", "right"), ("Sessions: client, lease (share), memory, age", "left")):
        devices.add_column(col, justify=justify)
    for h in doc["hosts"]:
        host = f"{h['host_id']}\n{h['address']} ({h['backend']})" if h["host_id"] != h["address"] else \
            f"{h['address']} ({h['backend']})"
        if h["stale"]:
            host += "\n[red]stale[/red]"
        if h.get("draining_s") is not None:
            host += f"\n[yellow]shutting down, {h['draining_s']:.0f}s left[/yellow]"
        for d in h["devices"]:
            lines = []
            for s in d["sessions"]:
                share = shares.get((s["lease_id"], h["host_id"], d["index"]))
                lease = f"{s['lease_id'][:8]}" + (f" ({share:g})" if share is not None else "") if s["lease_id"] \
                    else "no lease"
                lines.append(f"{s['client']}, {lease}, {_size(s['memory_used'])}, {_age(s['age_s'])}")
            devices.add_row(host, str(d["index"]), d["name"],
                            f"{_size(d['memory_used'])} / {_size(d['memory_total'])}",
                            f"{d['utilization'] * 100:.0f}%", "\n".join(lines) or "-")
            host = ""
    parts = [devices]
    if doc["leases"] or doc.get("waiting"):
        leases = Table(title=f"Leases ({doc.get('waiting', 0)} request(s) waiting)", title_justify="left")
        for col in ("Lease", "Client", "Devices (memory, share)", "Expires in", "Age"):
            leases.add_column(col)
        for lease in doc["leases"]:
            where = "\n".join(f"{g['host_id']}/{g['device']} ({_size(g['memory_limit'])}, {g['compute_share']:g})"
                              for g in lease["grants"])
            leases.add_row(lease["lease_id"][:8], lease["client"], where, f"{lease['expires_in_s']:.0f}s",
                           _age(lease["age_s"]))
        parts.append(leases)
    return Group(*parts)


@click.command()
@click.option("--pool", callback=_address, metavar="HOST:PORT",
              help="Show the pool's hosts, devices, sessions and leases (default: GPUREMOTE_POOL).")
@click.option("--daemon", callback=_address, metavar="HOST:PORT", help="Show one daemon's devices and sessions.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON document (stable keys) instead of tables.")
@click.option("--watch", type=float, callback=_period, metavar="SECONDS",
              help="Refresh every SECONDS until Ctrl-C.")
@security_options()
def smi(pool, daemon, as_json, watch, security):
    """Show every host and device: memory used/total, utilisation, and each lease and session on it."""
    if pool and daemon:
        raise click.UsageError("give --pool or --daemon, not both")
    if not pool and not daemon:
        pool = os.environ.get("GPUREMOTE_POOL")
        daemon = None if pool else os.environ.get("GPUREMOTE_DAEMON", "").split(",")[0].strip() or None
        if not pool and not daemon:
            raise click.UsageError("nothing to show: give --pool HOST:PORT or --daemon HOST:PORT (or set "
                                   "GPUREMOTE_POOL / GPUREMOTE_DAEMON)")
    from rich.console import Console
    console = Console()
    try:
        source = Source(pool, daemon, security)
    except SmiError as exc:
        raise click.ClickException(str(exc))
    title = f"gpuremote {'pool' if pool else 'daemon'} {pool or daemon}"
    try:
        while True:
            try:
                doc = source.document()
            except SmiError as exc:
                if watch is None:
                    raise click.ClickException(str(exc))
                click.echo(f"{time.strftime('%H:%M:%S')} {exc}", err=True)   # keep watching: it may come back
            else:
                if as_json:
                    click.echo(json.dumps(doc, indent=None if watch else 2))
                else:
                    if watch is not None and console.is_terminal:
                        console.clear()
                    console.print(render(doc, f"{title}  {time.strftime('%H:%M:%S')}" if watch else title))
                sys.stdout.flush()
            if watch is None:
                return
            time.sleep(watch)
    except KeyboardInterrupt:
        pass
    finally:
        source.close()
