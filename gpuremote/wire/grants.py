"""Signing and verifying pool grants (HMAC-SHA256 over the serialized Grant).

The pool signs each Grant with its grant key; a daemon that got the same key at registration
verifies it before honouring the grant. The signature covers the exact bytes in
`SignedGrant.grant`, so a verifier parses only bytes it has authenticated and never
re-serializes (protobuf serialization is not canonical across versions).

Beware: the key is a shared secret. Whoever holds it can mint grants, and the pool hands it to
any daemon that registers, so the pool must listen only where daemons it trusts can reach it.
Expiry compares against the verifier's wall clock: keep hosts' clocks in sync (NTP).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import time

from google.protobuf.message import DecodeError

from gpuremote.errors import GrantError
from gpuremote.v1 import pool_pb2

# 32 bytes, as secrets.token_bytes(32) makes; a shorter key would weaken HMAC-SHA256.
MIN_KEY_BYTES = 32


def _mac(key: bytes, data: bytes) -> bytes:
    if len(key) < MIN_KEY_BYTES:
        raise GrantError(f"grant key of {len(key)} bytes is too short: use at least {MIN_KEY_BYTES} random bytes")
    return hmac.new(key, data, hashlib.sha256).digest()


def sign(grant: pool_pb2.Grant, key: bytes) -> pool_pb2.SignedGrant:
    """The grant serialized once and signed as those bytes."""
    data = grant.SerializeToString(deterministic=True)
    return pool_pb2.SignedGrant(grant=data, signature=_mac(key, data))


def _check_fields(grant: pool_pb2.Grant) -> None:
    if not grant.lease_id or not grant.host_id or not grant.address:
        raise GrantError("malformed grant: it names no lease, host or daemon address")
    if grant.memory_limit == 0:
        raise GrantError(f"malformed grant for lease {grant.lease_id}: a memory limit of 0 bytes")
    if not (0 < grant.compute_share <= 1):
        raise GrantError(f"malformed grant for lease {grant.lease_id}: compute share {grant.compute_share} "
                         "is not in (0, 1]")
    if not (math.isfinite(grant.expires_at) and grant.expires_at > 0):
        raise GrantError(f"malformed grant for lease {grant.lease_id}: no valid expiry time")


def verify(signed: pool_pb2.SignedGrant, key: bytes, now: float | None = None) -> pool_pb2.Grant:
    """The Grant inside `signed` if its signature is valid, its fields sane and it is not expired.

    Raises GrantError saying which check failed. `now` is Unix time (default: time.time()).
    """
    if not hmac.compare_digest(_mac(key, signed.grant), signed.signature):
        raise GrantError("grant signature does not match: the grant was altered, or signed by a different pool "
                         "(ask the pool this daemon is registered with for a new lease)")
    try:
        grant = pool_pb2.Grant.FromString(signed.grant)
    except DecodeError as exc:
        raise GrantError(f"malformed grant: the signed bytes are not a gpuremote.v1.Grant ({exc})") from None
    _check_fields(grant)
    now = time.time() if now is None else now
    if grant.expires_at <= now:
        raise GrantError(f"grant for lease {grant.lease_id} expired {now - grant.expires_at:.1f} s ago: renew the "
                         "lease and present the grants the renewal returns, or allocate again")
    return grant
