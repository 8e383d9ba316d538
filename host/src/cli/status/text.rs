//! `sluice status --output text`: the tables.

use super::{Compile, Status, Task};
use sluice::worker::board::Phase;

/// `[#######-------------]  35%` for a share of 0 to 1.
fn bar(share: f64) -> String {
    const WIDTH: usize = 20;
    let share = share.clamp(0.0, 1.0);
    let full = (share * WIDTH as f64).round() as usize;
    format!(
        "[{}{}] {:>3.0}%",
        "#".repeat(full),
        "-".repeat(WIDTH - full),
        share * 100.0
    )
}

pub(super) fn print_text(s: &Status) {
    let generation = s.generation.map_or("-".to_string(), |g| g.to_string());
    println!(
        "cluster {} (group {}): {}, generation {generation}, {} worker(s)",
        s.cluster,
        s.group,
        s.state,
        s.workers.len()
    );
    println!();
    println!(
        "{:<50} {:<16} {:<21} {:>8} {:>7} {:>8} {:>6} {:>7} {:>7} {:>10} {:>8}",
        "WORKER",
        "HOST",
        "ADMIN",
        "CAPACITY",
        "RELEASE",
        "METADATA",
        "ACTIVE",
        "STANDBY",
        "LEARNER",
        "REBALANCES",
        "LAST"
    );
    let count = |n: Option<usize>| n.map_or("-".to_string(), |n| n.to_string());
    for w in &s.workers {
        let mut notes = Vec::new();
        if w.leaving {
            notes.push("leaving");
        }
        if w.rebalancing == Some(true) {
            notes.push("rebalancing");
        }
        if !w.admin.is_empty() && !w.live {
            notes.push("unreachable: as of its last join");
        }
        let notes = if notes.is_empty() {
            String::new()
        } else {
            format!(" ({})", notes.join(", "))
        };
        let admin = if w.admin.is_empty() { "-" } else { &w.admin };
        let rebalances = w.rebalances.map_or("-".to_string(), |r| r.to_string());
        let last = w.last_rebalance_seconds.map_or("-".to_string(), |r| format!("{r:.2}s"));
        println!(
            "{:<50} {:<16} {:<21} {:>8} {:>7} {:>8} {:>6} {:>7} {:>7} {:>10} {:>8}{notes}",
            w.member,
            w.host,
            admin,
            w.capacity,
            if w.release.is_empty() { "<0.3" } else { &w.release },
            format!("{}/{}", w.version, w.supported),
            count(w.active),
            count(w.standby),
            count(w.learner),
            rebalances,
            last
        );
    }
    println!();
    println!(
        "{:<40} {:<8} {:<10} {:<50} {:>9} {:>11}  PROGRESS",
        "TASK", "ROLE", "PHASE", "OWNER", "LAG", "UNAVAILABLE"
    );
    for t in &s.tasks {
        let lag = t.lag.map_or("-".to_string(), |l| l.to_string());
        let phase = t.phase.map_or("-".to_string(), |p| format!("{p:?}").to_lowercase());
        let unavailable = t.unavailable_seconds.map_or("-".to_string(), |u| format!("{u:.1}s"));
        // Progress bars for what is still restoring: learners, standbys catching up, and
        // active tasks replaying their changelog.
        let restoring = t.role == "learner" || t.role == "standby" || t.phase == Some(Phase::Restoring);
        let progress = match (t.progress, restoring) {
            (Some(p), true) => {
                let rate = t.restore_rate.map_or(String::new(), |r| format!("  {r:.0} records/s"));
                let left = match (t.lag, t.restore_rate) {
                    (Some(lag), Some(rate)) if rate > 1.0 && lag > 0 => format!(", ~{:.0}s left", lag as f64 / rate),
                    _ => String::new(),
                };
                format!("{}{rate}{left}", bar(p))
            }
            _ => String::new(),
        };
        println!(
            "{:<40} {:<8} {:<10} {:<50} {:>9} {:>11}  {progress}",
            t.task, t.role, phase, t.owner, lag, unavailable
        );
    }
    if !s.handovers.is_empty() {
        println!();
        println!(
            "{:<40} {:<4} {:<50} {:>8} {:>10} {:>8} {:>9} {:>8} {:>8}",
            "HANDOVER", "", "WORKER", "REVOKE", "REBALANCE", "START", "FIRST OUT", "TOTAL", "AGO"
        );
        let secs = |s: Option<f64>| s.map_or("-".to_string(), |s| format!("{s:.3}s"));
        for h in &s.handovers {
            let m = &h.handover;
            println!(
                "{:<40} {:<4} {:<50} {:>8} {:>10} {:>8} {:>9} {:>8} {:>8}",
                m.task,
                m.direction,
                h.worker,
                secs(m.revoke_seconds),
                secs(m.rebalance_seconds),
                secs(m.start_seconds),
                secs(m.first_output_seconds),
                secs(m.total_seconds),
                format!("{:.0}s", m.ago_seconds)
            );
        }
    }
    if !s.compiles.is_empty() {
        println!();
        println!(
            "{:<32} {:<50} {:>9} {:<10} {:>8}  PROGRESS",
            "COMPILE", "WORKER", "MB", "STATE", "TIME"
        );
        for c in &s.compiles {
            println!("{}", compile_line(c));
        }
    }
    let waiting: Vec<&Task> = s.tasks.iter().filter(|t| t.waiting.is_some()).collect();
    if !waiting.is_empty() {
        println!();
        println!("WAITING TASKS");
        for t in waiting {
            println!("  {}: {}", t.task, t.waiting.as_deref().unwrap_or_default());
        }
    }
    let failed: Vec<&Task> = s.tasks.iter().filter(|t| t.error.is_some()).collect();
    if !failed.is_empty() {
        println!();
        println!("FAILED TASKS");
        for t in failed {
            println!("  {}: {}", t.task, t.error.as_deref().unwrap_or_default());
        }
    }
    if !s.problems.is_empty() {
        println!();
        println!("PROBLEMS");
        for p in &s.problems {
            println!("  {p}");
        }
    }
}

/// One compile as `sluice status` shows it: under way with its estimated progress, or done
/// (how long ago, or why it failed).
fn compile_line(c: &Compile) -> String {
    let m = &c.compile;
    let what = if m.topology.is_empty() {
        &m.component
    } else {
        &m.topology
    };
    let progress = match (m.state.as_str(), m.progress, m.expected_seconds) {
        ("compiling", Some(p), Some(e)) => format!("about {:.0}% of about {e:.0}s", p * 100.0),
        ("compiling", _, _) => "no estimate yet (this worker's first compile)".to_string(),
        (_, _, _) => {
            let ago = m.ago_seconds.map_or(String::new(), |a| format!("{a:.0}s ago"));
            match &m.error {
                Some(e) => format!("{ago}: {e}"),
                None => ago,
            }
        }
    };
    format!(
        "{:<32} {:<50} {:>9.1} {:<10} {:>8}  {progress}",
        what,
        c.worker,
        m.bytes as f64 / 1e6,
        m.state,
        format!("{:.1}s", m.seconds)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_compile_under_way_shows_its_estimate_and_a_failed_one_why() {
        let compile = |state: &str, progress: Option<f64>, error: Option<&str>| Compile {
            worker: "w-1".into(),
            compile: sluice::runtime::progress::CompileStatus {
                topology: "py-wc".into(),
                component: "py.wasm".into(),
                bytes: 19_400_000,
                state: state.into(),
                seconds: 3.25,
                expected_seconds: progress.map(|_| 6.1),
                progress,
                ago_seconds: (state != "compiling").then_some(12.0),
                error: error.map(str::to_string),
            },
        };
        let line = compile_line(&compile("compiling", Some(0.53), None));
        assert!(line.starts_with("py-wc ") && line.contains("19.4 compiling"), "{line}");
        assert!(
            line.ends_with("3.2s  about 53% of about 6s") || line.ends_with("3.3s  about 53% of about 6s"),
            "{line}"
        );
        let line = compile_line(&compile("compiling", None, None));
        assert!(
            line.ends_with("no estimate yet (this worker's first compile)"),
            "{line}"
        );
        let line = compile_line(&compile("failed", None, Some("Cranelift ran out of memory")));
        assert!(line.ends_with("12s ago: Cranelift ran out of memory"), "{line}");
    }
}
