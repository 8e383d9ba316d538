//! Example topology (Processor API) over Avro records behind a Schema Registry: each order of
//! `orders` (Avro, read with `schemas/order-v2.avsc`, so orders of writers of version 1 read
//! `channel` as "web") goes to `enriched` as an Avro `EnrichedOrder` with its total (amount
//! times quantity) and whether it is large (100 or more), keeping its key; orders of quantity
//! 0 are dropped. The benchmark's Avro pipeline, and the topology the formats tests send bad
//! records, other writers' schemas and registry outages through.

use sluice_guest::formats::Avro;
use sluice_guest::serde::{Deserialize, Serialize};
use sluice_guest::{export, Context, Description, Error, Processor, Record, TaskInfo};

/// An order, version 2 (`schemas/order-v2.avsc`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(crate = "sluice_guest::serde")]
pub struct Order {
    pub id: String,
    pub customer: String,
    pub amount: f64,
    pub quantity: i32,
    pub placed: i64,
    pub note: Option<String>,
    pub channel: String,
}

sluice_guest::avro_schema!(Order, include_str!("../schemas/order-v2.avsc"));

/// What goes out (`schemas/enriched-order.avsc`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(crate = "sluice_guest::serde")]
pub struct EnrichedOrder {
    pub id: String,
    pub customer: String,
    pub total: f64,
    pub large: bool,
    pub channel: String,
    pub placed: i64,
}

sluice_guest::avro_schema!(EnrichedOrder, include_str!("../schemas/enriched-order.avsc"));

/// An order's enrichment; none for an order to drop.
pub fn enrich(order: Order) -> Option<EnrichedOrder> {
    if order.quantity == 0 {
        return None;
    }
    let total = order.amount * f64::from(order.quantity);
    Some(EnrichedOrder {
        id: order.id,
        customer: order.customer,
        total,
        large: total >= 100.0,
        channel: order.channel,
        placed: order.placed,
    })
}

struct AvroEnrich;

impl Processor for AvroEnrich {
    fn describe() -> Description {
        Description::new("avro-enrich")
            .source("orders")
            .sink("enriched")
            .value_format("orders", Avro::<Order>::schema())
            .value_format("enriched", Avro::<EnrichedOrder>::schema())
    }

    fn init(_task: &TaskInfo) -> Result<Self, Error> {
        Ok(AvroEnrich)
    }

    fn process(&mut self, record: &Record<'_>, ctx: &mut Context) -> Result<(), Error> {
        let Avro(order) = record.value_as::<Avro<Order>>()?;
        match enrich(order) {
            Some(enriched) => ctx.emit("enriched", record.key(), &Avro(enriched)),
            None => Ok(()),
        }
    }
}

export!(AvroEnrich);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_are_enriched_and_empty_ones_dropped() {
        let order = Order {
            id: "o1".into(),
            customer: "c1".into(),
            amount: 25.0,
            quantity: 4,
            placed: 5,
            note: None,
            channel: "web".into(),
        };
        let e = enrich(order.clone()).unwrap();
        assert_eq!((e.total, e.large), (100.0, true));
        assert!(enrich(Order { quantity: 0, ..order }).is_none());
    }
}
