"""Example topology in Python with the stream DSL: orders enriched with their customer,
twice — from a table and from a global table. The Python twin of `guests/dsl-enrich-orders`.

- `orders` is keyed by customer id, the value is the order (text).
- `customers` is a table keyed by customer id (the latest name per customer; a tombstone
  deletes one), kept in the store `customers`, co-partitioned with `orders`.
  `orders.left_join(customers)` sends each order to `enriched`.
- `directory` is the same customers as a global table (store `directory`).
  `orders.left_join_global(directory)` sends each order to `enriched_global`.

Both send `customer id → "<order> for <name>"`, or `"<order> for unknown customer"`."""

from sluice_guest import Str
from sluice_guest.dsl import topology


def enriched(order, customer):
    return f"{order} for {customer if customer is not None else 'unknown customer'}"


@topology("dsl-enrich-orders")
def enrich_orders(b):
    customers = b.table("customers", "customers", key=Str, value=Str)
    directory = b.global_table("directory", "directory", key=Str, value=Str)
    orders = b.stream("orders", key=Str, value=Str)
    orders.left_join(customers, enriched).to("enriched")
    orders.left_join_global(directory, lambda customer, _order: customer, enriched).to("enriched_global")
