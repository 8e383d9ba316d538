"""The component's exports, for componentize-py: ``exports_for(topology)`` gives the three
classes a component's app module must define (``Processor``, ``Introspection`` and
``Formats``), calling the topology's code and turning every exception into the task's error.

Only a component imports this module (it needs componentize-py's ``wit_world``). A
topology's own modules must be imported at the top of its files, not inside functions: the
component runs a snapshot of the interpreter taken when it was built, with no files."""

from __future__ import annotations

import gc

from componentize_py_types import Err
from wit_world import exports
from wit_world.exports import formats as wit_formats
from wit_world.imports import sluice_topology_types_0_1_0 as types1
from wit_world.imports import sluice_topology_types_0_2_0 as types2

from . import _host
from ._core import GuestFailure, Task, TaskInfo, failure_message

# Every module the calls below need is imported now, while the component is built: the
# running component has no files to import from.
_host.set_backend(_host._ComponentHost())


def _description(d) -> "types2.Description":
    return types2.Description(
        name=d.name,
        sources=list(d.sources),
        sinks=list(d.sinks),
        stores=list(d.stores),
        internal_topics=[types2.InternalTopic(name=n, partitions=p) for n, p in d.internal_topics],
        subtopologies=[
            types2.Subtopology(name=s.name, sources=list(s.sources), sinks=list(s.sinks), stores=list(s.stores))
            for s in d.subtopologies
        ],
        global_stores=[types2.GlobalStore(name=n, topic=t) for n, t in d.global_stores],
    )


_KINDS = {
    "avro": wit_formats.SchemaKind.AVRO,
    "protobuf": wit_formats.SchemaKind.PROTOBUF,
    "json-schema": wit_formats.SchemaKind.JSON_SCHEMA,
}


def _schema(s) -> "wit_formats.Schema":
    return wit_formats.Schema(kind=_KINDS[s.kind], text=s.text, message=s.message,
                              imports=[(path, text) for path, text in s.imports])


def _formats(d) -> list:
    return [wit_formats.TopicFormat(topic=f.topic, key=None if f.key is None else _schema(f.key),
                                    value=None if f.value is None else _schema(f.value))
            for f in d.formats]


def _err(failure: GuestFailure) -> Err:
    return Err(types1.GuestError(record_index=failure.record_index, message=failure.message))


def exports_for(topology):
    """The ``Processor``, ``Introspection`` and ``Formats`` export classes of a component
    running ``topology`` (a :class:`sluice_guest.Processor` subclass, or a DSL topology)."""
    state = {"task": None}

    def task() -> Task:
        current = state["task"]
        if current is None:
            raise Err(types1.GuestError(record_index=None, message="the host called the topology before init"))
        return current

    class Processor(exports.Processor):
        def describe(self):
            # `describe` returns no error in the contract: an exception traps, and the
            # host reports the guest's stderr, where the traceback is.
            return _description(topology.describe())

        def init(self, info):
            try:
                state["task"] = Task(topology, TaskInfo(
                    topology=info.topology,
                    subtopology=info.subtopology,
                    task_id=info.task_id,
                    partition=info.partition,
                    source_topics=list(info.source_topics),
                    sink_topics=list(info.sink_topics),
                ))
            except GuestFailure as f:
                raise _err(f) from None
            except BaseException as e:  # noqa: BLE001 — SystemExit too
                raise Err(types1.GuestError(record_index=None, message=failure_message(e))) from None

        def process(self, batch):
            try:
                return task().process(batch)
            except GuestFailure as f:
                raise _err(f) from None

        def punctuate(self, stream_time_ms, wall_clock_ms):
            try:
                return task().punctuate(stream_time_ms)
            except GuestFailure as f:
                raise _err(f) from None

        def close(self):
            try:
                return task().close()
            except GuestFailure as f:
                raise _err(f) from None

    class Introspection(exports.Introspection):
        def describe_operators(self):
            return [(name, list(lines)) for name, lines in topology.operators()]

    class Formats(exports.Formats):
        def describe_formats(self):
            # Called once per component, after `describe`: the same description's formats
            # (an exception traps, as in `describe`).
            return _formats(topology.describe())

    # Every object alive now (the interpreter, the standard library, the topology's modules)
    # is in the component's memory image, which every task's instance shares copy-on-write.
    # The garbage collector writes to each object it looks at, so a full collection would
    # make a private copy of every page of the image it visits. Frozen, the collector leaves
    # them alone. (Reference counts still write to the objects a call touches: a live task
    # holds a few MiB of private pages all the same; see docs/python.md.)
    gc.collect()
    gc.freeze()
    return Processor, Introspection, Formats
