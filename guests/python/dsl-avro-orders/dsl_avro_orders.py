"""Example topology in Python with the stream DSL over Avro records behind a Schema Registry:
the Python twin of `guests/dsl-avro-orders`, reading the same schema files.

Orders (`orders`, Avro values written by Confluent's `AvroSerializer`, any key) are regrouped
by customer through the repartition topic `by_customer`, and each customer's count of orders
and of items is kept in the store `totals` and sent to `totals` as an Avro `CustomerTotal`,
keyed by the customer (a plain string). The host reads each order with the schema id in its
first bytes, resolves it against `order.avsc` (a newer writer may add fields, an older one
lack `note`), and registers `customer_total.avsc` for the results: the topology sees only
values in its own schemas."""

import datetime
import os
import sys
from dataclasses import dataclass
from typing import Optional

from sluice_guest import Str
from sluice_guest.dsl import topology
from sluice_guest.formats import Avro


def _schema(name: str) -> str:
    """A schema file of the Rust example, read when the module is imported: natively from
    `guests/dsl-avro-orders/schemas`, in the build from the python path, which holds that
    folder (pyproject.toml). The component keeps the text."""
    here = os.path.dirname(os.path.abspath(__file__))
    for folder in [os.path.join(here, "..", "..", "dsl-avro-orders", "schemas"), *sys.path]:
        path = os.path.join(folder, name)
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                return f.read()
    raise FileNotFoundError(f"{name}: the schemas of guests/dsl-avro-orders are not on the python path")


@dataclass
class Order:
    """An order: `order.avsc` (`placed` is a `timestamp-millis`, a datetime in UTC)."""

    id: str
    customer: str
    amount: float
    quantity: int
    placed: datetime.datetime
    note: Optional[str] = None


@dataclass
class CustomerTotal:
    """A customer's orders so far: `customer_total.avsc`."""

    customer: str
    orders: int
    items: int


ORDER = Avro(_schema("order.avsc"), cls=Order)
CUSTOMER_TOTAL = Avro(_schema("customer_total.avsc"), cls=CustomerTotal)


@topology("dsl-avro-orders")
def avro_orders(b):
    (b.stream("orders", key=Str, value=ORDER)
      .group_by(lambda _, order: order.customer, key=Str)
      .named("by_customer")
      .aggregate(lambda: CustomerTotal("", 0, 0),
                 lambda customer, order, total: CustomerTotal(customer, total.orders + 1,
                                                              total.items + order.quantity),
                 "totals", value=CUSTOMER_TOTAL)
      .to_stream()
      .to("totals"))
