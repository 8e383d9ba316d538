//! Example DSL topology: orders enriched with their customer, twice — from a table and from a
//! global table — to compare the two joins on the same orders.
//!
//! - `orders` is keyed by customer id, the value is the order (text).
//! - `customers` is a table keyed by customer id (the latest name per customer; a tombstone
//!   deletes one), kept in the store `customers`. It must be co-partitioned with `orders`:
//!   the same partition count, and each key on the same partition number in both.
//!   `orders.left_join(customers)` sends each order to `enriched`.
//! - `directory` is the same customers as a global table (store `directory`): the host
//!   keeps the whole topic on every worker, so its partition count is free.
//!   `orders.left_join_global(directory)` looks each order's customer up there and sends it
//!   to `enriched_global`.
//!
//! Both send `customer id → "<order> for <name>"`, or `"<order> for unknown customer"`
//! when the customer is not (or no longer) in the table. An order sees the table as it is
//! when the order is processed.

use sluice_guest::dsl::StreamsBuilder;

fn enriched(order: &str, customer: Option<&String>) -> String {
    let name = customer.map_or("unknown customer", String::as_str);
    format!("{order} for {name}")
}

fn topology(b: &mut StreamsBuilder) {
    let customers = b.table::<String, String>("customers", "customers");
    let directory = b.global_table::<String, String>("directory", "directory");
    let orders = b.stream::<String, String>("orders");
    orders
        .left_join(&customers, |order, customer| enriched(order, customer))
        .to("enriched");
    orders
        .left_join_global(
            &directory,
            |customer, _order| customer.clone(),
            |order, customer| enriched(order, customer),
        )
        .to("enriched_global");
}

sluice_guest::export_dsl!("dsl-enrich-orders", topology);

#[cfg(test)]
mod tests {
    use sluice_guest::dsl::testing::TestDriver;

    fn pipe(driver: &mut TestDriver, source: &str, key: &str, value: Option<&str>) {
        driver
            .pipe(source, key.to_string(), value.map(str::to_string), 1)
            .unwrap();
    }

    #[test]
    fn both_joins_see_the_customer_as_it_is_when_the_order_comes() {
        let mut driver = TestDriver::new("dsl-enrich-orders", super::topology).unwrap();
        for topic in ["customers", "directory"] {
            pipe(&mut driver, topic, "c1", Some("Ann"));
            pipe(&mut driver, topic, "c2", Some("Bob"));
        }
        pipe(&mut driver, "orders", "c1", Some("order-1"));
        pipe(&mut driver, "orders", "c3", Some("order-2"));
        for topic in ["customers", "directory"] {
            pipe(&mut driver, topic, "c1", Some("Ann B."));
            pipe(&mut driver, topic, "c2", None);
        }
        pipe(&mut driver, "orders", "c1", Some("order-3"));
        pipe(&mut driver, "orders", "c2", Some("order-4"));
        let want = vec![
            ("c1".to_string(), "order-1 for Ann".to_string()),
            ("c3".to_string(), "order-2 for unknown customer".to_string()),
            ("c1".to_string(), "order-3 for Ann B.".to_string()),
            ("c2".to_string(), "order-4 for unknown customer".to_string()),
        ];
        for sink in ["enriched", "enriched_global"] {
            let got: Vec<(String, String)> = driver
                .read::<String, String>(sink)
                .unwrap()
                .into_iter()
                .map(|r| (r.key, r.value))
                .collect();
            assert_eq!(got, want, "{sink}");
        }
        let description = driver.description();
        assert_eq!(description.subtopologies.len(), 1, "no repartition: {description:?}");
    }
}
