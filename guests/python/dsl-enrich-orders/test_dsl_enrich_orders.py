from sluice_guest import Str
from sluice_guest.dsl.testing import TestDriver

from dsl_enrich_orders import enrich_orders


def test_orders_see_the_tables_as_they_are_when_processed():
    driver = TestDriver(enrich_orders)
    driver.pipe("customers", "c1", "Ann", 1)
    driver.pipe("directory", "c1", "Ann D.", 1)
    driver.pipe("orders", "c1", "o1", 2)
    driver.pipe("orders", "c2", "o2", 3)
    driver.pipe("customers", "c1", None, 4)  # deleted from the table, still in the directory
    driver.pipe("orders", "c1", "o3", 5)
    assert driver.read("enriched", Str, Str) == [
        ("c1", "o1 for Ann", 2), ("c2", "o2 for unknown customer", 3), ("c1", "o3 for unknown customer", 5)]
    assert driver.read("enriched_global", Str, Str) == [
        ("c1", "o1 for Ann D.", 2), ("c2", "o2 for unknown customer", 3), ("c1", "o3 for Ann D.", 5)]


def test_the_stream_and_its_table_run_in_one_sub_topology():
    d = TestDriver(enrich_orders).description
    assert [(s.name, s.sources, s.sinks, s.stores) for s in d.subtopologies] == [
        ("customers", ["customers", "orders"], ["enriched", "enriched_global"], ["customers"])]
    assert d.global_stores == [("directory", "directory")]
