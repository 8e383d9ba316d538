//! Example DSL topology: orders joined with their payments. `orders` and `payments` are both
//! keyed by order id (co-partitioned: the same key on the same partition number of both
//! topics) and stamped with event time. A payment counts for an order when it was made
//! within ten minutes after it (a stream-stream left join, Kafka Streams'
//! `JoinWindows.ofTimeDifferenceAndGrace(…)` with no time before the order).
//!
//! - Each (order, payment) pair within the window goes to `paid` at once:
//!   `order id → "<order> paid by <payment>"`, stamped with the later of the two times.
//! - An order no payment joined goes out once, alone, `"<order> unpaid"`, stamped with the
//!   order's time, once stream time is past its time, the window and the grace period (two
//!   minutes). Each side keeps its records for the window and the grace period of its own
//!   stream time: a payment out of order joins the orders still kept, as in Kafka Streams
//!   (also an order already sent as unpaid: then it goes out paid too).
//!
//! Both sides' records wait in the join's stores (`left_join_stream_<n>_this` / `_other`,
//! and unmatched orders in `…_outer`) with the join's stream time, so a restarted or moved
//! task neither repeats nor loses an unmatched order.

use std::time::Duration;

use sluice_guest::dsl::{JoinWindows, StreamsBuilder};

pub const WINDOW: Duration = Duration::from_secs(600);
pub const GRACE: Duration = Duration::from_secs(120);

fn topology(b: &mut StreamsBuilder) {
    let orders = b.stream::<String, String>("orders");
    let payments = b.stream::<String, String>("payments");
    orders
        .left_join_stream(
            &payments,
            |order, payment| match payment {
                Some(payment) => format!("{order} paid by {payment}"),
                None => format!("{order} unpaid"),
            },
            JoinWindows::of(WINDOW).before(Duration::ZERO).grace(GRACE),
        )
        .to("paid");
}

sluice_guest::export_dsl!("dsl-orders-payments", topology);

#[cfg(test)]
mod tests {
    use sluice_guest::dsl::testing::TestDriver;

    const MIN: i64 = 60_000;

    fn read(driver: &mut TestDriver) -> Vec<(String, String, i64)> {
        let out = driver.read::<String, String>("paid").unwrap();
        out.into_iter().map(|r| (r.key, r.value, r.timestamp)).collect()
    }

    fn pipe(driver: &mut TestDriver, source: &str, key: &str, value: &str, at: i64) {
        driver.pipe(source, key.to_string(), value.to_string(), at).unwrap();
    }

    #[test]
    fn payments_within_ten_minutes_join_and_unpaid_orders_go_out_once_after_window_and_grace() {
        let mut driver = TestDriver::new("dsl-orders-payments", super::topology).unwrap();
        let t = 1_000 * MIN;
        pipe(&mut driver, "orders", "o1", "o1", t);
        pipe(&mut driver, "orders", "o2", "o2", t);
        pipe(&mut driver, "orders", "o3", "o3", t);
        // Before the order: outside the window.
        pipe(&mut driver, "payments", "o2", "p2", t - MIN);
        pipe(&mut driver, "payments", "o1", "p1", t + 9 * MIN);
        // After the window: o3 stays unpaid.
        pipe(&mut driver, "payments", "o3", "p3", t + 11 * MIN);
        assert_eq!(
            read(&mut driver),
            vec![("o1".to_string(), "o1 paid by p1".to_string(), t + 9 * MIN)]
        );
        // Stream time t + 12 min: the window and grace of the orders at t have not passed.
        pipe(&mut driver, "payments", "x", "px", t + 12 * MIN);
        driver.punctuate().unwrap();
        assert_eq!(read(&mut driver), vec![]);
        let stores = driver.close().unwrap();
        let mut driver = TestDriver::with_stores("dsl-orders-payments", super::topology, stores).unwrap();
        // Out of order, and the orders at t are still kept (12 minutes of the orders'
        // stream time): it joins o2.
        pipe(&mut driver, "payments", "o2", "late", t + 1);
        pipe(&mut driver, "payments", "x", "py", t + 12 * MIN + 1);
        driver.punctuate().unwrap();
        assert_eq!(
            read(&mut driver),
            vec![
                ("o2".to_string(), "o2 paid by late".to_string(), t + 1),
                ("o3".to_string(), "o3 unpaid".to_string(), t)
            ]
        );
        // An order the orders' stream time has left behind joins nothing.
        pipe(&mut driver, "orders", "o4", "o4", t + 30 * MIN);
        pipe(&mut driver, "payments", "o1", "after", t + 9 * MIN);
        assert_eq!(read(&mut driver), vec![]);
        driver.punctuate().unwrap();
        assert_eq!(read(&mut driver), vec![], "once");
    }
}
