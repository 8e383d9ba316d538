//! One task's instance: its `Store`, the typed exports, and every call bounded by a deadline.

use std::time::Duration;

use wasmtime::component::Instance;
use wasmtime::{Store, Trap};

use super::bindings::exports::sluice::topology0_2_0::processor as wit;
use super::bindings::sluice::topology0_1_0::types::GuestError;
use super::bindings_v1::exports::sluice::topology0_1_0::processor as wit_v1;
use super::fault::GuestFault;
use super::host::TaskData;
use super::state_host::NamedStore;
use super::{bindings, bindings_v1};
use super::{LoadedTopology, EPOCH_TICK};
use sluice_wire::wire::{self, Emitted};
use sluice_wire::{Description, GlobalStore, InternalTopic, Subtopology, TaskInfo};

/// A component's exports, by the version of the contract it was built for.
pub(super) enum Exports {
    V2(bindings::Topology),
    V1(bindings_v1::Topology),
}

/// The `processor` export of either version.
enum Processor<'a> {
    V2(&'a wit::Guest),
    V1(&'a wit_v1::Guest),
}

/// Ready to instantiate, by the version of the contract the component was built for.
#[derive(Clone)]
pub(super) enum Pre {
    V2(bindings::TopologyPre<TaskData>),
    V1(bindings_v1::TopologyPre<TaskData>),
}

impl Pre {
    /// The instance, and its `processor` export typed by version.
    fn instantiate(&self, store: &mut Store<TaskData>) -> wasmtime::Result<(Exports, Instance)> {
        Ok(match self {
            Pre::V2(pre) => {
                let instance = pre.instance_pre().instantiate(&mut *store)?;
                (Exports::V2(bindings::Topology::new(&mut *store, &instance)?), instance)
            }
            Pre::V1(pre) => {
                let instance = pre.instance_pre().instantiate(&mut *store)?;
                (
                    Exports::V1(bindings_v1::Topology::new(&mut *store, &instance)?),
                    instance,
                )
            }
        })
    }
}

/// What a topology says of its operators: per sub-topology (by name), one line per operator.
pub type Operators = Vec<(String, Vec<String>)>;

/// The optional interface a topology describes its operators through (for people).
const INTROSPECTION: &str = "sluice:topology/introspection@0.2.0";
/// The optional interface a topology declares the formats of its topics through.
const FORMATS: &str = "sluice:topology/formats@0.2.0";

/// The types of the `formats` interface, lifted from the guest by hand (the interface is an
/// optional export, looked up by name like `introspection`).
mod formats {
    use wasmtime::component::{ComponentType, Lift};

    #[derive(ComponentType, Lift, Clone, Copy)]
    #[component(enum)]
    #[repr(u8)]
    // Made by lifting what the guest returned, never by name here.
    #[allow(dead_code)]
    pub enum SchemaKind {
        #[component(name = "avro")]
        Avro,
        #[component(name = "protobuf")]
        Protobuf,
        #[component(name = "json-schema")]
        JsonSchema,
    }

    #[derive(ComponentType, Lift)]
    #[component(record)]
    pub struct Schema {
        kind: SchemaKind,
        text: String,
        message: Option<String>,
        imports: Vec<(String, String)>,
    }

    #[derive(ComponentType, Lift)]
    #[component(record)]
    pub struct TopicFormat {
        topic: String,
        key: Option<Schema>,
        value: Option<Schema>,
    }

    impl Schema {
        fn into_wire(self) -> sluice_wire::Schema {
            sluice_wire::Schema {
                kind: match self.kind {
                    SchemaKind::Avro => sluice_wire::SchemaKind::Avro,
                    SchemaKind::Protobuf => sluice_wire::SchemaKind::Protobuf,
                    SchemaKind::JsonSchema => sluice_wire::SchemaKind::JsonSchema,
                },
                text: self.text,
                message: self.message,
                imports: self.imports,
            }
        }
    }

    impl TopicFormat {
        pub fn into_wire(self) -> sluice_wire::TopicFormat {
            sluice_wire::TopicFormat {
                topic: self.topic,
                key: self.key.map(Schema::into_wire),
                value: self.value.map(Schema::into_wire),
            }
        }
    }
}

/// Most text a topology's operator description may hold, lines longer than this are cut,
/// and more lines than this are dropped: it is shown to people, never acted on.
pub const MAX_OPERATOR_TEXT: usize = 64 << 10;
pub const MAX_OPERATOR_LINE: usize = 1_000;
pub const MAX_OPERATOR_LINES: usize = 2_000;

/// What a guest said of its operators, made fit to show: bounded in size, one line per
/// operator, control characters (a terminal's escape sequences) replaced.
pub fn bounded_operators(said: Operators) -> Operators {
    let clean = |text: &str| -> String {
        let mut out: String = text
            .chars()
            .map(|c| if c.is_control() { '?' } else { c })
            .take(MAX_OPERATOR_LINE)
            .collect();
        if text.chars().count() > MAX_OPERATOR_LINE {
            out.push('…');
        }
        out
    };
    let (mut bytes, mut lines) = (0usize, 0usize);
    let mut out = Vec::new();
    for (sub, operators) in said {
        let sub = clean(&sub);
        bytes += sub.len();
        let mut kept = Vec::new();
        for line in operators {
            let line = clean(&line);
            if bytes + line.len() > MAX_OPERATOR_TEXT || lines >= MAX_OPERATOR_LINES {
                kept.push("(more operators, not shown: the description is over its size limit)".to_string());
                out.push((sub, kept));
                return out;
            }
            bytes += line.len();
            lines += 1;
            kept.push(line);
        }
        out.push((sub, kept));
        if bytes > MAX_OPERATOR_TEXT {
            break;
        }
    }
    out
}

/// An instance of a topology for one task. After a fault it refuses further calls: a
/// trapped instance may be in any state, so the task must start over with a new one.
pub struct TaskInstance {
    store: Store<TaskData>,
    topology: Exports,
    instance: Instance,
    timeout: Duration,
    deadline_ticks: u64,
    faulted: bool,
}

/// What one call emitted: the guest's output buffer plus anything sent through `host.emit`.
#[derive(Debug, Default)]
pub struct CallOutput {
    returned: Vec<u8>,
    host_emitted: Vec<u8>,
}

impl CallOutput {
    /// The emitted records, checked against the contract (encoding, declared sinks).
    pub fn records(&self, sink_count: usize) -> Result<Vec<Emitted<'_>>, GuestFault> {
        let mut out = Vec::new();
        for buffer in [&self.host_emitted, &self.returned] {
            if buffer.is_empty() {
                continue;
            }
            // The count is checked against the buffer's size by the decoder, so reserving
            // it reserves at most one entry per smallest possible record in the buffer:
            // bounded by what the guest actually returned, not by what it claims.
            let records = wire::emitted(buffer).map_err(|e| GuestFault::BadOutput {
                detail: claimed(buffer, e),
            })?;
            out.reserve(records.remaining() as usize);
            for record in records {
                let record = record.map_err(|e| GuestFault::BadOutput { detail: e.to_string() })?;
                if record.sink as usize >= sink_count {
                    return Err(GuestFault::BadOutput {
                        detail: format!(
                            "a record for sink #{}, but the topology declares {sink_count} sink(s)",
                            record.sink
                        ),
                    });
                }
                out.push(record);
            }
        }
        Ok(out)
    }
}

/// A decoding error, with the record count the buffer claimed when that is what is wrong.
fn claimed(buffer: &[u8], e: wire::WireError) -> String {
    if e.position == 0 && buffer.len() >= 4 {
        let count = u32::from_le_bytes(buffer[..4].try_into().unwrap());
        format!("{e} (it claims {count} records in {} bytes)", buffer.len())
    } else {
        e.to_string()
    }
}

/// The pooling allocator had no room for one more instance: what it holds in all (the
/// worker's `--max-instances`), what each instance of this topology takes, and what to do.
fn pool_full(topology: &LoadedTopology, detail: &str) -> String {
    let n = topology.config.max_instances;
    let f = topology.footprint;
    format!(
        "the worker's instance pool is full ({detail}): --max-instances {n} holds {} instances of this topology \
         (each makes {} core instances, {} memories and {} tables) beside the worker's other tasks; raise \
         --max-instances or spread the tasks over more workers",
        f.capacity(n),
        f.core_instances,
        f.memories,
        f.tables
    )
}

impl TaskInstance {
    pub(super) fn new(
        topology: &LoadedTopology,
        label: &str,
        sinks: Vec<String>,
        stores: Vec<NamedStore>,
    ) -> Result<Self, GuestFault> {
        let config = &topology.config;
        let timeout = config.call_timeout;
        let mut store = Store::new(
            &topology.engine,
            TaskData::new(label, sinks, stores, config.memory_limit, config.host_memory_limit),
        );
        store.limiter(|data| data);
        store.epoch_deadline_trap();
        let deadline_ticks = timeout.as_nanos().div_ceil(EPOCH_TICK.as_nanos()).max(1) as u64;
        store.set_epoch_deadline(deadline_ticks);
        let (topology, instance) = match topology.pre.instantiate(&mut store) {
            Ok(instantiated) => instantiated,
            // A start function can trap like any call; anything else is the host's problem
            // (e.g. the pooling allocator has no free slot).
            Err(e) if e.downcast_ref::<Trap>().is_some() => return Err(classify(&mut store, e, timeout)),
            Err(e) => {
                // Its memories together asked for more than the limit (at creation).
                if let Some(requested) = store.data_mut().memory_denied.take() {
                    return Err(GuestFault::Memory {
                        limit: config.memory_limit,
                        requested,
                    });
                }
                let detail = format!("{e:#}");
                if detail.contains("concurrent limit") {
                    return Err(GuestFault::Instantiate {
                        detail: pool_full(topology, &detail),
                    });
                }
                return Err(GuestFault::Instantiate { detail });
            }
        };
        Ok(TaskInstance {
            store,
            topology,
            instance,
            timeout,
            deadline_ticks,
            faulted: false,
        })
    }

    pub fn describe(&mut self) -> Result<Description, GuestFault> {
        self.call(|p, s| {
            Ok(match p {
                Processor::V2(p) => {
                    let d = p.call_describe(s)?;
                    Description {
                        name: d.name,
                        sources: d.sources,
                        sinks: d.sinks,
                        stores: d.stores,
                        internal_topics: d
                            .internal_topics
                            .into_iter()
                            .map(|t| InternalTopic {
                                name: t.name,
                                partitions: t.partitions,
                            })
                            .collect(),
                        subtopologies: d
                            .subtopologies
                            .into_iter()
                            .map(|t| Subtopology {
                                name: t.name,
                                sources: t.sources,
                                sinks: t.sinks,
                                stores: t.stores,
                            })
                            .collect(),
                        global_stores: d
                            .global_stores
                            .into_iter()
                            .map(|g| GlobalStore {
                                name: g.name,
                                topic: g.topic,
                            })
                            .collect(),
                        // Read from the optional `formats` export (`describe_formats`).
                        formats: Vec::new(),
                    }
                }
                Processor::V1(p) => {
                    let d = p.call_describe(s)?;
                    Description {
                        name: d.name,
                        sources: d.sources,
                        sinks: d.sinks,
                        stores: d.stores,
                        ..Default::default()
                    }
                }
            })
        })
    }

    /// What the topology says of its operators (`introspection.describe-operators`), made
    /// fit to show ([`bounded_operators`]); none if it does not export that (a topology
    /// written without the SDK's DSL, or with an SDK before it).
    pub fn describe_operators(&mut self) -> Result<Operators, GuestFault> {
        let instance = self.instance;
        let Some(interface) = instance.get_export_index(&mut self.store, None, INTROSPECTION) else {
            return Ok(Vec::new());
        };
        let Some(index) = instance.get_export_index(&mut self.store, Some(&interface), "describe-operators") else {
            return Ok(Vec::new());
        };
        type Said = (Operators,);
        let Ok(func) = instance.get_typed_func::<(), Said>(&mut self.store, &index) else {
            // Not the function this host knows: nothing to show.
            return Ok(Vec::new());
        };
        let (said,) = self.call(|_, s| func.call(&mut *s, ()))?;
        self.end_call(true);
        Ok(bounded_operators(said))
    }

    /// The formats of its topics (`formats.describe-formats`); none if it does not export
    /// that (a topology of an SDK before formats, or written without one). What a guest
    /// declares is checked when the description is (`description::check`).
    pub fn describe_formats(&mut self) -> Result<Vec<sluice_wire::TopicFormat>, GuestFault> {
        let instance = self.instance;
        let Some(interface) = instance.get_export_index(&mut self.store, None, FORMATS) else {
            return Ok(Vec::new());
        };
        let Some(index) = instance.get_export_index(&mut self.store, Some(&interface), "describe-formats") else {
            return Ok(Vec::new());
        };
        type Said = (Vec<formats::TopicFormat>,);
        let func = instance
            .get_typed_func::<(), Said>(&mut self.store, &index)
            .map_err(|e| GuestFault::BadOutput {
                detail: format!("its formats export is not the one of sluice:topology@0.2.0: {e:#}"),
            })?;
        let (said,) = self.call(|_, s| func.call(&mut *s, ()))?;
        self.end_call(true);
        Ok(said.into_iter().map(formats::TopicFormat::into_wire).collect())
    }

    pub fn init(&mut self, task: &TaskInfo) -> Result<(), GuestFault> {
        let result = self.call(|p, s| match p {
            Processor::V2(p) => p.call_init(
                s,
                &wit::TaskInfo {
                    topology: task.topology.clone(),
                    subtopology: task.subtopology.clone(),
                    task_id: task.task_id.clone(),
                    partition: task.partition,
                    source_topics: task.source_topics.clone(),
                    sink_topics: task.sink_topics.clone(),
                },
            ),
            Processor::V1(p) => p.call_init(
                s,
                &wit_v1::TaskInfo {
                    topology: task.topology.clone(),
                    task_id: task.task_id.clone(),
                    partition: task.partition,
                    source_topics: task.source_topics.clone(),
                    sink_topics: task.sink_topics.clone(),
                },
            ),
        })?;
        if let (Ok(_), Some(what)) = (&result, self.store.data_mut().undeclared.take()) {
            self.faulted = true;
            self.end_call(false);
            return Err(GuestFault::Undeclared { what });
        }
        result.map_err(|e| self.guest_error(e))?;
        self.end_call(true);
        Ok(())
    }

    /// Processes one encoded batch (see `sluice_wire::wire`).
    pub fn process(&mut self, batch: &[u8]) -> Result<CallOutput, GuestFault> {
        let result = self.call(|p, s| match p {
            Processor::V2(p) => p.call_process(s, batch),
            Processor::V1(p) => p.call_process(s, batch),
        })?;
        self.output(result)
    }

    pub fn punctuate(&mut self, stream_time_ms: i64, wall_clock_ms: i64) -> Result<CallOutput, GuestFault> {
        let result = self.call(|p, s| match p {
            Processor::V2(p) => p.call_punctuate(s, stream_time_ms, wall_clock_ms),
            Processor::V1(p) => p.call_punctuate(s, stream_time_ms, wall_clock_ms),
        })?;
        self.output(result)
    }

    pub fn close(&mut self) -> Result<CallOutput, GuestFault> {
        let result = self.call(|p, s| match p {
            Processor::V2(p) => p.call_close(s),
            Processor::V1(p) => p.call_close(s),
        })?;
        self.output(result)
    }

    /// Takes the task's stores out (for a fresh instance after a fault); this instance is
    /// left without any.
    pub fn take_stores(&mut self) -> Vec<NamedStore> {
        std::mem::take(&mut self.store.data_mut().stores)
    }

    /// The task's state stores (the worker flushes them at commit).
    pub fn stores_mut(&mut self) -> &mut [NamedStore] {
        &mut self.store.data_mut().stores
    }

    /// Ends the state writes of the last call: keep them (the task produced its output) or
    /// drop them. A faulted call drops its writes by itself.
    pub fn end_call(&mut self, keep: bool) {
        for named in self.stores_mut() {
            named.store.end_call(keep);
        }
    }

    /// Bytes of linear memory the instance holds now, all its memories together.
    pub fn memory_used(&self) -> usize {
        self.store.data().memory_total()
    }

    /// Whether a previous call faulted (the instance must not be used again).
    pub fn is_faulted(&self) -> bool {
        self.faulted
    }

    fn output(&mut self, result: Result<Vec<u8>, GuestError>) -> Result<CallOutput, GuestFault> {
        let host_emitted = self.store.data_mut().emitted.take_if_any();
        // A guest that ignored the error of an undeclared sink or store still fails; one that
        // reported it says best where (its error names the record).
        if let (Ok(_), Some(what)) = (&result, self.store.data_mut().undeclared.take()) {
            self.faulted = true;
            self.end_call(false);
            return Err(GuestFault::Undeclared { what });
        }
        match result {
            Ok(returned) => Ok(CallOutput { returned, host_emitted }),
            Err(e) => Err(self.guest_error(e)),
        }
    }

    fn guest_error(&mut self, e: GuestError) -> GuestFault {
        self.faulted = true;
        self.end_call(false);
        GuestFault::Error {
            message: e.message,
            record_index: e.record_index,
        }
    }

    fn call<R>(
        &mut self,
        f: impl FnOnce(Processor<'_>, &mut Store<TaskData>) -> wasmtime::Result<R>,
    ) -> Result<R, GuestFault> {
        if self.faulted {
            return Err(GuestFault::Instantiate {
                detail: "the instance faulted earlier and cannot be called again".into(),
            });
        }
        self.store.set_epoch_deadline(self.deadline_ticks);
        let data = self.store.data_mut();
        (data.fault, data.undeclared, data.memory_denied) = (None, None, None);
        let processor = match &self.topology {
            Exports::V2(t) => Processor::V2(t.sluice_topology0_2_0_processor()),
            Exports::V1(t) => Processor::V1(t.sluice_topology0_1_0_processor()),
        };
        match f(processor, &mut self.store) {
            Ok(r) => Ok(r),
            Err(e) => {
                self.faulted = true;
                self.end_call(false);
                Err(self.classify(e))
            }
        }
    }

    fn classify(&mut self, e: wasmtime::Error) -> GuestFault {
        classify(&mut self.store, e, self.timeout)
    }
}

fn classify(store: &mut Store<TaskData>, e: wasmtime::Error, timeout: Duration) -> GuestFault {
    let data = store.data_mut();
    if let Some(fault) = data.fault.take() {
        return fault;
    }
    if let Some(requested) = data.memory_denied.take() {
        return GuestFault::Memory {
            limit: data.memory_limit,
            requested,
        };
    }
    match e.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => GuestFault::Deadline { timeout },
        Some(trap) => {
            let text = trap.to_string();
            let mut trap_text = text.strip_prefix("wasm trap: ").unwrap_or(&text).to_string();
            if *trap == Trap::MemoryOutOfBounds {
                // Rust keeps its stack in linear memory: running out of it reads below 0.
                trap_text.push_str(" (in a Rust guest usually a stack overflow: deep or endless recursion)");
            }
            let trap = trap_text;
            GuestFault::Trap {
                trap,
                stderr: data.captured_output(),
            }
        }
        None => GuestFault::Trap {
            trap: format!("{e:#}"),
            stderr: data.captured_output(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::bounded_operators;
    use super::{MAX_OPERATOR_LINE, MAX_OPERATOR_LINES, MAX_OPERATOR_TEXT};

    #[test]
    fn what_a_guest_says_of_its_operators_is_bounded_and_cleaned() {
        let mut lines = vec!["a\u{1b}[2Jb\n".to_string(), "x".repeat(5_000)];
        lines.extend((0..5_000).map(|i| format!("op_{i}")));
        let shown = bounded_operators(vec![("s\u{7}ub".into(), lines)]);
        assert_eq!(shown.len(), 1);
        let (sub, lines) = &shown[0];
        assert_eq!(sub, "s?ub");
        assert_eq!(lines[0], "a?[2Jb?");
        assert_eq!(lines[1].chars().count(), MAX_OPERATOR_LINE + 1, "cut, with a mark");
        assert_eq!(lines.len(), MAX_OPERATOR_LINES + 1);
        assert!(lines.last().unwrap().contains("not shown"));
        let bytes: usize = lines.iter().map(String::len).sum();
        assert!(bytes <= MAX_OPERATOR_TEXT + 200, "{bytes}");
        // Many sub-topologies: the total is bounded too.
        let many: Vec<(String, Vec<String>)> = (0..1_000)
            .map(|i| (format!("s{i}"), vec!["y".repeat(900); 3]))
            .collect();
        let shown = bounded_operators(many);
        let bytes: usize = shown.iter().flat_map(|(_, l)| l).map(String::len).sum();
        assert!(bytes <= MAX_OPERATOR_TEXT + 1_000, "{bytes}");
    }

    use super::*;

    /// Four bytes claiming four billion records: refused before anything is allocated for
    /// them (the host used to reserve room for every claimed record first and abort).
    #[test]
    fn a_record_count_larger_than_the_buffer_is_bad_output() {
        for returned in [vec![0xff; 4], [u32::MAX.to_le_bytes(), [0; 4]].concat()] {
            let output = CallOutput {
                returned,
                host_emitted: Vec::new(),
            };
            match output.records(1) {
                Err(GuestFault::BadOutput { detail }) => {
                    assert!(detail.contains("4294967295 records"), "{detail}")
                }
                other => panic!("expected bad output, got {other:?}"),
            }
        }
    }
}
