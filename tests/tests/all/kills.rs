//! Kill trials: a worker SIGKILLed at random moments of a word-count run while input flows,
//! restarted each time; the word count in Rust, and its twin in Python (the same store and
//! output, so the same truth). Under exactly-once every final count equals the truth (the
//! read-committed output and the stores); under at-least-once none is below it. CI runs a
//! short trial; `SLUICE_KILLS=20 cargo test kill_trials` runs the long one.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use sluice_tests::worker::shared_compile_cache;
use sluice_tests::{kafka, Scenario};

const PARTITIONS: i32 = 4;

fn lines(range: std::ops::Range<usize>) -> Vec<(Vec<u8>, Vec<u8>)> {
    range
        .map(|i| {
            let words: Vec<String> = (0..4).map(|j| format!("w{}", (i * 7 + j * 13) % 60)).collect();
            (format!("line-{i}").into_bytes(), words.join(" ").into_bytes())
        })
        .collect()
}

/// xorshift: random kill moments, reproducible from the printed seed.
fn next(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

async fn kill_trial(guarantee: &str, guest: &str) -> anyhow::Result<()> {
    let kills: usize = std::env::var("SLUICE_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let mut seed: u64 = std::env::var("SLUICE_KILL_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| std::process::id() as u64 * 2_654_435_761 + 1);
    eprintln!("kill trial ({guest}, {guarantee}): {kills} kills, seed {seed}");
    let wc = Scenario::builder("wc", guest)
        .source("lines", PARTITIONS)
        .sink("counts", PARTITIONS)
        .create()
        .await?;
    let cache = shared_compile_cache();
    let start = || {
        let mut args = vec![
            "--processing-guarantee",
            guarantee,
            "--commit-interval",
            "100ms",
            "--batch-size",
            "100",
        ];
        if guest.starts_with("python/") {
            args.extend(cache.iter().map(String::as_str));
        }
        wc.worker(&args)
    };
    let chunks = 20 + kills * 8;
    let total = chunks * 250;
    let producing = {
        let input = wc.input().to_string();
        tokio::spawn(async move {
            let mut positions = Vec::new();
            for chunk in 0..chunks {
                positions.extend(kafka().produce(&input, &lines(chunk * 250..(chunk + 1) * 250)).await?);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            anyhow::Ok(positions)
        })
    };
    let mut worker = start()?;
    for _ in 0..kills {
        let wait = 500 + next(&mut seed) % 1500;
        tokio::time::sleep(Duration::from_millis(wait)).await;
        worker.kill()?;
        worker = start()?;
    }
    let positions = producing.await??;
    if let Err(e) = wc.wait_committed(total, Duration::from_secs(180)).await {
        panic!("{e:#}; the last worker's log:\n{}", worker.log());
    }
    assert!(worker.terminate(Duration::from_secs(60))?.success(), "{}", worker.log());

    let mut truth: HashMap<i32, BTreeMap<String, u64>> = HashMap::new();
    for ((_, line), (p, _)) in lines(0..total).iter().zip(&positions) {
        for w in std::str::from_utf8(line)?.split(' ') {
            *truth.entry(*p).or_default().entry(w.to_string()).or_insert(0) += 1;
        }
    }
    let mut over: BTreeMap<u64, usize> = BTreeMap::new();
    for p in 0..PARTITIONS {
        let counts = wc.store_counts(p, "counts")?;
        for (word, n) in &truth[&p] {
            let got = counts.get(word).copied().unwrap_or(0);
            if guarantee == "exactly-once" {
                assert_eq!(
                    got, *n,
                    "partition {p}, {word}: exactly-once store differs from the truth"
                );
            } else {
                assert!(got >= *n, "partition {p}, {word}: {got} < {n}");
                *over.entry(got - n).or_default() += 1;
            }
        }
    }
    if guarantee == "exactly-once" {
        // Read-committed output: each word's counts 1..=n, each exactly once.
        let out = wc.read_all(Duration::from_secs(120))?;
        let mut per_word: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        for r in &out {
            let word = String::from_utf8(r.key.clone().unwrap())?;
            per_word
                .entry(word)
                .or_default()
                .push(std::str::from_utf8(r.value.as_ref().unwrap())?.parse()?);
        }
        for (word, mut counts) in per_word {
            counts.sort_unstable();
            let mut expected: Vec<u64> = truth
                .values()
                .flat_map(|c| 1..=c.get(&word).copied().unwrap_or(0))
                .collect();
            expected.sort_unstable();
            assert_eq!(
                counts, expected,
                "{word}: the committed output is not each count exactly once"
            );
        }
    } else {
        eprintln!("kill trial (at-least-once): over-count per (partition, word) -> how many: {over:?}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_trials_under_exactly_once_end_with_every_count_exact() -> anyhow::Result<()> {
    kill_trial("exactly-once", "word-count").await
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_trials_under_at_least_once_never_end_below_the_truth() -> anyhow::Result<()> {
    kill_trial("at-least-once", "word-count").await
}

#[tokio::test(flavor = "multi_thread")]
async fn python_kill_trials_under_exactly_once_end_with_every_count_exact() -> anyhow::Result<()> {
    kill_trial("exactly-once", "python/word-count").await
}

#[tokio::test(flavor = "multi_thread")]
async fn python_kill_trials_under_at_least_once_never_end_below_the_truth() -> anyhow::Result<()> {
    kill_trial("at-least-once", "python/word-count").await
}
