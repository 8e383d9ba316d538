"""Records written and read with confluent-kafka's own Schema Registry serializers, for the
interop tests (tests/tests/all/formats.rs): what a shop's producers and consumers would do.

    python confluent_io.py produce --bootstrap B --registry URL --topic T --format avro \
        --schema FILE [--key-format string|avro] [--key-schema FILE] < records.jsonl
    python confluent_io.py consume --bootstrap B --registry URL --topic T --format avro \
        --count N [--timeout S] [--key-format string] > records.jsonl
    python confluent_io.py random --schema FILE --count N --seed S > values.jsonl

A record line is `{"key": ..., "value": ..., "partition": P}`; values are JSON with the
types Avro has and JSON lacks written as objects: {"$bytes": "<hex>"}, {"$decimal": "1.25"},
{"$uuid": "..."}, {"$timestamp_ms": N}, {"$timestamp_us": N}, {"$date": days},
{"$time_ms": N}, {"$time_us": N}. `consume` writes what the deserializer returned the
same way, so a test compares values exactly. Protobuf takes `--schema FILE.proto` and
`--message NAME`; its message class is made at run time from the file (protoc is not
needed: the Rust tests compile the file with protox and pass a FileDescriptorSet as
`--schema`).
"""

import argparse
import datetime
import decimal
import json
import random
import string
import sys
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.serialization import MessageField, SerializationContext, StringDeserializer, StringSerializer

EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def to_json(v):
    """A deserialized value as JSON, the extra types tagged."""
    if isinstance(v, dict):
        return {k: to_json(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [to_json(x) for x in v]
    if isinstance(v, (bytes, bytearray)):
        return {"$bytes": bytes(v).hex()}
    if isinstance(v, decimal.Decimal):
        return {"$decimal": str(v)}
    if isinstance(v, uuid.UUID):
        return {"$uuid": str(v)}
    if isinstance(v, datetime.datetime):
        delta = v - EPOCH if v.tzinfo else v - EPOCH.replace(tzinfo=None)
        return {"$timestamp_us": delta // datetime.timedelta(microseconds=1)}
    if isinstance(v, datetime.date):
        return {"$date": (v - datetime.date(1970, 1, 1)).days}
    if isinstance(v, datetime.time):
        us = ((v.hour * 60 + v.minute) * 60 + v.second) * 1_000_000 + v.microsecond
        return {"$time_us": us}
    if isinstance(v, float) and v != v:
        return {"$float": "nan"}
    return v


def from_json(v):
    """JSON with tagged extra types, as the serializers take values."""
    if isinstance(v, dict):
        if len(v) == 1:
            (tag, x), = v.items()
            if tag == "$bytes":
                return bytes.fromhex(x)
            if tag == "$decimal":
                return decimal.Decimal(x)
            if tag == "$uuid":
                return uuid.UUID(x)
            if tag == "$timestamp_ms":
                return EPOCH + datetime.timedelta(milliseconds=x)
            if tag == "$timestamp_us":
                return EPOCH + datetime.timedelta(microseconds=x)
            if tag == "$date":
                return datetime.date(1970, 1, 1) + datetime.timedelta(days=x)
            if tag == "$time_ms":
                return (datetime.datetime.min + datetime.timedelta(milliseconds=x)).time()
            if tag == "$time_us":
                return (datetime.datetime.min + datetime.timedelta(microseconds=x)).time()
        return {k: from_json(x) for k, x in v.items()}
    if isinstance(v, list):
        return [from_json(x) for x in v]
    return v


def serializers(args, client, part):
    fmt = getattr(args, f"{part}_format")
    schema_file = getattr(args, f"{part}_schema")
    if fmt == "string":
        return StringSerializer("utf_8")
    conf = {"auto.register.schemas": True}
    text = None if fmt == "protobuf" else open(schema_file).read()
    if fmt == "avro":
        from confluent_kafka.schema_registry.avro import AvroSerializer
        return AvroSerializer(client, text, conf=conf)
    if fmt == "json":
        from confluent_kafka.schema_registry.json_schema import JSONSerializer
        return JSONSerializer(text, client, conf=conf)
    if fmt == "protobuf":
        from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
        message = proto_class(schema_file, args.message)
        return ProtobufSerializer(message, client, conf={"use.deprecated.format": False, **conf}), message
    raise SystemExit(f"no format {fmt}")


def deserializers(args, client, part):
    fmt = getattr(args, f"{part}_format")
    if fmt == "string":
        return StringDeserializer("utf_8")
    if fmt == "avro":
        from confluent_kafka.schema_registry.avro import AvroDeserializer
        return AvroDeserializer(client)
    if fmt == "json":
        from confluent_kafka.schema_registry.json_schema import JSONDeserializer
        schema_file = getattr(args, f"{part}_schema")
        return JSONDeserializer(open(schema_file).read() if schema_file else None, schema_registry_client=client)
    if fmt == "protobuf":
        from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
        message = proto_class(getattr(args, f"{part}_schema"), args.message)
        return ProtobufDeserializer(message, {"use.deprecated.format": False})
    raise SystemExit(f"no format {fmt}")


def proto_class(descriptor_set, message):
    """The message class of `message`, built at run time from a FileDescriptorSet file (no
    protoc here: the Rust test harness compiles the .proto with protox and writes the set)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    fds = descriptor_pb2.FileDescriptorSet()
    fds.ParseFromString(open(descriptor_set, "rb").read())
    pool = descriptor_pool.DescriptorPool()
    for f in fds.file:
        pool.Add(f)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(message))


def produce(args):
    client = SchemaRegistryClient({"url": args.registry})
    producer = Producer({"bootstrap.servers": args.bootstrap, "linger.ms": 5, "enable.idempotence": True})
    ser_value = serializers(args, client, "value")
    ser_key = serializers(args, client, "key")
    message = None
    if isinstance(ser_value, tuple):
        ser_value, message = ser_value
    count = 0
    for line in sys.stdin:
        if not line.strip():
            continue
        r = json.loads(line)
        value = r.get("value")
        if value is not None:
            value = from_json(value)
            if message is not None:
                from google.protobuf import json_format
                value = json_format.ParseDict(value, message())
            value = ser_value(value, SerializationContext(args.topic, MessageField.VALUE))
        key = r.get("key")
        if key is not None:
            key = ser_key(from_json(key), SerializationContext(args.topic, MessageField.KEY))
        kwargs = {"key": key, "value": value}
        if "partition" in r:
            kwargs["partition"] = r["partition"]
        if "timestamp" in r:
            kwargs["timestamp"] = r["timestamp"]
        while True:
            try:
                producer.produce(args.topic, **kwargs)
                break
            except BufferError:
                producer.poll(0.1)
        count += 1
        producer.poll(0)
    left = producer.flush(60)
    if left:
        raise SystemExit(f"{left} records not delivered")
    print(json.dumps({"produced": count}))


def consume(args):
    client = SchemaRegistryClient({"url": args.registry})
    de_value = deserializers(args, client, "value")
    de_key = deserializers(args, client, "key")
    consumer = Consumer({
        "bootstrap.servers": args.bootstrap,
        "group.id": f"confluent-io-{uuid.uuid4()}",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "isolation.level": "read_committed",
    })
    consumer.subscribe([args.topic])
    import time
    deadline = time.monotonic() + args.timeout
    got = 0
    while got < args.count and time.monotonic() < deadline:
        m = consumer.poll(0.5)
        if m is None:
            continue
        if m.error():
            raise SystemExit(f"consumer: {m.error()}")
        value = m.value()
        if value is not None:
            value = de_value(value, SerializationContext(args.topic, MessageField.VALUE))
            if args.value_format == "protobuf":
                from google.protobuf import json_format
                value = json_format.MessageToDict(value, preserving_proto_field_name=True,
                                                  always_print_fields_with_no_presence=True)
        key = m.key()
        if key is not None:
            key = de_key(key, SerializationContext(args.topic, MessageField.KEY))
        print(json.dumps({"partition": m.partition(), "offset": m.offset(), "key": to_json(key),
                          "value": to_json(value)}, sort_keys=True), flush=True)
        got += 1
    consumer.close()
    if got < args.count:
        raise SystemExit(f"read {got} of {args.count} records from {args.topic} in {args.timeout} s")


def random_value(schema, rng, names, depth=0):
    """A random value of an Avro schema (parsed JSON), as the serializers take it."""
    if isinstance(schema, str):
        if schema in names:
            return random_value(names[schema], rng, names, depth + 1)
        schema = {"type": schema}
    if isinstance(schema, list):
        branch = rng.randrange(len(schema))
        return random_value(schema[branch], rng, names, depth + 1)
    t = schema["type"]
    logical = schema.get("logicalType")
    if isinstance(t, (dict, list)):
        return random_value(t, rng, names, depth + 1)
    if logical == "decimal":
        scale = schema.get("scale", 0)
        digits = rng.randrange(0, 10 ** min(schema["precision"], 12))
        return decimal.Decimal(digits * rng.choice([1, -1])).scaleb(-scale)
    if logical == "uuid":
        return uuid.UUID(int=rng.getrandbits(128))
    if logical == "date":
        return datetime.date(1970, 1, 1) + datetime.timedelta(days=rng.randrange(-20000, 40000))
    if logical == "time-millis":
        return (datetime.datetime.min + datetime.timedelta(milliseconds=rng.randrange(86_400_000))).time().replace(
            microsecond=0)
    if logical == "time-micros":
        return (datetime.datetime.min + datetime.timedelta(microseconds=rng.randrange(86_400_000_000))).time()
    if logical == "timestamp-millis":
        return EPOCH + datetime.timedelta(milliseconds=rng.randrange(-10**12, 4 * 10**12))
    if logical == "timestamp-micros":
        return EPOCH + datetime.timedelta(microseconds=rng.randrange(-10**15, 4 * 10**15))
    if t == "null":
        return None
    if t == "boolean":
        return rng.random() < 0.5
    if t == "int":
        return rng.randrange(-2**31, 2**31)
    if t == "long":
        return rng.randrange(-2**63, 2**63)
    if t == "float":
        import struct
        return struct.unpack("<f", struct.pack("<f", rng.uniform(-1e6, 1e6)))[0]
    if t == "double":
        return rng.uniform(-1e300, 1e300) if rng.random() < 0.5 else rng.uniform(-1, 1)
    if t == "bytes":
        return bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 24)))
    if t == "string":
        alphabet = string.ascii_letters + string.digits + " éß→😀\u0000"
        return "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 16)))
    if t == "fixed":
        names[schema["name"]] = schema
        return bytes(rng.getrandbits(8) for _ in range(schema["size"]))
    if t == "enum":
        names[schema["name"]] = schema
        return rng.choice(schema["symbols"])
    if t == "array":
        return [random_value(schema["items"], rng, names, depth + 1) for _ in range(rng.randrange(0, 5 if depth < 4 else 1))]
    if t == "map":
        return {f"k{i}{rng.randrange(1000)}": random_value(schema["values"], rng, names, depth + 1)
                for i in range(rng.randrange(0, 4 if depth < 4 else 1))}
    if t == "record":
        names[schema["name"]] = schema
        if "namespace" in schema:
            names[schema["namespace"] + "." + schema["name"]] = schema
        return {f["name"]: random_value(f["type"], rng, names, depth + 1) for f in schema["fields"]}
    raise SystemExit(f"no random values of {schema}")


def random_values(args):
    schema = json.load(open(args.schema))
    rng = random.Random(args.seed)
    for i in range(args.count):
        value = random_value(schema, rng, {})
        print(json.dumps({"key": f"k{i}", "value": to_json(value)}, sort_keys=True))


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("produce", "consume"):
        c = sub.add_parser(name)
        c.add_argument("--bootstrap", required=True)
        c.add_argument("--registry", required=True)
        c.add_argument("--topic", required=True)
        c.add_argument("--format", dest="value_format", default="avro", choices=["avro", "json", "protobuf", "string"])
        c.add_argument("--schema", dest="value_schema")
        c.add_argument("--message")
        c.add_argument("--key-format", default="string", choices=["avro", "json", "string"])
        c.add_argument("--key-schema")
        if name == "consume":
            c.add_argument("--count", type=int, required=True)
            c.add_argument("--timeout", type=float, default=60)
    r = sub.add_parser("random")
    r.add_argument("--schema", required=True)
    r.add_argument("--count", type=int, required=True)
    r.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    {"produce": produce, "consume": consume, "random": random_values}[args.command](args)


if __name__ == "__main__":
    main()
