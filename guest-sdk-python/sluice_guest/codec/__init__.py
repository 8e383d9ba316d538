"""Codecs: how keys and values turn into bytes and back, byte for byte as the Rust SDK's.

A Python topology and a Rust one share topics and stores only if they write the same bytes,
so every codec here is the Rust SDK's (``sluice_guest::codec``) in Python:

=====================  =====================================  ==========================
Python                 bytes                                  Rust
=====================  =====================================  ==========================
``Bytes``              the bytes                              ``Vec<u8>``, ``&[u8]``
``Str``                UTF-8                                  ``String``, ``&str``
``U64`` / ``I64``      8 bytes, big-endian (two's complement) ``u64`` / ``i64``
``Json``               compact JSON (serde_json's bytes)      ``Json<T>``
``Tuple(a, b, ...)``   order-preserving elements, in order    ``(A, B, ...)``
``Ordered(e)``         one order-preserving element           ``Ordered<T>``
=====================  =====================================  ==========================

The elements of ``Tuple`` and ``Ordered`` are in :mod:`sluice_guest.codec.ordered`'s sense
(``codec.ordered.Str``, ``codec.ordered.I64``, ...): their bytes sort as the values do, so a
store's scans follow the values' order. A plain ``I64`` does not sort negatives first; an
``Ordered(ordered.I64)`` does. See the Rust SDK's ``codec::ordered`` for the table of
encodings; the two are tested against each other byte for byte over random values.
"""

from __future__ import annotations

import json as _json
import math as _math
import struct as _struct

__all__ = [
    "CodecError", "Codec", "Bytes", "Str", "U64", "I64", "Json", "Tuple", "Ordered", "ordered",
]


class CodecError(ValueError):
    """A key or value that could not be decoded or encoded: ``codec`` names the codec."""

    def __init__(self, codec: str, message: str):
        super().__init__(f"{codec} codec: {message}")
        self.codec = codec
        self.message = message


class Codec:
    """Turns values into bytes (``encode``) and back (``decode``)."""

    name = "codec"
    #: The schema (a :class:`sluice_guest.Schema`) a topic of these keys or values carries in
    #: the Confluent wire format: set by the codecs of :mod:`sluice_guest.formats`, so that a
    #: DSL stream of them declares its topics' formats by itself; None (plain bytes) for the
    #: others (the Rust SDK's ``Encode::schema``).
    schema = None

    def encode(self, value) -> bytes:
        raise NotImplementedError

    def decode(self, data: bytes):
        raise NotImplementedError

    def __repr__(self) -> str:
        return self.name


class _Bytes(Codec):
    name = "Bytes"

    def encode(self, value) -> bytes:
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise CodecError("bytes", f"expected bytes, got {type(value).__name__}")
        return bytes(value)

    def decode(self, data: bytes):
        return bytes(data)


class _Str(Codec):
    name = "Str"

    def encode(self, value) -> bytes:
        if not isinstance(value, str):
            raise CodecError("utf-8", f"expected str, got {type(value).__name__}")
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError as e:  # lone surrogates
            raise CodecError("utf-8", str(e)) from None

    def decode(self, data: bytes):
        try:
            return str(data, "utf-8")
        except UnicodeDecodeError as e:
            raise CodecError("utf-8", f"invalid utf-8: {e.reason} at byte {e.start}") from None


_BE_U64 = _struct.Struct(">Q")
_BE_I64 = _struct.Struct(">q")


class _BigEndian(Codec):
    def __init__(self, name: str, packer: _struct.Struct, lo: int, hi: int):
        self.name = name
        self._packer = packer
        self._lo = lo
        self._hi = hi

    def encode(self, value) -> bytes:
        if isinstance(value, bool) or not isinstance(value, int):
            raise CodecError("big-endian integer", f"expected int, got {type(value).__name__}")
        if not self._lo <= value <= self._hi:
            raise CodecError("big-endian integer", f"{value} is out of range for {self.name}")
        return self._packer.pack(value)

    def decode(self, data: bytes):
        if len(data) != 8:
            raise CodecError("big-endian integer", f"expected 8 bytes, got {len(data)}")
        return self._packer.unpack(data)[0]


def _float_text(x: float) -> str:
    """A finite float as serde_json (1.0.154, through zmij) writes it: the shortest digits
    that read back, in fixed notation from 1e-5 to below 1e16 (`1.0`, `0.00001`), else as
    `1e+16`, `1.5e-7` (Python's repr says `1e-05`, `1.5e-07`)."""
    if x == 0:
        return "-0.0" if _math.copysign(1.0, x) < 0 else "0.0"
    sign = "-" if x < 0 else ""
    mantissa, _, exp = repr(abs(x)).partition("e")
    whole, _, frac = mantissa.partition(".")
    all_digits = whole + frac
    # The value is 0.DIGITS x 10^point once leading zeros are dropped.
    point = len(whole) + (int(exp) if exp else 0)
    stripped = all_digits.lstrip("0")
    point -= len(all_digits) - len(stripped)
    digits = stripped.rstrip("0")
    length = len(digits)
    k = point - length  # the value is DIGITS x 10^k
    if 0 <= k and point <= 16:
        return f"{sign}{digits}{'0' * k}.0"
    if 0 < point <= 16:
        return f"{sign}{digits[:point]}.{digits[point:]}"
    if -5 < point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    e = point - 1
    exponent = f"e+{e}" if e >= 0 else f"e-{-e}"
    if length == 1:
        return f"{sign}{digits}{exponent}"
    return f"{sign}{digits[0]}.{digits[1:]}{exponent}"


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _json_str(s: str, out: list):
    out.append('"')
    start = 0
    for i, c in enumerate(s):
        if c in _ESCAPES or c < " ":
            out.append(s[start:i])
            out.append(_ESCAPES.get(c) or f"\\u{ord(c):04x}")
            start = i + 1
    out.append(s[start:])
    out.append('"')


def _json_write(value, out: list):
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int):
        out.append(str(int(value)))
    elif isinstance(value, float):
        # serde_json writes a non-finite float as null.
        out.append(_float_text(value) if _math.isfinite(value) else "null")
    elif isinstance(value, str):
        _json_str(value, out)
    elif isinstance(value, (list, tuple)):
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _json_write(item, out)
        out.append("]")
    elif isinstance(value, dict):
        out.append("{")
        for i, (k, item) in enumerate(value.items()):
            if not isinstance(k, str):
                raise CodecError("json", f"a map key must be a string, got {type(k).__name__}")
            if i:
                out.append(",")
            _json_str(k, out)
            out.append(":")
            _json_write(item, out)
        out.append("}")
    else:
        raise CodecError("json", f"cannot write a {type(value).__name__} as JSON")


class _Json(Codec):
    """JSON with serde_json's bytes: compact, keys in the dict's order (as a Rust struct
    writes its fields in declaration order), floats as serde_json writes them, non-ASCII as UTF-8."""

    name = "Json"

    def encode(self, value) -> bytes:
        out: list = []
        _json_write(value, out)
        try:
            return "".join(out).encode("utf-8")
        except UnicodeEncodeError as e:  # lone surrogates
            raise CodecError("json", str(e)) from None

    def decode(self, data: bytes):
        try:
            return _json.loads(bytes(data))
        except (ValueError, UnicodeDecodeError) as e:
            raise CodecError("json", str(e)) from None


Bytes = _Bytes()
Str = _Str()
U64 = _BigEndian("U64", _BE_U64, 0, 2**64 - 1)
I64 = _BigEndian("I64", _BE_I64, -(2**63), 2**63 - 1)
Json = _Json()

from . import ordered  # noqa: E402  (the elements need CodecError)
from .ordered import Ordered, Tuple  # noqa: E402
