"""Test topology: the Python twin of `guests/formats-echo`. For each format of a Schema
Registry, records are decoded with the SDK's codecs and written again — Avro (`every_in` →
`every_out`, a record of every Avro type, as fastavro reads it), Protobuf (`proto_in` →
`proto_out`, `interop.Order`) and JSON Schema (`json_in` → `json_out`), and JSON orders keyed
by an Avro record (`keyed_in` → `keyed_out`) — from the Rust guest's schema files. What comes out must equal what went in, read by another client (the
interop tests read it with confluent-kafka)."""

import os
import sys

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from sluice_guest import Description, Processor
from sluice_guest.formats import Avro, JsonSchema, Protobuf


def _schema(name: str) -> str:
    """A schema file of the Rust guest, read when the module is imported: natively from
    `guests/formats-echo/schemas`, in the build from the python path (pyproject.toml)."""
    here = os.path.dirname(os.path.abspath(__file__))
    for folder in [os.path.join(here, "..", "..", "formats-echo", "schemas"), *sys.path]:
        path = os.path.join(folder, name)
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                return f.read()
    raise FileNotFoundError(f"{name}: the schemas of guests/formats-echo are not on the python path")


def _order_class():
    """The class protoc would generate from `order.proto`'s `interop.Order`, built from its
    descriptor (there is no protoc here; a project would import its `order_pb2`)."""
    F = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(name="order.proto", package="interop", syntax="proto3")
    order = file.message_type.add(name="Order")

    def field(message, name, number, kind, label=F.LABEL_OPTIONAL, type_name=None):
        message.field.add(name=name, number=number, type=kind, label=label,
                          **({"type_name": type_name} if type_name else {}))

    field(order, "id", 1, F.TYPE_STRING)
    field(order, "quantity", 2, F.TYPE_INT32)
    field(order, "price", 3, F.TYPE_DOUBLE)
    field(order, "tags", 4, F.TYPE_STRING, F.LABEL_REPEATED)
    line = order.nested_type.add(name="Line")
    field(line, "sku", 1, F.TYPE_STRING)
    field(line, "count", 2, F.TYPE_INT64)
    field(order, "lines", 5, F.TYPE_MESSAGE, F.LABEL_REPEATED, ".interop.Order.Line")
    status = order.enum_type.add(name="Status")
    for number, name in enumerate(["NEW", "PAID", "SHIPPED"]):
        status.value.add(name=name, number=number)
    field(order, "status", 6, F.TYPE_ENUM, type_name=".interop.Order.Status")
    entry = order.nested_type.add(name="CountersEntry")
    entry.options.map_entry = True
    field(entry, "key", 1, F.TYPE_STRING)
    field(entry, "value", 2, F.TYPE_INT64)
    field(order, "counters", 7, F.TYPE_MESSAGE, F.LABEL_REPEATED, ".interop.Order.CountersEntry")
    field(order, "blob", 8, F.TYPE_BYTES)
    field(order, "gift", 9, F.TYPE_BOOL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("interop.Order"))


EVERY = Avro(_schema("every.avsc"))
ORDER_PROTO = Protobuf(_order_class(), _schema("order.proto"))
ORDER_JSON = JsonSchema(_schema("order.json"))
ORDER_KEY = Avro(_schema("order-key.avsc"))

_ECHO = {"every_in": ("every_out", EVERY), "proto_in": ("proto_out", ORDER_PROTO),
         "json_in": ("json_out", ORDER_JSON)}


class FormatsEcho(Processor):
    @classmethod
    def describe(cls):
        d = Description("formats-echo")
        for source, (sink, codec) in _ECHO.items():
            d = d.source(source).sink(sink).value_format(source, codec).value_format(sink, codec)
        return (d.source("keyed_in").sink("keyed_out")
                .key_format("keyed_in", ORDER_KEY).key_format("keyed_out", ORDER_KEY)
                .value_format("keyed_in", ORDER_JSON).value_format("keyed_out", ORDER_JSON))

    def init(self, task):
        pass

    def process(self, record, ctx):
        if record.source == "keyed_in":
            ctx.emit("keyed_out", record.key_as(ORDER_KEY), record.value_as(ORDER_JSON), key_codec=ORDER_KEY,
                     value_codec=ORDER_JSON)
            return
        sink, codec = _ECHO[record.source]
        ctx.emit(sink, record.key, record.value_as(codec), value_codec=codec)
