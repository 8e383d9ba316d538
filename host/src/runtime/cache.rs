//! The compile cache: components compiled by Cranelift, kept on disk as wasmtime's
//! serialized form, keyed by the component's SHA-256 and the engine's compatibility hash
//! (wasmtime's version and every setting that changes the code). A worker that restarts,
//! or loads an upload another version of it compiled before, skips compiling: seconds for a
//! large component become milliseconds.
//!
//! Loading serialized code trusts it (it is machine code), so the cache lives in the
//! worker's own state directory, each file is written whole (to a temporary name, then
//! renamed), and each carries the SHA-256 of its bytes: a file that does not match, or that
//! wasmtime refuses, is removed and the component compiled again.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use wasmtime::component::Component;
use wasmtime::Engine;

/// Most compiled components kept; the least recently written go first.
const MAX_ENTRIES: usize = 64;

pub struct Cache<'a> {
    dir: &'a Path,
    engine: &'a Engine,
    /// The engine's compatibility hash, hex.
    engine_key: String,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl<'a> Cache<'a> {
    pub fn new(dir: &'a Path, engine: &'a Engine) -> Cache<'a> {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        Cache {
            dir,
            engine,
            engine_key: format!("{:016x}", hasher.finish()),
        }
    }

    fn path(&self, component: &[u8]) -> PathBuf {
        let digest = hex(&Sha256::digest(component));
        self.dir.join(format!("{digest}-{}.cwasm", self.engine_key))
    }

    /// The component compiled before for this engine, if the cache holds it intact.
    pub fn get(&self, component: &[u8]) -> Option<Component> {
        let path = self.path(component);
        let bytes = std::fs::read(&path).ok()?;
        let check = std::fs::read_to_string(path.with_extension("sha256")).ok();
        if check.as_deref().map(str::trim) != Some(hex(&Sha256::digest(&bytes)).as_str()) {
            tracing::warn!(file = %path.display(), "a compiled component in the cache is damaged; compiling again");
            self.remove(&path);
            return None;
        }
        // SAFETY: the bytes are what `Component::serialize` wrote for an engine with this
        // compatibility hash, in the worker's own directory, checked against their SHA-256;
        // wasmtime checks the header (version, settings) again and refuses a mismatch.
        match unsafe { Component::deserialize(self.engine, &bytes) } {
            Ok(component) => Some(component),
            Err(e) => {
                tracing::warn!(file = %path.display(), "wasmtime refused a compiled component in the cache ({e:#}); compiling again");
                self.remove(&path);
                None
            }
        }
    }

    /// Keeps `compiled` (the compilation of `component`). Failing to is not an error: the
    /// next load compiles again.
    pub fn put(&self, component: &[u8], compiled: &Component) {
        let path = self.path(component);
        let written = (|| -> std::io::Result<()> {
            std::fs::create_dir_all(self.dir)?;
            let bytes = compiled.serialize().map_err(std::io::Error::other)?;
            let tmp = path.with_extension(format!("tmp-{}", uuid::Uuid::new_v4().simple()));
            std::fs::write(&tmp, &bytes)?;
            std::fs::write(path.with_extension("sha256"), hex(&Sha256::digest(&bytes)))?;
            std::fs::rename(&tmp, &path)
        })();
        match written {
            Ok(()) => self.prune(),
            Err(e) => tracing::warn!(dir = %self.dir.display(), "cannot keep a compiled component: {e}"),
        }
    }

    fn remove(&self, path: &Path) {
        let _ = std::fs::remove_file(path);
        let _ = std::fs::remove_file(path.with_extension("sha256"));
    }

    /// Removes the oldest entries past [`MAX_ENTRIES`].
    fn prune(&self) {
        let Ok(entries) = std::fs::read_dir(self.dir) else {
            return;
        };
        let mut files: Vec<(std::time::SystemTime, PathBuf)> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "cwasm"))
            .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
            .collect();
        if files.len() <= MAX_ENTRIES {
            return;
        }
        files.sort();
        for (_, path) in &files[..files.len() - MAX_ENTRIES] {
            self.remove(path);
        }
    }
}

/// Removes every compiled form of the component whose SHA-256 is `digest` (hex), for any
/// engine.
pub fn forget(dir: &Path, digest: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let prefix = format!("{digest}-");
    for entry in entries.flatten() {
        let name = entry.file_name();
        if name.to_string_lossy().starts_with(&prefix) {
            match std::fs::remove_file(entry.path()) {
                Ok(()) => {
                    tracing::debug!(file = %entry.path().display(), "removed a compiled component no topology uses")
                }
                Err(e) => tracing::warn!(file = %entry.path().display(), "removing a compiled component: {e}"),
            }
        }
    }
}
