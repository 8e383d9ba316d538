//! The word count run natively through the SDK's `TestDriver`, from `tests/` (the crate is
//! also an `rlib` for this): each word's count goes up by one per occurrence, across lines
//! and case, and the store holds the last count.

use sluice_guest::dsl::testing::TestDriver;

#[test]
fn every_occurrence_counts_once_across_lines_and_case() {
    let mut driver = TestDriver::new("dsl-word-count", dsl_word_count::topology).unwrap();
    driver.pipe("lines", (), "the cat and THE hat".to_string(), 1).unwrap();
    driver.pipe("lines", (), "The end".to_string(), 2).unwrap();
    let totals = driver.read::<String, Option<u64>>("totals").unwrap();
    let the: Vec<Option<u64>> = totals.iter().filter(|r| r.key == "the").map(|r| r.value).collect();
    assert_eq!(the, [Some(1), Some(2), Some(3)]);
    assert_eq!(totals.len(), 7, "one update per word read: {totals:?}");
}
