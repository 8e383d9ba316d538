"""Checks the Python codecs against vectors the Rust SDK wrote (guest-sdk/tests/python_codecs.rs):
for each, the Python encoding of the value must be the Rust bytes, and decoding the Rust bytes
must give the value. Prints "N vectors agree", or each disagreement and exits 1."""

import json
import sys

from sluice_guest import codec
from sluice_guest.codec import ordered


def parse_codec(spec: str):
    namespace = {name: getattr(ordered, name) for name in ordered.__all__}
    top = {"Str": codec.Str, "Bytes": codec.Bytes, "U64": codec.U64, "I64": codec.I64, "Json": codec.Json}
    if spec in top:
        return top[spec]
    return eval(spec, {"__builtins__": {}}, namespace)  # the specs are the test's own


def parse_value(v):
    if "s" in v:
        return v["s"]
    if "b" in v:
        return bytes.fromhex(v["b"])
    if "i" in v:
        return int(v["i"])
    if "t" in v:
        return tuple(parse_value(x) for x in v["t"])
    if "none" in v:
        return None
    if "some" in v:
        return parse_value(v["some"])
    if "bool" in v:
        return v["bool"]
    if "json" in v:
        return v["json"]
    raise ValueError(f"unknown value {v!r}")


def main(path: str) -> int:
    bad = 0
    n = 0
    with open(path) as f:
        for line in f:
            n += 1
            vector = json.loads(line)
            c = parse_codec(vector["codec"])
            value = parse_value(vector["value"])
            expected = bytes.fromhex(vector["bytes"])
            try:
                got = c.encode(value)
            except Exception as e:  # noqa: BLE001
                got = f"error: {e}"
            if got != expected:
                bad += 1
                print(f"{vector['codec']} {value!r}: Python writes {got!r}, Rust wrote {expected!r}")
                continue
            decoded = c.decode(expected)
            same = decoded == value and type(decoded) is type(value) if not isinstance(value, (dict, list)) else \
                json.dumps(decoded) == json.dumps(value)
            if not same:
                bad += 1
                print(f"{vector['codec']}: Python reads {expected!r} as {decoded!r}, Rust wrote {value!r}")
    if bad:
        print(f"{bad} of {n} vectors disagree")
        return 1
    print(f"{n} vectors agree")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
