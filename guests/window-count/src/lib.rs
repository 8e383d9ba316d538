//! Example topology: counts records per key in tumbling windows of 10 seconds of stream
//! time. A window's count is emitted once, when stream time passes the window's end
//! (`key → "<window start ms> <count>"`), and then forgotten. A record that arrives for a
//! window already emitted starts a late count that the next punctuation emits.

use sluice_guest::{export, Context, Description, Error, Processor, Record, Store, TaskInfo};

const WINDOW_MS: i64 = 10_000;

struct WindowCount {
    /// Key: window start (8 bytes, big-endian) followed by the record key; value: count.
    windows: Store<Vec<u8>, u64>,
}

fn window_key(start: i64, key: &[u8]) -> Vec<u8> {
    let mut k = (start as u64).to_be_bytes().to_vec();
    k.extend_from_slice(key);
    k
}

impl Processor for WindowCount {
    fn describe() -> Description {
        Description::new("window-count")
            .source("events")
            .sink("windows")
            .store("windows")
    }

    fn init(_task: &TaskInfo) -> Result<Self, Error> {
        Ok(WindowCount {
            windows: Store::open("windows")?,
        })
    }

    fn process(&mut self, record: &Record<'_>, _ctx: &mut Context) -> Result<(), Error> {
        let ts = record.timestamp().max(0);
        let key = window_key(ts - ts % WINDOW_MS, record.key().unwrap_or_default());
        let count = self.windows.get(&key)?.unwrap_or(0) + 1;
        self.windows.put(&key, &count)
    }

    fn punctuate(&mut self, stream_time_ms: i64, ctx: &mut Context) -> Result<(), Error> {
        // Windows that end at or before the stream time are closed: start + size <= time.
        let first_open = stream_time_ms.saturating_sub(WINDOW_MS - 1);
        if first_open <= 0 {
            return Ok(());
        }
        let bound = (first_open as u64).to_be_bytes().to_vec();
        let closed: Vec<(Vec<u8>, u64)> = self.windows.range(None, Some(&bound))?.collect::<Result<_, _>>()?;
        for (key, count) in &closed {
            let start = u64::from_be_bytes(key[..8].try_into().expect("8-byte window start"));
            ctx.emit_raw(
                "windows",
                Some(&key[8..]),
                Some(format!("{start} {count}").as_bytes()),
                None,
                &[],
            )?;
        }
        self.windows.write_batch(closed.iter().map(|(k, _)| (k, None)))
    }
}

export!(WindowCount);
