"""Runs a topology under plain CPython, without a host or Kafka: ``TestDriver`` feeds records
through the same batch encoding a worker uses, over in-memory stores, and collects what the
topology emits.

    driver = TestDriver(Uppercase)
    driver.pipe("input", b"k", b"hello", timestamp=5)
    assert driver.read("output") == [(b"k", b"HELLO", 5)]
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass
from typing import Dict, List, Optional

from . import _host
from ._core import GuestFailure, Level, Task, TaskInfo
from .codec import Bytes, Codec
from .wire import INHERIT_TIMESTAMP, decode_emitted, encode_inputs

__all__ = ["TestDriver", "Output", "TopologyFailed", "MemoryStore"]


class TopologyFailed(AssertionError):
    """A call failed as it would fail the task on a worker: ``message`` is the task's error
    and ``record_index`` the batch record at fault, if any."""

    def __init__(self, call: str, failure: GuestFailure):
        where = "" if failure.record_index is None else f" (at record #{failure.record_index} of the batch)"
        super().__init__(f"{call} failed{where}: {failure.message}")
        self.message = failure.message
        self.record_index = failure.record_index


@dataclass
class Output:
    """A record the topology emitted."""

    sink: str
    key: Optional[bytes]
    value: Optional[bytes]
    timestamp: int
    headers: list


class MemoryStore:
    """A store in memory, in key order (what RocksDB gives a task on a worker)."""

    def __init__(self):
        self.keys: List[bytes] = []
        self.values: Dict[bytes, bytes] = {}
        self.read_only = False

    def _writable(self):
        if self.read_only:
            raise _host.StoreFailure("a global store is read-only")

    def get(self, key):
        return self.values.get(bytes(key))

    def put(self, key, value):
        self._writable()
        key = bytes(key)
        if key not in self.values:
            bisect.insort(self.keys, key)
        self.values[key] = bytes(value)

    def delete(self, key):
        self._writable()
        key = bytes(key)
        if self.values.pop(key, None) is not None:
            self.keys.pop(bisect.bisect_left(self.keys, key))

    def write_batch(self, entries):
        for key, value in entries:
            if value is None:
                self.delete(key)
            else:
                self.put(key, value)

    def range(self, start, end):
        return _MemoryScan(self, start, end, None)

    def prefix(self, prefix):
        return _MemoryScan(self, bytes(prefix), None, bytes(prefix))


class _MemoryScan:
    def __init__(self, store: MemoryStore, start, end, prefix):
        self.store = store
        self.after = None  # the last key returned
        self.start = start
        self.end = end
        self.prefix = prefix

    def next_page(self, max_entries):
        keys = self.store.keys
        if self.after is None:
            i = 0 if self.start is None else bisect.bisect_left(keys, self.start)
        else:
            i = bisect.bisect_right(keys, self.after)
        page = []
        while i < len(keys) and len(page) < max_entries:
            key = keys[i]
            if self.end is not None and key >= self.end:
                break
            if self.prefix is not None and not key.startswith(self.prefix):
                break
            page.append((key, self.store.values[key]))
            i += 1
        if page:
            self.after = page[-1][0]
        return page


class _TestHost:
    def __init__(self, stores: Dict[str, MemoryStore], declared, clock):
        self.stores = stores
        self.declared = declared
        self.clock = clock
        self.logs: List[tuple] = []

    def log(self, level, message):
        self.logs.append((level, message))

    def now_ms(self):
        return self.clock()

    def open_store(self, name):
        if name not in self.declared:
            raise _host.StoreFailure(f"store {name!r} is not declared")
        return self.stores.setdefault(name, MemoryStore())


class TestDriver:
    """Runs ``topology`` (a Processor subclass) as one task on partition ``partition``."""

    __test__ = False  # not a pytest test class

    def __init__(self, topology, *, partition: int = 0, clock=None):
        self.topology = topology
        self.description = topology.describe()
        self.stores: Dict[str, MemoryStore] = {}
        declared = set(self.description.stores) | {name for name, _ in self.description.global_stores}
        for name, _ in self.description.global_stores:
            self.stores[name] = MemoryStore()
            self.stores[name].read_only = True
        self._host = _TestHost(self.stores, declared, clock or (lambda: int(time.time() * 1000)))
        self.outputs: List[Output] = []
        self.stream_time: Optional[int] = None
        self._offsets: Dict[str, int] = {}
        info = TaskInfo(
            topology=self.description.name,
            subtopology=self.description.name,
            task_id=f"{self.description.name}/{partition}",
            partition=partition,
            source_topics=list(self.description.sources),
            sink_topics=list(self.description.sinks),
        )
        self.partition = partition
        self._task = self._call("init", lambda: Task(topology, info))

    @property
    def logs(self) -> List[tuple]:
        """(level, message) of every line the topology logged."""
        return self._host.logs

    def _call(self, name, call):
        previous = _host.set_backend(self._host)
        try:
            return call()
        except GuestFailure as f:
            raise TopologyFailed(name, f) from None
        finally:
            _host.set_backend(previous)

    def _collect(self, buf: bytes, default_ts: int):
        for sink, key, value, timestamp, headers in decode_emitted(buf):
            if timestamp == INHERIT_TIMESTAMP:
                timestamp = default_ts
            self.outputs.append(Output(self.description.sinks[sink], key, value, timestamp, headers))

    def pipe(self, source: str, key, value, timestamp: int = 0, *, headers=(), key_codec: Codec = None,
             value_codec: Codec = None):
        """Processes one record (a batch of one); see ``pipe_batch``."""
        self.pipe_batch(source, [(key, value, timestamp, headers)], key_codec=key_codec, value_codec=value_codec)

    def pipe_batch(self, source: str, records, *, key_codec: Codec = None, value_codec: Codec = None):
        """Processes records of ``source`` in one batch: each (key, value, timestamp[,
        headers]); keys and values are bytes, str (UTF-8), None, or values of the codecs given."""
        if source not in self.description.sources:
            raise ValueError(f"{source!r} is not a source of {self.description.name!r}: {self.description.sources}")
        index = self.description.sources.index(source)

        def encode(item, codec):
            if item is None:
                return None
            if codec is not None:
                return codec.encode(item)
            return item.encode("utf-8") if isinstance(item, str) else bytes(item)

        batch = []
        for r in records:
            key, value, timestamp = r[0], r[1], r[2]
            headers = [(n, None if v is None else bytes(v)) for n, v in (r[3] if len(r) > 3 else ())]
            offset = self._offsets.get(source, 0)
            self._offsets[source] = offset + 1
            batch.append((encode(key, key_codec), encode(value, value_codec), timestamp, index, self.partition,
                          offset, headers))
            self.stream_time = timestamp if self.stream_time is None else max(self.stream_time, timestamp)
        out = self._call("process", lambda: self._task.process(encode_inputs(batch)))
        self._collect(out, INHERIT_TIMESTAMP)

    def punctuate(self, stream_time_ms: Optional[int] = None):
        """Calls ``punctuate`` at ``stream_time_ms`` (default: the largest timestamp piped)."""
        t = self.stream_time if stream_time_ms is None else stream_time_ms
        if t is None:
            raise ValueError("no stream time yet: pipe a record first, or pass stream_time_ms")
        out = self._call("punctuate", lambda: self._task.punctuate(t))
        self._collect(out, t)

    def close(self):
        out = self._call("close", self._task.close)
        self._collect(out, INHERIT_TIMESTAMP)

    def read(self, sink: str, key_codec: Codec = Bytes, value_codec: Codec = Bytes) -> List[tuple]:
        """What the topology emitted to ``sink`` since the last read of it, decoded:
        (key, value, timestamp) each (None for an absent key or value)."""
        if sink not in self.description.sinks:
            raise ValueError(f"{sink!r} is not a sink of {self.description.name!r}: {self.description.sinks}")
        mine = [o for o in self.outputs if o.sink == sink]
        self.outputs = [o for o in self.outputs if o.sink != sink]
        return [(None if o.key is None else key_codec.decode(o.key),
                 None if o.value is None else value_codec.decode(o.value), o.timestamp) for o in mine]

    def store(self, name: str, key_codec: Codec = Bytes, value_codec: Codec = Bytes) -> dict:
        """A store's entries, decoded, in key order."""
        store = self.stores.get(name, MemoryStore())
        return {key_codec.decode(k): value_codec.decode(store.values[k]) for k in store.keys}

    def fill_global(self, name: str, key: bytes, value: Optional[bytes]):
        """Puts an entry into a global store (what the host fills from its topic)."""
        store = self.stores[name]
        store.read_only = False
        try:
            store.write_batch([(key, value)])
        finally:
            store.read_only = True
