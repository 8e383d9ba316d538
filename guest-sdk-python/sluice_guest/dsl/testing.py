"""Runs a DSL topology under plain CPython (Kafka Streams' ``TopologyTestDriver``, the Rust
SDK's ``dsl::testing::TestDriver``): every sub-topology runs as one task (one partition) over
memory stores; records written to repartition topics go straight to the sub-topology that
reads them; each record is a batch of its own, followed by a commit (record caches flush).

    driver = TestDriver(word_count)
    driver.pipe("lines", None, "to be or not to be", 1)
    assert driver.read("totals", Str, U64)[-1] == ("be", 2, 1)
"""

from __future__ import annotations

from collections import deque
from typing import Dict, List, Optional

from ..codec import Bytes, Codec
from ..testing import MemoryStore, Output
from ._graph import Topology
from ._ops import unstamp

__all__ = ["TestDriver"]


class _Collect:
    def __init__(self):
        self.out: List[Output] = []

    def emit(self, sink, key, value, ts):
        self.out.append(Output(sink, None if key is None else bytes(key), None if value is None else bytes(value),
                               ts, []))


class TestDriver:
    """Runs the DSL topology ``topology`` (what ``@topology(name)`` made) over memory stores:
    new ones, or ``stores`` from an earlier driver's ``close()`` (a restart)."""

    __test__ = False  # not a pytest test class

    def __init__(self, topology, *, stores: Optional[Dict[str, MemoryStore]] = None):
        name, fn = topology.topology_name, topology.topology_function
        compiled = Topology.build(name, fn)
        self.description = compiled.description()
        self.operators = compiled.operators()
        self.stores: Dict[str, MemoryStore] = stores if stores is not None else {}
        self._internal = {t for t, _ in self.description.internal_topics}
        self._globals = {topic: store for store, topic in self.description.global_stores}
        self._offsets: Dict[str, int] = {}
        self.outputs: List[Output] = []
        self._tasks = []
        for sub in self.description.subtopologies:
            task = Topology.build(name, fn).instantiate(sub.name, self._open)
            self._tasks.append([task, None])

    def _open(self, name):
        return self.stores.setdefault(name, MemoryStore())

    def external_sources(self) -> List[str]:
        return [s for s in self.description.sources if s not in self._internal]

    def pipe(self, source: str, key, value, timestamp: int = 0, *, key_codec: Codec = None,
             value_codec: Codec = None):
        """Processes one record of ``source`` (or fills the global table read from it); keys and
        values are bytes, str (UTF-8), None, or values of the codecs given."""
        def encode(item, codec):
            if item is None:
                return None
            if codec is not None:
                return codec.encode(item)
            return item.encode("utf-8") if isinstance(item, str) else bytes(item)

        k, v = encode(key, key_codec), encode(value, value_codec)
        store = self._globals.get(source)
        if store is not None:
            if k is not None:
                self._open(store).write_batch([(k, v)])
            return
        if source in self._internal:
            raise ValueError(f"{source!r} is an internal topic: pipe into the topology's sources "
                             f"{self.external_sources()}")
        self._run(deque([Output(source, k, v, timestamp, [])]))

    def _run(self, queue):
        while queue:
            rec = queue.popleft()
            entry = next((t for t in self._tasks if t[0].reads(rec.sink)), None)
            if entry is None:
                raise ValueError(f"the topology has no source {rec.sink!r}; its sources are "
                                 f"{self.external_sources()}")
            task = entry[0]
            offset = self._offsets.get(rec.sink, 0)
            self._offsets[rec.sink] = offset + 1
            out = _Collect()
            task.batch_started()
            task.process(rec.sink, 0, offset, rec.key, rec.value, rec.timestamp, out)
            task.batch_done()
            task.flush(out)
            entry[1] = rec.timestamp if entry[1] is None else max(entry[1], rec.timestamp)
            self._route(out, queue)

    def _route(self, out: _Collect, queue):
        for o in out.out:
            if o.sink in self._internal:
                queue.append(o)
            else:
                self.outputs.append(o)

    def punctuate(self):
        """Punctuates every task that has read a record, at its stream time: windows close."""
        for entry in self._tasks:
            if entry[1] is None:
                continue
            out = _Collect()
            entry[0].punctuate(entry[1], out)
            queue = deque()
            self._route(out, queue)
            self._run(queue)

    def read(self, sink: str, key_codec: Codec = Bytes, value_codec: Codec = Bytes) -> List[tuple]:
        """What the topology wrote to ``sink`` since the last read of it: (key, value, timestamp)
        each, decoded (None for a null)."""
        if sink not in self.description.sinks or sink in self._internal:
            raise ValueError(f"{sink!r} is not a sink of {self.description.name!r}")
        mine = [o for o in self.outputs if o.sink == sink]
        self.outputs = [o for o in self.outputs if o.sink != sink]
        return [(None if o.key is None else key_codec.decode(o.key),
                 None if o.value is None else value_codec.decode(o.value), o.timestamp) for o in mine]

    def store(self, name: str, key_codec: Codec = Bytes, value_codec: Codec = Bytes) -> dict:
        """A store's entries, decoded, in key order (values without their stored time; the
        stream time entry of a windowed store is left out)."""
        store = self.stores.get(name, MemoryStore())
        return {key_codec.decode(k): value_codec.decode(unstamp(store.values[k])[0]) for k in store.keys if k}

    def close(self) -> Dict[str, MemoryStore]:
        """Closes every task (windowed operators save their stream time, caches flush) and
        returns the stores, for ``TestDriver(topology, stores=...)``."""
        queue = deque()
        for task, _ in self._tasks:
            out = _Collect()
            task.close(out)
            self._route(out, queue)
        self._run(queue)
        return self.stores
