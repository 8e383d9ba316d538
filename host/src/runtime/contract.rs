//! The contract a component must be built for: which versions of the `sluice:topology`
//! world this host runs, and the check of a component's imports and exports against it
//! before it is linked.

use wasmtime::component::Component;
use wasmtime::Engine;

use super::LoadError;

/// The version of the WIT world this host speaks (`package sluice:topology@…` in wit/).
pub const WIT_VERSION: &str = "0.2.0";
/// The earlier version whose components this host still runs (as one sub-topology).
pub const WIT_VERSION_V1: &str = "0.1.0";

/// What a topology's `processor` export must hold.
pub(super) const PROCESSOR_FUNCTIONS: [&str; 5] = ["describe", "init", "process", "punctuate", "close"];

/// The contract version a component was built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ContractVersion {
    V1,
    V2,
}

/// Which contract a `sluice:topology` interface of version `found` belongs to, if it is
/// one this host links (wasmtime's rule: the same major version, or for 0.x the same minor).
pub(super) fn contract_of(found: &str) -> Option<ContractVersion> {
    let key = |v: &str| -> Option<(u64, u64)> {
        let mut parts = v.split(['.', '-', '+']);
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        Some(if major == 0 { (0, minor) } else { (major, 0) })
    };
    let found = key(found)?;
    if Some(found) == key(WIT_VERSION) {
        Some(ContractVersion::V2)
    } else if Some(found) == key(WIT_VERSION_V1) {
        Some(ContractVersion::V1)
    } else {
        None
    }
}

/// Whether an export is the topology world's `processor` (of any version).
pub(super) fn is_processor(export: &str) -> bool {
    export.split('@').next() == Some("sluice:topology/processor")
}

/// The error for a component that does not export `processor`: it exports `exports`.
pub(super) fn not_a_topology(path: &str, exports: &[String]) -> LoadError {
    LoadError::WrongWorld {
        path: path.to_string(),
        detail: format!(
            "it exports {}, not sluice:topology/processor@{WIT_VERSION}: it is not a Sluice topology \
             (write one with the sluice-guest SDK; `sluice new` scaffolds a project)",
            if exports.is_empty() {
                "nothing".to_string()
            } else {
                exports.join(", ")
            }
        ),
    }
}

/// Checks what a component imports and exports against the topology world, before
/// linking it: so a component of another world, of another version of ours, or missing an
/// export gets an error that says which.
pub(super) fn check_world(engine: &Engine, component: &Component, path: &str) -> Result<ContractVersion, LoadError> {
    use wasmtime::component::types::ComponentItem;
    let ty = component.component_type();
    let ours = |name: &str| name.starts_with("sluice:topology/");
    let version = |name: &str| name.split_once('@').map_or(String::new(), |(_, v)| v.to_string());
    let wrong_version = |found: String| LoadError::WrongVersion {
        path: path.to_string(),
        found: if found.is_empty() { "(no version)".into() } else { found },
    };
    // Components of both versions import the host's interfaces of 0.1.0 (they have not
    // changed); a 0.2.0 component imports the types of 0.2.0 too.
    for (name, _) in ty.imports(engine).filter(|(n, _)| ours(n)) {
        if contract_of(&version(name)).is_none() {
            return Err(wrong_version(version(name)));
        }
    }
    let exports: Vec<(String, ComponentItem)> = ty.exports(engine).map(|(n, e)| (n.to_string(), e.ty)).collect();
    let Some((name, item)) = exports.iter().find(|(n, _)| is_processor(n)) else {
        let list: Vec<String> = exports.iter().map(|(n, _)| n.clone()).collect();
        return Err(not_a_topology(path, &list));
    };
    let Some(contract) = contract_of(&version(name)) else {
        return Err(wrong_version(version(name)));
    };
    if let ComponentItem::ComponentInstance(instance) = item {
        let have: Vec<String> = instance.exports(engine).map(|(n, _)| n.to_string()).collect();
        let missing: Vec<String> = PROCESSOR_FUNCTIONS
            .iter()
            .filter(|f| !have.iter().any(|h| h == *f))
            .map(|f| f.to_string())
            .collect();
        if !missing.is_empty() {
            return Err(LoadError::MissingExport {
                path: path.to_string(),
                missing,
            });
        }
    }
    Ok(contract)
}

#[cfg(test)]
mod tests {
    use super::{contract_of, ContractVersion};

    #[test]
    fn the_guest_sdks_copy_of_the_wit_is_the_hosts() {
        assert_eq!(
            include_str!("../../../wit/topology.wit"),
            include_str!("../../../guest-sdk/wit/topology.wit"),
            "guest-sdk/wit/topology.wit differs from wit/topology.wit: copy it over"
        );
        assert_eq!(
            include_str!("../../../wit/deps/topology-0.1.0/topology.wit"),
            include_str!("../../../guest-sdk/wit/deps/topology-0.1.0/topology.wit"),
            "guest-sdk/wit/deps/topology-0.1.0/topology.wit differs from wit/'s: copy it over"
        );
        assert_eq!(
            include_str!("../../../wit/topology.wit"),
            include_str!("../../../guest-sdk-python/sluice_guest/wit/topology.wit"),
            "guest-sdk-python/sluice_guest/wit/topology.wit differs from wit/topology.wit: copy it over"
        );
        assert_eq!(
            include_str!("../../../wit/deps/topology-0.1.0/topology.wit"),
            include_str!("../../../guest-sdk-python/sluice_guest/wit/deps/topology-0.1.0/topology.wit"),
            "guest-sdk-python/sluice_guest/wit/deps/topology-0.1.0/topology.wit differs from wit/'s: copy it over"
        );
    }

    #[test]
    fn the_versions_the_host_names_are_the_wits() {
        let wit = include_str!("../../../wit/topology.wit");
        assert!(
            wit.contains(&format!("package sluice:topology@{};", super::WIT_VERSION)),
            "WIT_VERSION differs from wit/topology.wit's package version"
        );
        let v1 = include_str!("../../../wit/deps/topology-0.1.0/topology.wit");
        assert!(v1.contains(&format!("package sluice:topology@{};", super::WIT_VERSION_V1)));
        assert_eq!(contract_of("0.2.0"), Some(ContractVersion::V2));
        assert_eq!(contract_of("0.2.3"), Some(ContractVersion::V2));
        assert_eq!(contract_of("0.1.0"), Some(ContractVersion::V1));
        assert_eq!(contract_of("0.1.7"), Some(ContractVersion::V1));
        for other in ["0.3.0", "1.1.0", "0.9.0", ""] {
            assert_eq!(contract_of(other), None, "{other}");
        }
    }
}
