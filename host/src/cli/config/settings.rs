//! Every worker setting: its key in the configuration file, the `sluice worker` argument it
//! sets, and how its value is written.

/// How a setting's value is written in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// A string or a number, as the flag takes it.
    Value,
    /// A number of milliseconds, or a duration with its unit (`"1s"`, `"250ms"`).
    Millis,
    /// A number of bytes, or a size with its unit (`"64MiB"`).
    Bytes,
    /// `true` or `false`: the flag given or not.
    Flag,
    /// `true` or `false`, the opposite of the flag (`guest.pooling = false` is `--no-pooling`).
    NotFlag,
    /// A path, relative to the file's directory.
    Path,
    /// A list of paths (one flag per item), relative to the file's directory.
    Paths,
}

/// A worker setting: its key in the file and the `sluice worker` argument it sets.
#[derive(Debug)]
pub struct Setting {
    pub key: &'static str,
    /// The clap id of the argument (the field name in `WorkerSettings`).
    pub arg: &'static str,
    pub(super) kind: Kind,
}

const fn s(key: &'static str, arg: &'static str, kind: Kind) -> Setting {
    Setting { key, arg, kind }
}

/// Every setting of a worker, with its key in the configuration file. Kafka Streams' name
/// where one means the same thing (`num.standby.replicas`, `acceptable.recovery.lag`,
/// `state.dir`, `group.instance.id`…), otherwise the flag's name in the same style.
pub const SETTINGS: &[Setting] = &[
    s("bootstrap.servers", "bootstrap", Kind::Value),
    s("cluster.name", "cluster", Kind::Value),
    s("topologies", "topologies", Kind::Paths),
    s("processing.guarantee", "processing_guarantee", Kind::Value),
    s("num.stream.threads", "threads", Kind::Value),
    s("num.standby.replicas", "standby_replicas", Kind::Value),
    s("max.learner.tasks", "max_learner_tasks", Kind::Value),
    s("acceptable.recovery.lag", "acceptable_recovery_lag", Kind::Value),
    s(
        "standby.restore.records.per.second",
        "standby_restore_rate",
        Kind::Value,
    ),
    s("learner.rejoin", "learner_rejoin", Kind::Value),
    s("commit.interval.ms", "commit_interval", Kind::Millis),
    s("idle.commit.interval.ms", "idle_commit_interval", Kind::Millis),
    s(
        "repartition.purge.interval.ms",
        "repartition_purge_interval",
        Kind::Millis,
    ),
    s("punctuate.interval.ms", "punctuate_interval", Kind::Millis),
    s("batch.max.records", "batch_size", Kind::Value),
    s("batch.max.bytes", "max_batch_bytes", Kind::Bytes),
    s("prefetch.max.bytes", "prefetch", Kind::Bytes),
    s(
        "changelog.replication.factor",
        "changelog_replication_factor",
        Kind::Value,
    ),
    s(
        "changelog.min.insync.replicas",
        "changelog_min_insync_replicas",
        Kind::Value,
    ),
    s("guest.memory.max.bytes", "memory_limit", Kind::Bytes),
    s("guest.host.memory.max.bytes", "host_memory_limit", Kind::Bytes),
    s("guest.call.timeout.ms", "call_timeout", Kind::Millis),
    s("guest.max.instances", "max_instances", Kind::Value),
    s("guest.pooling", "no_pooling", Kind::NotFlag),
    s("compile.cache.dir", "compile_cache", Kind::Path),
    s("compile.cache.enabled", "no_compile_cache", Kind::NotFlag),
    s("component.max.bytes", "max_component_size", Kind::Bytes),
    s("component.max.functions", "max_component_functions", Kind::Value),
    s("component.max.code", "max_component_code", Kind::Bytes),
    s("component.compile.timeout.ms", "compile_timeout", Kind::Millis),
    s("component.compile.max.bytes", "compile_memory", Kind::Bytes),
    s("worker.capacity", "capacity", Kind::Value),
    s("group.instance.id", "instance_id", Kind::Value),
    s("session.timeout.ms", "session_timeout", Kind::Millis),
    s("heartbeat.interval.ms", "heartbeat_interval", Kind::Millis),
    s("task.assignor", "assignor", Kind::Value),
    s("release.failed.tasks", "release_failed_tasks", Kind::Flag),
    s("drain.on.stop", "no_drain_on_stop", Kind::NotFlag),
    s("scale.down.timeout.ms", "scale_down_timeout", Kind::Millis),
    s("state.dir", "state_dir", Kind::Path),
    s("state.block.cache.bytes", "state_cache", Kind::Bytes),
    s("state.write.buffer.bytes", "state_write_buffers", Kind::Bytes),
    s("state.max.bytes", "state_limit", Kind::Bytes),
    s("admin.listener", "metrics", Kind::Value),
    s("admin.advertised.listener", "advertise_admin", Kind::Value),
    s("admin.metrics.public", "private_metrics", Kind::NotFlag),
    s("admin.allow.open", "allow_open_admin", Kind::Flag),
    s("admin.tls.cert", "admin_tls_cert", Kind::Path),
    s("admin.tls.key", "admin_tls_key", Kind::Path),
    s("admin.tls.ca", "admin_tls_ca", Kind::Path),
    s("admin.max.connections", "admin_max_connections", Kind::Value),
    s("admin.request.timeout.ms", "admin_request_timeout", Kind::Millis),
    s("admin.jwt.issuer", "admin_jwt_issuer", Kind::Value),
    s("admin.jwt.audience", "admin_jwt_audience", Kind::Value),
    s("admin.jwt.jwks.url", "admin_jwt_jwks_url", Kind::Value),
    s("admin.jwt.algorithms", "admin_jwt_algorithms", Kind::Value),
    s("admin.jwt.leeway.ms", "admin_jwt_leeway", Kind::Millis),
    s("admin.jwt.tenant.claim", "admin_jwt_tenant_claim", Kind::Value),
    s("admin.jwt.role.claim", "admin_jwt_role_claim", Kind::Value),
    s("admin.jwt.ssl.ca.location", "admin_jwt_ssl_ca_location", Kind::Path),
    s("admin.jwt.jwks.refresh.ms", "admin_jwt_jwks_refresh", Kind::Millis),
    s(
        "admin.jwt.jwks.min.refresh.ms",
        "admin_jwt_jwks_min_refresh",
        Kind::Millis,
    ),
    s("registry.secret", "registry_secret", Kind::Value),
    s("schema.registry.url", "schema_registry_url", Kind::Value),
    s("schema.registry.user", "schema_registry_user", Kind::Value),
    s(
        "schema.registry.password.file",
        "schema_registry_password_file",
        Kind::Path,
    ),
    s(
        "schema.registry.bearer.token.file",
        "schema_registry_bearer_token_file",
        Kind::Path,
    ),
    s(
        "schema.registry.ssl.ca.location",
        "schema_registry_ssl_ca_location",
        Kind::Path,
    ),
    s(
        "schema.registry.request.timeout.ms",
        "schema_registry_request_timeout",
        Kind::Millis,
    ),
    s("schema.registry.cache.max.bytes", "schema_cache", Kind::Bytes),
    s("registry.secret.file", "registry_secret_file", Kind::Path),
    s("kafka.security.protocol", "kafka_security_protocol", Kind::Value),
    s("kafka.sasl.mechanism", "kafka_sasl_mechanism", Kind::Value),
    s("kafka.sasl.username", "kafka_sasl_username", Kind::Value),
    s("kafka.sasl.password", "kafka_sasl_password", Kind::Value),
    s("kafka.sasl.password.file", "kafka_sasl_password_file", Kind::Path),
    s(
        "kafka.sasl.oauthbearer.token.endpoint.url",
        "kafka_sasl_oauthbearer_token_endpoint_url",
        Kind::Value,
    ),
    s(
        "kafka.sasl.oauthbearer.client.id",
        "kafka_sasl_oauthbearer_client_id",
        Kind::Value,
    ),
    s(
        "kafka.sasl.oauthbearer.client.secret.file",
        "kafka_sasl_oauthbearer_client_secret_file",
        Kind::Path,
    ),
    s(
        "kafka.sasl.oauthbearer.scope",
        "kafka_sasl_oauthbearer_scope",
        Kind::Value,
    ),
    s(
        "kafka.sasl.oauthbearer.audience",
        "kafka_sasl_oauthbearer_audience",
        Kind::Value,
    ),
    s("kafka.https.ca.location", "kafka_https_ca_location", Kind::Path),
    s("kafka.ssl.ca.location", "kafka_ssl_ca_location", Kind::Path),
    s(
        "kafka.ssl.certificate.location",
        "kafka_ssl_certificate_location",
        Kind::Path,
    ),
    s("kafka.ssl.key.location", "kafka_ssl_key_location", Kind::Path),
    s("kafka.ssl.key.password", "kafka_ssl_key_password", Kind::Value),
    s(
        "kafka.ssl.endpoint.identification.algorithm",
        "kafka_ssl_endpoint_identification_algorithm",
        Kind::Value,
    ),
];
