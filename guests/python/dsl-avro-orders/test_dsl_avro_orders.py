import datetime
import struct

from sluice_guest import Str
from sluice_guest.dsl.testing import TestDriver
from sluice_guest.formats import Schema

from dsl_avro_orders import CUSTOMER_TOTAL, ORDER, CustomerTotal, Order, _schema, avro_orders

PLACED = datetime.datetime(2024, 12, 6, 15, 46, 40, tzinfo=datetime.timezone.utc)


def order(i, customer, quantity):
    return Order(f"o{i}", customer, 1.5, quantity, PLACED)


def test_orders_are_counted_per_customer():
    driver = TestDriver(avro_orders)
    for i, (customer, quantity) in enumerate([("ann", 2), ("bob", 1), ("ann", 5)]):
        # What the host hands the topology: the Avro payload, in order.avsc, without framing.
        driver.pipe("orders", f"o{i}", order(i, customer, quantity), i, value_codec=ORDER)
    driver.punctuate()
    totals = driver.read("totals", Str, CUSTOMER_TOTAL)
    assert [t for t in totals if t[0] == "ann"][-1] == ("ann", CustomerTotal("ann", 2, 7), 2)
    assert driver.store("totals", Str, CUSTOMER_TOTAL) == {"ann": CustomerTotal("ann", 2, 7),
                                                           "bob": CustomerTotal("bob", 1, 1)}


def test_its_description_declares_the_formats_the_host_reads_and_writes_with():
    d = TestDriver(avro_orders).description
    assert d.format_of("orders").value == Schema.avro(_schema("order.avsc"))
    assert d.format_of("orders").key is None, "keys are plain strings"
    assert d.format_of("by_customer").value == Schema.avro(_schema("order.avsc")), "the repartition topic is Avro too"
    assert d.format_of("totals").value == Schema.avro(_schema("customer_total.avsc"))
    assert d.format_of("totals").key is None
    assert [f.topic for f in d.formats] == ["orders", "by_customer", "totals"]


def zigzag(n):
    """Avro's int and long: zig-zag, then 7 bits a byte, low first."""
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes(out + bytes([n]))


def text(s):
    return zigzag(len(s.encode())) + s.encode()


def test_an_order_is_avro_binary_in_its_schema_as_any_avro_library_writes_it():
    # The fields in order: strings (length, UTF-8), a double (8 bytes little-endian), an int, a
    # long (milliseconds), the union ["null", "string"] (branch 1, then the string).
    expected = (text("o-1") + text("ann") + struct.pack("<d", 1.5) + zigzag(2) + zigzag(1_733_500_000_000)
                + zigzag(1) + text("fast"))
    assert ORDER.encode(Order("o-1", "ann", 1.5, 2, PLACED, "fast")) == expected
    assert ORDER.decode(expected) == Order("o-1", "ann", 1.5, 2, PLACED, "fast")
