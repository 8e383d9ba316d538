//! Avro: schemas parsed with `apache-avro`, and each pair of a writer's schema and the
//! topology's reader schema resolved once into a [`Plan`] that then reads a record's bytes
//! and writes them in the reader's schema (Avro's resolution rules: promotions, defaults,
//! fields by name, enum symbols, unions), or only checks them when the two schemas read
//! alike.
//!
//! `apache-avro` resolves a decoded value against the reader schema again for every
//! record, through a tree of values; a plan walks the bytes once, with the decisions made
//! when it was compiled. Records are bytes a tenant wrote: every length and count is
//! checked against what is left, nesting and the output are bounded, and each error names
//! the field.

pub(crate) mod default;
mod plan;
mod run;

use std::collections::HashMap;

use apache_avro::schema::Name;
use apache_avro::Schema;

pub use plan::Plan;
pub use run::Limits;

/// An Avro schema, parsed, with its named types by full name.
pub struct AvroSchema {
    schema: Schema,
    /// Every named type it defines, by full name (references point into this).
    names: HashMap<String, Schema>,
    /// Its Parsing Canonical Form: two schemas with the same one read alike.
    canonical: String,
}

impl std::fmt::Debug for AvroSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AvroSchema")
            .field("canonical", &self.canonical)
            .finish()
    }
}

impl AvroSchema {
    /// Parses an Avro schema's JSON text; the error says what `apache-avro` found wrong.
    pub fn parse(text: &str) -> Result<AvroSchema, String> {
        let schema = Schema::parse_str(text).map_err(|e| format!("not an Avro schema: {e}"))?;
        let resolved =
            apache_avro::schema::ResolvedSchema::try_from(&schema).map_err(|e| format!("not an Avro schema: {e}"))?;
        let names = resolved
            .get_names()
            .iter()
            .map(|(name, s)| (name.fullname(None), (*s).clone()))
            .collect();
        let canonical = schema.canonical_form();
        Ok(AvroSchema {
            schema,
            names,
            canonical,
        })
    }

    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// Its Parsing Canonical Form.
    pub fn canonical(&self) -> &str {
        &self.canonical
    }

    /// The full name of its top-level type if it is named (a record, enum or fixed): what
    /// the record and topic-record subject strategies name subjects after.
    pub fn full_name(&self) -> Option<String> {
        named(&self.schema).map(|n| n.fullname(None))
    }

    /// The named type `name` refers to (a full name).
    pub(crate) fn named(&self, name: &str) -> Option<&Schema> {
        self.names.get(name)
    }
}

/// The namespace of a named type (none for an unnamed type, or a name without one).
pub(crate) fn named_namespace(schema: &Schema) -> Option<&str> {
    named(schema).and_then(|n| n.namespace())
}

/// The name of a named type (record, enum, fixed, and the logical types over fixed).
fn named(schema: &Schema) -> Option<&Name> {
    match schema {
        Schema::Record(r) => Some(&r.name),
        Schema::Enum(e) => Some(&e.name),
        Schema::Fixed(f) | Schema::Duration(f) => Some(&f.name),
        Schema::Decimal(d) => match &d.inner {
            apache_avro::schema::InnerDecimalSchema::Fixed(f) => Some(&f.name),
            apache_avro::schema::InnerDecimalSchema::Bytes => None,
        },
        Schema::Uuid(apache_avro::schema::UuidSchema::Fixed(f)) => Some(&f.name),
        Schema::Ref { name } => Some(name),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
