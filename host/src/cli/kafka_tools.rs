//! `sluice topics|produce|consume`: just enough of a Kafka client to feed and watch a demo
//! without a second tool.

use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context as _};
use clap::{Args, Subcommand};
use futures::StreamExt;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;
use sluice::kafka::{Authorize as _, Authorized};

#[derive(Debug, Args)]
pub struct Connection {
    /// Kafka bootstrap servers, `host:port[,host:port…]`.
    #[arg(long, env = "KAFKA_BOOTSTRAP")]
    pub bootstrap: String,
    #[command(flatten)]
    pub kafka: super::kafka_args::KafkaArgs,
}

impl Connection {
    /// A client configuration, once the brokers answer as the settings say (a wrong
    /// password or CA fails here within seconds, naming the broker and what failed).
    async fn config(&self) -> anyhow::Result<(sluice::kafka::KafkaSettings, ClientConfig)> {
        let settings = self.settings().await?;
        sluice::group::connection::check_brokers(&settings, std::time::Duration::from_secs(15))
            .await
            .context("connecting to Kafka")?;
        let config = settings.client();
        Ok((settings, config))
    }

    /// The Kafka settings of these flags, checked (with OAUTHBEARER, with a first token).
    pub async fn settings(&self) -> anyhow::Result<sluice::kafka::KafkaSettings> {
        self.kafka
            .settings(&self.bootstrap)?
            .start_tokens()
            .await
            .map_err(anyhow::Error::msg)
    }
}

#[derive(Debug, Args)]
pub struct TopicsArgs {
    #[command(subcommand)]
    command: TopicsCommand,
}

#[derive(Debug, Subcommand)]
enum TopicsCommand {
    /// Create topics (an existing topic is left as it is).
    Create {
        #[command(flatten)]
        connection: Connection,
        /// Partitions per topic.
        #[arg(long, default_value_t = 1)]
        partitions: i32,
        /// Replication factor.
        #[arg(long, default_value_t = 1)]
        replication: i32,
        #[arg(required = true)]
        topics: Vec<String>,
    },
}

pub async fn topics(args: TopicsArgs) -> anyhow::Result<ExitCode> {
    let TopicsCommand::Create {
        connection,
        partitions,
        replication,
        topics,
    } = args.command;
    let (kafka, config) = connection.config().await?;
    let admin: Authorized<AdminClient<DefaultClientContext>> = config.authorized(&kafka)?;
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|t| NewTopic::new(t, partitions, TopicReplication::Fixed(replication)))
        .collect();
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    for result in admin.create_topics(&new, &options).await? {
        match result {
            Ok(topic) => eprintln!("created topic {topic} ({partitions} partitions)"),
            Err((topic, RDKafkaErrorCode::TopicAlreadyExists)) => eprintln!("topic {topic} exists"),
            Err((topic, code)) => bail!("creating topic {topic}: {code}"),
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// How a key or value is written and read by `produce` and `consume`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RecordFormat {
    /// UTF-8 text, as it is (what other tools write).
    Text,
    /// Avro in the Confluent wire format, with its schema in the registry.
    Avro,
    /// Protobuf in the Confluent wire format.
    Protobuf,
    /// JSON Schema in the Confluent wire format.
    JsonSchema,
}

impl RecordFormat {
    fn kind(self) -> Option<sluice_wire::SchemaKind> {
        match self {
            RecordFormat::Text => None,
            RecordFormat::Avro => Some(sluice_wire::SchemaKind::Avro),
            RecordFormat::Protobuf => Some(sluice_wire::SchemaKind::Protobuf),
            RecordFormat::JsonSchema => Some(sluice_wire::SchemaKind::JsonSchema),
        }
    }
}

/// The flags of a format for keys or values, and the registry they need.
#[derive(Debug, Args)]
pub struct Formats {
    /// How values are written (`produce`) or read (`consume`).
    #[arg(long, value_enum, default_value = "text")]
    value_format: RecordFormat,
    /// How keys are written or read.
    #[arg(long, value_enum, default_value = "text")]
    key_format: RecordFormat,
    #[command(flatten)]
    registry: super::registry_args::RegistryArgs,
}

impl Formats {
    /// The worker-style schema cache for these flags, when a format needs the registry.
    fn schemas(&self) -> anyhow::Result<Option<sluice::formats::Schemas>> {
        if self.value_format == RecordFormat::Text && self.key_format == RecordFormat::Text {
            return Ok(None);
        }
        let Some(settings) = self.registry.settings()? else {
            bail!(
                "--value-format and --key-format other than text need a schema registry: --schema-registry-url \
                 (or --registry, or SLUICE_SCHEMA_REGISTRY_URL)"
            );
        };
        let client = sluice::formats::RegistryClient::new(settings).map_err(|e| anyhow::anyhow!(e))?;
        Ok(Some(sluice::formats::Schemas::new(
            Some(client),
            tokio::runtime::Handle::current(),
            64 << 20,
        )))
    }
}

/// How long a tool waits for the registry's answer.
const REGISTRY_WAIT: Duration = Duration::from_secs(30);

#[derive(Debug, Args)]
pub struct ProduceArgs {
    #[command(flatten)]
    connection: Connection,
    #[command(flatten)]
    formats: Formats,
    /// The value schema (`.avsc`, `.proto` or a JSON Schema file), registered under the
    /// topic's subject (`TOPIC-value`).
    #[arg(long, value_name = "FILE")]
    schema: Option<std::path::PathBuf>,
    /// The key schema, registered under `TOPIC-key`.
    #[arg(long, value_name = "FILE")]
    key_schema: Option<std::path::PathBuf>,
    /// Protobuf: the value's message (`package.Message`; default: the file's first).
    #[arg(long, value_name = "NAME")]
    message: Option<String>,
    /// Protobuf: the key's message.
    #[arg(long, value_name = "NAME")]
    key_message: Option<String>,
    /// The topic to write to.
    topic: String,
}

/// A schema file as a declared schema: `.proto` imports beside it (Google's well-known
/// types aside) are read too.
fn schema_from_file(
    kind: sluice_wire::SchemaKind,
    path: &std::path::Path,
    message: Option<&str>,
) -> anyhow::Result<sluice::formats::Declared> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading the schema {}", path.display()))?;
    let schema = match kind {
        sluice_wire::SchemaKind::Avro => sluice_wire::Schema::avro(text),
        sluice_wire::SchemaKind::JsonSchema => sluice_wire::Schema::json_schema(text),
        sluice_wire::SchemaKind::Protobuf => {
            let dir = path.parent().unwrap_or(std::path::Path::new("."));
            let mut imports: Vec<(String, String)> = Vec::new();
            let mut todo = proto_imports(&text);
            while let Some(import) = todo.pop() {
                if import.starts_with("google/protobuf/") || imports.iter().any(|(p, _)| *p == import) {
                    continue;
                }
                let file = dir.join(&import);
                let imported = std::fs::read_to_string(&file)
                    .with_context(|| format!("reading {} (imported by {})", file.display(), path.display()))?;
                todo.extend(proto_imports(&imported));
                imports.push((import, imported));
            }
            let message = match message {
                Some(m) => m.to_string(),
                None => sluice::formats::protobuf::ProtoSchema::parse(&text, &imports)
                    .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
                    .first_message()
                    .ok_or_else(|| anyhow::anyhow!("{} defines no message", path.display()))?,
            };
            imports
                .into_iter()
                .fold(sluice_wire::Schema::protobuf(text, message), |s, (p, t)| s.import(p, t))
        }
    };
    sluice::formats::Declared::parse(&schema).map_err(|e| anyhow::anyhow!("the schema {}: {e}", path.display()))
}

/// The files a `.proto` text imports.
fn proto_imports(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| {
            let l = l.trim();
            let rest = l.strip_prefix("import")?.trim_start();
            let rest = rest
                .strip_prefix("public")
                .or_else(|| rest.strip_prefix("weak"))
                .unwrap_or(rest)
                .trim_start();
            let quoted = rest.strip_prefix('"')?;
            quoted.split_once('"').map(|(p, _)| p.to_string())
        })
        .collect()
}

/// How one part (key or value) of each line is written: as text, or framed with a schema.
struct Writer {
    declared: Option<(std::sync::Arc<sluice::formats::Declared>, u32)>,
}

impl Writer {
    async fn new(
        schemas: Option<&sluice::formats::Schemas>,
        format: RecordFormat,
        schema: Option<&std::path::Path>,
        message: Option<&str>,
        subject: String,
        flag: &str,
    ) -> anyhow::Result<Writer> {
        let Some(kind) = format.kind() else {
            return Ok(Writer { declared: None });
        };
        let Some(schema) = schema else {
            bail!(
                "--{flag}-format {} needs its schema: --{}",
                kind.name(),
                if flag == "value" {
                    "schema FILE"
                } else {
                    "key-schema FILE"
                }
            );
        };
        let declared = std::sync::Arc::new(schema_from_file(kind, schema, message)?);
        let schemas = schemas.expect("a registry for a format");
        let id = schemas
            .subject_id_now(&subject, &declared, true, REGISTRY_WAIT)
            .await
            .map_err(|e| anyhow::anyhow!(e))?;
        eprintln!(
            "{} schema {} is id {id} under subject {subject}",
            flag,
            schema.display()
        );
        Ok(Writer {
            declared: Some((declared, id)),
        })
    }

    /// `text` (a line's part) as the bytes to send.
    fn bytes(&self, text: &str) -> anyhow::Result<Vec<u8>> {
        let Some((declared, id)) = &self.declared else {
            return Ok(text.as_bytes().to_vec());
        };
        let json: serde_json::Value =
            serde_json::from_str(text).map_err(|e| anyhow::anyhow!("{text:?} is not JSON: {e}"))?;
        let payload = sluice::formats::json_io::from_json(declared, &json).map_err(|e| anyhow::anyhow!(e))?;
        let mut out = Vec::with_capacity(payload.len() + 8);
        sluice::formats::framing::write_header(*id, &mut out);
        if let (sluice::formats::Parsed::Protobuf(file), Some(message)) = (&declared.parsed, &declared.message) {
            let indexes = file.indexes_of(message).expect("checked when parsed");
            sluice::formats::framing::write_message_indexes(&indexes, &mut out);
        }
        out.extend_from_slice(&payload);
        Ok(out)
    }
}

pub async fn produce(args: ProduceArgs) -> anyhow::Result<ExitCode> {
    let schemas = args.formats.schemas()?;
    let values = Writer::new(
        schemas.as_ref(),
        args.formats.value_format,
        args.schema.as_deref(),
        args.message.as_deref(),
        format!("{}-value", args.topic),
        "value",
    )
    .await?;
    let keys = Writer::new(
        schemas.as_ref(),
        args.formats.key_format,
        args.key_schema.as_deref(),
        args.key_message.as_deref(),
        format!("{}-key", args.topic),
        "key",
    )
    .await?;
    let (kafka, mut config) = args.connection.config().await?;
    let producer: Authorized<FutureProducer> = config.set("enable.idempotence", "true").authorized(&kafka)?;
    let lines: Vec<String> = std::io::stdin().lock().lines().collect::<Result<_, _>>()?;
    let mut records = Vec::with_capacity(lines.len());
    for (n, line) in lines.iter().enumerate() {
        let (key, value) = match line.split_once('\t') {
            Some((k, v)) => (Some(k), v),
            None => (None, line.as_str()),
        };
        let key = key
            .map(|k| keys.bytes(k))
            .transpose()
            .with_context(|| format!("line {}: the key", n + 1))?;
        let value = values
            .bytes(value)
            .with_context(|| format!("line {}: the value", n + 1))?;
        records.push((key, value));
    }
    let sends = records.iter().map(|(key, value)| {
        let mut record = FutureRecord::<[u8], [u8]>::to(&args.topic).payload(value);
        if let Some(key) = key {
            record = record.key(key);
        }
        producer.send(record, Duration::from_secs(30))
    });
    let results = futures::future::join_all(sends).await;
    for (line, result) in lines.iter().zip(results) {
        result.map_err(|(e, _)| anyhow::anyhow!("producing {line:?} to {}: {e}", args.topic))?;
    }
    eprintln!("produced {} record(s) to {}", lines.len(), args.topic);
    Ok(ExitCode::SUCCESS)
}

#[derive(Debug, Args)]
pub struct ConsumeArgs {
    #[command(flatten)]
    connection: Connection,
    #[command(flatten)]
    formats: Formats,
    /// The topic to read, from the beginning.
    topic: String,
    /// Stop after this many records.
    #[arg(long)]
    max: Option<usize>,
    /// Stop when no record arrived for this long (e.g. `5s`).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    idle: Duration,
}

/// A key or value as it is printed: text as it is, a framed one as plain JSON read with its
/// writer schema (or why it cannot be).
async fn shown(schemas: Option<&sluice::formats::Schemas>, format: RecordFormat, bytes: Option<&[u8]>) -> String {
    let Some(bytes) = bytes else {
        return String::new();
    };
    let (Some(schemas), Some(_)) = (schemas, format.kind()) else {
        return String::from_utf8_lossy(bytes).into_owned();
    };
    let read = async {
        let framed = sluice::formats::framing::split(bytes).map_err(|e| e.to_string())?;
        let writer = schemas.writer_now(framed.id, REGISTRY_WAIT).await?;
        sluice::formats::json_io::to_json(&writer, framed.rest)
    };
    match read.await {
        Ok(json) => json.to_string(),
        Err(e) => format!("(not readable: {e})"),
    }
}

pub async fn consume(args: ConsumeArgs) -> anyhow::Result<ExitCode> {
    let schemas = args.formats.schemas()?;
    let group = format!("sluice.consume.{}", uuid::Uuid::new_v4().simple());
    let (kafka, mut config) = args.connection.config().await?;
    let consumer: Authorized<StreamConsumer> = config
        .set("group.id", &group)
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .authorized(&kafka)?;
    consumer.subscribe(&[&args.topic])?;
    let mut stream = consumer.stream();
    let mut count = 0usize;
    while args.max.is_none_or(|max| count < max) {
        let message = match tokio::time::timeout(args.idle, stream.next()).await {
            Ok(Some(message)) => message.with_context(|| format!("reading {}", args.topic))?,
            Ok(None) | Err(_) => break,
        };
        let key = shown(schemas.as_ref(), args.formats.key_format, message.key()).await;
        let value = shown(schemas.as_ref(), args.formats.value_format, message.payload()).await;
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}/{} {key}\t{value}", message.partition(), message.offset())?;
        count += 1;
    }
    eprintln!("read {count} record(s) from {}", args.topic);
    Ok(ExitCode::SUCCESS)
}
