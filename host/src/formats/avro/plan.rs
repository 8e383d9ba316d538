//! Compiling a writer's schema against a reader's into a [`Plan`]: Avro's schema resolution
//! (the specification's "Schema Resolution") decided once, not per record.
//!
//! - The same type on both sides reads as it is written; promotions are int → long,
//!   float, double; long → float, double; float → double; string ↔ bytes.
//! - Records match by (unqualified) name or the reader's aliases; fields by name or the
//!   reader field's aliases. A writer field the reader lacks is skipped; a reader field the
//!   writer lacks takes its default, encoded once here (no default: the pair cannot be
//!   resolved).
//! - Enums match by name; a writer symbol the reader lacks reads as the reader's default
//!   symbol, or fails the record that carries it.
//! - A writer union resolves each branch on its own (a branch that cannot be read fails only
//!   the records written in it); a reader union takes the first of its branches that matches
//!   the writer's type, an exact match before a promotion.
//! - Logical types resolve as their underlying types, but two decimals must have the same
//!   scale and precision.
//!
//! Named types may be recursive: each (writer name, reader name) pair is compiled once, so
//! a plan is a graph of nodes by index.

use std::collections::HashMap;

use apache_avro::schema::{InnerDecimalSchema, RecordSchema, UuidSchema};
use apache_avro::Schema;

use super::AvroSchema;

/// A writer's schema resolved against a reader's: what to do with each part of a record.
#[derive(Debug)]
pub struct Plan {
    pub(super) nodes: Vec<Node>,
    pub(super) root: usize,
    /// Per node: reading it as the reader's schema leaves the bytes as they are.
    pub(super) identity: Vec<bool>,
    /// Per node: its encoding may take no bytes at all (a null, an empty record, a fixed of
    /// size 0): a block of them is bounded by count, not by the bytes left.
    pub(super) empty: Vec<bool>,
}

#[derive(Debug)]
pub(super) enum Node {
    Null,
    Boolean,
    /// An int (also read as a long: the same bytes).
    Int,
    Long,
    Float,
    Double,
    Bytes,
    /// A string: UTF-8 is checked (also read as bytes: the same bytes).
    Str,
    Fixed(usize),
    /// An enum whose symbols the reader has at the same places.
    Enum(u32),
    IntToFloat,
    IntToDouble,
    LongToFloat,
    LongToDouble,
    FloatToDouble,
    /// Bytes read as a string: UTF-8 is checked.
    BytesToStr,
    /// Writer symbol (by index) → reader symbol; none: the record fails, naming the symbol.
    EnumMap {
        map: Vec<Option<u32>>,
        writer_symbols: Vec<String>,
        reader: String,
    },
    Array(usize),
    Map(usize),
    Record(RecordPlan),
    /// The writer's union: per branch, how to read a value written in it.
    WriterUnion(Vec<Result<Branch, String>>),
    /// A value of the writer's (non-union) type, written as branch `branch` of the reader's
    /// union.
    ReaderUnion {
        branch: u32,
        node: usize,
    },
    /// Being compiled (a recursive type refers to itself).
    Pending,
}

/// How a value written in one branch of the writer's union is read.
#[derive(Debug)]
pub(super) struct Branch {
    /// The reader union's branch it is written as; none when the reader is no union.
    pub reader: Option<u32>,
    pub node: usize,
}

#[derive(Debug)]
pub(super) struct RecordPlan {
    /// The writer's fields, in its order.
    pub steps: Vec<Step>,
    /// Fields the reader's record has.
    pub reader_fields: usize,
    /// The kept fields come in the reader's order, so the record is written as it is read
    /// (the defaults between them at their places); otherwise each field is written aside
    /// and the record put together in the reader's order.
    pub in_order: bool,
    /// Reader fields the writer lacks: their position and default, encoded, in order.
    pub defaults: Vec<(usize, Vec<u8>)>,
}

#[derive(Debug)]
pub(super) struct Step {
    /// The writer field's name (for errors).
    pub name: String,
    pub node: usize,
    /// Its position among the reader's fields; none: the reader has no such field (skipped).
    pub keep: Option<usize>,
}

impl Plan {
    /// Resolves `writer` against `reader`; the error says where the two cannot be resolved.
    pub fn compile(writer: &AvroSchema, reader: &AvroSchema) -> Result<Plan, String> {
        let mut c = Compiler {
            nodes: Vec::new(),
            memo: HashMap::new(),
        };
        let root = c.node(
            Side {
                schema: writer,
                ns: None,
            },
            writer.schema(),
            Side {
                schema: reader,
                ns: None,
            },
            reader.schema(),
            "",
        )?;
        Ok(Plan::finish(c.nodes, root))
    }

    /// The plan that only checks records of `schema` (its own reader).
    pub fn check(schema: &AvroSchema) -> Plan {
        Plan::compile(schema, schema).expect("a schema resolves against itself")
    }

    /// Whether records come out as they go in: the plan only checks them.
    pub fn is_identity(&self) -> bool {
        self.identity[self.root]
    }

    fn finish(nodes: Vec<Node>, root: usize) -> Plan {
        // Both are greatest fixpoints over a graph that may have cycles: start from "yes"
        // and take it back wherever a node or one of its children says no.
        let identity = fixpoint(&nodes, |node, of| match node {
            Node::Null
            | Node::Boolean
            | Node::Int
            | Node::Long
            | Node::Float
            | Node::Double
            | Node::Bytes
            | Node::Str
            | Node::Fixed(_)
            | Node::Enum(_) => true,
            Node::IntToFloat
            | Node::IntToDouble
            | Node::LongToFloat
            | Node::LongToDouble
            | Node::FloatToDouble
            | Node::EnumMap { .. }
            | Node::ReaderUnion { .. }
            | Node::Pending => false,
            Node::BytesToStr => true,
            Node::Array(items) | Node::Map(items) => of(*items),
            Node::Record(r) => {
                r.defaults.is_empty()
                    && r.in_order
                    && r.steps.len() == r.reader_fields
                    && r.steps.iter().all(|s| s.keep.is_some() && of(s.node))
            }
            Node::WriterUnion(branches) => branches.iter().enumerate().all(|(i, b)| match b {
                Ok(Branch { reader: Some(r), node }) => *r as usize == i && of(*node),
                _ => false,
            }),
        });
        let empty = fixpoint(&nodes, |node, of| match node {
            Node::Null => true,
            Node::Fixed(0) => true,
            Node::Record(r) => r.steps.iter().all(|s| of(s.node)),
            _ => false,
        });
        Plan {
            nodes,
            root,
            identity,
            empty,
        }
    }
}

/// The greatest fixpoint of `holds` over the nodes: a node holds unless `holds` says no,
/// given which of the others hold.
fn fixpoint(nodes: &[Node], holds: impl Fn(&Node, &dyn Fn(usize) -> bool) -> bool) -> Vec<bool> {
    let mut yes = vec![true; nodes.len()];
    loop {
        let mut changed = false;
        for i in 0..nodes.len() {
            if yes[i] {
                let now = {
                    let of = |j: usize| yes[j];
                    holds(&nodes[i], &of)
                };
                if !now {
                    yes[i] = false;
                    changed = true;
                }
            }
        }
        if !changed {
            return yes;
        }
    }
}

/// One side of a resolution: its schema (for named types) and the enclosing namespace.
#[derive(Clone, Copy)]
struct Side<'a> {
    schema: &'a AvroSchema,
    ns: Option<&'a str>,
}

struct Compiler {
    nodes: Vec<Node>,
    /// (writer full name, reader full name, whether the reader is the writer's own schema)
    /// → node: each pair of named types is compiled once.
    memo: HashMap<(String, String, bool), usize>,
}

/// A type as it is encoded: logical types as what they annotate.
enum Base<'a> {
    Null,
    Boolean,
    Int,
    Long,
    Float,
    Double,
    Bytes,
    Str,
    Fixed { name: String, size: usize },
    Enum(&'a apache_avro::schema::EnumSchema),
    Array(&'a Schema),
    Map(&'a Schema),
    Record(&'a RecordSchema),
    Union(&'a [Schema]),
}

/// A decimal's scale and precision, to compare two decimals.
fn decimal(schema: &Schema) -> Option<(usize, usize)> {
    match schema {
        Schema::Decimal(d) => Some((d.precision, d.scale)),
        _ => None,
    }
}

fn base(schema: &Schema) -> Base<'_> {
    match schema {
        Schema::Null => Base::Null,
        Schema::Boolean => Base::Boolean,
        Schema::Int | Schema::Date | Schema::TimeMillis => Base::Int,
        Schema::Long
        | Schema::TimeMicros
        | Schema::TimestampMillis
        | Schema::TimestampMicros
        | Schema::TimestampNanos
        | Schema::LocalTimestampMillis
        | Schema::LocalTimestampMicros
        | Schema::LocalTimestampNanos => Base::Long,
        Schema::Float => Base::Float,
        Schema::Double => Base::Double,
        Schema::Bytes | Schema::BigDecimal | Schema::Uuid(UuidSchema::Bytes) => Base::Bytes,
        Schema::Decimal(d) => match &d.inner {
            InnerDecimalSchema::Bytes => Base::Bytes,
            InnerDecimalSchema::Fixed(f) => Base::Fixed {
                name: f.name.name().to_string(),
                size: f.size,
            },
        },
        Schema::String | Schema::Uuid(UuidSchema::String) => Base::Str,
        Schema::Uuid(UuidSchema::Fixed(f)) | Schema::Fixed(f) | Schema::Duration(f) => Base::Fixed {
            name: f.name.name().to_string(),
            size: f.size,
        },
        Schema::Enum(e) => Base::Enum(e),
        Schema::Array(a) => Base::Array(&a.items),
        Schema::Map(m) => Base::Map(&m.types),
        Schema::Record(r) => Base::Record(r),
        Schema::Union(u) => Base::Union(u.variants()),
        Schema::Ref { .. } => unreachable!("references are followed before"),
    }
}

/// A type's name for messages.
fn describe(schema: &Schema) -> String {
    match base(schema) {
        Base::Null => "null".into(),
        Base::Boolean => "boolean".into(),
        Base::Int => "int".into(),
        Base::Long => "long".into(),
        Base::Float => "float".into(),
        Base::Double => "double".into(),
        Base::Bytes => "bytes".into(),
        Base::Str => "string".into(),
        Base::Fixed { name, size } => format!("fixed {name} (size {size})"),
        Base::Enum(e) => format!("enum {}", e.name.name()),
        Base::Array(_) => "array".into(),
        Base::Map(_) => "map".into(),
        Base::Record(r) => format!("record {}", r.name.name()),
        Base::Union(_) => "union".into(),
    }
}

/// Whether a value of the writer's type `w` is read as the reader's `r` without promotion.
fn same_kind(w: &Schema, r: &Schema) -> bool {
    match (base(w), base(r)) {
        (Base::Null, Base::Null)
        | (Base::Boolean, Base::Boolean)
        | (Base::Int, Base::Int)
        | (Base::Long, Base::Long)
        | (Base::Float, Base::Float)
        | (Base::Double, Base::Double)
        | (Base::Bytes, Base::Bytes)
        | (Base::Str, Base::Str)
        | (Base::Array(_), Base::Array(_))
        | (Base::Map(_), Base::Map(_)) => true,
        (Base::Fixed { name: a, .. }, Base::Fixed { name: b, .. }) => a == b,
        (Base::Enum(a), Base::Enum(b)) => names_match(a.name.name(), b.name.name(), &b.aliases),
        (Base::Record(a), Base::Record(b)) => names_match(a.name.name(), b.name.name(), &b.aliases),
        _ => false,
    }
}

/// Whether the writer's type `w` promotes to the reader's `r`.
fn promotes(w: &Schema, r: &Schema) -> bool {
    matches!(
        (base(w), base(r)),
        (Base::Int, Base::Long | Base::Float | Base::Double)
            | (Base::Long, Base::Float | Base::Double)
            | (Base::Float, Base::Double)
            | (Base::Str, Base::Bytes)
            | (Base::Bytes, Base::Str)
    )
}

/// Whether a writer's named type `w` matches the reader's `r` (unqualified names, or one
/// of the reader's aliases).
fn names_match(w: &str, r: &str, aliases: &apache_avro::schema::Aliases) -> bool {
    w == r || aliases.iter().flatten().any(|a| a.name() == w)
}

fn at(path: &str) -> String {
    if path.is_empty() {
        String::new()
    } else {
        format!("field {path}: ")
    }
}

impl Compiler {
    fn push(&mut self, node: Node) -> usize {
        self.nodes.push(node);
        self.nodes.len() - 1
    }

    /// Follows a reference to the type it names; the namespace it is in.
    fn follow<'a>(side: Side<'a>, schema: &'a Schema) -> Result<(&'a Schema, Option<&'a str>), String> {
        match schema {
            Schema::Ref { name } => {
                let full = name.fully_qualified_name(side.ns);
                let found = side
                    .schema
                    .named(&full.fullname(None))
                    .ok_or_else(|| format!("the schema refers to {} but does not define it", full.fullname(None)))?;
                let ns = super::named(found).and_then(|n| n.namespace());
                Ok((found, ns.or(side.ns)))
            }
            other => Ok((other, side.ns)),
        }
    }

    /// The namespace inside named type `schema` (its own, or the enclosing one).
    fn inner_ns<'a>(schema: &'a Schema, ns: Option<&'a str>) -> Option<&'a str> {
        super::named(schema).and_then(|n| n.namespace()).or(ns)
    }

    fn node(&mut self, w: Side<'_>, ws: &Schema, r: Side<'_>, rs: &Schema, path: &str) -> Result<usize, String> {
        let (ws, wns) = Self::follow(w, ws)?;
        let (rs, rns) = Self::follow(r, rs)?;
        let w = Side { ns: wns, ..w };
        let r = Side { ns: rns, ..r };
        // Named types: compiled once per pair, which is also how recursion ends.
        let key = match (super::named(ws), super::named(rs)) {
            (Some(a), Some(b)) => Some((
                a.fully_qualified_name(wns).fullname(None),
                b.fully_qualified_name(rns).fullname(None),
                std::ptr::eq(w.schema, r.schema),
            )),
            _ => None,
        };
        if let Some(key) = &key {
            if let Some(&done) = self.memo.get(key) {
                return Ok(done);
            }
        }
        if let Base::Union(branches) = base(ws) {
            let mut planned = Vec::with_capacity(branches.len());
            for (i, wb) in branches.iter().enumerate() {
                let plan = match base(rs) {
                    Base::Union(readers) => self
                        .reader_branch(w, wb, r, readers, path)
                        .map(|(b, node)| Branch { reader: Some(b), node }),
                    _ => self.node(w, wb, r, rs, path).map(|node| Branch { reader: None, node }),
                };
                planned.push(plan.map_err(|e| format!("{e} (a value written in branch {i} of the writer's union)")));
            }
            return Ok(self.push(Node::WriterUnion(planned)));
        }
        if let Base::Union(readers) = base(rs) {
            let (branch, node) = self.reader_branch(w, ws, r, readers, path)?;
            return Ok(self.push(Node::ReaderUnion { branch, node }));
        }
        if let (Some(a), Some(b)) = (decimal(ws), decimal(rs)) {
            if a != b {
                return Err(format!(
                    "{}the writer's decimal({}, {}) cannot be read as the reader's decimal({}, {}): \
                     decimals must have the same precision and scale",
                    at(path),
                    a.0,
                    a.1,
                    b.0,
                    b.1
                ));
            }
        }
        let mismatch = || {
            format!(
                "{}the writer's {} cannot be read as the reader's {}",
                at(path),
                describe(ws),
                describe(rs)
            )
        };
        let node = match (base(ws), base(rs)) {
            (Base::Null, Base::Null) => Node::Null,
            (Base::Boolean, Base::Boolean) => Node::Boolean,
            (Base::Int, Base::Int | Base::Long) => Node::Int,
            (Base::Int, Base::Float) => Node::IntToFloat,
            (Base::Int, Base::Double) => Node::IntToDouble,
            (Base::Long, Base::Long) => Node::Long,
            (Base::Long, Base::Float) => Node::LongToFloat,
            (Base::Long, Base::Double) => Node::LongToDouble,
            (Base::Float, Base::Float) => Node::Float,
            (Base::Float, Base::Double) => Node::FloatToDouble,
            (Base::Double, Base::Double) => Node::Double,
            (Base::Bytes, Base::Bytes) => Node::Bytes,
            (Base::Bytes, Base::Str) => Node::BytesToStr,
            (Base::Str, Base::Str | Base::Bytes) => Node::Str,
            (Base::Fixed { name: a, size: x }, Base::Fixed { name: b, size: y }) => {
                if a != b || x != y {
                    return Err(mismatch());
                }
                Node::Fixed(x)
            }
            (Base::Enum(we), Base::Enum(re)) => {
                if !names_match(we.name.name(), re.name.name(), &re.aliases) {
                    return Err(mismatch());
                }
                let default = re
                    .default
                    .as_ref()
                    .and_then(|d| re.symbols.iter().position(|s| s == d))
                    .map(|i| i as u32);
                let map: Vec<Option<u32>> = we
                    .symbols
                    .iter()
                    .map(|s| re.symbols.iter().position(|x| x == s).map(|i| i as u32).or(default))
                    .collect();
                if map.iter().enumerate().all(|(i, m)| *m == Some(i as u32)) {
                    Node::Enum(we.symbols.len() as u32)
                } else {
                    Node::EnumMap {
                        map,
                        writer_symbols: we.symbols.clone(),
                        reader: re.name.name().to_string(),
                    }
                }
            }
            (Base::Array(wi), Base::Array(ri)) => {
                let id = self.push(Node::Pending);
                let items = self.node(w, wi, r, ri, &format!("{path}[]"))?;
                self.nodes[id] = Node::Array(items);
                return Ok(id);
            }
            (Base::Map(wv), Base::Map(rv)) => {
                let id = self.push(Node::Pending);
                let values = self.node(w, wv, r, rv, &format!("{path}{{}}"))?;
                self.nodes[id] = Node::Map(values);
                return Ok(id);
            }
            (Base::Record(wr), Base::Record(rr)) => {
                if !names_match(wr.name.name(), rr.name.name(), &rr.aliases) {
                    return Err(mismatch());
                }
                let id = self.push(Node::Pending);
                if let Some(key) = key {
                    self.memo.insert(key, id);
                }
                let plan = self.record(w, ws, wr, r, rs, rr, path)?;
                self.nodes[id] = Node::Record(plan);
                return Ok(id);
            }
            _ => return Err(mismatch()),
        };
        let id = self.push(node);
        if let Some(key) = key {
            self.memo.insert(key, id);
        }
        Ok(id)
    }

    /// The first of the reader union's branches that a value of type `ws` is read as: one of
    /// the same type first, else one it promotes to.
    fn reader_branch(
        &mut self,
        w: Side<'_>,
        ws: &Schema,
        r: Side<'_>,
        readers: &[Schema],
        path: &str,
    ) -> Result<(u32, usize), String> {
        let (wt, _) = Self::follow(w, ws)?;
        let mut followed = Vec::with_capacity(readers.len());
        for rb in readers {
            followed.push(Self::follow(r, rb)?.0);
        }
        let pick = followed
            .iter()
            .position(|rb| same_kind(wt, rb))
            .or_else(|| followed.iter().position(|rb| promotes(wt, rb)));
        let Some(i) = pick else {
            return Err(format!(
                "{}the writer's {} matches no branch of the reader's union [{}]",
                at(path),
                describe(wt),
                followed.iter().map(|s| describe(s)).collect::<Vec<_>>().join(", ")
            ));
        };
        let node = self.node(w, ws, r, &readers[i], path)?;
        Ok((i as u32, node))
    }

    #[allow(clippy::too_many_arguments)]
    fn record(
        &mut self,
        w: Side<'_>,
        ws: &Schema,
        wr: &RecordSchema,
        r: Side<'_>,
        rs: &Schema,
        rr: &RecordSchema,
        path: &str,
    ) -> Result<RecordPlan, String> {
        let w_inner = Side {
            ns: Self::inner_ns(ws, w.ns),
            ..w
        };
        let r_inner = Side {
            ns: Self::inner_ns(rs, r.ns),
            ..r
        };
        let mut steps = Vec::with_capacity(wr.fields.len());
        let mut taken = vec![false; rr.fields.len()];
        for wf in &wr.fields {
            let reader = rr
                .fields
                .iter()
                .position(|rf| rf.name == wf.name)
                .or_else(|| rr.fields.iter().position(|rf| rf.aliases.contains(&wf.name)));
            let here = if path.is_empty() {
                wf.name.clone()
            } else {
                format!("{path}.{}", wf.name)
            };
            let (node, keep) = match reader {
                Some(i) if !taken[i] => {
                    taken[i] = true;
                    let node = self.node(w_inner, &wf.schema, r_inner, &rr.fields[i].schema, &here)?;
                    (node, Some(i))
                }
                // Not read (or read by an earlier writer field): skipped, but checked.
                _ => (self.node(w_inner, &wf.schema, w_inner, &wf.schema, &here)?, None),
            };
            steps.push(Step {
                name: wf.name.clone(),
                node,
                keep,
            });
        }
        let mut defaults = Vec::new();
        for (i, rf) in rr.fields.iter().enumerate() {
            if taken[i] {
                continue;
            }
            let here = if path.is_empty() {
                rf.name.clone()
            } else {
                format!("{path}.{}", rf.name)
            };
            let Some(default) = &rf.default else {
                return Err(format!(
                    "field {here}: the reader's record {} has it without a default, and the writer's record {} has no such field",
                    rr.name.name(),
                    wr.name.name()
                ));
            };
            let mut bytes = Vec::new();
            super::default::encode(r_inner.schema, r_inner.ns, &rf.schema, default, &mut bytes)
                .map_err(|e| format!("field {here}: its default {default}: {e}"))?;
            defaults.push((i, bytes));
        }
        let kept: Vec<usize> = steps.iter().filter_map(|s| s.keep).collect();
        // Defaults are written between the kept fields, at their places: only the kept
        // fields' order decides whether a record can be written as it is read.
        let in_order = kept.windows(2).all(|p| p[0] < p[1]);
        Ok(RecordPlan {
            steps,
            reader_fields: rr.fields.len(),
            in_order,
            defaults,
        })
    }
}
