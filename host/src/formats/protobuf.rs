//! Protobuf: `.proto` files compiled in memory with `protox` (Google's well-known types
//! built in, every other import given with the schema; nothing is read from disk), messages
//! found by Confluent's message indexes, and records checked by decoding them with
//! `prost-reflect` under the writer's descriptor.
//!
//! Protobuf needs no resolution between schemas: a reader ignores fields it does not know
//! and defaults those it misses. A record is handed over as written once it parses, and
//! once its message is the one the topology reads.

use prost_reflect::{DescriptorPool, DynamicMessage, FileDescriptor, MessageDescriptor};
use protox::file::{ChainFileResolver, File, FileResolver, GoogleFileResolver};

/// The name the schema's own file is compiled under (imports keep their paths).
const MAIN: &str = "sluice-schema.proto";
/// Most imports a schema may bring.
const MAX_IMPORTS: usize = 256;

/// A `.proto` file with its imports, compiled.
pub struct ProtoSchema {
    file: FileDescriptor,
}

impl std::fmt::Debug for ProtoSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProtoSchema")
            .field("package", &self.file.package_name())
            .finish()
    }
}

/// Files given in memory, by import path: `.proto` text, or a `FileDescriptorProto` in
/// base64 (what confluent-kafka's Python serializer registers, and registries such as
/// Apicurio give back as they were registered).
struct Given(Vec<(String, String)>);

impl FileResolver for Given {
    fn open_file(&self, name: &str) -> Result<File, protox::Error> {
        match self.0.iter().find(|(path, _)| path == name) {
            Some((path, text)) => match descriptor(text) {
                Some(mut proto) => {
                    proto.name = Some(path.clone());
                    Ok(File::from_file_descriptor_proto(proto))
                }
                None => File::from_source(path, text),
            },
            None => Err(protox::Error::file_not_found(name)),
        }
    }
}

/// `text` as a base64 `FileDescriptorProto`, if it is one (`.proto` text never is: it has
/// spaces, semicolons and braces, which base64 has not).
fn descriptor(text: &str) -> Option<prost_types::FileDescriptorProto> {
    use base64::Engine as _;
    let compact: String = text.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    if compact.is_empty()
        || !compact
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"+/=-_".contains(&b))
    {
        return None;
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(&compact)
        .or_else(|_| base64::engine::general_purpose::URL_SAFE.decode(&compact))
        .ok()?;
    prost::Message::decode(&bytes[..]).ok()
}

impl ProtoSchema {
    /// Compiles `text` with `imports` (import path, text); the error is protox's, naming the
    /// file and line.
    pub fn parse(text: &str, imports: &[(String, String)]) -> Result<ProtoSchema, String> {
        if imports.len() > MAX_IMPORTS {
            return Err(format!(
                "{} imports, more than the {MAX_IMPORTS} a schema may have",
                imports.len()
            ));
        }
        let mut files = vec![(MAIN.to_string(), text.to_string())];
        files.extend(imports.iter().cloned());
        let mut resolver = ChainFileResolver::new();
        resolver.add(Given(files));
        resolver.add(GoogleFileResolver::new());
        let mut compiler = protox::Compiler::with_file_resolver(resolver);
        compiler.include_imports(true);
        compiler
            .open_file(MAIN)
            .map_err(|e| format!("not a Protobuf schema: {}", e.to_string().replace(MAIN, "the schema")))?;
        let pool: DescriptorPool = compiler.descriptor_pool();
        let file = pool
            .get_file_by_name(MAIN)
            .ok_or_else(|| "not a Protobuf schema: it compiled to nothing".to_string())?;
        Ok(ProtoSchema { file })
    }

    /// The message at Confluent's message indexes: the index among the file's top-level
    /// messages, then among that one's nested messages, and so on.
    pub fn message_at(&self, indexes: &[usize]) -> Result<MessageDescriptor, String> {
        let mut messages: Vec<MessageDescriptor> = self.file.messages().collect();
        let mut found = None;
        for (depth, &i) in indexes.iter().enumerate() {
            let Some(m) = messages.get(i).cloned() else {
                return Err(format!(
                    "message indexes {indexes:?} point past the schema's messages (index {i} at depth {depth}, of {})",
                    messages.len()
                ));
            };
            messages = m.child_messages().collect();
            found = Some(m);
        }
        found.ok_or_else(|| "no message indexes".to_string())
    }

    /// The message named `full_name` (`package.Message`, nested as `package.Outer.Inner`).
    pub fn message(&self, full_name: &str) -> Option<MessageDescriptor> {
        self.file.parent_pool().get_message_by_name(full_name)
    }

    /// Confluent's message indexes of `message` within this file.
    pub fn indexes_of(&self, message: &MessageDescriptor) -> Option<Vec<usize>> {
        fn search(messages: Vec<MessageDescriptor>, want: &str, path: &mut Vec<usize>) -> bool {
            for (i, m) in messages.into_iter().enumerate() {
                path.push(i);
                if m.full_name() == want || search(m.child_messages().collect(), want, path) {
                    return true;
                }
                path.pop();
            }
            false
        }
        let mut path = Vec::new();
        search(self.file.messages().collect(), message.full_name(), &mut path).then_some(path)
    }

    /// The full name of the file's first message (what the record strategies name a subject
    /// after when a schema names no message).
    pub fn first_message(&self) -> Option<String> {
        self.file.messages().next().map(|m| m.full_name().to_string())
    }
}

/// Checks that `payload` is a `message` (decoding it, nested messages and strings
/// included); the error names what does not parse.
pub fn check(message: &MessageDescriptor, payload: &[u8]) -> Result<(), String> {
    DynamicMessage::decode(message.clone(), payload)
        .map(|_| ())
        .map_err(|e| format!("it does not parse as Protobuf message {}: {e}", message.full_name()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHOP: &str = r#"
        syntax = "proto3";
        package shop;
        import "google/protobuf/timestamp.proto";
        import "common/money.proto";
        message Order {
            string id = 1;
            common.Money total = 2;
            google.protobuf.Timestamp placed = 3;
            message Line { string sku = 1; int32 quantity = 2; }
            repeated Line lines = 4;
        }
        message Refund { string order_id = 1; }
    "#;
    const MONEY: &str = r#"
        syntax = "proto3";
        package common;
        message Money { string currency = 1; int64 units = 2; }
    "#;

    fn shop() -> ProtoSchema {
        ProtoSchema::parse(SHOP, &[("common/money.proto".into(), MONEY.into())]).unwrap()
    }

    #[test]
    fn messages_are_found_by_confluent_indexes_and_back() {
        let s = shop();
        assert_eq!(s.message_at(&[0]).unwrap().full_name(), "shop.Order");
        assert_eq!(s.message_at(&[1]).unwrap().full_name(), "shop.Refund");
        assert_eq!(s.message_at(&[0, 0]).unwrap().full_name(), "shop.Order.Line");
        let line = s.message("shop.Order.Line").unwrap();
        assert_eq!(s.indexes_of(&line), Some(vec![0, 0]));
        assert_eq!(s.indexes_of(&s.message("shop.Refund").unwrap()), Some(vec![1]));
        assert!(s.message_at(&[2]).unwrap_err().contains("point past"));
        assert!(s.message_at(&[0, 3]).is_err());
        // An imported message is not in this file: it has no indexes here.
        assert_eq!(s.indexes_of(&s.message("common.Money").unwrap()), None);
        assert_eq!(s.first_message().as_deref(), Some("shop.Order"));
    }

    #[test]
    fn a_base64_descriptor_as_confluent_kafkas_python_serializer_registers_it_is_read() {
        // What confluent-kafka 2.16 registered for `message Order { string id = 1; int32
        // quantity = 2; }` in package `shop`, as Apicurio gives it back.
        let registered =
            "ChBzaG9wL29yZGVyLnByb3RvEgRzaG9wIiUKBU9yZGVyEgoKAmlkGAEgASgJEhAKCHF1YW50aXR5GAIgASgFYgZwcm90bzM=";
        let s = ProtoSchema::parse(registered, &[]).unwrap();
        let order = s.message_at(&[0]).unwrap();
        assert_eq!(order.full_name(), "shop.Order");
        assert!(check(&order, &[0x0a, 0x02, b'o', b'1', 0x10, 0x03]).is_ok());
        assert!(descriptor("syntax = \"proto3\";").is_none());
    }

    #[test]
    fn a_missing_import_or_a_syntax_error_is_named() {
        let e = ProtoSchema::parse(SHOP, &[]).unwrap_err();
        assert!(e.contains("common/money.proto"), "{e}");
        let e = ProtoSchema::parse("syntax = \"proto3\"; message { }", &[]).unwrap_err();
        assert!(e.starts_with("not a Protobuf schema"), "{e}");
    }

    #[test]
    fn payloads_are_checked_against_the_message() {
        let s = shop();
        let order = s.message("shop.Order").unwrap();
        // field 1 (id), length-delimited "o1".
        assert!(check(&order, &[0x0a, 2, b'o', b'1']).is_ok());
        assert!(check(&order, &[]).is_ok(), "an empty message is a message");
        // A length past the end.
        let e = check(&order, &[0x0a, 9, b'o']).unwrap_err();
        assert!(e.contains("shop.Order"), "{e}");
        // A string field holding bytes that are not UTF-8.
        assert!(check(&order, &[0x0a, 2, 0xff, 0xfe]).is_err());
    }
}
