"""The graph a topology function builds, what it compiles to (sub-topologies cut where a key
change meets a stateful operator, a description the host reads), and what runs in a task
(operators holding their children, punctuators, stores). A port of the Rust SDK's
``dsl/graph.rs`` and ``dsl/runtime.rs``: the same names, the same cuts, the same errors."""

from __future__ import annotations

import json
from typing import Callable, Dict, List, Optional

from .. import _host
from .._core import Description, Error, Subtopology
from ..codec import CodecError

#: Bytes each aggregation's record cache holds by default (the Rust SDK's
#: ``DEFAULT_CACHE_MAX_BYTES``).
DEFAULT_CACHE_MAX_BYTES = 1 << 20

def q(name) -> str:
    """A name quoted as the Rust SDK's messages quote it (`"counts"`)."""
    return json.dumps(name, ensure_ascii=False)


class Node:
    """One operator of the graph, as ``describe`` sees it."""

    __slots__ = ("name", "parents", "source", "sink", "stores", "reads", "internal_io", "build", "is_source",
                 "formats")

    def __init__(self, name: str, parents: List[int], build: Callable, *, is_source: bool = False):
        self.name = name
        self.parents = parents
        self.source: Optional[str] = None
        self.sink: Optional[str] = None
        self.stores: List[str] = []
        self.reads: List[str] = []
        self.internal_io = False
        # build(cx, children) -> the runtime operator (a source: with process_raw)
        self.build = build
        self.is_source = is_source
        # The schemas of the keys and values of the topic it reads or writes, when they are in
        # the Confluent wire format (its codecs' ``schema``): (key, value), None for bytes.
        self.formats = (None, None)

    def with_formats(self, key_codec, value_codec) -> "Node":
        """Records the codecs' schemas as those of the topic this node reads or writes."""
        self.formats = formats_of(key_codec, value_codec)
        return self


def formats_of(key_codec, value_codec) -> tuple:
    """(key schema, value schema) of a topic of these codecs (the Rust SDK's ``Data::schema``)."""
    return getattr(key_codec, "schema", None), getattr(value_codec, "schema", None)


class Graph:
    """What a topology function has built so far."""

    def __init__(self):
        self.nodes: List[Node] = []
        self.internal_topics: List[tuple] = []  # (name, partitions or None)
        self.global_stores: List[tuple] = []  # (store, topic)
        self.global_formats: List[tuple] = []  # (topic, (key schema, value schema))
        self.join_repartitions: Dict[int, int] = {}
        self.cache_max_bytes: Optional[int] = None
        self.errors: List[str] = []

    def next_name(self, kind: str) -> str:
        return f"{kind}_{len(self.nodes)}"

    def add(self, node: Node) -> int:
        self.nodes.append(node)
        return len(self.nodes) - 1

    def error(self, message: str):
        self.errors.append(message)

    def is_internal(self, topic: str) -> bool:
        return any(name == topic for name, _ in self.internal_topics)


def check_store_like(what: str, name: str) -> Optional[str]:
    """Store and internal topic names become parts of topic names: ``[A-Za-z0-9_]``, 1 to 64."""
    if not name or len(name.encode("utf-8")) > 64:
        return f"the {what} {q(name)} must be 1 to 64 characters long"
    for c in name:
        if not (c.isascii() and (c.isalnum() or c == "_")):
            return (f"the {what} {q(name)} contains '{c}'; use letters, digits and '_' "
                    f"(it becomes part of a topic name)")
    return None


class _Plan:
    __slots__ = ("name", "nodes", "sources", "sinks", "stores")

    def __init__(self):
        self.name = ""
        self.nodes: List[int] = []
        self.sources: List[str] = []
        self.sinks: List[str] = []
        self.stores: List[str] = []


def plan(graph: Graph) -> List[_Plan]:
    """Cuts the graph into sub-topologies (raises Error with the reason)."""
    n = len(graph.nodes)
    parent = list(range(n))

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(a, b):
        ra, rb = find(a), find(b)
        if ra < rb:
            parent[rb] = ra
        else:
            parent[ra] = rb

    keeper: Dict[str, int] = {}
    for i, node in enumerate(graph.nodes):
        for p in node.parents:
            union(i, p)
        for store in node.stores:
            e = check_store_like("store name", store)
            if e:
                raise Error(e)
            if store in keeper:
                raise Error(f"the store {q(store)} is kept by two operators ({graph.nodes[keeper[store]].name} and "
                            f"{node.name}): name each store once")
            keeper[store] = i
    globals_ = {s for s, _ in graph.global_stores}
    for store, _ in graph.global_stores:
        e = check_store_like("store name", store)
        if e:
            raise Error(e)
        if store in keeper:
            raise Error(f"the store {q(store)} is kept by operator {graph.nodes[keeper[store]].name} and is a "
                        f"global table too")
    for i, node in enumerate(graph.nodes):
        for store in node.reads:
            if store in globals_:
                continue
            if store not in keeper:
                raise Error(f"operator {node.name} reads the store {q(store)}, which no operator keeps")
            union(i, keeper[store])
    readers: Dict[str, int] = {}
    for i, node in enumerate(graph.nodes):
        source = node.source
        if source is None:
            continue
        if source in readers:
            if graph.is_internal(source):
                raise Error(f"two groupings are both named {q(source)} (their repartition topic): give each grouping "
                            f"its own name, or keep one grouping and aggregate it as often as needed (its "
                            f"aggregations share the topic)")
            raise Error(f"the source {q(source)} is read twice (by {graph.nodes[readers[source]].name} and "
                        f"{node.name}): call `stream({q(source)})` (or `table`) once and use the stream it returns "
                        f"as often as needed")
        readers[source] = i
    if not readers:
        raise Error("it reads no source: start with StreamsBuilder.stream or .table")
    for topic, _ in graph.internal_topics:
        e = check_store_like("internal topic name", topic)
        if e:
            raise Error(e)
        if any(not node.internal_io and topic in (node.source, node.sink) for node in graph.nodes):
            raise Error(f"the repartition topic {q(topic)} has the name of a source or sink of the topology: name "
                        f"the grouping or store differently (e.g. group_by_key().named(\"…\"))")
    for store, topic in graph.global_stores:
        if any(topic in (node.source, node.sink) for node in graph.nodes):
            raise Error(f"the topic {q(topic)} of the global table {q(store)} is also a source or sink: the host "
                        f"reads it whole into the table")
    plans: Dict[int, _Plan] = {}
    for i, node in enumerate(graph.nodes):
        p = plans.setdefault(find(i), _Plan())
        p.nodes.append(i)
        if node.source is not None:
            if not p.name:
                p.name = node.source
            p.sources.append(node.source)
        if node.sink is not None and node.sink not in p.sinks:
            p.sinks.append(node.sink)
        p.stores.extend(node.stores)
    result = [plans[root] for root in sorted(plans)]
    for p in result:
        if not p.sources:
            raise Error(f"operator {graph.nodes[p.nodes[0]].name} is connected to no source")
    return result


class Topology:
    """A compiled DSL topology: its description and, per sub-topology, how to build a task."""

    def __init__(self, name: str, graph: Graph, plans: List[_Plan]):
        self.name = name
        self.graph = graph
        self.plans = plans

    @classmethod
    def build(cls, name: str, topology: Callable) -> "Topology":
        """Runs the topology function and compiles what it built (raises Error)."""
        from ._ops import StreamsBuilder

        builder = StreamsBuilder()
        topology(builder)
        graph = builder._graph
        try:
            plans = plan(graph)
        except Error as e:
            raise Error(f"topology {q(name)}: {e}") from None
        if graph.errors:
            raise Error(f"topology {q(name)}: {graph.errors[0]}")
        return cls(name, graph, plans)

    def description(self) -> Description:
        g = self.graph
        d = Description(self.name)
        seen = set()
        for node in g.nodes:
            if node.source is not None and not g.is_internal(node.source) and ("source", node.source) not in seen:
                seen.add(("source", node.source))
                d.source(node.source)
        for node in g.nodes:
            if node.sink is not None and not g.is_internal(node.sink) and ("sink", node.sink) not in seen:
                seen.add(("sink", node.sink))
                d.sink(node.sink)
        for node in g.nodes:
            for store in node.stores:
                d.store(store)
        for topic, partitions in g.internal_topics:
            d.internal_topic(topic, partitions)
        for p in self.plans:
            d.subtopology(Subtopology(p.name, list(p.sources), list(p.sinks), list(p.stores)))
        for store, topic in g.global_stores:
            d.global_store(store, topic)
        # Formats: each topic's, from the operators that read or write it (the two ends of a
        # repartition topic have the same codecs), in the Rust SDK's order.
        topics = [(t, n.formats) for n in g.nodes for t in (n.source, n.sink) if t is not None]
        declared = set()
        for topic, (key, value) in topics + g.global_formats:
            if (key is None and value is None) or topic in declared:
                continue
            declared.add(topic)
            if key is not None:
                d.key_format(topic, key)
            if value is not None:
                d.value_format(topic, value)
        return d

    def operators(self) -> List[tuple]:
        """Per sub-topology, one line per operator (as the Rust SDK's ``Topology::operators``)."""
        nodes = self.graph.nodes
        children: List[List[int]] = [[] for _ in nodes]
        for i, node in enumerate(nodes):
            for p in node.parents:
                children[p].append(i)
        out = []
        for p in self.plans:
            within = set(p.nodes)
            lines = []
            for i in p.nodes:
                node = nodes[i]
                line = node.name
                if node.source is not None:
                    kind = "repartition topic" if self.graph.is_internal(node.source) else "source"
                    line += f" (reads {kind} {node.source})"
                if node.sink is not None:
                    kind = "repartition topic" if self.graph.is_internal(node.sink) else "sink"
                    line += f" (writes {kind} {node.sink})"
                if node.stores:
                    line += f" (stores: [{', '.join(node.stores)}])"
                if node.reads:
                    line += f" (reads stores: [{', '.join(node.reads)}])"
                parents = [nodes[x].name for x in node.parents if x in within]
                if parents:
                    line += f" <-- {', '.join(parents)}"
                kids = [nodes[x].name for x in children[i] if x in within]
                if kids:
                    line += f" --> {', '.join(kids)}"
                lines.append(line)
            out.append((p.name, lines))
        return out

    def instantiate(self, subtopology: str, open_store: Callable) -> "DslTask":
        """Builds the operators of ``subtopology`` over stores from ``open_store(name)``."""
        index = next((i for i, p in enumerate(self.plans) if p.name == subtopology), None)
        if index is None:
            if len(self.plans) != 1:
                names = [p.name for p in self.plans]
                raise Error(f"topology {q(self.name)} has no sub-topology {q(subtopology)}; it has {names}")
            index = 0
        p = self.plans[index]
        members = set(p.nodes)
        children: Dict[int, List[int]] = {}
        for i in p.nodes:
            for parent in self.graph.nodes[i].parents:
                children.setdefault(parent, []).append(i)
        cx = BuildCx(open_store, DEFAULT_CACHE_MAX_BYTES if self.graph.cache_max_bytes is None
                     else self.graph.cache_max_bytes)
        built: Dict[int, object] = {}
        sources = []
        for i in reversed(p.nodes):
            kids = [built[c] for c in children.get(i, []) if c in members and c in built]
            node = self.graph.nodes[i]
            made = node.build(cx, kids)
            if node.is_source:
                sources.append((node.source, made))
            else:
                built[i] = made
        sources.reverse()
        return DslTask(p.name, sources, cx.punctuators)


# --- What runs in a task ---------------------------------------------------------------------

class StoreRef:
    """A task's store, bytes in and out, errors naming the store."""

    __slots__ = ("name", "_inner")

    def __init__(self, name: str, inner):
        self.name = name
        self._inner = inner

    def _fail(self, e):
        return Error(f"store {q(self.name)}: {e}")

    def get(self, key: bytes):
        try:
            return self._inner.get(key)
        except _host.StoreFailure as e:
            raise self._fail(e) from None

    def put(self, key: bytes, value: bytes):
        try:
            self._inner.put(key, value)
        except _host.StoreFailure as e:
            raise self._fail(e) from None

    def delete(self, key: bytes):
        try:
            self._inner.delete(key)
        except _host.StoreFailure as e:
            raise self._fail(e) from None

    def write_batch(self, entries):
        try:
            self._inner.write_batch(entries)
        except _host.StoreFailure as e:
            raise self._fail(e) from None

    def range(self, start: Optional[bytes], end: Optional[bytes]):
        """Every (key, value) with start <= key < end, fetched a page at a time."""
        try:
            scan = self._inner.range(start, end)
            while True:
                page = scan.next_page(256)
                if not page:
                    return
                yield from page
        except _host.StoreFailure as e:
            raise self._fail(e) from None

    def delete_range(self, start: Optional[bytes], end: Optional[bytes]) -> int:
        doomed = [k for k, _ in self.range(start, end)]
        if doomed:
            try:
                self._inner.write_batch([(k, None) for k in doomed])
            except _host.StoreFailure as e:
                raise self._fail(e) from None
        return len(doomed)


class BuildCx:
    """What building a task's operators needs: its stores (each opened once) and the
    operators to punctuate."""

    def __init__(self, open_store: Callable, cache_max_bytes: int):
        self._open = open_store
        self._opened: Dict[str, StoreRef] = {}
        self.punctuators: List[object] = []
        self.cache_max_bytes = cache_max_bytes

    def store(self, name: str) -> StoreRef:
        store = self._opened.get(name)
        if store is None:
            try:
                store = StoreRef(name, self._open(name))
            except _host.StoreFailure as e:
                raise Error(f"store {q(name)}: {e}") from None
            self._opened[name] = store
        return store

    def punctuate(self, node):
        self.punctuators.append(node)


class Punctuator:
    """An operator that acts as time passes, keeps a record cache or its own stream time."""

    def punctuate(self, time: int, cx) -> None:
        pass

    def close(self, cx) -> None:
        pass

    def batch_started(self) -> None:
        pass

    def batch_done(self) -> None:
        pass

    def call_started(self) -> None:
        pass

    def call_done(self) -> None:
        pass

    def flush(self, cx) -> bool:
        return False


class Cx:
    """Where a chain's records go (``out.emit(sink, key, value, ts)``), and the input record
    it runs for: ``next_id()`` gives ids that are the same when the same input is processed
    again after a failure (its source's index, its offset, the n-th id taken for it)."""

    __slots__ = ("out", "source", "offset", "record", "taken")

    def __init__(self, out):
        self.out = out
        self.source = 0
        self.offset = 0
        self.record = None  # when set, the offset is read from it when first needed
        self.taken = 0

    def at(self, source: int, offset, record=None):
        self.source = source
        self.offset = offset
        self.record = record
        self.taken = 0

    def next_id(self):
        if self.record is not None:
            self.offset = self.record.offset
            self.record = None
        taken = self.taken
        self.taken = taken + 1
        return self.source, self.offset, taken


def encode(operator: str, what: str, codec, value) -> Optional[bytes]:
    """A key or value's bytes (None: null), a codec error naming the operator."""
    if value is None:
        return None
    try:
        return codec.encode(value)
    except CodecError as e:
        raise Error(f"operator {operator}: encoding the {what}: {e} (give the operator that made it a "
                    f"{'key' if what == 'key' else 'value'}= codec)") from None


def decode(operator: str, what: str, codec, data: Optional[bytes]):
    if data is None:
        return None
    try:
        return codec.decode(data)
    except CodecError as e:
        raise Error(f"operator {operator}: decoding the {what}: {e}") from None


class DslTask:
    """The operators of one sub-topology in one task."""

    def __init__(self, subtopology: str, sources: List[tuple], punctuators: List[object]):
        self.subtopology = subtopology
        self.sources = dict(sources)
        # Each source's index (the first part of `Cx.next_id`) and operator, in one lookup.
        self.entries = {name: (i, node) for i, (name, node) in enumerate(sources)}
        self.punctuators = punctuators

    def reads(self, source: str) -> bool:
        return source in self.sources

    def process(self, source: str, partition: int, offset: int, key, value, timestamp: int, out) -> None:
        entry = self.entries.get(source)
        if entry is None:
            raise Error(f"sub-topology {q(self.subtopology)} got a record from {q(source)}, which it does not read")
        index, node = entry
        cx = Cx(out)
        cx.at(index, offset)
        try:
            node.process_raw(key, value, timestamp, cx)
        except Error as e:
            raise Error(f"the record at {source}/{partition}@{offset}: {e}") from None

    def _drain(self, cx):
        for _ in range(len(self.punctuators) + 1):
            sent = False
            for node in reversed(self.punctuators):
                sent |= bool(node.flush(cx))
            if not sent:
                break

    def _outside_batch(self, out, work):
        cx = Cx(out)
        for n in self.punctuators:
            n.call_started()
        work(cx)
        self._drain(cx)
        for n in self.punctuators:
            n.call_done()

    def punctuate(self, stream_time: int, out) -> None:
        def work(cx):
            for n in self.punctuators:
                n.punctuate(stream_time, cx)
        self._outside_batch(out, work)

    def flush(self, out) -> None:
        self._outside_batch(out, lambda cx: None)

    def batch_started(self) -> None:
        for n in self.punctuators:
            n.call_started()
            n.batch_started()

    def batch_done(self) -> None:
        for n in self.punctuators:
            n.batch_done()
            n.call_done()

    def close(self, out) -> None:
        def work(cx):
            for n in self.punctuators:
                n.close(cx)
        self._outside_batch(out, work)
