//! What a DSL topology describes: sub-topologies cut where a key change meets a stateful
//! operator, the repartition topics between them, each sub-topology's stores, global
//! stores; and the mistakes the DSL refuses, by their message.

use std::time::Duration;

use sluice_guest::dsl::{StreamsBuilder, TimeWindows, Topology};
use sluice_guest::{Description, InternalTopic, Subtopology};

fn describe(topology: impl FnOnce(&mut StreamsBuilder)) -> Description {
    Topology::build("t", topology)
        .expect("the topology builds")
        .description()
}

fn refused(topology: impl FnOnce(&mut StreamsBuilder)) -> String {
    match Topology::build("t", topology) {
        Ok(_) => panic!("the topology was accepted"),
        Err(e) => e.to_string(),
    }
}

fn sub(name: &str, sources: &[&str], sinks: &[&str], stores: &[&str]) -> Subtopology {
    let mut s = Subtopology::new(name);
    s.sources = sources.iter().map(|s| s.to_string()).collect();
    s.sinks = sinks.iter().map(|s| s.to_string()).collect();
    s.stores = stores.iter().map(|s| s.to_string()).collect();
    s
}

#[test]
fn a_stateless_topology_is_one_sub_topology() {
    let d = describe(|b| {
        let s = b.stream::<String, String>("in");
        s.map(|k, v| (v, k)).filter(|_, v| !v.is_empty()).to("out");
        s.to("copy");
    });
    assert_eq!(d.sources, ["in"]);
    assert_eq!(d.sinks, ["out", "copy"]);
    assert!(d.stores.is_empty() && d.internal_topics.is_empty());
    assert_eq!(d.subtopologies, [sub("in", &["in"], &["out", "copy"], &[])]);
}

#[test]
fn a_key_change_before_an_aggregation_repartitions_through_a_topic_named_after_the_store() {
    let d = describe(|b| {
        b.stream::<(), String>("lines")
            .flat_map_values(|line| line.split_whitespace().map(str::to_string).collect::<Vec<_>>())
            .group_by(|_, word| word.clone())
            .count("word_counts")
            .to_stream()
            .to("counts");
    });
    assert_eq!(d.sources, ["lines", "word_counts"]);
    assert_eq!(d.sinks, ["counts", "word_counts"]);
    assert_eq!(d.stores, ["word_counts"]);
    assert_eq!(
        d.internal_topics,
        [InternalTopic {
            name: "word_counts".into(),
            partitions: None
        }]
    );
    assert_eq!(
        d.subtopologies,
        [
            sub("lines", &["lines"], &["word_counts"], &[]),
            sub("word_counts", &["word_counts"], &["counts"], &["word_counts"]),
        ]
    );
}

#[test]
fn no_key_change_no_repartition_and_a_named_grouping_names_the_topic() {
    let d = describe(|b| {
        let s = b.stream::<String, String>("in");
        s.map_values(|v| v.len() as u64).group_by_key().count("counts");
        s.select_key(|_, v| v.clone())
            .group_by_key()
            .named("by_value")
            .partitions(6)
            .windowed_by(TimeWindows::tumbling(Duration::from_secs(60)))
            .count("per_minute");
    });
    assert_eq!(
        d.internal_topics,
        [InternalTopic {
            name: "by_value".into(),
            partitions: Some(6)
        }]
    );
    assert_eq!(
        d.subtopologies,
        [
            sub("in", &["in"], &["by_value"], &["counts"]),
            sub("by_value", &["by_value"], &[], &["per_minute"]),
        ]
    );
}

#[test]
fn joins_run_beside_the_tables_they_read_and_global_tables_are_declared() {
    let d = describe(|b| {
        let customers = b.table::<String, String>("customers", "customers");
        let products = b.global_table::<String, String>("products", "products");
        b.stream::<String, String>("orders")
            .join(&customers, |order, customer| format!("{order} for {customer}"))
            .left_join_global(&products, |_, order| order.clone(), |v, p| format!("{v} ({p:?})"))
            .to("enriched");
        // A key change before a stream-table join repartitions the stream.
        b.stream::<String, String>("payments")
            .select_key(|_, v| v.clone())
            .left_join(&customers, |p, c| format!("{p} {c:?}"))
            .to("paid");
    });
    assert_eq!(d.global_stores.len(), 1);
    assert_eq!(
        (d.global_stores[0].name.as_str(), d.global_stores[0].topic.as_str()),
        ("products", "products")
    );
    assert_eq!(d.internal_topics.len(), 1);
    let topic = d.internal_topics[0].name.clone();
    assert!(topic.starts_with("left_join_") && topic.ends_with("_left"), "{topic}");
    assert_eq!(
        d.subtopologies,
        [
            sub(
                "customers",
                &["customers", "orders", &topic],
                &["enriched", "paid"],
                &["customers"]
            ),
            sub("payments", &["payments"], &[&topic], &[]),
        ]
    );
}

#[test]
fn a_table_aggregation_always_repartitions() {
    let d = describe(|b| {
        b.table::<String, String>("users", "users")
            .group_by(|_, city| (city.clone(), 1u64))
            .count("per_city");
    });
    assert_eq!(d.stores, ["users", "per_city"]);
    assert_eq!(
        d.subtopologies,
        [
            sub("users", &["users"], &["per_city"], &["users"]),
            sub("per_city", &["per_city"], &[], &["per_city"]),
        ]
    );
}

#[test]
fn generated_names_are_deterministic_and_readable() {
    let topology = |b: &mut StreamsBuilder| {
        b.stream::<String, String>("in")
            .select_key(|_, v| v.clone())
            .group_by_key()
            .count(sluice_guest::dsl::Materialized::unnamed());
    };
    let (a, b) = (describe(topology), describe(topology));
    assert_eq!(a, b);
    assert_eq!(a.stores, ["count_2"]);
    assert_eq!(a.internal_topics[0].name, "count_2");
}

#[test]
fn mistakes_are_refused_with_what_to_do() {
    let e = refused(|b| {
        b.stream::<String, String>("in").to("out");
        b.stream::<String, String>("in").to("out2");
    });
    assert!(e.contains("the source \"in\" is read twice"), "{e}");
    let e = refused(|b| {
        b.stream::<String, String>("in")
            .group_by(|_, v| v.clone())
            .count("counts")
            .to_stream()
            .to("counts");
    });
    assert!(
        e.contains("the repartition topic \"counts\" has the name of a source or sink"),
        "{e}"
    );
    let e = refused(|b| {
        b.stream::<String, String>("in").group_by_key().count("bad-name");
    });
    assert!(e.contains("the store name \"bad-name\" contains '-'"), "{e}");
    let e = refused(|b| {
        let s = b.stream::<String, String>("in");
        s.group_by_key().count("c");
        s.group_by_key().count("c");
    });
    assert!(e.contains("the store \"c\" is kept by two operators"), "{e}");
    let e = refused(|_| {});
    assert!(e.contains("it reads no source"), "{e}");
    let e = refused(|b| {
        b.stream::<String, String>("in")
            .group_by_key()
            .windowed_by(TimeWindows::hopping(Duration::from_secs(1), Duration::from_secs(2)))
            .count("w");
    });
    assert!(e.contains("the advance must be positive and at most the size"), "{e}");
}

#[test]
fn stream_stream_joins_keep_both_sides_and_window_stores_are_declared_where_they_run() {
    use sluice_guest::dsl::{JoinWindows, SessionWindows};
    let d = describe(|b| {
        let views = b.stream::<String, String>("views");
        let clicks = b.stream::<String, String>("clicks").select_key(|_, v| v.clone());
        views
            .outer_join_stream(
                &clicks,
                |v, c| format!("{v:?}{c:?}"),
                JoinWindows::of(Duration::from_secs(5)),
            )
            .to("joined");
        views
            .group_by_key()
            .windowed_by(SessionWindows::with_inactivity_gap(Duration::from_secs(30)))
            .count("sessions");
    });
    let join = "outer_join_stream_3";
    assert_eq!(d.internal_topics.len(), 1);
    assert_eq!(d.internal_topics[0].name, format!("{join}_right"));
    assert_eq!(
        d.stores,
        [
            format!("{join}_this"),
            format!("{join}_other"),
            format!("{join}_outer"),
            "sessions".into()
        ]
    );
    let stores: Vec<&str> = d.stores.iter().map(String::as_str).collect();
    assert_eq!(
        d.subtopologies,
        [
            sub("views", &["views", &format!("{join}_right")], &["joined"], &stores),
            sub("clicks", &["clicks"], &[&format!("{join}_right")], &[]),
        ]
    );
}

#[test]
fn operators_are_listed_per_sub_topology_with_their_topics_stores_and_neighbours() {
    let topology = Topology::build("wc", |b| {
        b.stream::<(), String>("lines")
            .flat_map_values(|line| line.split(' ').map(str::to_string).collect::<Vec<_>>())
            .group_by(|_, word| word.clone())
            .named("words")
            .count("counts")
            .to_stream()
            .to("totals");
    })
    .expect("the topology builds");
    let operators = topology.operators();
    let names: Vec<&str> = operators.iter().map(|(sub, _)| sub.as_str()).collect();
    let description = topology.description();
    let declared: Vec<&str> = description.subtopologies.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, declared, "one list per sub-topology, by the names it declares");
    let all: Vec<&str> = operators
        .iter()
        .flat_map(|(_, l)| l.iter().map(String::as_str))
        .collect();
    let line = |needles: &[&str]| {
        all.iter()
            .find(|l| needles.iter().all(|n| l.contains(n)))
            .unwrap_or_else(|| panic!("no operator line with {needles:?} in {all:#?}"))
    };
    let source = line(&["(reads source lines)"]);
    let flat_map = all
        .iter()
        .find(|l| l.starts_with("flat_map_values"))
        .expect("a flat-map operator");
    assert!(
        source.ends_with(&format!("--> {}", flat_map.split(' ').next().unwrap())),
        "{source}"
    );
    assert!(flat_map.contains("<-- source_"), "{flat_map}");
    assert!(line(&["(writes repartition topic words)"]).contains("<--"));
    assert!(line(&["(reads repartition topic words)"]).contains("-->"));
    assert!(line(&["(stores: [counts])"]).starts_with("count_"));
    assert!(line(&["(writes sink totals)"]).contains("<--"));
    // Every operator appears once, in the sub-topology it runs in.
    let first = &operators[0].1;
    assert!(first.iter().any(|l| l.contains("(reads source lines)")) && !first.iter().any(|l| l.contains("counts")));
}

#[test]
fn aggregations_of_one_grouping_share_its_repartition_topic() {
    for name in [Some("by_region"), None] {
        let d = describe(|b| {
            let mut grouped = b
                .stream::<String, String>("orders")
                .group_by(|_, region| region.clone());
            if let Some(name) = name {
                grouped = grouped.named(name);
            }
            grouped.count("orders_per_region");
            grouped
                .windowed_by(TimeWindows::tumbling(Duration::from_secs(300)))
                .count("per_window")
                .to_stream()
                .map(|w, n| (w.key, n.unwrap_or(0)))
                .to("out");
        });
        let topic = name.unwrap_or("orders_per_region");
        assert_eq!(
            d.internal_topics,
            [InternalTopic {
                name: topic.into(),
                partitions: None
            }],
            "one repartition topic for both aggregations ({name:?})"
        );
        assert_eq!(d.subtopologies.len(), 2, "{d:?}");
        assert_eq!(
            d.subtopologies[1],
            sub(topic, &[topic], &["out"], &["orders_per_region", "per_window"])
        );
    }
    // Two groupings named alike are two topics of one name: refused, saying what to do.
    let e = refused(|b| {
        let s = b.stream::<String, String>("orders");
        s.group_by(|_, v| v.clone()).named("by").count("a");
        s.group_by(|k, _| k.clone()).named("by").count("b");
    });
    assert!(e.contains("two groupings are both named \"by\""), "{e}");
}

/// Issue 35: a named table grouping aggregated twice was refused with a message that
/// recommended exactly that pattern; its aggregations now share its repartition topic.
#[test]
fn aggregations_of_one_table_grouping_share_its_repartition_topic() {
    for name in [Some("by_region"), None] {
        let d = describe(|b| {
            let mut grouped = b
                .table::<String, String>("customers", "customers")
                .group_by(|_, region| (region.clone(), 1u64));
            if let Some(name) = name {
                grouped = grouped.named(name);
            }
            grouped.count("customers_per_region").to_stream().to("counts");
            grouped
                .aggregate(|| 0u64, |_, v, a| a + v, |_, v, a| a - v, "sum_per_region")
                .to_stream()
                .to("sums");
        });
        let topic = name.unwrap_or("customers_per_region");
        assert_eq!(
            d.internal_topics,
            [InternalTopic {
                name: topic.into(),
                partitions: None
            }],
            "one repartition topic for both aggregations ({name:?})"
        );
        assert_eq!(d.subtopologies.len(), 2, "{d:?}");
        assert_eq!(
            d.subtopologies[1],
            sub(
                topic,
                &[topic],
                &["counts", "sums"],
                &["customers_per_region", "sum_per_region"]
            )
        );
    }
}

/// Issue 35: two joins of one re-keyed stream wrote it to two repartition topics (each
/// record written three times); Kafka Streams reuses the stream's join repartition topic.
#[test]
fn joins_of_one_rekeyed_stream_share_its_repartition_topic() {
    let d = describe(|b| {
        let customers = b.table::<String, String>("customers", "customers");
        let payments = b.stream::<String, String>("payments");
        let orders = b
            .stream::<String, String>("orders")
            .select_key(|_, order| order.split(' ').next().unwrap_or_default().to_string());
        orders.left_join(&customers, |o, c| format!("{o} {c:?}")).to("enriched");
        orders.join(&customers, |o, c| format!("{o} {c}")).to("known");
        orders
            .join_stream(
                &payments,
                |o, p| format!("{o} {p}"),
                sluice_guest::dsl::JoinWindows::of(Duration::from_secs(60)),
            )
            .to("paid");
    });
    assert_eq!(
        d.internal_topics.len(),
        1,
        "one repartition topic for three joins: {:?}",
        d.internal_topics
    );
    let topic = d.internal_topics[0].name.clone();
    assert!(topic.ends_with("_left"), "{topic}");
    let reading: Vec<&Subtopology> = d.subtopologies.iter().filter(|s| s.sources.contains(&topic)).collect();
    assert_eq!(reading.len(), 1, "{d:?}");
    for sink in ["enriched", "known", "paid"] {
        assert!(
            reading[0].sinks.contains(&sink.to_string()),
            "{sink} in {:?}",
            reading[0]
        );
    }
}
