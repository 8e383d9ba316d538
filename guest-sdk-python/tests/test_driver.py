"""The Processor API under the TestDriver: what a topology emits, with which timestamps; its
stores and scans; and how each kind of failure becomes the task's error."""

import pytest

from sluice_guest import Description, Error, Json, Processor, Store, Str, Tuple, U64, ordered as o
from sluice_guest.testing import TestDriver, TopologyFailed
from sluice_guest.wire import decode_emitted, encode_inputs
from sluice_guest._core import Task, TaskInfo


class Uppercase(Processor):
    @classmethod
    def describe(cls):
        return Description("uppercase").source("input").sink("output")

    def process(self, record, ctx):
        ctx.emit("output", record.key, record.value_as().upper())


def test_records_keep_their_key_and_timestamp():
    d = TestDriver(Uppercase)
    d.pipe_batch("input", [(b"k", "hello", 5), (None, "a", 1), ("x", b"b", 2, [("h", b"v"), ("n", None)])])
    assert d.read("output") == [(b"k", b"HELLO", 5), (None, b"A", 1), (b"x", b"B", 2)]
    assert d.read("output") == []


class Everything(Processor):
    """Reads every field and emits with codecs, explicit timestamps and headers."""

    @classmethod
    def describe(cls):
        return Description("everything").source("a").source("b").sink("out").store("seen")

    def init(self, task):
        self.task = task
        self.seen = Store("seen", key=Tuple(o.Str, o.I64), value=Json)

    def process(self, record, ctx):
        self.seen.put((record.source, record.offset), {"key": record.key_as(), "headers": len(record.headers)})
        ctx.emit("out", record.key, record.value, headers=record.headers)
        ctx.emit_at("out", None, record.offset, record.timestamp + 1000, value_codec=U64)

    def punctuate(self, stream_time_ms, ctx):
        ctx.emit("out", "tick", str(stream_time_ms))

    def close(self, ctx):
        ctx.emit_at("out", "bye", None, -5)


def test_every_field_and_every_way_to_emit():
    d = TestDriver(Everything, partition=3)
    assert d._task.processor.task.partition == 3 and d._task.processor.task.task_id == "everything/3"
    d.pipe("b", "k1", b"v1", 10, headers=[("h", b"1")])
    d.pipe("a", "k2", b"v2", 20)
    d.punctuate()
    d.close()
    out = d.outputs
    assert [(o.key, o.value, o.timestamp, o.headers) for o in out] == [
        (b"k1", b"v1", 10, [("h", b"1")]),
        (None, U64.encode(0), 1010, []),
        (b"k2", b"v2", 20, []),
        (None, U64.encode(0), 1020, []),
        (b"tick", b"20", 20, []),
        (b"bye", None, -1, []),
    ]
    assert d.store("seen", Tuple(o.Str, o.I64), Json) == {("a", 0): {"key": "k2", "headers": 0},
                                                          ("b", 0): {"key": "k1", "headers": 1}}


class Counter(Processor):
    @classmethod
    def describe(cls):
        return Description("counter").source("in").sink("out").store("counts")

    def init(self, task):
        self.counts = Store("counts", key=Tuple(o.Str, o.I64), value=U64)

    def process(self, record, ctx):
        user, n = record.key_as(), int(record.value_as())
        for i in range(n):
            self.counts.put((user, i - n // 2), i)
        if user == "scan":
            ctx.emit("out", "all", str(sum(1 for _ in self.counts.range())))
            ctx.emit("out", "u1", str([k for k, _ in self.counts.prefix(("u1",))][:3]))
            ctx.emit("out", "deleted", str(self.counts.delete_range(("u1", -1), ("u1", 2))))
            ctx.emit("out", "after", str([k[1] for k, _ in self.counts.prefix(("u1",))][:5]))


def test_scans_page_lazily_in_key_order_and_delete_ranges():
    d = TestDriver(Counter)
    d.pipe("in", "u1", "600", 1)  # more than a page (256)
    d.pipe("in", "u10", "3", 1)
    d.pipe("in", "scan", "1", 2)
    out = {k.decode(): v.decode() for k, v, _ in d.read("out")}
    assert out["all"] == str(600 + 3 + 1)
    # Negative numbers first, and "u1" does not take "u10"'s keys.
    assert out["u1"] == "[('u1', -300), ('u1', -299), ('u1', -298)]"
    assert out["deleted"] == "3"
    assert out["after"] == "[-300, -299, -298, -297, -296]"
    assert ("u1", 0) not in d.store("counts", Tuple(o.Str, o.I64), U64)


class Faulty(Processor):
    @classmethod
    def describe(cls):
        return Description("faulty").source("in").sink("out").store("s")

    def process(self, record, ctx):
        what = record.value_as()
        if what == "raise":
            helper()
        if what == "undeclared":
            try:
                ctx.emit("nowhere", None, "x")
            except Error:
                pass  # ignored: the call still fails
        if what == "store":
            Store("not-declared")
        if what == "int":
            ctx.emit("out", None, 5)
        ctx.emit("out", None, what)


def helper():
    return {}["missing"]


@pytest.mark.parametrize("value,message", [
    ("raise", "KeyError: 'missing' (Python traceback, innermost first: test_driver.py:"),
    ("undeclared", "emit to undeclared sink 'nowhere'; the topology declares ['out']"),
    ("store", "store 'not-declared': store 'not-declared' is not declared"),
    ("int", "cannot emit a int value without a codec"),
])
def test_a_failure_names_the_record_and_what_went_wrong(value, message):
    d = TestDriver(Faulty)
    with pytest.raises(TopologyFailed) as e:
        d.pipe_batch("in", [(None, "fine", 1), (None, value, 2)])
    assert e.value.record_index == 1
    assert message in e.value.message, e.value.message
    if value == "raise":
        assert "in helper <- test_driver.py:" in e.value.message and "in process" in e.value.message
    # Nothing the failed batch emitted is kept.
    assert d.read("out") == []
    d.pipe("in", None, "after", 3)
    assert d.read("out") == [(None, b"after", 3)]


class FailsInInit(Processor):
    @classmethod
    def describe(cls):
        return Description("init").source("in").sink("out")

    def init(self, task):
        raise RuntimeError("no config")


def test_an_exception_in_init_is_the_tasks_error():
    with pytest.raises(TopologyFailed, match=r"init failed: init: RuntimeError: no config \(Python traceback"):
        TestDriver(FailsInInit)


def test_a_malformed_batch_is_an_error_not_a_crash():
    task = Task(Uppercase, TaskInfo("t", "t", "t/0", 0, ["i"], ["o"]))
    good = encode_inputs([(b"k", b"v", 1, 0, 0, 0, [])])
    assert decode_emitted(task.process(good))[0][2] == b"V"
    from sluice_guest._core import GuestFailure
    for bad in (good[:-3], good[:6], b"\x05\x00\x00\x00", good + b"!", encode_inputs([(b"k", b"v", 1, 9, 0, 0, [])])):
        with pytest.raises(GuestFailure):
            task.process(bad)
