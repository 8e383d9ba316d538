//! Example DSL topology: user sessions. `clicks` is keyed by user and stamped with the time
//! of the click (the value is not read); a user's clicks less than two minutes apart (the
//! inactivity gap) are one session. A click may arrive up to a minute late (the grace
//! period) and still count; if it falls between two sessions of its user, within the gap of
//! both, it merges them into one.
//!
//! Each session goes out once, when it has closed (no on-time click can reach it any more:
//! its last click plus the gap and the grace is before stream time): `user → "<start> <end>
//! <clicks>"`, `start` its first click, `end` one millisecond after its last, stamped with
//! its last click's time. The store `sessions` holds the open ones; the operator keeps its
//! stream time there too, so a restarted or moved task neither sends a session again nor
//! closes one early.

use std::time::Duration;

use sluice_guest::dsl::{SessionWindows, StreamsBuilder, Windowed};

pub const GAP: Duration = Duration::from_secs(120);
pub const GRACE: Duration = Duration::from_secs(60);

fn line(session: Windowed<String>, clicks: Option<u64>) -> (String, String) {
    let clicks = clicks.unwrap_or(0);
    (session.key, format!("{} {} {clicks}", session.start, session.end))
}

fn topology(b: &mut StreamsBuilder) {
    b.stream::<String, String>("clicks")
        .group_by_key()
        .windowed_by(SessionWindows::with_inactivity_gap(GAP).grace(GRACE))
        .emit_final()
        .count("sessions")
        .to_stream()
        .map(line)
        .to("sessions");
}

sluice_guest::export_dsl!("dsl-sessions", topology);

#[cfg(test)]
mod tests {
    use sluice_guest::dsl::testing::TestDriver;

    const SEC: i64 = 1_000;

    fn click(driver: &mut TestDriver, user: &str, at: i64) {
        driver.pipe("clicks", user.to_string(), "/".to_string(), at).unwrap();
    }

    fn read(driver: &mut TestDriver) -> Vec<(String, String, i64)> {
        let out = driver.read::<String, String>("sessions").unwrap();
        out.into_iter().map(|r| (r.key, r.value, r.timestamp)).collect()
    }

    #[test]
    fn a_late_click_between_two_sessions_merges_them_and_each_session_goes_out_once() {
        let mut driver = TestDriver::new("dsl-sessions", super::topology).unwrap();
        let t = 1_000_000 * SEC;
        click(&mut driver, "ann", t);
        click(&mut driver, "ann", t + 30 * SEC);
        // 150 s later: more than the gap, a second session.
        click(&mut driver, "ann", t + 180 * SEC);
        driver.punctuate().unwrap();
        assert_eq!(read(&mut driver), vec![], "both still open");
        // Late (stream time is t + 180 s), within the gap of both: one session of four.
        click(&mut driver, "ann", t + 100 * SEC);
        // Far from any session, 180 s behind stream time: a session of its own that closes
        // only once its click + gap + grace has passed (Kafka Streams' rule), so not late.
        click(&mut driver, "bob", t);
        // A millisecond earlier, its session would be closed already: late, dropped.
        click(&mut driver, "carl", t - 1);
        // Stream time moves past the merged session's last click + gap + grace.
        click(&mut driver, "eve", t + 361 * SEC);
        driver.punctuate().unwrap();
        assert_eq!(
            read(&mut driver),
            vec![
                ("bob".to_string(), format!("{t} {} 1", t + 1), t),
                ("ann".to_string(), format!("{t} {} 4", t + 180 * SEC + 1), t + 180 * SEC)
            ]
        );
        let stores = driver.close().unwrap();
        // Restarted on the same stores: nothing goes out again, eve's session is still open.
        let mut driver = TestDriver::with_stores("dsl-sessions", super::topology, stores).unwrap();
        click(&mut driver, "eve", t + 362 * SEC);
        driver.punctuate().unwrap();
        assert_eq!(read(&mut driver), vec![]);
    }
}
