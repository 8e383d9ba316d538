//! The stream DSL's join and table examples on a real broker, each against a truth the test
//! computes, under exactly-once through a scale step (a second worker joins) and a SIGKILL
//! (of the first worker): orders joined with their payments within ten minutes
//! (`guests/dsl-orders-payments`, a stream-stream left join), orders enriched with their
//! customer from a co-partitioned table and from a global table (`guests/dsl-enrich-orders`),
//! and revenue per customer from a table-table join and a table aggregation that retracts
//! (`guests/dsl-revenue`). The cluster and the producing helpers are in `dsl_examples`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use sluice_tests::{kafka, unique_name, Received};

use crate::dsl_examples::{base_ms, committed, produce, produce_slowly, text, Example, Out};

const SEC: i64 = 1_000;
const MIN: i64 = 60 * SEC;

// --- 4. Orders joined with payments within ten minutes -------------------------------------

const JOIN_PARTITIONS: i32 = 4;
/// The example's window (a payment up to ten minutes after its order) and grace period.
const WINDOW: i64 = 10 * MIN;
const JOIN_GRACE: i64 = 2 * MIN;
/// Records are written in rounds of 100 s of event time, each round once the one before is
/// committed: within a round, the orders and payments of a partition are read in any
/// interleaving (two topics), so a round spans less than the grace period.
const ROUND: i64 = 100 * SEC;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Topic {
    Orders,
    Payments,
}

/// A record of the orders-payments example, and the round it is written in (`first`: with
/// the first records of the round, committed before the others are written).
#[derive(Debug, Clone)]
struct Event {
    round: usize,
    first: bool,
    topic: Topic,
    partition: i32,
    key: String,
    value: String,
    ts: i64,
}

fn round_of(ts: i64) -> usize {
    ((ts - base_ms()) / ROUND).max(0) as usize
}

/// The round in which a second worker joins: its first records are the payments past
/// grace of `AFTER_SCALE_STEP`.
const SCALE_ROUND: usize = 5;

/// 400 orders 3.5 s apart, on the partition of their number. By the last digit of their
/// number divided by 4 (so that each partition has every kind): 0-4 paid once within the
/// window (some written a round late, still within grace), 5 paid before the order (outside
/// the window), 6 paid twice, 7 paid 11 minutes later (outside), 8 never paid, 9 paid within
/// the window but written five minutes late (the order is still kept: it joins). The first
/// order of kind 8 on each partition gets a payment within its window written first after
/// the scale step (the first record of the moved tasks, joined only if they kept the orders
/// and the join's stream times). And 20 orders written 15 minutes late, each with a payment
/// a minute after it: the order goes out unpaid at once, and its payment finds it no more.
fn orders_and_payments() -> Vec<Event> {
    let mut events = Vec::new();
    let mut event = |topic: Topic, partition: i32, key: &str, value: String, ts: i64, round: usize| {
        events.push(Event {
            round,
            first: false,
            topic,
            partition,
            key: key.to_string(),
            value,
            ts,
        })
    };
    for i in 0..400usize {
        let p = (i % 4) as i32;
        let key = format!("o-{i:03}");
        let t = base_ms() + 20 * SEC + i as i64 * 3_500;
        event(Topic::Orders, p, &key, format!("order {key}"), t, round_of(t));
        let mut pay = |n: usize, ts: i64, round: usize| {
            event(Topic::Payments, p, &key, format!("pay-{i}-{n}"), ts, round);
        };
        let kind = (i / 4) % 10;
        match kind {
            0..=4 => {
                let ts = t + ((i as i64 * 37) % 540 + 30) * SEC;
                // Late in its round: may come in the next one and still be on time.
                let deferred = kind == 3 && (ts - base_ms()) % ROUND >= 85 * SEC;
                pay(0, ts, round_of(ts) + usize::from(deferred));
            }
            5 => pay(0, t - 30 * SEC, round_of(t - 30 * SEC)),
            6 => {
                pay(0, t + MIN, round_of(t + MIN));
                pay(1, t + 5 * MIN, round_of(t + 5 * MIN));
            }
            7 => pay(0, t + 11 * MIN, round_of(t + 11 * MIN)),
            8 => {}
            _ => pay(0, t + MIN, round_of(t + 6 * MIN)),
        }
    }
    for k in 0..20usize {
        let round = 10 + k % 5;
        let t = base_ms() + round as i64 * ROUND - 15 * MIN;
        let (p, key) = ((k % 4) as i32, format!("o-late-{k:02}"));
        event(Topic::Orders, p, &key, format!("order {key}"), t, round);
        event(Topic::Payments, p, &key, format!("pay-late-{k}"), t + MIN, round);
    }
    for i in (0..40usize).filter(|i| (i / 4) % 10 == 8) {
        let t = base_ms() + 20 * SEC + i as i64 * 3_500;
        events.push(Event {
            round: SCALE_ROUND,
            first: true,
            topic: Topic::Payments,
            partition: (i % 4) as i32,
            key: format!("o-{i:03}"),
            value: format!("pay-{i}-0"),
            ts: t + MIN,
        });
    }
    events.sort_by_key(|e| (e.round, e.ts));
    events
}

/// The example's results when a partition's records are read in `order`: Kafka Streams 4.x's
/// left join, record by record (see `guest-sdk/src/dsl/stream_join.rs`). Each side keeps its
/// records for the window and grace of its own stream time; an order finds the payments
/// kept within its window; a payment the orders kept that it falls within; an order with no
/// payment goes out alone at once if its window has passed, or once a record moves stream
/// time past its window and grace, unless a payment came first.
fn left_join(events: &[Event], order: &[usize]) -> BTreeMap<(String, String, i64), usize> {
    let retention = WINDOW + JOIN_GRACE;
    let mut out: BTreeMap<(String, String, i64), usize> = BTreeMap::new();
    let mut add = |key: &str, value: String, ts: i64| *out.entry((key.to_string(), value, ts)).or_default() += 1;
    let (mut kept_orders, mut kept_payments): (Vec<usize>, Vec<usize>) = (Vec::new(), Vec::new());
    let mut waiting: Vec<usize> = Vec::new();
    let mut time = [i64::MIN, i64::MIN]; // orders, payments
    for &i in order {
        let e = &events[i];
        let side = e.topic as usize;
        let before = time[0].max(time[1]);
        time[side] = time[side].max(e.ts);
        let now = time[0].max(time[1]);
        if e.ts >= before {
            waiting.sort_by_key(|&w| events[w].ts);
            waiting.retain(|&w| {
                let o = &events[w];
                let closed = o.ts + WINDOW + JOIN_GRACE < now;
                if closed {
                    add(&o.key, format!("{} unpaid", o.value), o.ts);
                }
                !closed
            });
        }
        let other_from = time[1 - side].saturating_sub(retention) + 1;
        match e.topic {
            Topic::Orders => {
                let found: Vec<usize> = kept_payments
                    .iter()
                    .copied()
                    .filter(|&j| {
                        let pay = &events[j];
                        pay.key == e.key && pay.ts >= other_from && e.ts <= pay.ts && pay.ts <= e.ts + WINDOW
                    })
                    .collect();
                for &j in &found {
                    let pay = &events[j];
                    add(&e.key, format!("{} paid by {}", e.value, pay.value), e.ts.max(pay.ts));
                }
                kept_orders.push(i);
                if found.is_empty() {
                    if e.ts + WINDOW < now {
                        add(&e.key, format!("{} unpaid", e.value), e.ts);
                    } else {
                        waiting.push(i);
                    }
                }
            }
            Topic::Payments => {
                for &j in &kept_orders {
                    let o = &events[j];
                    if o.key == e.key && o.ts >= other_from && o.ts <= e.ts && e.ts <= o.ts + WINDOW {
                        waiting.retain(|&w| w != j);
                        add(&o.key, format!("{} paid by {}", o.value, e.value), o.ts.max(e.ts));
                    }
                }
                kept_payments.push(i);
            }
        }
    }
    out
}

/// The truth, and that it does not depend on how the two topics of a partition interleave
/// within a round (records of earlier rounds were all read before): the left join of each
/// partition when a round's orders are read first, its payments first, or both in time
/// order. Panics if these differ (the test data would be wrong).
fn truth_of(events: &[Event], closer_at: i64) -> BTreeMap<(String, String, i64), usize> {
    let mut truth = BTreeMap::new();
    for p in 0..JOIN_PARTITIONS {
        let mine: Vec<usize> = (0..events.len()).filter(|&i| events[i].partition == p).collect();
        let chunks: std::collections::BTreeSet<(usize, bool)> =
            mine.iter().map(|&i| (events[i].round, !events[i].first)).collect();
        let mut answers = Vec::new();
        for interleaving in 0..3 {
            let mut order = Vec::new();
            for &(round, later) in &chunks {
                let mut chunk: Vec<usize> = mine
                    .iter()
                    .copied()
                    .filter(|&i| events[i].round == round && events[i].first != later)
                    .collect();
                match interleaving {
                    0 => chunk.sort_by_key(|&i| (events[i].topic as usize, events[i].ts)),
                    1 => chunk.sort_by_key(|&i| (1 - events[i].topic as usize, events[i].ts)),
                    _ => chunk.sort_by_key(|&i| events[i].ts),
                }
                order.extend(chunk);
            }
            let mut all = events.to_vec();
            all.push(Event {
                round: usize::MAX,
                first: false,
                topic: Topic::Orders,
                partition: p,
                key: format!("o-closer-{p}"),
                value: format!("order o-closer-{p}"),
                ts: closer_at,
            });
            order.push(all.len() - 1);
            answers.push(left_join(&all, &order));
        }
        assert!(
            answers[0] == answers[1] && answers[1] == answers[2],
            "test data: the results of partition {p} depend on how its topics interleave"
        );
        for (k, n) in answers.swap_remove(0) {
            *truth.entry(k).or_default() += n;
        }
    }
    truth
}

#[tokio::test(flavor = "multi_thread")]
async fn dsl_orders_join_payments_within_ten_minutes_exactly_through_a_scale_step_and_a_kill() -> anyhow::Result<()> {
    let (orders, payments, paid) = (
        unique_name("dsl-orders"),
        unique_name("dsl-payments"),
        unique_name("dsl-paid"),
    );
    kafka().create_topic(&orders, JOIN_PARTITIONS).await?;
    kafka().create_topic(&payments, JOIN_PARTITIONS).await?;
    kafka().create_topic(&paid, 2).await?;
    let mut ex = Example::new(
        "dslpaid",
        "dsl-orders-payments",
        &[("orders", &orders), ("payments", &payments)],
        &[("paid", &paid)],
    );
    let events = orders_and_payments();
    // Closers: an order 45 minutes in on every partition ends every window above; theirs
    // stays open (they must not come out).
    let closer_at = base_ms() + 45 * MIN;
    let truth = truth_of(&events, closer_at);
    // The data does what it is meant to: orders 15 minutes late go out unpaid at once (their
    // payments find them no more), payments written five minutes late still join, many
    // orders go out unpaid, and a pair within the window goes out joined.
    let count =
        |f: &dyn Fn(&(String, String, i64)) -> bool| truth.iter().filter(|(k, _)| f(k)).map(|(_, n)| n).sum::<usize>();
    let late_unpaid = count(&|(k, v, _)| k.starts_with("o-late") && v.ends_with("unpaid"));
    let unpaid = count(&|(_, v, _)| v.ends_with("unpaid"));
    let joined = count(&|(_, v, _)| v.contains("paid by"));
    let kind_9_paid = count(&|(k, v, _)| {
        let i: usize = k.trim_start_matches("o-").parse().unwrap_or(0);
        !k.starts_with("o-late") && (i / 4) % 10 == 9 && v.contains("paid by")
    });
    assert!(
        late_unpaid == 20 && unpaid >= 120 && joined >= 300 && kind_9_paid >= 30,
        "test data: {late_unpaid} late orders unpaid, {unpaid} unpaid, {joined} paid, {kind_9_paid} paid late"
    );
    let rounds = events.iter().map(|e| e.round).max().unwrap_or(0) + 1;
    assert_eq!(
        events.iter().filter(|e| e.first).count(),
        JOIN_PARTITIONS as usize,
        "test data: one payment past grace per partition right after the scale step"
    );
    let round = |r: usize, first: bool, topic: Topic| -> Vec<Out> {
        events
            .iter()
            .filter(|e| e.round == r && e.first == first && e.topic == topic)
            .map(|e| Out::at(e.partition, &e.key, &e.value, e.ts))
            .collect()
    };
    let (mut sent_orders, mut sent_payments) = (0, 0);

    ex.start_worker()?;
    ex.settle(4).await?;
    for r in 0..rounds {
        if r == SCALE_ROUND {
            // A second worker joins between two rounds and takes two tasks over (their
            // join stores through learners).
            ex.start_worker()?;
            ex.settle(2).await?;
        }
        for first in [true, false] {
            let (o, p) = (round(r, first, Topic::Orders), round(r, first, Topic::Payments));
            if o.is_empty() && p.is_empty() {
                continue;
            }
            (sent_orders, sent_payments) = (sent_orders + o.len(), sent_payments + p.len());
            produce(&orders, &o).await?;
            produce(&payments, &p).await?;
            if r == 11 {
                // The first worker is killed while this round is read; the second takes
                // its tasks (and their join stores) over.
                tokio::time::sleep(Duration::from_millis(200)).await;
                ex.kill_first()?;
                ex.settle(4).await?;
            }
            committed(&ex, &orders, JOIN_PARTITIONS, sent_orders).await?;
            committed(&ex, &payments, JOIN_PARTITIONS, sent_payments).await?;
        }
    }
    let closers: Vec<Out> = (0..JOIN_PARTITIONS)
        .map(|p| Out::at(p, format!("o-closer-{p}"), format!("order o-closer-{p}"), closer_at))
        .collect();
    produce(&orders, &closers).await?;

    let want: usize = truth.values().sum();
    let outputs = ex
        .finish(&[&paid], Duration::from_secs(90), |out| out[0].len() >= want)
        .await?;
    let mut got: BTreeMap<(String, String, i64), usize> = BTreeMap::new();
    for r in &outputs[0] {
        let (key, value) = text(r);
        *got.entry((key, value, r.timestamp.unwrap_or(-1))).or_default() += 1;
    }
    let mut problems = Vec::new();
    for (result, n) in &got {
        match truth.get(result) {
            Some(m) if m == n => {}
            Some(m) => problems.push(format!("{result:?}: sent {n} times, the truth is {m}")),
            None => problems.push(format!("{result:?}: sent {n} times, not in the truth")),
        }
    }
    for (result, m) in &truth {
        if !got.contains_key(result) {
            problems.push(format!("{result:?}: never sent (the truth: {m})"));
        }
    }
    assert!(
        problems.is_empty(),
        "{} of {} results differ from the truth (key, value, timestamp), e.g.:\n{}",
        problems.len(),
        truth.len(),
        problems[..problems.len().min(12)].join("\n")
    );
    Ok(())
}

// --- 5. Orders enriched from a co-partitioned table and from a global table ----------------

fn orders(range: std::ops::Range<usize>) -> Vec<Out> {
    range
        .map(|n| Out::keyed(format!("c-{:03}", n % 230), Some(format!("order-{n}"))))
        .collect()
}

/// Customers 0..200 first; then 0..40 renamed, 40..60 deleted, 200..220 added.
fn customers_then_changes() -> (Vec<Out>, Vec<Out>) {
    let c = |i: usize| format!("c-{i:03}");
    let first = (0..200).map(|i| Out::keyed(c(i), Some(format!("name-{i}")))).collect();
    let changes = (0..40)
        .map(|i| Out::keyed(c(i), Some(format!("renamed-{i}"))))
        .chain((40..60).map(|i| Out::keyed(c(i), None)))
        .chain((200..220).map(|i| Out::keyed(c(i), Some(format!("new-{i}")))))
        .collect();
    (first, changes)
}

/// The names a table of `records` holds, in order (a tombstone deletes).
fn names(records: &[Out]) -> BTreeMap<String, String> {
    let mut table = BTreeMap::new();
    for r in records {
        match &r.value {
            Some(v) => table.insert(r.key.clone(), v.clone()),
            None => table.remove(&r.key),
        };
    }
    table
}

/// Each order's enriched value in `out`: order → (customer key, values); probes left out.
fn enriched(out: &[Received]) -> BTreeMap<String, (String, Vec<String>)> {
    let mut by_order: BTreeMap<String, (String, Vec<String>)> = BTreeMap::new();
    for r in out {
        let (key, value) = text(r);
        let order = value.split(' ').next().unwrap_or_default().to_string();
        if !order.starts_with("probe-") {
            let e = by_order.entry(order).or_insert((key, Vec::new()));
            e.1.push(value);
        }
    }
    by_order
}

#[tokio::test(flavor = "multi_thread")]
async fn dsl_orders_are_enriched_from_a_table_and_a_global_table_exactly_through_a_scale_step_and_a_kill(
) -> anyhow::Result<()> {
    let t = |what: &str| unique_name(&format!("dsl-enrich-{what}"));
    let (orders_topic, customers, directory) = (t("orders"), t("customers"), t("directory"));
    let (out_table, out_global) = (t("enriched"), t("enriched-global"));
    // Orders and customers co-partitioned (4 and 4, the same partitioner); the global
    // table's topic on 3.
    kafka().create_topic(&orders_topic, 4).await?;
    kafka().create_topic(&customers, 4).await?;
    kafka().create_topic(&directory, 3).await?;
    kafka().create_topic(&out_table, 2).await?;
    kafka().create_topic(&out_global, 2).await?;
    let mut ex = Example::new(
        "dslenrich",
        "dsl-enrich-orders",
        &[
            ("orders", &orders_topic),
            ("customers", &customers),
            ("directory", &directory),
        ],
        &[("enriched", &out_table), ("enriched_global", &out_global)],
    );
    let (first, changes) = customers_then_changes();
    let before = names(&first);
    let after = names(&[first.clone(), changes.clone()].concat());
    let expected = |order: &Out, table: &BTreeMap<String, String>| {
        let name = table.get(&order.key).map_or("unknown customer", String::as_str);
        format!("{} for {name}", order.value.as_deref().unwrap_or_default())
    };
    let (batch_1, batch_2) = (orders(0..800), orders(800..1_400));

    // The customers are there before the first order: the table's tasks read them first,
    // the global table is filled before any task starts.
    produce(&customers, &first).await?;
    produce(&directory, &first).await?;
    ex.start_worker()?;
    ex.settle(4).await?;
    committed(&ex, &customers, 4, first.len()).await?;
    // A second worker joins while orders flow (its tasks' customers come from their
    // changelog through learners; its global table is filled before they start); then the
    // first is killed while more flow.
    let producing = produce_slowly(&orders_topic, batch_1[..400].to_vec(), 8, Duration::from_millis(150));
    tokio::time::sleep(Duration::from_millis(300)).await;
    ex.start_worker()?;
    ex.settle(2).await?;
    producing.await??;
    let producing = produce_slowly(&orders_topic, batch_1[400..].to_vec(), 8, Duration::from_millis(100));
    tokio::time::sleep(Duration::from_millis(400)).await;
    ex.kill_first()?;
    producing.await??;
    ex.settle(4).await?;
    committed(&ex, &orders_topic, 4, batch_1.len()).await?;

    // Renames, deletions and new customers; the second batch of orders comes once the table
    // has read them (committed) and the global table shows them (probe orders come back
    // with the new names).
    produce(&customers, &changes).await?;
    produce(&directory, &changes).await?;
    committed(&ex, &customers, 4, first.len() + changes.len()).await?;
    let changed: Vec<String> = changes.iter().map(|c| c.key.clone()).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    for round in 0.. {
        let probes: Vec<Out> = changed
            .iter()
            .map(|c| Out::keyed(c.clone(), Some(format!("probe-{round}-{c}"))))
            .collect();
        produce(&orders_topic, &probes).await?;
        let answers = loop {
            let out = kafka().read_all(&out_global, Duration::from_secs(60))?;
            let answers: BTreeMap<String, String> = out
                .iter()
                .map(text)
                .filter(|(_, v)| v.starts_with(&format!("probe-{round}-")))
                .collect();
            if answers.len() == changed.len() || Instant::now() > deadline {
                break answers;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let current = probes.iter().all(|p| answers.get(&p.key) == Some(&expected(p, &after)));
        if current {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the global table did not show the changes within 60 s; the workers' logs:\n{}",
            ex.logs()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    produce(&orders_topic, &batch_2).await?;

    let all = batch_1.len() + batch_2.len();
    let outputs = ex
        .finish(&[&out_table, &out_global], Duration::from_secs(90), |out| {
            out.iter().all(|o| enriched(o).len() >= all)
        })
        .await?;
    for (sink, out) in [("enriched (table)", &outputs[0]), ("enriched_global", &outputs[1])] {
        let got = enriched(out);
        let mut problems = Vec::new();
        for (batch, table) in [(&batch_1, &before), (&batch_2, &after)] {
            for order in batch {
                let id = order.value.clone().unwrap_or_default();
                let want = expected(order, table);
                match got.get(&id) {
                    None => problems.push(format!("{id}: never enriched")),
                    Some((key, values)) if key != &order.key || values != &vec![want.clone()] => {
                        problems.push(format!(
                            "{id}: sent {values:?} keyed {key}, the truth is once {want:?} keyed {}",
                            order.key
                        ))
                    }
                    Some(_) => {}
                }
            }
        }
        if got.len() != all {
            problems.push(format!("{} orders enriched, {all} sent", got.len()));
        }
        assert!(
            problems.is_empty(),
            "{sink}: {} orders differ from the truth, e.g.:\n{}",
            problems.len(),
            problems[..problems.len().min(12)].join("\n")
        );
    }
    Ok(())
}

// --- 6. Revenue per customer: a table-table join and a table aggregation -------------------

/// xorshift: the same updates every run.
fn next(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

/// Three rounds of updates to `orders` (`order id → {"customer", "amount"}`) and `statuses`
/// (`order id → status`): all 300 orders with their first status, then 400 random changes
/// twice: new amounts, moves to another customer, statuses changing, orders and statuses
/// deleted (tombstones) and orders made again.
fn revenue_rounds() -> Vec<(Vec<Out>, Vec<Out>)> {
    let order = |customer: u64, amount: u64| format!("{{\"customer\":\"c-{customer:02}\",\"amount\":{amount}}}");
    let statuses = ["paid", "paid", "pending", "refunded"];
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut rounds = Vec::new();
    // Each order's customer now.
    let mut customer: Vec<u64> = (0..300).map(|i| i % 30).collect();
    let (mut first_orders, mut first_statuses) = (Vec::new(), Vec::new());
    for i in 0..300u64 {
        let id = format!("o-{i:03}");
        first_orders.push(Out::keyed(&id, Some(order(customer[i as usize], 100 + (i * 37) % 900))));
        if i % 10 != 9 {
            first_statuses.push(Out::keyed(&id, Some(statuses[(i % 4) as usize].to_string())));
        }
    }
    rounds.push((first_orders, first_statuses));
    for _ in 0..2 {
        let (mut o, mut s) = (Vec::new(), Vec::new());
        for _ in 0..400 {
            let r = next(&mut seed);
            let (i, x) = ((r % 300) as usize, (r >> 20) % 1_000);
            let id = format!("o-{i:03}");
            match (r >> 12) % 8 {
                // A new amount (an order deleted before is made again).
                0 | 1 => o.push(Out::keyed(&id, Some(order(customer[i], 50 + x)))),
                // A move to another customer.
                2 => {
                    customer[i] = (r >> 32) % 30;
                    o.push(Out::keyed(&id, Some(order(customer[i], 1 + x / 3))));
                }
                3 => o.push(Out::keyed(&id, None)),
                4 | 5 => s.push(Out::keyed(&id, Some(statuses[(x % 4) as usize].to_string()))),
                6 => s.push(Out::keyed(&id, Some("paid".to_string()))),
                _ => s.push(Out::keyed(&id, None)),
            }
        }
        rounds.push((o, s));
    }
    rounds
}

/// Revenue per customer (cents) of the tables `rounds` leave: each paid order's amount.
fn revenue_truth(rounds: &[(Vec<Out>, Vec<Out>)]) -> BTreeMap<String, i64> {
    let orders: Vec<Out> = rounds.iter().flat_map(|r| r.0.clone()).collect();
    let statuses: Vec<Out> = rounds.iter().flat_map(|r| r.1.clone()).collect();
    let (orders, statuses) = (names(&orders), names(&statuses));
    let mut revenue = BTreeMap::new();
    for (id, order) in &orders {
        if statuses.get(id).map(String::as_str) == Some("paid") {
            let v: serde_json::Value = serde_json::from_str(order).expect("an order of the test");
            let customer = v["customer"].as_str().unwrap_or_default().to_string();
            *revenue.entry(customer).or_insert(0) += v["amount"].as_i64().unwrap_or_default();
        }
    }
    revenue
}

/// The last revenue sent per customer (in the order written: one partition per customer),
/// and every revenue sent that was negative.
fn last_revenue(out: &[Received]) -> (BTreeMap<String, i64>, Vec<(String, String)>) {
    let mut sorted: Vec<&Received> = out.iter().collect();
    sorted.sort_by_key(|r| (r.partition, r.offset));
    let (mut last, mut bad) = (BTreeMap::new(), Vec::new());
    for r in sorted {
        let (customer, value) = text(r);
        match value.parse::<i64>() {
            Ok(v) if v >= 0 => {
                last.insert(customer, v);
            }
            _ => bad.push((customer, value)),
        }
    }
    (last, bad)
}

#[tokio::test(flavor = "multi_thread")]
async fn dsl_revenue_per_customer_follows_updates_and_deletions_exactly_through_a_scale_step_and_a_kill(
) -> anyhow::Result<()> {
    let t = |what: &str| unique_name(&format!("dsl-revenue-{what}"));
    let (orders_topic, statuses, revenue) = (t("orders"), t("statuses"), t("out"));
    kafka().create_topic(&orders_topic, 4).await?;
    kafka().create_topic(&statuses, 4).await?;
    kafka().create_topic(&revenue, 3).await?;
    let mut ex = Example::new(
        "dslrevenue",
        "dsl-revenue",
        &[("orders", &orders_topic), ("statuses", &statuses)],
        &[("revenue", &revenue)],
    );
    let rounds = revenue_rounds();
    let truth = revenue_truth(&rounds);
    let tombstones = rounds
        .iter()
        .flat_map(|r| r.0.iter().chain(&r.1))
        .filter(|r| r.value.is_none())
        .count();
    assert!(
        tombstones >= 100 && truth.len() >= 25,
        "test data: {tombstones} tombstones, {} customers",
        truth.len()
    );
    let send = |round: usize, chunks: usize, pause: Duration| {
        let (o, s) = &rounds[round];
        (
            produce_slowly(&orders_topic, o.clone(), chunks, pause),
            produce_slowly(&statuses, s.clone(), chunks, pause),
        )
    };

    // 4 joining tasks (`orders`), 4 summing ones (`paid_by_customer`).
    ex.start_worker()?;
    ex.settle(8).await?;
    let (a, b) = send(0, 8, Duration::from_millis(150));
    tokio::time::sleep(Duration::from_millis(300)).await;
    ex.start_worker()?;
    ex.settle(4).await?;
    a.await??;
    b.await??;
    let (a, b) = send(1, 8, Duration::from_millis(100));
    tokio::time::sleep(Duration::from_millis(400)).await;
    ex.kill_first()?;
    a.await??;
    b.await??;
    let (a, b) = send(2, 1, Duration::ZERO);
    a.await??;
    b.await??;
    ex.settle(8).await?;

    // Done when both tables have read everything and the revenues, equal to the truth,
    // have stopped changing (the summing tasks have read all the joining tasks wrote).
    let sent_orders: usize = rounds.iter().map(|r| r.0.len()).sum();
    let sent_statuses: usize = rounds.iter().map(|r| r.1.len()).sum();
    committed(&ex, &orders_topic, 4, sent_orders).await?;
    committed(&ex, &statuses, 4, sent_statuses).await?;
    let mut seen = usize::MAX;
    let outputs = ex
        .finish(&[&revenue], Duration::from_secs(90), |out| {
            let (last, _) = last_revenue(&out[0]);
            let still = std::mem::replace(&mut seen, out[0].len()) == out[0].len();
            still
                && truth.iter().all(|(c, r)| last.get(c) == Some(r))
                && last.iter().all(|(c, r)| truth.contains_key(c) || *r == 0)
        })
        .await?;
    let (last, bad) = last_revenue(&outputs[0]);
    assert!(
        bad.is_empty(),
        "revenues that are not a number or below zero (a retraction applied twice?): {:?}",
        &bad[..bad.len().min(10)]
    );
    let mut problems = Vec::new();
    for (customer, r) in &truth {
        match last.get(customer) {
            Some(got) if got == r => {}
            got => problems.push(format!(
                "{customer}: the last revenue sent is {got:?}, the truth is {r}"
            )),
        }
    }
    for (customer, r) in &last {
        if !truth.contains_key(customer) && *r != 0 {
            problems.push(format!(
                "{customer}: the last revenue sent is {r}, but it has no paid order"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "{} customers' revenue differs from the truth:\n{}",
        problems.len(),
        problems.join("\n")
    );
    Ok(())
}
