//! Tables: a table aggregation retracts an entry's old value before adding its new one
//! (checked against a model over random updates, moves and deletions), table operators
//! pass changes on, and a stream becomes a table.

use std::collections::BTreeMap;

use proptest::prelude::*;
use sluice_guest::dsl::testing::TestDriver;
use sluice_guest::dsl::StreamsBuilder;

/// Users (keyed by id) in cities; per city, how many users and the sum of their ids.
fn per_city(b: &mut StreamsBuilder) {
    let by_city = b
        .table::<u64, String>("users", "users")
        .group_by(|user, city| (city.clone(), *user))
        .named("by_city"); // both aggregations read one repartition topic
    by_city.count("city_counts").to_stream().to("counts");
    by_city
        .aggregate(
            || 0u64,
            |_, user, sum| sum + user,
            |_, user, sum| sum - user,
            "city_sums",
        )
        .to_stream()
        .to("sums");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn a_table_aggregation_subtracts_the_old_value_and_adds_the_new(
        updates in proptest::collection::vec((0u64..6, proptest::option::of(0u8..3)), 0..60),
    ) {
        let mut driver = TestDriver::new("cities", per_city).unwrap();
        let mut users: BTreeMap<u64, String> = BTreeMap::new();
        let mut counts: BTreeMap<String, u64> = BTreeMap::new();
        let mut sums: BTreeMap<String, u64> = BTreeMap::new();
        let mut expected = Vec::new();
        for (i, (user, city)) in updates.iter().enumerate() {
            let ts = i as i64;
            let city = city.map(|c| format!("city{c}"));
            match &city {
                Some(city) => driver.pipe("users", *user, city.clone(), ts).unwrap(),
                None => driver.pipe("users", *user, None::<String>, ts).unwrap(),
            }
            let old = match &city {
                Some(city) => users.insert(*user, city.clone()),
                None => users.remove(user),
            };
            // One update per city touched: the old city's (retraction) first.
            let mut touched = Vec::new();
            if let Some(old) = &old {
                *counts.get_mut(old).unwrap() -= 1;
                *sums.get_mut(old).unwrap() -= user;
                touched.push(old.clone());
            }
            if let Some(new) = &city {
                *counts.entry(new.clone()).or_default() += 1;
                *sums.entry(new.clone()).or_default() += user;
                if !touched.contains(new) {
                    touched.push(new.clone());
                }
            }
            for c in touched {
                expected.push((c.clone(), counts[&c], sums[&c], ts));
            }
        }
        let got_counts = driver.read::<String, Option<u64>>("counts").unwrap();
        let got_sums = driver.read::<String, Option<u64>>("sums").unwrap();
        let got: Vec<(String, u64, u64, i64)> = got_counts
            .into_iter()
            .zip(got_sums)
            .map(|(c, s)| (c.key, c.value.unwrap(), s.value.unwrap(), c.timestamp))
            .collect();
        prop_assert_eq!(got, expected);
        // The stores hold what the model holds (a city whose users all left keeps 0).
        prop_assert_eq!(driver.store::<String, u64>("city_counts").unwrap(), counts.into_iter().collect::<Vec<_>>());
        prop_assert_eq!(driver.store::<u64, String>("users").unwrap(), users.into_iter().collect::<Vec<_>>());
    }
}

#[test]
fn table_operators_pass_changes_and_deletions_on() {
    fn topology(b: &mut StreamsBuilder) {
        b.table::<String, u64>("prices", "prices")
            .filter(|_, p| *p >= 10)
            .map_values(|p| format!("${p}"))
            .to_stream()
            .to("expensive");
    }
    let mut driver = TestDriver::new("t", topology).unwrap();
    driver.pipe("prices", "tea".to_string(), 12u64, 1).unwrap();
    driver.pipe("prices", "tea".to_string(), 3u64, 2).unwrap(); // no longer passes: deleted
    driver.pipe("prices", "jam".to_string(), 2u64, 3).unwrap(); // never passed: nothing
    driver.pipe("prices", "jam".to_string(), None::<u64>, 4).unwrap();
    driver.pipe("prices", "pie".to_string(), 20u64, 5).unwrap();
    driver.pipe("prices", "pie".to_string(), None::<u64>, 6).unwrap();
    let out: Vec<(String, Option<String>)> = driver
        .read::<String, Option<String>>("expensive")
        .unwrap()
        .into_iter()
        .map(|r| (r.key, r.value))
        .collect();
    let s = |k: &str, v: Option<&str>| (k.to_string(), v.map(str::to_string));
    assert_eq!(
        out,
        [
            s("tea", Some("$12")),
            s("tea", None),
            s("pie", Some("$20")),
            s("pie", None)
        ]
    );
}

#[test]
fn a_stream_becomes_a_table_after_a_repartition_when_its_key_changed() {
    fn topology(b: &mut StreamsBuilder) {
        let latest = b
            .stream::<String, String>("events")
            .select_key(|_, v| v.split(':').next().unwrap_or_default().to_string())
            .to_table("latest");
        latest.to_stream().to("latest_out");
    }
    let mut driver = TestDriver::new("t", topology).unwrap();
    assert_eq!(driver.description().internal_topics[0].name, "latest");
    driver
        .pipe("events", "e1".to_string(), "u1:login".to_string(), 1)
        .unwrap();
    driver
        .pipe("events", "e2".to_string(), "u1:logout".to_string(), 2)
        .unwrap();
    assert_eq!(
        driver.store::<String, String>("latest").unwrap(),
        [("u1".to_string(), "u1:logout".to_string())]
    );
    assert_eq!(driver.read::<String, Option<String>>("latest_out").unwrap().len(), 2);
}
