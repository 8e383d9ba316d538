//! A stream DSL (Kafka Streams' `StreamsBuilder`, `KStream`, `KTable`, …) that compiles,
//! inside the guest, to the Processor API's contract: the host sees a [`Description`](crate::Description) with
//! sub-topologies, repartition topics, stores and global stores, and knows nothing of
//! operators.
//!
//! # How a topology becomes tasks
//!
//! A topology is a function `fn(&mut StreamsBuilder)`, exported with
//! [`crate::export_dsl!`]. It runs at `describe` and again at every task's `init`, so it
//! must build the same graph every time (deterministic: no clock, no randomness).
//!
//! 1. **Graph.** Each operator call adds a node (named `<kind>_<index>`, e.g. `count_5`)
//!    whose typed closures are kept, boxed, for later. A stream remembers whether an
//!    operator upstream may have changed its key (`map`, `flat_map`, `select_key`,
//!    `group_by`).
//! 2. **Repartitioning.** A stateful operator (aggregation, join, `to_table`) below a key
//!    change reads its input through an internal topic: a sink writes each record keyed by
//!    its new key, a source reads it back. The topic is named after the grouping
//!    ([`KGroupedStream::named`]) or else the operator's store (`counts`), or for joins
//!    `<join>_left` / `<join>_right`; the host creates it as
//!    `<topology>-<name>-repartition` (Kafka Streams' own naming) and puts each record on
//!    the partition of its key. A table's `group_by` always repartitions. Records with a
//!    null key are dropped on the way.
//! 3. **Sub-topologies** ([`Topology::build`]): operators connected by an edge, or by a
//!    store one keeps and another reads (a join reads its table's store), run together;
//!    internal topics are the only links between sub-topologies. Each is named after its
//!    first source (`lines`, `counts`), and declares its sources, sinks and stores.
//! 4. **`init`** ([`Topology::instantiate`]) builds only the operators of the task's
//!    sub-topology, children first, each holding its children ([`DslTask`]): a record goes
//!    through the whole chain in one pass, by value, copied only where a stream feeds
//!    several operators.
//!
//! Names are checked when the topology is built: stores and internal topics are
//! `[A-Za-z0-9_]`, 1 to 64 characters (they become parts of topic names); a source is read
//! once; an internal topic may not share its name with a source or sink; a store is kept
//! by one operator. `describe` of an invalid topology panics with the reason, which the
//! host shows when it refuses the upload; [`Topology::build`] and the
//! [`TestDriver`](testing::TestDriver) return it as an error.
//!
//! # Keys, values and nulls
//!
//! A stream's key and value types are its codecs ([`Data`]): `String`, `u64`,
//! [`Json<T>`](crate::Json), tuples, … A type is null only if it says so: `Option<T>`
//! reads a null key or a tombstone as `None`; `()` is a key nobody reads. A null where the
//! type cannot be null is an error naming the operator and the record. Aggregations and
//! joins drop records whose key is null, as Kafka Streams does. A table's updates carry
//! the old value with the new one (a retraction and an addition), so that a table
//! aggregation can subtract and a join can update its result; [`KTable::to_stream`] gives
//! `Option<V>` values, `None` for a deletion.
//!
//! # State
//!
//! Operators keep state behind [`KeyValueStore`], a byte-level trait with two
//! implementations: the host's stores in a Wasm instance, [`MemoryStores`] natively. The
//! layouts:
//!
//! - **Tables and aggregations** (`table`, `to_table`, `count`, `reduce`, `aggregate`):
//!   key → value in the user's codecs, then the value's time (Kafka Streams'
//!   `ValueAndTimestamp`: 8 bytes big-endian and an 8-byte tag, see `stamp.rs`), so an
//!   interactive query of a store named `counts` reads the key's bytes and the count's
//!   (the host strips the time and answers it beside the value). Values stored by an SDK
//!   from before times were kept read back without one, and take their next record's.
//! - **Time windows**: `[start: 8 bytes, order-preserving][key]` → aggregate and its
//!   time, as above; closing and
//!   expiring windows are range operations over the oldest starts.
//! - **Session windows**: `(segment of last, key, last, first)` → aggregate; **sliding
//!   windows** keep the records, `(segment of t, key, t, id)` → value, and aggregate a
//!   window when it goes out; **stream-stream joins** keep each side's records the same way
//!   and unmatched records by `(t, side, key, id)`. A segment is a span of time, so expiry
//!   deletes whole ranges and a lookup scans the few segments a window covers.
//! - A windowed operator keeps its **stream time** (the largest timestamp it has seen) in
//!   its store under the empty key, written at each punctuation and at `close`: the host's
//!   stream time starts again from the first record read after a restart or a move, and a
//!   window must neither be emitted again nor early. Ids of stored records derive from the
//!   input's source and offset, so a record processed again after a failure writes the
//!   same entries.
//!
//! # Time and windows
//!
//! Windows are `[start, end)` in milliseconds ([`Windowed`]). A windowed operator's stream
//! time `T` is the largest timestamp it has seen; a record counts in the windows still open
//! when it comes, and is late, and dropped, when the last window it belongs to has closed:
//! `end + grace <= T`. With [`WindowedBy::emit_final`], a window's result goes out once, at
//! the first punctuation after it closed; otherwise at every update. Either way a window's
//! result has Kafka Streams' time: the latest of its records' (an aggregate's time is the
//! latest of the records folded into it; a session's is its last record's). Punctuations
//! ([`DslTask::punctuate`]) send closed windows and expire state; what they send does not
//! depend on when they come.
//!
//! - [`TimeWindows`]: tumbling and hopping; a record is in every window that covers it.
//! - [`SessionWindows`]: a record within the gap of a session joins it, and merges the
//!   sessions it bridges; a session `[first, last]` is `Windowed { start: first, end:
//!   last + 1 }`, late and closed when `last + gap + grace < T` (as in Kafka Streams), and
//!   joined by nothing more once `last + gap + grace <= T` (Kafka Streams' session store,
//!   with its default retention, no longer finds it).
//! - [`SlidingWindows`]: windows `[t - d, t]` for each record and `[t + 1, t + 1 + d]` when
//!   a record follows within it (Kafka Streams' definition, both ends inclusive, so
//!   `end = start + d + 1`). A window that only comes to exist once closed is not
//!   emitted; on update, a record sends the open windows that hold it.
//! - [`JoinWindows`]: a left record at `t` joins right records in `[t - before,
//!   t + after]` that the right side still keeps (for `before + after + grace` of its own
//!   stream time), with no other lateness check; left and outer joins send a record that
//!   found no partner alone once a record moves `T` past the part of its window ahead of
//!   it and the grace period, or at once if that part had passed when it came (Kafka
//!   Streams 4.x, record for record).
//!
//! Where this differs from Kafka Streams: closed windows go out at punctuation (about once
//! a second), not at the record that closes them (the same results, later); on update, a
//! sliding window aggregation does not send the new record's right window (Kafka Streams
//! does); a stream's records without a value are an error unless its value type is an
//! `Option`.
//!
//! # Testing
//!
//! [`testing::TestDriver`] runs a topology natively: every sub-topology as one task over
//! memory stores, records written to repartition topics handed straight to the
//! sub-topology that reads them, punctuation on demand, outputs and stores readable, and
//! restarts on the same stores.

mod builder;
mod cache;
mod data;
mod export;
mod graph;
mod grouped;
mod grouped_table;
mod joins;
mod runtime;
mod session;
mod sliding;
mod stamp;
mod state;
mod stream;
mod stream_join;
mod table;
pub mod testing;
mod windows;

pub use builder::{materialized, Materialized, StreamsBuilder};
pub use cache::DEFAULT_CACHE_MAX_BYTES;
pub use data::{Data, Windowed};
pub use export::{DslProcessor, DslTopology};
pub use graph::Topology;
pub use grouped::KGroupedStream;
pub use grouped_table::KGroupedTable;
pub use runtime::{DslTask, Emitter, SourceRecord};
pub use session::SessionWindows;
pub use sliding::SlidingWindows;
pub use state::{Entry, EntryIter, KeyValueStore, MemoryStore, MemoryStores, StateBackend};
pub use stream::{KStream, Split};
pub use stream_join::JoinWindows;
pub use table::{GlobalKTable, KTable};
pub use windows::{Emit, TimeWindows, WindowedBy, Windows};
