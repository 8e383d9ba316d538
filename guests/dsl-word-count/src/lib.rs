//! Example topology written with the stream DSL: a true word count. Lines (keys ignored)
//! are split into lower-case words, regrouped by word through the repartition topic
//! `words`, and counted in the store `counts` (word → count, 8 bytes big-endian); every
//! new count goes to `totals` keyed by its word. It compiles to the same two sub-topologies
//! as `guests/word-totals`, written by hand with the Processor API.

use sluice_guest::dsl::StreamsBuilder;

/// The topology (public, so that `tests/` can run it through a `TestDriver`).
pub fn topology(b: &mut StreamsBuilder) {
    b.stream::<(), String>("lines")
        .flat_map_values(|line| line.split_whitespace().map(str::to_lowercase).collect::<Vec<_>>())
        .group_by(|_, word| word.clone())
        .named("words")
        .count("counts")
        .to_stream()
        .to("totals");
}

sluice_guest::export_dsl!("dsl-word-count", topology);

#[cfg(test)]
mod tests {
    use sluice_guest::dsl::testing::TestDriver;

    #[test]
    fn counts_words_across_lines() {
        let mut driver = TestDriver::new("dsl-word-count", super::topology).unwrap();
        driver.pipe("lines", (), "To be or not to be".to_string(), 1).unwrap();
        let totals = driver.read::<String, Option<u64>>("totals").unwrap();
        let last = totals.last().unwrap();
        assert_eq!((last.key.as_str(), last.value), ("be", Some(2)));
    }
}
