//! Stream-stream joins within a time window (inner, left, outer), as Kafka Streams 4.x
//! has them: a record of one side joins every record of the other side with the same key
//! whose time is within the window and that the other side still keeps; with a left or
//! outer join, a record that found no partner goes out alone (`None` for the other side)
//! once its window has passed.
//!
//! With a window of `before` and `after` (a left record at `t` joins right records in
//! `[t - before, t + after]`; a right record at `t` left records in `[t - after,
//! t + before]`) and a grace period, each side has a stream time (the largest timestamp of
//! its records, kept in its store under the empty key, so it survives restarts) and the
//! join's, `T`, is the larger of the two. Kafka Streams' rules, record by record:
//!
//! - a side keeps its records for `before + after + grace` (the retention) of its own
//!   stream time: a record at `t` is found by the other side while `t > S - retention`;
//!   there is no other lateness check, so an out-of-order record joins whatever the other
//!   side still keeps;
//! - a record that found no partner goes out alone at once if the part of its window ahead
//!   of it has passed (`t + after < T` for a left record, `t + before < T` for a right one);
//!   otherwise it waits, and goes out alone when a record moves `T` past that and the grace
//!   period, unless a partner came first. A partner that comes later still joins it, so a
//!   record can go out alone and joined both (Kafka Streams does the same).
//!
//! Each side's records are kept in a store keyed by `(segment, key, time, id)` (a segment
//! is a span of time, so expiring is a range deletion of the oldest segments, at
//! punctuation, and a lookup scans the few segments the window covers); unmatched records
//! wait in `<join>_outer`, keyed by `(time, side, key, id)`, so emitting them is a range
//! scan. The id is the input record's (source, offset, n-th record it made): processing
//! the same input again after a failure writes the same entries.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use super::builder::{decode, encode, join_input};
use super::data::{pop_ordered, push_ordered, Data};
use super::graph::{Build, GraphNode};
use super::runtime::{built, BuildCx, Cx, Downstream, Node, NodeRef, Punctuate, Rec};
use super::state::KeyValueStore;
use super::stream::{add_fn_node, KStream};
use super::windows::{millis, StreamTime};
use crate::Error;

/// The window of a stream-stream join: a left record at `t` joins right records in
/// `[t - before, t + after]`, both ends included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JoinWindows {
    pub(crate) before: i64,
    pub(crate) after: i64,
    pub(crate) grace: i64,
}

impl JoinWindows {
    /// Records at most `difference` apart join, with no grace period (Kafka Streams'
    /// `JoinWindows.ofTimeDifferenceWithNoGrace`).
    pub fn of(difference: Duration) -> Self {
        let d = millis(difference);
        JoinWindows {
            before: d,
            after: d,
            grace: 0,
        }
    }

    /// How far before a left record a right record may be.
    pub fn before(mut self, before: Duration) -> Self {
        self.before = millis(before);
        self
    }

    /// How far after a left record a right record may be.
    pub fn after(mut self, after: Duration) -> Self {
        self.after = millis(after);
        self
    }

    /// How long out-of-order records are still taken after their window has passed.
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = millis(grace);
        self
    }

    /// How long a record is kept: the window and the grace period.
    fn retention(&self) -> i64 {
        self.before.saturating_add(self.after).saturating_add(self.grace)
    }
}

/// A record of either side, on its way into the join.
#[derive(Debug, Clone)]
enum Side<A, B> {
    This(A),
    Other(B),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Inner,
    Left,
    Outer,
}

impl<K: Data, V: Data> KStream<K, V> {
    /// Each record joined with every record of `other` with the same key within `windows`
    /// (Kafka Streams' `KStream.join(KStream, …, JoinWindows)`). After a key change a side
    /// is repartitioned first.
    pub fn join_stream<V2: Data, VR: Data>(
        &self,
        other: &KStream<K, V2>,
        mut joiner: impl FnMut(&V, &V2) -> VR + 'static,
        windows: JoinWindows,
    ) -> KStream<K, VR> {
        self.join_streams(other, Kind::Inner, windows, move |a, b| Some(joiner(a?, b?)))
    }

    /// As [`KStream::join_stream`], and each record of this stream that joins nothing goes
    /// out with `None` once its window and grace period have passed.
    pub fn left_join_stream<V2: Data, VR: Data>(
        &self,
        other: &KStream<K, V2>,
        mut joiner: impl FnMut(&V, Option<&V2>) -> VR + 'static,
        windows: JoinWindows,
    ) -> KStream<K, VR> {
        self.join_streams(other, Kind::Left, windows, move |a, b| Some(joiner(a?, b)))
    }

    /// As [`KStream::left_join_stream`], for the records of both streams.
    pub fn outer_join_stream<V2: Data, VR: Data>(
        &self,
        other: &KStream<K, V2>,
        mut joiner: impl FnMut(Option<&V>, Option<&V2>) -> VR + 'static,
        windows: JoinWindows,
    ) -> KStream<K, VR> {
        self.join_streams(other, Kind::Outer, windows, move |a, b| Some(joiner(a, b)))
    }

    fn join_streams<V2: Data, VR: Data>(
        &self,
        other: &KStream<K, V2>,
        kind: Kind,
        windows: JoinWindows,
        joiner: impl FnMut(Option<&V>, Option<&V2>) -> Option<VR> + 'static,
    ) -> KStream<K, VR> {
        let op = match kind {
            Kind::Inner => "join_stream",
            Kind::Left => "left_join_stream",
            Kind::Outer => "outer_join_stream",
        };
        let base = self.graph.borrow().next_name(op);
        if windows.before < 0 || windows.after < 0 || windows.grace < 0 {
            self.graph.borrow_mut().error(format!(
                "join windows of {op}: before, after and grace must not be negative"
            ));
        }
        let this = join_input(self, &format!("{base}_left"));
        let that = join_input(other, &format!("{base}_right"));
        let this_side = add_fn_node(
            &self.graph,
            vec![this.node],
            &format!("{op}_this"),
            |rec: Rec<K, V>, down: &Downstream<K, Side<V, V2>>, cx: &mut Cx<'_>| {
                down.forward(
                    Rec {
                        key: rec.key,
                        value: Side::This(rec.value),
                        ts: rec.ts,
                    },
                    cx,
                )
            },
        );
        let other_side = add_fn_node(
            &self.graph,
            vec![that.node],
            &format!("{op}_other"),
            |rec: Rec<K, V2>, down: &Downstream<K, Side<V, V2>>, cx: &mut Cx<'_>| {
                down.forward(
                    Rec {
                        key: rec.key,
                        value: Side::Other(rec.value),
                        ts: rec.ts,
                    },
                    cx,
                )
            },
        );
        let stores = [format!("{base}_this"), format!("{base}_other"), format!("{base}_outer")];
        let mut g = self.graph.borrow_mut();
        let name = g.next_name(op);
        let build = {
            let (name, stores) = (name.clone(), stores.clone());
            Build::Node(Box::new(
                move |cx: &mut BuildCx<'_>, children: &[Rc<dyn std::any::Any>]| {
                    let this_store = cx.store(&stores[0])?;
                    let outer = if kind == Kind::Inner {
                        None
                    } else {
                        Some(cx.store(&stores[2])?)
                    };
                    let other_store = cx.store(&stores[1])?;
                    let min_time = MinTime::load(&name, outer_ref(&outer))?;
                    let node = Rc::new(RefCell::new(StreamStreamJoin {
                        times: [
                            StreamTime::load(&name, &*this_store)?,
                            StreamTime::load(&name, &*other_store)?,
                        ],
                        down: Downstream::<K, VR>::from_built(&name, children)?,
                        stores: [this_store, other_store],
                        outer,
                        windows,
                        kind,
                        joiner,
                        segment: (windows.retention() / 2).max(1),
                        expired_below: i64::MIN,
                        min_time,
                        bufs: Default::default(),
                        name,
                        _types: std::marker::PhantomData,
                    }));
                    cx.punctuate(node.clone());
                    let node: NodeRef<K, Side<V, V2>> = node;
                    Ok(built(node))
                },
            ))
        };
        let mut node = GraphNode::new(name, vec![this_side, other_side], build);
        let kept = if kind == Kind::Inner { 2 } else { 3 };
        node.stores = stores[..kept].to_vec();
        let id = g.add(node);
        KStream::new(self.graph.clone(), id, false)
    }
}

struct StreamStreamJoin<K, V, V2, VR, F> {
    name: String,
    /// The records of this side and of the other side.
    stores: [Rc<dyn KeyValueStore>; 2],
    /// Unmatched records waiting for their window to pass (left and outer joins).
    outer: Option<Rc<dyn KeyValueStore>>,
    windows: JoinWindows,
    kind: Kind,
    joiner: F,
    down: Downstream<K, VR>,
    /// Each side's stream time (the largest timestamp of its records), kept in its store
    /// under the empty key; the join's is the larger of the two.
    times: [StreamTime; 2],
    /// Milliseconds per segment of the window stores.
    segment: i64,
    /// The join's stream time at the last punctuation (nothing to expire if unchanged).
    expired_below: i64,
    /// Kafka Streams' `minTime` of the unmatched records (see [`MinTime`]).
    min_time: MinTime,
    bufs: [Vec<u8>; 4],
    _types: std::marker::PhantomData<fn(V, V2)>,
}

/// Side numbers in keys: this side 0, the other side 1.
const THIS: u8 = 0;
const OTHER: u8 = 1;

type Id = (u32, i64, u32);

fn push_id(out: &mut Vec<u8>, id: Id) {
    push_ordered(out, &id.0);
    push_ordered(out, &id.1);
    push_ordered(out, &id.2);
}

impl<K, V, V2, VR, F> StreamStreamJoin<K, V, V2, VR, F>
where
    K: Data,
    V: Data,
    V2: Data,
    VR: Data,
    F: FnMut(Option<&V>, Option<&V2>) -> Option<VR>,
{
    fn window_key(&self, out: &mut Vec<u8>, key: &[u8], ts: i64, id: Id) {
        out.clear();
        push_ordered(out, &ts.div_euclid(self.segment));
        push_ordered(out, key);
        push_ordered(out, &ts);
        push_id(out, id);
    }

    /// An unmatched record's key in the outer store: (time, side, key), as Kafka Streams
    /// keys it (a right record before a left one at the same time; one entry per time, side
    /// and key: a second such record replaces the first, as in Kafka Streams).
    fn outer_key(out: &mut Vec<u8>, ts: i64, side: u8, key: &[u8]) {
        out.clear();
        push_ordered(out, &ts);
        push_ordered(out, &if side == THIS { OUTER_LEFT } else { OUTER_RIGHT });
        push_ordered(out, key);
    }

    /// The other side's records of `key` with times in `[from, to]`: (time, id, value).
    fn partners(&self, side: u8, key: &[u8], from: i64, to: i64) -> Result<Vec<(i64, Id, Vec<u8>)>, Error> {
        let store = &self.stores[usize::from(1 - side)];
        let mut found = Vec::new();
        if from > to {
            return Ok(found); // the other side keeps nothing this far back
        }
        let (mut lower, mut upper) = (Vec::new(), Vec::new());
        for segment in from.div_euclid(self.segment)..=to.div_euclid(self.segment) {
            lower.clear();
            push_ordered(&mut lower, &segment);
            push_ordered(&mut lower, key);
            upper.clone_from(&lower);
            push_ordered(&mut lower, &from);
            // Every entry at `to` is (…, to, 16 bytes of id): below (…, to, 17 × 0xFF).
            push_ordered(&mut upper, &to);
            upper.extend_from_slice(&[0xFF; 17]);
            for entry in store.range(Some(&lower), Some(&upper))? {
                let (raw_key, value) = entry?;
                let mut rest = &raw_key[..];
                let parsed = (|| {
                    let _segment: i64 = pop_ordered(&mut rest)?;
                    let _key: Vec<u8> = pop_ordered(&mut rest)?;
                    let ts: i64 = pop_ordered(&mut rest)?;
                    let id: Id = (
                        pop_ordered(&mut rest)?,
                        pop_ordered(&mut rest)?,
                        pop_ordered(&mut rest)?,
                    );
                    Ok::<_, crate::CodecError>((ts, id))
                })();
                let (ts, id) = parsed.map_err(|e| {
                    Error::msg(format!(
                        "operator {}: a key in store {:?}: {e}",
                        self.name,
                        store.name()
                    ))
                })?;
                found.push((ts, id, value));
            }
        }
        Ok(found)
    }

    fn joined(&mut self, side: u8, mine: &[u8], theirs: &[u8]) -> Result<Option<VR>, Error> {
        let (this, other) = if side == THIS { (mine, theirs) } else { (theirs, mine) };
        let this = decode::<V>(&self.name, "left value", Some(this))?;
        let other = decode::<V2>(&self.name, "right value", Some(other))?;
        Ok((self.joiner)(Some(&this), Some(&other)))
    }

    fn keeps_unmatched(&self, side: u8) -> bool {
        match self.kind {
            Kind::Inner => false,
            Kind::Left => side == THIS,
            Kind::Outer => true,
        }
    }

    fn add(&mut self, key: K, side: u8, value: Vec<u8>, ts: i64, cx: &mut Cx<'_>) -> Result<(), Error> {
        let mut raw_key = std::mem::take(&mut self.bufs[0]);
        let result = self.add_keyed(key, &mut raw_key, side, value, ts, cx);
        self.bufs[0] = raw_key;
        result
    }

    fn add_keyed(
        &mut self,
        key: K,
        raw_key: &mut Vec<u8>,
        side: u8,
        value: Vec<u8>,
        ts: i64,
        cx: &mut Cx<'_>,
    ) -> Result<(), Error> {
        if encode(&self.name, "key", &key, raw_key)?.is_none() {
            return Ok(()); // null keys are dropped
        }
        let w = self.windows;
        // A left record at t joins right records in [t - before, t + after]; a right record
        // at t joins left records in [t - after, t + before].
        let (reach_back, reach_ahead) = if side == THIS {
            (w.before, w.after)
        } else {
            (w.after, w.before)
        };
        let advanced = ts >= self.now();
        self.times[usize::from(side)].observe(ts);
        let now = self.now();
        if advanced {
            // Only a record that moves stream time closes windows (Kafka Streams).
            self.emit_closed(now, side, cx)?;
        }
        let id = cx.next_id();
        let mut entry_key = std::mem::take(&mut self.bufs[1]);
        self.window_key(&mut entry_key, raw_key, ts, id);
        self.stores[usize::from(side)].put(&entry_key, &value)?;
        self.bufs[1] = entry_key;
        // The other side's records the store still keeps: those within the retention of
        // that side's stream time (Kafka Streams' window store hides older ones).
        let kept_from = self.times[usize::from(1 - side)]
            .now
            .saturating_sub(w.retention())
            .saturating_add(1);
        let partners = self.partners(
            side,
            raw_key,
            ts.saturating_sub(reach_back).max(kept_from),
            ts.saturating_add(reach_ahead),
        )?;
        for (their_ts, _their_id, theirs) in &partners {
            // The partner may be waiting alone: it is matched now.
            if self.keeps_unmatched(1 - side) {
                if let Some(outer) = &self.outer {
                    let mut k = std::mem::take(&mut self.bufs[2]);
                    Self::outer_key(&mut k, *their_ts, 1 - side, raw_key);
                    if outer.get(&k)?.is_some() {
                        outer.delete(&k)?;
                    }
                    self.bufs[2] = k;
                }
            }
            if let Some(value) = self.joined(side, &value, theirs)? {
                let rec = Rec {
                    key: key.clone(),
                    value,
                    ts: ts.max(*their_ts),
                };
                self.down.forward(rec, cx)?;
            }
        }
        if partners.is_empty() && self.keeps_unmatched(side) {
            if ts.saturating_add(reach_ahead) < now {
                // Its window has passed already: alone at once (Kafka Streams).
                self.forward_alone(key, side, &value, ts, cx)?;
            } else if let Some(outer) = &self.outer {
                let mut k = std::mem::take(&mut self.bufs[2]);
                Self::outer_key(&mut k, ts, side, raw_key);
                self.min_time.now = self.min_time.now.min(ts);
                outer.put(&k, &value)?;
                self.bufs[2] = k;
            }
        }
        Ok(())
    }

    /// The join's stream time: the largest timestamp of either side.
    fn now(&self) -> i64 {
        self.times[0].now.max(self.times[1].now)
    }

    /// How long after its time a record of `side` may still find a partner: the part of the
    /// window ahead of it.
    fn reach_ahead(&self, side: u8) -> i64 {
        if side == THIS {
            self.windows.after
        } else {
            self.windows.before
        }
    }

    fn forward_alone(&mut self, key: K, side: u8, value: &[u8], ts: i64, cx: &mut Cx<'_>) -> Result<(), Error> {
        let value = if side == THIS {
            let v = decode::<V>(&self.name, "left value", Some(value))?;
            (self.joiner)(Some(&v), None)
        } else {
            let v = decode::<V2>(&self.name, "right value", Some(value))?;
            (self.joiner)(None, Some(&v))
        };
        match value {
            Some(value) => self.down.forward(Rec { key, value, ts }, cx),
            None => Ok(()),
        }
    }

    /// Sends the unmatched records whose window and grace period have passed at stream
    /// time `now` (a record of `side` at `t` once `t + reach_ahead(side) + grace < now`), as
    /// Kafka Streams' `emitNonJoinedOuterRecords` does when a record of `side` moves stream
    /// time: nothing if its `minTime` says nothing can have passed; otherwise the unmatched
    /// records in (time, side, key) order until one of each side is still waiting.
    fn emit_closed(&mut self, now: i64, side: u8, cx: &mut Cx<'_>) -> Result<(), Error> {
        let Some(outer) = self.outer.clone() else {
            return Ok(());
        };
        let grace = self.windows.grace;
        let min = self.min_time.now;
        if min != i64::MAX && min.saturating_add(self.reach_ahead(side)).saturating_add(grace) >= now {
            return Ok(());
        }
        self.min_time.now = i64::MAX;
        let (mut left_open, mut right_open) = (false, false);
        let mut lower = Vec::new();
        push_ordered(&mut lower, &i64::MIN);
        let mut sent = Vec::new();
        for entry in outer.range(Some(&lower), None)? {
            let (raw, value) = entry?;
            let mut rest = &raw[..];
            let parsed = (|| {
                let ts: i64 = pop_ordered(&mut rest)?;
                let side: u8 = pop_ordered(&mut rest)?;
                let key: Vec<u8> = pop_ordered(&mut rest)?;
                Ok::<_, crate::CodecError>((ts, side, key))
            })();
            let (ts, stored_side, key) = parsed.map_err(|e| {
                Error::msg(format!(
                    "operator {}: a key in store {:?}: {e}",
                    self.name,
                    outer.name()
                ))
            })?;
            let side = match stored_side {
                OUTER_LEFT | THIS => THIS, // (0 and 1: as an SDK before 0.2 kept them)
                _ => OTHER,
            };
            self.min_time.now = ts;
            if left_open && right_open {
                break;
            }
            if ts.saturating_add(self.reach_ahead(side)).saturating_add(grace) >= now {
                // Still waiting; later ones of its side too.
                if side == THIS {
                    left_open = true;
                } else {
                    right_open = true;
                }
                continue;
            }
            let key = decode::<K>(&self.name, "key of an unmatched record", Some(&key))?;
            self.forward_alone(key, side, &value, ts, cx)?;
            sent.push(raw);
        }
        if !sent.is_empty() {
            let deletions: Vec<(Vec<u8>, Option<Vec<u8>>)> = sent.into_iter().map(|k| (k, None)).collect();
            outer.write_batch(&deletions)?;
        }
        Ok(())
    }
}

impl<K, V, V2, VR, F> Node<K, Side<V, V2>> for StreamStreamJoin<K, V, V2, VR, F>
where
    K: Data,
    V: Data,
    V2: Data,
    VR: Data,
    F: FnMut(Option<&V>, Option<&V2>) -> Option<VR>,
{
    fn process(&mut self, rec: Rec<K, Side<V, V2>>, cx: &mut Cx<'_>) -> Result<(), Error> {
        if rec.key.is_null() {
            return Ok(());
        }
        // Stored as bytes: the value goes into the side's store, and is decoded again for
        // each partner it joins (a joiner takes references).
        let mut buf = std::mem::take(&mut self.bufs[3]);
        let (side, encoded) = match &rec.value {
            Side::This(v) => (THIS, encode(&self.name, "value", v, &mut buf)?.is_some()),
            Side::Other(v) => (OTHER, encode(&self.name, "value", v, &mut buf)?.is_some()),
        };
        if !encoded {
            self.bufs[3] = buf;
            return Ok(()); // a null value joins nothing
        }
        let value = buf.clone();
        self.bufs[3] = buf;
        self.add(rec.key, side, value, rec.ts, cx)
    }
}

impl<K, V, V2, VR, F> Punctuate for StreamStreamJoin<K, V, V2, VR, F>
where
    K: Data,
    V: Data,
    V2: Data,
    VR: Data,
    F: FnMut(Option<&V>, Option<&V2>) -> Option<VR>,
{
    fn batch_started(&mut self) -> Result<(), Error> {
        for side in [THIS, OTHER] {
            let store = &*self.stores[usize::from(side)];
            self.times[usize::from(side)] = StreamTime::load(&self.name, store)?;
        }
        self.min_time = MinTime::load(&self.name, outer_ref(&self.outer))?;
        Ok(())
    }

    fn batch_done(&mut self) -> Result<(), Error> {
        self.save_times()
    }

    fn punctuate(&mut self, _time: i64, _cx: &mut Cx<'_>) -> Result<(), Error> {
        let now = self.now();
        if now == i64::MIN || now == self.expired_below {
            return self.save_times(); // stream time has not moved: nothing more expires
        }
        self.expired_below = now;
        // Each side's records older than its retention are no longer looked up: deleted a
        // segment at a time. (Unmatched records go out as records move stream time.)
        let mut lower = Vec::new();
        push_ordered(&mut lower, &i64::MIN);
        for side in [THIS, OTHER] {
            let cut = self.times[usize::from(side)]
                .now
                .saturating_sub(self.windows.retention());
            let mut first_kept = Vec::new();
            push_ordered(&mut first_kept, &cut.div_euclid(self.segment));
            self.stores[usize::from(side)].delete_range(Some(&lower), Some(&first_kept))?;
        }
        self.save_times()
    }

    fn close(&mut self, _cx: &mut Cx<'_>) -> Result<(), Error> {
        self.save_times()
    }
}

impl<K, V, V2, VR, F> StreamStreamJoin<K, V, V2, VR, F> {
    fn save_times(&mut self) -> Result<(), Error> {
        let [this, other] = &mut self.times;
        this.save(&*self.stores[0])?;
        other.save(&*self.stores[1])?;
        if let Some(outer) = &self.outer {
            self.min_time.save(&**outer)?;
        }
        Ok(())
    }
}

/// Side numbers in the keys of the outer store: a right record sorts before a left one at
/// the same time, as in Kafka Streams' store (its side flag is 0 for right, 1 for left).
const OUTER_RIGHT: u8 = 2;
const OUTER_LEFT: u8 = 3;

fn outer_ref(outer: &Option<Rc<dyn KeyValueStore>>) -> Option<&dyn KeyValueStore> {
    outer.as_deref()
}

/// Kafka Streams' `minTime` of a join's unmatched records: a lower bound of their times as
/// it keeps it (lowered as records wait, set anew by each pass over them to where the pass
/// stopped, which can be above a record it passed over), deciding when a pass is made at
/// all. Kept in the outer store under the empty key so that a restart changes nothing
/// (Kafka Streams starts again from "none", which makes the next pass at once).
struct MinTime {
    now: i64,
    saved: i64,
}

impl MinTime {
    fn load(operator: &str, store: Option<&dyn KeyValueStore>) -> Result<Self, Error> {
        let Some(store) = store else {
            return Ok(MinTime {
                now: i64::MAX,
                saved: i64::MAX,
            });
        };
        let now = match store.get(b"")? {
            None => i64::MAX,
            Some(bytes) => i64::from_be_bytes(bytes.as_slice().try_into().map_err(|_| {
                Error::msg(format!(
                    "operator {operator}: the time in store {:?} is {} bytes, not 8",
                    store.name(),
                    bytes.len()
                ))
            })?),
        };
        Ok(MinTime { now, saved: now })
    }

    fn save(&mut self, store: &dyn KeyValueStore) -> Result<(), Error> {
        if self.now != self.saved {
            store.put(b"", &self.now.to_be_bytes())?;
            self.saved = self.now;
        }
        Ok(())
    }
}
