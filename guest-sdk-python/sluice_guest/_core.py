"""The Processor API: what a topology declares, the records it reads, how it emits."""

from __future__ import annotations

import os
import traceback
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from . import _host
from .codec import Codec, CodecError, Str
from .wire import (INHERIT_TIMESTAMP, NONE, WireError, Writer, _source_headers, _u32, fixed_at, headers_at,
                   timestamp_bytes)
import struct as _struct

__all__ = [
    "Error", "Level", "Description", "Subtopology", "TaskInfo", "Record", "Context", "Processor", "Schema",
    "TopicFormat",
]


class Error(Exception):
    """A failure in a topology's code. Raising it (or any exception) fails the task at the
    record being processed; the host reports the message with the topology, partition and
    offset, and the manifest's ``on-error`` decides what happens to the record."""


class Level:
    """Severity of a log line."""

    TRACE = 0
    DEBUG = 1
    INFO = 2
    WARN = 3
    ERROR = 4


@dataclass
class Subtopology:
    """One stage of a topology: its tasks read ``sources`` and may write ``sinks`` and open
    ``stores``, all declared in the description too."""

    name: str
    sources: List[str] = field(default_factory=list)
    sinks: List[str] = field(default_factory=list)
    stores: List[str] = field(default_factory=list)

    def source(self, name: str) -> "Subtopology":
        self.sources.append(name)
        return self

    def sink(self, name: str) -> "Subtopology":
        self.sinks.append(name)
        return self

    def store(self, name: str) -> "Subtopology":
        self.stores.append(name)
        return self


#: The schema languages of a Schema Registry, as the WIT and ``sluice_wire::SchemaKind`` name them.
SCHEMA_KINDS = ("avro", "protobuf", "json-schema")


@dataclass(frozen=True)
class Schema:
    """A schema a topology reads or writes a topic's keys or values with, in the Confluent wire
    format behind a Schema Registry (the Rust SDK's ``sluice_guest::formats::Schema``).

    The host registers ``text`` as it is and fetches the writers' schemas itself, so it is
    the schema's text, not a parsed form. The codecs of :mod:`sluice_guest.formats` carry
    theirs (``Avro(...).schema``); a description takes either."""

    #: ``"avro"``, ``"protobuf"`` or ``"json-schema"``.
    kind: str
    #: Avro's JSON, a ``.proto`` file, or a JSON Schema document.
    text: str
    #: Protobuf: the message the records are (its full name, ``package.Message``).
    message: Optional[str] = None
    #: Protobuf: the files ``text`` imports, as (import path, text), other than Google's
    #: well-known types (the host knows those).
    imports: Tuple[Tuple[str, str], ...] = ()

    def __post_init__(self):
        if self.kind not in SCHEMA_KINDS:
            raise ValueError(f"a schema's kind is one of {', '.join(SCHEMA_KINDS)}, not {self.kind!r}")
        if not isinstance(self.text, str):
            raise TypeError(f"a schema's text is a str (the {self.kind} schema as the registry keeps it), "
                            f"not {type(self.text).__name__}")
        if (self.kind == "protobuf") != (self.message is not None):
            raise ValueError("a Protobuf schema names its message (package.Message), and only a Protobuf one")
        object.__setattr__(self, "imports", tuple((str(p), str(t)) for p, t in self.imports))

    @classmethod
    def avro(cls, text: str) -> "Schema":
        return cls("avro", text)

    @classmethod
    def json_schema(cls, text: str) -> "Schema":
        return cls("json-schema", text)

    @classmethod
    def protobuf(cls, text: str, message: str, imports=()) -> "Schema":
        return cls("protobuf", text, message, tuple(imports))


@dataclass
class TopicFormat:
    """What one source, sink or internal topic (by its logical name) holds: its key's schema
    and its value's, each None for plain bytes."""

    topic: str
    key: Optional[Schema] = None
    value: Optional[Schema] = None


def _schema_of(what: str, topic: str, schema) -> Schema:
    if isinstance(schema, Schema):
        return schema
    carried = getattr(schema, "schema", None)
    if isinstance(carried, Schema):
        return carried
    raise TypeError(f"{what}({topic!r}, ...) takes a Schema or a codec that carries one (sluice_guest.formats: "
                    f"Avro, JsonSchema, Protobuf), not {schema!r}")


@dataclass
class Description:
    """What a topology declares: everything it may touch (as the Rust SDK's ``Description``).

    ``Description("uppercase").source("input").sink("output")``
    """

    name: str
    sources: List[str] = field(default_factory=list)
    sinks: List[str] = field(default_factory=list)
    stores: List[str] = field(default_factory=list)
    # (name, partitions or None)
    internal_topics: List[tuple] = field(default_factory=list)
    subtopologies: List[Subtopology] = field(default_factory=list)
    # (store name, logical topic)
    global_stores: List[tuple] = field(default_factory=list)
    # Topics in the Confluent wire format, with their schemas (the WIT's `formats` export).
    formats: List[TopicFormat] = field(default_factory=list)

    def source(self, name: str) -> "Description":
        self.sources.append(name)
        return self

    def sink(self, name: str) -> "Description":
        self.sinks.append(name)
        return self

    def store(self, name: str) -> "Description":
        self.stores.append(name)
        return self

    def internal_topic(self, name: str, partitions: Optional[int] = None) -> "Description":
        """A topic the topology writes and reads itself (a repartition topic): a source and
        a sink too."""
        self.sources.append(name)
        self.sinks.append(name)
        self.internal_topics.append((name, partitions))
        return self

    def global_store(self, name: str, topic: str) -> "Description":
        self.global_stores.append((name, topic))
        return self

    def subtopology(self, subtopology: Subtopology) -> "Description":
        self.subtopologies.append(subtopology)
        return self

    def key_format(self, topic: str, schema) -> "Description":
        """Reads or writes the keys of ``topic`` (a declared source, sink or internal topic) in
        the Confluent wire format with ``schema``: a :class:`Schema`, or a codec of
        :mod:`sluice_guest.formats` (``Avro(ORDER_SCHEMA)``), whose schema it takes. The host
        then hands the topology each key without its framing, in this schema."""
        schema = _schema_of("key_format", topic, schema)
        self._format(topic).key = schema
        return self

    def value_format(self, topic: str, schema) -> "Description":
        """As :meth:`key_format`, for the values of ``topic``."""
        schema = _schema_of("value_format", topic, schema)
        self._format(topic).value = schema
        return self

    def format_of(self, topic: str) -> Optional[TopicFormat]:
        """The format of ``topic``'s records, if it has one."""
        return next((f for f in self.formats if f.topic == topic), None)

    def _format(self, topic: str) -> TopicFormat:
        found = self.format_of(topic)
        if found is None:
            found = TopicFormat(topic)
            self.formats.append(found)
        return found


@dataclass
class TaskInfo:
    """The task an instance runs: one sub-topology on one partition of its sources."""

    topology: str
    subtopology: str
    task_id: str
    partition: int
    source_topics: List[str]
    sink_topics: List[str]


class Record:
    """One input record. Its fields are read from the batch when asked for: ``key`` and
    ``value`` are bytes (None when absent), ``key_as(codec)`` and ``value_as(codec)`` decode
    them. It is valid after the call too (it holds the batch's bytes)."""

    __slots__ = ("_buf", "_kpos", "_klen", "_vpos", "_vlen", "_fpos", "source")

    def __init__(self, buf, kpos, klen, vpos, vlen, fpos, source):
        self._buf = buf
        self._kpos = kpos
        self._klen = klen
        self._vpos = vpos
        self._vlen = vlen
        self._fpos = fpos
        self.source = source

    @property
    def key(self) -> Optional[bytes]:
        """The key's bytes, or None for a record without a key."""
        if self._klen == NONE:
            return None
        return self._buf[self._kpos:self._kpos + self._klen]

    @property
    def value(self) -> Optional[bytes]:
        """The value's bytes, or None for a tombstone."""
        if self._vlen == NONE:
            return None
        return self._buf[self._vpos:self._vpos + self._vlen]

    def key_as(self, codec: Codec = Str):
        """The key decoded with ``codec`` (default ``Str``); a record without a key is an error."""
        if self._klen == NONE:
            raise Error(f"{self._describe()} has no key")
        try:
            return codec.decode(self._buf[self._kpos:self._kpos + self._klen])
        except CodecError as e:
            raise Error(f"the key of {self._describe()}: {e}") from None

    def value_as(self, codec: Codec = Str):
        """The value decoded with ``codec`` (default ``Str``); a tombstone is an error."""
        if self._vlen == NONE:
            raise Error(f"{self._describe()} has no value")
        try:
            return codec.decode(self._buf[self._vpos:self._vpos + self._vlen])
        except CodecError as e:
            raise Error(f"the value of {self._describe()}: {e}") from None

    @property
    def timestamp(self) -> int:
        """Milliseconds since the epoch."""
        return fixed_at(self._buf, self._fpos)[0]

    @property
    def partition(self) -> int:
        return fixed_at(self._buf, self._fpos)[2]

    @property
    def offset(self) -> int:
        return fixed_at(self._buf, self._fpos)[3]

    @property
    def headers(self) -> List[tuple]:
        """(name, value bytes or None) for each header, in order."""
        count = fixed_at(self._buf, self._fpos)[4]
        if not count:
            return []
        return headers_at(self._buf, self._fpos + 28, count, len(self._buf))[0]

    def _describe(self) -> str:
        return f"the record at {self.source}/{self.partition}@{self.offset}"

    def __repr__(self) -> str:
        return (f"Record(source={self.source!r}, key={self.key!r}, value={self.value!r}, "
                f"timestamp={self.timestamp}, partition={self.partition}, offset={self.offset})")


def _as_bytes(what: str, item, codec: Optional[Codec]):
    if codec is not None:
        return None if item is None else codec.encode(item)
    if item is None or isinstance(item, (bytes, bytearray, memoryview)):
        return item
    if isinstance(item, str):
        return item.encode("utf-8")
    raise Error(f"cannot emit a {type(item).__name__} {what} without a codec: "
                f"pass {what}_codec= (e.g. U64, Json) or bytes or str")


class Context:
    """How a processor talks to the host: emit records to declared sinks, log, read the clock.

    Emitted records are written into one buffer and handed to the host when the call
    returns: one transfer per batch, not one host call per record."""

    __slots__ = ("_sinks", "_index", "_out", "_violation", "_timestamp", "_record")

    def __init__(self, sinks: List[str]):
        self._sinks = list(sinks)
        self._index = {name: i for i, name in enumerate(self._sinks)}
        self._out = Writer()
        self._violation: Optional[str] = None
        self._timestamp = INHERIT_TIMESTAMP
        self._record: Optional[Record] = None

    @property
    def sinks(self) -> List[str]:
        """The declared sinks, in order."""
        return list(self._sinks)

    def emit(self, sink: str, key, value, *, key_codec: Optional[Codec] = None,
             value_codec: Optional[Codec] = None, headers=None):
        """Emits a record to ``sink`` with the timestamp of the input being processed (in
        ``punctuate``, the stream time). ``key`` and ``value`` are bytes, str (UTF-8), None,
        or any value with a codec (``value_codec=U64``). An undeclared sink is an error."""
        index = self._index.get(sink)
        if index is None:
            self._undeclared(sink)
        record = self._record
        if record is not None:
            # The input's own 8 bytes: its timestamp is never decoded.
            timestamp = record._buf[record._fpos:record._fpos + 8]
        else:
            timestamp = timestamp_bytes(self._timestamp)
        # The common case, bytes or text without codecs, without a call per field.
        if key_codec is None and value_codec is None and (key is None or type(key) is bytes):
            kind = type(value)
            if kind is str:
                self._out.emit(index, key, value.encode("utf-8"), timestamp, headers)
                return
            if kind is bytes:
                self._out.emit(index, key, value, timestamp, headers)
                return
        self._emit(sink, index, key, value, key_codec, value_codec, timestamp, headers)

    def emit_at(self, sink: str, key, value, timestamp_ms: int, *, key_codec: Optional[Codec] = None,
                value_codec: Optional[Codec] = None, headers=None):
        """Emits like ``emit``, with an explicit timestamp (milliseconds since the epoch). Kafka
        has no negative timestamps: a negative one is sent as none."""
        index = self._index.get(sink)
        if index is None:
            self._undeclared(sink)
        timestamp = timestamp_bytes(max(int(timestamp_ms), -1))
        self._emit(sink, index, key, value, key_codec, value_codec, timestamp, headers)

    def _undeclared(self, sink):
        message = f"emit to undeclared sink {sink!r}; the topology declares {self._sinks!r}"
        if self._violation is None:
            self._violation = message
        raise Error(message)

    def _emit(self, sink, index, key, value, key_codec, value_codec, timestamp, headers):
        try:
            k = _as_bytes("key", key, key_codec)
            v = _as_bytes("value", value, value_codec)
        except CodecError as e:
            raise Error(f"encoding a record for sink {sink!r}: {e}") from None
        self._out.emit(index, k, v, timestamp, headers)

    def log(self, level: int, message: str):
        """Writes a line to the worker's log, tagged with this topology and task."""
        _host.backend().log(level, str(message))

    def now_ms(self) -> int:
        """Wall-clock time from the host, milliseconds since the epoch."""
        return _host.backend().now_ms()


class Processor:
    """A stream-processing topology. One object of it exists per task.

    Subclass it and define ``describe`` (a classmethod) and ``process``; ``init``,
    ``batch_started``, ``batch_done``, ``punctuate`` and ``close`` are optional.
    ``export(MyProcessor)`` makes it the component's topology (``sluice build`` does it)."""

    @classmethod
    def describe(cls) -> Description:
        """Declares sources, sinks and stores. Called before any task starts."""
        raise NotImplementedError(f"{cls.__name__}.describe")

    def init(self, task: TaskInfo) -> None:
        """Prepares this object for one task (open stores here)."""

    def process(self, record: Record, ctx: Context) -> None:
        """Handles one record; emit with ``ctx``. An exception stops the task at this record
        (or, as the manifest's ``on-error`` says, skips it or sends it to the dead-letter topic)."""
        raise NotImplementedError(f"{type(self).__name__}.process")

    def batch_started(self) -> None:
        """Called before the records of each batch (see the Rust SDK's ``batch_started``)."""

    def batch_done(self, ctx: Context) -> None:
        """Called after the last record of each batch, before the host takes what it emitted."""

    def punctuate(self, stream_time_ms: int, ctx: Context) -> None:
        """Called as time advances (about once per punctuation interval), between batches."""

    def close(self, ctx: Context) -> None:
        """Called once when the task ends cleanly."""

    @classmethod
    def operators(cls) -> List[tuple]:
        """What each sub-topology does, for people: (sub-topology name, [line, ...])."""
        return []


class GuestFailure(Exception):
    """A call failed: what the host is told (a message, and the batch record at fault)."""

    def __init__(self, message: str, record_index: Optional[int] = None):
        super().__init__(message)
        self.message = message
        self.record_index = record_index


_SDK_DIR = os.path.dirname(os.path.abspath(__file__))
_MAX_MESSAGE = 3000


def failure_message(exc: BaseException) -> str:
    """An exception as the task's error: its type and message, then the traceback's frames
    in the topology's own code (the SDK's are left out), innermost last, on one line."""
    if isinstance(exc, Error):
        head = str(exc)
    else:
        head = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not os.path.abspath(f.filename).startswith(_SDK_DIR)]
    if frames:
        where = " <- ".join(f"{os.path.basename(f.filename)}:{f.lineno} in {f.name}" for f in reversed(frames[-8:]))
        message = f"{head} (Python traceback, innermost first: {where})"
    else:
        message = head
    if len(message) > _MAX_MESSAGE:
        message = message[:_MAX_MESSAGE] + " …"
    return message


class Task:
    """One task's processor and context, and the calls the host makes (`process` etc.),
    each returning the emitted records' buffer or raising GuestFailure."""

    def __init__(self, topology: type, info: TaskInfo):
        description = topology.describe()
        self.sources = list(description.sources)
        self.ctx = Context(description.sinks)
        try:
            self.processor = topology()
            self.processor.init(info)
        except BaseException as e:  # noqa: BLE001 — every failure is the task's error
            raise GuestFailure(f"init: {failure_message(e)}") from None

    def _fail(self, message: str, index: Optional[int]):
        self.ctx._out.clear()
        self.ctx._violation = None
        self.ctx._record = None
        raise GuestFailure(message, index)

    def process(self, batch: bytes) -> bytes:
        ctx = self.ctx
        processor = self.processor
        sources = self.sources
        n_sources = len(sources)
        process = processor.process
        u32 = _u32
        source_headers = _source_headers
        try:
            processor.batch_started()
        except BaseException as e:  # noqa: BLE001 — SystemExit too
            self._fail(failure_message(e), None)
        end = len(batch)
        index = -1
        pos = 4
        try:
            count = u32(batch, 0)[0]
            # Walks the batch: each record's fields are found, none is decoded.
            for index in range(count):
                klen = u32(batch, pos)[0]
                kpos = pos + 4
                pos = kpos if klen == NONE else kpos + klen
                vlen = u32(batch, pos)[0]
                vpos = pos + 4
                fpos = vpos if vlen == NONE else vpos + vlen
                pos = fpos + 28
                if pos > end:
                    raise WireError(fpos, "a timestamp, source, partition, offset and header count")
                source, hcount = source_headers(batch, fpos + 8)
                if hcount:
                    pos = headers_at(batch, pos, hcount, end)[1]
                if source >= n_sources:
                    self._fail(f"the host sent a record from source #{source}, which is not declared", index)
                record = Record(batch, kpos, klen, vpos, vlen, fpos, sources[source])
                ctx._record = record
                process(record, ctx)
                if ctx._violation is not None:
                    self._fail(ctx._violation, index)
            if pos != end:
                raise WireError(pos, "the end of the batch")
        except GuestFailure:
            raise
        except _struct.error:
            self._fail(str(WireError(pos, "a length within the batch")), None)
        except WireError as e:
            self._fail(str(e), None)
        except BaseException as e:  # noqa: BLE001 — SystemExit too
            self._fail(ctx._violation or failure_message(e), index if index >= 0 else None)
        ctx._record = None
        try:
            processor.batch_done(ctx)
        except BaseException as e:  # noqa: BLE001 — SystemExit too
            self._fail(ctx._violation or failure_message(e), None)
        if ctx._violation is not None:
            self._fail(ctx._violation, None)
        return ctx._out.take()

    def _finish(self, call, timestamp: int) -> bytes:
        ctx = self.ctx
        ctx._record = None
        ctx._timestamp = timestamp
        try:
            call()
        except BaseException as e:  # noqa: BLE001 — SystemExit too
            self._fail(ctx._violation or failure_message(e), None)
        if ctx._violation is not None:
            self._fail(ctx._violation, None)
        return ctx._out.take()

    def punctuate(self, stream_time_ms: int) -> bytes:
        return self._finish(lambda: self.processor.punctuate(stream_time_ms, self.ctx), stream_time_ms)

    def close(self) -> bytes:
        return self._finish(lambda: self.processor.close(self.ctx), INHERIT_TIMESTAMP)
