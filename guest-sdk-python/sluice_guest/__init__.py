"""sluice-guest for Python: write Sluice topologies in Python.

A topology is a :class:`Processor` subclass: it declares what it reads, writes and keeps
(:class:`Description`), and handles one record at a time (the host hands records over in
batches). ``sluice build`` makes a WebAssembly component of it with componentize-py;
``sluice_guest.testing.TestDriver`` runs it under plain CPython for tests.

    from sluice_guest import Description, Processor

    class Uppercase(Processor):
        @classmethod
        def describe(cls):
            return Description("uppercase").source("input").sink("output")

        def process(self, record, ctx):
            ctx.emit("output", record.key, record.value_as().upper())
"""

from ._core import Context, Description, Error, Level, Processor, Record, Subtopology, TaskInfo
from .codec import Bytes, CodecError, I64, Json, Ordered, Str, Tuple, U64, ordered
from .store import Scan, Store

__all__ = [
    "Processor", "Record", "Context", "Description", "Subtopology", "TaskInfo", "Error", "Level",
    "Store", "Scan", "CodecError", "Bytes", "Str", "U64", "I64", "Json", "Tuple", "Ordered", "ordered",
]

__version__ = "0.2.0"
