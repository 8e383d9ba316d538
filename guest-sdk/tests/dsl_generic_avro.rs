//! The stream DSL over Avro values without Rust types for their schemas ([`GenericAvro`]):
//! the types declare their topics' formats as typed `Avro<T>` streams do, and a field is read
//! and set by name.

use sluice_guest::dsl::testing::TestDriver;
use sluice_guest::dsl::StreamsBuilder;
use sluice_guest::formats::{AvroValue, GenericAvro, SchemaKind};

struct Orders;
sluice_guest::avro_schema!(
    Orders,
    r#"{"type":"record","name":"Order","namespace":"shop","fields":[
        {"name":"id","type":"string"},{"name":"amount","type":"double"},
        {"name":"note","type":["null","string"],"default":null}]}"#
);

struct Big;
sluice_guest::avro_schema!(
    Big,
    r#"{"type":"record","name":"BigOrder","namespace":"shop","fields":[
        {"name":"id","type":"string"},{"name":"cents","type":"long"}]}"#
);

fn big_orders(b: &mut StreamsBuilder) {
    b.stream::<String, GenericAvro<Orders>>("orders")
        .filter(|_, order| order["amount"].as_f64().is_some_and(|a| a >= 100.0))
        .map_values(|order| {
            let mut big = AvroValue::default();
            big.set("id", order["id"].clone());
            big.set("cents", (order["amount"].as_f64().unwrap() * 100.0).round() as i64);
            GenericAvro::<Big>::new(big)
        })
        .to("big");
}

fn order(id: &str, amount: f64) -> GenericAvro<Orders> {
    let mut v = AvroValue::default();
    v.set("id", id);
    v.set("amount", amount);
    v.set("note", None::<String>);
    GenericAvro::new(v)
}

#[test]
fn generic_avro_values_are_filtered_and_remade_by_field_name() {
    let mut driver = TestDriver::new("big-orders", big_orders).unwrap();
    for (i, amount) in [12.5, 250.0, 99.99, 100.0].into_iter().enumerate() {
        let id = format!("o{i}");
        driver.pipe("orders", id.clone(), order(&id, amount), i as i64).unwrap();
    }
    let out: Vec<(String, Option<i64>)> = driver
        .read::<String, GenericAvro<Big>>("big")
        .unwrap()
        .into_iter()
        .map(|r| (r.value["id"].as_str().unwrap().to_string(), r.value["cents"].as_i64()))
        .collect();
    assert_eq!(
        out,
        [("o1".to_string(), Some(25_000)), ("o3".to_string(), Some(10_000))]
    );
    let d = driver.description();
    let orders = d.format_of("orders").unwrap().value.clone().unwrap();
    assert_eq!(orders.kind, SchemaKind::Avro);
    assert!(orders.text.contains("\"Order\""));
    assert!(d
        .format_of("big")
        .unwrap()
        .value
        .as_ref()
        .unwrap()
        .text
        .contains("BigOrder"));
}

#[test]
fn a_generic_value_that_does_not_fit_its_schema_is_an_error_naming_the_field() {
    let mut driver = TestDriver::new("big-orders", big_orders).unwrap();
    let mut bad = order("o9", 500.0);
    bad.set("amount", "a lot");
    // The test driver writes the input with the codec, as a producer would: it is refused.
    let e = driver.pipe("orders", "o9".to_string(), bad, 0).unwrap_err();
    assert!(e.to_string().contains("avro"), "{e}");
}
