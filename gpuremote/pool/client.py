"""A pool's clients: allocate a lease, keep it renewed from a thread, release it; read the status.

`PoolClient(address)` connects (or raises PoolError within pool_connect_timeout_s) and maps
every gRPC failure to a PoolError whose message says what happened and what to do.
`Lease.allocate(client, request)` holds one lease: a `LeaseKeeper` thread renews it every
ttl/3 (each call bounded; a failed renewal is retried sooner until the lease would have
expired), rewrites the grants file with the re-signed grants, and stops at `release()`, which
gives the devices back. Renew and Release prove the holder with the lease secret of the
AllocateReply (the lease id is public): it stays in this process's memory, never in a file, the
command's environment or a message. Used by `gpuremote run --pool` (the wrapper process holds the
lease while its command runs) and `gpuremote smi`.

Beware: renewal runs in the wrapper, not in the command: if the wrapper is killed (SIGKILL),
nothing renews, and the pool expires the lease after its TTL; the daemons then close the
command's sessions (PoolAgent). A lease lost that way is reported once on stderr.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
import threading

import grpc

from gpuremote._config import DEFAULTS
from gpuremote.client import grants as grant_env
from gpuremote.pool.channel import channel_options, connect
from gpuremote.transport import auth
from gpuremote.v1 import pool_pb2, pool_pb2_grpc

log = logging.getLogger("gpuremote.pool.client")


class PoolError(Exception):
    """A pool call failed; `code` is the gRPC status (None when the pool could not be reached)."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None):
        super().__init__(message)
        self.code = code


def _unreachable(address: str, why: str) -> PoolError:
    return PoolError(f"cannot reach the gpuremote pool at {address} ({why}): check that `gpuremote pool` runs "
                     "there and that the address and port are right (GPUREMOTE_POOL / --pool)",
                     grpc.StatusCode.UNAVAILABLE)


def pool_error(exc: grpc.RpcError, address: str) -> PoolError:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) and "no capacity" not in details:
        return _unreachable(address, f"{code.name.lower()}: {details}")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return PoolError(f"not enough free capacity in the pool at {address}: {details}", code)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return PoolError(f"the pool at {address} refused the request: {details}", code)
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return PoolError(f"the pool at {address} cannot meet the request: {details}", code)
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return PoolError(f"the pool at {address} refused this client: {details}", code)
    return PoolError(f"the pool at {address} answered {getattr(code, 'name', 'an error')}: {details}", code)


class PoolClient:
    """A connected client of the pool at `address` (token and TLS from `security` or the environment)."""

    def __init__(self, address: str, security: auth.ClientSecurity | None = None,
                 connect_timeout: float = DEFAULTS.pool_connect_timeout_s):
        self.address = address
        self.channel = auth.channel(address, security, channel_options())
        why = connect(self.channel, connect_timeout)
        if why is not None:
            self.channel.close()
            raise _unreachable(address, why)
        self.stub = pool_pb2_grpc.PoolStub(self.channel)

    def _call(self, method, request, timeout: float):
        try:
            return method(request, timeout=timeout)
        except grpc.RpcError as exc:
            raise pool_error(exc, self.address) from None

    def allocate(self, request: pool_pb2.AllocateRequest) -> pool_pb2.AllocateReply:
        """A lease for `request`; waits in the pool's queue up to request.wait_s (Ctrl-C gives up)."""
        future = self.stub.Allocate.future(request, timeout=request.wait_s + DEFAULTS.pool_rpc_timeout_s)
        try:
            while True:
                try:
                    return future.result(timeout=0.5)    # short waits keep KeyboardInterrupt responsive
                except grpc.FutureTimeoutError:
                    continue
        except grpc.RpcError as exc:
            raise pool_error(exc, self.address) from None
        except BaseException:
            future.cancel()        # the pool drops the waiting request at once
            raise

    def renew(self, lease_id: str, secret: bytes,
              timeout: float = DEFAULTS.pool_rpc_timeout_s) -> pool_pb2.RenewReply:
        """Extend the lease; `secret` is its AllocateReply.lease_secret."""
        return self._call(self.stub.Renew, pool_pb2.RenewRequest(lease_id=lease_id, lease_secret=secret), timeout)

    def release(self, lease_id: str, secret: bytes) -> None:
        """Give the lease's devices back; `secret` is its AllocateReply.lease_secret."""
        self._call(self.stub.Release, pool_pb2.ReleaseRequest(lease_id=lease_id, lease_secret=secret),
                   DEFAULTS.pool_rpc_timeout_s)

    def status(self) -> pool_pb2.StatusReply:
        return self._call(self.stub.Status, pool_pb2.StatusRequest(), DEFAULTS.pool_rpc_timeout_s)

    def close(self) -> None:
        self.channel.close()


class LeaseKeeper:
    """Renews a lease every ttl/3 from a daemon thread until `stop()`; calls `on_renew(reply)` after each."""

    def __init__(self, client: PoolClient, lease_id: str, secret: bytes, ttl_s: float, expires_at: float,
                 on_renew=None):
        self.client = client
        self.lease_id = lease_id
        self._secret = secret
        self.ttl_s = ttl_s
        self.expires_at = expires_at
        self.on_renew = on_renew
        self.renewals = 0
        self.lost: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpuremote-lease-renewal", daemon=True)

    def start(self) -> "LeaseKeeper":
        self._thread.start()
        return self

    def _run(self) -> None:
        import time
        period = self.ttl_s / 3
        wait = period
        while not self._stop.wait(wait):
            try:
                reply = self.client.renew(self.lease_id, self._secret,
                                          timeout=min(DEFAULTS.pool_rpc_timeout_s, period))
            except PoolError as exc:
                if exc.code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.PERMISSION_DENIED) \
                        or time.time() >= self.expires_at:
                    self.lost = str(exc)
                    print(f"gpuremote: lease {self.lease_id} is lost ({exc}); the command's devices may be "
                          "given to others and its sessions closed", file=sys.stderr, flush=True)
                    return
                log.warning("renewing lease %s failed (%s); retrying", self.lease_id, exc)
                wait = min(1.0, period / 2)     # again soon, well before the lease would expire
                continue
            self.expires_at = reply.expires_at
            self.renewals += 1
            if self.on_renew is not None:
                try:
                    self.on_renew(reply)
                except Exception as exc:          # a full disk must not stop the renewals
                    log.warning("after renewing lease %s: %s", self.lease_id, exc)
            wait = period

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(DEFAULTS.pool_rpc_timeout_s + 1)


class Lease:
    """A lease held by this process: its devices, grants (kept current in a file) and renewal thread."""

    def __init__(self, client: PoolClient, reply: pool_pb2.AllocateReply):
        self.client = client
        self.lease_id = reply.lease_id
        self._secret = reply.lease_secret
        self.ttl_s = reply.ttl_s
        self.signed = list(reply.grants)
        self.grants = [pool_pb2.Grant.FromString(s.grant) for s in self.signed]
        self.devices = [f"{g.address}/{g.device}" for g in self.grants]
        self._dir = tempfile.mkdtemp(prefix="gpuremote-lease-")      # mode 0700: grants are credentials
        self.grants_file = os.path.join(self._dir, "grants")
        grant_env.write_file(self.grants_file, self.signed)
        self.keeper = LeaseKeeper(client, self.lease_id, self._secret, reply.ttl_s, reply.expires_at,
                                  self._renewed).start()
        self._released = False

    @classmethod
    def allocate(cls, client: PoolClient, request: pool_pb2.AllocateRequest) -> "Lease":
        reply = client.allocate(request)
        try:
            return cls(client, reply)
        except BaseException:
            client.release(reply.lease_id, reply.lease_secret)
            raise

    def _renewed(self, reply: pool_pb2.RenewReply) -> None:
        self.signed = list(reply.grants)
        grant_env.write_file(self.grants_file, self.signed)

    def env(self) -> dict[str, str]:
        """The command's environment for this lease: its devices and grants."""
        return {"GPUREMOTE_DEVICES": ",".join(self.devices), grant_env.GRANTS_ENV: grant_env.encode(self.signed),
                grant_env.GRANTS_FILE_ENV: self.grants_file}

    def release(self) -> None:
        """Stop renewing and give the devices back (a failure is reported; the TTL frees them anyway)."""
        if self._released:
            return
        self._released = True
        self.keeper.stop()
        try:
            if self.keeper.lost is None:
                self.client.release(self.lease_id, self._secret)
        except PoolError as exc:
            if exc.code != grpc.StatusCode.NOT_FOUND:
                print(f"gpuremote: could not release lease {self.lease_id} ({exc}); the pool frees it when it "
                      f"expires, within {self.ttl_s:g} s", file=sys.stderr, flush=True)
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)
