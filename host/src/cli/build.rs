//! `sluice build [DIR]`: builds a topology project into a component and says where it wrote
//! it. A Python project (`pyproject.toml` with `[tool.sluice]`) is built by the Python SDK
//! (`python -m sluice_guest.build`, componentize-py underneath); a Rust one (`Cargo.toml`) by
//! `cargo build --release` for `wasm32-wasip2`.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{bail, Context};

#[derive(Debug, clap::Args)]
pub struct BuildArgs {
    /// The project's directory.
    #[arg(default_value = ".")]
    dir: PathBuf,
    /// The Python to build a Python project with (it needs componentize-py; default:
    /// $SLUICE_PYTHON, then the venv `dev/setup-python` makes, then `python3`).
    #[arg(long, value_name = "PATH")]
    python: Option<PathBuf>,
    /// Where the component goes (default: `build/NAME.wasm` in a Python project; cargo's own
    /// place in a Rust one).
    #[arg(long, short, value_name = "FILE")]
    output: Option<PathBuf>,
}

/// The Python SDK next to this build of sluice, in its repository.
pub fn built_in_python_sdk() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("guest-sdk-python")
}

/// The Python a Python project is built with.
fn python(asked: Option<PathBuf>) -> PathBuf {
    if let Some(p) = asked.or_else(|| std::env::var_os("SLUICE_PYTHON").map(PathBuf::from)) {
        return p;
    }
    let cache = std::env::var_os("SLUICE_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|c| PathBuf::from(c).join("sluice")))
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/sluice")));
    if let Some(venv) = cache.map(|c| c.join("python/componentize-py-0.25.1/bin/python")) {
        if venv.exists() {
            return venv;
        }
    }
    PathBuf::from("python3")
}

/// `[tool.sluice] sdk` of a pyproject.toml, if it names one.
fn python_sdk_of(pyproject: &Path) -> anyhow::Result<Option<PathBuf>> {
    let text = std::fs::read_to_string(pyproject).with_context(|| format!("reading {}", pyproject.display()))?;
    let doc: toml::Table = text
        .parse()
        .with_context(|| format!("{} is not valid TOML", pyproject.display()))?;
    let sluice = doc.get("tool").and_then(|t| t.get("sluice"));
    if sluice.is_none() {
        bail!(
            "{} has no [tool.sluice] table: it is not a Sluice topology project (`sluice new --python` writes one)",
            pyproject.display()
        );
    }
    Ok(sluice
        .and_then(|s| s.get("sdk"))
        .and_then(|s| s.as_str())
        .map(|s| pyproject.parent().unwrap_or(Path::new(".")).join(s)))
}

pub fn run(args: BuildArgs) -> anyhow::Result<ExitCode> {
    let dir = &args.dir;
    let pyproject = dir.join("pyproject.toml");
    if pyproject.exists() {
        let sdk = python_sdk_of(&pyproject)?.unwrap_or_else(built_in_python_sdk);
        let python = python(args.python);
        let mut command = Command::new(&python);
        command.args(["-m", "sluice_guest.build"]).arg(dir);
        if let Some(out) = &args.output {
            command.arg("--output").arg(out);
        }
        if sdk.join("sluice_guest").exists() {
            let mut path = std::ffi::OsString::from(&sdk);
            if let Some(old) = std::env::var_os("PYTHONPATH") {
                path.push(":");
                path.push(old);
            }
            command.env("PYTHONPATH", path);
        }
        let status = command
            .status()
            .with_context(|| format!("running {} (pass --python PATH)", python.display()))?;
        return Ok(if status.success() {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        });
    }
    let cargo_toml = dir.join("Cargo.toml");
    if cargo_toml.exists() {
        let status = Command::new("cargo")
            .args(["build", "--release", "--target", "wasm32-wasip2"])
            .current_dir(dir)
            .status()
            .context("running cargo")?;
        if !status.success() {
            bail!("cargo build failed");
        }
        let manifest: toml::Table = std::fs::read_to_string(&cargo_toml)?.parse()?;
        let name = manifest
            .get("package")
            .and_then(|p| p.get("name"))
            .and_then(|n| n.as_str())
            .context("Cargo.toml has no [package] name")?
            .replace('-', "_");
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| dir.join("target"));
        let built = target.join("wasm32-wasip2/release").join(format!("{name}.wasm"));
        if !built.exists() {
            bail!("cargo built, but {} is not there", built.display());
        }
        let built = match &args.output {
            Some(out) => {
                std::fs::copy(&built, out).with_context(|| format!("copying to {}", out.display()))?;
                out.clone()
            }
            None => built,
        };
        println!("{}", built.display());
        return Ok(ExitCode::SUCCESS);
    }
    bail!(
        "{} has neither a pyproject.toml (a Python topology) nor a Cargo.toml (a Rust one)",
        dir.display()
    )
}
