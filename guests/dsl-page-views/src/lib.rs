//! Example DSL topology: page views per user in event-time windows, each window's count sent
//! once, when the window closes (`emit_final`).
//!
//! `views` is keyed by user (the value, the page, is not read) and stamped with the time of
//! the view. Two windowed counts read it, grouped by the user as it is keyed (no
//! repartition):
//!
//! - `per_minute`: tumbling windows of one minute (store `views_per_minute`);
//! - `per_5_minutes`: hopping windows of five minutes, one starting every minute (store
//!   `views_per_5_minutes`): a view counts in the five windows that cover it.
//!
//! A view may arrive up to 30 s after its window ended (the grace period) and still count;
//! a later one is dropped. Once stream time (the largest timestamp the task has read) is past
//! a window's end and grace, the next punctuation sends `user → "<start> <end> <count>"`
//! (milliseconds, `end` exclusive), stamped with its latest view's time, and forgets
//! the window. Each operator keeps its stream time in its store, so after a restart or a
//! move a window is neither sent again nor early.

use std::time::Duration;

use sluice_guest::dsl::{StreamsBuilder, TimeWindows, Windowed};

/// The grace period: how long after its end a window still counts late views.
pub const GRACE: Duration = Duration::from_secs(30);
pub const MINUTE: Duration = Duration::from_secs(60);

/// A closed window as it goes out: keyed by the user, `"<start> <end> <count>"`.
fn line(window: Windowed<String>, count: Option<u64>) -> (String, String) {
    let count = count.unwrap_or(0);
    (window.key, format!("{} {} {count}", window.start, window.end))
}

fn topology(b: &mut StreamsBuilder) {
    let by_user = b.stream::<String, String>("views").group_by_key();
    by_user
        .windowed_by(TimeWindows::tumbling(MINUTE).grace(GRACE))
        .emit_final()
        .count("views_per_minute")
        .to_stream()
        .map(line)
        .to("per_minute");
    by_user
        .windowed_by(TimeWindows::hopping(5 * MINUTE, MINUTE).grace(GRACE))
        .emit_final()
        .count("views_per_5_minutes")
        .to_stream()
        .map(line)
        .to("per_5_minutes");
}

sluice_guest::export_dsl!("dsl-page-views", topology);

#[cfg(test)]
mod tests {
    use sluice_guest::dsl::testing::TestDriver;

    const MIN: i64 = 60_000;

    fn view(driver: &mut TestDriver, user: &str, at: i64) {
        driver.pipe("views", user.to_string(), "/home".to_string(), at).unwrap();
    }

    fn read(driver: &mut TestDriver, sink: &str) -> Vec<(String, String, i64)> {
        let out = driver.read::<String, String>(sink).unwrap();
        out.into_iter().map(|r| (r.key, r.value, r.timestamp)).collect()
    }

    #[test]
    fn a_window_goes_out_once_when_closed_with_late_views_within_grace_counted() {
        let mut driver = TestDriver::new("dsl-page-views", super::topology).unwrap();
        let t0 = 100 * MIN;
        view(&mut driver, "ann", t0 + 1_000);
        view(&mut driver, "ann", t0 + 59_000);
        view(&mut driver, "bob", t0 + 2_000);
        // Stream time passes the first minute's end; within grace, so still open.
        view(&mut driver, "bob", t0 + MIN + 20_000);
        driver.punctuate().unwrap();
        assert_eq!(read(&mut driver, "per_minute"), vec![], "no window closed yet");
        // Late, within grace: counted in the first minute.
        view(&mut driver, "ann", t0 + 30_000);
        // Stream time reaches end + grace: the first minute closes.
        view(&mut driver, "bob", t0 + MIN + 30_000);
        // Late past grace: dropped from the first minute.
        view(&mut driver, "ann", t0 + 40_000);
        driver.punctuate().unwrap();
        // Each stamped with its latest view (Kafka Streams' time of a window).
        assert_eq!(
            read(&mut driver, "per_minute"),
            vec![
                ("ann".to_string(), format!("{t0} {} 3", t0 + MIN), t0 + 59_000),
                ("bob".to_string(), format!("{t0} {} 1", t0 + MIN), t0 + 2_000),
            ]
        );
        driver.punctuate().unwrap();
        assert_eq!(read(&mut driver, "per_minute"), vec![], "sent once");
        // The hopping windows that hold the dropped view are still open: it counts there.
        view(&mut driver, "ann", t0 + 10 * MIN);
        driver.punctuate().unwrap();
        let hopping = read(&mut driver, "per_5_minutes");
        let ann: Vec<&str> = hopping
            .iter()
            .filter(|(k, _, _)| k == "ann")
            .map(|(_, v, _)| v.as_str())
            .collect();
        let w = |start: i64, n: u64| format!("{start} {} {n}", start + 5 * MIN);
        assert_eq!(
            ann,
            vec![
                w(t0 - 4 * MIN, 3).as_str(),
                &w(t0 - 3 * MIN, 4),
                &w(t0 - 2 * MIN, 4),
                &w(t0 - MIN, 4),
                &w(t0, 4)
            ]
        );
    }
}
