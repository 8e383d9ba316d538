//! A tenant's `max-topologies` and `max-tasks`, judged on the registry as every worker reads
//! it. An upload checks them against what its worker has read, but two uploads through two
//! workers at once each pass that check; so a worker that loads uploaded topologies judges
//! them again, each tenant's in the order they were first uploaded, and does not run those
//! past a limit. Every worker reads the same registry, so every worker refuses the same ones.

use std::collections::BTreeMap;

use super::tenants::{Tenancy, ADMIN};
use super::Entry;

/// The topologies (by name) past their tenant's limits, each with the reason.
pub fn over_quota<'a>(entries: impl IntoIterator<Item = &'a Entry>, tenancy: &Tenancy) -> BTreeMap<String, String> {
    let mut by_tenant: BTreeMap<&str, Vec<&Entry>> = BTreeMap::new();
    for e in entries {
        if e.tenant != ADMIN {
            by_tenant.entry(e.tenant.as_str()).or_default().push(e);
        }
    }
    let mut over = BTreeMap::new();
    for (name, mut mine) in by_tenant {
        let Some(tenant) = tenancy.tenant(name) else { continue };
        mine.sort_by_key(|e| (e.first_uploaded_ms(), e.name.clone()));
        let (mut topologies, mut tasks) = (0u32, 0u32);
        for e in mine {
            if tenant.max_topologies.is_some_and(|max| topologies + 1 > max) {
                over.insert(
                    e.name.clone(),
                    format!(
                        "topology {}: its tenant {name} has {topologies} older topologies, its limit (max-topologies = {}); \
                         delete one",
                        e.name,
                        tenant.max_topologies.unwrap_or_default()
                    ),
                );
                continue;
            }
            if tenant.max_tasks.is_some_and(|max| tasks + e.partitions > max) {
                over.insert(
                    e.name.clone(),
                    format!(
                        "topology {}: its {} tasks and the {tasks} of its tenant {name}'s older topologies are over its \
                         limit (max-tasks = {})",
                        e.name,
                        e.partitions,
                        tenant.max_tasks.unwrap_or_default()
                    ),
                );
                continue;
            }
            topologies += 1;
            tasks += e.partitions;
        }
    }
    over
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::tenants::{RawTenant, TenancyConfig};

    fn entry(name: &str, tenant: &str, partitions: u32, first: i64) -> Entry {
        Entry {
            name: name.into(),
            version: 1,
            manifest: String::new(),
            digest: String::new(),
            size: 0,
            chunks: 0,
            uploaded_at_ms: first + 1_000,
            created_at_ms: first,
            partitions,
            subtopologies: vec![],
            internal_topics: vec![],
            sources: vec![],
            sinks: vec![],
            stores: vec![],
            operators: vec![],
            tenant: tenant.into(),
            caps: Default::default(),
            offsets_epoch: 0,
            reprocess_from: None,
        }
    }

    fn tenancy() -> Tenancy {
        let raw = RawTenant {
            tokens: vec![],
            namespace: "a.".into(),
            max_topologies: Some(1),
            max_tasks: Some(2),
            max_memory: None,
            max_host_memory: None,
            max_call_timeout: None,
            max_state: None,
            max_records_per_second: None,
            max_deploys_per_minute: None,
        };
        Tenancy::from_config(TenancyConfig {
            tenants: [("alpha".to_string(), raw)].into(),
            ..Default::default()
        })
        .unwrap()
    }

    /// Five uploads that raced past their workers' checks: the first uploaded runs, the
    /// others are refused, and an upgrade of the first (uploaded last) keeps its place.
    #[test]
    fn uploads_that_raced_past_the_limit_are_refused_in_upload_order() {
        let t = tenancy();
        let mut entries: Vec<Entry> = (0..5).map(|i| entry(&format!("a.t{i}"), "alpha", 2, 100 + i)).collect();
        entries[0].uploaded_at_ms = 9_999;
        entries[0].version = 2;
        let over = over_quota(&entries, &t);
        assert_eq!(
            over.keys().cloned().collect::<Vec<_>>(),
            ["a.t1", "a.t2", "a.t3", "a.t4"]
        );
        assert!(over["a.t1"].contains("max-topologies = 1"), "{}", over["a.t1"]);
        let admin = entry("anything", ADMIN, 100, 1);
        assert!(over_quota([&admin], &t).is_empty(), "the admin has no quota");
    }

    #[test]
    fn tasks_count_in_upload_order_too() {
        let t = tenancy();
        let entries = [entry("a.big", "alpha", 3, 5)];
        let over = over_quota(&entries, &t);
        assert!(over["a.big"].contains("max-tasks = 2"), "{over:?}");
    }
}
