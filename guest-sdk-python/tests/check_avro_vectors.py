"""Checks the Avro codec against values the Rust SDK wrote (guest-sdk/tests/python_avro.rs):
``python check_avro_vectors.py VECTORS OUT``. The first line of VECTORS is the schema; each
other line a value as serde_json writes the Rust one, and its Avro bytes (serde_avro_fast).

For each, decoding the Rust bytes must give the value in its Python form (built here from the
JSON, by the schema: ``Decimal``, aware ``datetime``, ``UUID``…), and encoding that value must
work; the bytes it writes go to OUT, one hex line per value, for the Rust side to read back
and compare. Prints "N vectors agree", or each disagreement and exits 1."""

import datetime
import decimal
import json
import struct
import sys
import uuid

from sluice_guest.formats import Avro

UTC = datetime.timezone.utc
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=UTC)
EPOCH_NAIVE = datetime.datetime(1970, 1, 1)


def python_value(schema, value, named):
    """The Rust value (as serde_json wrote it) in the form fastavro reads the Avro value in."""
    if isinstance(schema, str) and schema in named:
        schema = named[schema]
    if isinstance(schema, list):
        if len(schema) == 2 and "null" in schema:  # an Option
            other = [s for s in schema if s != "null"][0]
            return None if value is None else python_value(other, value, named)
        # An Option of a Rust enum of the other branches, externally tagged: null, {"Long": 5},
        # {"test.Inner": {…}}.
        if value is None:
            return None
        (branch, inner), = value.items()
        for s in schema:
            name = s if isinstance(s, str) else s.get("name", s.get("type"))
            full = named.get(name, {}).get("__full", name)
            if branch.lower() == str(name).lower() or branch == full:
                return python_value(s, inner, named)
        raise ValueError(f"no branch {branch} in {schema}")
    if isinstance(schema, str):
        schema = {"type": schema}
    kind, logical = schema["type"], schema.get("logicalType")
    if isinstance(kind, (dict, list)) or (isinstance(kind, str) and kind in named):
        return python_value(kind, value, named)
    if kind in ("record", "enum", "fixed"):
        named[schema["name"]] = dict(schema, __full=f"test.{schema['name']}")
    if kind == "record":
        return {f["name"]: python_value(f["type"], value[f["name"]], named) for f in schema["fields"]}
    if logical == "decimal":
        return decimal.Decimal(value)
    if kind in ("bytes", "fixed"):
        return bytes(value)
    if kind == "array":
        return [python_value(schema["items"], v, named) for v in value]
    if kind == "map":
        return {k: python_value(schema["values"], v, named) for k, v in value.items()}
    if kind == "float":
        return struct.unpack("<f", struct.pack("<f", value))[0]  # JSON holds the shortest text of the f32
    if kind == "double":
        return float(value)
    if logical == "uuid":
        return uuid.UUID(value)
    if logical == "date":
        return datetime.date(1970, 1, 1) + datetime.timedelta(days=value)
    if logical in ("time-millis", "time-micros"):
        micros = value * 1000 if logical == "time-millis" else value
        return (datetime.datetime.min + datetime.timedelta(microseconds=micros)).time()
    if logical in ("timestamp-millis", "timestamp-micros", "local-timestamp-millis", "local-timestamp-micros"):
        micros = value * 1000 if logical.endswith("millis") else value
        return (EPOCH_NAIVE if logical.startswith("local") else EPOCH) + datetime.timedelta(microseconds=micros)
    return value  # null, boolean, int, long, string, enum


def same(a, b) -> bool:
    """Equal, with floats equal bit for bit (-0.0 is not 0.0)."""
    if isinstance(a, float) or isinstance(b, float):
        return type(a) is type(b) and struct.pack("<d", a) == struct.pack("<d", b)
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def main(vectors: str, out: str) -> int:
    with open(vectors) as f:
        lines = f.read().splitlines()
    schema_text = json.loads(lines[0])["schema"]
    codec = Avro(schema_text)
    schema = json.loads(schema_text)
    bad = 0
    n = 0
    identical = 0
    written = []
    for line in lines[1:]:
        n += 1
        vector = json.loads(line)
        expected = python_value(schema, vector["value"], {})
        rust = bytes.fromhex(vector["bytes"])
        try:
            got = codec.decode(rust)
        except Exception as e:  # noqa: BLE001
            got = f"error: {e}"
        if not same(got, expected):
            bad += 1
            print(f"Python reads {vector['bytes']} as {got!r}; Rust wrote {expected!r}")
        try:
            mine = codec.encode(expected)
        except Exception as e:  # noqa: BLE001
            bad += 1
            print(f"Python cannot write {expected!r}: {e}")
            mine = b""
        identical += mine == rust
        written.append(mine.hex())
    with open(out, "w") as f:
        f.write("\n".join(written) + "\n")
    if bad:
        print(f"{bad} of {n} vectors disagree")
        return 1
    print(f"{n} vectors agree ({identical} written byte for byte as Rust wrote them)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
