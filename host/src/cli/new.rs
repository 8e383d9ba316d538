//! `sluice new NAME`: a guest project of its own (outside any repository) that builds a
//! topology component and deploys with `sluice deploy`; `--dsl` writes it with the SDK's
//! stream DSL instead of the Processor API.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context as _};
use clap::Args;

#[derive(Debug, Args)]
pub struct NewArgs {
    /// The project's directory; its last component names the crate and the topology
    /// (lower-case letters, digits, '-' and '_', starting with a letter).
    path: PathBuf,
    /// The guest SDK to depend on, as a path (default: the SDK this build of sluice came
    /// from, when it is still there).
    #[arg(long, value_name = "DIR")]
    sdk: Option<PathBuf>,
    /// Write the topology with the SDK's stream DSL (a word count: streams, a repartition,
    /// a counting store), with a unit test, instead of the Processor API.
    #[arg(long)]
    dsl: bool,
    /// Write a Python project (`pyproject.toml`, the topology, its test, a manifest), built by
    /// `sluice build` with componentize-py; `--sdk` is then the Python SDK's directory.
    #[arg(long)]
    python: bool,
}

/// Where this build's guest SDK is (next to the host in its repository).
fn built_in_sdk() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("guest-sdk")
}

pub fn run(args: NewArgs) -> anyhow::Result<ExitCode> {
    let name = args
        .path
        .file_name()
        .and_then(|n| n.to_str())
        .context("the project's path must end in a name")?
        .to_string();
    let valid = name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    if !valid {
        bail!("{name:?} cannot name a topology crate: use lower-case letters, digits, '-' and '_', starting with a letter");
    }
    if args.path.exists() && std::fs::read_dir(&args.path)?.next().is_some() {
        bail!("{} exists and is not empty", args.path.display());
    }
    if args.python {
        return python(&args, &name);
    }
    let sdk = args.sdk.unwrap_or_else(built_in_sdk);
    let sdk = sdk
        .canonicalize()
        .with_context(|| format!("the guest SDK is not at {} (pass --sdk DIR)", sdk.display()))?;
    if !sdk.join("Cargo.toml").exists() {
        bail!("{} is not the guest SDK (no Cargo.toml); pass --sdk DIR", sdk.display());
    }
    let artifact = name.replace('-', "_");
    let files: [(&str, String); 5] = [
        (
            "Cargo.toml",
            format!(
                r#"[package]
name = "{name}"
version = "0.1.0"
edition = "2021"
publish = false

[lib]
crate-type = ["cdylib"]

[dependencies]
sluice-guest = {{ path = "{sdk}" }}

[profile.release]
lto = true
opt-level = 3
codegen-units = 1
panic = "abort"

# A project of its own, even inside another workspace.
[workspace]
"#,
                sdk = sdk.display().to_string().replace('\\', "/"),
            ),
        ),
        (
            ".cargo/config.toml",
            "# Topologies are WebAssembly components.\n[build]\ntarget = \"wasm32-wasip2\"\n".to_string(),
        ),
        (
            "src/lib.rs",
            if args.dsl {
                DSL_LIB.replace("NAME", &name)
            } else {
                PROCESSOR_LIB.replace("NAME", &name)
            },
        ),
        (
            &format!("{name}.toml"),
            if args.dsl {
                format!(
                    r#"# The topology's manifest: its name in the cluster and the topics it is bound to.
name = "{name}"
component = "target/wasm32-wasip2/release/{artifact}.wasm"

[sources]
lines = "{name}-lines"

[sinks]
totals = "{name}-totals"
"#
                )
            } else {
                format!(
                    r#"# The topology's manifest: its name in the cluster and the topics it is bound to.
name = "{name}"
component = "target/wasm32-wasip2/release/{artifact}.wasm"

[sources]
input = "{name}-in"

[sinks]
output = "{name}-out"
"#
                )
            },
        ),
        (
            "README.md",
            if args.dsl {
                format!(
                    r#"# {name}

A Sluice topology written with the stream DSL: a word count. Build it (a WebAssembly
component) and deploy it to a cluster:

```sh
cargo build --release
sluice topics create --partitions 4 {name}-lines {name}-totals      # once
sluice deploy target/wasm32-wasip2/release/{artifact}.wasm --manifest {name}.toml --admin HOST:PORT
sluice topologies describe {name} --admin HOST:PORT                  # its sub-topologies and operators
sluice query {name} counts SOME-WORD --admin HOST:PORT
```

Its unit test runs natively (the DSL's `TestDriver`, no broker):
`cargo test --target $(rustc -vV | sed -n 's/host: //p')`.

`rustup target add wasm32-wasip2` if the target is missing.
"#
                )
            } else {
                format!(
                    r#"# {name}

A Sluice topology. Build it (a WebAssembly component) and deploy it to a cluster:

```sh
cargo build --release
sluice topics create --partitions 4 {name}-in {name}-out      # once
sluice deploy target/wasm32-wasip2/release/{artifact}.wasm --manifest {name}.toml --admin HOST:PORT
sluice query {name} seen SOME-KEY --admin HOST:PORT
```

`rustup target add wasm32-wasip2` if the target is missing.
"#
                )
            },
        ),
    ];
    for (file, text) in &files {
        let path = args.path.join(file);
        std::fs::create_dir_all(path.parent().expect("a file in the project"))?;
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    println!("created {} (topology {name}); next:", args.path.display());
    println!("  cd {} && cargo build --release", args.path.display());
    println!("  sluice deploy target/wasm32-wasip2/release/{artifact}.wasm --manifest {name}.toml --admin HOST:PORT");
    Ok(ExitCode::SUCCESS)
}

/// A Python project: the topology (the Processor API, or with `--dsl` the stream DSL), its
/// test under plain CPython, a manifest and a README; `sluice build` builds it.
fn python(args: &NewArgs, name: &str) -> anyhow::Result<ExitCode> {
    let sdk = args.sdk.clone().unwrap_or_else(super::build::built_in_python_sdk);
    let sdk = sdk
        .canonicalize()
        .with_context(|| format!("the Python SDK is not at {} (pass --sdk DIR)", sdk.display()))?;
    if !sdk.join("sluice_guest").join("__init__.py").exists() {
        bail!(
            "{} is not the Python SDK (no sluice_guest/); pass --sdk DIR",
            sdk.display()
        );
    }
    let module = name.replace('-', "_");
    let sdk_text = sdk.display().to_string().replace('\\', "/");
    let attribute = if args.dsl { "word_count" } else { "Topology" };
    let (source, sink) = if args.dsl {
        ("lines", "totals")
    } else {
        ("input", "output")
    };
    let (source_topic, sink_topic) = if args.dsl {
        (format!("{name}-lines"), format!("{name}-totals"))
    } else {
        (format!("{name}-in"), format!("{name}-out"))
    };
    let (topology, test) = if args.dsl {
        (PYTHON_DSL_TOPOLOGY, PYTHON_DSL_TEST)
    } else {
        (PYTHON_TOPOLOGY, PYTHON_TEST)
    };
    let what = if args.dsl {
        "written with the stream DSL: a word count"
    } else {
        "with the Processor API: it upper-cases values and counts keys"
    };
    let query = if args.dsl { "counts SOME-WORD" } else { "seen SOME-KEY" };
    let files: [(String, String); 6] = [
        (
            "pyproject.toml".into(),
            format!(
                r#"[project]
name = "{name}"
version = "0.1.0"
requires-python = ">=3.11"

[tool.sluice]
# The topology `sluice build` makes a component of: module:attribute.
topology = "{module}:{attribute}"
# The Python SDK (sluice_guest) it is built and tested with.
sdk = "{sdk_text}"
"#
            ),
        ),
        (format!("{module}.py"), topology.replace("NAME", name)),
        (format!("test_{module}.py"), test.replace("MODULE", &module)),
        (
            "conftest.py".into(),
            format!(
                "# pytest finds the Python SDK here (what `sluice build` builds with, from pyproject.toml).\n\
                 import sys\n\nsys.path.insert(0, {sdk_text:?})\n"
            ),
        ),
        (
            format!("{name}.toml"),
            format!(
                r#"# The topology's manifest: its name in the cluster and the topics it is bound to.
name = "{name}"
component = "build/{name}.wasm"

[sources]
{source} = "{source_topic}"

[sinks]
{sink} = "{sink_topic}"
"#
            ),
        ),
        (
            "README.md".into(),
            format!(
                r#"# {name}

A Sluice topology in Python, {what}. Test it under plain CPython, build it (a WebAssembly
component, with componentize-py) and deploy it to a cluster:

```sh
python3 -m pytest                                             # its test, no broker
sluice build                                                  # writes build/{name}.wasm
sluice topics create --partitions 4 {source_topic} {sink_topic}      # once
sluice deploy build/{name}.wasm --manifest {name}.toml --admin HOST:PORT
sluice topologies describe {name} --admin HOST:PORT           # its sub-topologies and operators
sluice query {name} {query} --admin HOST:PORT
```

`sluice build` needs componentize-py 0.25.1 (`pip install componentize-py==0.25.1`, or the
Sluice repository's `dev/setup-python`). A component is about 19 MB (CPython is in it); a
worker compiles it once and keeps the compiled code. Import modules at the top of a file,
not inside functions: the component runs a snapshot of the interpreter taken at build time.
"#
            ),
        ),
    ];
    for (file, text) in &files {
        let path = args.path.join(file);
        std::fs::create_dir_all(path.parent().expect("a file in the project"))?;
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    println!("created {} (topology {name}, Python); next:", args.path.display());
    println!("  cd {} && python3 -m pytest && sluice build", args.path.display());
    println!("  sluice deploy build/{name}.wasm --manifest {name}.toml --admin HOST:PORT");
    Ok(ExitCode::SUCCESS)
}

/// The Python scaffold's topology.
const PYTHON_TOPOLOGY: &str = r#""""A topology: upper-cases every value and counts the records of each key in a store."""

from sluice_guest import Description, Processor, Store, Str, U64


class Topology(Processor):
    @classmethod
    def describe(cls):
        return Description("NAME").source("input").sink("output").store("seen")

    def init(self, task):
        # Records seen per key (kept in RocksDB on the workers, backed by a changelog).
        self.seen = Store("seen", key=Str, value=U64)

    def process(self, record, ctx):
        text = record.value_as()  # fails the task if the value is not UTF-8
        if record.key is not None:
            key = record.key_as()
            self.seen.put(key, self.seen.get(key, 0) + 1)
        ctx.emit("output", record.key, text.upper())
"#;

/// The Python scaffold's test.
const PYTHON_TEST: &str = r#"from sluice_guest import Str, U64
from sluice_guest.testing import TestDriver

from MODULE import Topology


def test_upper_cases_and_counts_keys():
    driver = TestDriver(Topology)
    driver.pipe_batch("input", [("a", "hello", 1), ("a", "again", 2), (None, "no key", 3)])
    assert driver.read("output") == [(b"a", b"HELLO", 1), (b"a", b"AGAIN", 2), (None, b"NO KEY", 3)]
    assert driver.store("seen", Str, U64) == {"a": 2}
"#;

/// The Processor API scaffold.
const PROCESSOR_LIB: &str = r#"//! A topology: upper-cases every value and counts the records of each key in a store.

use sluice_guest::{export, Context, Description, Error, Processor, Record, Store, TaskInfo};

struct Topology {
    /// Records seen per key (kept in RocksDB on the workers, backed by a changelog).
    seen: Store<String, u64>,
}

impl Processor for Topology {
    fn describe() -> Description {
        Description::new("NAME").source("input").sink("output").store("seen")
    }

    fn init(_task: &TaskInfo) -> Result<Self, Error> {
        Ok(Topology { seen: Store::open("seen")? })
    }

    fn process(&mut self, record: &Record<'_>, ctx: &mut Context) -> Result<(), Error> {
        let text: &str = record.value_as()?;
        if record.key().is_some() {
            let key: String = record.key_as()?;
            let seen = self.seen.get(&key)?.unwrap_or(0) + 1;
            self.seen.put(&key, &seen)?;
        }
        ctx.emit("output", record.key(), &text.to_uppercase())
    }
}

export!(Topology);
"#;

/// The Python DSL scaffold: a word count in two stages.
const PYTHON_DSL_TOPOLOGY: &str = r#""""A topology written with the stream DSL: a word count. Lines are split into words, each
word goes (through a repartition topic the host creates) to the task that counts it, and
every new count goes to `totals`. `sluice topologies describe NAME` shows the two
sub-topologies this compiles to, and their operators."""

from sluice_guest import Str
from sluice_guest.dsl import Unit, topology


@topology("NAME")
def word_count(b):
    (b.stream("lines", key=Unit, value=Str)  # keys ignored, values UTF-8 text
      .flat_map_values(lambda line: line.lower().split())
      .group_by(lambda _, word: word, key=Str)  # a new key: repartitioned through "words"
      .named("words")
      .count("counts")  # the store "counts": word -> count (U64), queryable
      .to_stream()
      .to("totals"))
"#;

/// The Python DSL scaffold's test.
const PYTHON_DSL_TEST: &str = r#"from sluice_guest import Str, U64
from sluice_guest.dsl.testing import TestDriver

from MODULE import word_count


def test_counts_every_word():
    driver = TestDriver(word_count)
    driver.pipe("lines", None, "the cat and the hat", 1_000)
    assert driver.store("counts", Str, U64)["the"] == 2
    totals = driver.read("totals", Str, U64)
    assert len(totals) == 5, "one update per word"
    assert totals[-2] == ("the", 2, 1_000)
"#;

/// The DSL scaffold: a word count in two stages, and its unit test.
const DSL_LIB: &str = r#"//! A topology written with the stream DSL: a word count. Lines are split into words, each
//! word goes (through a repartition topic the host creates) to the task that counts it,
//! and every new count goes to `totals`. `sluice topologies describe NAME` shows the two
//! sub-topologies this compiles to, and their operators.

use sluice_guest::dsl::StreamsBuilder;

fn topology(b: &mut StreamsBuilder) {
    b.stream::<(), String>("lines") // keys ignored, values UTF-8 text
        .flat_map_values(|line| line.split_whitespace().map(str::to_lowercase).collect::<Vec<_>>())
        .group_by(|_, word| word.clone()) // a new key: repartitioned through "words"
        .named("words")
        .count("counts") // the store "counts": word -> count, queryable
        .to_stream()
        .to("totals");
}

sluice_guest::export_dsl!("NAME", topology);

#[cfg(test)]
mod tests {
    use sluice_guest::dsl::testing::TestDriver;

    #[test]
    fn counts_every_word() {
        let mut driver = TestDriver::new("NAME", super::topology).unwrap();
        driver.pipe("lines", (), "the cat and the hat".to_string(), 1_000).unwrap();
        let counts = driver.store::<String, u64>("counts").unwrap();
        assert!(counts.contains(&("the".to_string(), 2)), "{counts:?}");
        let totals = driver.read::<String, Option<u64>>("totals").unwrap();
        assert_eq!(totals.len(), 5, "one update per word");
    }
}
"#;
