//! The group runner's decisions that need no group, no runner and no clock of their own:
//! what an assignment stops, starts and promotes, when to back off a rejoin, when the loop
//! wakes, whether a drain ran out of time.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::group::metadata::{Assignment, AssignmentError, OLDEST_VERSION};
use crate::group::TaskId;

/// The standbys a worker reports in its metadata: those that are not learners (reported
/// as learners).
pub(super) fn standing_by(standbys: Vec<TaskId>, learners: &[TaskId]) -> Vec<TaskId> {
    standbys.into_iter().filter(|t| !learners.contains(t)).collect()
}

/// Tasks assigned active here that this worker does not own yet.
pub(super) fn arriving(active: &[TaskId], owned: &[TaskId]) -> Vec<TaskId> {
    active.iter().filter(|t| !owned.contains(t)).cloned().collect()
}

/// Tasks this worker owns that are not assigned active here any more: revoked (or no longer
/// ours); they stop first.
pub(super) fn no_longer_active(owned: Vec<TaskId>, active: &[TaskId]) -> Vec<TaskId> {
    owned.into_iter().filter(|t| !active.contains(t)).collect()
}

/// Standbys (and learners) no longer assigned as either (or promoted): they stop and
/// checkpoint what they applied.
pub(super) fn no_longer_standing_by(standbys: Vec<TaskId>, standby: &[TaskId], learner: &[TaskId]) -> Vec<TaskId> {
    standbys
        .into_iter()
        .filter(|t| !standby.contains(t) && !learner.contains(t))
        .collect()
}

/// When the run of rejoins that an assignment is part of began: kept (or begun at
/// `assigned_at`) while assignments ask for a rejoin, over once one does not.
pub(super) fn round_began(began: Option<Instant>, rejoin: bool, assigned_at: Instant) -> Option<Instant> {
    if rejoin {
        Some(began.unwrap_or(assigned_at))
    } else {
        None
    }
}

/// Learners made active by an assignment, each with how far behind it was: the changelogs'
/// end less its position (unknown if either is).
pub(super) fn promoted(
    active: &[TaskId],
    learning: &[TaskId],
    ends: &HashMap<TaskId, i64>,
    positions: &HashMap<TaskId, i64>,
) -> Vec<(TaskId, Option<i64>)> {
    active
        .iter()
        .filter(|t| learning.contains(t))
        .map(|t| {
            (
                t.clone(),
                ends.get(t).zip(positions.get(t)).map(|(e, p)| (e - p).max(0)),
            )
        })
        .collect()
}

/// Asked to rejoin by an assignment of `generation`: how long to back off first. `rejoins`
/// holds the generation of the last such assignment and how many came in a row: the first
/// of a generation rejoins at once, each further one waits twice as long (20 ms to 640 ms),
/// since the rebalance waits for another member (finishing a revocation).
pub(super) fn rejoin_backoff(rejoins: &mut (i32, u32), generation: i32) -> Option<Duration> {
    if rejoins.0 == generation {
        rejoins.1 += 1;
        Some(Duration::from_millis(20 << rejoins.1.min(5)))
    } else {
        *rejoins = (generation, 0);
        None
    }
}

/// When the loop between rebalances wakes: for the next heartbeat or reaping, and for the
/// next learners' or standbys' check when there are any.
pub(super) fn wake_at(
    next_beat: Instant,
    next_reap: Instant,
    learner_check: Option<Instant>,
    standby_check: Option<Instant>,
) -> Instant {
    let mut wake = next_beat.min(next_reap);
    if let Some(at) = learner_check {
        wake = wake.min(at);
    }
    if let Some(at) = standby_check {
        wake = wake.min(at);
    }
    wake
}

/// Whether a drain that began at `leaving_since` has gone on for `limit` or longer by `now`.
pub(super) fn drain_over(leaving_since: Option<Instant>, limit: Option<Duration>, now: Instant) -> bool {
    let (Some(since), Some(limit)) = (leaving_since, limit) else {
        return false;
    };
    now.duration_since(since) >= limit
}

/// What an assignment says about the metadata version this member speaks (version probing:
/// see `group::metadata`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Speak {
    /// Go on in the version spoken.
    Keep,
    /// The leader could not read this member's metadata and answered in an older version
    /// (a leader of an older release): join again at once, speaking that.
    Fallback(u16),
    /// The group speaks an older version (a member of an older release joined): speak it
    /// from the next join on, so that any member may lead.
    Down(u16),
    /// Every member supports a newer version now: join again once, speaking it.
    Up(u16),
}

/// How `assignment` changes the version spoken (`speaking`, at most `supported`).
pub(super) fn speak_after(assignment: &Assignment, speaking: u16, supported: u16) -> Speak {
    let version = assignment.version.clamp(OLDEST_VERSION, supported);
    if assignment.error == AssignmentError::BadMetadata as i16 {
        return if version < speaking {
            Speak::Fallback(version)
        } else {
            Speak::Keep
        };
    }
    match version.cmp(&speaking) {
        std::cmp::Ordering::Greater => Speak::Up(version),
        std::cmp::Ordering::Less => Speak::Down(version),
        std::cmp::Ordering::Equal => Speak::Keep,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(partition: u32) -> TaskId {
        TaskId::new("t", partition)
    }

    #[test]
    fn an_assignment_stops_what_it_takes_away_and_starts_what_arrives() {
        let owned = vec![t(0), t(1), t(2)];
        let active = [t(1), t(3)];
        assert_eq!(arriving(&active, &owned), vec![t(3)]);
        assert_eq!(no_longer_active(owned, &active), vec![t(0), t(2)]);
        // A standby kept as a standby or as a learner stays; the others stop.
        let standbys = vec![t(4), t(5), t(6)];
        assert_eq!(no_longer_standing_by(standbys, &[t(4)], &[t(6)]), vec![t(5)]);
        // Learners are reported as learners, not standbys.
        assert_eq!(standing_by(vec![t(4), t(6)], &[t(6)]), vec![t(4)]);
    }

    #[test]
    fn a_promoted_learner_reports_its_lag_when_both_ends_are_known() {
        let ends = HashMap::from([(t(0), 100), (t(1), 50), (t(2), 10)]);
        let positions = HashMap::from([(t(0), 90), (t(2), 20)]);
        let promoted = promoted(&[t(0), t(1), t(2), t(3)], &[t(0), t(1), t(2)], &ends, &positions);
        assert_eq!(
            promoted,
            vec![(t(0), Some(10)), (t(1), None), (t(2), Some(0))],
            "t/3 was no learner; t/1's position is unknown; a position past the end is 0 behind"
        );
    }

    #[test]
    fn rejoins_in_one_generation_back_off_exponentially_up_to_640_ms() {
        let mut rejoins = (i32::MIN, 0);
        assert_eq!(
            rejoin_backoff(&mut rejoins, 7),
            None,
            "the first rejoin of a generation goes at once"
        );
        let waits: Vec<u64> = (0..7)
            .map(|_| rejoin_backoff(&mut rejoins, 7).unwrap().as_millis() as u64)
            .collect();
        assert_eq!(waits, vec![40, 80, 160, 320, 640, 640, 640]);
        assert_eq!(rejoin_backoff(&mut rejoins, 8), None, "a new generation starts over");
        assert_eq!(rejoin_backoff(&mut rejoins, 8), Some(Duration::from_millis(40)));
    }

    #[test]
    fn a_round_of_rejoins_is_timed_from_its_first_assignment() {
        let first = Instant::now();
        let later = first + Duration::from_secs(1);
        assert_eq!(round_began(None, true, first), Some(first));
        assert_eq!(round_began(Some(first), true, later), Some(first));
        assert_eq!(round_began(Some(first), false, later), None);
        assert_eq!(round_began(None, false, later), None);
    }

    #[test]
    fn the_loop_wakes_for_the_earliest_of_what_it_waits_for() {
        let now = Instant::now();
        let at = |ms: u64| now + Duration::from_millis(ms);
        assert_eq!(wake_at(at(300), at(100), None, None), at(100));
        assert_eq!(wake_at(at(300), at(100), Some(at(50)), None), at(50));
        assert_eq!(wake_at(at(300), at(100), Some(at(200)), Some(at(20))), at(20));
        assert_eq!(wake_at(at(10), at(100), Some(at(200)), Some(at(20))), at(10));
    }

    #[test]
    fn a_drain_runs_out_of_time_only_with_a_scale_down_timeout() {
        let since = Instant::now();
        let limit = Some(Duration::from_secs(30));
        assert!(
            !drain_over(None, limit, since + Duration::from_secs(60)),
            "not draining"
        );
        assert!(
            !drain_over(Some(since), None, since + Duration::from_secs(600)),
            "no timeout"
        );
        assert!(!drain_over(Some(since), limit, since + Duration::from_secs(29)));
        assert!(drain_over(Some(since), limit, since + Duration::from_secs(30)));
    }

    #[test]
    fn a_member_falls_back_when_refused_in_an_older_version_and_goes_up_once_all_support_more() {
        let a = |version, error: AssignmentError| Assignment {
            version,
            error: error as i16,
            ..Default::default()
        };
        // A leader of 0.2.0 cannot read version 5: it answers BadMetadata in version 4.
        assert_eq!(
            speak_after(&a(4, AssignmentError::BadMetadata), 5, 5),
            Speak::Fallback(4)
        );
        // Refused in the version spoken: not a version matter (the usual wait and rejoin).
        assert_eq!(speak_after(&a(4, AssignmentError::BadMetadata), 4, 5), Speak::Keep);
        // An older member joined: speak its version from the next join.
        assert_eq!(speak_after(&a(4, AssignmentError::None), 5, 5), Speak::Down(4));
        // Every member supports 5 now: up, once.
        assert_eq!(speak_after(&a(5, AssignmentError::None), 4, 5), Speak::Up(5));
        assert_eq!(speak_after(&a(5, AssignmentError::None), 5, 5), Speak::Keep);
        // Never above what this member supports (a test worker speaking 3), never below 1.
        assert_eq!(speak_after(&a(5, AssignmentError::None), 3, 3), Speak::Keep);
        assert_eq!(speak_after(&a(0, AssignmentError::None), 3, 3), Speak::Down(1));
    }
}
