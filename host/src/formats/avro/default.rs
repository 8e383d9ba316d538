//! A field's default (JSON, as the schema writes it) encoded in Avro's binary form, once,
//! for records whose writer lacks the field. The specification's JSON encoding of defaults:
//! bytes and fixed as strings of code points 0–255, enums as their symbol, a union's default
//! as a value of its first branch (any branch whose type fits is taken, as newer Avro
//! releases allow).

use apache_avro::schema::{InnerDecimalSchema, UuidSchema};
use apache_avro::Schema;
use serde_json::Value;

use super::AvroSchema;

/// Nesting a default may have.
const MAX_DEPTH: usize = 64;

/// Appends `default`, encoded under `schema` (named types looked up in `within`), to `out`.
pub(super) fn encode(
    within: &AvroSchema,
    ns: Option<&str>,
    schema: &Schema,
    default: &Value,
    out: &mut Vec<u8>,
) -> Result<(), String> {
    value(within, ns, schema, default, out, 0)
}

fn value(
    within: &AvroSchema,
    ns: Option<&str>,
    schema: &Schema,
    v: &Value,
    out: &mut Vec<u8>,
    depth: usize,
) -> Result<(), String> {
    if depth > MAX_DEPTH {
        return Err(format!("nested deeper than {MAX_DEPTH}"));
    }
    let wrong = |what: &str| Err(format!("{v} is not {what}"));
    match schema {
        Schema::Ref { name } => {
            let full = name.fully_qualified_name(ns).fullname(None);
            let named = within
                .named(&full)
                .ok_or_else(|| format!("the schema refers to {full} but does not define it"))?;
            let inner = super::named(named).and_then(|n| n.namespace()).or(ns);
            value(within, inner, named, v, out, depth + 1)
        }
        Schema::Null => match v {
            Value::Null => Ok(()),
            _ => wrong("null"),
        },
        Schema::Boolean => match v {
            Value::Bool(b) => {
                out.push(*b as u8);
                Ok(())
            }
            _ => wrong("a boolean"),
        },
        Schema::Int | Schema::Date | Schema::TimeMillis => match v.as_i64().and_then(|n| i32::try_from(n).ok()) {
            Some(n) => {
                write_long(n as i64, out);
                Ok(())
            }
            None => wrong("an int"),
        },
        Schema::Long
        | Schema::TimeMicros
        | Schema::TimestampMillis
        | Schema::TimestampMicros
        | Schema::TimestampNanos
        | Schema::LocalTimestampMillis
        | Schema::LocalTimestampMicros
        | Schema::LocalTimestampNanos => match v.as_i64() {
            Some(n) => {
                write_long(n, out);
                Ok(())
            }
            None => wrong("a long"),
        },
        Schema::Float => match v.as_f64() {
            Some(x) => {
                out.extend_from_slice(&(x as f32).to_le_bytes());
                Ok(())
            }
            None => wrong("a float"),
        },
        Schema::Double => match v.as_f64() {
            Some(x) => {
                out.extend_from_slice(&x.to_le_bytes());
                Ok(())
            }
            None => wrong("a double"),
        },
        Schema::String | Schema::Uuid(UuidSchema::String) => match v {
            Value::String(s) => {
                write_long(s.len() as i64, out);
                out.extend_from_slice(s.as_bytes());
                Ok(())
            }
            _ => wrong("a string"),
        },
        Schema::Bytes | Schema::BigDecimal | Schema::Uuid(UuidSchema::Bytes) => {
            let bytes = code_points(v)?;
            write_long(bytes.len() as i64, out);
            out.extend_from_slice(&bytes);
            Ok(())
        }
        Schema::Decimal(d) => match &d.inner {
            InnerDecimalSchema::Bytes => {
                let bytes = code_points(v)?;
                write_long(bytes.len() as i64, out);
                out.extend_from_slice(&bytes);
                Ok(())
            }
            InnerDecimalSchema::Fixed(f) => fixed(v, f.size, out),
        },
        Schema::Fixed(f) | Schema::Duration(f) | Schema::Uuid(UuidSchema::Fixed(f)) => fixed(v, f.size, out),
        Schema::Enum(e) => match v {
            Value::String(s) => match e.symbols.iter().position(|x| x == s) {
                Some(i) => {
                    write_long(i as i64, out);
                    Ok(())
                }
                None => Err(format!("{s:?} is not a symbol of enum {}", e.name.name())),
            },
            _ => wrong("an enum symbol"),
        },
        Schema::Array(a) => match v {
            Value::Array(items) => {
                if !items.is_empty() {
                    write_long(items.len() as i64, out);
                    for item in items {
                        value(within, ns, &a.items, item, out, depth + 1)?;
                    }
                }
                out.push(0);
                Ok(())
            }
            _ => wrong("an array"),
        },
        Schema::Map(m) => match v {
            Value::Object(entries) => {
                if !entries.is_empty() {
                    write_long(entries.len() as i64, out);
                    for (k, item) in entries {
                        write_long(k.len() as i64, out);
                        out.extend_from_slice(k.as_bytes());
                        value(within, ns, &m.types, item, out, depth + 1)?;
                    }
                }
                out.push(0);
                Ok(())
            }
            _ => wrong("a map"),
        },
        Schema::Record(r) => match v {
            Value::Object(entries) => {
                let inner = r.name.namespace().or(ns);
                for f in &r.fields {
                    let given = entries.get(&f.name).or(f.default.as_ref()).ok_or_else(|| {
                        format!(
                            "it has no value for field {} of record {}, which has no default",
                            f.name,
                            r.name.name()
                        )
                    })?;
                    value(within, inner, &f.schema, given, out, depth + 1)
                        .map_err(|e| format!("field {}: {e}", f.name))?;
                }
                Ok(())
            }
            _ => wrong("a record (an object)"),
        },
        Schema::Union(u) => {
            // The first branch is the specification's; a later one is tried when the value is
            // not of the first branch's type.
            let mut first_error = None;
            for (i, branch) in u.variants().iter().enumerate() {
                let mut attempt = Vec::new();
                write_long(i as i64, &mut attempt);
                match value(within, ns, branch, v, &mut attempt, depth + 1) {
                    Ok(()) => {
                        out.extend_from_slice(&attempt);
                        return Ok(());
                    }
                    Err(e) => {
                        first_error.get_or_insert(e);
                    }
                }
            }
            Err(first_error.unwrap_or_else(|| "an empty union has no values".into()))
        }
    }
}

fn fixed(v: &Value, size: usize, out: &mut Vec<u8>) -> Result<(), String> {
    let bytes = code_points(v)?;
    if bytes.len() != size {
        return Err(format!("{} bytes, not the fixed size {size}", bytes.len()));
    }
    out.extend_from_slice(&bytes);
    Ok(())
}

/// Bytes written as a JSON string of code points 0–255, one per byte.
fn code_points(v: &Value) -> Result<Vec<u8>, String> {
    let Value::String(s) = v else {
        return Err(format!("{v} is not bytes (a string of code points 0 to 255)"));
    };
    s.chars()
        .map(|c| u8::try_from(u32::from(c)).map_err(|_| format!("{c:?} is not a code point from 0 to 255")))
        .collect()
}

/// Avro's long: zig-zag, then a varint.
pub(crate) fn write_long(n: i64, out: &mut Vec<u8>) {
    let mut v = ((n << 1) ^ (n >> 63)) as u64;
    while v >= 0x80 {
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}
