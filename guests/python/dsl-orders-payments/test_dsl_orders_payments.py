from sluice_guest import Str
from sluice_guest.dsl.testing import TestDriver

from dsl_orders_payments import orders_payments

MIN = 60_000


def test_a_paid_order_goes_out_joined_and_an_unpaid_one_alone_after_window_and_grace():
    driver = TestDriver(orders_payments)
    driver.pipe("orders", "o1", "book", 0)
    driver.pipe("orders", "o2", "pen", 1 * MIN)
    driver.pipe("payments", "o1", "card", 5 * MIN)
    assert driver.read("paid", Str, Str) == [("o1", "book paid by card", 5 * MIN)]
    # o2's window and grace end at 13 min: a record past it sends o2 alone.
    driver.pipe("payments", "o9", "cash", 13 * MIN + 1)
    assert driver.read("paid", Str, Str) == [("o2", "pen unpaid", 1 * MIN)]
