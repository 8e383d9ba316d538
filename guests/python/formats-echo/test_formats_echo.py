import datetime
import decimal
import re
import uuid

from sluice_guest.testing import TestDriver

from formats_echo import EVERY, ORDER_JSON, ORDER_KEY, ORDER_PROTO, FormatsEcho, _schema


def test_the_order_class_has_the_fields_of_order_proto():
    text = _schema("order.proto")
    descriptor = ORDER_PROTO.message_class.DESCRIPTOR

    def fields(d):
        for f in d.fields:
            yield f
        for nested in d.nested_types:
            if not nested.GetOptions().map_entry:  # a map's entry is `map<...> name = n;`
                yield from fields(nested)

    for f in fields(descriptor):
        assert re.search(rf"\b{f.name}\s*=\s*{f.number}\s*;", text), f"{f.full_name} = {f.number} is not in order.proto"
    assert [v.name for v in descriptor.enum_types_by_name["Status"].values] == ["NEW", "PAID", "SHIPPED"]


def test_each_format_comes_out_as_it_went_in():
    every = {
        "n": None, "b": True, "i": -5, "l": 1 << 40, "f": 1.5, "d": -2.25, "by": b"\x00\xff", "s": "héllo",
        "fx": b"\x01\x02\x03\x04", "e": "HEARTS", "a": [1, -2], "m": {"k": "v"}, "u": 7,
        "r": {"x": 1, "next": {"x": 2, "next": None}}, "ra": [], "date": datetime.date(2024, 12, 6),
        "tm": datetime.time(1, 2, 3, 4000), "tu": datetime.time(1, 2, 3, 4),
        "tsm": datetime.datetime(2024, 12, 6, 1, 2, 3, 4000, tzinfo=datetime.timezone.utc),
        "tsu": datetime.datetime(2024, 12, 6, 1, 2, 3, 4, tzinfo=datetime.timezone.utc),
        "uuid": uuid.UUID(int=12345), "dec": decimal.Decimal("12.50"),
    }
    order = ORDER_PROTO.message_class(id="p-1", quantity=3, tags=["a"], counters={"x": 2}, blob=b"\x01")
    order.lines.add(sku="s", count=4)
    json_order = {"id": "j-1", "amount": 0.5, "customer": {"name": "Ann"}}
    driver = TestDriver(FormatsEcho)
    driver.pipe("every_in", "e", every, value_codec=EVERY)
    driver.pipe("proto_in", "p", order, value_codec=ORDER_PROTO)
    driver.pipe("json_in", "j", json_order, value_codec=ORDER_JSON)
    assert [v for _, v, _ in driver.read("every_out", value_codec=EVERY)] == [every]
    assert [v for _, v, _ in driver.read("proto_out", value_codec=ORDER_PROTO)] == [order]
    assert [v for _, v, _ in driver.read("json_out", value_codec=ORDER_JSON)] == [json_order]
    driver.pipe("keyed_in", {"id": "j-1", "shard": 3}, json_order, key_codec=ORDER_KEY, value_codec=ORDER_JSON)
    assert [(k, v) for k, v, _ in driver.read("keyed_out", ORDER_KEY, ORDER_JSON)] == [({"id": "j-1", "shard": 3},
                                                                                       json_order)]
