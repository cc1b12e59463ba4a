"""Pool grants handed from `gpuremote run --pool` to the command's processes, through the environment.

GPUREMOTE_GRANTS holds the lease's grants as comma-separated base64 of each SignedGrant's bytes
(one per device, in GPUREMOTE_DEVICES order). GPUREMOTE_GRANTS_FILE names a file with the same
text, which the wrapper rewrites (atomically) at each lease renewal: a renewal re-signs the
grants with a later expiry, and a process started after the first grants expired (a
multiprocessing worker late in a long run) must present the renewed ones. The file is read when
it exists, else the variable.

Each session presents the grants for its daemon's address (routing reads the unverified Grant
inside; only the daemon verifies). Beware: a grant is a bearer credential for its lease's share
until it expires; the file is created mode 600 in a private folder.
"""

from __future__ import annotations

import base64
import binascii
import os

from google.protobuf.message import DecodeError

from gpuremote.v1 import pool_pb2

GRANTS_ENV = "GPUREMOTE_GRANTS"
GRANTS_FILE_ENV = "GPUREMOTE_GRANTS_FILE"


def encode(signed: list[pool_pb2.SignedGrant]) -> str:
    return ",".join(base64.b64encode(s.SerializeToString()).decode("ascii") for s in signed)


def decode(text: str) -> list[pool_pb2.SignedGrant]:
    """The SignedGrants of a GPUREMOTE_GRANTS text; ValueError naming the bad entry."""
    out = []
    for n, item in enumerate(filter(None, (t.strip() for t in text.split(",")))):
        try:
            out.append(pool_pb2.SignedGrant.FromString(base64.b64decode(item, validate=True)))
        except (binascii.Error, ValueError, DecodeError):
            raise ValueError(f"{GRANTS_ENV} entry {n} is not a base64 SignedGrant: run the program with "
                             "`gpuremote run --pool ADDR`, which sets it") from None
    return out


def write_file(path: str, signed: list[pool_pb2.SignedGrant]) -> None:
    """Replace the grants file atomically (readers see the old or the new grants, never half)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(encode(signed) + "\n")
    os.replace(tmp, path)


def from_environ(environ=None) -> dict[str, list[pool_pb2.SignedGrant]]:
    """{daemon address: its grants} from GPUREMOTE_GRANTS_FILE or GPUREMOTE_GRANTS; {} when neither is set."""
    environ = os.environ if environ is None else environ
    text = environ.get(GRANTS_ENV, "")
    path = environ.get(GRANTS_FILE_ENV)
    if path:
        try:
            with open(path) as f:
                text = f.read()
        except OSError:
            pass     # the wrapper is gone; the variable's grants may still be valid
    by_address: dict[str, list[pool_pb2.SignedGrant]] = {}
    for s in decode(text):
        try:
            address = pool_pb2.Grant.FromString(s.grant).address
        except DecodeError:
            raise ValueError(f"{GRANTS_ENV} holds a grant whose content is not a gpuremote.v1.Grant") from None
        by_address.setdefault(address, []).append(s)
    return by_address
