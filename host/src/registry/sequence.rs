//! Which signed registry records are current. A signature says a worker of the cluster
//! wrote a record, not when: on a Kafka without ACLs a tenant could write an old signed
//! record back (a tenant with a token that was rotated out, a topology's tombstone) and undo
//! a change. So every record a worker writes carries a sequence, signed with it: the
//! microseconds of its writer's clock, above anything its writer had read. A reader believes
//! a topology or tenant record only if its sequence is above the last one it believed for
//! that key, and not far below the highest it has read of any key (a record written back
//! after others were written is old). Chunks are addressed by their content's digest, so an
//! old one says nothing new and is not judged.

use std::collections::HashMap;
use std::time::{SystemTime, UNIX_EPOCH};

/// The header a record's sequence travels in (decimal).
pub const SEQUENCE_HEADER: &str = "sluice.sequence";

/// How far below the highest sequence read a record may be and still be believed: two
/// workers' clocks differ by less, and a write that raced another's is not older than this.
pub const STALE_AFTER_MICROS: i64 = 60_000_000;

/// What a reader has believed.
#[derive(Debug, Default)]
pub struct Sequences {
    /// The sequence of the last record believed for each topology and tenant key
    /// (tombstones too: a deleted key stays deleted).
    last: HashMap<String, i64>,
    /// The highest sequence read of any record.
    highest: i64,
}

/// Why a record is not believed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stale {
    /// A record of its key with this sequence or a higher one was believed already.
    Superseded { last: i64 },
    /// Written back long after: records with sequences up to this one were read before it.
    Old { highest: i64 },
}

impl std::fmt::Display for Stale {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stale::Superseded { last } => write!(f, "a newer record of its key was read already (sequence {last})"),
            Stale::Old { highest } => write!(
                f,
                "it is more than {}s older than records read before it (sequence {highest}): an old record written back",
                STALE_AFTER_MICROS / 1_000_000
            ),
        }
    }
}

impl Sequences {
    /// Whether the record of `key` with `sequence` (0: written before sequences, unsigned
    /// by them) is current; if so, it is remembered as the key's last.
    pub fn judge(&mut self, key: &str, sequence: i64) -> Result<(), Stale> {
        if let Some(&last) = self.last.get(key) {
            // Records from before sequences (0) follow each other in the order written.
            if sequence <= last && !(sequence == 0 && last == 0) {
                return Err(Stale::Superseded { last });
            }
        }
        if sequence < self.highest.saturating_sub(STALE_AFTER_MICROS) {
            return Err(Stale::Old { highest: self.highest });
        }
        self.last.insert(key.to_string(), sequence);
        self.highest = self.highest.max(sequence);
        Ok(())
    }

    /// A record judged not by sequence (a chunk) still moves the highest sequence read.
    pub fn saw(&mut self, sequence: i64) {
        self.highest = self.highest.max(sequence);
    }

    /// The highest sequence read.
    pub fn highest(&self) -> i64 {
        self.highest
    }
}

/// The sequence of a record written now: this clock's microseconds, above every sequence
/// read (`highest_read`) and every one given before (`last_given`).
pub fn next(highest_read: i64, last_given: i64) -> i64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64);
    now.max(highest_read + 1).max(last_given + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_written_back_is_not_believed() {
        let mut s = Sequences::default();
        let t0 = 1_700_000_000_000_000;
        // A tenant with token A, then the same tenant with token B (A rotated out).
        assert_eq!(s.judge("n/acme", t0), Ok(()));
        assert_eq!(s.judge("n/acme", t0 + 5_000_000), Ok(()));
        // The first record written back right after: its key has a newer one.
        assert_eq!(s.judge("n/acme", t0), Err(Stale::Superseded { last: t0 + 5_000_000 }));
        // A topology deleted (its tombstone) and uploaded again; the old tombstone written
        // back does not delete the new upload.
        assert_eq!(s.judge("t/orders", t0 + 10_000_000), Ok(()));
        assert_eq!(s.judge("t/orders", t0 + 20_000_000), Ok(()));
        assert_eq!(s.judge("t/orders", t0 + 30_000_000), Ok(()));
        assert!(s.judge("t/orders", t0 + 20_000_000).is_err());
    }

    #[test]
    fn a_key_seen_first_is_judged_by_the_highest_sequence_read() {
        // After compaction a worker may read an old record of a key whose newer records
        // are gone (the old one, written back later, shadowed them).
        let mut s = Sequences::default();
        let t0 = 1_700_000_000_000_000;
        assert_eq!(s.judge("t/a", t0 + 600_000_000), Ok(()));
        assert_eq!(
            s.judge("n/acme", t0),
            Err(Stale::Old {
                highest: t0 + 600_000_000
            })
        );
        // Within the clocks' tolerance a record is believed (two workers writing at once).
        assert_eq!(s.judge("n/bravo", t0 + 600_000_000 - STALE_AFTER_MICROS), Ok(()));
        // Records from before sequences, read before any sequenced one, are believed in
        // the order they were written; once a sequenced one was read, none is.
        let mut fresh = Sequences::default();
        assert_eq!(fresh.judge("t/legacy", 0), Ok(()));
        assert_eq!(
            fresh.judge("t/legacy", 0),
            Ok(()),
            "an upgrade written before sequences"
        );
        assert_eq!(fresh.judge("t/legacy", t0), Ok(()));
        assert!(fresh.judge("t/legacy", 0).is_err());
        assert!(fresh.judge("t/other", 0).is_err(), "written back after sequences began");
    }

    #[test]
    fn the_next_sequence_is_above_everything_read_and_given() {
        let far = i64::MAX / 4;
        assert_eq!(next(far, 0), far + 1);
        assert_eq!(next(0, far), far + 1);
        let now = next(0, 0);
        assert!(now > 1_600_000_000_000_000, "microseconds of the clock: {now}");
    }
}
