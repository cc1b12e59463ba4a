"""Chunk messages on the gRPC stream without protobuf's copies.

A ClientMessage or ServerMessage holding only a Chunk is the most common message of a bulk
transfer over gRPC, and the costliest through the protobuf runtime: the bytes are copied into
a bytes object, into the message, out to the wire, and on the other side out of the wire, out of
the message and into the array. `encode` writes the same protobuf encoding by hand with one copy
of the data; `decode` reads it back with none (the chunk's data is a memoryview of the received
bytes). The wire format is unchanged: these bytes parse with the generated classes, and a
message that is not exactly the canonical form written here is handed to protobuf as before.
"""

from __future__ import annotations

from typing import Any

_CHUNK_TAG = 0x1A          # field 3 (`chunk` in both ClientMessage and ServerMessage), length-delimited
_SEQ, _OFFSET, _DATA = 0x08, 0x10, 0x1A


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def encode(seq: int, offset: int, data) -> bytes:
    """The serialized ClientMessage/ServerMessage {chunk {seq, offset, data}} (`data`: bytes-like)."""
    n = len(data) if not hasattr(data, "nbytes") else data.nbytes
    inner = b"".join((bytes((_SEQ,)), _varint(seq), bytes((_OFFSET,)), _varint(offset), bytes((_DATA,)), _varint(n)))
    return b"".join((bytes((_CHUNK_TAG,)), _varint(len(inner) + n), inner, data))


def _read_varint(buf, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while pos < end and shift < 64:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
    raise ValueError("truncated varint")


class _Chunk:
    __slots__ = ("seq", "offset", "data")


class ChunkMessage:
    """Stands in for a parsed message whose `kind` is `chunk` (what the session code reads of it)."""

    __slots__ = ("chunk",)

    def __init__(self, chunk: _Chunk):
        self.chunk = chunk

    def WhichOneof(self, name: str) -> str:   # noqa: N802 -- protobuf's spelling
        return "chunk"


def decode(data: bytes) -> Any | None:
    """A ChunkMessage when `data` is exactly the canonical chunk encoding `encode` writes, else None."""
    try:
        if len(data) < 8 or data[0] != _CHUNK_TAG:
            return None
        length, pos = _read_varint(data, 1, len(data))
        end = len(data)
        if pos + length != end or data[pos] != _SEQ:
            return None
        seq, pos = _read_varint(data, pos + 1, end)
        if pos >= end or data[pos] != _OFFSET:
            return None
        offset, pos = _read_varint(data, pos + 1, end)
        if pos >= end or data[pos] != _DATA:
            return None
        n, pos = _read_varint(data, pos + 1, end)
        if pos + n != end:
            return None
    except (ValueError, IndexError):
        return None
    chunk = _Chunk()
    chunk.seq, chunk.offset, chunk.data = seq, offset, memoryview(data)[pos:end]
    return ChunkMessage(chunk)


def serialize(msg) -> bytes:
    """Request/response serializer: pre-encoded bytes pass through, messages are serialized."""
    return msg if type(msg) is bytes else msg.SerializeToString()
