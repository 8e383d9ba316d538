//! The host's layers, as `docs/architecture.md` draws them, checked against the source: a
//! module refers only to modules of its own layer or below, and no two top-level modules
//! refer to each other (directly or around a loop).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each top-level module of the library and its layer (lowest first).
const LAYERS: &[(&str, u32)] = &[
    ("kafka", 1),
    ("secret", 1),
    ("tls", 1),
    ("web", 1),
    ("oidc", 1),
    ("manifest", 1),
    ("group", 1),
    ("state", 1),
    ("runtime", 1),
    ("metrics", 1),
    ("formats", 1),
    ("topology", 2),
    ("registry", 2),
    ("acls", 2),
    ("task", 3),
    ("threads", 4),
    ("worker", 5),
    ("admin", 6),
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The `.rs` files under `dir`.
fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("reading the source tree") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file belongs to (`task` for `task/batch.rs`), if it is one of
/// the library's (the binary's `cli/` and `main.rs`, and `lib.rs`, are not layered).
fn module_of(file: &Path) -> Option<&'static str> {
    let rel = file.strip_prefix(src()).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    LAYERS.iter().map(|(m, _)| *m).find(|m| *m == name)
}

/// The top-level modules a source text names as `crate::<module>`.
fn referenced(text: &str) -> BTreeSet<&'static str> {
    let mut out = BTreeSet::new();
    for (at, _) in text.match_indices("crate::") {
        // `sluice::crate::` cannot occur; `$crate::` in macros would not be ours.
        if text[..at].ends_with('$') {
            continue;
        }
        let rest = &text[at + "crate::".len()..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if let Some((m, _)) = LAYERS.iter().find(|(m, _)| *m == name) {
            out.insert(*m);
        }
    }
    // `use crate::{a, b::c}` names several.
    for (at, _) in text.match_indices("use crate::{") {
        let rest = &text[at + "use crate::{".len()..];
        let list = &rest[..rest.find("};").unwrap_or(rest.len())];
        for part in list.split([',', '{', '}']) {
            let name = part.trim().split("::").next().unwrap_or_default();
            if let Some((m, _)) = LAYERS.iter().find(|(m, _)| *m == name) {
                out.insert(*m);
            }
        }
    }
    out
}

#[test]
fn every_module_refers_only_to_its_layer_and_below_and_no_modules_refer_to_each_other() {
    let layer: BTreeMap<&str, u32> = LAYERS.iter().copied().collect();
    let mut all = Vec::new();
    files(&src(), &mut all);
    let mut edges: BTreeMap<&str, BTreeMap<&str, Vec<String>>> = BTreeMap::new();
    let mut problems = Vec::new();
    for file in &all {
        let Some(module) = module_of(file) else { continue };
        let text = std::fs::read_to_string(file).expect("reading a source file");
        let shown = file.strip_prefix(src()).unwrap().display().to_string();
        for other in referenced(&text) {
            if other == module {
                continue;
            }
            if layer[other] > layer[module] {
                problems.push(format!(
                    "{shown} ({module}, layer {}) refers to {other} (layer {}), a layer above it",
                    layer[module], layer[other]
                ));
            }
            edges
                .entry(module)
                .or_default()
                .entry(other)
                .or_default()
                .push(shown.clone());
        }
    }
    // No loop between modules: a depth-first search from each.
    fn reaches<'a>(
        edges: &BTreeMap<&'a str, BTreeMap<&'a str, Vec<String>>>,
        from: &'a str,
        to: &str,
        seen: &mut BTreeSet<&'a str>,
    ) -> bool {
        let Some(next) = edges.get(from) else { return false };
        next.keys()
            .any(|n| *n == to || (seen.insert(n) && reaches(edges, n, to, seen)))
    }
    for (module, next) in &edges {
        for (other, files) in next {
            if reaches(&edges, other, module, &mut BTreeSet::new()) {
                problems.push(format!(
                    "{module} refers to {other} (in {}), and {other} leads back to {module}",
                    files.join(", ")
                ));
            }
        }
    }
    assert!(problems.is_empty(), "the layers are broken:\n{}", problems.join("\n"));
}

#[test]
fn the_check_sees_what_it_checks() {
    // A check that found nothing to look at would pass for any tree.
    let found = referenced("use crate::task::state::StateEnv;\nuse crate::{kafka::KafkaSettings, metrics};\n");
    assert_eq!(found, BTreeSet::from(["kafka", "metrics", "task"]));
    let mut all = Vec::new();
    files(&src(), &mut all);
    let layered = all.iter().filter(|f| module_of(f).is_some()).count();
    assert!(
        layered > 40,
        "only {layered} files of the library were found under {}",
        src().display()
    );
}
