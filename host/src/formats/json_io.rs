//! Records of the Confluent wire format as plain JSON, for people and tools (`sluice
//! consume` and `sluice produce`): a framed key or value read with its writer schema and
//! printed as JSON, and a JSON value written in a declared schema.
//!
//! Avro values are decoded and encoded with `apache-avro` (a tool reads one record at a
//! time; the tasks' per-record path is [`super::avro::Plan`]). The JSON is plain: a union's
//! value without its branch name, an enum as its symbol, `bytes` and `fixed` as strings of
//! code points 0–255 (Avro's own JSON encoding of bytes), a decimal as a string of its digits
//! (`"12.50"`), timestamps, dates and times as their numbers, a UUID as its text. Protobuf
//! uses its canonical JSON mapping (`prost-reflect`); JSON Schema values are their text.

use apache_avro::types::Value as Avro;
use serde_json::{Map, Number, Value as Json};

use super::{framing, Declared, Parsed, WriterSchema};

/// A framed key or value (`rest`: what follows its schema id) as JSON, read with its
/// writer schema.
pub fn to_json(writer: &WriterSchema, rest: &[u8]) -> Result<Json, String> {
    match &writer.parsed {
        Parsed::Avro(schema) => {
            // Anyone who may write to the topic wrote these bytes: they are checked first, by
            // what they hold, so that apache-avro never builds what a count only claims (a
            // million nulls take no bytes).
            let limits = super::avro::Limits {
                max_items: 1 << 20,
                ..Default::default()
            };
            super::avro::Plan::check(schema)
                .check_bytes(rest, &limits)
                .map_err(|e| format!("it does not read as Avro under schema id {}: {e}", writer.id))?;
            let mut bytes = rest;
            #[allow(deprecated)]
            let value = apache_avro::from_avro_datum(schema.schema(), &mut bytes, None)
                .map_err(|e| format!("it does not read as Avro under schema id {}: {e}", writer.id))?;
            avro_to_json(value, schema.schema())
        }
        Parsed::Protobuf(file) => {
            let (indexes, payload) = framing::message_indexes(rest).map_err(|e| e.to_string())?;
            let message = file.message_at(&indexes)?;
            let decoded = prost_reflect::DynamicMessage::decode(message.clone(), payload)
                .map_err(|e| format!("it does not parse as Protobuf message {}: {e}", message.full_name()))?;
            serde_json::to_value(&decoded).map_err(|e| e.to_string())
        }
        Parsed::Json(_) => serde_json::from_slice(rest).map_err(|e| format!("it is not JSON: {e}")),
    }
}

/// `json`, written in the declared schema: the payload (without framing).
pub fn from_json(declared: &Declared, json: &Json) -> Result<Vec<u8>, String> {
    match &declared.parsed {
        Parsed::Avro(schema) => {
            let value = json_to_avro(json, schema.schema(), schema, None, 0)
                .map_err(|e| format!("{json} does not fit the schema: {e}"))?;
            #[allow(deprecated)]
            apache_avro::to_avro_datum(schema.schema(), value)
                .map_err(|e| format!("{json} does not fit the schema: {e}"))
        }
        Parsed::Protobuf(_) => {
            let message = declared
                .message
                .clone()
                .expect("a declared Protobuf schema names its message");
            let decoded = prost_reflect::DynamicMessage::deserialize(message.clone(), json.clone())
                .map_err(|e| format!("{json} is not a {}: {e}", message.full_name()))?;
            Ok(prost::Message::encode_to_vec(&decoded))
        }
        Parsed::Json(schema) => {
            let bytes = serde_json::to_vec(json).map_err(|e| e.to_string())?;
            schema.check(&bytes, true)?;
            Ok(bytes)
        }
    }
}

/// Bytes as Avro's JSON writes them: one code point (0–255) per byte.
fn code_points(bytes: &[u8]) -> Json {
    Json::String(bytes.iter().map(|&b| b as char).collect())
}

/// A decimal's unscaled two's-complement bytes, with `scale`, as text (`"-12.50"`).
fn decimal_text(bytes: &[u8], scale: usize) -> Result<String, String> {
    if bytes.len() > 16 {
        return Err(format!("a decimal of {} bytes, more than 16", bytes.len()));
    }
    let negative = bytes.first().is_some_and(|b| b & 0x80 != 0);
    let mut full = [if negative { 0xff } else { 0 }; 16];
    full[16 - bytes.len()..].copy_from_slice(bytes);
    let n = i128::from_be_bytes(full);
    let digits = n.unsigned_abs().to_string();
    let digits = if digits.len() <= scale {
        format!("{}{digits}", "0".repeat(scale + 1 - digits.len()))
    } else {
        digits
    };
    let (int, frac) = digits.split_at(digits.len() - scale);
    let sign = if n < 0 { "-" } else { "" };
    Ok(if scale == 0 {
        format!("{sign}{int}")
    } else {
        format!("{sign}{int}.{frac}")
    })
}

fn avro_to_json(value: Avro, schema: &apache_avro::Schema) -> Result<Json, String> {
    Ok(match value {
        Avro::Null => Json::Null,
        Avro::Boolean(b) => Json::Bool(b),
        Avro::Int(n) | Avro::Date(n) | Avro::TimeMillis(n) => Json::from(n),
        Avro::Long(n)
        | Avro::TimeMicros(n)
        | Avro::TimestampMillis(n)
        | Avro::TimestampMicros(n)
        | Avro::TimestampNanos(n)
        | Avro::LocalTimestampMillis(n)
        | Avro::LocalTimestampMicros(n)
        | Avro::LocalTimestampNanos(n) => Json::from(n),
        Avro::Float(x) => Number::from_f64(x as f64).map_or(Json::Null, Json::Number),
        Avro::Double(x) => Number::from_f64(x).map_or(Json::Null, Json::Number),
        Avro::Bytes(b) | Avro::Fixed(_, b) => code_points(&b),
        Avro::String(s) | Avro::Enum(_, s) => Json::String(s),
        Avro::Uuid(u) => Json::String(u.to_string()),
        Avro::Decimal(d) => {
            let scale = scale_of(schema);
            let bytes = Vec::<u8>::try_from(&d).map_err(|e| e.to_string())?;
            Json::String(decimal_text(&bytes, scale)?)
        }
        Avro::BigDecimal(d) => Json::String(d.to_string()),
        Avro::Duration(d) => Json::from(vec![u32::from(d.months()), u32::from(d.days()), u32::from(d.millis())]),
        Avro::Union(i, inner) => {
            let branch = match schema {
                apache_avro::Schema::Union(u) => u.variants().get(i as usize).cloned(),
                _ => None,
            };
            avro_to_json(*inner, branch.as_ref().unwrap_or(schema))?
        }
        Avro::Array(items) => {
            let item = match schema {
                apache_avro::Schema::Array(a) => (*a.items).clone(),
                other => other.clone(),
            };
            Json::Array(
                items
                    .into_iter()
                    .map(|v| avro_to_json(v, &item))
                    .collect::<Result<_, _>>()?,
            )
        }
        Avro::Map(entries) => {
            let item = match schema {
                apache_avro::Schema::Map(m) => (*m.types).clone(),
                other => other.clone(),
            };
            let mut out = Map::new();
            let mut entries: Vec<_> = entries.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            for (k, v) in entries {
                out.insert(k, avro_to_json(v, &item)?);
            }
            Json::Object(out)
        }
        Avro::Record(fields) => {
            let mut out = Map::new();
            for (name, v) in fields {
                let field = match schema {
                    apache_avro::Schema::Record(r) => {
                        r.fields.iter().find(|f| f.name == name).map(|f| f.schema.clone())
                    }
                    _ => None,
                };
                out.insert(name, avro_to_json(v, field.as_ref().unwrap_or(schema))?);
            }
            Json::Object(out)
        }
    })
}

/// Plain JSON (as [`to_json`] writes it) as an Avro value of `schema`.
fn json_to_avro(
    json: &Json,
    schema: &apache_avro::Schema,
    within: &super::avro::AvroSchema,
    ns: Option<&str>,
    depth: usize,
) -> Result<Avro, String> {
    use apache_avro::schema::{InnerDecimalSchema, UuidSchema};
    use apache_avro::Schema as S;
    if depth > 64 {
        return Err("nested deeper than 64".into());
    }
    let wrong = |what: &str| Err(format!("{json} is not {what}"));
    let int = |j: &Json| j.as_i64().and_then(|n| i32::try_from(n).ok());
    let bytes = |j: &Json| -> Result<Vec<u8>, String> {
        let Json::String(s) = j else {
            return Err(format!("{j} is not bytes (a string of code points 0 to 255)"));
        };
        s.chars()
            .map(|c| u8::try_from(u32::from(c)).map_err(|_| format!("{c:?} is not a code point from 0 to 255")))
            .collect()
    };
    Ok(match schema {
        S::Ref { name } => {
            let full = name.fully_qualified_name(ns).fullname(None);
            let named = within
                .named(&full)
                .ok_or_else(|| format!("the schema does not define {full}"))?;
            let inner = super::avro::named_namespace(named).or(ns);
            return json_to_avro(json, named, within, inner, depth + 1);
        }
        S::Null => match json {
            Json::Null => Avro::Null,
            _ => return wrong("null"),
        },
        S::Boolean => match json {
            Json::Bool(b) => Avro::Boolean(*b),
            _ => return wrong("a boolean"),
        },
        S::Int => Avro::Int(int(json).ok_or_else(|| format!("{json} is not an int"))?),
        S::Date => Avro::Date(int(json).ok_or_else(|| format!("{json} is not a date (days)"))?),
        S::TimeMillis => Avro::TimeMillis(int(json).ok_or_else(|| format!("{json} is not a time (ms)"))?),
        S::Long => Avro::Long(json.as_i64().ok_or_else(|| format!("{json} is not a long"))?),
        S::TimeMicros => Avro::TimeMicros(json.as_i64().ok_or_else(|| format!("{json} is not a time (µs)"))?),
        S::TimestampMillis => Avro::TimestampMillis(json.as_i64().ok_or_else(|| format!("{json} is not a timestamp"))?),
        S::TimestampMicros => Avro::TimestampMicros(json.as_i64().ok_or_else(|| format!("{json} is not a timestamp"))?),
        S::TimestampNanos => Avro::TimestampNanos(json.as_i64().ok_or_else(|| format!("{json} is not a timestamp"))?),
        S::LocalTimestampMillis => {
            Avro::LocalTimestampMillis(json.as_i64().ok_or_else(|| format!("{json} is not a timestamp"))?)
        }
        S::LocalTimestampMicros => {
            Avro::LocalTimestampMicros(json.as_i64().ok_or_else(|| format!("{json} is not a timestamp"))?)
        }
        S::LocalTimestampNanos => {
            Avro::LocalTimestampNanos(json.as_i64().ok_or_else(|| format!("{json} is not a timestamp"))?)
        }
        S::Float => Avro::Float(json.as_f64().ok_or_else(|| format!("{json} is not a float"))? as f32),
        S::Double => Avro::Double(json.as_f64().ok_or_else(|| format!("{json} is not a double"))?),
        S::Bytes | S::Uuid(UuidSchema::Bytes) => Avro::Bytes(bytes(json)?),
        S::String => match json {
            Json::String(s) => Avro::String(s.clone()),
            _ => return wrong("a string"),
        },
        S::Uuid(UuidSchema::String) => match json.as_str().map(uuid::Uuid::parse_str) {
            Some(Ok(u)) => Avro::Uuid(u),
            _ => return wrong("a UUID"),
        },
        S::Uuid(UuidSchema::Fixed(_)) => match json.as_str().map(uuid::Uuid::parse_str) {
            Some(Ok(u)) => Avro::Uuid(u),
            _ => return wrong("a UUID"),
        },
        S::Fixed(f) | S::Duration(f) => {
            let b = bytes(json)?;
            if b.len() != f.size {
                return Err(format!("{json} is {} bytes, not the fixed size {}", b.len(), f.size));
            }
            Avro::Fixed(f.size, b)
        }
        S::Decimal(d) => {
            let text = match json {
                Json::String(s) => s.clone(),
                Json::Number(n) => n.to_string(),
                _ => return wrong("a decimal (a string such as \"12.50\")"),
            };
            let unscaled = decimal_bytes(&text, d.scale)?;
            let _ = matches!(d.inner, InnerDecimalSchema::Bytes);
            Avro::Decimal(apache_avro::Decimal::from(unscaled))
        }
        S::BigDecimal => return Err("big-decimal values are not written from JSON".into()),
        S::Enum(e) => match json {
            Json::String(s) if e.symbols.contains(s) => {
                Avro::Enum(e.symbols.iter().position(|x| x == s).unwrap() as u32, s.clone())
            }
            _ => return Err(format!("{json} is not a symbol of enum {}", e.name.name())),
        },
        S::Array(a) => match json {
            Json::Array(items) => Avro::Array(
                items
                    .iter()
                    .map(|i| json_to_avro(i, &a.items, within, ns, depth + 1))
                    .collect::<Result<_, _>>()?,
            ),
            _ => return wrong("an array"),
        },
        S::Map(m) => match json {
            Json::Object(entries) => Avro::Map(
                entries
                    .iter()
                    .map(|(k, v)| Ok((k.clone(), json_to_avro(v, &m.types, within, ns, depth + 1)?)))
                    .collect::<Result<_, String>>()?,
            ),
            _ => return wrong("a map (an object)"),
        },
        S::Record(r) => {
            let Json::Object(entries) = json else {
                return wrong("a record (an object)");
            };
            let inner = r.name.namespace().or(ns);
            let mut fields = Vec::with_capacity(r.fields.len());
            for f in &r.fields {
                let given = match (entries.get(&f.name), &f.default) {
                    (Some(v), _) => v.clone(),
                    (None, Some(d)) => d.clone(),
                    (None, None) => return Err(format!("it has no field {} (which has no default)", f.name)),
                };
                let value = json_to_avro(&given, &f.schema, within, inner, depth + 1)
                    .map_err(|e| format!("field {}: {e}", f.name))?;
                fields.push((f.name.clone(), value));
            }
            if let Some(extra) = entries.keys().find(|k| !r.fields.iter().any(|f| &f.name == *k)) {
                return Err(format!(
                    "it has a field {extra:?} that record {} has not",
                    r.name.name()
                ));
            }
            Avro::Record(fields)
        }
        S::Union(u) => {
            // The value as it is (unions unwrapped): the first branch it fits.
            let mut errors = Vec::new();
            for (i, branch) in u.variants().iter().enumerate() {
                match json_to_avro(json, branch, within, ns, depth + 1) {
                    Ok(v) => return Ok(Avro::Union(i as u32, Box::new(v))),
                    Err(e) => errors.push(e),
                }
            }
            return Err(format!("it fits no branch of the union: {}", errors.join("; ")));
        }
    })
}

/// A decimal's text (`"-12.5"`) as its unscaled two's-complement bytes at `scale`.
fn decimal_bytes(text: &str, scale: usize) -> Result<Vec<u8>, String> {
    let bad = || format!("{text:?} is not a decimal number");
    let (sign, digits) = match text.strip_prefix('-') {
        Some(rest) => (-1i128, rest),
        None => (1, text),
    };
    let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
    if int.is_empty() && frac.is_empty() || !int.chars().chain(frac.chars()).all(|c| c.is_ascii_digit()) {
        return Err(bad());
    }
    if frac.len() > scale {
        return Err(format!("{text:?} has more than the schema's {scale} decimal places"));
    }
    let all = format!("{int}{frac}{}", "0".repeat(scale - frac.len()));
    let n: i128 = all.parse::<i128>().map_err(|_| bad())? * sign;
    let bytes = n.to_be_bytes();
    // The shortest two's complement that keeps the sign.
    let mut start = 0;
    while start < 15
        && ((bytes[start] == 0 && bytes[start + 1] & 0x80 == 0)
            || (bytes[start] == 0xff && bytes[start + 1] & 0x80 != 0))
    {
        start += 1;
    }
    Ok(bytes[start..].to_vec())
}

/// The scale of a decimal schema (0 when it is not one, or is a reference).
fn scale_of(schema: &apache_avro::Schema) -> usize {
    match schema {
        apache_avro::Schema::Decimal(d) => d.scale,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_are_written_from_their_text() {
        for (text, scale, shown, bytes) in [
            ("12.50", 2, "12.50", &[0x04, 0xe2][..]),
            ("-12.5", 2, "-12.50", &[0xfb, 0x1e]),
            ("0.005", 3, "0.005", &[0x05]),
            ("123", 0, "123", &[0x7b]),
            ("128", 0, "128", &[0x00, 0x80]),
            ("-128", 0, "-128", &[0x80]),
            ("-0.01", 2, "-0.01", &[0xff]),
        ] {
            assert_eq!(decimal_bytes(text, scale).unwrap(), bytes, "{text}");
            assert_eq!(decimal_text(bytes, scale).unwrap(), shown, "{text}");
        }
        assert!(decimal_bytes("1.234", 2).unwrap_err().contains("decimal places"));
        assert!(decimal_bytes("abc", 2).is_err());
    }

    #[test]
    fn decimals_print_with_their_scale() {
        assert_eq!(decimal_text(&[0x04, 0xe2], 2).unwrap(), "12.50");
        assert_eq!(decimal_text(&[0xfb, 0x1e], 2).unwrap(), "-12.50");
        assert_eq!(decimal_text(&[0x05], 3).unwrap(), "0.005");
        assert_eq!(decimal_text(&[0x7b], 0).unwrap(), "123");
        assert_eq!(decimal_text(&[], 2).unwrap(), "0.00");
    }

    #[test]
    fn an_avro_record_reads_as_plain_json_and_back() {
        let text = r#"{"type":"record","name":"R","fields":[
            {"name":"id","type":"string"},{"name":"n","type":["null","long"]},
            {"name":"tags","type":{"type":"array","items":"string"}},
            {"name":"b","type":"bytes"},
            {"name":"e","type":{"type":"enum","name":"E","symbols":["A","B"]}}]}"#;
        let declared = Declared::parse(&sluice_wire::Schema::avro(text)).unwrap();
        let json: Json = serde_json::json!({"id": "x", "n": 7, "tags": ["a", "b"], "b": "\u{00ff}A", "e": "B"});
        let payload = from_json(&declared, &json).unwrap();
        let writer = WriterSchema {
            id: 1,
            kind: sluice_wire::SchemaKind::Avro,
            text: text.into(),
            imports: Vec::new(),
            parsed: Parsed::parse(sluice_wire::SchemaKind::Avro, text, &[]).unwrap(),
        };
        assert_eq!(
            to_json(&writer, &payload).unwrap(),
            json,
            "unions unwrapped, bytes as code points"
        );
        let wrong = serde_json::json!({"id": 3});
        assert!(from_json(&declared, &wrong)
            .unwrap_err()
            .contains("does not fit the schema"));
    }

    /// A record anyone with write access to the topic wrote: `sluice consume` must not build
    /// what its counts claim before it knows the bytes hold it (two million nulls take no
    /// bytes each in Avro, and half a gigabyte as decoded values).
    #[test]
    fn a_hostile_avro_record_is_refused_before_it_is_decoded() {
        let text = r#"{"type":"record","name":"R","fields":[{"name":"a","type":{"type":"array","items":"null"}}]}"#;
        let writer = WriterSchema {
            id: 9,
            kind: sluice_wire::SchemaKind::Avro,
            text: text.into(),
            imports: Vec::new(),
            parsed: Parsed::parse(sluice_wire::SchemaKind::Avro, text, &[]).unwrap(),
        };
        let mut payload = Vec::new();
        crate::formats::avro::default::write_long(2_000_000, &mut payload);
        payload.push(0);
        let e = to_json(&writer, &payload).unwrap_err();
        assert!(e.contains("schema id 9") && e.contains("field a"), "{e}");
        // A string longer than the record: named, not read.
        let text = r#"{"type":"record","name":"S","fields":[{"name":"s","type":"string"}]}"#;
        let writer = WriterSchema {
            text: text.into(),
            parsed: Parsed::parse(sluice_wire::SchemaKind::Avro, text, &[]).unwrap(),
            ..writer
        };
        let mut payload = Vec::new();
        crate::formats::avro::default::write_long(400 << 20, &mut payload);
        let e = to_json(&writer, &payload).unwrap_err();
        assert!(e.contains("field s"), "{e}");
    }
}
