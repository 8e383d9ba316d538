//! The `sluice` command: runs workers and offers small Kafka tools for demos and operations.

mod cli;

use std::process::ExitCode;

fn main() -> ExitCode {
    // The command line, with the configuration file layered under the environment and flags.
    let (args, layered) = match cli::config::parse(std::env::args_os().collect()) {
        Ok(parsed) => parsed,
        Err(e) => {
            eprintln!("sluice: error: {e:#}");
            return ExitCode::from(2);
        }
    };
    cli::init_logging(args.log.as_deref());
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("sluice: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(cli::run(args, layered)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("sluice: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
