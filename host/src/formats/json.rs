//! JSON Schema: documents compiled once with the `jsonschema` crate into a validator. A
//! `$ref` to another document is served only from the schema's own references (the
//! registry's, or those the topology gives); nothing is fetched from the network or read
//! from disk, whatever a schema's `$ref` says.

use std::sync::Arc;

use serde_json::Value;

/// Most imports a schema may bring.
const MAX_IMPORTS: usize = 256;

/// A JSON Schema document, compiled.
pub struct JsonSchema {
    validator: jsonschema::Validator,
    /// The schema's `title`: what the record strategies name a subject after.
    title: Option<String>,
}

impl std::fmt::Debug for JsonSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JsonSchema").field("title", &self.title).finish()
    }
}

/// Serves `$ref`s from the documents given with a schema, matched by their name as the end
/// of the URI asked for.
struct Given(Arc<Vec<(String, Value)>>);

impl jsonschema::Retrieve for Given {
    fn retrieve(&self, uri: &jsonschema::Uri<String>) -> Result<Value, Box<dyn std::error::Error + Send + Sync>> {
        let asked = uri.as_str();
        self.0
            .iter()
            .find(|(name, _)| asked == name || asked.ends_with(&format!("/{name}")))
            .map(|(_, doc)| doc.clone())
            .ok_or_else(|| format!("{asked} is not one of the schema's references (nothing else is fetched)").into())
    }
}

impl JsonSchema {
    /// Compiles `text` with the documents it refers to (`imports`: name, text).
    pub fn parse(text: &str, imports: &[(String, String)]) -> Result<JsonSchema, String> {
        if imports.len() > MAX_IMPORTS {
            return Err(format!(
                "{} references, more than the {MAX_IMPORTS} a schema may have",
                imports.len()
            ));
        }
        let schema: Value = serde_json::from_str(text).map_err(|e| format!("not a JSON Schema: not JSON: {e}"))?;
        let mut docs = Vec::with_capacity(imports.len());
        for (name, doc) in imports {
            let value: Value =
                serde_json::from_str(doc).map_err(|e| format!("its reference {name:?} is not JSON: {e}"))?;
            docs.push((name.clone(), value));
        }
        let validator = jsonschema::options()
            .with_retriever(Given(Arc::new(docs)))
            .build(&schema)
            .map_err(|e| format!("not a JSON Schema: {e}"))?;
        let title = schema.get("title").and_then(Value::as_str).map(str::to_string);
        Ok(JsonSchema { validator, title })
    }

    pub fn title(&self) -> Option<&str> {
        self.title.as_deref()
    }

    /// Checks `bytes` as JSON and, with `validate`, against the schema; the error names the
    /// place in the document and the rule it breaks.
    pub fn check(&self, bytes: &[u8], validate: bool) -> Result<(), String> {
        if !validate {
            return check_json(bytes);
        }
        let value: Value = serde_json::from_slice(bytes).map_err(|e| format!("it is not JSON: {e}"))?;
        match self.validator.validate(&value) {
            Ok(()) => Ok(()),
            Err(e) => {
                let at = e.instance_path().to_string();
                Err(format!(
                    "it does not match its JSON Schema at {}: {e}",
                    if at.is_empty() { "the top".to_string() } else { at }
                ))
            }
        }
    }
}

/// Checks that `bytes` are one JSON text, without building it.
pub fn check_json(bytes: &[u8]) -> Result<(), String> {
    serde_json::from_slice::<serde::de::IgnoredAny>(bytes)
        .map(|_| ())
        .map_err(|e| format!("it is not JSON: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ORDER: &str = r#"{
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "Order",
        "type": "object",
        "properties": {
            "id": { "type": "string" },
            "amount": { "type": "number", "minimum": 0 },
            "customer": { "$ref": "customer.json" }
        },
        "required": ["id", "amount"]
    }"#;
    const CUSTOMER: &str =
        r#"{ "type": "object", "properties": { "name": { "type": "string" } }, "required": ["name"] }"#;

    fn order() -> JsonSchema {
        JsonSchema::parse(ORDER, &[("customer.json".into(), CUSTOMER.into())]).unwrap()
    }

    #[test]
    fn records_are_validated_and_the_error_names_the_place() {
        let s = order();
        assert_eq!(s.title(), Some("Order"));
        assert!(s
            .check(br#"{"id":"o1","amount":3.5,"customer":{"name":"Ann"}}"#, true)
            .is_ok());
        let e = s.check(br#"{"id":"o1","amount":-1}"#, true).unwrap_err();
        assert!(e.contains("/amount"), "{e}");
        let e = s.check(br#"{"id":"o1","amount":1,"customer":{}}"#, true).unwrap_err();
        assert!(e.contains("/customer"), "{e}");
        let e = s.check(br#"{"amount":1}"#, true).unwrap_err();
        assert!(e.contains("the top") && e.contains("id"), "{e}");
        // Not validated on read unless asked: JSON is enough.
        assert!(s.check(br#"{"amount":-1}"#, false).is_ok());
        assert!(s.check(b"{not json", false).unwrap_err().starts_with("it is not JSON"));
        assert!(s.check(b"{} {}", false).is_err(), "one JSON text, not two");
    }

    /// Anyone who may register a schema writes its patterns: one that backtracks
    /// exponentially (a back-reference makes the engine a backtracking one) over a record
    /// built for it stops at the engine's step limit, as an error, instead of holding the
    /// thread.
    #[test]
    fn a_pattern_that_backtracks_without_end_is_an_error_not_a_hung_thread() {
        let schema = JsonSchema::parse(
            r#"{"$schema":"http://json-schema.org/draft-07/schema#","type":"string","pattern":"^(a|aa)+\\1$"}"#,
            &[],
        )
        .unwrap();
        let record = format!("\"{}c\"", "a".repeat(40));
        let started = std::time::Instant::now();
        let e = schema.check(record.as_bytes(), true).unwrap_err();
        assert!(e.contains("does not match") && e.contains("backtracking"), "{e}");
        // 2^40 steps would take hours; the limit is a million.
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn a_ref_outside_the_references_is_not_fetched() {
        let schema = r#"{"type":"object","properties":{"x":{"$ref":"https://example.com/evil.json"}}}"#;
        let e = JsonSchema::parse(schema, &[]).unwrap_err();
        assert!(e.contains("evil.json"), "{e}");
        let e = JsonSchema::parse(r#"{"$ref":"file:///etc/passwd"}"#, &[]).unwrap_err();
        assert!(e.contains("passwd"), "{e}");
    }
}
