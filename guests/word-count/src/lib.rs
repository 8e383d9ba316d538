//! Example topology: splits text into words (lower-cased, letters and digits) and keeps a
//! running count per word in the `counts` store; emits `word → count` on every update.
//!
//! Each task counts the words of its own input partition. For one count per word across
//! partitions, key the input so that a word's lines share a partition (or use one partition);
//! repartitioning inside a topology is not there yet.

use sluice_guest::{export, Context, Description, Error, Processor, Record, Store, TaskInfo};

struct WordCount {
    counts: Store<String, u64>,
}

impl Processor for WordCount {
    fn describe() -> Description {
        Description::new("word-count")
            .source("lines")
            .sink("counts")
            .store("counts")
    }

    fn init(_task: &TaskInfo) -> Result<Self, Error> {
        Ok(WordCount {
            counts: Store::open("counts")?,
        })
    }

    fn process(&mut self, record: &Record<'_>, ctx: &mut Context) -> Result<(), Error> {
        let text: &str = record.value_as()?;
        for word in text.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()) {
            let word = word.to_lowercase();
            let count = self.counts.get(&word)?.unwrap_or(0) + 1;
            self.counts.put(&word, &count)?;
            ctx.emit("counts", Some(word.as_str()), &count.to_string())?;
        }
        Ok(())
    }
}

export!(WordCount);
