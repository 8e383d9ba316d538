//! `sluice state`: look into a worker's local state (while that worker is stopped).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use sluice::state::dir::task_dir;
use sluice::state::engine::Storage;
use sluice::state::rocks::{RocksStorage, SharedMemory};

#[derive(Debug, Args)]
pub struct StateArgs {
    #[command(subcommand)]
    command: StateCommand,
}

#[derive(Debug, Subcommand)]
enum StateCommand {
    /// Print every entry of one task's store as `hex(key) hex(value)`, in key order.
    Dump {
        #[arg(long, default_value = "sluice-state", env = "SLUICE_STATE_DIR")]
        state_dir: PathBuf,
        #[arg(long)]
        topology: String,
        /// The sub-topology, in a topology of several.
        #[arg(long)]
        subtopology: Option<String>,
        #[arg(long)]
        partition: u32,
        #[arg(long)]
        store: String,
    },
}

pub fn run(args: StateArgs) -> anyhow::Result<ExitCode> {
    let StateCommand::Dump {
        state_dir,
        topology,
        subtopology,
        partition,
        store,
    } = args.command;
    let task = sluice::group::TaskId::of(&topology, subtopology.as_deref(), partition);
    let path = task_dir(&state_dir, &task).join(&store);
    if !path.exists() {
        anyhow::bail!(
            "no state at {}: check --state-dir, --topology, --subtopology, --partition and --store",
            path.display()
        );
    }
    let storage = RocksStorage::new(SharedMemory::new(8 << 20, 8 << 20));
    let db = storage
        .open(&path)
        .map_err(|e| anyhow::anyhow!("{e} (is a worker still using it?)"))?;
    let mut out = std::io::stdout().lock();
    // Entries are copied one at a time: a store larger than memory dumps too.
    let mut cursor = db.cursor(None);
    cursor.seek_to_first();
    while let (Some(k), Some(v)) = (cursor.key(), cursor.value()) {
        writeln!(out, "{} {}", hex(k), hex(v))?;
        cursor.next();
    }
    cursor.status()?;
    Ok(ExitCode::SUCCESS)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
