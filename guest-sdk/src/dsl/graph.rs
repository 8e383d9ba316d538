//! The graph a topology function builds ([`Graph`]), and what it compiles to: the
//! [`Topology`], whose description declares sub-topologies cut where a key change meets a
//! stateful operator, and whose tasks ([`DslTask`]) run one sub-topology each.

use std::any::Any;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

use super::runtime::{BuildCx, DslTask, RawSource};
use super::state::StateBackend;
use super::StreamsBuilder;
use crate::{Description, Error, Subtopology};

/// Builds an operator at `init`: gets what its children were built into, returns itself.
pub(crate) type BuildFn = Box<dyn FnOnce(&mut BuildCx<'_>, &[Rc<dyn Any>]) -> Result<Rc<dyn Any>, Error>>;
/// Builds a source at `init`.
pub(crate) type SourceBuildFn = Box<dyn FnOnce(&mut BuildCx<'_>, &[Rc<dyn Any>]) -> Result<Box<dyn RawSource>, Error>>;

pub(crate) enum Build {
    Node(BuildFn),
    Source(SourceBuildFn),
    Taken,
}

/// The schemas of a topic's keys and values (none: bytes).
pub(crate) type Formats = (Option<crate::formats::Schema>, Option<crate::formats::Schema>);

/// One operator of the graph, as `describe` sees it.
pub(crate) struct GraphNode {
    /// `<kind>_<index>`: `map_values_3`, `count_5`; named in errors.
    pub name: String,
    pub parents: Vec<usize>,
    /// The topic it reads (a source: external, or an internal topic).
    pub source: Option<String>,
    /// The topic it writes (a sink: external, or an internal topic).
    pub sink: Option<String>,
    /// The stores it keeps (each declared once, in its sub-topology).
    pub stores: Vec<String>,
    /// Stores of other operators it reads: it runs in their sub-topology.
    pub reads: Vec<String>,
    /// It reads or writes an internal topic (a repartition's two ends).
    pub internal_io: bool,
    /// The schemas of the keys and values of the topic it reads or writes, when they are in
    /// the Confluent wire format (its types' [`Data::schema`](super::Data::schema)).
    pub formats: Formats,
    pub build: Build,
}

impl GraphNode {
    pub fn new(name: String, parents: Vec<usize>, build: Build) -> Self {
        GraphNode {
            name,
            parents,
            source: None,
            sink: None,
            stores: Vec::new(),
            reads: Vec::new(),
            internal_io: false,
            formats: (None, None),
            build,
        }
    }

    /// Records `K` and `V`'s schemas as those of the topic this node reads or writes.
    pub fn with_formats<K: super::Data, V: super::Data>(mut self) -> Self {
        self.formats = (K::schema(), V::schema());
        self
    }
}

/// What a topology function has built so far.
#[derive(Default)]
pub(crate) struct Graph {
    pub nodes: Vec<GraphNode>,
    /// Internal (repartition) topics, in the order they were made: name, partitions.
    pub internal_topics: Vec<(String, Option<u32>)>,
    /// Global tables: store, topic.
    pub global_stores: Vec<(String, String)>,
    /// The schemas of the keys and values of global tables' topics, by topic.
    pub global_formats: Vec<(String, Formats)>,
    /// For a re-keyed stream (by its operator) that a join repartitioned: the operator that
    /// reads the repartition topic back. Every join of that stream reads it (Kafka Streams
    /// reuses a stream's join repartition topic the same way).
    pub join_repartitions: std::collections::BTreeMap<usize, usize>,
    /// Bytes each aggregation's record cache holds (none: the default; 0: no cache).
    pub cache_max_bytes: Option<usize>,
    /// Mistakes found while building, reported by [`Topology::build`].
    pub errors: Vec<String>,
}

impl Graph {
    /// The name the next operator of kind `kind` gets.
    pub fn next_name(&self, kind: &str) -> String {
        format!("{kind}_{}", self.nodes.len())
    }

    pub fn add(&mut self, node: GraphNode) -> usize {
        self.nodes.push(node);
        self.nodes.len() - 1
    }

    pub fn error(&mut self, message: String) {
        self.errors.push(message);
    }

    fn is_internal(&self, topic: &str) -> bool {
        self.internal_topics.iter().any(|(name, _)| name == topic)
    }
}

/// Store names and internal topic names become parts of topic names
/// (`<topology>-<store>-changelog`, `<topology>-<name>-repartition`): the host accepts
/// `[A-Za-z0-9_]`, 1 to 64 characters.
pub(crate) fn check_store_like(what: &str, name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 64 {
        return Err(format!("the {what} {name:?} must be 1 to 64 characters long"));
    }
    if let Some(c) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || *c == '_')) {
        return Err(format!(
            "the {what} {name:?} contains {c:?}; use letters, digits and '_' (it becomes part of a topic name)"
        ));
    }
    Ok(())
}

/// One sub-topology of a built topology.
struct Plan {
    name: String,
    /// Its operators, in the order they were made (parents before children).
    nodes: Vec<usize>,
    sources: Vec<String>,
    sinks: Vec<String>,
    stores: Vec<String>,
}

/// A compiled DSL topology: its description and, per sub-topology, how to build a task.
pub struct Topology {
    name: String,
    graph: Graph,
    plans: Vec<Plan>,
}

impl Topology {
    /// Runs the topology function `topology` and compiles what it built. The function runs
    /// again at every `init`, so it must build the same graph every time.
    pub fn build(name: &str, topology: impl FnOnce(&mut StreamsBuilder)) -> Result<Self, Error> {
        let mut builder = StreamsBuilder::new();
        topology(&mut builder);
        let graph = builder.into_graph()?;
        let plans = plan(&graph).map_err(|e| Error::msg(format!("topology {name:?}: {e}")))?;
        if let Some(first) = graph.errors.first() {
            return Err(Error::msg(format!("topology {name:?}: {first}")));
        }
        Ok(Topology {
            name: name.to_string(),
            graph,
            plans,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// What `describe` answers: sources, sinks, stores, internal topics, sub-topologies and
    /// global stores.
    pub fn description(&self) -> Description {
        let mut d = Description::new(&self.name);
        let mut seen = BTreeSet::new();
        for node in &self.graph.nodes {
            if let Some(source) = &node.source {
                if !self.graph.is_internal(source) && seen.insert(("source", source.clone())) {
                    d = d.source(source);
                }
            }
        }
        for node in &self.graph.nodes {
            if let Some(sink) = &node.sink {
                if !self.graph.is_internal(sink) && seen.insert(("sink", sink.clone())) {
                    d = d.sink(sink);
                }
            }
        }
        for node in &self.graph.nodes {
            for store in &node.stores {
                d = d.store(store);
            }
        }
        for (topic, partitions) in &self.graph.internal_topics {
            d = d.internal_topic(topic, *partitions);
        }
        for plan in &self.plans {
            let mut s = Subtopology::new(&plan.name);
            s.sources = plan.sources.clone();
            s.sinks = plan.sinks.clone();
            s.stores = plan.stores.clone();
            d = d.subtopology(s);
        }
        for (store, topic) in &self.graph.global_stores {
            d = d.global_store(store, topic);
        }
        // Formats: each topic's, from the operators that read or write it (the two ends of
        // a repartition topic have the same types).
        let topics = self
            .graph
            .nodes
            .iter()
            .flat_map(|n| n.source.iter().chain(n.sink.iter()).map(move |t| (t, &n.formats)))
            .chain(self.graph.global_formats.iter().map(|(t, f)| (t, f)));
        let mut declared = BTreeSet::new();
        for (topic, (key, value)) in topics {
            if (key.is_none() && value.is_none()) || !declared.insert(topic.clone()) {
                continue;
            }
            if let Some(key) = key {
                d = d.key_format(topic, key.clone());
            }
            if let Some(value) = value {
                d = d.value_format(topic, value.clone());
            }
        }
        d
    }

    /// What each sub-topology does, operator by operator, in the manner of Kafka Streams'
    /// `Topology#describe()`: per sub-topology, one line per operator with what it reads
    /// (a topic), writes (a topic), keeps and reads of stores, and its neighbours within
    /// the sub-topology (`<--` parents, `-->` children).
    ///
    /// ```text
    /// words: count_3 (stores: [counts]) <-- source_2 --> to_stream_4
    /// ```
    pub fn operators(&self) -> Vec<(String, Vec<String>)> {
        let nodes = &self.graph.nodes;
        let mut children: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
        for (i, node) in nodes.iter().enumerate() {
            for &p in &node.parents {
                if let Some(c) = children.get_mut(p) {
                    c.push(i);
                }
            }
        }
        let names = |ids: &[usize], within: &[usize]| -> Vec<&str> {
            ids.iter()
                .filter(|i| within.contains(i))
                .filter_map(|&i| nodes.get(i).map(|n| n.name.as_str()))
                .collect()
        };
        self.plans
            .iter()
            .map(|plan| {
                let lines = plan
                    .nodes
                    .iter()
                    .filter_map(|&i| nodes.get(i).map(|n| (i, n)))
                    .map(|(i, node)| {
                        let mut line = node.name.clone();
                        if let Some(topic) = &node.source {
                            let kind = if self.graph.is_internal(topic) {
                                "repartition topic"
                            } else {
                                "source"
                            };
                            line.push_str(&format!(" (reads {kind} {topic})"));
                        }
                        if let Some(topic) = &node.sink {
                            let kind = if self.graph.is_internal(topic) {
                                "repartition topic"
                            } else {
                                "sink"
                            };
                            line.push_str(&format!(" (writes {kind} {topic})"));
                        }
                        if !node.stores.is_empty() {
                            line.push_str(&format!(" (stores: [{}])", node.stores.join(", ")));
                        }
                        if !node.reads.is_empty() {
                            line.push_str(&format!(" (reads stores: [{}])", node.reads.join(", ")));
                        }
                        let parents = names(&node.parents, &plan.nodes);
                        if !parents.is_empty() {
                            line.push_str(&format!(" <-- {}", parents.join(", ")));
                        }
                        let children = names(&children[i], &plan.nodes);
                        if !children.is_empty() {
                            line.push_str(&format!(" --> {}", children.join(", ")));
                        }
                        line
                    })
                    .collect();
                (plan.name.clone(), lines)
            })
            .collect()
    }

    /// Builds the operators of sub-topology `subtopology` over the stores of `backend`. A
    /// topology of one sub-topology answers to any name (a task of a 0.1.0-style topology
    /// is named after the topology).
    pub fn instantiate(mut self, subtopology: &str, backend: &mut dyn StateBackend) -> Result<DslTask, Error> {
        let index = match self.plans.iter().position(|p| p.name == subtopology) {
            Some(index) => index,
            None if self.plans.len() == 1 => 0,
            None => {
                let names: Vec<&str> = self.plans.iter().map(|p| p.name.as_str()).collect();
                return Err(Error::msg(format!(
                    "topology {:?} has no sub-topology {subtopology:?}; it has {names:?}",
                    self.name
                )));
            }
        };
        let plan = &self.plans[index];
        let members: BTreeSet<usize> = plan.nodes.iter().copied().collect();
        let mut children: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for &id in &plan.nodes {
            for &parent in &self.graph.nodes[id].parents {
                children.entry(parent).or_default().push(id);
            }
        }
        let mut cx = BuildCx::new(backend);
        cx.cache_max_bytes = self
            .graph
            .cache_max_bytes
            .unwrap_or(super::cache::DEFAULT_CACHE_MAX_BYTES);
        let mut built: BTreeMap<usize, Rc<dyn Any>> = BTreeMap::new();
        let mut sources = Vec::new();
        // Children are made after their parents, so building backwards builds them first.
        for &id in plan.nodes.iter().rev() {
            let kids: Vec<Rc<dyn Any>> = children
                .get(&id)
                .into_iter()
                .flatten()
                .filter(|c| members.contains(c))
                .filter_map(|c| built.get(c).cloned())
                .collect();
            let node = &mut self.graph.nodes[id];
            match std::mem::replace(&mut node.build, Build::Taken) {
                Build::Node(build) => {
                    built.insert(id, build(&mut cx, &kids)?);
                }
                Build::Source(build) => {
                    let source = node.source.clone().unwrap_or_default();
                    sources.push((source, build(&mut cx, &kids)?));
                }
                Build::Taken => {
                    return Err(Error::msg(format!(
                        "internal error: operator {} built twice",
                        node.name
                    )));
                }
            }
        }
        sources.reverse();
        Ok(DslTask {
            subtopology: plan.name.clone(),
            sources,
            punctuators: cx.punctuators,
        })
    }
}

/// Cuts the graph into sub-topologies: operators joined by an edge or by a store they share
/// run together; internal topics are the only links between sub-topologies.
fn plan(graph: &Graph) -> Result<Vec<Plan>, String> {
    let n = graph.nodes.len();
    let mut parent: Vec<usize> = (0..n).collect();
    fn find(parent: &mut [usize], mut x: usize) -> usize {
        while parent[x] != x {
            parent[x] = parent[parent[x]];
            x = parent[x];
        }
        x
    }
    fn union(parent: &mut [usize], a: usize, b: usize) {
        let (ra, rb) = (find(parent, a), find(parent, b));
        // The smaller index is the root, so a sub-topology is known by its first operator.
        if ra < rb {
            parent[rb] = ra;
        } else {
            parent[ra] = rb;
        }
    }
    let mut keeper: BTreeMap<&str, usize> = BTreeMap::new();
    for (id, node) in graph.nodes.iter().enumerate() {
        for &p in &node.parents {
            union(&mut parent, id, p);
        }
        for store in &node.stores {
            check_store_like("store name", store)?;
            if let Some(other) = keeper.insert(store, id) {
                return Err(format!(
                    "the store {store:?} is kept by two operators ({} and {}): name each store once",
                    graph.nodes[other].name, node.name
                ));
            }
        }
    }
    let globals: BTreeSet<&str> = graph.global_stores.iter().map(|(s, _)| s.as_str()).collect();
    for (store, _) in &graph.global_stores {
        check_store_like("store name", store)?;
        if let Some(&other) = keeper.get(store.as_str()) {
            return Err(format!(
                "the store {store:?} is kept by operator {} and is a global table too",
                graph.nodes[other].name
            ));
        }
    }
    for (id, node) in graph.nodes.iter().enumerate() {
        for store in node.reads.iter().filter(|s| !globals.contains(s.as_str())) {
            match keeper.get(store.as_str()) {
                Some(&k) => union(&mut parent, id, k),
                None => {
                    return Err(format!(
                        "operator {} reads the store {store:?}, which no operator keeps",
                        node.name
                    ))
                }
            }
        }
    }
    // Sources: each topic read once; internal topics and external names apart.
    let mut readers: BTreeMap<&str, usize> = BTreeMap::new();
    for (id, node) in graph.nodes.iter().enumerate() {
        if let Some(source) = &node.source {
            if let Some(other) = readers.insert(source, id) {
                if graph.is_internal(source) {
                    return Err(format!(
                        "two groupings are both named {source:?} (their repartition topic): give each grouping \
                         its own name, or keep one grouping (`let grouped = stream.group_by(..).named({source:?});`) \
                         and aggregate it as often as needed (its aggregations share the topic)"
                    ));
                }
                return Err(format!(
                    "the source {source:?} is read twice (by {} and {}): call `stream({source:?})` (or `table`) once \
                     and use the stream it returns as often as needed",
                    graph.nodes[other].name, node.name
                ));
            }
        }
    }
    if readers.is_empty() {
        return Err("it reads no source: start with StreamsBuilder::stream or ::table".into());
    }
    for (topic, _) in &graph.internal_topics {
        check_store_like("internal topic name", topic)?;
        let external = graph.nodes.iter().any(|node| {
            let names = [&node.source, &node.sink];
            !node.internal_io && names.iter().any(|n| n.as_deref() == Some(topic))
        });
        if external {
            return Err(format!(
                "the repartition topic {topic:?} has the name of a source or sink of the topology: name the \
                 grouping or store differently (e.g. group_by_key().named(\"…\"))"
            ));
        }
    }
    for (store, topic) in &graph.global_stores {
        if graph
            .nodes
            .iter()
            .any(|n| n.source.as_deref() == Some(topic) || n.sink.as_deref() == Some(topic))
        {
            return Err(format!(
                "the topic {topic:?} of the global table {store:?} is also a source or sink: the host reads it whole \
                 into the table"
            ));
        }
    }
    let mut plans: BTreeMap<usize, Plan> = BTreeMap::new();
    for (id, node) in graph.nodes.iter().enumerate() {
        let root = find(&mut parent, id);
        let plan = plans.entry(root).or_insert_with(|| Plan {
            name: String::new(),
            nodes: Vec::new(),
            sources: Vec::new(),
            sinks: Vec::new(),
            stores: Vec::new(),
        });
        plan.nodes.push(id);
        if let Some(source) = &node.source {
            if plan.name.is_empty() {
                plan.name = source.clone();
            }
            plan.sources.push(source.clone());
        }
        if let Some(sink) = &node.sink {
            if !plan.sinks.contains(sink) {
                plan.sinks.push(sink.clone());
            }
        }
        plan.stores.extend(node.stores.iter().cloned());
    }
    let plans: Vec<Plan> = plans.into_values().collect();
    for plan in &plans {
        if plan.sources.is_empty() {
            let first = &graph.nodes[plan.nodes[0]].name;
            return Err(format!("operator {first} is connected to no source"));
        }
    }
    Ok(plans)
}
