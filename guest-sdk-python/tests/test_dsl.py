"""The Python DSL's own checks: topologies refused with the reason, failures that name the
operator, the record cache, and a DSL topology run through the component's batch path.
(Record-for-record equality with the Rust DSL is `guest-sdk/tests/python_dsl.rs`.)"""

import pytest

from sluice_guest import Error, Str, U64
from sluice_guest.dsl import Change, TimeWindows, Unit, topology
from sluice_guest.dsl._ops import RecordCache, _read_change, _write_change
from sluice_guest.dsl.testing import TestDriver
from sluice_guest.testing import TestDriver as ProcessorDriver, TopologyFailed


def refused(fn) -> str:
    with pytest.raises(Error) as e:
        fn.describe()
    return str(e.value)


def test_mistakes_are_refused_with_the_reason():
    @topology("two-keepers")
    def two_keepers(b):
        s = b.stream("in", value=Str)
        s.group_by_key().count("counts")
        s.group_by_key().count("counts")
    assert refused(two_keepers) == ('topology "two-keepers": the store "counts" is kept by two operators '
                                    '(count_1 and count_2): name each store once')

    @topology("read-twice")
    def read_twice(b):
        b.stream("in").to("a")
        b.stream("in").to("b")
    assert "the source \"in\" is read twice (by source_0 and source_2)" in refused(read_twice)

    @topology("bad-name")
    def bad_name(b):
        b.stream("in").map(lambda k, v: (v, k)).group_by_key().count("my counts")
    assert "contains ' '" in refused(bad_name)

    @topology("clash")
    def clash(b):
        s = b.stream("in").map(lambda k, v: (v, k))
        s.to("counts")
        s.group_by_key().count("counts")
    assert "has the name of a source or sink" in refused(clash)

    @topology("nothing")
    def nothing(b):
        pass
    assert "it reads no source" in refused(nothing)

    @topology("bad-windows")
    def bad_windows(b):
        b.stream("in").group_by_key().windowed_by(TimeWindows.hopping(10, 20)).count("w")
    assert "the advance must be positive and at most the size" in refused(bad_windows)


def test_a_value_of_the_wrong_type_names_the_operator_and_the_fix():
    @topology("lengths")
    def lengths(b):
        b.stream("in", key=Str, value=Str).map_values(len).to("out")
    driver = TestDriver(lengths)
    with pytest.raises(Error) as e:
        driver.pipe("in", "k", "abc", 1)
    assert str(e.value) == ("the record at in/0@0: operator sink_2: encoding the value: utf-8 codec: expected str, "
                            "got int (give the operator that made it a value= codec)")

    @topology("lengths-fixed")
    def fixed(b):
        b.stream("in", key=Str, value=Str).map_values(len, value=U64).to("out")
    driver = TestDriver(fixed)
    driver.pipe("in", "k", "abc", 1)
    assert driver.read("out", Str, U64) == [("k", 3, 1)]


def test_a_dsl_topology_runs_through_the_batch_path_and_an_exception_names_its_line():
    @topology("upper-or-fail")
    def upper(b):
        b.stream("in", key=Unit, value=Str).map_values(lambda v: v.upper() if v != "boom" else 1 // 0).to("out")
    driver = ProcessorDriver(upper)
    driver.pipe_batch("in", [(None, "a", 5), (None, "b", 6)])
    assert driver.read("out", value_codec=Str) == [(None, "A", 5), (None, "B", 6)]
    with pytest.raises(TopologyFailed) as e:
        driver.pipe_batch("in", [(None, "c", 7), (None, "boom", 8)])
    assert e.value.record_index == 1
    assert e.value.message.startswith("ZeroDivisionError: integer division or modulo by zero (Python traceback")
    assert "test_dsl.py:" in e.value.message


def test_windows_go_out_once_with_the_time_of_their_latest_record_and_a_restart_keeps_stream_time():
    @topology("per-minute")
    def per_minute(b):
        (b.stream("in", key=Str, value=Str).group_by_key()
         .windowed_by(TimeWindows.tumbling(60_000).grace(10_000)).emit_final().count("per_minute")
         .to_stream().map(lambda w, n: (f"{w.key}@{w.start}", str(n)), key=Str, value=Str).to("out"))
    driver = TestDriver(per_minute)
    for ts in (1_000, 30_000, 2_000):
        driver.pipe("in", "a", "x", ts)
    driver.pipe("in", "b", "x", 69_999)
    driver.punctuate()
    assert driver.read("out", Str, Str) == []
    stores = driver.close()
    again = TestDriver(per_minute, stores=stores)
    again.pipe("in", "b", "x", 70_000)
    again.punctuate()
    assert again.read("out", Str, Str) == [("a@0", "3", 30_000)]
    again.pipe("in", "a", "x", 3_000)  # closed: dropped
    again.punctuate()
    assert again.read("out", Str, Str) == []


def test_the_record_cache_sends_a_key_once_from_its_first_old_value_and_undoes_a_failed_call():
    c = RecordCache(1 << 20)
    c.call_started()
    assert c.put(b"a", "a", None, 1, 10, 8) == []
    assert c.put(b"b", "b", None, 1, 11, 8) == []
    assert c.put(b"a", "a", 1, 2, 12, 8) == []
    c.call_done()
    c.call_started()
    c.put(b"a", "a", 2, 3, 13, 8)
    c.put(b"c", "c", None, 1, 14, 8)
    # No call_done: the batch failed; the next call starts from where the last good one ended.
    c.call_started()
    assert c.flush() == [("b", Change(1, None), 11), ("a", Change(2, None), 12)]
    # A full cache sends its oldest keys on: each entry costs 1 + 8 + 1 + 64 bytes.
    small = RecordCache(160)
    assert small.put(b"a", "a", None, 1, 1, 9) == []
    assert small.put(b"b", "b", None, 1, 2, 9) == []
    assert small.put(b"c", "c", None, 1, 3, 9) == [("a", Change(1, None), 1)]
    # Created and deleted between flushes: nothing.
    gone = RecordCache(1 << 20)
    gone.put(b"a", "a", None, 1, 1, 9)
    gone.put(b"a", "a", 1, None, 2, 0)
    assert gone.flush() == []


def test_an_aggregation_keeps_its_value_with_the_latest_time_in_rusts_bytes():
    @topology("totals")
    def totals(b):
        b.stream("in", key=Str, value=Str).group_by_key().count("counts").to_stream().to("out")
    driver = TestDriver(totals)
    driver.pipe("in", "k", "x", 50)
    driver.pipe("in", "k", "x", 20)
    raw = driver.stores["counts"].values[b"k"]
    # The count, its time (the later of the two), then the stamp's tag.
    assert raw == (2).to_bytes(8, "big") + (50).to_bytes(8, "big") + bytes([0xF5, 0xC1]) + b"SlTs\x00\x01"
    assert driver.read("out", Str, U64) == [("k", 1, 50), ("k", 2, 50)]


def test_table_changes_round_trip_and_forged_ones_are_named():
    # The repartition topic of a table grouping is Kafka: what is read from it is checked.
    for old, new in [(b"old", b"new"), (None, b""), (b"", None), (None, None)]:
        assert _read_change(_write_change(old, new)) == (old, new)
    for forged, why in [(b"", "an empty table change"), (b"\x01\x00\x00\x00\x09ab", "a table change cut short"),
                        (b"\x07", "a table change with flags 0x07"),
                        (b"\x00x", "bytes after a table change without a new value")]:
        with pytest.raises(ValueError) as e:
            _read_change(forged)
        assert str(e.value) == why

    @topology("regroup")
    def regroup(b):
        (b.table("t", "t", key=Str, value=Str).group_by(lambda k, v: (v, k)).named("by_value").count("n")
         .to_stream().to("out"))
    driver = TestDriver(regroup)
    task = next(t for t, _ in driver._tasks if t.reads("by_value"))
    with pytest.raises(Error) as e:
        task.process("by_value", 0, 7, b"k", b"\x07", 1, None)
    assert str(e.value) == "the record at by_value/0@7: operator repartition_source_2: a table change with flags 0x07"
