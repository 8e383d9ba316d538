//! Example DSL topology: revenue per customer, kept right as orders change.
//!
//! - `orders` is a table keyed by order id, the value JSON `{"customer": "c-7", "amount":
//!   1250}` (a tombstone deletes the order), kept in the store `orders`;
//! - `statuses` is a table keyed by the same order id (`"pending"`, `"paid"`,
//!   `"refunded"`, or a tombstone), kept in the store `statuses`, co-partitioned with
//!   `orders`.
//!
//! A table-table join gives each order that has a status its customer, amount and status;
//! the paid ones are grouped by customer (through the repartition topic
//! `paid_by_customer`) and summed in the store `revenue_per_customer`. Every change of an
//! order travels as the retraction of what it was and the addition of what it is: a new
//! amount, a move to another customer, a refund, a deleted order or status — each takes the
//! old amount out of the customer's revenue (the subtractor) and adds the new one (the
//! adder). Each new revenue goes to `revenue`: `customer → "<revenue>"` (text).

use sluice_guest::dsl::StreamsBuilder;
use sluice_guest::serde::{Deserialize, Serialize};
use sluice_guest::Json;

/// An order as `orders` carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(crate = "sluice_guest::serde")]
pub struct Order {
    pub customer: String,
    /// In cents.
    pub amount: i64,
}

fn topology(b: &mut StreamsBuilder) {
    let orders = b.table::<String, Json<Order>>("orders", "orders");
    let statuses = b.table::<String, String>("statuses", "statuses");
    orders
        .join(&statuses, |order, status| {
            (order.0.customer.clone(), order.0.amount, status.clone())
        })
        .filter(|_, (_, _, status)| status == "paid")
        .group_by(|_, (customer, amount, _)| (customer.clone(), *amount))
        .named("paid_by_customer")
        .aggregate(
            || 0i64,
            |_, amount, revenue| revenue + amount,
            |_, amount, revenue| revenue - amount,
            "revenue_per_customer",
        )
        .to_stream()
        .map_values(|revenue| revenue.unwrap_or(0).to_string())
        .to("revenue");
}

sluice_guest::export_dsl!("dsl-revenue", topology);

#[cfg(test)]
mod tests {
    use sluice_guest::dsl::testing::TestDriver;
    use sluice_guest::Json;

    use super::Order;

    fn order(driver: &mut TestDriver, id: &str, order: Option<(&str, i64)>) {
        let value = order.map(|(customer, amount)| {
            Json(Order {
                customer: customer.to_string(),
                amount,
            })
        });
        driver.pipe("orders", id.to_string(), value, 1).unwrap();
    }

    fn status(driver: &mut TestDriver, id: &str, status: Option<&str>) {
        driver
            .pipe("statuses", id.to_string(), status.map(str::to_string), 1)
            .unwrap();
    }

    /// The last revenue sent per customer.
    fn revenue(driver: &mut TestDriver) -> std::collections::BTreeMap<String, String> {
        let out = driver.read::<String, String>("revenue").unwrap();
        out.into_iter().map(|r| (r.key, r.value)).collect()
    }

    #[test]
    fn revenue_follows_amounts_moves_refunds_and_deletions() {
        let mut driver = TestDriver::new("dsl-revenue", super::topology).unwrap();
        order(&mut driver, "o1", Some(("ann", 100)));
        order(&mut driver, "o2", Some(("ann", 50)));
        order(&mut driver, "o3", Some(("bob", 70)));
        status(&mut driver, "o1", Some("paid"));
        status(&mut driver, "o2", Some("pending"));
        status(&mut driver, "o3", Some("paid"));
        let got = revenue(&mut driver);
        assert_eq!((got["ann"].as_str(), got["bob"].as_str()), ("100", "70"));
        status(&mut driver, "o2", Some("paid")); // ann 150
        order(&mut driver, "o1", Some(("ann", 120))); // ann 170
        order(&mut driver, "o3", Some(("ann", 70))); // moved: bob 0, ann 240
        let got = revenue(&mut driver);
        assert_eq!((got["ann"].as_str(), got["bob"].as_str()), ("240", "0"));
        status(&mut driver, "o2", Some("refunded")); // ann 190
        order(&mut driver, "o1", None); // deleted: ann 70
        status(&mut driver, "o3", None); // no status: ann 0
        let got = revenue(&mut driver);
        assert_eq!(got["ann"], "0");
        assert_eq!(driver.description().subtopologies.len(), 2);
    }
}
