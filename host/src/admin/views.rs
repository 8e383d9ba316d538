//! What each caller may see of the worker: its status and its metrics, cut down to the
//! caller's own topologies. The admin and other workers see everything; a tenant sees the
//! worker-level fields and its own topologies' tasks, handovers and series; a caller
//! without a token (public metrics) sees the worker-level series only, nothing named after
//! a topology or a task.

use crate::registry::tenants::Caller;
use crate::worker::board::{Narrowed, WorkerStatus};
use crate::worker::WorkerHandle;

/// Whether `who` may see what is named after `topology` (a registry entry's name), or all.
fn visibility(worker: &WorkerHandle, who: Option<&Caller>) -> impl Fn(&str) -> bool {
    let tenant = match who {
        Some(Caller::Tenant(t)) => Some(Some(t.name.clone())),
        Some(Caller::Admin | Caller::Worker | Caller::Operator) => None,
        None => Some(None),
    };
    let snapshot = tenant
        .as_ref()
        .and_then(|t| t.as_ref())
        .and_then(|_| worker.registry().map(|r| r.snapshot()));
    move |topology: &str| match &tenant {
        None => true,
        Some(None) => false,
        Some(Some(name)) => snapshot
            .as_ref()
            .is_some_and(|s| s.entries.get(topology).is_some_and(|(e, _)| e.tenant == *name)),
    }
}

/// The topology a task id (`<topology>/<partition>`, `<topology>/<sub>/<partition>`) is of.
fn topology_of(task: &str) -> &str {
    task.split_once('/').map_or(task, |(t, _)| t)
}

/// The worker's status as `who` may see it: every part named after a task (its tasks with
/// their errors, standbys and learners, and the handovers) only for the caller's topologies.
/// A tenant's answer names the tenant and its topologies (`narrowed_to`), so a reader of
/// several workers' answers can narrow what it learns elsewhere (the group) the same way.
pub(super) fn status_for(worker: &WorkerHandle, who: &Caller) -> WorkerStatus {
    let status = worker.status();
    let mut status = filter_status(status, visibility(worker, Some(who)));
    if let Caller::Tenant(t) = who {
        let topologies = worker.registry().map_or_else(Vec::new, |r| {
            let snapshot = r.snapshot();
            let mine = snapshot.entries.iter().filter(|(_, (e, _))| e.tenant == t.name);
            mine.map(|(name, _)| name.to_string()).collect()
        });
        status.narrowed_to = Some(Narrowed {
            tenant: t.name.clone(),
            topologies,
        });
    }
    status
}

fn filter_status(mut status: WorkerStatus, visible: impl Fn(&str) -> bool) -> WorkerStatus {
    // Every field of `WorkerStatus` is listed, so a new one cannot be shown unfiltered
    // without a decision here.
    let WorkerStatus {
        release: _,
        metadata_version: _,
        generation: _,
        leader: _,
        leaving: _,
        rebalancing: _,
        rebalances: _,
        last_rebalance_seconds: _,
        rebalance_seconds_total: _,
        tasks,
        handovers,
        compiles,
        narrowed_to: _,
    } = &mut status;
    tasks.retain(|t| visible(topology_of(&t.task)));
    handovers.retain(|h| visible(topology_of(&h.task)));
    // A compile of no known topology (a component loaded by path) shows to no tenant.
    compiles.retain(|c| visible(&c.topology));
    status
}

/// The Prometheus text of the worker's metrics as `who` may see them (none: a caller
/// without a token, when metrics are public).
pub(super) fn metrics_for(worker: &WorkerHandle, who: Option<&Caller>) -> String {
    let text = worker.metrics_text();
    if matches!(who, Some(Caller::Admin | Caller::Worker | Caller::Operator)) {
        return text;
    }
    filter_metrics(&text, visibility(worker, who))
}

/// Keeps the comment lines and every sample that names no topology and no task, and of
/// those that do, the ones `visible` lets through. A sample whose labels cannot be read is
/// dropped.
fn filter_metrics(text: &str, visible: impl Fn(&str) -> bool) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let keep = line.starts_with('#')
            || line.trim().is_empty()
            || match owner_of_sample(line) {
                Ok(None) => true,
                Ok(Some(topology)) => visible(&topology),
                Err(()) => false,
            };
        if keep {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The topology a sample line is about: its `topology` label, else its `task` label's
/// topology; none for a worker-level sample. Err: labels that do not parse.
fn owner_of_sample(line: &str) -> Result<Option<String>, ()> {
    let Some(open) = line.find('{') else {
        return Ok(None);
    };
    if line[..open].contains(' ') {
        // `name value` with a `{` later (no labels).
        return Ok(None);
    }
    let (mut topology, mut task) = (None, None);
    let mut rest = &line[open + 1..];
    loop {
        rest = rest.trim_start_matches([',', ' ']);
        if rest.starts_with('}') {
            break;
        }
        let eq = rest.find('=').ok_or(())?;
        let key = rest[..eq].trim();
        let value_text = rest[eq + 1..].strip_prefix('"').ok_or(())?;
        let mut value = String::new();
        let mut chars = value_text.char_indices();
        let end = loop {
            match chars.next().ok_or(())? {
                (i, '"') => break i,
                (_, '\\') => match chars.next().ok_or(())?.1 {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                (_, c) => value.push(c),
            }
        };
        match key {
            "topology" => topology = Some(value),
            "task" => task = Some(value),
            _ => {}
        }
        rest = &value_text[end + 1..];
    }
    Ok(topology.or_else(|| task.map(|t| topology_of(&t).to_string())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::board::{HandoverStatus, Role, TaskStatus};

    fn task(id: &str) -> TaskStatus {
        TaskStatus {
            task: id.into(),
            role: Role::Standby,
            phase: None,
            lag: None,
            restored: 0,
            restore_rate: None,
            progress: None,
            unavailable_seconds: 0.0,
            in_role_seconds: 0.0,
            error: Some(format!("{id} failed")),
            waiting: None,
        }
    }

    #[test]
    fn a_status_keeps_only_the_visible_topologies_tasks_and_handovers() {
        let status = WorkerStatus {
            generation: 7,
            tasks: vec![task("a.one/0"), task("b.two/sub/1")],
            handovers: vec![
                HandoverStatus {
                    task: "b.two/sub/1".into(),
                    direction: "out".into(),
                    ..Default::default()
                },
                HandoverStatus {
                    task: "a.one/0".into(),
                    direction: "in".into(),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let shown = filter_status(status, |t| t == "a.one");
        let text = serde_json::to_string(&shown).unwrap();
        assert!(!text.contains("b.two"), "{text}");
        assert_eq!(shown.tasks.len(), 1);
        assert_eq!(shown.handovers.len(), 1);
        assert_eq!(shown.generation, 7);
    }

    const METRICS: &str = "# HELP sluice_records_in Records read.\n\
        # TYPE sluice_records_in counter\n\
        sluice_records_in_total{topology=\"a.one\",task=\"a.one/0\"} 5\n\
        sluice_records_in_total{topology=\"b.two\",task=\"b.two/1\"} 3\n\
        sluice_records_in_total{task=\"b.two/2\",topology=\"b.two\"} 1\n\
        sluice_odd{task=\"b.two/3\"} 1\n\
        sluice_tricky{kind=\"x\\\",topology=\\\"a.one\",topology=\"b.two\"} 1\n\
        sluice_broken{topology=\"b.two} 1\n\
        sluice_tasks_running 2\n\
        sluice_handover_seconds_bucket{le=\"0.005\",phase=\"total\"} 0\n\
        # EOF\n";

    #[test]
    fn metrics_keep_worker_series_and_only_the_visible_topologies() {
        let tenant = filter_metrics(METRICS, |t| t == "a.one");
        assert!(tenant.contains("task=\"a.one/0\""), "{tenant}");
        assert!(!tenant.contains("b.two"), "{tenant}");
        assert!(tenant.contains("sluice_tasks_running 2") && tenant.contains("phase=\"total\""));
        assert!(tenant.contains("# HELP sluice_records_in") && tenant.ends_with("# EOF\n"));
        let public = filter_metrics(METRICS, |_| false);
        assert!(!public.contains("a.one") && !public.contains("b.two"), "{public}");
        assert!(public.contains("sluice_tasks_running 2"), "{public}");
        let all = filter_metrics(METRICS, |_| true);
        assert_eq!(
            all.lines().count(),
            METRICS.lines().count() - 1,
            "only the broken line goes"
        );
    }
}
