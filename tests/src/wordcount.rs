//! The word count's input and its truth, for the tests that run the example `word-count`
//! (kills, upgrades): lines of four words out of 60, counted per input partition (the guest
//! counts the words of its own partition; its output is word → count).

use std::collections::BTreeMap;

use anyhow::Result;

use crate::Received;

/// Lines `range` of the input: key `line-<i>`, four words out of 60.
pub fn lines(range: std::ops::Range<usize>) -> Vec<(Vec<u8>, Vec<u8>)> {
    range
        .map(|i| {
            let words: Vec<String> = (0..4).map(|j| format!("w{}", (i * 7 + j * 13) % 60)).collect();
            (format!("line-{i}").into_bytes(), words.join(" ").into_bytes())
        })
        .collect()
}

/// Input partition → word → how often lines `0..total` put it there (`positions`: where
/// each line went, in order, as `Kafka::produce` returns them).
pub fn truth(total: usize, positions: &[(i32, i64)]) -> Result<BTreeMap<i32, BTreeMap<String, u64>>> {
    let mut truth: BTreeMap<i32, BTreeMap<String, u64>> = BTreeMap::new();
    for ((_, line), (p, _)) in lines(0..total).iter().zip(positions) {
        for w in std::str::from_utf8(line)?.split(' ') {
            *truth.entry(*p).or_default().entry(w.to_string()).or_insert(0) += 1;
        }
    }
    Ok(truth)
}

/// Word → the counts the output holds for it, sorted.
pub fn counts_per_word(out: &[Received]) -> Result<BTreeMap<String, Vec<u64>>> {
    let mut per_word: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for r in out {
        let word = String::from_utf8(r.key.clone().unwrap_or_default())?;
        let count = std::str::from_utf8(r.value.as_deref().unwrap_or_default())?.parse()?;
        per_word.entry(word).or_default().push(count);
    }
    for counts in per_word.values_mut() {
        counts.sort_unstable();
    }
    Ok(per_word)
}

/// The counts an exactly-once run outputs for `word`: 1 to its count in each partition,
/// sorted.
pub fn expected_counts(truth: &BTreeMap<i32, BTreeMap<String, u64>>, word: &str) -> Vec<u64> {
    let mut expected: Vec<u64> = truth
        .values()
        .flat_map(|c| 1..=c.get(word).copied().unwrap_or(0))
        .collect();
    expected.sort_unstable();
    expected
}
