//! Benchmark topology written with the stream DSL: events keyed by user, counted per user
//! in tumbling windows of one minute (10 s of grace), every update sent to `counts` as
//! `user@<window start ms> → count` (text). The same job as `WindowedCount` in
//! `bench/kafka-streams` (`groupByKey`, `windowedBy`, `count`).

use std::time::Duration;

use sluice_guest::dsl::{StreamsBuilder, TimeWindows};

fn topology(b: &mut StreamsBuilder) {
    b.stream::<String, Vec<u8>>("events")
        .group_by_key()
        .windowed_by(TimeWindows::tumbling(Duration::from_secs(60)).grace(Duration::from_secs(10)))
        .count("counts")
        .to_stream()
        .map(|w, n| (format!("{}@{}", w.key, w.start), n.unwrap_or(0).to_string()))
        .to("counts");
}

sluice_guest::export_dsl!("dsl-windowed-count", topology);

#[cfg(test)]
mod tests {
    use sluice_guest::dsl::testing::TestDriver;

    #[test]
    fn counts_per_user_and_minute() {
        let mut driver = TestDriver::new("dsl-windowed-count", super::topology).unwrap();
        for (user, ts) in [("a", 1_000), ("a", 59_999), ("a", 60_000), ("b", 5_000)] {
            driver.pipe("events", user.to_string(), Vec::new(), ts).unwrap();
        }
        let out = driver.read::<String, String>("counts").unwrap();
        let got: Vec<(&str, &str)> = out.iter().map(|r| (r.key.as_str(), r.value.as_str())).collect();
        assert_eq!(got, [("a@0", "1"), ("a@0", "2"), ("a@60000", "1"), ("b@0", "1")]);
    }
}
