//! What a component's description must say to be run: names that are valid and declared
//! once, and (contract 0.2.0) internal topics and sub-topologies that fit together.

use std::collections::{BTreeMap, HashSet};

use sluice_wire::Description;

use crate::manifest::{check_name, check_store_name};

/// Checks a description; the error says what is wrong, naming it.
pub(super) fn check(d: &Description) -> Result<(), String> {
    if d.sources.is_empty() {
        return Err("it declares no sources".into());
    }
    for (kind, names) in [("source", &d.sources), ("sink", &d.sinks), ("store", &d.stores)] {
        let mut seen = HashSet::new();
        for name in names {
            if kind == "store" {
                check_store_name(name)?;
            } else {
                check_name(&format!("{kind} name"), name)?;
            }
            if !seen.insert(name) {
                return Err(format!("it declares the {kind} {name:?} twice"));
            }
        }
    }
    check_global_stores(d)?;
    // The formats it declares: each for a topic it declares, each schema one the host can use
    // (the sinks' subjects are named when the topology is bound to topics).
    crate::formats::TopologyFormats::new(d, &d.sinks, &Default::default(), 1 << 20)?;
    let mut internal = HashSet::new();
    for t in &d.internal_topics {
        if !internal.insert(t.name.as_str()) {
            return Err(format!("it declares the internal topic {:?} twice", t.name));
        }
        check_internal_name(&t.name)?;
        if t.partitions == Some(0) {
            return Err(format!(
                "internal topic {:?}: a topic has at least one partition",
                t.name
            ));
        }
        if !d.sources.contains(&t.name) || !d.sinks.contains(&t.name) {
            return Err(format!(
                "internal topic {:?} must be declared as a source and as a sink too (one sub-topology writes \
                 it, another reads it)",
                t.name
            ));
        }
    }
    if d.subtopologies.is_empty() {
        return Ok(());
    }
    check_subtopologies(d, &internal)
}

/// Global tables: named like stores and apart from them; each filled by a topic of its
/// own that no task reads or writes as a source or sink.
fn check_global_stores(d: &Description) -> Result<(), String> {
    let (mut names, mut topics) = (HashSet::new(), HashSet::new());
    for g in &d.global_stores {
        check_store_name(&g.name)?;
        check_name("global store topic name", &g.topic)?;
        if d.stores.contains(&g.name) || !names.insert(g.name.as_str()) {
            return Err(format!(
                "it declares the store {:?} twice (a global store is a store too)",
                g.name
            ));
        }
        if !topics.insert(g.topic.as_str()) {
            return Err(format!(
                "the topic {:?} fills two global stores: a topic fills one",
                g.topic
            ));
        }
        if d.sources.contains(&g.topic) || d.sinks.contains(&g.topic) {
            return Err(format!(
                "global store {:?}: its topic {:?} is also declared as a source or sink; the host reads it whole \
                 into the store, so tasks neither read nor write it",
                g.name, g.topic
            ));
        }
    }
    Ok(())
}

/// Internal topics become the middle of topic names (`<topology>-<name>-repartition`):
/// `[A-Za-z0-9_]`, 1–64 characters, so two topologies' internal topics cannot collide (`a` +
/// `b-c` against `a-b` + `c`).
fn check_internal_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 64 {
        return Err(format!(
            "internal topic {name:?}: its name must be 1 to 64 characters long"
        ));
    }
    if let Some(c) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || *c == '_')) {
        return Err(format!(
            "internal topic {name:?} contains {c:?}; it becomes part of the topic `<topology>-{name}-repartition`, \
             so use letters, digits and '_'"
        ));
    }
    Ok(())
}

fn check_subtopologies(d: &Description, internal: &HashSet<&str>) -> Result<(), String> {
    let mut names = HashSet::new();
    // Who reads each source, who keeps each store, who writes each internal topic.
    let (mut reader, mut keeper, mut writers) = (BTreeMap::new(), BTreeMap::new(), BTreeMap::<&str, Vec<&str>>::new());
    for s in &d.subtopologies {
        check_name("sub-topology name", &s.name)?;
        if !names.insert(s.name.as_str()) {
            return Err(format!("it declares the sub-topology {:?} twice", s.name));
        }
        if s.sources.is_empty() {
            return Err(format!("sub-topology {:?} reads no source", s.name));
        }
        for (kind, used, declared) in [
            ("source", &s.sources, &d.sources),
            ("sink", &s.sinks, &d.sinks),
            ("store", &s.stores, &d.stores),
        ] {
            for name in used {
                if !declared.contains(name) {
                    return Err(format!(
                        "sub-topology {:?} uses the {kind} {name:?}, which the description does not declare",
                        s.name
                    ));
                }
            }
        }
        for source in &s.sources {
            if let Some(other) = reader.insert(source.as_str(), s.name.as_str()) {
                return Err(format!(
                    "source {source:?} is read by sub-topologies {other:?} and {:?}: a source belongs to one",
                    s.name
                ));
            }
        }
        for store in &s.stores {
            if let Some(other) = keeper.insert(store.as_str(), s.name.as_str()) {
                return Err(format!(
                    "store {store:?} is kept by sub-topologies {other:?} and {:?}: a store belongs to one",
                    s.name
                ));
            }
        }
        for sink in s.sinks.iter().filter(|t| internal.contains(t.as_str())) {
            writers.entry(sink.as_str()).or_default().push(s.name.as_str());
        }
    }
    for source in &d.sources {
        if !reader.contains_key(source.as_str()) {
            return Err(format!("source {source:?} is read by no sub-topology"));
        }
    }
    for topic in internal {
        if !writers.contains_key(topic) {
            return Err(format!("internal topic {topic:?} is written by no sub-topology"));
        }
    }
    // The sub-topologies and the internal topics between them must not loop: records
    // would go round for ever, and no sub-topology could be placed before the others.
    let mut downstream: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (topic, from) in &writers {
        let to = reader[topic];
        for from in from {
            downstream.entry(from).or_default().push(to);
        }
    }
    let mut done = HashSet::new();
    for s in &d.subtopologies {
        let mut path = Vec::new();
        find_loop(s.name.as_str(), &downstream, &mut path, &mut done)?;
    }
    Ok(())
}

/// Depth first from `at`; an error names the loop found.
fn find_loop<'a>(
    at: &'a str,
    downstream: &BTreeMap<&'a str, Vec<&'a str>>,
    path: &mut Vec<&'a str>,
    done: &mut HashSet<&'a str>,
) -> Result<(), String> {
    if let Some(start) = path.iter().position(|p| *p == at) {
        let mut cycle: Vec<&str> = path[start..].to_vec();
        cycle.push(at);
        return Err(format!(
            "its sub-topologies form a loop through internal topics: {}",
            cycle.join(" → ")
        ));
    }
    if !done.insert(at) {
        return Ok(());
    }
    path.push(at);
    for next in downstream.get(at).into_iter().flatten() {
        find_loop(next, downstream, path, done)?;
    }
    path.pop();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_wire::Subtopology;

    fn two_stage() -> Description {
        Description::new("wc")
            .source("lines")
            .sink("counts")
            .store("counts")
            .internal_topic("words", Some(8))
            .subtopology(Subtopology::new("split").source("lines").sink("words"))
            .subtopology(Subtopology::new("count").source("words").sink("counts").store("counts"))
    }

    #[test]
    fn a_two_stage_description_checks() {
        check(&two_stage()).unwrap();
        check(&Description::new("u").source("in").sink("out")).unwrap();
        // Internal topics become the middle of topic names: no '-' or '.'.
        let d = Description::new("x")
            .source("in")
            .internal_topic("by-key", None)
            .subtopology(Subtopology::new("a").source("in").sink("by-key"))
            .subtopology(Subtopology::new("b").source("by-key"));
        let e = check(&d).unwrap_err();
        assert!(e.contains("internal topic \"by-key\" contains '-'"), "{e}");
    }

    #[test]
    fn what_does_not_fit_together_is_named() {
        let refused = |d: Description| check(&d).unwrap_err();
        let mut d = two_stage();
        d.subtopologies[1].sources.push("lines".into());
        assert_eq!(
            refused(d),
            "source \"lines\" is read by sub-topologies \"split\" and \"count\": a source belongs to one"
        );
        let mut d = two_stage();
        d.subtopologies[0].stores.push("counts".into());
        assert!(refused(d).contains("store \"counts\" is kept by sub-topologies \"split\" and \"count\""));
        let mut d = two_stage();
        d.subtopologies[0].sinks.clear();
        assert_eq!(refused(d), "internal topic \"words\" is written by no sub-topology");
        let mut d = two_stage();
        d.subtopologies[0].sinks.push("nowhere".into());
        assert!(refused(d).contains("uses the sink \"nowhere\", which the description does not declare"));
        let mut d = two_stage();
        d.internal_topics[0].partitions = Some(0);
        assert!(refused(d).contains("at least one partition"));
        let mut d = Description::new("x").source("a").sink("b");
        d.internal_topics.push(sluice_wire::InternalTopic {
            name: "a".into(),
            partitions: None,
        });
        assert!(refused(d).contains("must be declared as a source and as a sink"));
        let d = two_stage().source("orphan");
        assert_eq!(refused(d), "source \"orphan\" is read by no sub-topology");
    }

    #[test]
    fn global_stores_are_checked() {
        let d = Description::new("g")
            .source("orders")
            .sink("out")
            .global_store("customers", "customers");
        check(&d).unwrap();
        let refused = |d: Description| check(&d).unwrap_err();
        assert!(refused(d.clone().store("customers")).contains("declares the store \"customers\" twice"));
        assert!(refused(d.clone().global_store("again", "customers")).contains("fills two global stores"));
        assert!(refused(d.clone().global_store("x", "out")).contains("also declared as a source or sink"));
        assert!(refused(d.clone().global_store("bad/name", "t")).contains("bad/name"));
        assert!(refused(d.global_store("y", "")).contains("global store topic name"));
    }

    #[test]
    fn a_loop_of_sub_topologies_is_refused_naming_it() {
        let d = Description::new("loop")
            .source("in")
            .internal_topic("ab", None)
            .internal_topic("ba", None)
            .subtopology(Subtopology::new("a").source("in").source("ba").sink("ab"))
            .subtopology(Subtopology::new("b").source("ab").sink("ba"));
        assert_eq!(
            check(&d).unwrap_err(),
            "its sub-topologies form a loop through internal topics: a → b → a"
        );
        // A sub-topology that writes what it reads itself loops too.
        let d = Description::new("self")
            .source("in")
            .internal_topic("again", None)
            .subtopology(Subtopology::new("s").source("in").source("again").sink("again"));
        assert_eq!(
            check(&d).unwrap_err(),
            "its sub-topologies form a loop through internal topics: s → s"
        );
    }
}
