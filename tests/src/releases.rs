//! Earlier releases of Sluice, built from their git tags by `dev/previous` (which `dev/test`
//! runs): the upgrade tests run clusters of them beside this build.

use std::path::PathBuf;

/// The release before this one (keep in step with `dev/previous`'s default).
pub const PREVIOUS: &str = "v0.2.0";

/// Where `dev/previous` puts release `tag`: `$SLUICE_CACHE/releases/TAG` (the cache is the
/// target directory's parent, as `dev/env.sh` sets them up), or `SLUICE_RELEASES/TAG`.
fn release_dir(tag: &str) -> PathBuf {
    let root = std::env::var_os("SLUICE_RELEASES")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let target = crate::worker::target_dir();
            target.parent().map(|p| p.join("releases")).unwrap_or(target)
        });
    root.join(tag)
}

/// The previous release's `sluice` binary.
pub fn previous_binary() -> PathBuf {
    let path = release_dir(PREVIOUS).join("sluice");
    assert!(
        path.exists(),
        "{} is missing: build the previous release with `dev/previous {PREVIOUS}` (dev/test does)",
        path.display()
    );
    path
}

/// An example guest of the previous release, built with its SDK: `word_count` or
/// `uppercase`.
pub fn previous_guest(name: &str) -> PathBuf {
    let path = release_dir(PREVIOUS).join("guests").join(format!("{name}.wasm"));
    assert!(
        path.exists(),
        "{} is missing: build the previous release with `dev/previous {PREVIOUS}` (dev/test does)",
        path.display()
    );
    path
}
