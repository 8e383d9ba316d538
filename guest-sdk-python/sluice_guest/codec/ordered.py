"""Order-preserving elements, for tuple keys (``Tuple``) and ``Ordered``: their bytes sort as
the values do, and each knows where it ends, so a tuple is its elements one after the other.

The same bytes as the Rust SDK's ``sluice_guest::codec::ordered``:

=======================  ===============================================================
element                  bytes
=======================  ===============================================================
``U8`` ... ``U128``      big-endian, fixed width
``I8`` ... ``I128``      big-endian, fixed width, sign bit flipped (negatives sort first)
``Bool``                 ``0x00`` or ``0x01``
``Str``, ``Bytes``       the bytes, each ``0x00`` written ``0x00 0xFF``, then ``0x00 0x01``
``Fixed(n)``             the n bytes as they are (Rust's ``[u8; N]``)
``Optional(e)``          ``0x00`` for None; ``0x01`` then ``e``
``Tuple(a, b, ...)``     the elements in order (tuples nest)
=======================  ===============================================================
"""

from __future__ import annotations

from . import Codec, CodecError

__all__ = [
    "Element", "U8", "U16", "U32", "U64", "U128", "I8", "I16", "I32", "I64", "I128",
    "Bool", "Str", "Bytes", "Fixed", "Optional", "Tuple", "Ordered",
]

_CODEC = "ordered key"


def _error(message: str) -> CodecError:
    return CodecError(_CODEC, message)


class Element:
    """One element of an order-preserving key."""

    name = "element"

    def encode_into(self, value, out: bytearray) -> None:
        raise NotImplementedError

    def decode_from(self, data: bytes, pos: int):
        """Reads one element at ``pos``; returns it and the position after it."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return self.name


def _take(data: bytes, pos: int, n: int, what: str) -> int:
    left = len(data) - pos
    if left < n:
        raise _error(f"{what} needs {n} byte(s), {left} left")
    return pos + n


class _Unsigned(Element):
    def __init__(self, bits: int):
        self.name = f"U{bits}"
        self._width = bits // 8
        self._max = (1 << bits) - 1
        self._what = f"a u{bits}"

    def encode_into(self, value, out):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= self._max:
            raise _error(f"{value!r} is not a {self.name} (0 ..= {self._max})")
        out += value.to_bytes(self._width, "big")

    def decode_from(self, data, pos):
        end = _take(data, pos, self._width, self._what)
        return int.from_bytes(data[pos:end], "big"), end


class _Signed(Element):
    def __init__(self, bits: int):
        self.name = f"I{bits}"
        self._width = bits // 8
        self._flip = 1 << (bits - 1)
        self._mask = (1 << bits) - 1
        self._what = f"an i{bits}"

    def encode_into(self, value, out):
        if isinstance(value, bool) or not isinstance(value, int) or not -self._flip <= value < self._flip:
            raise _error(f"{value!r} is not an {self.name} ({-self._flip} ..= {self._flip - 1})")
        out += ((value & self._mask) ^ self._flip).to_bytes(self._width, "big")

    def decode_from(self, data, pos):
        end = _take(data, pos, self._width, self._what)
        raw = int.from_bytes(data[pos:end], "big") ^ self._flip
        return (raw - (1 << (self._width * 8)) if raw >= self._flip else raw), end


class _Bool(Element):
    name = "Bool"

    def encode_into(self, value, out):
        if not isinstance(value, bool):
            raise _error(f"{value!r} is not a bool")
        out.append(1 if value else 0)

    def decode_from(self, data, pos):
        _take(data, pos, 1, "a bool")
        b = data[pos]
        if b > 1:
            raise _error(f"a bool is 0x00 or 0x01, not 0x{b:02x}")
        return b == 1, pos + 1


def _decode_escaped(data: bytes, pos: int, what: str):
    parts = []
    start = pos
    while True:
        zero = data.find(b"\x00", pos)
        if zero < 0 or zero + 1 >= len(data):
            raise _error(f"{what} has no end mark (0x00 0x01) in the {len(data) - start} byte(s) left")
        parts.append(data[pos:zero])
        nxt = data[zero + 1]
        if nxt == 0xFF:
            parts.append(b"\x00")
            pos = zero + 2
        elif nxt == 0x01:
            return b"".join(parts), zero + 2
        else:
            raise _error(
                f"{what} has 0x00 followed by 0x{nxt:02x} at its byte {zero - start} "
                "(0x00 is written 0x00 0xFF, and 0x00 0x01 ends the element)"
            )


class _BytesElement(Element):
    name = "Bytes"

    def encode_into(self, value, out):
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise _error(f"expected bytes, got {type(value).__name__}")
        out += bytes(value).replace(b"\x00", b"\x00\xff")
        out += b"\x00\x01"

    def decode_from(self, data, pos):
        return _decode_escaped(data, pos, "a byte-string element")


class _StrElement(Element):
    name = "Str"

    def encode_into(self, value, out):
        if not isinstance(value, str):
            raise _error(f"expected str, got {type(value).__name__}")
        try:
            raw = value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise _error(str(e)) from None
        out += raw.replace(b"\x00", b"\x00\xff")
        out += b"\x00\x01"

    def decode_from(self, data, pos):
        raw, end = _decode_escaped(data, pos, "a string element")
        try:
            return raw.decode("utf-8"), end
        except UnicodeDecodeError as e:
            raise _error(f"a string element is not UTF-8: {e.reason} at byte {e.start}") from None


class Fixed(Element):
    """``n`` bytes as they are (Rust's ``[u8; N]``): the width is in the type."""

    def __init__(self, n: int):
        self.n = n
        self.name = f"Fixed({n})"

    def encode_into(self, value, out):
        if not isinstance(value, (bytes, bytearray, memoryview)) or len(value) != self.n:
            raise _error(f"expected {self.n} bytes, got {value!r}")
        out += value

    def decode_from(self, data, pos):
        end = _take(data, pos, self.n, "a byte array")
        return bytes(data[pos:end]), end


class Optional(Element):
    """None, or a value of ``element`` (Rust's ``Option<T>``): None sorts first."""

    def __init__(self, element: Element):
        self.element = element
        self.name = f"Optional({element!r})"

    def encode_into(self, value, out):
        if value is None:
            out.append(0)
        else:
            out.append(1)
            self.element.encode_into(value, out)

    def decode_from(self, data, pos):
        _take(data, pos, 1, "an option")
        tag = data[pos]
        if tag == 0:
            return None, pos + 1
        if tag == 1:
            return self.element.decode_from(data, pos + 1)
        raise _error(f"an option starts with 0x00 (none) or 0x01 (some), not 0x{tag:02x}")


def _whole(element: Element, data: bytes):
    data = bytes(data)
    value, pos = element.decode_from(data, 0)
    if pos != len(data):
        raise _error(f"{len(data) - pos} byte(s) left after the last element (a key of another type?)")
    return value


class Tuple(Element, Codec):
    """A tuple key or value: its elements' order-preserving bytes, in order (Rust's tuples of
    up to five elements). Values are Python tuples. ``encode_prefix`` writes a leading run of
    the elements, for ``Store.prefix``."""

    def __init__(self, *elements: Element):
        if not elements:
            raise TypeError("a Tuple has at least one element")
        for e in elements:
            if not isinstance(e, Element):
                raise TypeError(f"a Tuple's elements are ordered elements (codec.ordered.*), not {e!r}")
        self.elements = elements
        self.name = f"Tuple({', '.join(map(repr, elements))})"

    def encode_into(self, value, out):
        if not isinstance(value, (tuple, list)) or len(value) != len(self.elements):
            raise _error(f"expected a tuple of {len(self.elements)}, got {value!r}")
        for element, item in zip(self.elements, value):
            element.encode_into(item, out)

    def decode_from(self, data, pos):
        items = []
        for i, element in enumerate(self.elements):
            try:
                item, pos = element.decode_from(data, pos)
            except CodecError as e:
                raise _error(f"tuple field .{i}: {e.message}") from None
            items.append(item)
        return tuple(items), pos

    def encode(self, value) -> bytes:
        out = bytearray()
        self.encode_into(value, out)
        return bytes(out)

    def decode(self, data: bytes):
        return _whole(self, data)

    def encode_prefix(self, prefix) -> bytes:
        """The bytes every key whose leading elements equal ``prefix`` (a shorter tuple)
        starts with, and no other key does."""
        if not isinstance(prefix, (tuple, list)) or not 0 < len(prefix) <= len(self.elements):
            raise _error(f"a prefix of {self.name} is a tuple of 1 to {len(self.elements)} elements, not {prefix!r}")
        out = bytearray()
        for element, item in zip(self.elements, prefix):
            element.encode_into(item, out)
        return bytes(out)


class Ordered(Codec):
    """One element as a whole key or value (Rust's ``Ordered<T>``): ``Ordered(ordered.I64)``
    sorts negatives first, where the plain ``I64`` codec does not."""

    def __init__(self, element: Element):
        if not isinstance(element, Element):
            raise TypeError(f"Ordered takes an ordered element (codec.ordered.*), not {element!r}")
        self.element = element
        self.name = f"Ordered({element!r})"

    def encode(self, value) -> bytes:
        out = bytearray()
        self.element.encode_into(value, out)
        return bytes(out)

    def decode(self, data: bytes):
        return _whole(self.element, data)


U8, U16, U32, U64, U128 = (_Unsigned(b) for b in (8, 16, 32, 64, 128))
I8, I16, I32, I64, I128 = (_Signed(b) for b in (8, 16, 32, 64, 128))
Bool = _Bool()
Str = _StrElement()
Bytes = _BytesElement()
