//! Event-time order across a task's inputs (Kafka Streams' partition group, KIP-695): a task
//! with several source partitions takes its next record by timestamp across them, and waits
//! for a partition the broker still has records for before processing past it.
//!
//! Each test writes both inputs in full before the worker starts, the side that must come
//! first (by its timestamps) written *first*, so that its partitions are not ahead in
//! offsets, only in time: a task that processed its partitions in fetch order, not in time
//! order, found no customer for the first orders of a partition (issue 35: 421–851 of
//! ~3,300 matches missing in 4 of 8 runs) and took orders for late.

use std::collections::BTreeMap;
use std::time::Duration;

use sluice_tests::{kafka, unique_name};

use crate::dsl_examples::{base_ms, produce, text, Example, Out};

const CUSTOMERS: usize = 400;
const ORDERS: usize = 4_000;

fn at(key: String, value: Option<String>, ts: i64) -> Out {
    Out {
        partition: None,
        key,
        value,
        ts: Some(ts),
    }
}

/// A join whose table is written first, with timestamps ten minutes older than every order:
/// every order finds its customer, in the table join and in the global table join alike.
#[tokio::test(flavor = "multi_thread")]
async fn a_table_written_first_with_older_timestamps_joins_every_order() -> anyhow::Result<()> {
    let t = |what: &str| unique_name(&format!("evt-{what}"));
    let (orders_topic, customers, directory) = (t("orders"), t("customers"), t("directory"));
    let (out_table, out_global) = (t("enriched"), t("enriched-global"));
    kafka().create_topic(&orders_topic, 4).await?;
    kafka().create_topic(&customers, 4).await?;
    kafka().create_topic(&directory, 3).await?;
    kafka().create_topic(&out_table, 2).await?;
    kafka().create_topic(&out_global, 2).await?;
    let base = base_ms();
    let people: Vec<Out> = (0..CUSTOMERS)
        .map(|i| at(format!("c-{i:03}"), Some(format!("name-{i}")), base + i as i64))
        .collect();
    let orders: Vec<Out> = (0..ORDERS)
        .map(|n| {
            at(
                format!("c-{:03}", n % CUSTOMERS),
                Some(format!("order-{n}")),
                base + 10 * 60_000 + n as i64 * 10,
            )
        })
        .collect();
    produce(&customers, &people).await?;
    produce(&directory, &people).await?;
    produce(&orders_topic, &orders).await?;

    let mut ex = Example::new(
        "evtjoin",
        "dsl-enrich-orders",
        &[
            ("orders", &orders_topic),
            ("customers", &customers),
            ("directory", &directory),
        ],
        &[("enriched", &out_table), ("enriched_global", &out_global)],
    );
    ex.start_worker()?;
    let outputs = ex
        .finish(&[&out_table, &out_global], Duration::from_secs(120), |out| {
            out.iter().all(|o| o.len() >= ORDERS)
        })
        .await?;
    for (sink, out) in [("enriched (table)", &outputs[0]), ("enriched_global", &outputs[1])] {
        let unknown: Vec<String> = out
            .iter()
            .map(text)
            .filter(|(_, v)| v.ends_with("for unknown customer"))
            .map(|(k, v)| format!("{k}: {v}"))
            .collect();
        assert!(
            unknown.is_empty() && out.len() == ORDERS,
            "{sink}: {} of {} orders found no customer (the table was written first, with older \
             timestamps; {ORDERS} orders sent), e.g.:\n{}",
            unknown.len(),
            out.len(),
            unknown[..unknown.len().min(8)].join("\n")
        );
    }
    Ok(())
}

/// A stream-stream join whose later side (payments, each a minute after its order) is written
/// first: processed in time order, every order meets its payment and none is taken for late
/// (stream time is the join's, shared by both sides, and the window's grace is two minutes:
/// a task that read the payments first moved stream time past every order's window).
#[tokio::test(flavor = "multi_thread")]
async fn a_stream_join_whose_later_side_is_written_first_pairs_every_record() -> anyhow::Result<()> {
    let t = |what: &str| unique_name(&format!("evt-{what}"));
    let (orders_topic, payments, paid) = (t("orders"), t("payments"), t("paid"));
    kafka().create_topic(&orders_topic, 4).await?;
    kafka().create_topic(&payments, 4).await?;
    kafka().create_topic(&paid, 2).await?;
    let base = base_ms();
    const N: usize = 2_000;
    // Orders 400 ms apart over 13 minutes; each paid a minute later.
    let order_ts = |i: usize| base + i as i64 * 400;
    let orders: Vec<Out> = (0..N)
        .map(|i| at(format!("o-{i:04}"), Some(format!("order-{i}")), order_ts(i)))
        .collect();
    let pays: Vec<Out> = (0..N)
        .map(|i| at(format!("o-{i:04}"), Some(format!("pay-{i}")), order_ts(i) + 60_000))
        .collect();
    produce(&payments, &pays).await?;
    produce(&orders_topic, &orders).await?;

    let mut ex = Example::new(
        "evtsjoin",
        "dsl-orders-payments",
        &[("orders", &orders_topic), ("payments", &payments)],
        &[("paid", &paid)],
    );
    ex.start_worker()?;
    let outputs = ex
        .finish(&[&paid], Duration::from_secs(120), |out| out[0].len() >= N)
        .await?;
    let mut got: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in &outputs[0] {
        let (k, v) = text(r);
        got.entry(k).or_default().push(v);
    }
    let wrong: Vec<String> = (0..N)
        .filter_map(|i| {
            let key = format!("o-{i:04}");
            let want = vec![format!("order-{i} paid by pay-{i}")];
            (got.get(&key) != Some(&want)).then(|| format!("{key}: {:?}, want {want:?}", got.get(&key)))
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "{} of {N} orders were not paired once with their payment (the payments were written \
         first, each a minute after its order), e.g.:\n{}",
        wrong.len(),
        wrong[..wrong.len().min(8)].join("\n")
    );
    Ok(())
}

/// A table-table join whose tables are read in time order. Each order has an amount, then
/// is paid, then gets a new amount, then is refunded; both amounts are written before any
/// status. Kafka Streams joins the first amount with "paid", retracts it for the new one,
/// then retracts that at the refund: each customer's revenue goes through the old amount,
/// then the new one, and ends at 0. A task that read all of `orders` first never saw the old
/// amount paid; one that read `statuses` first never saw an order paid at all.
#[tokio::test(flavor = "multi_thread")]
async fn a_table_table_join_sees_each_side_as_it_was_at_the_others_time() -> anyhow::Result<()> {
    let t = |what: &str| unique_name(&format!("evt-{what}"));
    let (orders_topic, statuses, revenue) = (t("orders"), t("statuses"), t("revenue"));
    kafka().create_topic(&orders_topic, 4).await?;
    kafka().create_topic(&statuses, 4).await?;
    kafka().create_topic(&revenue, 2).await?;
    let base = base_ms();
    const N: usize = 300;
    let order = |i: usize, amount: i64, ts: i64| {
        at(
            format!("o-{i:03}"),
            Some(format!(r#"{{"customer":"c-{i:03}","amount":{amount}}}"#)),
            ts,
        )
    };
    let status = |i: usize, s: &str, ts: i64| at(format!("o-{i:03}"), Some(s.into()), ts);
    let first = |i: usize| 100 + i as i64;
    let then = |i: usize| 10_000 + i as i64;
    // What the join sent on for customer `i`, in order: the new value of each change (None
    // for a retraction).
    let news = |out: &[sluice_tests::Received], i: usize| -> Vec<Option<i64>> {
        let key = format!("c-{i:03}");
        out.iter()
            .filter(|r| r.key.as_deref() == Some(key.as_bytes()))
            .map(|r| change_new(r.value.as_deref().unwrap_or_default()))
            .collect()
    };
    // The old amount, later the new one, and last a retraction.
    let right = |i: usize, news: &[Option<i64>]| {
        let old = news.iter().position(|v| *v == Some(first(i)));
        let new = news.iter().rposition(|v| *v == Some(then(i)));
        matches!((old, new), (Some(o), Some(n)) if o < n) && news.last() == Some(&None)
    };
    let minute = 60_000;
    let mut orders: Vec<Out> = (0..N).map(|i| order(i, first(i), base + i as i64)).collect();
    orders.extend((0..N).map(|i| order(i, then(i), base + 2 * minute + i as i64)));
    let mut changes: Vec<Out> = (0..N).map(|i| status(i, "paid", base + minute + i as i64)).collect();
    changes.extend((0..N).map(|i| status(i, "refunded", base + 3 * minute + i as i64)));
    produce(&orders_topic, &orders).await?;
    produce(&statuses, &changes).await?;

    let mut ex = Example::new(
        "evtttjoin",
        "dsl-revenue",
        &[("orders", &orders_topic), ("statuses", &statuses)],
        &[("revenue", &revenue)],
    )
    .with_args(&["--repartition-purge-interval", "10m"]);
    ex.start_worker()?;
    // The revenue per customer goes out once per commit (the record cache): what the join
    // made of each update is in the repartition topic it writes, as table changes.
    let regrouped = format!("{}-paid_by_customer-repartition", ex.name);
    let all_right = |out: &[sluice_tests::Received]| (0..N).all(|i| right(i, &news(out, i)));
    ex.finish(&[&revenue], Duration::from_secs(60), |_| {
        kafka()
            .read_all(&regrouped, Duration::from_secs(10))
            .is_ok_and(|out| all_right(&out))
    })
    .await?;
    let out = kafka().read_all(&regrouped, Duration::from_secs(30))?;
    let wrong: Vec<String> = (0..N)
        .filter(|&i| !right(i, &news(&out, i)))
        .map(|i| {
            format!(
                "c-{i:03}: {:?}, want {} then {} then a retraction",
                news(&out, i),
                first(i),
                then(i)
            )
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "{} of {N} customers' paid orders did not go through the old amount, the new one and a \
         retraction (both amounts were written before any status; in time, each status falls \
         between them), e.g.:\n{}",
        wrong.len(),
        wrong[..wrong.len().min(8)].join("\n")
    );
    Ok(())
}

/// The new value of a table change as a grouping writes it to its repartition topic (a
/// flags byte: 1 old value, 2 new value; the old value's length, 4 bytes, and bytes; the new
/// value's bytes), decoded as the SDK's `i64`; None for a retraction alone.
fn change_new(bytes: &[u8]) -> Option<i64> {
    use sluice_guest::Decode;
    let (&flags, rest) = bytes.split_first()?;
    let rest = if flags & 1 == 1 {
        let len = u32::from_be_bytes(rest.get(..4)?.try_into().ok()?) as usize;
        rest.get(4 + len..)?
    } else {
        rest
    };
    (flags & 2 == 2).then(|| i64::decode(rest).expect("an i64 amount"))
}
