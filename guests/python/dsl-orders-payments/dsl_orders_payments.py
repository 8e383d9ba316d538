"""Example topology in Python with the stream DSL: orders joined with their payments. The
Python twin of `guests/dsl-orders-payments`. `orders` and `payments` are both keyed by order
id (co-partitioned) and stamped with event time. A payment counts for an order when it was
made within ten minutes after it (a stream-stream left join with no time before the order).

- Each (order, payment) pair within the window goes to `paid` at once:
  `order id → "<order> paid by <payment>"`, stamped with the later of the two times.
- An order no payment joined goes out once, alone, `"<order> unpaid"`, stamped with the
  order's time, once stream time is past its time, the window and the grace period (two
  minutes)."""

from datetime import timedelta

from sluice_guest import Str
from sluice_guest.dsl import JoinWindows, topology

WINDOW = timedelta(minutes=10)
GRACE = timedelta(minutes=2)


def paid(order, payment):
    return f"{order} unpaid" if payment is None else f"{order} paid by {payment}"


@topology("dsl-orders-payments")
def orders_payments(b):
    orders = b.stream("orders", key=Str, value=Str)
    payments = b.stream("payments", key=Str, value=Str)
    orders.left_join_stream(payments, paid, JoinWindows.of(WINDOW).before(0).grace(GRACE)).to("paid")
