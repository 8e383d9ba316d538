//! Example DSL topology over Avro records behind a Schema Registry: orders (`orders`, Avro
//! values written by Confluent's `AvroSerializer`, any key) are regrouped by customer through
//! the repartition topic `by_customer`, and each customer's count of orders and of items is
//! kept in the store `totals` and sent to `totals` as an Avro `CustomerTotal`, keyed by the
//! customer (a plain string). The host reads each order with the schema id in its first
//! bytes, resolves it against `schemas/order.avsc` (a newer writer may add fields, an older
//! one lack `note`), and registers `schemas/customer_total.avsc` for the results.

use sluice_guest::dsl::StreamsBuilder;
use sluice_guest::formats::Avro;
use sluice_guest::serde::{Deserialize, Serialize};

/// An order: `schemas/order.avsc` (`placed` is a `timestamp-millis`, milliseconds).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(crate = "sluice_guest::serde")]
pub struct Order {
    pub id: String,
    pub customer: String,
    pub amount: f64,
    pub quantity: i32,
    pub placed: i64,
    pub note: Option<String>,
}

sluice_guest::avro_schema!(Order, include_str!("../schemas/order.avsc"));

/// A customer's orders so far: `schemas/customer_total.avsc`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(crate = "sluice_guest::serde")]
pub struct CustomerTotal {
    pub customer: String,
    pub orders: i64,
    pub items: i64,
}

sluice_guest::avro_schema!(CustomerTotal, include_str!("../schemas/customer_total.avsc"));

/// The topology (public, so that `tests/` can run it through a `TestDriver`).
pub fn topology(b: &mut StreamsBuilder) {
    b.stream::<Option<String>, Avro<Order>>("orders")
        .group_by(|_, order| order.0.customer.clone())
        .named("by_customer")
        .aggregate(
            || {
                Avro(CustomerTotal {
                    customer: String::new(),
                    orders: 0,
                    items: 0,
                })
            },
            |customer: &String, order, Avro(total)| {
                Avro(CustomerTotal {
                    customer: customer.clone(),
                    orders: total.orders + 1,
                    items: total.items + i64::from(order.0.quantity),
                })
            },
            "totals",
        )
        .to_stream()
        .to("totals");
}

sluice_guest::export_dsl!("dsl-avro-orders", topology);

#[cfg(test)]
mod tests {
    use sluice_guest::dsl::testing::TestDriver;
    use sluice_guest::formats::Avro;

    use super::{CustomerTotal, Order};

    fn order(id: &str, customer: &str, quantity: i32) -> Avro<Order> {
        Avro(Order {
            id: id.into(),
            customer: customer.into(),
            amount: 1.5,
            quantity,
            placed: 1_733_500_000_000,
            note: None,
        })
    }

    #[test]
    fn orders_are_counted_per_customer() {
        let mut driver = TestDriver::new("dsl-avro-orders", super::topology).unwrap();
        for (i, (customer, quantity)) in [("ann", 2), ("bob", 1), ("ann", 5)].into_iter().enumerate() {
            driver
                .pipe(
                    "orders",
                    Some(format!("o{i}")),
                    order(&format!("o{i}"), customer, quantity),
                    i as i64,
                )
                .unwrap();
        }
        driver.punctuate().unwrap();
        let totals = driver.read::<String, Option<Avro<CustomerTotal>>>("totals").unwrap();
        let last = totals.iter().rev().find(|r| r.key == "ann").unwrap();
        let total = last.value.clone().unwrap().0;
        assert_eq!((total.customer.as_str(), total.orders, total.items), ("ann", 2, 7));
        // Its description declares the formats the host reads and writes with.
        let d = driver.description();
        assert!(d.format_of("orders").unwrap().value.is_some());
        assert!(d.format_of("totals").unwrap().value.is_some());
        assert!(d.format_of("totals").unwrap().key.is_none(), "keys are plain strings");
        assert!(
            d.format_of("by_customer").unwrap().value.is_some(),
            "the repartition topic is Avro too"
        );
    }
}
