//! Example DSL topology: what users do, through the window and join kinds the other examples
//! do not use. `clicks` (user → page) and `purchases` (user → item) are keyed by user and
//! co-partitioned; `profiles` (user → name) and `plans` (user → plan) are tables.
//!
//! - `sliding`: clicks per user in sliding windows of a minute (every set of clicks at most
//!   60 s apart) with 30 s of grace, each window sent once when it closes:
//!   `user → "<start> <end> <clicks>"` (`end` exclusive: start + 60 s + 1 ms).
//! - `session_updates`: clicks per session (an inactivity gap of two minutes, a minute of
//!   grace), every update: `"<user> <start> <end>" → "<clicks>"`, and a tombstone for a
//!   session merged into another.
//! - `hopping_updates`: clicks per user in hopping windows of a minute advancing by 20 s
//!   (10 s of grace), every update: `"<user>@<start>" → "<clicks>"`.
//! - `bought_after_click` and `click_or_purchase`: each click joined with the purchases of its
//!   user at most a minute before or after it (30 s of grace), as an inner join (`"<page> →
//!   <item>"` per pair) and an outer join (also `"<page> → -"` and `"- → <item>"` for a record
//!   nothing joined, once its window and grace have passed).
//! - `profile_plans` and `profiles_or_plans`: a user's name with their plan, as a left join
//!   of the tables (`"<name>/<plan or ->"`) and an outer join (`"<name or ->/<plan or ->"`);
//!   a deletion is a tombstone.
//!
//! Every result has Kafka Streams' timestamp; `bench/kafka-streams` (`dev.sluice.bench.Dsl`)
//! has the same topology, and the differential test compares the two.

use std::time::Duration;

use sluice_guest::dsl::{JoinWindows, SessionWindows, SlidingWindows, StreamsBuilder, TimeWindows};

pub const SLIDE: Duration = Duration::from_secs(60);
pub const SLIDE_GRACE: Duration = Duration::from_secs(30);
pub const GAP: Duration = Duration::from_secs(120);
pub const SESSION_GRACE: Duration = Duration::from_secs(60);
pub const HOP_SIZE: Duration = Duration::from_secs(60);
pub const HOP_ADVANCE: Duration = Duration::from_secs(20);
pub const HOP_GRACE: Duration = Duration::from_secs(10);
pub const JOIN: Duration = Duration::from_secs(60);
pub const JOIN_GRACE: Duration = Duration::from_secs(30);

fn or_dash(value: Option<&String>) -> &str {
    value.map_or("-", String::as_str)
}

fn topology(b: &mut StreamsBuilder) {
    let clicks = b.stream::<String, String>("clicks");
    let purchases = b.stream::<String, String>("purchases");
    let by_user = clicks.group_by_key();
    by_user
        .windowed_by(SlidingWindows::with_time_difference(SLIDE).grace(SLIDE_GRACE))
        .emit_final()
        .count("clicks_sliding")
        .to_stream()
        .map(|w, n| (w.key, format!("{} {} {}", w.start, w.end, n.unwrap_or(0))))
        .to("sliding");
    by_user
        .windowed_by(SessionWindows::with_inactivity_gap(GAP).grace(SESSION_GRACE))
        .count("clicks_sessions")
        .to_stream()
        .map(|w, n| (format!("{} {} {}", w.key, w.start, w.end), n.map(|n| n.to_string())))
        .to("session_updates");
    by_user
        .windowed_by(TimeWindows::hopping(HOP_SIZE, HOP_ADVANCE).grace(HOP_GRACE))
        .count("clicks_hopping")
        .to_stream()
        .map(|w, n| (format!("{}@{}", w.key, w.start), n.unwrap_or(0).to_string()))
        .to("hopping_updates");
    let windows = JoinWindows::of(JOIN).grace(JOIN_GRACE);
    clicks
        .join_stream(&purchases, |page, item| format!("{page} → {item}"), windows)
        .to("bought_after_click");
    clicks
        .outer_join_stream(
            &purchases,
            |page, item| format!("{} → {}", or_dash(page), or_dash(item)),
            windows,
        )
        .to("click_or_purchase");
    let profiles = b.table::<String, String>("profiles", "profiles");
    let plans = b.table::<String, String>("plans", "plans");
    profiles
        .left_join(&plans, |name, plan| format!("{name}/{}", or_dash(plan)))
        .to_stream()
        .to("profile_plans");
    profiles
        .outer_join(&plans, |name, plan| format!("{}/{}", or_dash(name), or_dash(plan)))
        .to_stream()
        .to("profiles_or_plans");
}

sluice_guest::export_dsl!("dsl-activity", topology);

#[cfg(test)]
mod tests {
    use sluice_guest::dsl::testing::TestDriver;

    const SEC: i64 = 1_000;

    fn pipe(driver: &mut TestDriver, source: &str, user: &str, value: Option<&str>, at: i64) {
        let value = value.map(str::to_string);
        driver.pipe(source, user.to_string(), value, at).unwrap();
    }

    fn read(driver: &mut TestDriver, sink: &str) -> Vec<(String, Option<String>, i64)> {
        let out = driver.read::<String, Option<String>>(sink).unwrap();
        out.into_iter().map(|r| (r.key, r.value, r.timestamp)).collect()
    }

    fn kv(key: &str, value: Option<&str>, ts: i64) -> (String, Option<String>, i64) {
        (key.to_string(), value.map(str::to_string), ts)
    }

    #[test]
    fn windows_and_joins_of_one_user() {
        let mut d = TestDriver::new("dsl-activity", super::topology).unwrap();
        let t = 1_000_000 * SEC;
        pipe(&mut d, "clicks", "ann", Some("/home"), t);
        pipe(&mut d, "purchases", "ann", Some("book"), t + 40 * SEC);
        pipe(&mut d, "clicks", "ann", Some("/cart"), t + 50 * SEC);
        assert_eq!(
            read(&mut d, "bought_after_click"),
            [
                kv("ann", Some("/home → book"), t + 40 * SEC),
                kv("ann", Some("/cart → book"), t + 50 * SEC)
            ]
        );
        // The second click merges into the first one's session: its tombstone, then the
        // merged session.
        let start = t.to_string();
        assert_eq!(
            read(&mut d, "session_updates"),
            [
                kv(&format!("ann {start} {}", t + 1), Some("1"), t),
                kv(&format!("ann {start} {}", t + 1), None, t),
                kv(&format!("ann {start} {}", t + 50 * SEC + 1), Some("2"), t + 50 * SEC),
            ]
        );
        // Stream time far ahead: the sliding windows close, the clicks' join windows pass.
        pipe(&mut d, "clicks", "zed", Some("/"), t + 10 * 60 * SEC);
        d.punctuate().unwrap();
        let sliding: Vec<_> = read(&mut d, "sliding").into_iter().filter(|r| r.0 == "ann").collect();
        assert_eq!(
            sliding,
            [
                kv("ann", Some(&format!("{} {} 1", t - 60 * SEC, t + 1)), t),
                kv(
                    "ann",
                    Some(&format!("{} {} 2", t - 10 * SEC, t + 50 * SEC + 1)),
                    t + 50 * SEC
                ),
                kv("ann", Some(&format!("{} {} 1", t + 1, t + 60 * SEC + 2)), t + 50 * SEC),
            ]
        );
        assert!(read(&mut d, "click_or_purchase")
            .iter()
            .all(|r| r.0 == "ann" || r.0 == "zed"));
    }

    #[test]
    fn table_joins_follow_both_sides_and_deletions() {
        let mut d = TestDriver::new("dsl-activity", super::topology).unwrap();
        pipe(&mut d, "plans", "bob", Some("gold"), 100);
        pipe(&mut d, "profiles", "ann", Some("Ann"), 200);
        pipe(&mut d, "profiles", "bob", Some("Bob"), 150);
        pipe(&mut d, "plans", "bob", None, 300);
        assert_eq!(
            read(&mut d, "profile_plans"),
            [
                kv("ann", Some("Ann/-"), 200),
                kv("bob", Some("Bob/gold"), 150),
                kv("bob", Some("Bob/-"), 300)
            ]
        );
        assert_eq!(
            read(&mut d, "profiles_or_plans"),
            [
                kv("bob", Some("-/gold"), 100),
                kv("ann", Some("Ann/-"), 200),
                kv("bob", Some("Bob/gold"), 150),
                kv("bob", Some("Bob/-"), 300)
            ]
        );
    }
}

/// A worker that dies after any record and a new one that starts over the committed stores
/// send what one worker running throughout sends: every operator keeps what it decides by in
/// its stores (random clicks and purchases, some out of order, punctuations at random).
#[cfg(test)]
mod restarts {
    use sluice_guest::dsl::testing::{Output, TestDriver};

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            self.0 >> 33
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    type Input = (&'static str, String, String, i64);

    fn inputs(seed: u64) -> Vec<Input> {
        let mut rng = Rng(seed);
        let mut t = 1_000_000_000i64;
        let mut out = Vec::new();
        for i in 0..300 {
            t += rng.below(8_000) as i64;
            let late = if rng.below(5) == 0 {
                rng.below(120_000) as i64
            } else {
                0
            };
            let user = format!("u{}", rng.below(3));
            let source = if rng.below(3) == 0 { "purchases" } else { "clicks" };
            out.push((source, user, format!("v{i}"), t - late));
        }
        out
    }

    fn all(d: &mut TestDriver) -> Vec<Output> {
        let mut out = Vec::new();
        for sink in [
            "sliding",
            "session_updates",
            "hopping_updates",
            "bought_after_click",
            "click_or_purchase",
        ] {
            out.extend(d.outputs(sink));
        }
        out
    }

    fn run(seed: u64, crash_at: Option<usize>, punctuate_every: u64) -> Vec<Output> {
        let mut d = TestDriver::new("dsl-activity", super::topology).unwrap();
        let mut out = Vec::new();
        let mut rng = Rng(seed ^ 0xabc);
        for (i, (source, user, value, ts)) in inputs(seed).into_iter().enumerate() {
            if Some(i) == crash_at {
                out.extend(all(&mut d));
                let stores = d.stores().clone();
                drop(d);
                d = TestDriver::with_stores("dsl-activity", super::topology, stores).unwrap();
            }
            d.pipe(source, user, Some(value), ts).unwrap();
            if rng.below(punctuate_every) == 0 {
                d.punctuate().unwrap();
            }
        }
        d.punctuate().unwrap();
        out.extend(all(&mut d));
        out.sort_by(|a, b| (&a.sink, &a.key, &a.value, a.timestamp).cmp(&(&b.sink, &b.key, &b.value, b.timestamp)));
        out
    }

    #[test]
    fn a_restart_changes_nothing() {
        let mut bad = 0;
        for seed in 1..40 {
            let truth = run(seed, None, 5);
            for crash in [37, 101, 150, 222] {
                let got = run(seed, Some(crash), 5);
                if got != truth {
                    bad += 1;
                    let only_got: Vec<_> = got.iter().filter(|o| !truth.contains(o)).take(3).collect();
                    let only_truth: Vec<_> = truth.iter().filter(|o| !got.contains(o)).take(3).collect();
                    eprintln!("seed {seed} crash {crash}: {} vs {}\n  restart only: {only_got:?}\n  straight only: {only_truth:?}", got.len(), truth.len());
                }
            }
        }
        assert_eq!(bad, 0);
    }
}
