"""The operators: streams, tables, groupings, time windows, joins, the record cache and the
stored layouts (a port of the Rust SDK's ``dsl``, operator for operator: the same node names,
repartition topics, stores and stored bytes, so that a Python topology compiles to the same
sub-topologies as its Rust twin and either can read the other's stores)."""

from __future__ import annotations

import datetime
from collections import OrderedDict
from typing import Callable, List, NamedTuple, Optional

from .._core import Error
from ..codec import Bytes, Codec, CodecError, U64
from ..codec import ordered as _ordered
from ._graph import Graph, Node, Punctuator, check_store_like, decode, encode, formats_of, q

__all__ = [
    "StreamsBuilder", "KStream", "KTable", "GlobalKTable", "KGroupedStream", "KGroupedTable", "TimeWindows",
    "WindowedBy",
    "Windowed", "WindowedCodec", "Change", "Unit",
]


# --- Codecs the DSL adds ----------------------------------------------------------------------

class _Unit(Codec):
    """A key (or value) nobody reads: anything reads as None, None writes a null (Rust's ``()``)."""

    name = "Unit"

    def encode(self, value):
        return None

    def decode(self, data):
        return None


Unit = _Unit()


class Windowed(NamedTuple):
    """The key of a windowed aggregation: the record key and the window ``[start, end)`` in
    milliseconds."""

    key: object
    start: int
    end: int


class WindowedCodec(Codec):
    """A windowed key as the Rust SDK writes it: the key's bytes, then start and end, each 8
    bytes big-endian."""

    def __init__(self, inner: Codec):
        self.inner = inner
        self.name = f"Windowed({inner!r})"

    def encode(self, value) -> bytes:
        key = b"" if value.key is None else (self.inner.encode(value.key) or b"")
        return key + _I64.pack(value.start) + _I64.pack(value.end)

    def decode(self, data):
        if len(data) < 16:
            raise CodecError("windowed key", f"needs at least 16 bytes (start and end), got {len(data)}")
        key = bytes(data[:-16])
        start, end = _I64.unpack(data[-16:-8])[0], _I64.unpack(data[-8:])[0]
        return Windowed(self.inner.decode(key), start, end)


import struct as _struct  # noqa: E402

_I64 = _struct.Struct(">q")


class Change(NamedTuple):
    """What a table forwards: a key's new value and the one it replaces (None: absent)."""

    new: object
    old: object


# --- Values kept with a timestamp (the Rust SDK's ``stamp.rs``) -------------------------------

TAG = bytes([0xF5, 0xC1]) + b"SlTs" + bytes([0x00, 0x01])
UNKNOWN = -(1 << 63)
I64_MAX = (1 << 63) - 1


def stamp(value: bytes, ts: int) -> bytes:
    return value + _I64.pack(ts) + TAG


def unstamp(stored: bytes):
    """A stored value's codec bytes and its time (UNKNOWN for a value stored without one)."""
    if len(stored) >= 16 and stored[-8:] == TAG:
        return stored[:-16], _I64.unpack(stored[-16:-8])[0]
    return stored, UNKNOWN


def _ms(d) -> int:
    if isinstance(d, datetime.timedelta):
        return d // datetime.timedelta(milliseconds=1)
    if isinstance(d, bool) or not isinstance(d, int):
        raise TypeError(f"a duration is milliseconds (int) or a datetime.timedelta, not {type(d).__name__}")
    return d


def _clamp(x: int) -> int:
    return max(UNKNOWN, min(I64_MAX, x))


def _ord(element, value) -> bytes:
    """One order-preserving element's bytes (``codec.ordered``, as the Rust SDK's ``push_ordered``)."""
    out = bytearray()
    element.encode_into(value, out)
    return bytes(out)


def _ordered_i64(x: int) -> bytes:
    return _ord(_ordered.I64, _clamp(x))


# --- Running operators ---------------------------------------------------------------------------

def _noop(key, value, ts, cx):
    pass


def _fan_out(children):
    """What forwarding to ``children`` calls: the only child's ``process`` itself (no frame
    in between: most operators have one child), or a loop over several."""
    procs = [c.process for c in children]
    if len(procs) == 1:
        return procs[0]
    if not procs:
        return _noop

    def forward(key, value, ts, cx):
        for p in procs:
            p(key, value, ts, cx)
    return forward


class _Down:
    """An operator's children: ``forward(key, value, ts, cx)``."""

    __slots__ = ("forward",)

    def __init__(self, children):
        self.forward = _fan_out(children)


class _FnNode:
    __slots__ = ("process",)

    def __init__(self, process):
        self.process = process


def _decode_stored(operator, what, store, codec, data):
    try:
        return codec.decode(data)
    except CodecError as e:
        raise Error(f"operator {operator}: decoding the {what} in store {q(store.name)}: {e}") from None


class RecordCache:
    """An aggregation's record cache (the Rust SDK's ``cache.rs``): a key's updates between two
    flushes go downstream once, from its value at the last flush to its value now."""

    OVERHEAD = 64

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.entries: "OrderedDict[bytes, list]" = OrderedDict()  # raw key -> [key, old, new, ts, size, seq]
        self.bytes = 0
        self.seq = 0
        self.undo = {}

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def _remember(self, raw):
        if raw not in self.undo:
            was = self.entries.get(raw)
            self.undo[raw] = None if was is None else list(was)

    def _pop(self, raw):
        entry = self.entries.pop(raw, None)
        if entry is not None:
            self.bytes -= entry[4]
        return entry

    def put(self, raw, key, old, new, ts, size) -> list:
        self._remember(raw)
        was = self._pop(raw)
        first_old = old if was is None else was[1]
        self.seq += 1
        entry = [key, first_old, new, ts, size + len(raw) + self.OVERHEAD, self.seq]
        self.entries[raw] = entry
        self.bytes += entry[4]
        out = []
        while self.bytes > self.max_bytes and self.entries:
            oldest = next(iter(self.entries))
            self._remember(oldest)
            _emit(self._pop(oldest), out)
        return out

    def flush(self) -> list:
        out = []
        for raw in list(self.entries):
            self._remember(raw)
            _emit(self._pop(raw), out)
        return out

    def call_started(self):
        if not self.undo:
            return
        undo, self.undo = self.undo, {}
        for raw, was in undo.items():
            self._pop(raw)
            if was is not None:
                self.entries[raw] = was
                self.bytes += was[4]
        self.entries = OrderedDict(sorted(self.entries.items(), key=lambda kv: kv[1][5]))

    def call_done(self):
        self.undo.clear()


def _emit(entry, out):
    key, old, new, ts = entry[0], entry[1], entry[2], entry[3]
    if old is None and new is None:
        return
    out.append((key, Change(new, old), ts))


def _forward_all(down, out, cx) -> bool:
    for key, change, ts in out:
        down.forward(key, change, ts, cx)
    return bool(out)


class StreamTime:
    """An operator's stream time, saved in its store under the empty key."""

    __slots__ = ("now", "saved")

    def __init__(self, operator, store):
        raw = store.get(b"")
        if raw is None:
            self.now = UNKNOWN
        elif len(raw) != 8:
            raise Error(f"operator {operator}: the stream time in store {q(store.name)} is {len(raw)} bytes, not 8")
        else:
            self.now = _I64.unpack(raw)[0]
        self.saved = self.now

    def save(self, store):
        if self.now != self.saved:
            store.put(b"", _I64.pack(self.now))
            self.saved = self.now


# --- The builder -----------------------------------------------------------------------------

class StreamsBuilder:
    """Builds a topology: a topology function gets one and makes streams and tables from its
    sources (Kafka Streams' ``StreamsBuilder``)."""

    def __init__(self):
        self._graph = Graph()

    def cache_max_bytes(self, n: int) -> "StreamsBuilder":
        """Bytes of each aggregation's record cache (0: every update goes on at once)."""
        self._graph.cache_max_bytes = int(n)
        return self

    def stream(self, source: str, *, key: Codec = Bytes, value: Codec = Bytes) -> "KStream":
        """The records of the source ``source`` (a logical name the manifest binds to a topic),
        keys and values read with the codecs given (``Unit`` for a key nobody reads)."""
        g = self._graph
        name = g.next_name("source")
        node = Node(name, [], _stream_source(name, source, key, value), is_source=True).with_formats(key, value)
        node.source = source
        return KStream(g, g.add(node), False, key, value)

    def table(self, source: str, store: Optional[str] = None, *, key: Codec = Bytes,
              value: Codec = Bytes) -> "KTable":
        """A table of ``source``: the latest value per key, a record without a value deleting its
        key, kept in the store ``store`` (its joins read it; interactive queries can)."""
        g = self._graph
        name = g.next_name("table")
        store = store or name

        def build(cx, children):
            down = _Down(children)
            kv = cx.store(store)
            label = name

            class _Source:
                @staticmethod
                def process_raw(k, v, ts, cx):
                    k = decode(label, "key", key, k)
                    if k is None:
                        return
                    new = decode(label, "value", value, v)
                    _upsert(label, kv, key, value, k, new, ts, down, cx)

            return _Source

        node = Node(name, [], build, is_source=True).with_formats(key, value)
        node.source = source
        node.stores.append(store)
        return KTable(g, g.add(node), _store_getter(store, key, value), [store], key, value)

    def global_table(self, topic: str, store: Optional[str] = None, *, key: Codec = Bytes,
                     value: Codec = Bytes) -> "GlobalKTable":
        """Every partition of ``topic``, kept by the host in the store ``store`` and read by every
        task; join a stream with it with ``join_global``."""
        g = self._graph
        store = store or f"global_{len(g.global_stores)}"
        if any(t == topic for _, t in g.global_stores):
            g.error(f"the topic {q(topic)} fills two global tables: read it once")
        g.global_stores.append((store, topic))
        g.global_formats.append((topic, formats_of(key, value)))
        return GlobalKTable(store, key, value)


def _stream_source(name, source, kc, vc):
    label = f"{name} (source {q(source)})"

    def build(cx, children):
        forward = _Down(children).forward

        class _Source:
            @staticmethod
            def process_raw(k, v, ts, cx):
                if k is not None:
                    try:
                        k = kc.decode(k)
                    except CodecError as e:
                        raise Error(f"operator {label}: decoding the key: {e}") from None
                if v is not None:
                    try:
                        v = vc.decode(v)
                    except CodecError as e:
                        raise Error(f"operator {label}: decoding the value: {e}") from None
                forward(k, v, ts, cx)

        return _Source

    return build


def _upsert(name, store, kc, vc, key, new, ts, down, cx):
    raw = encode(name, "key", kc, key)
    if raw is None:
        return
    stored = store.get(raw)
    old = None if stored is None else _decode_stored(name, "value", store, vc, unstamp(stored)[0])
    if old is None and new is None:
        return
    data = encode(name, "value", vc, new)
    if data is not None:
        store.put(raw, stamp(data, ts))
    else:
        store.delete(raw)
    down.forward(key, Change(new, old), ts, cx)


def _add_sink(g: Graph, parent: int, kind: str, sink: str, internal: bool, kc, vc) -> int:
    name = g.next_name(kind)

    def build(cx, children):
        kenc, venc = kc.encode, vc.encode

        def process(key, value, ts, cx):
            if key is None:
                if internal:
                    return
                k = None
            else:
                try:
                    k = kenc(key)
                except CodecError:
                    k = encode(name, "key", kc, key)  # raises, naming the operator
            if value is None:
                v = None
            else:
                try:
                    v = venc(value)
                except CodecError:
                    v = encode(name, "value", vc, value)
            cx.out.emit(sink, k, v, ts)
        return _FnNode(process)

    node = Node(name, [parent], build).with_formats(kc, vc)
    node.sink = sink
    node.internal_io = internal
    return g.add(node)


def _add_internal_topic(g: Graph, topic: str, partitions):
    e = check_store_like("repartition topic name", topic)
    if e:
        g.error(e)
    if any(t == topic for t, _ in g.internal_topics):
        g.error(f"two repartitions are named {q(topic)}: name the groupings or stores differently")
    g.internal_topics.append((topic, partitions))


def _repartition(stream: "KStream", topic: str, partitions) -> "KStream":
    g = stream._g
    _add_internal_topic(g, topic, partitions)
    _add_sink(g, stream._node, "repartition", topic, True, stream.key_codec, stream.value_codec)
    name = g.next_name("repartition_source")
    node = Node(name, [], _stream_source(name, topic, stream.key_codec, stream.value_codec),
                is_source=True).with_formats(stream.key_codec, stream.value_codec)
    node.source = topic
    node.internal_io = True
    return KStream(g, g.add(node), False, stream.key_codec, stream.value_codec)


def _join_input(stream: "KStream", topic: str) -> "KStream":
    if not stream._key_changed:
        return stream
    made = stream._g.join_repartitions.get(stream._node)
    if made is not None:
        return KStream(stream._g, made, False, stream.key_codec, stream.value_codec)
    made = _repartition(stream, topic, None)
    stream._g.join_repartitions[stream._node] = made._node
    return made


def _add_fn(g: Graph, parents: List[int], kind: str, make: Callable) -> int:
    """An operator whose ``make(forward)`` gives its ``process(key, value, ts, cx)``."""
    name = g.next_name(kind)
    return g.add(Node(name, parents, lambda cx, children: _FnNode(make(_Down(children).forward))))


_DROP = object()


# --- Streams ---------------------------------------------------------------------------------

class KStream:
    """A stream of records (Kafka Streams' ``KStream``). A stream may feed several operators;
    each gets every record. ``key_codec`` and ``value_codec`` write its keys and values to
    sinks, repartition topics and stores: an operator that changes their type takes
    ``key=`` / ``value=`` (by default they stay as they were)."""

    def __init__(self, g: Graph, node: int, key_changed: bool, key_codec: Codec, value_codec: Codec):
        self._g = g
        self._node = node
        self._key_changed = key_changed
        self.key_codec = key_codec
        self.value_codec = value_codec

    def _then(self, kind, key_changed, make, key=None, value=None) -> "KStream":
        node = _add_fn(self._g, [self._node], kind, make)
        return KStream(self._g, node, key_changed, key or self.key_codec, value or self.value_codec)

    def map(self, f, *, key: Codec = None, value: Codec = None) -> "KStream":
        """Each record becomes the ``(key, value)`` that ``f(key, value)`` returns (the key may
        change: a stateful operator below repartitions)."""
        def make(forward):
            def process(k, v, ts, cx):
                k2, v2 = f(k, v)
                forward(k2, v2, ts, cx)
            return process
        return self._then("map", True, make, key, value)

    def map_values(self, f, *, value: Codec = None) -> "KStream":
        """Each record's value becomes ``f(value)``; the key stays."""
        def make(forward):
            return lambda k, v, ts, cx: forward(k, f(v), ts, cx)
        return self._then("map_values", self._key_changed, make, None, value)

    def map_values_with_key(self, f, *, value: Codec = None) -> "KStream":
        """Each record's value becomes ``f(key, value)``."""
        def make(forward):
            return lambda k, v, ts, cx: forward(k, f(k, v), ts, cx)
        return self._then("map_values", self._key_changed, make, None, value)

    def flat_map(self, f, *, key: Codec = None, value: Codec = None) -> "KStream":
        """Each record becomes the ``(key, value)`` pairs ``f(key, value)`` yields."""
        def make(forward):
            def process(k, v, ts, cx):
                for k2, v2 in f(k, v):
                    forward(k2, v2, ts, cx)
            return process
        return self._then("flat_map", True, make, key, value)

    def flat_map_values(self, f, *, value: Codec = None) -> "KStream":
        """Each record becomes one record per value ``f(value)`` yields, with its key."""
        def make(forward):
            def process(k, v, ts, cx):
                for v2 in f(v):
                    forward(k, v2, ts, cx)
            return process
        return self._then("flat_map_values", self._key_changed, make, None, value)

    def filter(self, f) -> "KStream":
        """The records for which ``f(key, value)`` is true."""
        def make(forward):
            def process(k, v, ts, cx):
                if f(k, v):
                    forward(k, v, ts, cx)
            return process
        return self._then("filter", self._key_changed, make)

    def filter_not(self, f) -> "KStream":
        """The records for which ``f(key, value)`` is false."""
        def make(forward):
            def process(k, v, ts, cx):
                if not f(k, v):
                    forward(k, v, ts, cx)
            return process
        return self._then("filter_not", self._key_changed, make)

    def select_key(self, f, *, key: Codec = None) -> "KStream":
        """Each record gets the key ``f(key, value)``."""
        def make(forward):
            return lambda k, v, ts, cx: forward(f(k, v), v, ts, cx)
        return self._then("select_key", True, make, key, None)

    def peek(self, f) -> "KStream":
        """Calls ``f(key, value)`` on each record and passes it on."""
        def make(forward):
            def process(k, v, ts, cx):
                f(k, v)
                forward(k, v, ts, cx)
            return process
        return self._then("peek", self._key_changed, make)

    def merge(self, other: "KStream") -> "KStream":
        """The records of this stream and of ``other``, as they come (one sub-topology: their
        sources must be co-partitioned)."""
        node = _add_fn(self._g, [self._node, other._node], "merge", lambda forward: forward)
        return KStream(self._g, node, self._key_changed or other._key_changed, self.key_codec, self.value_codec)

    def split(self) -> "Split":
        """Branches: each record goes to the first branch whose predicate it meets."""
        return Split(self)

    def to(self, sink: str) -> None:
        """Writes every record to the sink ``sink``."""
        _add_sink(self._g, self._node, "sink", sink, False, self.key_codec, self.value_codec)

    def to_table(self, store: Optional[str] = None) -> "KTable":
        """The latest value per key, kept in ``store``; after a key change the stream is
        repartitioned first (through ``<store>``)."""
        g = self._g
        store = store or g.next_name("to_table")
        source = _repartition(self, store, None) if self._key_changed else self
        name = g.next_name("to_table")
        kc, vc = self.key_codec, self.value_codec

        def build(cx, children):
            down = _Down(children)
            kv = cx.store(store)

            def process(k, v, ts, cx):
                if k is None:
                    return
                _upsert(name, kv, kc, vc, k, v, ts, down, cx)
            return _FnNode(process)

        node = Node(name, [source._node], build)
        node.stores.append(store)
        return KTable(g, g.add(node), _store_getter(store, kc, vc), [store], kc, vc)

    def group_by_key(self) -> "KGroupedStream":
        """Groups the records by their key (repartitioned first after a key change)."""
        return KGroupedStream(self, self._key_changed)

    def group_by(self, f, *, key: Codec = None) -> "KGroupedStream":
        """Groups the records by the key ``f(key, value)`` (always repartitioned)."""
        def make(forward):
            return lambda k, v, ts, cx: forward(f(k, v), v, ts, cx)
        return KGroupedStream(self._then("group_by", True, make, key, None), True)

    # Joins with tables.

    def join(self, table: "KTable", joiner, *, value: Codec = None) -> "KStream":
        """Each record joined with the table's value for its key, ``joiner(value, table_value)``;
        records whose key the table does not have are dropped."""
        return self._join_table(table, "join", lambda v, t: _DROP if t is None else joiner(v, t), value)

    def left_join(self, table: "KTable", joiner, *, value: Codec = None) -> "KStream":
        """Each record joined with the table's value for its key, None when it has none."""
        return self._join_table(table, "left_join", joiner, value)

    def _join_table(self, table, kind, joiner, value):
        g = self._g
        base = g.next_name(kind)
        source = _join_input(self, f"{base}_left")
        name = g.next_name(kind)
        getter = table._getter

        def build(cx, children):
            lookup = getter(cx)
            forward = _Down(children).forward

            def process(k, v, ts, cx):
                if k is None:
                    return
                found = lookup(k)
                out = joiner(v, None if found is None else found[0])
                if out is not _DROP:
                    forward(k, out, ts, cx)
            return _FnNode(process)

        node = Node(name, [source._node], build)
        node.reads = list(table._stores)
        return KStream(g, g.add(node), False, self.key_codec, value or self.value_codec)

    def join_stream(self, other: "KStream", joiner, windows: "JoinWindows", *, value: Codec = None) -> "KStream":
        """Each record joined with every record of ``other`` with the same key within
        ``windows``, ``joiner(value, other_value)`` (Kafka Streams' ``KStream.join(KStream)``)."""
        return self._join_streams(other, "join_stream", windows,
                                  lambda a, b: _DROP if a is None or b is None else joiner(a, b), value)

    def left_join_stream(self, other: "KStream", joiner, windows: "JoinWindows", *,
                         value: Codec = None) -> "KStream":
        """As ``join_stream``; a record of this stream that joins nothing goes out with None
        once its window and grace period have passed."""
        return self._join_streams(other, "left_join_stream", windows,
                                  lambda a, b: _DROP if a is None else joiner(a, b), value)

    def outer_join_stream(self, other: "KStream", joiner, windows: "JoinWindows", *,
                          value: Codec = None) -> "KStream":
        """As ``left_join_stream``, for the records of both streams."""
        return self._join_streams(other, "outer_join_stream", windows, joiner, value)

    def _join_streams(self, other, op, windows, joiner, value):
        g = self._g
        base = g.next_name(op)
        w = windows
        if w.before_ms < 0 or w.after_ms < 0 or w.grace_ms < 0:
            g.error(f"join windows of {op}: before, after and grace must not be negative")
        this = _join_input(self, f"{base}_left")
        that = _join_input(other, f"{base}_right")
        this_side = _add_fn(g, [this._node], f"{op}_this",
                            lambda forward: lambda k, v, ts, cx: forward(k, (0, v), ts, cx))
        other_side = _add_fn(g, [that._node], f"{op}_other",
                             lambda forward: lambda k, v, ts, cx: forward(k, (1, v), ts, cx))
        stores = [f"{base}_this", f"{base}_other", f"{base}_outer"]
        name = g.next_name(op)
        kc, codecs = self.key_codec, (self.value_codec, other.value_codec)

        def build(cx, children):
            this_store = cx.store(stores[0])
            outer = None if op == "join_stream" else cx.store(stores[2])
            other_store = cx.store(stores[1])
            node = _StreamStreamJoin(name, (this_store, other_store), outer, w, op, joiner, kc, codecs,
                                     _Down(children))
            cx.punctuate(node)
            return node

        node = Node(name, [this_side, other_side], build)
        node.stores = stores[:2] if op == "join_stream" else stores
        return KStream(g, g.add(node), False, self.key_codec, value or self.value_codec)

    def join_global(self, table: "GlobalKTable", key, joiner, *, value: Codec = None) -> "KStream":
        """Each record joined with the global table's value for ``key(key, value)``,
        ``joiner(value, table_value)``; records it finds nothing for are dropped."""
        return self._join_global(table, "join_global", key,
                                 lambda v, t: _DROP if t is None else joiner(v, t), value)

    def left_join_global(self, table: "GlobalKTable", key, joiner, *, value: Codec = None) -> "KStream":
        """As ``join_global``, with None when the global table has nothing."""
        return self._join_global(table, "left_join_global", key, joiner, value)

    def _join_global(self, table, kind, key_fn, joiner, value):
        g = self._g
        name = g.next_name(kind)
        store_name, gk, gv = table.store, table.key_codec, table.value_codec

        def build(cx, children):
            store = cx.store(store_name)
            forward = _Down(children).forward

            def process(k, v, ts, cx):
                raw = encode(name, "global table key", gk, key_fn(k, v))
                if raw is None:
                    return
                found = store.get(raw)
                if found is not None:
                    found = _decode_stored(name, "global table's value", store, gv, found)
                out = joiner(v, found)
                if out is not _DROP:
                    forward(k, out, ts, cx)
            return _FnNode(process)

        node = Node(name, [self._node], build)
        node.reads = [store_name]
        return KStream(g, g.add(node), self._key_changed, self.key_codec, value or self.value_codec)


class Split:
    """The branches of ``KStream.split``, made one predicate at a time."""

    def __init__(self, stream: KStream):
        self._stream = stream
        self._predicates = []

    def branch(self, predicate) -> "Split":
        """A branch of the records that meet ``predicate(key, value)`` (and no earlier one's)."""
        self._predicates.append(predicate)
        return self

    def default_branch(self) -> List[KStream]:
        """The branches, in order, and last the records no branch took."""
        return self._finish(True)

    def no_default_branch(self) -> List[KStream]:
        return self._finish(False)

    def _finish(self, default):
        s, predicates = self._stream, list(self._predicates)
        g = s._g
        branches = len(predicates) + (1 if default else 0)
        name = g.next_name("split")

        def build(cx, children):
            if len(children) != branches:
                raise Error(f"internal error: split {name} has {len(children)} branches built, not {branches}")
            downs = [c.process for c in children]

            def process(k, v, ts, cx):
                for i, p in enumerate(predicates):
                    if p(k, v):
                        downs[i](k, v, ts, cx)
                        return
                if default:
                    downs[-1](k, v, ts, cx)
            return _FnNode(process)

        split = g.add(Node(name, [s._node], build))
        return [KStream(g, _add_fn(g, [split], "branch", lambda forward: forward), s._key_changed,
                        s.key_codec, s.value_codec) for _ in range(branches)]


# --- Tables ----------------------------------------------------------------------------------

def _store_getter(store_name, kc, vc):
    def factory(cx):
        store = cx.store(store_name)
        operator = f"lookup in store {q(store_name)}"

        def get(key):
            raw = encode(operator, "key", kc, key)
            if raw is None:
                return None
            found = store.get(raw)
            if found is None:
                return None
            data, ts = unstamp(found)
            return decode(operator, "value", vc, data), ts
        return get
    return factory


class KTable:
    """The latest value per key (Kafka Streams' ``KTable``): its operators pass on changes
    (``Change(new, old)``), and it can be read by key."""

    def __init__(self, g: Graph, node: int, getter, stores: List[str], key_codec: Codec, value_codec: Codec):
        self._g = g
        self._node = node
        self._getter = getter
        self._stores = stores
        self.key_codec = key_codec
        self.value_codec = value_codec

    def _then(self, kind, getter, make, value=None) -> "KTable":
        node = _add_fn(self._g, [self._node], kind, make)
        return KTable(self._g, node, getter, list(self._stores), self.key_codec, value or self.value_codec)

    def filter(self, f) -> "KTable":
        """The entries for which ``f(key, value)`` is true (one that stops meeting it is deleted)."""
        return self._filter("filter", f, True)

    def filter_not(self, f) -> "KTable":
        return self._filter("filter_not", f, False)

    def _filter(self, kind, f, keep):
        parent = self._getter

        def getter(cx):
            get = parent(cx)

            def filtered(key):
                found = get(key)
                return found if found is not None and bool(f(key, found[0])) == keep else None
            return filtered

        def make(forward):
            def process(k, change, ts, cx):
                new = change.new if change.new is not None and bool(f(k, change.new)) == keep else None
                old = change.old if change.old is not None and bool(f(k, change.old)) == keep else None
                if new is None and old is None:
                    return
                forward(k, Change(new, old), ts, cx)
            return process
        return self._then(kind, getter, make)

    def map_values(self, f, *, value: Codec = None) -> "KTable":
        """Each value becomes ``f(value)``."""
        parent = self._getter

        def getter(cx):
            get = parent(cx)

            def mapped(key):
                found = get(key)
                return None if found is None else (f(found[0]), found[1])
            return mapped

        def make(forward):
            def process(k, change, ts, cx):
                forward(k, Change(None if change.new is None else f(change.new),
                                  None if change.old is None else f(change.old)), ts, cx)
            return process
        return self._then("map_values", getter, make, value)

    def join(self, other: "KTable", joiner, *, value: Codec = None) -> "KTable":
        """The keys in both tables, ``joiner(value, other_value)``; an update of either side
        updates the result (Kafka Streams' ``KTable.join``)."""
        return self._join_tables(other, "join",
                                 lambda a, b: None if a is None or b is None else joiner(a, b), value)

    def left_join(self, other: "KTable", joiner, *, value: Codec = None) -> "KTable":
        """Every key of this table, ``joiner(value, other_value or None)``."""
        return self._join_tables(other, "left_join", lambda a, b: None if a is None else joiner(a, b), value)

    def outer_join(self, other: "KTable", joiner, *, value: Codec = None) -> "KTable":
        """Every key of either table, ``joiner(value or None, other_value or None)``."""
        return self._join_tables(other, "outer_join",
                                 lambda a, b: None if a is None and b is None else joiner(a, b), value)

    def _join_tables(self, other, kind, joiner, value):
        g = self._g
        base = g.next_name(kind)
        this_getter, other_getter = self._getter, other._getter

        def side(lookup_factory, this_first):
            def build(cx, children):
                lookup = lookup_factory(cx)
                forward = _fan_out(children)

                def process(k, change, ts, cx):
                    found = lookup(k)
                    o = None if found is None else found[0]
                    if this_first:
                        new, old = joiner(change.new, o), joiner(change.old, o)
                    else:
                        new, old = joiner(o, change.new), joiner(o, change.old)
                    if new is None and old is None:
                        return
                    if found is not None and found[1] > ts:
                        ts = found[1]
                    forward(k, Change(new, old), ts, cx)
                return _FnNode(process)
            return build

        this_side = Node(f"{base}_this", [self._node], side(other_getter, True))
        this_side.reads = list(other._stores)
        this_id = g.add(this_side)
        other_side = Node(f"{base}_other", [other._node], side(this_getter, False))
        other_side.reads = list(self._stores)
        other_id = g.add(other_side)
        merged = _add_fn(g, [this_id, other_id], f"{kind}_merge", lambda forward: forward)

        def getter(cx):
            this, that = this_getter(cx), other_getter(cx)

            def get(key):
                a, b = this(key), that(key)
                result = joiner(None if a is None else a[0], None if b is None else b[0])
                times = [x[1] for x in (a, b) if x is not None]
                if result is None or not times:
                    return None
                return result, max(times)
            return get

        return KTable(g, merged, getter, list(self._stores) + list(other._stores), self.key_codec,
                      value or self.value_codec)

    def group_by(self, selector, *, key: Codec = None, value: Codec = None) -> "KGroupedTable":
        """Groups the table by the ``(key, value)`` that ``selector(key, value)`` makes of each
        entry, for an aggregation that subtracts an entry's old value and adds its new one."""
        return KGroupedTable(self, selector, key or self.key_codec, value or self.value_codec)

    def to_stream(self) -> KStream:
        """The table's updates as a stream: each new value, None where a key was deleted."""
        node = _add_fn(self._g, [self._node], "to_stream",
                       lambda forward: lambda k, change, ts, cx: forward(k, change.new, ts, cx))
        return KStream(self._g, node, False, self.key_codec, self.value_codec)


class GlobalKTable:
    """A global table: the whole topic in every task, read by ``join_global``."""

    def __init__(self, store: str, key_codec: Codec, value_codec: Codec):
        self.store = store
        self.key_codec = key_codec
        self.value_codec = value_codec


# --- Grouped tables ---------------------------------------------------------------------------------

def _write_change(old: Optional[bytes], new: Optional[bytes]) -> bytes:
    """A table change over a repartition topic: flags (1: old value, 2: new value), the old
    value's length (4 bytes, big-endian) and bytes, the new value's bytes."""
    out = bytearray([(1 if old is not None else 0) | (2 if new is not None else 0)])
    if old is not None:
        out += len(old).to_bytes(4, "big")
        out += old
    if new is not None:
        out += new
    return bytes(out)


def _read_change(data: bytes):
    if not data:
        raise ValueError("an empty table change")
    flags = data[0]
    if flags > 3:
        raise ValueError(f"a table change with flags {flags:#04x}")
    rest = data[1:]
    old = None
    if flags & 1:
        if len(rest) < 4:
            raise ValueError("a table change cut short")
        n = int.from_bytes(rest[:4], "big")
        if len(rest) < 4 + n:
            raise ValueError("a table change cut short")
        old, rest = rest[4:4 + n], rest[4 + n:]
    if flags & 2:
        return old, rest
    if rest:
        raise ValueError("bytes after a table change without a new value")
    return old, None


class KGroupedTable:
    """A table grouped by a new key (Kafka Streams' ``KGroupedTable``): always repartitioned;
    each update travels as the retraction of the old value and the addition of the new one."""

    def __init__(self, table: KTable, selector, key_codec: Codec, value_codec: Codec):
        self._table = table
        self._selector = selector
        self.key_codec = key_codec
        self.value_codec = value_codec
        self._name: Optional[str] = None
        self._partitions: Optional[int] = None
        self._source: Optional[int] = None

    def named(self, name: str) -> "KGroupedTable":
        """Names the repartition topic (by default, after the aggregation's store)."""
        self._name = name
        return self

    def partitions(self, n: int) -> "KGroupedTable":
        self._partitions = int(n)
        return self

    def count(self, store: Optional[str] = None) -> KTable:
        """The number of entries per new key (an entry that moves counts at its new key only)."""
        def step(k, change, n):
            n = n or 0
            if change.old is not None:
                n = max(n - 1, 0)
            if change.new is not None:
                n += 1
            return n
        return self._aggregate("count", store, step, U64)

    def reduce(self, adder, subtractor, store: Optional[str] = None) -> KTable:
        """Each key's values combined by ``adder(agg, value)``; a value that leaves the key is
        taken out with ``subtractor(agg, value)``."""
        def step(k, change, agg):
            if change.old is not None and agg is not None:
                agg = subtractor(agg, change.old)
            if change.new is not None:
                agg = change.new if agg is None else adder(agg, change.new)
            return agg
        return self._aggregate("reduce", store, step, self.value_codec)

    def aggregate(self, initializer, adder, subtractor, store: Optional[str] = None, *, value: Codec) -> KTable:
        """Each key's values folded in by ``adder(key, value, agg)`` and taken out by
        ``subtractor(key, value, agg)``, from ``initializer()``."""
        def step(k, change, agg):
            if agg is None:
                agg = initializer()
            if change.old is not None:
                agg = subtractor(k, change.old, agg)
            if change.new is not None:
                agg = adder(k, change.new, agg)
            return agg
        return self._aggregate("aggregate", store, step, value)

    def _input(self, store: str) -> int:
        if self._source is not None:
            return self._source
        g = self._table._g
        topic = self._name or store
        _add_internal_topic(g, topic, self._partitions)
        selector, table = self._selector, self._table
        kc, vc = self.key_codec, self.value_codec
        label = f"group_by (to {q(topic)})"

        def build(cx, children):
            def pair(k0, v0):
                if v0 is None:
                    return None
                k, v = selector(k0, v0)
                raw = encode(label, "key", kc, k)
                if raw is None:
                    return None
                return raw, encode(label, "value", vc, v)

            def process(k0, change, ts, cx):
                old, new = pair(k0, change.old), pair(k0, change.new)
                emit = cx.out.emit
                if old is not None and new is not None and old[0] == new[0]:
                    emit(topic, old[0], _write_change(old[1], new[1]), ts)
                    return
                if old is not None:
                    emit(topic, old[0], _write_change(old[1], None), ts)
                if new is not None:
                    emit(topic, new[0], _write_change(None, new[1]), ts)
            return _FnNode(process)

        regroup = Node(g.next_name("group_by"), [table._node], build)
        regroup.sink = topic
        regroup.internal_io = True
        g.add(regroup)
        name = g.next_name("repartition_source")

        def build_source(cx, children):
            forward = _fan_out(children)

            class _Source:
                @staticmethod
                def process_raw(k, v, ts, cx):
                    k = decode(name, "key", kc, k)
                    try:
                        old, new = _read_change(b"" if v is None else bytes(v))
                    except ValueError as e:
                        raise Error(f"operator {name}: {e}") from None
                    old = None if old is None else decode(name, "old value", vc, old)
                    new = None if new is None else decode(name, "new value", vc, new)
                    forward(k, Change(new, old), ts, cx)
            return _Source

        source = Node(name, [], build_source, is_source=True)
        source.source = topic
        source.internal_io = True
        self._source = g.add(source)
        return self._source

    def _aggregate(self, kind, store, step, vc) -> KTable:
        g = self._table._g
        store = store or g.next_name(kind)
        source = self._input(store)
        name = g.next_name(kind)
        kc = self.key_codec

        def build(cx, children):
            node = _TableAggregate(name, cx.store(store), step, kc, vc, _Down(children), cx.cache_max_bytes)
            if cx.cache_max_bytes > 0:
                cx.punctuate(node)
            return node

        node = Node(name, [source], build)
        node.stores.append(store)
        return KTable(g, g.add(node), _store_getter(store, kc, vc), [store], kc, vc)


class _TableAggregate(Punctuator):
    def __init__(self, name, store, step, kc, vc, down, cache_bytes):
        self.name = name
        self.store = store
        self.step = step
        self.kc = kc
        self.vc = vc
        self.down = down
        self.cache = RecordCache(cache_bytes)

    def process(self, key, change, ts, cx):
        raw = encode(self.name, "key", self.kc, key)
        if raw is None:
            return
        old, old_ts = _read_aggregate(self.name, self.store, self.vc, raw)
        if old_ts is not None and old_ts > ts:
            ts = old_ts
        new = self.step(key, change, old)
        size = _write_aggregate(self.name, self.store, self.vc, raw, new, ts)
        if self.cache.max_bytes > 0:
            _forward_all(self.down, self.cache.put(raw, key, old, new, ts, len(raw) + size), cx)
            return
        if new is None and old is None:
            return
        self.down.forward(key, Change(new, old), ts, cx)

    def call_started(self):
        self.cache.call_started()

    def call_done(self):
        self.cache.call_done()

    def flush(self, cx):
        return _forward_all(self.down, self.cache.flush(), cx)


# --- Grouped streams and aggregations ------------------------------------------------------------

class KGroupedStream:
    """A stream grouped by key, ready for an aggregation (Kafka Streams' ``KGroupedStream``)."""

    def __init__(self, stream: KStream, repartition: bool):
        self._stream = stream
        self._repartition = repartition
        self._name: Optional[str] = None
        self._partitions: Optional[int] = None
        self._made = [None]  # the repartitioned stream, shared by every aggregation of this grouping

    def named(self, name: str) -> "KGroupedStream":
        """Names the repartition topic, if one is needed (``<topology>-<name>-repartition``)."""
        self._name = name
        return self

    def partitions(self, n: int) -> "KGroupedStream":
        """The partition count of the repartition topic, if one is needed."""
        self._partitions = int(n)
        return self

    def _input(self, store: str) -> KStream:
        if not self._repartition:
            return self._stream
        if self._made[0] is None:
            self._made[0] = _repartition(self._stream, self._name or store, self._partitions)
        return self._made[0]

    def count(self, store: Optional[str] = None) -> KTable:
        """The number of records per key, kept in ``store`` (key → ``U64``)."""
        return self._aggregate("count", store, lambda k, v, n: (n or 0) + 1, U64)

    def reduce(self, reducer, store: Optional[str] = None) -> KTable:
        """Each key's values combined by ``reducer(aggregate, value)`` (the first as it is)."""
        return self._aggregate("reduce", store, lambda k, v, agg: v if agg is None else reducer(agg, v),
                               self._stream.value_codec)

    def aggregate(self, initializer, aggregator, store: Optional[str] = None, *, value: Codec) -> KTable:
        """Each key's values folded by ``aggregator(key, value, aggregate)`` from
        ``initializer()``, the aggregate written with the codec ``value``."""
        def step(k, v, agg):
            return aggregator(k, v, initializer() if agg is None else agg)
        return self._aggregate("aggregate", store, step, value)

    def _aggregate(self, kind, store, step, vc) -> KTable:
        g = self._stream._g
        store = store or g.next_name(kind)
        source = self._input(store)
        name = g.next_name(kind)
        kc = source.key_codec

        def build(cx, children):
            node = _StreamAggregate(name, cx.store(store), step, kc, vc, _Down(children), cx.cache_max_bytes)
            if cx.cache_max_bytes > 0:
                cx.punctuate(node)
            return node

        node = Node(name, [source._node], build)
        node.stores.append(store)
        return KTable(g, g.add(node), _store_getter(store, kc, vc), [store], kc, vc)

    def windowed_by(self, windows) -> "WindowedBy":
        """Windows the groups by ``TimeWindows`` (tumbling or hopping), ``SessionWindows`` or
        ``SlidingWindows``."""
        if isinstance(windows, SessionWindows):
            return SessionWindowedBy(self, windows)
        if isinstance(windows, SlidingWindows):
            return SlidingWindowedBy(self, windows)
        if not isinstance(windows, TimeWindows):
            raise Error(f"windowed_by takes TimeWindows, SessionWindows or SlidingWindows, not "
                        f"{type(windows).__name__}")
        return WindowedBy(self, windows)


def _read_aggregate(name, store, vc, raw):
    stored = store.get(raw)
    if stored is None:
        return None, None
    data, ts = unstamp(stored)
    return _decode_stored(name, "aggregate", store, vc, data), ts


def _write_aggregate(name, store, vc, raw, agg, ts) -> int:
    data = encode(name, "aggregate", vc, agg)
    if data is None:
        store.delete(raw)
        return 0
    data = stamp(data, ts)
    store.put(raw, data)
    return len(data)


class _StreamAggregate(Punctuator):
    def __init__(self, name, store, step, kc, vc, down, cache_bytes):
        self.name = name
        self.store = store
        self.step = step
        self.kc = kc
        self.vc = vc
        self.down = down
        self.cache = RecordCache(cache_bytes)

    def process(self, key, value, ts, cx):
        if key is None:
            return  # null keys are dropped, as Kafka Streams does
        try:
            raw = self.kc.encode(key)
        except CodecError:
            raw = encode(self.name, "key", self.kc, key)
        if raw is None:
            return
        stored = self.store.get(raw)
        if stored is None:
            old = None
        else:
            if len(stored) >= 16 and stored[-8:] == TAG:
                old_ts = _I64.unpack_from(stored, len(stored) - 16)[0]
                stored = stored[:-16]
                if old_ts > ts:
                    ts = old_ts
            old = _decode_stored(self.name, "aggregate", self.store, self.vc, stored)
        new = self.step(key, value, old)
        size = _write_aggregate(self.name, self.store, self.vc, raw, new, ts)
        if self.cache.max_bytes > 0:
            out = self.cache.put(raw, key, old, new, ts, len(raw) + size)
            if out:
                _forward_all(self.down, out, cx)
            return
        self.down.forward(key, Change(new, old), ts, cx)

    def call_started(self):
        self.cache.call_started()

    def call_done(self):
        self.cache.call_done()

    def flush(self, cx):
        return _forward_all(self.down, self.cache.flush(), cx)


# --- Time windows ------------------------------------------------------------------------------

class TimeWindows:
    """Fixed-size windows, tumbling (back to back) or hopping (one every ``advance``),
    starting at multiples of ``advance`` from the epoch. Times are milliseconds or
    ``datetime.timedelta``."""

    def __init__(self, size, advance, grace=0):
        self.size = _ms(size)
        self.advance = _ms(advance)
        self.grace_ms = _ms(grace)

    @classmethod
    def tumbling(cls, size) -> "TimeWindows":
        """Windows of ``size``, back to back, with no grace period."""
        return cls(size, size)

    @classmethod
    def hopping(cls, size, advance) -> "TimeWindows":
        """Windows of ``size``, a new one every ``advance`` (at most ``size``)."""
        return cls(size, advance)

    def grace(self, grace) -> "TimeWindows":
        """How long after its end a window still takes late records."""
        return TimeWindows(self.size, self.advance, grace)

    def check(self) -> Optional[str]:
        if self.size <= 0:
            return f"time windows of {self.size} ms: the size must be positive"
        if self.advance <= 0 or self.advance > self.size:
            return (f"time windows of {self.size} ms advancing by {self.advance} ms: the advance must be "
                    f"positive and at most the size")
        return None

    def starts(self, ts: int) -> range:
        """The starts of the windows that cover ``ts`` (none for a negative time)."""
        first = max(ts - self.size + self.advance, 0) // self.advance * self.advance
        last = ts if ts >= 0 else -1
        return range(first, last + 1, self.advance)


class _Windowed:
    """What every windowed grouping shares: ``emit_final`` and the operator an aggregation
    adds (its store, its input, repartitioned if needed, and a table no one can look up by
    key)."""

    def __init__(self, grouped: KGroupedStream, windows):
        self._grouped = grouped
        self._windows = windows
        self._final = False

    def emit_final(self):
        """Sends each window's result once, when it closes, instead of at every update."""
        self._final = True
        return self

    def _add(self, kind, store, problem, make, vc) -> KTable:
        """Adds the aggregation ``kind`` keeping ``store``; ``make(name, store, key codec,
        down, cache bytes)`` builds its operator at ``init``."""
        grouped = self._grouped
        g = grouped._stream._g
        if problem:
            g.error(problem)
        store = store or g.next_name(kind)
        source = grouped._input(store)
        name = g.next_name(kind)
        kc = source.key_codec

        def build(cx, children):
            node = make(name, cx.store(store), kc, _Down(children), cx.cache_max_bytes)
            cx.punctuate(node)
            return node

        node = Node(name, [source._node], build)
        node.stores.append(store)

        def no_getter(cx):
            raise Error(f"the windowed table of {name} cannot be looked up by key (join its stream instead)")
        return KTable(g, g.add(node), no_getter, [store], WindowedCodec(kc), vc)


class WindowedBy(_Windowed):
    """A grouped stream with time windows, ready for an aggregation."""

    def count(self, store: Optional[str] = None) -> KTable:
        """The number of records per key and window (``U64``)."""
        return self._aggregate("count", store, lambda k, v, n: (n or 0) + 1, U64)

    def reduce(self, reducer, store: Optional[str] = None) -> KTable:
        return self._aggregate("reduce", store, lambda k, v, agg: v if agg is None else reducer(agg, v),
                               self._grouped._stream.value_codec)

    def aggregate(self, initializer, aggregator, store: Optional[str] = None, *, value: Codec) -> KTable:
        def step(k, v, agg):
            return aggregator(k, v, initializer() if agg is None else agg)
        return self._aggregate("aggregate", store, step, value)

    def _aggregate(self, kind, store, step, vc) -> KTable:
        windows, final = self._windows, self._final

        def make(name, kv, kc, down, cache_bytes):
            return _TimeWindowAggregate(name, kv, windows, final, step, kc, vc, down, 0 if final else cache_bytes)
        return self._add(kind, store, windows.check(), make, vc)


class _TimeWindowAggregate(Punctuator):
    def __init__(self, name, store, windows, final, step, kc, vc, down, cache_bytes):
        self.name = name
        self.store = store
        self.windows = windows
        self.final = final
        self.step = step
        self.kc = kc
        self.vc = vc
        self.down = down
        self.cache = RecordCache(cache_bytes)
        self.time = StreamTime(name, store)
        self.closed_below = UNKNOWN

    def process(self, key, value, ts, cx):
        if ts < 0:
            return  # Kafka has no negative timestamps; Kafka Streams drops them too
        raw = encode(self.name, "key", self.kc, key)
        if raw is None:
            return
        time = self.time
        if ts > time.now:
            time.now = ts
        size = self.windows.size
        close = time.now - self.windows.grace_ms
        for start in self.windows.starts(ts):
            if start + size <= close:
                continue
            wkey = _ordered_i64(start) + raw
            old, old_ts = _read_aggregate(self.name, self.store, self.vc, wkey)
            at = ts if old_ts is None or old_ts < ts else old_ts
            new = self.step(key, value, old)
            stored = _write_aggregate(self.name, self.store, self.vc, wkey, new, at)
            if not self.final:
                windowed = Windowed(key, start, start + size)
                if self.cache.max_bytes > 0:
                    _forward_all(self.down, self.cache.put(wkey, windowed, old, new, at, len(wkey) + stored), cx)
                    continue
                self.down.forward(windowed, Change(new, old), at, cx)

    def batch_started(self):
        self.time = StreamTime(self.name, self.store)

    def batch_done(self):
        self.time.save(self.store)

    def call_started(self):
        self.cache.call_started()

    def call_done(self):
        self.cache.call_done()

    def flush(self, cx):
        return _forward_all(self.down, self.cache.flush(), cx)

    def punctuate(self, _time, cx):
        now = self.time.now
        if now == UNKNOWN:
            return
        bound = _clamp(now - self.windows.grace_ms - self.windows.size + 1)
        if bound == self.closed_below:
            self.time.save(self.store)
            return
        self.closed_below = bound
        lower, upper = _ordered_i64(UNKNOWN), _ordered_i64(bound)
        if self.final:
            size = self.windows.size
            for raw, stored in list(self.store.range(lower, upper)):
                try:
                    start, pos = _ordered.I64.decode_from(raw, 0)
                except CodecError as e:
                    raise Error(f"operator {self.name}: a window key in its store: {e}") from None
                key = decode(self.name, "key in its store", self.kc, bytes(raw[pos:]))
                data, ts = unstamp(stored)
                value = decode(self.name, "aggregate in its store", self.vc, data)
                end = start + size
                if ts == UNKNOWN:
                    ts = end - 1
                self.down.forward(Windowed(key, start, end), Change(value, None), ts, cx)
        self.store.delete_range(lower, upper)
        self.time.save(self.store)

    def close(self, cx):
        self.time.save(self.store)


# --- Session windows ---------------------------------------------------------------------------

class SessionWindows:
    """Session windows: a key's records closer than the inactivity gap to each other are one
    session; a record that bridges two sessions merges them (Kafka Streams' ``SessionWindows``)."""

    def __init__(self, gap, grace=0):
        self.gap = _ms(gap)
        self.grace_ms = _ms(grace)

    @classmethod
    def with_inactivity_gap(cls, gap) -> "SessionWindows":
        """Sessions that end after ``gap`` without a record, with no grace period."""
        return cls(gap)

    def grace(self, grace) -> "SessionWindows":
        """How long after a session could last have grown it still takes late records."""
        return SessionWindows(self.gap, grace)


def _prefix_end(prefix: bytes) -> bytes:
    """The smallest key above every key that starts with ``prefix`` (b"": none)."""
    end = bytearray(prefix)
    while end:
        last = end.pop()
        if last < 0xFF:
            end.append(last + 1)
            return bytes(end)
    return b""


def _ordered_bytes(b: bytes) -> bytes:
    return _ord(_ordered.Bytes, b)


class SessionWindowedBy(_Windowed):
    """A grouped stream with session windows, ready for an aggregation."""

    def count(self, store: Optional[str] = None) -> KTable:
        """The number of records per key and session (``U64``)."""
        return self._sessions("count", store, lambda k, v, n: (n or 0) + 1, lambda k, a, b: a + b, U64)

    def reduce(self, reducer, store: Optional[str] = None) -> KTable:
        """Each session's values combined by ``reducer(agg, value)`` (also when two merge)."""
        return self._sessions("reduce", store, lambda k, v, agg: v if agg is None else reducer(agg, v),
                              lambda k, a, b: reducer(a, b), self._grouped._stream.value_codec)

    def aggregate(self, initializer, aggregator, merger, store: Optional[str] = None, *, value: Codec) -> KTable:
        """Each session's values folded by ``aggregator(key, value, agg)`` from
        ``initializer()``; ``merger(key, a, b)`` combines two sessions a record bridges."""
        def add(k, v, agg):
            return aggregator(k, v, initializer() if agg is None else agg)
        return self._sessions("aggregate", store, add, merger, value)

    def _sessions(self, kind, store, add, merge, vc) -> KTable:
        w, final = self._windows, self._final
        problem = None
        if w.gap < 0 or w.grace_ms < 0:
            problem = (f"session windows with a gap of {w.gap} ms and a grace of {w.grace_ms} ms: neither may be "
                       f"negative")

        def make(name, kv, kc, down, _cache_bytes):
            return _SessionAggregate(name, kv, w, final, add, merge, kc, vc, down)
        return self._add(kind, store, problem, make, vc)


class _SessionAggregate(Punctuator):
    """The Rust SDK's ``session.rs``: per session, ``(segment of last, key, last, first)``
    (order-preserving) → the aggregate; the empty key holds the stream time."""

    def __init__(self, name, store, windows, final, add, merge, kc, vc, down):
        self.name = name
        self.store = store
        self.windows = windows
        self.final = final
        self.add = add
        self.merge = merge
        self.kc = kc
        self.vc = vc
        self.down = down
        self.time = StreamTime(name, store)
        self.segment = max(_clamp(windows.gap + windows.grace_ms) // 2, 1)
        self.closed_below = UNKNOWN
        first = next(iter(store.range(_ordered_i64(UNKNOWN), None)), None)
        if first is None:
            self.floor = I64_MAX
        else:
            try:
                self.floor = _ordered.I64.decode_from(first[0], 0)[0]
            except CodecError as e:
                raise Error(f"operator {name}: a session key in its store: {e}") from None

    def _session_key(self, key: bytes, first: int, last: int) -> bytes:
        return (_ordered_i64(last // self.segment) + _ordered_bytes(key) + _ordered_i64(last)
                + _ordered_i64(first))

    def _parse(self, raw: bytes):
        try:
            _, pos = _ordered.I64.decode_from(raw, 0)
            key, pos = _ordered.Bytes.decode_from(raw, pos)
            last, pos = _ordered.I64.decode_from(raw, pos)
            first, pos = _ordered.I64.decode_from(raw, pos)
        except CodecError as e:
            raise Error(f"operator {self.name}: a session key in its store: {e}") from None
        return key, first, last

    def _overlapping(self, key: bytes, lo: int, hi: int) -> list:
        found = []
        newest = max(self.time.now, hi)
        ordered_key = _ordered_bytes(key)
        for segment in range(max(lo // self.segment, self.floor), newest // self.segment + 1):
            prefix = _ordered_i64(segment) + ordered_key
            for store_key, agg in list(self.store.range(prefix + _ordered_i64(lo), _prefix_end(prefix))):
                _, first, last = self._parse(store_key)
                if first <= hi:
                    found.append((store_key, first, last, agg))
        return found

    def process(self, key, value, ts, cx):
        raw = encode(self.name, "key", self.kc, key)
        if raw is None:
            return  # null keys are dropped
        if ts > self.time.now:
            self.time.now = ts
        gap, grace, now = self.windows.gap, self.windows.grace_ms, self.time.now
        found = [f for f in self._overlapping(raw, _clamp(ts - gap), _clamp(ts + gap))
                 if _clamp(f[2] + gap + grace) > now]
        first = min([ts] + [f[1] for f in found])
        last = max([ts] + [f[2] for f in found])
        if _clamp(last + gap + grace) < now:
            return  # late: the session it would make has closed
        in_place = first == ts and last == ts
        agg = None
        for store_key, f_first, f_last, raw_agg in found:
            old = decode(self.name, "aggregate in its store", self.vc, raw_agg)
            self.store.delete(store_key)
            if not self.final and not in_place:
                self.down.forward(Windowed(key, f_first, _clamp(f_last + 1)), Change(None, old), f_last, cx)
            agg = old if agg is None else self.merge(key, agg, old)
        new = self.add(key, value, agg)
        self.floor = min(self.floor, last // self.segment)
        data = encode(self.name, "aggregate", self.vc, new)
        session_key = self._session_key(raw, first, last)
        if data is None:
            self.store.delete(session_key)
        else:
            self.store.put(session_key, data)
        if not self.final:
            self.down.forward(Windowed(key, first, _clamp(last + 1)), Change(new, None), last, cx)

    def batch_started(self):
        self.time = StreamTime(self.name, self.store)

    def batch_done(self):
        self.time.save(self.store)

    def punctuate(self, _time, cx):
        now = self.time.now
        if now == UNKNOWN:
            return
        cut = _clamp(now - self.windows.gap - self.windows.grace_ms)
        if cut == self.closed_below:
            self.time.save(self.store)
            return
        self.closed_below = cut
        closed = []
        for store_key, agg in list(self.store.range(_ordered_i64(UNKNOWN), _ordered_i64(cut // self.segment + 1))):
            key, first, last = self._parse(store_key)
            if last >= cut:
                continue
            if self.final:
                k = decode(self.name, "key in its store", self.kc, bytes(key))
                value = decode(self.name, "aggregate in its store", self.vc, agg)
                self.down.forward(Windowed(k, first, _clamp(last + 1)), Change(value, None), last, cx)
            closed.append((store_key, None))
        if closed:
            self.store.write_batch(closed)
        self.floor = max(self.floor, cut // self.segment)
        self.time.save(self.store)

    def close(self, cx):
        self.time.save(self.store)


# --- Stream-stream joins (the Rust SDK's ``stream_join.rs``) -----------------------------------

class JoinWindows:
    """The window of a stream-stream join: a left record at ``t`` joins right records in
    ``[t - before, t + after]``, both ends included."""

    def __init__(self, before, after, grace=0):
        self.before_ms = _ms(before)
        self.after_ms = _ms(after)
        self.grace_ms = _ms(grace)

    @classmethod
    def of(cls, difference) -> "JoinWindows":
        """Records at most ``difference`` apart join, with no grace period."""
        return cls(difference, difference)

    def before(self, before) -> "JoinWindows":
        """How far before a left record a right record may be."""
        return JoinWindows(before, self.after_ms, self.grace_ms)

    def after(self, after) -> "JoinWindows":
        """How far after a left record a right record may be."""
        return JoinWindows(self.before_ms, after, self.grace_ms)

    def grace(self, grace) -> "JoinWindows":
        """How long out-of-order records are still taken after their window has passed."""
        return JoinWindows(self.before_ms, self.after_ms, grace)

    def retention(self) -> int:
        return _clamp(self.before_ms + self.after_ms + self.grace_ms)


_THIS, _OTHER = 0, 1
_OUTER_RIGHT, _OUTER_LEFT = 2, 3


def _ordered_u32(x: int) -> bytes:
    return _ord(_ordered.U32, x)


def _ordered_u8(x: int) -> bytes:
    return _ord(_ordered.U8, x)


class _MinTime:
    """Kafka Streams' ``minTime`` of a join's unmatched records, kept in the outer store under
    the empty key (see the Rust SDK)."""

    __slots__ = ("now", "saved")

    def __init__(self, operator, store):
        raw = None if store is None else store.get(b"")
        if raw is None:
            self.now = I64_MAX
        elif len(raw) != 8:
            raise Error(f"operator {operator}: the time in store {q(store.name)} is {len(raw)} bytes, not 8")
        else:
            self.now = _I64.unpack(raw)[0]
        self.saved = self.now

    def save(self, store):
        if self.now != self.saved:
            store.put(b"", _I64.pack(self.now))
            self.saved = self.now


class _StreamStreamJoin(Punctuator):
    def __init__(self, name, stores, outer, windows, op, joiner, kc, codecs, down):
        self.name = name
        self.stores = stores
        self.outer = outer
        self.windows = windows
        self.op = op
        self.joiner = joiner
        self.kc = kc
        self.codecs = codecs
        self.down = down
        self.times = [StreamTime(name, stores[0]), StreamTime(name, stores[1])]
        self.segment = max(windows.retention() // 2, 1)
        self.expired_below = UNKNOWN
        self.min_time = _MinTime(name, outer)

    def _keeps_unmatched(self, side):
        if self.op == "join_stream":
            return False
        if self.op == "left_join_stream":
            return side == _THIS
        return True

    def _reach_ahead(self, side):
        return self.windows.after_ms if side == _THIS else self.windows.before_ms

    def _now(self):
        return max(self.times[0].now, self.times[1].now)

    @staticmethod
    def _outer_key(ts, side, key):
        return _ordered_i64(ts) + _ordered_u8(_OUTER_LEFT if side == _THIS else _OUTER_RIGHT) + _ordered_bytes(key)

    def _partners(self, side, key, lo, hi):
        store = self.stores[1 - side]
        found = []
        if lo > hi:
            return found
        ordered_key = _ordered_bytes(key)
        for segment in range(lo // self.segment, hi // self.segment + 1):
            prefix = _ordered_i64(segment) + ordered_key
            upper = prefix + _ordered_i64(hi) + b"\xff" * 17
            for raw, value in list(store.range(prefix + _ordered_i64(lo), upper)):
                try:
                    _, pos = _ordered.I64.decode_from(raw, 0)
                    _, pos = _ordered.Bytes.decode_from(raw, pos)
                    ts, pos = _ordered.I64.decode_from(raw, pos)
                except CodecError as e:
                    raise Error(f"operator {self.name}: a key in store {q(store.name)}: {e}") from None
                found.append((ts, value))
        return found

    def _decode(self, side, data):
        return decode(self.name, "left value" if side == _THIS else "right value", self.codecs[side], data)

    def _forward_alone(self, key, side, value, ts, cx):
        v = self._decode(side, value)
        out = self.joiner(v, None) if side == _THIS else self.joiner(None, v)
        if out is not _DROP:
            self.down.forward(key, out, ts, cx)

    def process(self, key, sided, ts, cx):
        if key is None:
            return
        side, v = sided
        value = encode(self.name, "value", self.codecs[side], v)
        if value is None:
            return  # a null value joins nothing
        raw = encode(self.name, "key", self.kc, key)
        if raw is None:
            return
        w = self.windows
        reach_back, reach_ahead = (w.before_ms, w.after_ms) if side == _THIS else (w.after_ms, w.before_ms)
        advanced = ts >= self._now()
        if ts > self.times[side].now:
            self.times[side].now = ts
        now = self._now()
        if advanced:
            self._emit_closed(now, side, cx)
        source, offset, taken = cx.next_id()
        entry = (_ordered_i64(ts // self.segment) + _ordered_bytes(raw) + _ordered_i64(ts) + _ordered_u32(source)
                 + _ordered_i64(offset) + _ordered_u32(taken))
        self.stores[side].put(entry, value)
        kept_from = _clamp(self.times[1 - side].now - w.retention()) + 1
        partners = self._partners(side, raw, max(_clamp(ts - reach_back), kept_from), _clamp(ts + reach_ahead))
        for their_ts, theirs in partners:
            if self._keeps_unmatched(1 - side) and self.outer is not None:
                k = self._outer_key(their_ts, 1 - side, raw)
                if self.outer.get(k) is not None:
                    self.outer.delete(k)
            mine = self._decode(side, value)
            other = self._decode(1 - side, theirs)
            out = self.joiner(mine, other) if side == _THIS else self.joiner(other, mine)
            if out is not _DROP:
                self.down.forward(key, out, max(ts, their_ts), cx)
        if not partners and self._keeps_unmatched(side):
            if _clamp(ts + reach_ahead) < now:
                self._forward_alone(key, side, value, ts, cx)  # its window has passed already
            elif self.outer is not None:
                if ts < self.min_time.now:
                    self.min_time.now = ts
                self.outer.put(self._outer_key(ts, side, raw), value)

    def _emit_closed(self, now, side, cx):
        outer = self.outer
        if outer is None:
            return
        grace = self.windows.grace_ms
        low = self.min_time.now
        if low != I64_MAX and _clamp(low + self._reach_ahead(side) + grace) >= now:
            return
        self.min_time.now = I64_MAX
        left_open = right_open = False
        sent = []
        for raw, value in outer.range(_ordered_i64(UNKNOWN), None):
            try:
                ts, pos = _ordered.I64.decode_from(raw, 0)
                stored_side, pos = _ordered.U8.decode_from(raw, pos)
                key, pos = _ordered.Bytes.decode_from(raw, pos)
            except CodecError as e:
                raise Error(f"operator {self.name}: a key in store {q(outer.name)}: {e}") from None
            s = _THIS if stored_side in (_OUTER_LEFT, _THIS) else _OTHER
            self.min_time.now = ts
            if left_open and right_open:
                break
            if _clamp(ts + self._reach_ahead(s) + grace) >= now:
                if s == _THIS:
                    left_open = True
                else:
                    right_open = True
                continue
            k = decode(self.name, "key of an unmatched record", self.kc, bytes(key))
            self._forward_alone(k, s, value, ts, cx)
            sent.append((raw, None))
        if sent:
            outer.write_batch(sent)

    def _save_times(self):
        self.times[0].save(self.stores[0])
        self.times[1].save(self.stores[1])
        if self.outer is not None:
            self.min_time.save(self.outer)

    def batch_started(self):
        self.times = [StreamTime(self.name, self.stores[0]), StreamTime(self.name, self.stores[1])]
        self.min_time = _MinTime(self.name, self.outer)

    def batch_done(self):
        self._save_times()

    def punctuate(self, _time, cx):
        now = self._now()
        if now == UNKNOWN or now == self.expired_below:
            self._save_times()
            return
        self.expired_below = now
        for side in (_THIS, _OTHER):
            cut = _clamp(self.times[side].now - self.windows.retention())
            self.stores[side].delete_range(_ordered_i64(UNKNOWN), _ordered_i64(cut // self.segment))
        self._save_times()

    def close(self, cx):
        self._save_times()


# --- Sliding windows (the Rust SDK's ``sliding.rs``, Kafka Streams 4.x's algorithm) -------------

class SlidingWindows:
    """Windows of a fixed time difference that slide with the records: every set of a key's
    records at most ``difference`` apart (Kafka Streams' ``SlidingWindows``)."""

    def __init__(self, difference, grace=0):
        self.difference = _ms(difference)
        self.grace_ms = _ms(grace)

    @classmethod
    def with_time_difference(cls, difference) -> "SlidingWindows":
        """Windows of records at most ``difference`` apart, with no grace period."""
        return cls(difference)

    def grace(self, grace) -> "SlidingWindows":
        """How long after a window's end it still takes out-of-order records."""
        return SlidingWindows(self.difference, grace)


class SlidingWindowedBy(_Windowed):
    """A grouped stream with sliding windows, ready for an aggregation."""

    def count(self, store: Optional[str] = None) -> KTable:
        return self._sliding("count", store, lambda k, v, n: (n or 0) + 1, U64)

    def reduce(self, reducer, store: Optional[str] = None) -> KTable:
        return self._sliding("reduce", store, lambda k, v, agg: v if agg is None else reducer(agg, v),
                             self._grouped._stream.value_codec)

    def aggregate(self, initializer, aggregator, store: Optional[str] = None, *, value: Codec) -> KTable:
        def fold(k, v, agg):
            return aggregator(k, v, initializer() if agg is None else agg)
        return self._sliding("aggregate", store, fold, value)

    def _sliding(self, kind, store, fold, vc) -> KTable:
        w, final = self._windows, self._final
        problem = None
        if w.difference < 0 or w.grace_ms < 0:
            problem = (f"sliding windows with a time difference of {w.difference} ms and a grace of {w.grace_ms} "
                       f"ms: neither may be negative")

        def make(name, kv, kc, down, _cache_bytes):
            return _SlidingAggregate(name, kv, w, final, fold, kc, vc, down)
        return self._add(kind, store, problem, make, vc)


_CLOSED_KEY = b"\x00"


class _SlidingAggregate(Punctuator):
    def __init__(self, name, store, windows, final, fold, kc, vc, down):
        self.name = name
        self.store = store
        self.windows = windows
        self.final = final
        self.fold = fold
        self.kc = kc
        self.vc = vc
        self.down = down
        raw = store.get(_CLOSED_KEY)
        if raw is None:
            self.closed_to = UNKNOWN
        elif len(raw) != 8:
            raise Error(f"operator {name}: the closing time in its store is not 8 bytes")
        else:
            self.closed_to = _I64.unpack(raw)[0]
        self.time = StreamTime(name, store)
        self.segment = max(_clamp(windows.difference + windows.grace_ms) // 2, 1)

    def _window_key(self, key, start):
        return _ordered_i64(start // self.segment) + _ordered_bytes(key) + _ordered_i64(start)

    def _parse(self, raw):
        try:
            _, pos = _ordered.I64.decode_from(raw, 0)
            key, pos = _ordered.Bytes.decode_from(raw, pos)
            start, pos = _ordered.I64.decode_from(raw, pos)
        except CodecError as e:
            raise Error(f"operator {self.name}: a window key in its store: {e}") from None
        if pos != len(raw):
            raise Error(f"operator {self.name}: store {q(self.store.name)} holds sliding-window state of an older "
                        f"SDK (records, not windows): reset the topology's state (or name the store anew) to run "
                        f"this version")
        return bytes(key), start

    def _fetch(self, key, lo, hi):
        found = []
        if lo > hi:
            return found
        ordered_key = _ordered_bytes(key)
        for segment in range(lo // self.segment, hi // self.segment + 1):
            prefix = _ordered_i64(segment) + ordered_key
            for raw, stored in list(self.store.range(prefix, _prefix_end(prefix))):
                _, start = self._parse(raw)
                if lo <= start <= hi:
                    agg, ts = unstamp(stored)
                    found.append((start, bytes(agg), ts))
        found.sort(key=lambda w: w[0])
        return found

    def _put(self, key, start, agg, ts):
        data = encode(self.name, "aggregate", self.vc, agg)
        k = self._window_key(key, start)
        if data is None:
            self.store.delete(k)  # a null aggregate: no window
        else:
            self.store.put(k, stamp(data, ts))

    def _forward(self, key, start, agg, ts, cx):
        end = _clamp(_clamp(start + self.windows.difference) + 1)
        self.down.forward(Windowed(key, start, end), Change(agg, None), ts, cx)

    def _update(self, key, value, t, raw, start, old, close, cx):
        if _clamp(start + self.windows.difference) < close:
            return  # a closed window takes nothing more
        old_agg = None if old is None else decode(self.name, "aggregate in its store", self.vc, old[0])
        ts = t if old is None else max(t, old[1])
        agg = self.fold(key, value, old_agg)
        self._put(raw, start, agg, ts)
        if not self.final:
            self._forward(key, start, agg, ts, cx)

    def _right_window(self, key, t, raw, found, cx):
        start = _clamp(t + 1)
        agg = decode(self.name, "aggregate in its store", self.vc, found[1])
        self._put(raw, start, agg, found[2])
        if not self.final:
            self._forward(key, start, agg, found[2], cx)

    def process(self, key, value, t, cx):
        if t < 0:
            return
        raw = encode(self.name, "key", self.kc, key)
        if raw is None or value is None:
            return  # null keys and values are dropped
        d, grace = self.windows.difference, self.windows.grace_ms
        if t > self.time.now:
            self.time.now = t
        close = _clamp(self.time.now - grace)
        if _clamp(t + d) < close:
            return  # late: its last window [t, t + d] is closed
        if t < d:
            self._early(key, value, t, raw, close, cx)
        else:
            self._in_time(key, value, t, raw, close, cx)

    def _in_time(self, key, value, t, raw, close, cx):
        d = self.windows.difference
        found = self._fetch(raw, max(_clamp(t - 2 * d), 0), _clamp(t + 1))
        starts = {w[0] for w in found}
        left_agg = right_agg = None
        left_exists = right_exists = False
        previous = None
        for w in reversed(found):
            end = _clamp(w[0] + d)
            if w[0] == _clamp(t + 1):
                right_exists = True
            elif end > t:
                if right_agg is None:
                    right_agg = w
                self._update(key, value, t, raw, w[0], (w[1], w[2]), close, cx)
            elif end == t:
                left_exists = True
                self._update(key, value, t, raw, w[0], (w[1], w[2]), close, cx)
                if w[2] < t:
                    previous = w[2]
                else:
                    return  # a record at t was here before: every window exists
            else:
                left_agg = w
                previous = w[2]
                break
        if previous is not None:
            start = _clamp(previous + 1)
            if start not in starts and _clamp(start + d) >= t:
                self._update(key, value, t, raw, start, None, close, cx)
        if not left_exists:
            old = None
            if previous is not None and left_agg is not None and _clamp(t - d) <= previous:
                old = (left_agg[1], t)
            self._update(key, value, t, raw, _clamp(t - d), old, close, cx)
        if right_agg is not None and not right_exists and right_agg[2] > t:
            self._right_window(key, t, raw, right_agg, cx)

    def _early(self, key, value, t, raw, close, cx):
        found = self._fetch(raw, 0, _clamp(t + 1))
        starts = {w[0] for w in found}
        combined = right_agg = None
        right_exists = False
        previous = None
        for w in found:
            if w[0] == 0:
                combined = w
                if w[2] < t:
                    previous = w[2]
            elif w[0] <= t:
                right_agg = w
                self._update(key, value, t, raw, w[0], (w[1], w[2]), close, cx)
            elif w[0] == _clamp(t + 1):
                right_exists = True
        if right_agg is None and combined is not None and combined[2] > t:
            right_agg = combined
        if right_agg is not None and not right_exists and right_agg[2] > t:
            self._right_window(key, t, raw, right_agg, cx)
        if previous is not None and _clamp(previous + 1) not in starts:
            self._update(key, value, t, raw, _clamp(previous + 1), None, close, cx)
        old = None if combined is None else (combined[1], combined[2])
        self._update(key, value, t, raw, 0, old, close, cx)

    def batch_started(self):
        self.time = StreamTime(self.name, self.store)

    def batch_done(self):
        self.time.save(self.store)

    def punctuate(self, _time, cx):
        now = self.time.now
        if now == UNKNOWN:
            return
        d = self.windows.difference
        close = _clamp(now - self.windows.grace_ms)
        if close > self.closed_to and self.final:
            lo = 0 if self.closed_to == UNKNOWN else max(_clamp(self.closed_to - d), 0)
            hi = _clamp(_clamp(close - d) - 1)
            if lo <= hi:
                due = []
                for raw, stored in list(self.store.range(_ordered_i64(lo // self.segment),
                                                         _ordered_i64(_clamp(hi // self.segment + 1)))):
                    key, start = self._parse(raw)
                    if lo <= start <= hi:
                        agg, ts = unstamp(stored)
                        due.append((start, key, bytes(agg), ts))
                due.sort()
                for start, raw_key, agg, ts in due:
                    k = decode(self.name, "key in its store", self.kc, raw_key)
                    value = decode(self.name, "aggregate in its store", self.vc, agg)
                    self._forward(k, start, value, ts, cx)
        if close > self.closed_to:
            self.closed_to = close
            self.store.put(_CLOSED_KEY, _I64.pack(close))
            reach = _clamp(close - 3 * d)
            self.store.delete_range(_ordered_i64(UNKNOWN), _ordered_i64(reach // self.segment))
        self.time.save(self.store)

    def close(self, cx):
        self.time.save(self.store)
