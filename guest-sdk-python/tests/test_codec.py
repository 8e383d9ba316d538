"""The codecs: documented bytes, order preservation over random values, errors that name
what is wrong. (Byte-for-byte agreement with the Rust SDK is guest-sdk/tests/python_codecs.rs.)"""

import random

import pytest

from sluice_guest import codec
from sluice_guest.codec import CodecError, Json, Ordered, Str, Tuple, U64, I64, ordered as o


def test_elements_have_the_documented_bytes():
    assert Tuple(o.U16, o.I16, o.Bool).encode((1, -1, True)) == bytes([0, 1, 0x7F, 0xFF, 1])
    assert Ordered(o.I64).encode(-(2**63)) == bytes(8)
    assert Tuple(o.Str, o.Bytes).encode(("a\0b", b"\0\xff")) == b"a\x00\xffb\x00\x01\x00\xff\xff\x00\x01"
    assert Tuple(o.Optional(o.U8), o.Optional(o.U8), o.Fixed(2)).encode((None, 7, b"\x09\x00")) == bytes([0, 1, 7, 9, 0])
    assert U64.encode(258) == bytes([0, 0, 0, 0, 0, 0, 1, 2])
    assert I64.encode(-1) == b"\xff" * 8


def test_malformed_keys_are_errors_that_say_what_is_wrong():
    key = Tuple(o.Str, o.U64)

    def text(data):
        with pytest.raises(CodecError) as e:
            key.decode(data)
        return str(e.value)

    assert text(b"ab") == ("ordered key codec: tuple field .0: a string element has no end mark (0x00 0x01) "
                           "in the 2 byte(s) left")
    assert text(b"a\x00\x07") == ("ordered key codec: tuple field .0: a string element has 0x00 followed by 0x07 "
                                  "at its byte 1 (0x00 is written 0x00 0xFF, and 0x00 0x01 ends the element)")
    assert text(b"a\x00\x01\x00\x00\x01") == "ordered key codec: tuple field .1: a u64 needs 8 byte(s), 3 left"
    assert text(b"a\x00\x01" + bytes(7) + b"\x01!") == \
        "ordered key codec: 1 byte(s) left after the last element (a key of another type?)"
    with pytest.raises(CodecError, match="a bool is 0x00 or 0x01, not 0x02"):
        Tuple(o.Bool, o.U8).decode(bytes([2, 0]))
    with pytest.raises(CodecError, match="expected 8 bytes, got 3"):
        U64.decode(b"abc")
    with pytest.raises(CodecError, match="invalid utf-8"):
        Str.decode(b"\xff\xfe")
    with pytest.raises(CodecError, match="out of range"):
        U64.encode(-1)
    with pytest.raises(CodecError, match="is not a U8"):
        Tuple(o.U8).encode((256,))


def _random_value(element, rng):
    if element is o.Str:
        return "".join(rng.choice(["\0", "\x01", "a", "ÿ", "z", "€"]) for _ in range(rng.randrange(5)))
    if element is o.Bytes:
        return bytes(rng.choice([0, 1, 0xFF, 0x7F]) for _ in range(rng.randrange(5)))
    if element is o.Bool:
        return rng.random() < 0.5
    if element is o.I64:
        return rng.choice([-(2**63), -1, 0, 1, 2**63 - 1, rng.randrange(-5, 5), rng.randrange(-(2**63), 2**63)])
    if element is o.U32:
        return rng.choice([0, 1, 2**32 - 1, rng.randrange(2**32)])
    if isinstance(element, o.Optional):
        return None if rng.random() < 0.3 else _random_value(element.element, rng)
    raise AssertionError(element)


def _sort_key(element, value):
    """How the value sorts (None first, as Rust's Option does)."""
    if isinstance(element, o.Optional):
        return (0,) if value is None else (1, _sort_key(element.element, value))
    if element is o.Str:
        return value.encode("utf-8")  # Rust's String orders by its bytes
    return value


@pytest.mark.parametrize("elements", [
    (o.Str, o.I64), (o.I64, o.Str), (o.Bytes, o.Bool, o.U32), (o.Optional(o.Str), o.I64),
])
def test_tuple_bytes_sort_as_the_values_do_and_read_back(elements):
    rng = random.Random(7)
    key = Tuple(*elements)
    values = [tuple(_random_value(e, rng) for e in elements) for _ in range(400)]
    for v in values:
        assert key.decode(key.encode(v)) == v
    by_value = sorted(values, key=lambda v: tuple(_sort_key(e, x) for e, x in zip(elements, v)))
    by_bytes = sorted(values, key=key.encode)
    assert [key.encode(v) for v in by_value] == [key.encode(v) for v in by_bytes]


def test_a_prefix_is_the_leading_elements():
    key = Tuple(o.Str, o.U64, o.Bool)
    p = key.encode_prefix(("user-1",))
    assert key.encode(("user-1", 5, True)).startswith(p)
    assert not key.encode(("user-10", 5, True)).startswith(p)
    assert key.encode(("user-1", 5, True)).startswith(key.encode_prefix(("user-1", 5)))


def test_json_is_serde_jsons_bytes():
    assert Json.encode({"b": [1, 2.5, None, True], "a": "x\n\"é\x01"}) == \
        '{"b":[1,2.5,null,true],"a":"x\\n\\"é\\u0001"}'.encode()
    assert Json.encode([1e16, 1e15, 1.5e-7, 0.00001, -0.0, float("nan")]) == \
        b"[1e+16,1000000000000000.0,1.5e-7,0.00001,-0.0,null]"
    assert Json.decode(b'{"a":[1,2]}') == {"a": [1, 2]}
    with pytest.raises(CodecError, match="json codec"):
        Json.decode(b"{")
    with pytest.raises(CodecError, match="cannot write a set"):
        Json.encode({1, 2})
    assert codec.Bytes.decode(b"\x00") == b"\x00"
