"""Grant signing and verification: a valid grant passes; altered, foreign, malformed or expired ones do not."""

from __future__ import annotations

import hashlib
import hmac
import secrets

import pytest

from gpuremote.errors import KNOWN_TYPES, GrantError, rebuild, wire_type_name
from gpuremote.v1 import pool_pb2
from gpuremote.wire import grants

KEY = secrets.token_bytes(32)
NOW = 1_700_000_000.0


def make_grant(**changes) -> pool_pb2.Grant:
    fields = dict(lease_id="lease-1", host_id="gpu1", address="gpu1:7200", device=0, memory_limit=4 * 2**30,
                  compute_share=0.5, expires_at=NOW + 30, nonce=secrets.token_bytes(16))
    fields.update(changes)
    return pool_pb2.Grant(**fields)


def test_sign_then_verify_returns_the_grant():
    grant = make_grant()
    signed = grants.sign(grant, KEY)
    assert len(signed.signature) == 32
    assert grants.verify(signed, KEY, now=NOW) == grant


def test_verify_uses_the_wall_clock_by_default():
    import time
    grants.verify(grants.sign(make_grant(expires_at=time.time() + 60), KEY), KEY)
    with pytest.raises(GrantError, match="expired"):
        grants.verify(grants.sign(make_grant(expires_at=time.time() - 1), KEY), KEY)


def test_two_grants_with_the_same_fields_sign_differently():
    assert grants.sign(make_grant(), KEY).signature != grants.sign(make_grant(), KEY).signature


@pytest.mark.parametrize("field,value", [("memory_limit", 80 * 2**30), ("compute_share", 1.0),
                                         ("expires_at", NOW + 10**6), ("device", 1), ("lease_id", "other")])
def test_tampered_grant_is_refused(field, value):
    signed = grants.sign(make_grant(), KEY)
    grant = pool_pb2.Grant.FromString(signed.grant)
    setattr(grant, field, value)
    forged = pool_pb2.SignedGrant(grant=grant.SerializeToString(), signature=signed.signature)
    with pytest.raises(GrantError, match="signature does not match"):
        grants.verify(forged, KEY, now=NOW)


def test_flipped_signature_bit_and_foreign_key_are_refused():
    signed = grants.sign(make_grant(), KEY)
    bad = bytearray(signed.signature)
    bad[0] ^= 1
    with pytest.raises(GrantError, match="signature does not match"):
        grants.verify(pool_pb2.SignedGrant(grant=signed.grant, signature=bytes(bad)), KEY, now=NOW)
    with pytest.raises(GrantError, match="different pool"):
        grants.verify(signed, secrets.token_bytes(32), now=NOW)
    with pytest.raises(GrantError, match="signature"):
        grants.verify(pool_pb2.SignedGrant(grant=signed.grant), KEY, now=NOW)


def test_expired_grant_is_refused_with_how_long_ago():
    signed = grants.sign(make_grant(expires_at=NOW - 5), KEY)
    with pytest.raises(GrantError, match=r"lease-1 expired 5\.0 s ago.*renew"):
        grants.verify(signed, KEY, now=NOW)
    with pytest.raises(GrantError, match="expired 0.0 s ago"):
        grants.verify(grants.sign(make_grant(expires_at=NOW), KEY), KEY, now=NOW)


@pytest.mark.parametrize("changes,message", [
    (dict(lease_id=""), "names no lease"),
    (dict(address=""), "names no lease, host or daemon address"),
    (dict(memory_limit=0), "memory limit of 0"),
    (dict(compute_share=0.0), r"compute share 0.0 is not in \(0, 1\]"),
    (dict(compute_share=1.5), "compute share 1.5"),
    (dict(expires_at=float("nan")), "no valid expiry"),
    (dict(expires_at=0.0), "no valid expiry"),
])
def test_signed_but_malformed_grant_is_refused(changes, message):
    with pytest.raises(GrantError, match=message):
        grants.verify(grants.sign(make_grant(**changes), KEY), KEY, now=NOW)


def test_signed_bytes_that_are_not_a_grant_are_refused():
    junk = b"\xff\xff\xff\xff"
    signed = pool_pb2.SignedGrant(grant=junk, signature=hmac.new(KEY, junk, hashlib.sha256).digest())
    with pytest.raises(GrantError, match="not a gpuremote.v1.Grant"):
        grants.verify(signed, KEY, now=NOW)


def test_short_key_is_refused_on_both_sides():
    with pytest.raises(GrantError, match="at least 32"):
        grants.sign(make_grant(), b"short")
    with pytest.raises(GrantError, match="too short"):
        grants.verify(grants.sign(make_grant(), KEY), b"", now=NOW)


def test_grant_error_crosses_the_wire():
    assert KNOWN_TYPES["gpuremote.GrantError"] is GrantError
    assert wire_type_name(GrantError("x")) == "gpuremote.GrantError"
    rebuilt = rebuild("gpuremote.GrantError", "grant expired")
    assert isinstance(rebuilt, GrantError) and str(rebuilt) == "grant expired"
