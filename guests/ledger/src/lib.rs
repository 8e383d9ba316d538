//! Test topology: keeps two stores in step and reads one back with a scan on every record,
//! so a test can tell whether state was applied twice, partly, or out of step.
//!
//! For each record with key `k`: `counts[k] += 1`, then `log["k/<n>"] = value` where `n`
//! is the new count, then a prefix scan of `log` for `k/` counts its entries and a scan of
//! all of `counts` sums them. It emits `k → "<count> <logged> <total>"` to `totals`; the
//! first two are equal unless the stores disagree. A record whose value is `fail` makes the call fail (after this batch's earlier
//! records wrote their state): the host must leave no trace of the failed batch.

use sluice_guest::{export, Context, Description, Error, Processor, Record, Store, TaskInfo};

struct Ledger {
    counts: Store<String, u64>,
    log: Store<String, String>,
}

impl Processor for Ledger {
    fn describe() -> Description {
        Description::new("ledger")
            .source("events")
            .sink("totals")
            .store("counts")
            .store("log")
    }

    fn init(_task: &TaskInfo) -> Result<Self, Error> {
        Ok(Ledger {
            counts: Store::open("counts")?,
            log: Store::open("log")?,
        })
    }

    fn process(&mut self, record: &Record<'_>, ctx: &mut Context) -> Result<(), Error> {
        let key: &str = record.key_as()?;
        let value: &str = record.value_as()?;
        if value == "fail" {
            return Err(Error::msg(format!("refusing the record at offset {}", record.offset())));
        }
        let count = self.counts.get(&key.to_string())?.unwrap_or(0) + 1;
        self.counts.put(&key.to_string(), &count)?;
        self.log.put(&format!("{key}/{count:010}"), &value.to_string())?;
        let mut logged = 0u64;
        for entry in self.log.prefix(&format!("{key}/"))? {
            entry?;
            logged += 1;
        }
        let mut total = 0u64;
        for entry in self.counts.range(None, None)? {
            total += entry?.1;
        }
        ctx.emit("totals", Some(key), &format!("{count} {logged} {total}"))?;
        Ok(())
    }
}

export!(Ledger);
