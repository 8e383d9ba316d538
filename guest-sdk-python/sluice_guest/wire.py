"""The batch encoding records cross the boundary in (``wit/deps/topology-0.1.0``,
``processor.process``), read and written without a Python object per field.

A batch is walked once to find where each record's fields lie; a field becomes a Python
object only when the topology asks for it (``record.value``). What a call emits is written
into one ``bytearray``, handed to the host when the call returns.

    batch   := count:u32 input*
    input   := key:bytes? value:bytes? timestamp:s64 source:u32 partition:s32 offset:s64
               header-count:u32 (name:bytes value:bytes?)*
    result  := count:u32 emitted*
    emitted := sink:u32 key:bytes? value:bytes? timestamp:s64 header-count:u32
               (name:bytes value:bytes?)*
"""

from __future__ import annotations

import struct

NONE = 0xFFFFFFFF
INHERIT_TIMESTAMP = -(2**63)

_u32 = struct.Struct("<I").unpack_from
_i64 = struct.Struct("<q").unpack_from
_fixed = struct.Struct("<qIiqI").unpack_from  # timestamp, source, partition, offset, header count
_FIXED = 28
_pack_u32 = struct.Struct("<I").pack
_pack_ts_headers = struct.Struct("<qI").pack
_EMPTY = b"\x00\x00\x00\x00"


class WireError(ValueError):
    """A buffer that does not follow the encoding."""

    def __init__(self, position: int, expected: str):
        super().__init__(f"malformed record buffer at byte {position}: expected {expected}")
        self.position = position


def _field(buf: bytes, pos: int, end: int, what: str):
    """The (start, length) of a length-prefixed field at ``pos``; length NONE for none."""
    if pos + 4 > end:
        raise WireError(pos, what)
    length = _u32(buf, pos)[0]
    pos += 4
    if length != NONE:
        if length > end - pos:
            raise WireError(pos - 4, f"{what} of {length} bytes within the buffer")
        return pos, length, pos + length
    return pos, NONE, pos


def headers_at(buf: bytes, pos: int, count: int, end: int):
    """Decodes ``count`` headers at ``pos``: a list of (name, value or None)."""
    out = []
    for _ in range(count):
        start, length, pos = _field(buf, pos, end, "a header name")
        if length == NONE:
            raise WireError(start - 4, "a header name (not none)")
        name = buf[start:start + length].decode("utf-8", "replace")
        start, length, pos = _field(buf, pos, end, "a header value")
        out.append((name, None if length == NONE else buf[start:start + length]))
    return out, pos


_source_headers = struct.Struct("<I12xI").unpack_from  # source and header count, from fpos + 8


def fixed_at(buf: bytes, fpos: int):
    """(timestamp, source, partition, offset, header count) at ``fpos``."""
    return _fixed(buf, fpos)


_pack_ii = struct.Struct("<II").pack
_pack_q = struct.Struct("<q").pack
_NO_HEADERS = b"\x00\x00\x00\x00"
_NONE_LEN = b"\xff\xff\xff\xff"


def timestamp_bytes(timestamp: int) -> bytes:
    return _pack_q(timestamp)


class Writer:
    """Emitted records, written into one buffer."""

    __slots__ = ("buf", "count")

    def __init__(self):
        self.buf = bytearray(_EMPTY)
        self.count = 0

    def emit(self, sink: int, key, value, timestamp: bytes, headers=()):
        """Appends a record: ``key`` and ``value`` are bytes-like or None, ``timestamp`` the
        8 bytes of an s64 (copied from the input's, or ``timestamp_bytes``)."""
        buf = self.buf
        if key is None:
            buf += _pack_ii(sink, NONE)
        else:
            buf += _pack_ii(sink, len(key))
            buf += key
        if value is None:
            buf += _NONE_LEN
        else:
            buf += _pack_u32(len(value))
            buf += value
        buf += timestamp
        if headers:
            buf += _pack_u32(len(headers))
            for name, hvalue in headers:
                name = name.encode("utf-8") if isinstance(name, str) else bytes(name)
                buf += _pack_u32(len(name))
                buf += name
                if hvalue is None:
                    buf += _NONE_LEN
                else:
                    buf += _pack_u32(len(hvalue))
                    buf += hvalue
        else:
            buf += _NO_HEADERS
        self.count += 1

    def take(self) -> bytes:
        """The buffer (the count written in front), and an empty writer again."""
        if not self.count:
            return _EMPTY
        buf = self.buf
        buf[0:4] = _pack_u32(self.count)
        self.buf = bytearray(_EMPTY)
        self.count = 0
        return bytes(buf)

    def clear(self):
        self.buf = bytearray(_EMPTY)
        self.count = 0


def encode_inputs(records) -> bytes:
    """A batch of inputs, for tests: each (key, value, timestamp, source, partition, offset,
    headers)."""
    out = bytearray(_pack_u32(len(records)))
    for key, value, timestamp, source, partition, offset, headers in records:
        for field in (key, value):
            if field is None:
                out += b"\xff\xff\xff\xff"
            else:
                out += _pack_u32(len(field))
                out += field
        out += struct.pack("<qIiqI", timestamp, source, partition, offset, len(headers))
        for name, hvalue in headers:
            name = name.encode("utf-8")
            out += _pack_u32(len(name)) + name
            out += b"\xff\xff\xff\xff" if hvalue is None else _pack_u32(len(hvalue)) + hvalue
    return bytes(out)


def decode_emitted(buf: bytes):
    """The records of a result buffer, for tests: (sink, key, value, timestamp, headers)."""
    end = len(buf)
    if end < 4:
        raise WireError(0, "a record count")
    count = _u32(buf, 0)[0]
    pos = 4
    out = []
    for _ in range(count):
        if pos + 4 > end:
            raise WireError(pos, "a sink")
        sink = _u32(buf, pos)[0]
        fields = []
        pos += 4
        for what in ("a key", "a value"):
            start, length, pos = _field(buf, pos, end, what)
            fields.append(None if length == NONE else bytes(buf[start:start + length]))
        if pos + 12 > end:
            raise WireError(pos, "a timestamp and header count")
        timestamp = _i64(buf, pos)[0]
        hcount = _u32(buf, pos + 8)[0]
        headers, pos = headers_at(buf, pos + 12, hcount, end)
        out.append((sink, fields[0], fields[1], timestamp, headers))
    if pos != end:
        raise WireError(pos, "the end of the buffer")
    return out
