"""The stream DSL in Python: Kafka Streams' ``StreamsBuilder``, ``KStream``, ``KTable`` and
friends, with the same operators and names as the Rust SDK's ``sluice_guest::dsl``, compiled
inside the guest to the same sub-topologies, repartition topics and stores.

    from sluice_guest import Str
    from sluice_guest.dsl import Unit, topology

    @topology("dsl-word-count")
    def word_count(b):
        (b.stream("lines", key=Unit, value=Str)
          .flat_map_values(lambda line: line.lower().split())
          .group_by(lambda _, word: word, key=Str)
          .named("words")
          .count("counts")
          .to_stream()
          .to("totals"))

``@topology(name)`` turns the function into the topology's :class:`~sluice_guest.Processor`
(what ``[tool.sluice] topology`` names, what ``TestDriver`` runs). The function runs at
``describe`` and again at every task's ``init``: it must build the same graph every time.

Codecs: a stream's keys and values are written with its codecs (``stream(key=, value=)``);
an operator that changes their type takes ``key=`` / ``value=`` (otherwise they stay as
they were); ``count`` writes ``U64``; ``aggregate`` takes ``value=``. ``None`` is a null key
or a tombstone with every codec. Every operator of the Rust DSL is here (``docs/python.md``).
"""

from __future__ import annotations

from .._core import Error, Processor
from .._host import backend as _backend
from ..wire import timestamp_bytes as _ts_bytes
from ._graph import DEFAULT_CACHE_MAX_BYTES, DslTask, Topology
from ._ops import (Change, GlobalKTable, JoinWindows, KGroupedStream, KGroupedTable, KStream, KTable, SessionWindowedBy,
                   SessionWindows, SlidingWindowedBy, SlidingWindows, Split, StreamsBuilder, TimeWindows, Unit, Windowed,
                   WindowedBy, WindowedCodec)

__all__ = [
    "topology", "StreamsBuilder", "KStream", "KTable", "GlobalKTable", "KGroupedStream", "KGroupedTable", "Split",
    "TimeWindows", "SessionWindows", "SessionWindowedBy", "SlidingWindows", "SlidingWindowedBy", "JoinWindows",
    "WindowedBy", "Windowed", "WindowedCodec", "Change", "Unit", "Topology", "DslTask", "DEFAULT_CACHE_MAX_BYTES",
]


class _Emitter:
    """Emits into a Context's buffer, by sink name (every DSL sink is declared)."""

    __slots__ = ("_out", "_index")

    def __init__(self, ctx):
        self._out = ctx._out
        self._index = ctx._index

    def emit(self, sink, key, value, ts):
        self._out.emit(self._index[sink], key, value, _ts_bytes(ts if ts >= -1 else -1), None)


def _open_store(name):
    return _backend().open_store(name)


def topology(name: str):
    """Makes a topology function ``f(builder)`` the :class:`Processor` of the topology
    ``name`` (a decorator)."""

    def wrap(fn):
        class DslProcessor(Processor):
            @classmethod
            def describe(cls):
                return Topology.build(name, fn).description()

            @classmethod
            def operators(cls):
                try:
                    return Topology.build(name, fn).operators()
                except Error:
                    return []

            def init(self, info):
                self.task = Topology.build(name, fn).instantiate(info.subtopology, _open_store)
                self._emitter = None
                self._cx = None
                self._ctx = None

            def _out(self, ctx):
                if self._ctx is not ctx:
                    self._ctx, self._emitter = ctx, _Emitter(ctx)
                    self._cx = _Cx(self._emitter)
                return self._emitter

            def process(self, record, ctx):
                entry = self.task.entries.get(record.source)
                if entry is None:
                    # Raises: the sub-topology does not read this source.
                    self.task.process(record.source, record.partition, record.offset, None, None, 0, None)
                index, node = entry
                if self._ctx is not ctx:
                    self._out(ctx)
                cx = self._cx
                cx.at(index, 0, record)
                try:
                    node.process_raw(record.key, record.value, record.timestamp, cx)
                except Error as e:
                    raise Error(f"the record at {record.source}/{record.partition}@{record.offset}: {e}") from None

            def batch_started(self):
                self.task.batch_started()

            def batch_done(self, ctx):
                self.task.batch_done()

            def punctuate(self, stream_time_ms, ctx):
                self.task.punctuate(stream_time_ms, self._out(ctx))

            def close(self, ctx):
                self.task.close(self._out(ctx))

        DslProcessor.__name__ = DslProcessor.__qualname__ = getattr(fn, "__name__", "DslProcessor")
        DslProcessor.__module__ = getattr(fn, "__module__", __name__)
        DslProcessor.__doc__ = fn.__doc__
        DslProcessor.topology_name = name
        DslProcessor.topology_function = staticmethod(fn)
        return DslProcessor

    return wrap


from ._graph import Cx as _Cx  # noqa: E402
