"""Keys and values in the formats of a Schema Registry — Avro, Protobuf, JSON Schema — as
Confluent's serializers write them: the Python twin of the Rust SDK's ``sluice_guest::formats``.

The host does the registry's part (``docs/formats.md``): for a source it finds each record's
writer schema by the id in its first bytes, checks the record, and hands the topology the
payload in the topology's own schema (an Avro record resolved from the writer's schema to this
one, a Protobuf message of this type, a JSON text). For a sink it checks what the topology
emits against the schema declared here, registers the schema and frames each record. So a
codec here reads and writes the payload alone, with no network and no registry, and carries
its schema (``codec.schema``) so that a description, or a DSL stream of these values,
declares which topics hold it:

    from sluice_guest import Description, Processor
    from sluice_guest.formats import Avro

    with open(os.path.join(os.path.dirname(__file__), "order.avsc")) as f:
        ORDER = Avro(f.read())

    class Orders(Processor):
        @classmethod
        def describe(cls):
            return (Description("orders").source("orders").sink("big")
                    .value_format("orders", ORDER).value_format("big", ORDER))

        def process(self, record, ctx):
            order = record.value_as(ORDER)          # a dict, as fastavro reads it
            if order["amount"] > 100:
                ctx.emit("big", record.key, order, value_codec=ORDER)

===================  ==============================================  ==============================
codec                values                                          bytes
===================  ==============================================  ==============================
``Avro(schema)``     fastavro's: dicts, bytes, Decimal, datetime,    Avro binary (fastavro)
                     date, UUID…; ``cls=``: instances of a dataclass
``JsonSchema(s)``    what ``json.loads`` gives                       compact JSON, serde_json's
``Protobuf(...)``    instances of the message class                  the message (google.protobuf)
===================  ==============================================  ==============================

Avro binary is the same bytes for the same value whoever writes it (bar a map's order), so
a Python topology and a Rust one (``serde_avro_fast``) read each other's stores and topics;
``guest-sdk/tests/python_avro.rs`` checks that over random values of every Avro type.

The Avro codec runs on fastavro's pure-Python modules natively as in a component (whose
CPython cannot load compiled extensions): what a test sees is what a worker runs.
google.protobuf runs its compiled implementation natively and its pure-Python one in a
component, with the same bytes. Schemas are read at import time, like everything a component
needs: read ``.avsc`` files at the top of a module (``sluice build`` runs it then, with the
project's folders readable), not inside a function.
"""

from __future__ import annotations

import dataclasses
import io
import json
import re
import sys
import types
from collections.abc import Mapping
from typing import Optional

from ._core import Schema
from .codec import Codec, CodecError, _json_write

__all__ = ["Avro", "JsonSchema", "Protobuf", "Schema"]


# --- fastavro, as a component can load it -------------------------------------------------------

def _import_fastavro():
    """fastavro's pure-Python reader, writer, schema parser and validation (the modules it
    falls back to where its compiled ones cannot load, as in a component), or None when it
    is not installed. The SDK uses them natively too, so that a test sees what a worker runs.

    Its reader and writer import ``bz2`` and ``lzma`` for the compression of Avro container
    files, which componentize-py's CPython lacks (no ``_bz2``, ``_lzma``). Single values never
    use them, so while fastavro is imported those two are stand-ins whose functions say so;
    they are taken out of ``sys.modules`` again afterwards, so that no other import sees them."""
    stand_ins = {}
    for name in ("bz2", "lzma"):
        try:
            __import__(name)
        except ImportError:
            stand_ins[name] = _missing_module(name)
    sys.modules.update(stand_ins)
    try:
        from fastavro import _logical_readers_py, _logical_writers_py, _read_py, _schema_py, _validation_py, _write_py
    except ImportError:
        return None
    finally:
        for name, module in stand_ins.items():
            if sys.modules.get(name) is module:
                del sys.modules[name]
    # Natively the pure-Python reader and writer take their logical types from fastavro's
    # compiled modules (which differ in small ways: a fixed decimal is a bytearray there);
    # here they take the pure-Python ones, as in a component, where they are the same dicts.
    readers, writers = _logical_readers_py.LOGICAL_READERS, _logical_writers_py.LOGICAL_WRITERS
    _read_py.LOGICAL_READERS = readers
    _write_py.LOGICAL_WRITERS = _validation_py.LOGICAL_WRITERS = writers
    return types.SimpleNamespace(read=_read_py, write=_write_py, schema=_schema_py, validation=_validation_py,
                                 readers=readers, writers=writers)


def _missing_module(name: str) -> types.ModuleType:
    module = types.ModuleType(name, f"A stand-in for {name}, which this CPython lacks (sluice_guest.formats).")

    def unavailable(*args, **kwargs):
        raise RuntimeError(f"{name} is not available in a Sluice component: Avro container files compressed "
                           f"with it cannot be read or written here (single Avro values never are)")

    module.compress = module.decompress = unavailable
    return module


_fastavro = _import_fastavro()


def _need_fastavro():
    if _fastavro is None:
        raise ImportError("sluice_guest.formats.Avro runs on fastavro: pip install fastavro==1.13.1 (the version "
                          "the SDK is tested with; `sluice build` puts its pure-Python modules into the component)")
    return _fastavro


# Three logical types are written with fastavro's writers, then held to more than fastavro asks:
# - timestamps: fastavro writes a naive datetime in the machine's local time zone (time.mktime),
#   so the same value would be other bytes natively than in a component (UTC); refused here;
# - a decimal in bytes: fastavro gives a negative power of two (-128, -2**31) one byte more than
#   its two's complement needs; here it is the shortest, as Java's Avro and serde_avro_fast write
#   it, so that the same decimal is the same bytes (a key of a store) in either SDK.
# The codec's own copy of a schema names them after itself, with fastavro's readers; the schema
# the host registers is the topology's text.
_STRICT = {("long", "timestamp-millis"): "sluice-timestamp-millis",
           ("long", "timestamp-micros"): "sluice-timestamp-micros",
           ("bytes", "decimal"): "sluice-decimal"}


def _shortest(data: bytes) -> bytes:
    """A big-endian two's complement without the leading bytes that only repeat the sign."""
    start = 0
    while start + 1 < len(data) and (data[start], data[start + 1] & 0x80) in ((0x00, 0), (0xFF, 0x80)):
        start += 1
    return data[start:]


def _install_strict_writers(fa):
    for (kind, logical), ours in _STRICT.items():
        if f"{kind}-{ours}" in fa.writers:
            continue
        prepare = fa.writers[f"{kind}-{logical}"]
        if kind == "long":
            def strict(datum, schema, prepare=prepare, logical=logical):
                if getattr(datum, "tzinfo", True) is None:
                    raise TypeError(f"a {logical} needs a datetime with a time zone (tzinfo=datetime.timezone.utc): "
                                    f"a naive one has no instant")
                return prepare(datum, schema)
        else:
            def strict(datum, schema, prepare=prepare):
                data = prepare(datum, schema)
                return _shortest(data) if isinstance(data, (bytes, bytearray)) else data
        fa.writers[f"{kind}-{ours}"] = strict
        fa.readers[f"{kind}-{ours}"] = fa.readers[f"{kind}-{logical}"]


def _strict_copy(schema):
    """``schema`` (parsed JSON) with the logical types of ``_STRICT`` renamed for their writers."""
    if isinstance(schema, list):
        return [_strict_copy(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict_copy(v) if k in ("type", "fields", "items", "values") else v for k, v in schema.items()}
    kind, logical = out.get("type"), out.get("logicalType")
    ours = _STRICT.get((kind, logical)) if isinstance(kind, str) and isinstance(logical, str) else None
    if ours is not None:
        out["logicalType"] = ours
    return out


def _avro_name(schema) -> str:
    """What a message calls the schema: a named type's full name, else its type."""
    if isinstance(schema, dict):
        name = schema.get("name")
        if isinstance(name, str):
            namespace = schema.get("namespace")
            return name if "." in name or not namespace else f"{namespace}.{name}"
        return _avro_name(schema.get("type"))
    if isinstance(schema, list):
        return "union [" + ", ".join(_avro_name(s) for s in schema) + "]"
    return str(schema)


class Avro(Codec):
    """Avro binary in the topology's schema ``schema`` (its JSON text, or a dict), with fastavro.

    Values are what fastavro reads and writes, as confluent-kafka's ``AvroDeserializer`` gives
    them: a record is a dict of its fields, ``bytes`` and ``fixed`` are bytes, an enum its
    symbol (str), a union its branch's value, ``decimal`` a ``decimal.Decimal``,
    ``timestamp-millis`` / ``-micros`` an aware ``datetime`` (UTC; a naive one is refused: it
    names no instant), ``local-timestamp-*`` a naive one, ``date`` a ``datetime.date``,
    ``time-*`` a ``datetime.time``, ``uuid`` a ``uuid.UUID``. A record's missing field takes
    its default; a key the schema does not have is an error (a typo would lose the field).

    ``cls``, a dataclass with the record's fields, reads each value as an instance of it and
    writes instances (or dicts); nested records stay dicts.

    The schema is parsed once, here: a schema that does not parse fails the import (the
    build). Text is declared to the host as given (what the registry keeps); a dict as its
    compact JSON."""

    def __init__(self, schema, cls: Optional[type] = None):
        fa = _need_fastavro()
        if isinstance(schema, (bytes, bytearray)):
            schema = bytes(schema).decode("utf-8")
        if isinstance(schema, str):
            text = schema
            try:
                parsed_json = json.loads(schema)
            except ValueError as e:
                raise CodecError("avro", f"the schema is not JSON: {e}") from None
        elif isinstance(schema, (dict, list)):
            parsed_json = schema
            text = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
        else:
            raise TypeError(f"Avro(schema): the schema is its JSON text (an .avsc file's) or a dict, "
                            f"not {type(schema).__name__}")
        _install_strict_writers(fa)
        try:
            fa.schema.parse_schema(parsed_json)  # fastavro's checks of the logical types renamed below
            self._parsed = fa.schema.parse_schema(_strict_copy(parsed_json))
        except Exception as e:  # noqa: BLE001 — fastavro raises several kinds
            raise CodecError("avro", f"the schema does not parse: {type(e).__name__}: {e}") from None
        self._fa = fa
        self.schema = Schema.avro(text)
        self.type_name = _avro_name(parsed_json)
        self.name = f"Avro({self.type_name})"
        self.cls = cls
        self._fields = None
        if cls is not None:
            self._fields = self._check_cls(cls, parsed_json)

    def _check_cls(self, cls, parsed_json):
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            raise TypeError(f"{self.name}: cls is a dataclass with the record's fields, not {cls!r}")
        if not (isinstance(parsed_json, dict) and parsed_json.get("type") == "record"):
            raise TypeError(f"{self.name}: cls= needs a record schema")
        fields = tuple(f.name for f in dataclasses.fields(cls) if f.init)
        schema_fields = [f["name"] for f in parsed_json.get("fields", [])]
        missing = [f for f in schema_fields if f not in fields]
        extra = [f for f in fields if f not in schema_fields]
        if missing or extra:
            what = []
            if missing:
                what.append(f"the schema's {', '.join(missing)} missing from {cls.__name__}")
            if extra:
                what.append(f"{cls.__name__}'s {', '.join(extra)} not in the schema")
            raise TypeError(f"{self.name}: {cls.__name__} must have the record's fields: {'; '.join(what)}")
        return fields

    def encode(self, value) -> bytes:
        datum = value
        if self._fields is not None:
            if isinstance(value, self.cls):
                datum = {name: getattr(value, name) for name in self._fields}
            elif not isinstance(value, dict):
                raise CodecError("avro", f"{self.type_name}: expected a {self.cls.__name__} (or a dict), "
                                         f"got {type(value).__name__}")
        out = io.BytesIO()
        try:
            self._fa.write.schemaless_writer(out, self._parsed, datum, strict_allow_default=True)
        except Exception as e:  # noqa: BLE001 — fastavro raises whatever the value's type does
            raise CodecError("avro", f"{self.type_name}: cannot write the value: {self._why(datum, e)}") from None
        return out.getvalue()

    def _why(self, datum, error) -> str:
        """Where the value departs from the schema, by fastavro's validation (which names the
        field), or the writer's own words (a field missing or unknown, a naive timestamp)."""
        words = str(error)
        if isinstance(error, ValueError) and ("missing from the record" in words or (
                "more fields than the schema" in words and isinstance(datum, Mapping))):
            return words
        try:
            self._fa.validation.validate(datum, self._parsed, raise_errors=True)
        except self._fa.validation.ValidationError as e:
            found = [f"{d.field or 'the value'} is {_short(d.datum)}, not {_avro_name(d.schema)}"
                     for d in e.errors]
            if found:
                return "; ".join(found)
        except Exception:  # noqa: BLE001 — the writer's error says it then
            pass
        return f"{type(error).__name__}: {words}"

    def decode(self, data: bytes):
        data = bytes(data)
        reader = io.BytesIO(data)
        try:
            value = self._fa.read.schemaless_reader(reader, self._parsed)
        except EOFError:
            raise CodecError("avro", f"{self.type_name}: the {len(data)} byte(s) end before the value does "
                                     f"(bytes of another schema?)") from None
        except Exception as e:  # noqa: BLE001 — an index out of range, bad UTF-8, a date beyond Python's
            raise CodecError("avro", f"{self.type_name}: the bytes are not a value of this schema: "
                                     f"{type(e).__name__}: {e}") from None
        left = len(data) - reader.tell()
        if left:
            raise CodecError("avro", f"{self.type_name}: {left} byte(s) left after the value (bytes of another "
                                     f"schema?)")
        if self.cls is not None:
            return self.cls(**value)
        return value


def _short(value) -> str:
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{text} ({type(value).__name__})"


class JsonSchema(Codec):
    """JSON under the JSON Schema ``schema`` (the document as text, or a dict): the host
    validates what is written against it (and, if the manifest asks, what is read). Values are
    what ``json.loads`` gives; they are written compact, as serde_json writes them (the Rust
    SDK's ``JsonSchema<T>``: the same bytes for the same value, keys in the dict's order)."""

    def __init__(self, schema):
        if isinstance(schema, (bytes, bytearray)):
            schema = bytes(schema).decode("utf-8")
        if isinstance(schema, str):
            text = schema
            try:
                document = json.loads(schema)
            except ValueError as e:
                raise CodecError("json-schema", f"the schema is not JSON: {e}") from None
        elif isinstance(schema, (dict, bool)):
            document = schema
            text = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
        else:
            raise TypeError(f"JsonSchema(schema): the schema is a JSON Schema document (text or a dict), "
                            f"not {type(schema).__name__}")
        if not isinstance(document, (dict, bool)):
            raise CodecError("json-schema", f"a JSON Schema is an object (or true/false), not {_short(document)}")
        self.schema = Schema.json_schema(text)
        title = document.get("title") if isinstance(document, dict) else None
        self.name = f"JsonSchema({title})" if isinstance(title, str) else "JsonSchema"

    def encode(self, value) -> bytes:
        out: list = []
        try:
            _json_write(value, out)
            return "".join(out).encode("utf-8")
        except CodecError as e:
            raise CodecError("json-schema", e.message) from None
        except UnicodeEncodeError as e:  # lone surrogates
            raise CodecError("json-schema", str(e)) from None

    def decode(self, data: bytes):
        try:
            return json.loads(bytes(data))
        except (ValueError, UnicodeDecodeError) as e:
            raise CodecError("json-schema", f"the bytes are not JSON: {e}") from None


class Protobuf(Codec):
    """A Protobuf message of ``message_class`` (a class made by protoc's ``*_pb2.py``, or by
    ``google.protobuf.message_factory``), whose ``.proto`` file is the text ``proto``: the
    host registers that text and checks records against it, so it must be the file the class
    was generated from. ``message`` is the message's full name (``package.Message``; by
    default the class's), ``imports`` the files ``proto`` imports, as (import path, text),
    other than Google's well-known types.

    Values are instances of the class (``FromString`` reads them, ``SerializeToString``
    writes them, map entries in key order). A dict is not one: build the message with
    ``google.protobuf.json_format.ParseDict(d, Cls())``. In a component google.protobuf runs
    its pure-Python implementation."""

    def __init__(self, message_class, proto: str, message: Optional[str] = None, imports=()):
        descriptor = getattr(message_class, "DESCRIPTOR", None)
        if not (isinstance(message_class, type) and hasattr(message_class, "FromString")
                and getattr(descriptor, "full_name", None)):
            raise TypeError(f"Protobuf(message_class, ...): a generated message class (from a *_pb2 module), "
                            f"not {message_class!r}")
        if not isinstance(proto, str):
            raise TypeError(f"Protobuf({descriptor.full_name}): proto is the .proto file's text "
                            f"({descriptor.file.name}), not {type(proto).__name__}")
        full_name = descriptor.full_name
        if message is not None and message != full_name:
            raise ValueError(f"Protobuf({full_name}): message={message!r} is not the class's message {full_name!r}")
        package = descriptor.file.package
        top = full_name[len(package) + 1:] if package else full_name
        if not re.search(rf"\bmessage\s+{re.escape(top.split('.')[0])}\b", proto):
            raise ValueError(f"Protobuf({full_name}): the .proto text declares no message {top.split('.')[0]}: "
                             f"give the text of {descriptor.file.name}, the file the class comes from")
        imports = tuple((str(p), str(t)) for p, t in imports)
        self.message_class = message_class
        self.schema = Schema.protobuf(proto, full_name, imports)
        self.name = f"Protobuf({full_name})"

    def encode(self, value) -> bytes:
        if not isinstance(value, self.message_class):
            hint = " (build it with json_format.ParseDict)" if isinstance(value, dict) else ""
            raise CodecError("protobuf", f"{self.schema.message}: expected a {self.message_class.__name__} message, "
                                         f"got {type(value).__name__}{hint}")
        try:
            return value.SerializeToString(deterministic=True)
        except Exception as e:  # noqa: BLE001 — a required field unset (proto2), ...
            raise CodecError("protobuf", f"{self.schema.message}: {type(e).__name__}: {e}") from None

    def decode(self, data: bytes):
        try:
            return self.message_class.FromString(bytes(data))
        except Exception as e:  # noqa: BLE001 — DecodeError, and what the pure-Python parser raises
            raise CodecError("protobuf", f"{self.schema.message}: the bytes are not this message: "
                                         f"{type(e).__name__}: {e}") from None
