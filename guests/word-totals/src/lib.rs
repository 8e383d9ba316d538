//! Example topology in two stages: a word count over every input partition.
//!
//! - `split` reads lines and emits each word (lower-cased, letters and digits), keyed by
//!   the word, to the internal topic `words`. The host creates it as
//!   `<topology>-words-repartition` with 8 partitions and puts each word where Java's
//!   default partitioner would, so all of a word's records reach one task of the next stage.
//! - `count` reads `words`, keeps a running count per word in the `counts` store and emits
//!   `word → count` on every update.
//!
//! The host runs `split` on as many tasks as `lines` has partitions, and `count` on 8.

use sluice_guest::{export, Context, Description, Error, Processor, Record, Store, Subtopology, TaskInfo};

enum WordTotals {
    Split,
    Count { counts: Store<String, u64> },
}

impl Processor for WordTotals {
    fn describe() -> Description {
        Description::new("word-totals")
            .source("lines")
            .sink("counts")
            .store("counts")
            // A source and a sink both: `split` writes it, `count` reads it.
            .internal_topic("words", Some(8))
            .subtopology(Subtopology::new("split").source("lines").sink("words"))
            .subtopology(Subtopology::new("count").source("words").sink("counts").store("counts"))
    }

    fn init(task: &TaskInfo) -> Result<Self, Error> {
        match task.subtopology.as_str() {
            "split" => Ok(WordTotals::Split),
            "count" => Ok(WordTotals::Count {
                counts: Store::open("counts")?,
            }),
            other => Err(Error::msg(format!("no sub-topology {other:?}"))),
        }
    }

    fn process(&mut self, record: &Record<'_>, ctx: &mut Context) -> Result<(), Error> {
        match self {
            WordTotals::Split => {
                let text: &str = record.value_as()?;
                for word in text.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()) {
                    ctx.emit("words", Some(word.to_lowercase().as_str()), "")?;
                }
            }
            WordTotals::Count { counts } => {
                let word: String = record.key_as::<&str>()?.to_string();
                let count = counts.get(&word)?.unwrap_or(0) + 1;
                counts.put(&word, &count)?;
                ctx.emit("counts", Some(word.as_str()), &count.to_string())?;
            }
        }
        Ok(())
    }
}

export!(WordTotals);
