//! The record cache (Kafka Streams' `statestore.cache.max.bytes`): within one commit
//! interval — the host punctuates before each commit — an aggregation sends each key's
//! updates on once, the last one, from the value downstream saw last; with the cache at 0
//! bytes every update goes on at once. Driven here as the host drives a task: batches of
//! records, then a punctuation.

use sluice_guest::dsl::{DslTask, Emitter, MemoryStores, SourceRecord, StreamsBuilder, Topology};
use sluice_guest::{Decode, Error};

/// What a task emitted: sink, key, value, timestamp.
type Emitted = (String, Option<Vec<u8>>, Option<Vec<u8>>, i64);

#[derive(Default)]
struct Collect(Vec<Emitted>);

impl Emitter for Collect {
    fn emit(&mut self, sink: &str, key: Option<&[u8]>, value: Option<&[u8]>, ts: i64) -> Result<(), Error> {
        self.0
            .push((sink.to_string(), key.map(<[u8]>::to_vec), value.map(<[u8]>::to_vec), ts));
        Ok(())
    }
}

/// Words (already keyed by word) counted per word, the counts sent to `totals`.
fn counts(cache: Option<usize>) -> impl Fn(&mut StreamsBuilder) {
    move |b: &mut StreamsBuilder| {
        if let Some(bytes) = cache {
            b.cache_max_bytes(bytes);
        }
        b.stream::<String, String>("words")
            .group_by_key()
            .count("counts")
            .to_stream()
            .to("totals");
    }
}

fn task(cache: Option<usize>) -> DslTask {
    let topology = Topology::build("wc", counts(cache)).unwrap();
    topology.instantiate("wc", &mut MemoryStores::new()).unwrap()
}

/// 300 records of three words in three batches; what went to `totals` after each batch and
/// after the punctuation, as (word, count).
fn run(task: &mut DslTask) -> (Vec<usize>, Vec<(String, u64)>) {
    let mut out = Collect::default();
    let mut after_batches = Vec::new();
    for batch in 0..3 {
        task.batch_started().unwrap();
        for i in 0..100 {
            let n = batch * 100 + i;
            let word = ["apple", "pear", "fig"][n % 3];
            let record = SourceRecord {
                source: "words",
                partition: 0,
                offset: n as i64,
                key: Some(word.as_bytes()),
                value: Some(b"x"),
                timestamp: 1_000 + n as i64,
            };
            task.process(&record, &mut out).unwrap();
        }
        task.batch_done().unwrap();
        after_batches.push(out.0.len());
    }
    task.punctuate(1_300, &mut out).unwrap();
    let sent = out
        .0
        .iter()
        .map(|(sink, k, v, _)| {
            assert_eq!(sink, "totals");
            let word = String::from_utf8(k.clone().unwrap()).unwrap();
            (word, u64::decode(v.as_deref().unwrap()).unwrap())
        })
        .collect();
    (after_batches, sent)
}

#[test]
fn each_words_updates_go_on_once_per_commit_interval_with_the_cache() {
    let (after_batches, sent) = run(&mut task(None));
    assert_eq!(after_batches, [0, 0, 0], "nothing goes on before the punctuation");
    let mut sent = sent;
    sent.sort();
    assert_eq!(sent, [("apple".into(), 100), ("fig".into(), 100), ("pear".into(), 100)]);
}

#[test]
fn without_the_cache_every_update_goes_on() {
    let (after_batches, sent) = run(&mut task(Some(0)));
    assert_eq!(after_batches, [100, 200, 300]);
    assert_eq!(sent.len(), 300);
    assert_eq!(sent[299], ("fig".into(), 100));
}

#[test]
fn a_small_cache_sends_its_oldest_words_on_early_and_still_ends_right() {
    // Room for about two entries: every third update pushes the oldest word out.
    let (after_batches, sent) = run(&mut task(Some(200)));
    assert!(after_batches[2] > 0 && after_batches[2] < 300, "{after_batches:?}");
    let last: std::collections::BTreeMap<String, u64> = sent.into_iter().collect();
    assert_eq!(last.values().copied().collect::<Vec<_>>(), [100, 100, 100]);
}

#[test]
fn a_batch_that_failed_leaves_nothing_waiting() {
    let mut task = task(None);
    let mut out = Collect::default();
    task.batch_started().unwrap();
    let record = SourceRecord {
        source: "words",
        partition: 0,
        offset: 0,
        key: Some(b"apple"),
        value: Some(b"x"),
        timestamp: 1,
    };
    task.process(&record, &mut out).unwrap();
    // The batch fails after this record: no batch_done; the host drops its store writes
    // (here they stay in memory, but the cache must not send the update on).
    task.punctuate(1, &mut out).unwrap();
    assert!(out.0.is_empty(), "{:?}", out.0);
}
